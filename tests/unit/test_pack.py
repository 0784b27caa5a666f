"""The packed weight layout: GPU-able torch packing equals the element-wise reference, unpack
inverts pack, and PackedWeight.dequantized() is (q - z) * s rounded once."""
import pytest
import torch

import humming_aot
from humming_aot.nn import QuantizedLinear
from humming_aot.packed_layout import (
    pack_codes,
    permute_unit_columns,
    reference_pack_codes,
    unpack_codes,
    unpermute_unit_columns,
)
from humming_aot.packing import unpack
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k", [(64, 16), (128, 64), (448, 384)])
def test_pack_codes_matches_reference_and_inverts(bits, n, k):
    u = torch.randint(0, 2**bits, (n, k), generator=torch.Generator().manual_seed(n * k + bits))
    packed = pack_codes(u, bits)
    assert packed.dtype == torch.int32 and packed.shape == (k // 16, n * bits // 2)
    assert torch.equal(packed, reference_pack_codes(u, bits))
    assert torch.equal(unpack_codes(packed, n, k, bits), u.to(torch.int32))


def test_unit_column_permutation_is_the_documented_one():
    x = torch.arange(128).reshape(1, 128)
    y = permute_unit_columns(x)
    # column 16 j + 8 h + g of a unit moves to g * 8 + 2 j + h
    for unit in range(2):
        for j in range(4):
            for h in range(2):
                for g in range(8):
                    assert y[0, unit * 64 + g * 8 + 2 * j + h] == unit * 64 + 16 * j + 8 * h + g
    assert torch.equal(unpermute_unit_columns(y), x)


@pytest.mark.parametrize("fmt", ["int4:g128", "uint4:g64:zp", "int8:channel", "int4:g32", "uint4:channel:zp"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_pack_roundtrip_and_dequantized_operand(fmt, act):
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(192, 256, generator=gen)
    qw = humming_aot.quantize(w, fmt)
    packed = humming_aot.pack(qw, act_dtype=act)
    codes, scales, zeros = unpack(packed)
    bits = packed.bits
    if qw.zero_points is None:
        expected_codes = (qw.codes.to(torch.int32) + (1 << (bits - 1))) & ((1 << bits) - 1)
    else:
        expected_codes = qw.codes.to(torch.int32)
        assert torch.equal(zeros.float(), qw.zero_points.float().reshape(zeros.shape))
    assert torch.equal(codes, expected_codes)
    assert torch.equal(scales, qw.scales.reshape(scales.shape).to(act))
    # the operand the kernel multiplies: dequantize with the act-dtype scales, rounded once
    group = packed.group_size
    idx = torch.arange(256) // group
    exact = (codes.double() - zeros.double()[:, idx]) * scales.double()[:, idx]
    assert torch.equal(packed.dequantized(), exact.to(act))
    # and it is humming_aot.dequantize up to the rounding of the scales to act
    ref = humming_aot.dequantize(qw)
    step = (scales.float()[:, idx]).abs()
    assert ((packed.dequantized().float() - ref).abs() <= step * 2**-6 * (2 ** bits) + 1e-6).all()


@pytest.mark.parametrize(
    "n,k,fmt,match",
    [
        (128, 192, "int4:g48", "group"),
        (128, 96, "int4:g48", "K=96 pads to 128 \\(a multiple of 64\\), which groups of 48 do not tile"),
    ],
)
def test_pack_rejects_unaligned_shapes_with_a_clear_error(n, k, fmt, match):
    qw = humming_aot.quantize(torch.randn(n, k), fmt)
    with pytest.raises(ValueError, match=match):
        humming_aot.pack(qw, act_dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "n,k,fmt",
    [(100, 128, "int4:g128"), (128, 96, "int4:channel"), (96, 96, "uint4:g32:zp"), (130, 80, "float4e2m1:g16"),
     (64, 96, "uint4:g32:zpf"), (96, 160, "nvfp4"), (192, 96, "float8e4m3:channel")],
)
def test_pack_pads_unaligned_shapes_and_the_gemm_runs_on_the_weights_own(n, k, fmt):
    """N or K that is not a multiple of 64 (tensor-parallel shards) is padded inside pack, not
    refused: the kernel's N x K rounds up to 64 with zero codes and unit scales, the weight keeps
    its own shape (out_features x in_features; dequantized, effective_weight and
    as_quantized_weight are of it), and ops.gemm and QuantizedLinear take activations of its K
    and return its N, equal to the float64 reference of the unpadded operands."""
    gen = torch.Generator().manual_seed(11)
    qw = humming_aot.quantize(torch.randn(n, k, generator=gen) * 0.05, fmt)
    packed = humming_aot.pack(qw, act_dtype=torch.bfloat16)
    assert packed.padded and (packed.out_features, packed.in_features) == (n, k)
    assert (packed.n, packed.k) == (-(-n // 64) * 64, -(-k // 64) * 64)
    w_eff = packed.effective_weight()
    assert w_eff.shape == (n, k) and packed.dequantized().shape == (n, k)
    again = humming_aot.pack(packed.as_quantized_weight(), act_dtype=torch.bfloat16)
    assert torch.equal(again.dequantized(), packed.dequantized())
    a = torch.randn(2, 3, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    out = humming_aot.ops.gemm(a, packed, bias)
    assert out.shape == (2, 3, n)
    assert_gemm_close(out.reshape(6, n), reference_gemm(a.reshape(6, k), w_eff, bias), a=a.reshape(6, k),
                      w_eff=w_eff, bias=bias, context=f"{fmt} {n}x{k}")
    with pytest.raises(ValueError, match=f"its last dimension must be the weight's K={k}"):
        humming_aot.ops.gemm(torch.zeros(2, packed.k + 64, dtype=torch.bfloat16), packed)  # not its K
    with pytest.raises(ValueError, match=f"bias must be a tensor of shape \\({n},\\)"):
        humming_aot.ops.gemm(a, packed, torch.zeros(packed.n + 64, dtype=torch.bfloat16))
    layer = QuantizedLinear(packed, bias)
    assert (layer.in_features, layer.out_features) == (k, n)
    assert torch.equal(layer(a), out)


def test_pack_rejects_unsupported_element_and_act_dtype():
    qw = humming_aot.quantize(torch.randn(128, 128), "int4:g128")
    with pytest.raises(ValueError, match="act_dtype"):
        humming_aot.pack(qw, act_dtype=torch.float32)
    # a finite-only E5 format would put its top binade on float16's inf and NaN
    qw7 = humming_aot.quantize(torch.randn(128, 128), "float7e5m1:channel")
    with pytest.raises(ValueError, match="float7e5m1 values do not all fit float16"):
        humming_aot.pack(qw7, act_dtype=torch.float16)
    humming_aot.pack(qw7, act_dtype=torch.bfloat16)


def test_pack_moves_scale_range_into_the_global_scale_and_refuses_what_cannot_fit():
    w = torch.randn(128, 128, generator=torch.Generator().manual_seed(3))
    for fmt, factor in (("mxfp4", 2.0**40), ("float4e2m1:g32:s=float16", 5000.0), ("float8e5m2:g64", 1e-3)):
        qw = humming_aot.quantize(w * factor, fmt)
        packed = humming_aot.pack(qw, act_dtype=torch.float16)
        scales = unpack(packed)[1].float()
        assert torch.isfinite(scales).all() and (scales >= torch.finfo(torch.float16).tiny).all(), fmt
        # a power of two moved between the group scales and the global scale changes no value
        exact = qw.format.scale_dtype in ("float8e8m0", "float8e4m3")  # code x scale fits float16's 11 bits
        ref = humming_aot.dequantize(qw).double()
        err = (packed.effective_weight() - ref).abs()
        assert (err == 0).all() if exact else (err <= ref.abs() * 2**-10).all(), fmt
    # scales spanning 2^60 do not fit float16's range at once
    wide = w.clone()
    wide[0] *= 2.0**30
    wide[64] *= 2.0**-30
    with pytest.raises(ValueError, match="more than float16"):
        humming_aot.pack(humming_aot.quantize(wide, "mxfp4"), act_dtype=torch.float16)
    humming_aot.pack(humming_aot.quantize(wide, "mxfp4"), act_dtype=torch.bfloat16)


FLOAT_FORMATS = ["mxfp4", "nvfp4", "mxfp8", "mxfp6e3m2", "float8e5m2:g64", "float4e0m3:g32", "float2e1m0:g128",
                 "float8e4m3:tensor", "float8e4m3:b128x128", "float5e2m2:channel", "float8e7m0:g64"]


@pytest.mark.parametrize("fmt", FLOAT_FORMATS)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_float_weights_pack_their_codes_and_dequantize_exactly(fmt, act):
    """Float codes are packed as they are; with 16-bit, e4m3 or e8m0 scales (MX, NVFP4) the
    kernel's operand times the global scale is exactly humming_aot.dequantize in float64."""
    from humming_aot import formats

    gen = torch.Generator().manual_seed(11)
    w = torch.randn(192, 256, generator=gen) * 0.05
    qw = humming_aot.quantize(w, fmt)
    if act == torch.float16 and formats.get(qw.format.element).exponent_bits > 4 and qw.format.element != "float8e5m2":
        with pytest.raises(ValueError, match="do not all fit float16"):
            humming_aot.pack(qw, act_dtype=act)
        return
    packed = humming_aot.pack(qw, act_dtype=act)
    codes, scales, zeros = unpack(packed)
    assert zeros is None and packed.is_float and packed.w_dtype == qw.format.element
    assert torch.equal(codes, qw.codes.to(torch.int32))
    value = formats.get(packed.w_dtype).decode(codes).double()
    idx = torch.arange(256) // packed.group_size
    assert torch.equal(packed.dequantized(), (value * scales.double()[:, idx]).to(act))
    reference = humming_aot.dequantize(qw).double()
    if qw.format.scale_dtype in ("float8e8m0", "float8e4m3") or qw.format.granularity.value == "tensor":
        # exact scales: only dequantize's own float32 product with the global scale rounds
        torch.testing.assert_close(packed.effective_weight(), reference, rtol=2**-23, atol=0)
    else:  # float32 scales round to act once, and so does the product (to a float16 subnormal at worst)
        assert ((packed.effective_weight() - reference).abs() <= reference.abs() * 2**-7 + 2**-24).all()


@pytest.mark.parametrize("fmt", ["uint4:g64:zpf", "uint8:channel:zpf:s=bfloat16", "uint3:g32:zpf:s=float16"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_float_zero_points_round_twice_like_the_kernel(fmt, act):
    """HQQ-style zero points: the kernel computes q - z and then (q - z) * s in the activation
    dtype, each rounded once; dequantized() says exactly that, and stays within two roundings of
    humming_aot.dequantize."""
    gen = torch.Generator().manual_seed(21)
    qw = humming_aot.quantize(torch.randn(192, 256, generator=gen) * 0.05, fmt)
    packed = humming_aot.pack(qw, act_dtype=act)
    assert packed.float_zero_point and packed.zero_point.value == "zpf"
    codes, scales, zeros = unpack(packed)
    assert torch.equal(codes, qw.codes.to(torch.int32))
    assert torch.equal(zeros, qw.zero_points.reshape(zeros.shape).to(act))
    idx = torch.arange(256) // packed.group_size
    shifted = (codes.double() - zeros.double()[:, idx]).to(act).double()
    assert torch.equal(packed.dequantized(), (shifted * scales.double()[:, idx]).to(act))
    ref = humming_aot.dequantize(qw).double()
    step = scales.double()[:, idx] * 2 ** packed.bits  # |q - z| * s is at most this
    eps = 2**-7 if act == torch.bfloat16 else 2**-10
    assert ((packed.effective_weight() - ref).abs() <= 3 * eps * step).all()
    again = packed.as_quantized_weight()
    assert again.format.zero_point.value == "float" and again.zero_points.dtype == torch.float32


def test_five_bit_fold_fills_every_spare_bit_once():
    """The 15 bits of V_5..V_7 go to bits 5-7 of P_0..P_4, each exactly once (no collisions)."""
    from humming_aot.packed_layout import _FIVE_BIT_HOMES

    homes = [home for word in (5, 6, 7) for home in _FIVE_BIT_HOMES[word]]
    assert sorted(homes) == [(i, b) for i in range(5) for b in (5, 6, 7)]


@pytest.mark.parametrize("fmt", ["int4:g128", "uint8:g64:zp", "int5:channel", "int3:tensor"])
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_effective_weight_with_scales_in_fp32_is_the_unrounded_product(fmt, act):
    """The kernels of KernelKey.scales_in_fp32 multiply q - z exactly and apply s to fp32 sums:
    their weight is (q - z) * s x global in float64, with no rounding to the activation dtype;
    the default weight is that product rounded once (and they differ for bf16 group scales)."""
    gen = torch.Generator().manual_seed(5)
    qw = humming_aot.quantize(torch.randn(192, 256, generator=gen) * 0.05, fmt)
    packed = humming_aot.pack(qw, act_dtype=act)
    codes, scales, zeros = unpack(packed)
    idx = torch.arange(256) // packed.group_size
    zero = (1 << (packed.bits - 1)) if zeros is None else zeros.double()[:, idx]
    exact = (codes.double() - zero) * scales.double()[:, idx] * packed.global_scale
    assert torch.equal(packed.effective_weight(scales_in_fp32=True), exact)
    assert torch.equal(packed.effective_weight(), exact.div(packed.global_scale).to(act).double() * packed.global_scale)
    if act == torch.bfloat16 and not fmt.endswith(":tensor"):  # a tensor scale is a power of two here
        assert not torch.equal(packed.effective_weight(scales_in_fp32=True), packed.effective_weight())


@pytest.mark.parametrize("fmt", ["float4e2m1:g32", "uint4:g64:zpf"])
def test_effective_weight_with_scales_in_fp32_refuses_what_no_kernel_does(fmt):
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(64, 128) * 0.05, fmt), act_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="to fp32 sums"):
        packed.effective_weight(scales_in_fp32=True)
