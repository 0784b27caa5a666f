"""W4A8 with MXFP4 weights (float4e2m1, an e8m0 scale per 32 of K) x float8e4m3 on the CPU: the
kernel's table conversion (numerics/e2m1_e4m3.cuh, emulated with its constants) for every code,
place and group offset, the packed layout against the PTX 8-bit A fragment with each K tile's
entries, pack's entries and window, the float64 reference path, the keys of both bodies, the
generated source and nvcc (NVRTC: test_w4a8.py), the layer and the custom op (GPU runs:
tests/gpu/test_w4a8_mxfp4_gpu.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from humming_aot import codegen, formats, ops, quant, w4a8
from humming_aot.bodies.wgmma_w4a8 import overlapped
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey
from humming_aot.testing.nvcc import needs_nvcc
from humming_aot.testing.w4a8_layout import fragment_steps
from humming_aot.testing.w8a8 import assert_w4a8_op_compiles_and_fakes

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "csrc" / "include" / "humming_aot" / "numerics" / "e2m1_e4m3.cuh"
E4M3, E2M1 = formats.get("float8e4m3"), formats.get("float4e2m1")
_MX = w4a8.MXFP4_ELEMENT


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte n from byte (selector nibble n & 7) of b:a, or with the
    nibble's bit 3 its msb replicated."""
    data = a | (b << 32)
    out = 0
    for n in range(4):
        nibble = (selector >> (4 * n)) & 0xF
        byte = (data >> (8 * (nibble & 7))) & 0xFF
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * n)
    return out


def _header_constants() -> tuple[tuple[int, int], tuple[int, int]]:
    """The two table IMADs' (multiplier, addend) of E2m1ToE4m3::table, read from its header."""
    found = re.findall(r"o \* (0x[0-9A-Fa-f]+)u \+ (0x[0-9A-Fa-f]+)u", HEADER.read_text())
    assert len(found) == 2, found
    return tuple((int(m, 16), int(c, 16)) for m, c in found)


def _table(group_bytes: int, group: int) -> tuple[int, int]:
    (m_lo, c_lo), (m_hi, c_hi) = _header_constants()
    o = _prmt(group_bytes, 0, 0x4440 + group)
    return (o * m_lo + c_lo) & 0xFFFFFFFF, (o * m_hi + c_hi) & 0xFFFFFFFF


def _convert(codes: int, low: tuple[int, int], high: tuple[int, int]) -> tuple[int, int]:
    """E2m1ToE4m3::convert, emulated."""
    magnitudes = codes & 0x77777777
    a_low = _prmt(low[0], low[1], magnitudes & 0xFFFF) | ((codes << 4) & 0x80808080)
    a_high = _prmt(high[0], high[1], magnitudes >> 16) | (codes & 0x80808080)
    return a_low & 0xFFFFFFFF, a_high & 0xFFFFFFFF


def _e4m3_values(register: int) -> list[float]:
    return [E4M3.decode(torch.tensor([(register >> (8 * j)) & 0xFF], dtype=torch.uint8)).item() for j in range(4)]


def _weight(n: int, k: int, gen: torch.Generator, spread: int = 11) -> quant.QuantizedWeight:
    """Random codes and power-of-two group scales: per channel and K tile a base exponent in
    -20 .. 20, each group 0 .. spread binades below it."""
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    groups = k // 32
    base = torch.randint(-20, 21, (n, -(-groups // 4)), generator=gen).repeat_interleave(4, 1)[:, :groups]
    exponents = base - torch.randint(0, spread + 1, (n, groups), generator=gen)
    return quant.QuantizedWeight(format=quant.WeightFormat.parse("mxfp4"), codes=codes,
                                 scales=torch.pow(2.0, exponents.double()).float())


def test_every_code_place_and_group_offset_converts_to_its_e4m3_value():
    """A code packed alone at any of a word's eight places comes out at its register byte as the
    e2m1 value times 2^d for every offset d the window holds, the other bytes zero."""
    for d in range(-5, 7):
        o = 8 * (d + 5)
        for code in range(16):
            for r in range(2):
                for j in range(4):
                    codes = torch.zeros(64, 128, dtype=torch.uint8)
                    codes[8 * r, j] = code  # warp 0, lane 0, K step 0: word 0's register r, byte j
                    packed = w4a8._pack_mxfp4_codes(codes)
                    word = int.from_bytes(bytes(packed[0, 0, :4].tolist()), "little")
                    group = _table(o << 16, 2)  # the byte of group 2 (any group reads its own byte)
                    registers = _convert(word, group, group)
                    value = E2M1.decode(torch.tensor([code], dtype=torch.uint8)).item() * 2.0**d
                    got = _e4m3_values(registers[r])
                    assert got[j] == value, (d, code, r, j, got)
                    others = [x for i, x in enumerate(got + _e4m3_values(registers[1 - r])) if i != j]
                    assert all(x == 0 for x in others), (d, code, r, j)


def test_the_packed_layout_and_entries_are_the_8_bit_wgmma_a_fragment():
    """Each consumer thread's 16-byte loads, converted with the tables of its rows' entries for the
    step's group and weighed by the tile scale, hold the rows and K of the PTX ISA's 8-bit A
    fragment (m64nNk32: warp w rows 16 w + g (+ 8), register r: K 4 t .. 4 t + 3 (+ 16)), valued as
    the dequantized weight."""
    gen = torch.Generator().manual_seed(7)
    n, k = 128, 256
    qw = _weight(n, k, gen)
    dequantized = quant.dequantize(qw).double()
    packed = w4a8.pack(qw)
    assert packed.w.shape == (2, 2, 4096) and packed.w_scale.shape == (2, 128, 2)
    entries = packed.w_scale
    for step in fragment_steps(packed.w):
        scale = [entries[step.k_tile, row, 0:1].view(torch.float32).item() for row in step.rows]
        group_bytes = [int(entries[step.k_tile, row, 1]) & 0xFFFFFFFF for row in step.rows]
        low, high = _table(group_bytes[0], step.kk), _table(group_bytes[1], step.kk)
        a0, a1 = _convert(step.words[0], low, high)
        a2, a3 = _convert(step.words[1], low, high)
        for r, register in enumerate((a0, a1, a2, a3)):
            row, k0 = step.rows[r & 1], step.k0(r)
            got = [v * scale[r & 1] for v in _e4m3_values(register)]
            assert got == dequantized[row, k0:k0 + 4].tolist(), (step, r)


def test_pack_pads_and_decodes_back():
    gen = torch.Generator().manual_seed(1)
    for n, k in ((200, 416), (64, 128), (130, 96)):
        qw = quant.quantize(torch.randn(n, k, generator=gen), "mxfp4")
        packed = w4a8.pack(qw)
        n_pad, k_tiles = -(-n // 64) * 64, -(-k // 128)
        span = 1 << (k_tiles - 1).bit_length()  # (a Gaussian's groups fold over all of K: its power of two)
        assert (packed.n, packed.k, packed.out_features, packed.group_size, packed.element) == (n_pad, k, n,
                                                                                               128 * span, _MX)
        assert packed.n_valid == (n if n != n_pad else None)
        assert packed.w.shape == (k_tiles, n_pad // 64, 4096) and packed.w_scale.shape == (k_tiles, n_pad, 2)
        assert torch.equal(packed.effective_weight(), quant.dequantize(qw).double())
        values = w4a8.decode_packed_mxfp4(packed.w)
        assert not values[n:].any() and not values[:, k:].any()  # the padding is code 0
        assert not packed.w_scale[:, n:, 0].any()  # tile scale 0 past N


def test_entries_take_the_window_and_ignore_groups_of_zero_codes():
    gen = torch.Generator().manual_seed(2)
    qw = _weight(64, 256, gen)
    # a group of zero codes far below its tile's others: its scale is outside the window, but no
    # value depends on it
    codes, scales = qw.codes.clone(), qw.scales.clone()
    codes[3, 32:64] = 8  # -0 (sign only)
    scales[3, 1] = 2.0**-100
    zeros = quant.QuantizedWeight(format=qw.format, codes=codes, scales=scales)
    packed = w4a8.pack(zeros)
    assert torch.equal(packed.effective_weight(), quant.dequantize(zeros).double())
    # one group 12 binades below the largest of its tile, with a nonzero code: refused
    scales[5, 4:8] = 1.0
    scales[5, 6] = 2.0**-12
    with pytest.raises(ValueError, match=r"1 channel spans of 1 K tile\(s\) \(the first: channel 5, K 128 \.\. 255\) "
                                         r"whose group scales lie more than 2\^11 apart.*16-bit activations"):
        w4a8.pack(quant.QuantizedWeight(format=qw.format, codes=codes, scales=scales))
    scales[5, 6] = 2.0**-11  # 11 binades: the window's edge
    edge = quant.QuantizedWeight(format=qw.format, codes=codes, scales=scales)
    packed = w4a8.pack(edge)
    assert torch.equal(packed.effective_weight(), quant.dequantize(edge).double())
    offsets = int(packed.w_scale[1, 5, 1])
    assert [(offsets >> (8 * g)) & 0xFF for g in range(4)] == [8 * 11, 8 * 11, 0, 8 * 11]  # d = 6, 6, -5, 6
    assert packed.w_scale[1, 5, 0:1].view(torch.float32).item() == 2.0**-6


def test_spans_fold_over_k_tiles_where_exact():
    """pack folds the scales over the longest span (K tiles, a power of two up to MAX_SPAN) in
    which each channel's groups lie within the window: every K tile's entry then holds its span's
    scale, and the effective weight is exact for every span."""
    from humming_aot import w4a8_mxfp4

    gen = torch.Generator().manual_seed(5)
    n, k = 70, 11 * 128 - 32
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    exponents = -torch.randint(0, 4, (n, k // 32), generator=gen)  # every group within 3 binades
    qw = quant.QuantizedWeight(format=quant.WeightFormat.parse("mxfp4"), codes=codes,
                               scales=torch.pow(2.0, exponents.double()).float())
    assert w4a8.pack(qw).group_size == 128 * w4a8_mxfp4.MAX_SPAN
    for span in (1, 2, 4, 8, 16):
        packed = w4a8.pack(qw, mxfp4_span=span)
        assert packed.group_size == 128 * span and packed.w_scale.shape == (11, 128, 2)
        assert torch.equal(packed.effective_weight(), quant.dequantize(qw).double()), span
        bases = packed.w_scale[..., 0]
        for first in range(0, 11, span):  # one base per channel over each span
            assert torch.equal(bases[first:first + span], bases[first:first + 1].expand(min(span, 11 - first), -1))
    # channel 9's K tiles 4 .. 7 lie 12 binades below its K tiles 0 .. 3: spans of 4 fold, 8 do not
    far = exponents.clone()
    far[9, 0] = 0
    far[9, 16:32] = -12 - torch.randint(0, 4, (16,), generator=gen)
    far_qw = quant.QuantizedWeight(format=qw.format, codes=codes, scales=torch.pow(2.0, far.double()).float())
    assert w4a8.pack(far_qw).group_size == 128 * 4
    with pytest.raises(ValueError, match=r"channel spans of 8 K tile\(s\) \(the first: channel 9, K 0 \.\. 1023\).*"
                                         r"shorter span"):
        w4a8.pack(far_qw, mxfp4_span=8)
    assert torch.equal(w4a8.pack(far_qw).effective_weight(), quant.dequantize(far_qw).double())


def test_experts_share_the_shortest_span():
    from humming_aot.moe.a8 import pack_w4a8_experts

    gen = torch.Generator().manual_seed(6)
    codes = torch.randint(1, 8, (3, 64, 1024), generator=gen, dtype=torch.uint8)
    exponents = torch.zeros(3, 64, 32)
    exponents[1, 5, 8:16] = -12  # expert 1's K tiles 2 .. 3 lie 12 binades below 0 .. 1: spans of 2 at most
    qw = quant.QuantizedWeight(format=quant.WeightFormat.parse("mxfp4"), codes=codes,
                               scales=torch.pow(2.0, exponents.double()).float())
    assert w4a8.pack(quant.QuantizedWeight(format=qw.format, codes=codes[1], scales=qw.scales[1])).group_size == 256
    packed = pack_w4a8_experts(qw)
    assert packed.group_size == 256
    for e in range(3):
        assert torch.equal(packed.expert(e).effective_weight(), quant.dequantize(
            quant.QuantizedWeight(format=qw.format, codes=codes[e], scales=qw.scales[e])).double())


def _operands(m, n, k, seed=0, act="float8e4m3:token"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    return x, w, w4a8.pack(quant.quantize(w, "mxfp4")), ops.quantize_activation(x, act)


def test_cpu_gemm_is_the_float64_product_rounded_once():
    x, w, packed, qa = _operands(5, 100, 416)
    a = E4M3.decode(qa.codes).double() * qa.scales.double()
    expected = a @ quant.dequantize(quant.quantize(w, "mxfp4")).double().T
    bias = torch.randn(100).to(torch.bfloat16)
    assert torch.equal(w4a8.reference(qa, packed), expected)
    assert torch.equal(w4a8.gemm(qa, packed, bias=bias), formats.round_to(expected + bias.double(), torch.bfloat16))
    rel = ((w4a8.gemm(qa, packed).double() - x.double() @ w.double().T).norm() / (x.double() @ w.double().T).norm())
    assert rel.item() < 0.2  # mxfp4 weights and e4m3 activations approximate the float product


def test_errors_say_what_to_do():
    _, w, packed, qa = _operands(3, 64, 256)
    with pytest.raises(ValueError, match="takes float8e4m3 activations, got int8"):
        w4a8.gemm(ops.quantize_activation(torch.randn(3, 256), "int8:token"), packed)
    with pytest.raises(ValueError, match="or MXFP4 weights, got nvfp4"):
        w4a8.pack(quant.quantize(w, "nvfp4"))
    import dataclasses

    with pytest.raises(ValueError, match="int32 entries of shape"):
        w4a8.gemm(qa, dataclasses.replace(packed, w_scale=packed.w_scale.float()))
    with pytest.raises(ValueError, match="int32 entries of shape"):
        w4a8.gemm(qa, dataclasses.replace(packed, group_size=384))  # (a span of 3 K tiles: not a power of two)
    for span in (3, 0, True, "2"):
        with pytest.raises(ValueError, match="mxfp4_span=.*power of two"):
            w4a8.pack(quant.quantize(w, "mxfp4"), mxfp4_span=span)
    with pytest.raises(ValueError, match="for MXFP4 weights only"):
        w4a8.pack(quant.quantize(w, "int4:g128"), mxfp4_span=2)
    with pytest.raises(ValueError, match="element 'int2'"):
        w4a8.gemm(qa, dataclasses.replace(packed, element="int2"))


def test_keys_of_both_bodies():
    for m in (1, 16, 100, 4096):
        key = w4a8.kernel_key("sm90a", torch.bfloat16, w4a8.select_tile(m, n=4096), weight_element=_MX)
        assert KernelKey.from_name(key.name) == key and "_wgmma-w4a8_a-e4m3-k-f32_w-e2m1-g-ue8m0_" in key.name
        sync = w4a8.kernel_key("sm120", torch.float16, w4a8.select_sync_tile(m), weight_element=_MX)
        assert KernelKey.from_name(sync.name) == sync
    with pytest.raises(ValueError, match="needs sm89 or later, not sm86"):
        w4a8.kernel_key("sm86", torch.bfloat16, w4a8.select_sync_tile(16), weight_element=_MX)
    with pytest.raises(ValueError, match="MXFP4 weights .* x float8e4m3 activations"):
        w4a8.kernel_key("sm89", torch.bfloat16, w4a8.select_sync_tile(16), "int8", _MX)
    # one scratch set where int4's two fit (its group bytes and tables take the registers)
    tile = parse_tile_field("wgmma-w4a8:128x128x128_w1x8_s7")
    assert overlapped(tile) and not overlapped(tile, _MX)


def test_mxfp4_takes_the_192_token_tile_from_fewer_tokens():
    # MXFP4's dearer conversion: 192 tokens a CTA from MXFP4_WIDE_FROM tokens where the rows padded
    # to 192 are at most 5 % more than to 128, and above 1536 as for integer codes
    wide = {192: False, 256: False, 300: True, 384: True, 385: False, 512: False, 768: True, 1024: False,
            1152: True, 1280: True, 1344: True, 1345: False, 1536: True, 1537: True, 1600: True, 4096: True}
    assert w4a8.MXFP4_WIDE_FROM == 257
    for m, expected in wide.items():
        mx = w4a8.select_tile(m, n=8192, weight_element=_MX)  # (past one wave of 128-token tiles from 257)
        assert mx.block_m == (192 if expected else 128), m
        for element in (w4a8.WEIGHT_ELEMENT, w4a8.UINT4_ELEMENT):
            assert w4a8.select_tile(m, n=8192, weight_element=element).block_m == (192 if m > 1536 else 128), m
    # decode keeps its rows
    assert w4a8.select_tile(1, n=8192, weight_element=_MX).label == w4a8._WIDE_DECODE_TILE
    # where the 128-token tiles fit one wave (7 x 16 = 112 on 2048 channels and 132 SMs) they stay
    assert w4a8.select_tile(768, n=2048, weight_element=_MX).block_m == 128
    assert w4a8.select_tile(768, n=2048, num_sms=90, weight_element=_MX).block_m == 192
    assert w4a8.select_tile(768, weight_element=_MX).block_m == 192


def test_the_launch_passes_the_weight_element_to_the_table():
    # w8a8's launch path (shared with W4A8): MXFP4 at 768 tokens on sm90a takes the 192-token tile,
    # int4 the 128-token one
    from types import SimpleNamespace

    from humming_aot import _w8a8_launch

    info = SimpleNamespace(arches=("sm90a", "sm90"), num_sms=132)
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    for fmt, rows in (("mxfp4", 192), ("int4:g128", 128)):
        packed = w4a8.pack(quant.quantize(w, fmt))
        tile, key = _w8a8_launch._kernel(info, torch.bfloat16, packed, None, 768, 4096, w4a8.ACT_ELEMENT)
        assert tile.block_m == rows and key.tile == tile, fmt


def test_generated_source_and_the_default_catalog():
    from humming_aot.enumerate import enumerate_keys

    key = w4a8.kernel_key("sm90a", torch.bfloat16, w4a8.select_tile(1024, weight_element=w4a8.WEIGHT_ELEMENT),
                          weight_element=_MX)  # (the 128-token tile, which MXFP4 runs up to 768 tokens)
    text = codegen.kernel_source(key)
    assert "humming_aot::numerics::E2m1ToE4m3" in text and "kOverlapped == false" in text
    # 7 slots of 128 x 128 activation bytes + 128 x 72 (codes and entries) -> 25 KB, the staging tile after them
    assert f"Kernel::kSmemBytes == {7 * 25600 + 128 * 136 * 2 + 1024}" in text
    # 16 x 256: a slot of 2 KB + 256 x 72 -> 20 KB (int4's 19)
    wide = codegen.kernel_source(w4a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(w4a8._WIDE_DECODE_TILE),
                                                 weight_element=_MX))
    assert f"Kernel::kSmemBytes == {6 * 20480 + 16 * 264 * 2 + 1024}" in wide
    sync = codegen.kernel_source(w4a8.kernel_key("sm89", torch.bfloat16, w4a8.select_sync_tile(32), weight_element=_MX))
    assert "humming_aot::mma::E4m3SyncCodes" in sync and "humming_aot::numerics::E2m1ToE4m3" in sync
    names = {k.name for k in enumerate_keys("default", ["sm90a"])}
    for label in [label for _, label in w4a8._TILES] + [w4a8._WIDE_DECODE_TILE]:
        for dtype in (torch.bfloat16, torch.float16):
            assert w4a8.kernel_key("sm90a", dtype, parse_tile_field(label), weight_element=_MX).name in names
    for arch in ("sm89", "sm100", "sm110", "sm120"):
        names = {k.name for k in enumerate_keys("default", [arch])}
        for _, label in w4a8._SYNC_TILES:
            assert w4a8.kernel_key(arch, torch.bfloat16, parse_tile_field(label), weight_element=_MX).name in names


@pytest.mark.slow
@needs_nvcc
def test_nvcc_compiles_the_table_tiles_without_spills():
    import subprocess
    import tempfile

    from humming_aot.testing.nvcc import nvcc_or_none

    include = str(REPO / "csrc" / "include")
    keys = [w4a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(label), weight_element=_MX)
            for label in sorted({label for _, label in w4a8._TILES} | {w4a8._WIDE_DECODE_TILE})]
    keys += [w4a8.kernel_key("sm89", torch.bfloat16, parse_tile_field(label), weight_element=_MX)
             for _, label in w4a8._SYNC_TILES]
    for key in keys:
        with tempfile.TemporaryDirectory() as tmp:
            src = f"{tmp}/k.cu"
            open(src, "w").write(codegen.kernel_source(key))
            arch = "sm_90a" if key.arch == "sm90a" else f"sm_{key.arch[2:]}"
            done = subprocess.run([str(nvcc_or_none()), "-cubin", "-O3", "-std=c++17", f"-arch={arch}", "-I", include,
                                   "-Xptxas", "-v", src, "-o", f"{tmp}/k.cubin"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        # The 192-token tile (one scratch set) sums a span of K tiles into its scratch set, which is
        # then live across K tiles: ptxas keeps a few words in local memory (28 bytes with ptxas
        # 13.0, one 8-byte load a K tile in the loop); timed faster than a promotion per K tile
        # (docs/performance/log.md section 88). Every other tile spills nothing.
        spills = [int(v) for v in re.findall(r"(\d+) bytes spill stores", done.stderr)]
        allowed = 32 if key.tile.block_m == 192 else 0
        assert spills and max(spills) <= allowed and "serialized" not in done.stderr, (key.name, done.stderr)


def test_the_layer_and_the_custom_op():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(256, 100)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    layer = QuantizedLinear.from_linear(linear, "mxfp4", activations="float8e4m3:token")
    assert isinstance(layer, W8A8Linear) and layer.packed.element == _MX
    qa = ops.quantize_activation(x, "float8e4m3:token")
    expected = w4a8.gemm(qa, w4a8.pack(quant.quantize(linear.weight.detach().float(), "mxfp4")),
                         bias=linear.bias.detach().to(torch.bfloat16))
    assert torch.equal(layer(x), expected)
    assert W8A8Linear.from_linear(linear, "mxfp4").activations == "float8e4m3:token"
    with pytest.raises(ValueError, match="use float8e4m3:token or float8e4m3:tensor"):
        W8A8Linear.from_linear(linear, "mxfp4", activations="int8:token")
    again = W8A8Linear.from_linear(torch.nn.Linear(256, 100), "mxfp4")
    again.load_state_dict(layer.state_dict())
    assert torch.equal(again(x), layer(x))

    _, _, packed, qa2 = _operands(6, 100, 256, seed=3)
    assert_w4a8_op_compiles_and_fakes(qa2, packed)
