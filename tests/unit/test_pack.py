"""The packed weight layout: GPU-able torch packing equals the element-wise reference, unpack
inverts pack, and PackedWeight.dequantized() is (q - z) * s rounded once."""
import pytest
import torch

import humming_aot
from humming_aot.packing import (
    pack_codes,
    permute_unit_columns,
    reference_pack_codes,
    unpack,
    unpack_codes,
    unpermute_unit_columns,
)


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
        (100, 128, "int4:g128", "N=100"),
        (128, 96, "int4:channel", "K=96"),
        (128, 192, "int4:g48", "group"),
    ],
)
def test_pack_rejects_unaligned_shapes_with_a_clear_error(n, k, fmt, match):
    qw = humming_aot.quantize(torch.randn(n, k), fmt)
    with pytest.raises(ValueError, match=match):
        humming_aot.pack(qw, act_dtype=torch.bfloat16)


def test_pack_rejects_unsupported_element_and_act_dtype():
    qw = humming_aot.quantize(torch.randn(128, 128), "int4:g128")
    with pytest.raises(ValueError, match="act_dtype"):
        humming_aot.pack(qw, act_dtype=torch.float32)
    qw8 = humming_aot.quantize(torch.randn(128, 128), "float8e4m3:channel")
    with pytest.raises(ValueError, match="float8e4m3"):
        humming_aot.pack(qw8, act_dtype=torch.bfloat16)
