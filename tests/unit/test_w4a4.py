"""W4A4 (int4:channel weights x int4:token activations, humming_aot.w8a8 on the portable mma-ss
body with mma.sync m16n8k64 s4) on the CPU: the two-a-byte packing, pack's checks, the float64
reference path, the keys and generated source, the default catalogs, the layer and the custom op (the launcher on fake GPUs:
tests/unit/test_w8a8_launch.py; the SASS of sm80 / sm89 builds: tests/unit/test_portable_8bit_bodies.py;
GPU runs: tests/gpu/test_w4a4_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from humming_aot import codegen, formats, ops, quant, w8a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey


def _operands(m, n, k, seed=0, wfmt="int4:channel", act="int4:token"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    return x, w, w8a8.pack(quant.quantize(w, wfmt)), ops.quantize_activation(x, act)


def test_two_codes_a_byte_in_the_s4_fragment_order():
    codes = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    packed = w8a8.pack_int4(codes)
    assert packed.shape == (3, 32)
    # code 2 j in the low nibble of byte j, code 2 j + 1 in the high one (the mma's element order
    # within a 32-bit register: element i at bits 4 i .. 4 i + 3, little-endian)
    assert torch.equal(packed[:, 5] & 0xF, codes[:, 10]) and torch.equal(packed[:, 5] >> 4, codes[:, 11])
    assert torch.equal(w8a8.unpack_int4(packed), codes)


def test_pack_pads_and_decodes_back():
    gen = torch.Generator().manual_seed(1)
    for fmt, n, k in (("int4:channel", 100, 256), ("int4:tensor", 64, 96)):
        qw = quant.quantize(torch.randn(n, k, generator=gen), fmt)
        packed = w8a8.pack(qw)
        n_pad = -(-n // w8a8.N_ALIGN) * w8a8.N_ALIGN
        assert (packed.n, packed.k, packed.row_bytes, packed.element) == (n_pad, k, k // 2, "int4")
        assert packed.w.shape == (n_pad, k // 2) and packed.w_scale.shape == (n_pad,)
        exact = formats.get("int4").decode(qw.codes).double() * qw.scales.double().reshape(-1, 1)
        assert torch.equal(packed.effective_weight(), exact)
        assert not packed.w[n:].any() and not packed.w_scale[n:].any()


def test_cpu_gemm_is_the_float64_product_rounded_once():
    x, w, packed, qa = _operands(5, 100, 256)
    a = formats.get("int4").decode(qa.codes).double() * qa.scales.double()
    qw = quant.quantize(w, "int4:channel")
    expected = a @ (formats.get("int4").decode(qw.codes).double() * qw.scales.double()).T
    bias = torch.randn(100).to(torch.bfloat16)
    assert torch.equal(w8a8.reference(qa, packed), expected)
    assert torch.equal(w8a8.gemm(qa, packed, bias=bias), formats.round_to(expected + bias.double(), torch.bfloat16))
    ref = x.double() @ w.double().T
    assert ((w8a8.gemm(qa, packed).double() - ref).norm() / ref.norm()).item() < 0.3  # int4 x int4


def test_errors_say_what_to_do():
    _, w, packed, qa = _operands(3, 64, 256)
    with pytest.raises(ValueError, match="multiple of 32"):
        w8a8.pack(quant.quantize(torch.randn(64, 48), "int4:channel"))
    with pytest.raises(ValueError, match="int4 weights with groups of K run with float8e4m3 or int8 activations"):
        w8a8.pack(quant.quantize(w, "int4:g128"))
    with pytest.raises(ValueError, match="takes int4 activations"):
        w8a8.gemm(ops.quantize_activation(torch.randn(3, 256), "int8:token"), packed)


def test_keys_and_generated_source():
    tile = w8a8.select_sync_tile(64)
    for arch in ("sm80", "sm86", "sm89", "sm90a", "sm120"):
        key = w8a8.kernel_key(arch, torch.bfloat16, tile, element="int4")
        assert KernelKey.from_name(key.name) == key and "_mma-ss_a-s4-k-f32_w-s4-g-f32_" in key.name
    source = codegen.kernel_source(w8a8.kernel_key("sm80", torch.float16, tile, element="int4"))
    assert "humming_aot::mma::S4SyncCodes" in source and "DenseMmaSs<" in source
    with pytest.raises(ValueError, match="needs sm80 or later, not sm75"):
        w8a8.kernel_key("sm75", torch.bfloat16, tile, element="int4")
    with pytest.raises(ValueError, match="wgmma-ss body computes"):
        w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field("wgmma-ss:8x128x128_w1x4_s6"), element="int4")


def test_the_default_catalogs_hold_the_table_for_every_arch_from_sm80():
    from humming_aot.enumerate import enumerate_keys

    for arch, expected in (("sm75", False), ("sm80", True), ("sm86", True), ("sm89", True), ("sm90a", True),
                           ("sm100", True), ("sm120", True)):
        names = {k.name for k in enumerate_keys("default", [arch])}
        for _, label in w8a8._SYNC_TILES:
            for dtype in (torch.bfloat16, torch.float16):
                if not expected:  # (sm75 has no int mma.sync of this shape: the key is refused)
                    assert not any("_a-s4-k-f32_w-s4-g-f32_" in name for name in names), arch
                    continue
                key = w8a8.kernel_key(arch, dtype, parse_tile_field(label), element="int4")
                assert key.name in names, (arch, key.name)


def test_the_layer_and_the_custom_op():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(256, 100)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, "int4:channel", activations="int4:token")
    assert isinstance(layer, W8A8Linear) and isinstance(layer.packed, w8a8.PackedW8A8Weight)
    assert layer.packed.element == "int4" and layer.activations == "int4:token"
    qa = ops.quantize_activation(x, "int4:token")
    expected = w8a8.gemm(qa, w8a8.pack(quant.quantize(linear.weight.detach().float(), "int4:channel")),
                         bias=linear.bias.detach().to(torch.bfloat16))
    assert torch.equal(layer(x), expected)
    # with other activations an int4 weight is W4A8's
    assert not isinstance(W8A8Linear.from_linear(linear, "int4:channel").packed, w8a8.PackedW8A8Weight)
    again = W8A8Linear.from_linear(torch.nn.Linear(256, 100), "int4:channel", activations="int4:token")
    again.load_state_dict(layer.state_dict())
    assert torch.equal(again(x), layer(x))

    _, _, packed, qa2 = _operands(6, 100, 256, seed=3)
    eager = w8a8.gemm(qa2, packed)
    fn = torch.compile(lambda codes, scales: w8a8.gemm(
        quant.QuantizedActivation(element=qa2.element, granularity=qa2.granularity, group_size=None,
                                  scale_dtype="float32", codes=codes, scales=scales), packed),
        backend="eager", fullgraph=True)
    assert torch.equal(fn(qa2.codes, qa2.scales), eager)
