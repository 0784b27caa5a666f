"""The W8A8 pairings (float8, int8) on the CPU: packing, the float64 reference path of w8a8.gemm, the
wgmma-ss body's names, tile rules and generated source, its Params bytes, NVRTC and nvcc
compiling its keys, and the errors a caller can cause (GPU runs: tests/gpu/test_w8a8_gpu.py)."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from humming_aot import codegen, formats, ops, params_abi, quant, w8a8
from humming_aot.bodies.wgmma_ss import WGMMA_SS
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey, MmaKind

REPO = Path(__file__).resolve().parents[2]
ALL_M = (1, 8, 9, 16, 17, 32, 33, 64, 65, 1024, 1025, 8192)


def _operands(m, n, k, seed=0, act="float8e4m3:token", wfmt="float8e4m3:channel"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    return x, w, w8a8.pack(quant.quantize(w, wfmt)), ops.quantize_activation(x, act)


def test_pack_keeps_the_codes_and_widens_the_scales():
    _, w, packed, _ = _operands(3, 100, 256)
    qw = quant.quantize(w, "float8e4m3:channel")
    assert (packed.n, packed.k, packed.n_valid, packed.out_features) == (112, 256, 100, 100)
    assert torch.equal(packed.w[:100], qw.codes) and not packed.w[100:].any()
    assert torch.equal(packed.w_scale[:100], qw.scales.reshape(-1)) and not packed.w_scale[100:].any()
    tensor = w8a8.pack(quant.quantize(w[:96], "float8e4m3:tensor"))
    assert tensor.n_valid is None and tensor.w_scale.unique().numel() == 1


def test_cpu_gemm_is_the_float64_product_of_the_codes_rounded_once():
    x, w, packed, qa = _operands(5, 64, 128)
    e4m3 = formats.get("float8e4m3")
    a = e4m3.decode(qa.codes).double() * qa.scales.double()
    wt = e4m3.decode(packed.w).double() * packed.w_scale.double()[:, None]
    bias = torch.randn(64).to(torch.bfloat16)
    expected = formats.round_to(a @ wt.T + bias.double(), torch.bfloat16)
    assert torch.equal(w8a8.gemm(qa, packed, bias=bias), expected)
    assert torch.equal(w8a8.reference(qa, packed, bias), a @ wt.T + bias.double())
    assert torch.equal(ops.gemm(qa, packed, bias), expected)  # the op routes a W8A8 weight here
    # and it approximates the float product (e4m3 keeps 3 mantissa bits)
    rel = ((w8a8.gemm(qa, packed).double() - x.double() @ w.double().T).norm() / (x @ w.T).norm()).item()
    assert rel < 0.1


def test_leading_dimensions_and_per_tensor_activation_scales():
    _, _, packed, qa = _operands(6, 64, 128, act="float8e4m3:tensor")
    y = w8a8.gemm(qa, packed, out_dtype=torch.float16)
    assert y.dtype == torch.float16 and y.shape == (6, 64)
    qa3 = quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                                    scale_dtype="float32", codes=qa.codes.reshape(2, 3, 128), scales=qa.scales)
    assert torch.equal(w8a8.gemm(qa3, packed, out_dtype=torch.float16).reshape(6, 64), y)


def test_errors_say_what_to_do():
    _, w, packed, qa = _operands(2, 64, 128)
    with pytest.raises(ValueError, match="quantize with 'float8e4m3:channel'"):
        w8a8.pack(quant.quantize(w, "int8:g64"))
    with pytest.raises(ValueError, match="symmetric int8 or int4 \\(W4A4\\) weights"):
        w8a8.pack(quant.quantize(w.abs(), "uint8:channel:zp"))
    with pytest.raises(ValueError, match="multiple of 16"):
        w8a8.pack(quant.quantize(torch.randn(16, 72), "float8e4m3:channel"))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        w8a8.pack(w)
    with pytest.raises(ValueError, match="float8e4m3 activations with a float32 scale per token"):
        w8a8.gemm(ops.quantize_activation(torch.randn(2, 128), "int8:token"), packed)
    with pytest.raises(ValueError, match="K=64 but the weight has K=128"):
        w8a8.gemm(ops.quantize_activation(torch.randn(2, 64), "float8e4m3:token"), packed)
    with pytest.raises(ValueError, match=r"bias must be a contiguous \(64,\) torch.bfloat16"):
        w8a8.gemm(qa, packed, bias=torch.zeros(63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="out_dtype"):
        w8a8.gemm(qa, packed, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="bias must be a contiguous"):
        w8a8.gemm(qa, packed, bias=torch.zeros(128, dtype=torch.bfloat16)[::2])
    with pytest.raises(ValueError, match="W8A8 GEMM's bias is bfloat16 or float16"):
        ops.gemm(qa, packed, torch.zeros(64))
    with pytest.raises(ValueError, match="leave them None on the CPU"):
        w8a8.gemm(qa, packed, tile="wgmma-ss:8x128x128_w1x4_s6")


@pytest.mark.parametrize("m", ALL_M)
def test_every_m_has_a_tile_whose_key_round_trips(m):
    tile = w8a8.select_tile(m)
    # up to 32 tokens a tile that holds them all, then 64 up to 128 tokens, then 128
    assert tile.mma is MmaKind.WGMMA_SS and tile.block_m == (next(t for t in (8, 16, 32) if m <= t) if m <= 32
                                                             else 64 if m <= 128 else 128)
    for dtype in (torch.bfloat16, torch.float16):
        key = w8a8.kernel_key("sm90a", dtype, tile)
        assert KernelKey.from_name(key.name) == key and key.scales_in_fp32
        assert "_wgmma-ss_a-e4m3-k-f32_w-e4m3-g-f32_o-" in key.name


def test_the_64_token_rows_give_way_to_128_tokens_past_one_wave():
    """65-128 tokens: the 64-token tile while its tiles fit on the SMs at once, else 128 tokens."""
    assert w8a8.select_tile(128, n=8192).block_m == 64  # 2 x 64 tiles: one wave of 132
    assert w8a8.select_tile(128, n=8448).block_m == 64 and w8a8.select_tile(128, n=8576).block_m == 128
    assert w8a8.select_tile(100, n=28672).block_m == 128 and w8a8.select_tile(64, n=28672).block_m == 64
    assert w8a8.select_tile(128, n=28672, num_sms=500).block_m == 64
    assert w8a8.select_tile(128, n=28672).label == w8a8.select_tile(129).label


def test_the_64_token_tile_past_128_tokens_where_it_fits_one_wave_at_short_k():
    """More than 128 tokens: the 64-token tile only where its tiles fit in one wave and K is at most
    _WIDE_64_TOKEN_MAX_K; block scales keep 128 tokens from 65."""
    short, long_k = w8a8._WIDE_64_TOKEN_MAX_K, w8a8._WIDE_64_TOKEN_MAX_K + 128
    for element in ("float8e4m3", "int8"):
        assert w8a8.select_tile(256, n=4096, k=short, element=element).block_m == 64  # 4 x 32 = 128 tiles
        assert w8a8.select_tile(256, n=4224, k=4096, element=element).block_m == 64  # 132 tiles
        assert w8a8.select_tile(256, n=4352, k=4096, element=element).block_m == 128  # 136 tiles
        assert w8a8.select_tile(512, n=2048, k=4096, element=element).block_m == 64
        assert w8a8.select_tile(640, n=2048, k=4096, element=element).block_m == 128  # 160 tiles
        assert w8a8.select_tile(256, n=4096, k=long_k, element=element).block_m == 128
        assert w8a8.select_tile(256, n=4096, element=element).block_m == 128  # K not given
        assert w8a8.select_tile(128, n=4096, k=long_k, element=element).block_m == 64  # its own row: any K
    assert w8a8.select_tile(256, blocks=True, n=2048, k=4096).block_m == 128
    assert w8a8.select_tile(100, blocks=True, n=2048, k=4096).block_m == 128


def test_tile_rules_name_the_limit():
    with pytest.raises(ValueError, match="stages 128 K"):
        parse_tile_field("wgmma-ss:64x128x64_w1x8_s4")
    with pytest.raises(ValueError, match="tokens per CTA"):
        parse_tile_field("wgmma-ss:48x128x128_w1x8_s4")
    with pytest.raises(ValueError, match="holds at most 192"):
        parse_tile_field("wgmma-ss:256x256x128_w1x8_s2")
    with pytest.raises(ValueError, match="64 or 128 channels per consumer warpgroup"):
        parse_tile_field("wgmma-ss:64x512x128_w1x8_s2")
    tile = parse_tile_field("wgmma-ss:64x128x128_w1x8_s6")
    with pytest.raises(ValueError, match="a-e4m3-k-f32"):
        KernelKey.from_name("gemm_dense_sm90a_wgmma-ss_a-bf16_w-s4-g-bf16_o-bf16_" + tile.field)
    with pytest.raises(ValueError, match="exist only for sm90a"):
        w8a8.kernel_key("sm89", torch.bfloat16, tile)


def test_generated_source_and_shared_memory():
    key = w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field("wgmma-ss:192x128x128_w1x8_s5"))
    source = codegen.kernel_source(key)
    assert "humming_aot::kernel::DenseWgmmaSs<\n    humming_aot::numerics::BFloat16," in source
    assert "192, 128, 1, 5>" in source and "ScaledTmaGemmParams params" in source
    # five slots of (128 + 192) rows of 128 bytes, + the 1024 bytes of base alignment
    assert f"Kernel::kSmemBytes == {5 * 320 * 128 + 1024}" in source
    assert WGMMA_SS.smem_bytes(key.tile, 8, False) == 5 * 320 * 128 + 1024
    # the staging tile when it outgrows the ring: 8 tokens x 2 slots
    small = parse_tile_field("wgmma-ss:8x128x128_w1x4_s2")
    assert WGMMA_SS.smem_bytes(small, 8, False) == 2 * 17 * 1024 + 1024


def test_params_bytes_follow_the_header():
    gemm = params_abi.GEMM_PARAMS.pack(*range(1, 9), 9, 10, 11, 12, 13, 14, 15, 1.0)
    schedule = params_abi.TMA_SCHEDULE.pack(3, 4, 1)
    params = w8a8._pack_params(gemm, schedule, b"\xaa" * 128, b"\xbb" * 128, 0x1234)
    assert len(params) == w8a8.SCALED_PARAMS_BYTES == 448
    assert params[:104] == gemm and params[104:116] == schedule and params[116:128] == bytes(12)
    assert params[128:256] == b"\xaa" * 128 and params[256:384] == b"\xbb" * 128
    assert struct.unpack_from("<Q", params, 384)[0] == 0x1234 and params[392:] == bytes(56)
    text = (REPO / "csrc" / "include" / "humming_aot" / "kernel" / "params.cuh").read_text()
    assert "sizeof(ScaledTmaGemmParams) == 448" in text


def test_nvrtc_compiles_a_key():
    from humming_aot import jit
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the test compiles with NVRTC", "to compile")
    if why is not None:
        pytest.skip(why)
    key = w8a8.kernel_key("sm90a", torch.float16, w8a8.select_tile(64))
    image = jit.compile_kernel(key)
    assert len(image) > 10000


@pytest.mark.slow
def test_nvcc_compiles_every_table_tile_without_spills():
    import subprocess
    import tempfile

    from humming_aot.aot import ninja

    try:
        nvcc = ninja.find_nvcc()
    except ninja.NvccNotFoundError:
        pytest.skip("nvcc not found (set HUMMING_AOT_NVCC)")
    include = str(REPO / "csrc" / "include")
    keys = [w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(label)) for _, label in w8a8._TILES]
    keys += [w8a8.kernel_key("sm90a", torch.float16, parse_tile_field(label), blocks=True)
             for _, label in w8a8._BLOCK_TILES]
    keys += [w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(label), element="int8")
             for _, label in w8a8._INT8_TILES]
    for key in keys:
        with tempfile.TemporaryDirectory() as tmp:
            src = f"{tmp}/k.cu"
            open(src, "w").write(codegen.kernel_source(key))
            done = subprocess.run([str(nvcc), "-cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-I", include,
                                   "-Xptxas", "-v", src, "-o", f"{tmp}/k.cubin"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert " 0 bytes spill stores" in done.stderr and "bytes stack frame" in done.stderr, (key.name, done.stderr)


def test_block_scales_pack_reference_and_keys():
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(200, 384, generator=gen), torch.randn(7, 384, generator=gen)
    qw = quant.quantize(w, "float8e4m3:b128x128")
    packed = w8a8.pack(qw)
    assert packed.blocks and packed.w_scale.shape == (2, 3) and (packed.n, packed.n_valid) == (208, 200)
    qa = ops.quantize_activation(x, "float8e4m3:g128")
    e4m3 = formats.get("float8e4m3")
    a = e4m3.decode(qa.codes).double() * qa.scales.double().repeat_interleave(128, 1)
    wt = e4m3.decode(qw.codes).double() * qw.scales.double().repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)
    assert torch.equal(w8a8.reference(qa, packed), a @ wt.T)
    assert torch.equal(w8a8.gemm(qa, packed), formats.round_to(a @ wt.T, torch.bfloat16))
    with pytest.raises(ValueError, match="quantize with 'float8e4m3:g128'"):
        w8a8.gemm(ops.quantize_activation(x, "float8e4m3:token"), packed)
    channel = w8a8.pack(quant.quantize(w, "float8e4m3:channel"))
    with pytest.raises(ValueError, match="per 128 x 128 block for 'float8e4m3:g128'"):
        w8a8.gemm(qa, channel)
    with pytest.raises(ValueError, match="float8e4m3:b128x128"):
        w8a8.pack(quant.quantize(w, "float8e4m3:b64x128"))
    for m in ALL_M:
        key = w8a8.kernel_key("sm90a", torch.bfloat16, w8a8.select_tile(m, blocks=True), blocks=True)
        assert "_a-e4m3-g-f32_w-e4m3-b-f32_" in key.name and KernelKey.from_name(key.name) == key
        assert "    true,  // scales per 128 x 128 weight block" in codegen.kernel_source(key)
    # the 192-token tile leaves no room for the token scales
    with pytest.raises(ValueError, match="token scales"):
        w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field("wgmma-ss:192x128x128_w1x8_s5"), blocks=True)


def test_the_default_catalog_holds_every_table_tile():
    from humming_aot.enumerate import enumerate_keys

    names = {key.name for key in enumerate_keys("default", ["sm90a"])}
    for blocks, table in ((False, w8a8._TILES), (True, w8a8._BLOCK_TILES)):
        for _, label in table:
            for dtype in (torch.bfloat16, torch.float16):
                assert w8a8.kernel_key("sm90a", dtype, parse_tile_field(label), blocks=blocks).name in names


def test_gemm_is_a_custom_op_under_torch_compile_and_fake_tensors():
    for blocks in (False, True):
        formats = dict(act="float8e4m3:g128", wfmt="float8e4m3:b128x128") if blocks else {}
        _, _, packed, qa = _operands(6, 100, 256, seed=3, **formats)
        bias = torch.randn(100).to(torch.bfloat16)
        eager = w8a8.gemm(qa, packed, bias=bias)
        fn = torch.compile(lambda codes, scales: w8a8.gemm(
            quant.QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=qa.group_size,
                                      scale_dtype="float32", codes=codes, scales=scales), packed, bias=bias),
            backend="eager", fullgraph=True)
        assert torch.equal(fn(qa.codes, qa.scales), eager)
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            out = torch.ops.humming_aot.gemm_w8a8(mode.from_tensor(qa.codes.reshape(2, 3, 256)), mode.from_tensor(
                qa.scales.reshape(2, 3, -1)), packed.w, packed.w_scale, None, 100, blocks, qa.granularity.value,
                qa.group_size or 0, torch.float16)
            assert out.shape == (2, 3, 100) and out.dtype == torch.float16
        with torch.device("cpu"):  # a torch function mode: the op path, where tile, out and stream_k are refused
            assert torch.equal(w8a8.gemm(qa, packed, bias=bias), eager)
            with pytest.raises(ValueError, match="eager-only"):
                w8a8.gemm(qa, packed, tile="wgmma-ss:8x128x128_w1x4_s6")


def test_w8a8_linear_quantizes_its_input_and_matches_the_reference():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(4)
    linear = torch.nn.Linear(256, 100)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    for fmt, acts in (("float8e4m3:channel", "float8e4m3:token"), ("float8e4m3:b128x128", None)):
        layer = QuantizedLinear.from_linear(linear, fmt, activations=acts or "float8e4m3:g128")
        assert isinstance(layer, W8A8Linear) and "activations='float8e4m3:" in repr(layer)
        y = layer(x)
        assert y.shape == (2, 3, 100) and y.dtype == torch.bfloat16
        qa = ops.quantize_activation(x, layer.activations)
        expected = formats.round_to(w8a8.reference(qa, layer.packed) + linear.bias.detach().to(torch.bfloat16).double(),
                                    torch.bfloat16)
        assert torch.equal(y.reshape(6, 100), expected)
        rel = ((y.double() - linear(x.float()).double()).norm() / linear(x.float()).double().norm()).item()
        assert rel < 0.1
    with pytest.raises(ValueError, match="do not suit weights"):
        W8A8Linear.from_linear(linear, "float8e4m3:channel", activations="float8e4m3:g128")


def test_int8_pack_reference_keys_and_errors():
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(100, 256, generator=gen), torch.randn(7, 256, generator=gen)
    qw = quant.quantize(w, "int8:channel")
    packed = w8a8.pack(qw)
    assert packed.element == "int8" and not packed.blocks and (packed.n, packed.n_valid) == (112, 100)
    qa = ops.quantize_activation(x, "int8:token")
    int8 = formats.get("int8")
    a = int8.decode(qa.codes).double() * qa.scales.double()
    wt = int8.decode(qw.codes).double() * qw.scales.double().reshape(-1, 1)
    assert torch.equal(w8a8.reference(qa, packed), a @ wt.T)
    assert torch.equal(w8a8.gemm(qa, packed, out_dtype=torch.float16), formats.round_to(a @ wt.T, torch.float16))
    assert torch.equal(ops.gemm(qa, packed), formats.round_to(a @ wt.T, torch.bfloat16))
    rel = ((w8a8.gemm(qa, packed).double() - x.double() @ w.double().T).norm() / (x @ w.T).norm()).item()
    assert rel < 0.02  # int8 keeps 7 bits of each row's scale
    tensor = w8a8.pack(quant.quantize(w, "int8:tensor"))
    assert tensor.element == "int8" and tensor.w_scale[:100].unique().numel() == 1
    with pytest.raises(ValueError, match="takes int8 activations with a float32 scale per token"):
        w8a8.gemm(ops.quantize_activation(x, "float8e4m3:token"), packed)
    with pytest.raises(ValueError, match="quantize with 'int8:token' or 'int8:tensor'"):
        w8a8.gemm(ops.quantize_activation(x, "int8:g128"), packed)
    with pytest.raises(ValueError, match="takes float8e4m3 activations"):
        w8a8.gemm(qa, w8a8.pack(quant.quantize(w, "float8e4m3:channel")))
    for m in ALL_M:
        tile = w8a8.select_tile(m, element="int8")
        key = w8a8.kernel_key("sm90a", torch.bfloat16, tile, element="int8")
        assert "_wgmma-ss_a-s8-k-f32_w-s8-g-f32_o-bf16_" in key.name and KernelKey.from_name(key.name) == key
        assert "humming_aot::mma::S8Codes,  // both operands' codes: int8" in codegen.kernel_source(key)
    # exact sums hold no promotion's scratch set: tiles float8 cannot hold, and the 256-token wgmma
    wide = parse_tile_field("wgmma-ss:128x256x128_w1x8_s4")
    assert w8a8.kernel_key("sm90a", torch.bfloat16, wide, element="int8").tile == wide
    with pytest.raises(ValueError, match="float8e4m3 tiles hold 128 fp32 accumulators"):
        w8a8.kernel_key("sm90a", torch.bfloat16, wide)
    with pytest.raises(ValueError, match="float8e4m3 tiles hold"):
        w8a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field("wgmma-ss:256x128x128_w1x8_s4"))
    with pytest.raises(ValueError, match="int8 x int8 per token and per channel"):
        KernelKey.from_name("gemm_dense_sm90a_wgmma-ss_a-s8-g-f32_w-s8-b-f32_o-bf16_" + wide.field)


def test_int8_linear_custom_op_and_catalog():
    from humming_aot.enumerate import enumerate_keys
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(6)
    linear = torch.nn.Linear(256, 100)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, "int8:channel", activations="int8:token")
    assert isinstance(layer, W8A8Linear) and layer.activations == "int8:token"
    assert W8A8Linear.from_linear(linear, "int8:channel").activations == "int8:token"
    qa = ops.quantize_activation(x, "int8:token")
    expected = formats.round_to(w8a8.reference(qa, layer.packed) + linear.bias.detach().to(torch.bfloat16).double(),
                                    torch.bfloat16)
    assert torch.equal(layer(x).reshape(6, 100), expected)
    with pytest.raises(ValueError, match="int8:token or int8:tensor"):
        W8A8Linear.from_linear(linear, "int8:channel", activations="float8e4m3:token")
    fn = torch.compile(lambda codes, scales: w8a8.gemm(
        quant.QuantizedActivation(element="int8", granularity=qa.granularity, group_size=None, scale_dtype="float32",
                                  codes=codes, scales=scales), layer.packed), backend="eager", fullgraph=True)
    assert torch.equal(fn(qa.codes, qa.scales), w8a8.gemm(qa, layer.packed))
    names = {key.name for key in enumerate_keys("default", ["sm90a"])}
    for _, label in w8a8._INT8_TILES:
        for dtype in (torch.bfloat16, torch.float16):
            assert w8a8.kernel_key("sm90a", dtype, parse_tile_field(label), element="int8").name in names


def test_partial_last_waves_stream_k_at_decode_sizes():
    from humming_aot.heuristics import partial_wave_stream_k

    def rule(two, m, tiles, k_tiles, slots):  # W8A8's K tiles are 128 columns
        return partial_wave_stream_k(two_warpgroups=two, m=m, tiles=tiles, k=128 * k_tiles, slots=slots, max_tiles=4096)

    assert rule(False, 1, 448, 64, 264)  # 57344 x 8192: 1.7 waves, 85 % full on average
    assert not rule(False, 1, 528, 64, 264)  # two whole waves
    assert not rule(False, 1, 500, 64, 264)  # two waves 95 % full on average
    assert not rule(False, 1, 200, 64, 264)  # below a wave: heuristics.stream_k_ctas' case
    assert rule(True, 128, 448, 64, 132) and rule(True, 100, 288, 56, 132)
    assert not rule(True, 128, 224, 32, 132)  # short K: the fix-up is not paid back
    assert not rule(True, 256, 448, 64, 132)  # past decode sizes
    assert not rule(True, 128, 5000, 64, 132)  # more tiles than split-K counters


def test_int8_k_whose_sums_could_overflow_int32_is_refused():
    assert w8a8.INT8_MAX_K * 128 * 128 <= 2**31 - 1 < (w8a8.INT8_MAX_K + 1) * 128 * 128
    gen = torch.Generator().manual_seed(7)
    longest = w8a8.INT8_MAX_K // w8a8.K_ALIGN * w8a8.K_ALIGN
    assert w8a8.pack(quant.quantize(torch.randn(16, longest, generator=gen), "int8:channel")).k == longest
    with pytest.raises(ValueError, match="overflow the kernel's int32 accumulators; split K"):
        w8a8.pack(quant.quantize(torch.randn(16, longest + w8a8.K_ALIGN, generator=gen), "int8:channel"))
    # float8 sums are promoted to fp32 every 128 of K: no such limit
    assert w8a8.pack(quant.quantize(torch.randn(16, longest + w8a8.K_ALIGN, generator=gen), "float8e4m3:channel"))


def test_a_cast_of_the_layer_keeps_its_packed_scales():
    """model.to(torch.bfloat16) (a whole model cast) moves W8A8Linear's buffers but leaves the codes'
    and scales' dtypes as packed (the kernels read float32 scales by address): the same outputs
    after the cast, for W8A8 per channel (per token and with a static scale), per block, and W4A8."""
    from humming_aot.nn import QuantizedLinear

    linear = torch.nn.Linear(256, 128)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    for fmt, act, static in (("float8e4m3:channel", "float8e4m3:token", None),
                             ("float8e4m3:channel", "float8e4m3:tensor", 0.05),
                             ("float8e4m3:b128x128", "float8e4m3:g128", None), ("int4:g128", "int8:token", None)):
        layer = QuantizedLinear.from_linear(linear, fmt, activations=act)
        if static is not None:
            layer = type(layer)(layer.packed, act, layer.bias, static_scale=static)
        y = layer(x)
        dtypes = {name: b.dtype for name, b in layer.named_buffers() if name != "bias"}
        for cast in (torch.bfloat16, torch.float16, torch.float64):
            layer = layer.to(cast)
            assert {name: b.dtype for name, b in layer.named_buffers() if name != "bias"} == dtypes, (fmt, cast)
            assert layer.bias.dtype == cast
        assert torch.equal(layer.to(torch.bfloat16)(x), y), fmt
