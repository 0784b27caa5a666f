"""W4A8 (int4 x float8e4m3) on the CPU: the kernel's integer conversion and the packed layout
against the PTX fragment layout (an emulation of the consumer threads' loads and conversion), the
float64 reference path of w4a8.gemm, the wgmma-w4a8 body's names, tile rules and generated
source, NVRTC and nvcc compiling its keys, and the errors a caller can cause (GPU runs:
tests/gpu/test_w4a8_gpu.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from humming_aot import codegen, formats, ops, quant, w4a8
from humming_aot.bodies.wgmma_w4a8 import overlapped
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey
from humming_aot.testing.w4a8_layout import fragment_steps

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "csrc" / "include" / "humming_aot" / "numerics" / "int4_e4m3.cuh"
E4M3 = formats.get("float8e4m3")


def _constants() -> dict[str, float]:
    """The kernel's conversion constants, read from its header."""
    text = HEADER.read_text()
    found = {name: int(value, 16) for name, value in re.findall(r"(k\w+) = (0x[0-9A-Fa-f]+)u;", text)}
    found.update({name: float(value) for name, value in re.findall(r"(k\w+) = ([0-9.]+)f;", text)})
    return found


def _convert(word: int) -> tuple[int, int]:
    """Int4ToE4m3::convert, emulated: (low, high) registers of four e4m3 codes each."""
    c = _constants()

    def four(w: int) -> int:
        return ((w & c["kCode"]) + ((w & c["kSign"]) >> 7)) & 0xFFFFFFFF

    rotated = ((word >> 4) | (word << 28)) & 0xFFFFFFFF
    return four(word), four(rotated)


def _e4m3_values(register: int) -> list[float]:
    """The four e4m3 values of a register, times the kernel's 2^9 (its sums' scale)."""
    scale = _constants()["kValueScale"]
    return [E4M3.decode(torch.tensor([(register >> (8 * j)) & 0xFF], dtype=torch.uint8)).item() * scale
            for j in range(4)]


def test_every_int4_value_converts_to_its_e4m3_code_in_every_register_byte():
    """A value packed alone at any of a word's eight places comes out at its register byte, the
    other bytes 0 (through the packed layout: the high codes' signs sit one byte over)."""
    for v in range(-8, 8):
        for r in range(2):
            for j in range(4):
                values = torch.zeros(64, 128, dtype=torch.int64)
                values[8 * r, j] = v  # warp 0, lane 0, K step 0: word 0's register r, byte j
                qw = quant.QuantizedWeight(format=quant.WeightFormat.parse("int4:channel"),
                                           codes=(values & 0xF).to(torch.uint8), scales=torch.ones(64, 1))
                word = int.from_bytes(bytes(w4a8.pack(qw).w[0, 0, :4].tolist()), "little")
                registers = _convert(word)
                assert _e4m3_values(registers[r])[j] == v, (v, r, j)
                assert all(x == 0 for i, x in enumerate(_e4m3_values(registers[r]) + _e4m3_values(registers[1 - r]))
                           if i != j), (v, r, j)
    assert {int(w4a8.encode(torch.tensor([v])).item()) for v in range(-8, 8)} == set(range(16))


def _pack_v1(values: torch.Tensor) -> torch.Tensor:
    """(n, k) int4 values in layout version 1, written by hand: table indices (first row 0 2 4 6 -1
    -3 -5 -7, second 1 3 5 7 -2 ...) in the byte order (w, h, g, t, s, q, r, j / 2)."""
    n, k = values.shape
    index = {v: i for i, v in enumerate((0, 2, 4, 6, -1, -3, -5, -7, 1, 3, 5, 7, -2, -4, -6, -8))}
    codes = values.to(torch.int64).clone().apply_(lambda v: index[v])
    codes = codes.reshape(n // 64, 4, 2, 8, k // 128, 2, 2, 2, 4, 4)  # u w r g kt h s q t j
    nibbles = codes.permute(4, 0, 1, 5, 3, 8, 6, 7, 2, 9).reshape(k // 128, n // 64, 4096, 2)
    return (nibbles[..., 0] | (nibbles[..., 1] << 4)).to(torch.uint8)


def test_layout_version_1_codes_are_converted_to_the_same_values():
    gen = torch.Generator().manual_seed(3)
    values = torch.randint(-8, 8, (128, 256), generator=gen)
    qw = quant.QuantizedWeight(format=quant.WeightFormat.parse("int4:channel"), codes=(values & 0xF).to(torch.uint8),
                               scales=torch.ones(128, 1))
    v1 = _pack_v1(values)
    assert torch.equal(w4a8.upgrade_packed(v1, 1), w4a8.pack(qw).w)
    with pytest.raises(ValueError, match="pack the quantized weight again"):
        w4a8.upgrade_packed(v1, 7)


def test_the_packed_layout_is_the_8_bit_wgmma_a_fragment():
    """Each consumer thread's 16-byte loads, converted, hold the rows and K of the PTX ISA's 8-bit A
    fragment (m64nNk32: warp w rows 16 w + g (+ 8), register r: K 4 t .. 4 t + 3 (+ 16))."""
    gen = torch.Generator().manual_seed(7)
    n, k = 128, 256
    values = torch.randint(-8, 8, (n, k), generator=gen)
    qw = quant.QuantizedWeight(format=quant.WeightFormat.parse("int4:channel"), codes=(values & 0xF).to(torch.uint8),
                               scales=torch.ones(n, 1))
    packed = w4a8.pack(qw)
    assert packed.w.shape == (2, 2, 4096)
    for step in fragment_steps(packed.w):
        a0, a1 = _convert(step.words[0])
        a2, a3 = _convert(step.words[1])
        for r, register in enumerate((a0, a1, a2, a3)):
            row, k0 = step.rows[r & 1], step.k0(r)
            assert _e4m3_values(register) == values[row, k0:k0 + 4].tolist(), (step, r)


def test_pack_pads_and_decodes_back():
    gen = torch.Generator().manual_seed(1)
    for fmt, k in (("int4:g128", 384), ("int4:channel", 400), ("int4:tensor", 400), ("int4:g256", 512)):
        w = torch.randn(200, k, generator=gen)
        qw = quant.quantize(w, fmt)
        packed = w4a8.pack(qw)
        assert packed.n == 256 and packed.n_valid == 200 and packed.k == k and packed.out_features == 200
        assert packed.w.shape == (-(-k // 128), 4, 4096)
        assert packed.group_size == (int(fmt[6:]) if fmt.startswith("int4:g") else -(-k // 128) * 128)
        assert torch.equal(packed.effective_weight(), _dequantized(qw))
        assert not packed.w_scale[:, 200:].any()
        values = w4a8.decode_packed(packed.w)
        assert not values[200:].any() and not values[:, k:].any()  # the padding is code 0: the value 0


def _dequantized(qw) -> torch.Tensor:
    """(N, K) float64 values x scales of an int4 QuantizedWeight (two's complement codes)."""
    c = qw.codes.to(torch.int64)
    values = torch.where(c >= 8, c - 16, c).double()
    n, k = values.shape
    scales = qw.scales.double().reshape(n if qw.scales.numel() > 1 else 1, -1).expand(n, -1)
    return values * scales.repeat_interleave(-(-k // scales.shape[1]), 1)[:, :k]


def _operands(m, n, k, seed=0, wfmt="int4:g128", act="float8e4m3:token"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    return x, w, w4a8.pack(quant.quantize(w, wfmt)), ops.quantize_activation(x, act)


def test_cpu_gemm_is_the_float64_product_rounded_once():
    x, w, packed, qa = _operands(5, 100, 384)
    qw = quant.quantize(w, "int4:g128")
    a = E4M3.decode(qa.codes).double() * qa.scales.double()
    expected = a @ _dequantized(qw).T
    bias = torch.randn(100).to(torch.bfloat16)
    assert torch.equal(w4a8.reference(qa, packed), expected)
    assert torch.equal(w4a8.gemm(qa, packed, bias=bias), formats.round_to(expected + bias.double(), torch.bfloat16))
    y = w4a8.gemm(qa, packed, out_dtype=torch.float16)
    assert y.dtype == torch.float16 and y.shape == (5, 100)
    rel = ((y.double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm()).item()
    assert rel < 0.2  # int4 weights and e4m3 activations approximate the float product


def test_errors_say_what_to_do():
    _, w, packed, qa = _operands(3, 64, 256)
    with pytest.raises(ValueError, match="int4:g128"):
        w4a8.pack(quant.quantize(w, "int4:g64"))
    with pytest.raises(ValueError, match="symmetric int4"):
        w4a8.pack(quant.quantize(w, "uint4:g128:zpf"))
    with pytest.raises(ValueError, match="multiple of 16"):
        w4a8.pack(quant.quantize(torch.randn(64, 136), "int4:channel"))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        w4a8.pack(w)
    with pytest.raises(ValueError, match="'float8e4m3:token', 'int8:token'"):
        w4a8.gemm(ops.quantize_activation(torch.randn(3, 256), "float8e4m3:g128"), packed)
    with pytest.raises(ValueError, match="K=128 but the weight has K=256"):
        w4a8.gemm(ops.quantize_activation(torch.randn(3, 128), "float8e4m3:token"), packed)
    with pytest.raises(ValueError, match="bias must be"):
        w4a8.gemm(qa, packed, bias=torch.zeros(64))
    with pytest.raises(ValueError, match="leave them None on the CPU"):
        w4a8.gemm(qa, packed, tile="wgmma-w4a8:8x128x128_w1x4_s8")


@pytest.mark.parametrize("m", (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 1536, 1537, 8192))
def test_every_m_has_a_tile_whose_key_round_trips(m):
    tile = w4a8.select_tile(m, n=4096)
    assert tile.label in {label for _, label in w4a8._TILES}
    # 64 tokens up to 128 on 4096 channels (64 x 32 tiles fit a wave of 132), then 128, 192 above 1536
    expected = 8 if m <= 8 else 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 128 else 128 if m <= 1536 else 192
    assert tile.block_m == expected
    # decode on wide layers: two warpgroups of 128 channels
    wide = w4a8.select_tile(m, n=8192)
    assert (wide.label == w4a8._WIDE_DECODE_TILE) == (m <= 16)
    for dtype in (torch.bfloat16, torch.float16):
        key = w4a8.kernel_key("sm90a", dtype, tile)
        assert KernelKey.from_name(key.name) == key
        assert "_wgmma-w4a8_a-e4m3-k-f32_w-s4-g-f32_" in key.name


def test_tile_rules_name_the_limit():
    with pytest.raises(ValueError, match="block_k=64"):
        parse_tile_field("wgmma-w4a8:64x128x64_w1x8_s4")
    with pytest.raises(ValueError, match="registers"):
        parse_tile_field("wgmma-w4a8:128x256x128_w1x8_s4")
    with pytest.raises(ValueError, match="shared memory"):
        parse_tile_field("wgmma-w4a8:128x128x128_w1x8_s10")
    with pytest.raises(ValueError, match="wgmma-w4a8 body computes"):
        KernelKey.from_name("gemm_dense_sm90a_wgmma-w4a8_a-e4m3-k-f32_w-u4-g-f32_o-bf16_8x128x128_w1x4_s8")
    with pytest.raises(ValueError, match="exist only for sm90a"):
        KernelKey.from_name("gemm_dense_sm100a_wgmma-w4a8_a-e4m3-k-f32_w-s4-g-f32_o-bf16_8x128x128_w1x4_s8")


def test_generated_source_names_the_body_and_its_shared_memory():
    key = w4a8.kernel_key("sm90a", torch.bfloat16, w4a8.select_tile(1024))
    text = codegen.kernel_source(key)
    assert "humming_aot::kernel::DenseWgmmaW4A8<" in text and "ScaledTmaGemmParams" in text
    # 7 slots of 128 x 128 activation bytes + 128 x 68 (codes and scales) -> 25 KB, the staging tile after them
    assert f"Kernel::kSmemBytes == {7 * 25600 + 128 * 136 * 2 + 1024}" in text
    # 192 tokens: 5 slots of 192 x 128 + 128 x 68 -> 33 KB, the staging tile after them
    big = codegen.kernel_source(w4a8.kernel_key("sm90a", torch.bfloat16, w4a8.select_tile(4096)))
    assert f"Kernel::kSmemBytes == {5 * 33792 + 192 * 136 * 2 + 1024}" in big
    assert overlapped(parse_tile_field("wgmma-w4a8:128x128x128_w1x8_s7"))
    assert not overlapped(parse_tile_field("wgmma-w4a8:192x128x128_w1x8_s5"))


@pytest.mark.parametrize("weight", w4a8.WEIGHT_ELEMENTS)
def test_nvrtc_compiles_a_key_of_every_weight_element(weight):
    from humming_aot import jit
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the test compiles with NVRTC", "to compile")
    if why is not None:
        pytest.skip(why)
    image = jit.compile_kernel(w4a8.kernel_key("sm90a", torch.float16, w4a8.select_tile(16), weight_element=weight))
    assert len(image) > 10000


def _probe_tiles() -> list[str]:
    """The W4A8 tiles of the GPU tests' catalog (catalog/probe_w8a8_sm90a.toml)."""
    import tomllib

    data = tomllib.loads((REPO / "catalog" / "probe_w8a8_sm90a.toml").read_text())
    return [t for family in data["family"] if family["pairing"] == "w4a8_int4_float8" for t in family["tiles"]]


@pytest.mark.slow
def test_nvcc_compiles_every_table_tile_without_spills_or_serialized_wgmma():
    import subprocess
    import tempfile

    from humming_aot.aot import ninja

    try:
        nvcc = ninja.find_nvcc()
    except ninja.NvccNotFoundError:
        pytest.skip("nvcc not found (set HUMMING_AOT_NVCC)")
    include = str(REPO / "csrc" / "include")
    for label in sorted({label for _, label in w4a8._TILES} | {w4a8._WIDE_DECODE_TILE} | set(_probe_tiles())
                        | {"wgmma-w4a8:64x256x128_w1x8_s4"}):
        key = w4a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(label))
        with tempfile.TemporaryDirectory() as tmp:
            src = f"{tmp}/k.cu"
            open(src, "w").write(codegen.kernel_source(key))
            done = subprocess.run([str(nvcc), "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-I", include,
                                   "-Xptxas", "-v", src, "-o", f"{tmp}/k.cubin"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert " 0 bytes spill stores" in done.stderr and "serialized" not in done.stderr, (key.name, done.stderr)


def test_the_default_catalog_holds_every_table_tile():
    from humming_aot.enumerate import enumerate_keys

    names = {key.name for key in enumerate_keys("default", ["sm90a"])}
    for label in [label for _, label in w4a8._TILES] + [w4a8._WIDE_DECODE_TILE]:
        for dtype in (torch.bfloat16, torch.float16):
            assert w4a8.kernel_key("sm90a", dtype, parse_tile_field(label)).name in names


def test_gemm_is_a_custom_op_under_torch_compile_and_fake_tensors():
    _, _, packed, qa = _operands(6, 100, 256, seed=3)
    bias = torch.randn(100).to(torch.bfloat16)
    eager = w4a8.gemm(qa, packed, bias=bias)
    fn = torch.compile(lambda codes, scales: w4a8.gemm(
        quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                  scale_dtype="float32", codes=codes, scales=scales), packed, bias=bias),
        backend="eager", fullgraph=True)
    assert torch.equal(fn(qa.codes, qa.scales), eager)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = torch.ops.humming_aot.gemm_w4a8(mode.from_tensor(qa.codes.reshape(2, 3, 256)), mode.from_tensor(
            qa.scales.reshape(2, 3, 1)), packed.w, packed.w_scale, None, 256, 128, 100, qa.granularity.value,
            torch.float16)
        assert out.shape == (2, 3, 100) and out.dtype == torch.float16
    with torch.device("cpu"):
        assert torch.equal(w4a8.gemm(qa, packed, bias=bias), eager)


def test_the_layer_quantizes_its_input_and_matches_the_reference():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(256, 100)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, "int4:g128", activations="float8e4m3:token")
    assert isinstance(layer, W8A8Linear) and "activations='float8e4m3:token'" in repr(layer)
    assert isinstance(layer.packed, w4a8.PackedW4A8Weight) and layer.packed.group_size == 128
    y = layer(x)
    qa = ops.quantize_activation(x, "float8e4m3:token")
    expected = w4a8.gemm(qa, w4a8.pack(quant.quantize(linear.weight.detach().float(), "int4:g128")),
                         bias=linear.bias.detach().to(torch.bfloat16))
    assert y.shape == (2, 3, 100) and torch.equal(y, expected)
    # per-tensor activations (dynamic); the default is per token; int8 activations too (int4 x int8);
    # groups of K are refused
    assert W8A8Linear.from_linear(linear, "int4:channel").activations == "float8e4m3:token"
    assert W8A8Linear.from_linear(linear, "int4:g128", activations="float8e4m3:tensor")(x).shape == (2, 3, 100)
    int8 = W8A8Linear.from_linear(linear, "int4:g128", activations="int8:token")
    assert torch.equal(int8(x), w4a8.gemm(ops.quantize_activation(x, "int8:token"), int8.packed,
                                          bias=linear.bias.detach().to(torch.bfloat16)))
    with pytest.raises(ValueError, match="float8e4m3:token or float8e4m3:tensor or int8:token or int8:tensor"):
        W8A8Linear.from_linear(linear, "int4:g128", activations="float8e4m3:g128")


def test_the_layer_records_its_packed_layout_version():
    from humming_aot.nn import W8A8Linear

    layer = W8A8Linear.from_linear(torch.nn.Linear(256, 64), "int4:g128")
    state = layer.state_dict()
    assert int(state["packed_layout_version"]) == w4a8.LAYOUT_VERSION
    again = W8A8Linear.from_linear(torch.nn.Linear(256, 64), "int4:g128")
    again.load_state_dict(state)
    assert torch.equal(again.w, layer.w)
    # a state dict of layout version 1 loads as the same values
    old = dict(state, w=_pack_v1(w4a8.decode_packed(layer.w)), packed_layout_version=torch.tensor(1, dtype=torch.int32))
    third = W8A8Linear.from_linear(torch.nn.Linear(256, 64), "int4:g128")
    third.load_state_dict(old)
    assert torch.equal(third.w, layer.w) and int(third.packed_layout_version) == w4a8.LAYOUT_VERSION
    state["packed_layout_version"] = torch.tensor(w4a8.LAYOUT_VERSION + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"packed layout version {w4a8.LAYOUT_VERSION + 1}, but this humming_aot "
                                         f"reads version {w4a8.LAYOUT_VERSION}"):
        again.load_state_dict(state)


def test_packed_tensors_that_disagree_with_their_fields_are_refused():
    import dataclasses

    _, _, packed, qa = _operands(3, 64, 256)
    with pytest.raises(ValueError, match="make it with humming_aot.w4a8.pack"):
        w4a8.gemm(qa, dataclasses.replace(packed, group_size=256))  # w_scale has two rows, not one
    with pytest.raises(ValueError, match="make it with humming_aot.w4a8.pack"):
        w4a8.gemm(qa, dataclasses.replace(packed, w=packed.w[:1]))


def test_codes_of_another_or_no_layout_version_are_refused():
    """A PackedW4A8Weight carries its packed layout version; gemm and the layer refuse another one
    (or none recorded), a state dict without it, and encode refuses values outside int4."""
    import dataclasses

    from humming_aot.nn import W8A8Linear

    _, _, packed, qa = _operands(3, 64, 256)
    assert packed.layout_version == w4a8.LAYOUT_VERSION
    for version, what in ((None, "records no packed layout version"), (1, "packed layout version 1")):
        stale = dataclasses.replace(packed, layout_version=version)
        with pytest.raises(ValueError, match=what):
            w4a8.gemm(qa, stale)
        with pytest.raises(ValueError, match="upgrade_packed"):
            W8A8Linear(stale, "float8e4m3:token")
    layer = W8A8Linear.from_linear(torch.nn.Linear(256, 64), "int4:g128")
    assert layer.packed.layout_version == w4a8.LAYOUT_VERSION
    state = layer.state_dict()
    del state["packed_layout_version"]
    with pytest.raises(ValueError, match="without their packed layout version"):
        W8A8Linear.from_linear(torch.nn.Linear(256, 64), "int4:g128").load_state_dict(state, strict=False)
    for bad in (8, -9):
        with pytest.raises(ValueError, match="int4 values -8..7"):
            w4a8.encode(torch.tensor([0, bad]))
