"""W4A8 with uint4 weights less an integer zero point (AWQ) x float8e4m3 or int8 activations on
the CPU: the kernels' conversion (numerics/uint4_zero_point.cuh, emulated as its header writes it)
for every code, zero point and place, the packed layout against the PTX 8-bit A fragment with each
K tile's entries, pack's groups and padding, the float64 reference path against the quantized
weight's own codes, the keys of both bodies and the catalog, the generated source and nvcc
(NVRTC: test_w4a8.py), the layer and the custom op (GPU runs: tests/gpu/test_w4a8_uint4_gpu.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from humming_aot import codegen, formats, ops, quant, support, w4a8, w4a8_uint4
from humming_aot.bodies.wgmma_w4a8 import overlapped
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey
from humming_aot.testing.nvcc import needs_nvcc
from humming_aot.testing.w4a8_layout import fragment_steps
from humming_aot.testing.w8a8 import assert_w4a8_op_compiles_and_fakes

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "csrc" / "include" / "humming_aot" / "numerics" / "uint4_zero_point.cuh"
E4M3 = formats.get("float8e4m3")
_U4 = w4a8.UINT4_ELEMENT


def _vabsdiff4(a: int, b: int) -> int:
    """__vabsdiffu4: the absolute difference of each unsigned byte."""
    return sum(abs(((a >> (8 * j)) & 0xFF) - ((b >> (8 * j)) & 0xFF)) << (8 * j) for j in range(4))


def _offset_difference(q: int, zero: int) -> int:
    return (q + 0x80808080 - zero) & 0xFFFFFFFF


def _convert(codes: int, zero_low: int, zero_high: int, s8: bool) -> tuple[int, int]:
    """Uint4ZeroPointToE4m3::convert (or ToS8), emulated."""
    def bytes_of(q: int, zero: int) -> int:
        if s8:
            return _offset_difference(q, zero) ^ 0x80808080
        return _vabsdiff4(q, zero) | (~_offset_difference(q, zero) & 0x80808080)

    return bytes_of(codes & 0x0F0F0F0F, zero_low), bytes_of((codes >> 4) & 0x0F0F0F0F, zero_high)


def test_the_emulation_is_the_header():
    text = HEADER.read_text()
    assert "return q + 0x80808080u - row.zero;" in text
    assert "return __vabsdiffu4(q, row.zero) | (~offset_difference(q, row) & 0x80808080u);" in text
    assert "return offset_difference(q, row) ^ 0x80808080u;" in text
    assert "codes & 0x0F0F0F0Fu" in text and "(codes >> 4) & 0x0F0F0F0Fu" in text
    # convert: the low nibbles (row g) with the low row's table, the high ones (row g + 8) with the high row's
    assert text.count("a_low = bytes(low_codes(codes), low);") == 2
    assert text.count("a_high = bytes(high_codes(codes), high);") == 2
    # the call sites: row g's entry is the low table, row g + 8's the high one, in both bodies
    loop = (REPO / "csrc/include/humming_aot/mainloop/int4_e4m3_groups.cuh").read_text()
    assert "Widen::table(into_scales.groups_low[u], kk);" in loop
    assert "Widen::convert(words[pair][u][2 * half], low, high, a[0], a[1]);" in loop
    assert "address + 8 * kEntry" in loop  # groups_high: the entry of row + 8
    sync = (REPO / "csrc/include/humming_aot/kernel/dense_mma_w4a8.cuh").read_text()
    assert "Widen::table(groups[mi][0], step);" in sync and "Widen::table(groups[mi][1], step);" in sync
    assert "Widen::convert(words[mi][2 * s], low, high, a[mi][0], a[mi][1]);" in sync
    assert '"r"(entry + 4 + 8 * kEntryBytes)' in sync  # groups[mi][1]: the entry of row g + 8


def _values(register: int, s8: bool) -> list[float]:
    raw = [(register >> (8 * j)) & 0xFF for j in range(4)]
    if s8:
        return [float(b - 256 if b >= 128 else b) for b in raw]
    return [E4M3.decode(torch.tensor([b], dtype=torch.uint8)).item() * 512 for b in raw]


@pytest.mark.parametrize("s8", [False, True])
def test_every_code_zero_point_and_place_converts_to_its_difference(s8):
    """Four different codes at the four bytes of either register, every zero point, the other row's
    zero point another: each byte is q - z of its own row (e4m3 bytes: (q - z) x 2^-9), with no
    carry or borrow into its neighbours."""
    for z in range(16):
        zeros = (z, 15 - z)  # rows g (the low register) and g + 8 (the high one)
        for q0 in range(16):
            quad = [q0, (q0 + 5) % 16, (q0 + 11) % 16, 15 - q0]
            for r in range(2):
                word = sum(q << (8 * j + 4 * r) for j, q in enumerate(quad))
                other = 0x0F0F0F0F if r == 0 else 0  # the other register's codes: 15 in the high nibbles
                low, high = _convert(word | (other << 4), zeros[0] * 0x01010101, zeros[1] * 0x01010101, s8)
                got = _values((low, high)[r], s8)
                assert got == [float(q - zeros[r]) for q in quad], (z, quad, r)
                rest = _values((low, high)[1 - r], s8)
                assert rest == [float((15 if r == 0 else 0) - zeros[1 - r])] * 4


def _weight(n: int, k: int, gen: torch.Generator, fmt: str = "uint4:g128:zp") -> quant.QuantizedWeight:
    """Random codes, zero points (every value) and positive scales of the format's shape."""
    f = quant.WeightFormat.parse(fmt)
    w = quant.quantize(torch.randn(n, k, generator=gen), f)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    zeros = torch.randint(0, 16, w.zero_points.shape, generator=gen, dtype=torch.uint8)
    scales = torch.rand(w.scales.shape, generator=gen).add(0.01).to(w.scales.dtype)
    return quant.QuantizedWeight(format=f, codes=codes, scales=scales, zero_points=zeros)


def _expected_weight(qw: quant.QuantizedWeight) -> torch.Tensor:
    """(n, k) float64 (q - z) x s from the weight's own codes."""
    n, k = qw.codes.shape
    fmt = qw.format
    if fmt.granularity is quant.ScaleGranularity.GROUP:
        s = qw.scales.double().reshape(n, -1).repeat_interleave(fmt.group_size, 1)[:, :k]
        z = qw.zero_points.double().reshape(n, -1).repeat_interleave(fmt.group_size, 1)[:, :k]
    else:
        s = qw.scales.double().reshape(-1, 1).expand(n, k)
        z = qw.zero_points.double().reshape(-1, 1).expand(n, k)
    return (qw.codes.double() - z) * s


@pytest.mark.parametrize("fmt", ["uint4:g128:zp", "uint4:g256:zp", "uint4:channel:zp"])
@pytest.mark.parametrize("s8", [False, True])
def test_the_packed_layout_and_entries_are_the_8_bit_a_fragment(s8, fmt):
    """Each consumer thread's 16-byte loads, converted with the zero points of its rows' entries
    (the entry row the kernels pick for K tile t: t x 128 / group_size) and weighed by their
    scales, hold the rows and K of the PTX ISA's 8-bit A fragment (m64nNk32 and m16n8k32 alike:
    warp w rows 16 w + g (+ 8), register r: K 4 t .. 4 t + 3 (+ 16)), valued as the weight's
    (q - z) x s."""
    gen = torch.Generator().manual_seed(7)
    n, k = 128, 512
    qw = _weight(n, k, gen, fmt)
    expected = _expected_weight(qw)
    packed = w4a8.pack(qw)
    groups = {"uint4:g128:zp": 4, "uint4:g256:zp": 2, "uint4:channel:zp": 1}[fmt]
    assert packed.w.shape == (4, 2, 4096) and packed.w_scale.shape == (groups, 128, 2)
    for step in fragment_steps(packed.w):
        entry = packed.w_scale[step.k_tile * 128 // packed.group_size]  # the entry row the kernels read
        scale = [entry[row, 0:1].view(torch.float32).item() for row in step.rows]
        zero = [int(entry[row, 1]) & 0xFFFFFFFF for row in step.rows]
        a0, a1 = _convert(step.words[0], zero[0], zero[1], s8)
        a2, a3 = _convert(step.words[1], zero[0], zero[1], s8)
        for r, register in enumerate((a0, a1, a2, a3)):
            row, k0 = step.rows[r & 1], step.k0(r)
            got = [v * scale[r & 1] for v in _values(register, s8)]
            assert got == expected[row, k0:k0 + 4].tolist(), (step, r)


# (format, its group size (None: one group spanning K), shapes: N off 64, K off 128 where the format allows)
_PACKINGS = [("uint4:g128:zp", 128, ((200, 384), (64, 128), (130, 256))),
             ("uint4:g256:zp", 256, ((200, 768), (130, 256))),
             ("uint4:channel:zp", None, ((200, 416), (64, 128), (130, 96))),
             ("uint4:tensor:zp", None, ((200, 416), (130, 96)))]


@pytest.mark.parametrize("fmt,group,shapes", _PACKINGS)
def test_pack_pads_groups_and_decodes_back(fmt, group, shapes):
    gen = torch.Generator().manual_seed(1)
    for n, k in shapes:
        qw = _weight(n, k, gen, fmt)
        packed = w4a8.pack(qw)
        n_pad, k_tiles = -(-n // 64) * 64, -(-k // 128)
        group_size = group or k_tiles * 128
        groups = -(-k_tiles * 128 // group_size)
        assert (packed.n, packed.k, packed.out_features, packed.group_size, packed.element) == (n_pad, k, n, group_size,
                                                                                               _U4)
        assert packed.w.shape == (k_tiles, n_pad // 64, 4096) and packed.w_scale.shape == (groups, n_pad, 2)
        assert torch.equal(packed.effective_weight(), _expected_weight(qw))
        codes = w4a8_uint4.decode_codes(packed.w)
        assert torch.equal(codes[:n, :k], qw.codes.to(torch.int64))
        assert not codes[n:].any() and not codes[:, k:].any()  # the padding is code 0 ...
        assert not packed.w_scale[:, n:].any()  # ... with zero point 0 and scale 0
        zeros = w4a8_uint4.entry_zero_points(packed.w_scale)
        assert torch.equal(packed.w_scale[..., 1].to(torch.int64), zeros * 0x01010101)
        assert torch.equal(w4a8_uint4.entry_scales(packed.w_scale)[:, :n],
                           qw.scales.float().reshape(n if qw.scales.numel() > 1 else 1, -1).t().expand(groups, n))


def _operands(m, n, k, seed=0, act="float8e4m3:token", fmt="uint4:g128:zp"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(m, k, generator=gen)
    qw = quant.quantize(w, fmt)
    return x, w, qw, w4a8.pack(qw), ops.quantize_activation(x, act)


@pytest.mark.parametrize("act", ["float8e4m3:token", "int8:token", "float8e4m3:tensor"])
def test_cpu_gemm_is_the_float64_product_rounded_once(act):
    x, w, qw, packed, qa = _operands(5, 100, 384, act=act)
    _, _, qw2, packed2, qa2 = _operands(3, 70, 416, seed=1, act=act, fmt="uint4:channel:zp")  # K off 128
    a2 = formats.get(qa2.element).decode(qa2.codes).double() * qa2.scales.double().reshape(-1, 1)
    assert torch.equal(w4a8.reference(qa2, packed2), a2 @ _expected_weight(qw2).T)
    a = formats.get(qa.element).decode(qa.codes).double() * qa.scales.double().reshape(-1, 1)
    expected = a @ _expected_weight(qw).T
    bias = torch.randn(100).to(torch.bfloat16)
    assert torch.equal(w4a8.reference(qa, packed), expected)
    assert torch.equal(w4a8.gemm(qa, packed, bias=bias), formats.round_to(expected + bias.double(), torch.bfloat16))
    exact = x.double() @ w.double().T
    assert ((w4a8.gemm(qa, packed).double() - exact).norm() / exact.norm()).item() < 0.2


def test_errors_say_what_to_do():
    _, w, qw, packed, qa = _operands(3, 64, 256)
    bad = quant.QuantizedWeight(format=qw.format, codes=qw.codes, scales=qw.scales, zero_points=qw.zero_points + 16)
    with pytest.raises(ValueError, match=r"zero_points hold \d+, but uint4 zero_points lie in 0\.\.15"):
        w4a8.pack(bad)
    with pytest.raises(ValueError, match="uint4 ones with an integer zero point.*got uint4:g64:zp"):
        w4a8.pack(quant.quantize(w, "uint4:g64:zp"))
    with pytest.raises(ValueError, match="a float zero point.*runs with 16-bit activations"):
        w4a8.pack(quant.quantize(w, "uint4:g128:zpf"))
    with pytest.raises(ValueError, match=r"int32 entries of shape \(2, 64, 2\)"):
        w4a8.gemm(qa, dataclasses.replace(packed, w_scale=packed.w_scale[..., 0].contiguous().view(torch.float32)))
    with pytest.raises(ValueError, match="int32 entries of shape"):
        w4a8.gemm(qa, dataclasses.replace(packed, group_size=192))
    with pytest.raises(ValueError, match="the uint4 weight .* takes float8e4m3 or int8 activations"):
        w4a8.gemm(ops.quantize_activation(torch.randn(3, 256), "float8e4m3:g128"), packed)


def test_keys_support_and_the_default_catalog():
    from humming_aot.enumerate import enumerate_keys

    for m in (1, 16, 100, 4096):
        key = w4a8.kernel_key("sm90a", torch.bfloat16, w4a8.select_tile(m, n=4096), weight_element=_U4)
        assert KernelKey.from_name(key.name) == key and "_wgmma-w4a8_a-e4m3-k-f32_w-u4-g-f32-zpi_" in key.name
        assert support.why_unsupported(key.spec, "sm90a") is None
        for arch, act in (("sm80", "int8"), ("sm89", "float8e4m3"), ("sm120", "int8")):
            sync = w4a8.kernel_key(arch, torch.float16, w4a8.select_sync_tile(m), act, _U4)
            assert KernelKey.from_name(sync.name) == sync and support.why_unsupported(sync.spec, arch) is None
    assert support.why_unsupported(w4a8.gemm_spec(torch.bfloat16, "float8e4m3", _U4), "sm86") is not None
    with pytest.raises(ValueError, match="needs sm89 or later, not sm86"):
        w4a8.kernel_key("sm86", torch.bfloat16, w4a8.select_sync_tile(16), "float8e4m3", _U4)
    # one scratch set where int4's two fit (its zero-point words take the registers: bodies/wgmma_w4a8.py)
    tile = parse_tile_field("wgmma-w4a8:128x128x128_w1x8_s7")
    assert overlapped(tile) and not overlapped(tile, _U4)
    for arch in ("sm90a", "sm80", "sm89", "sm120"):
        names = {k.name for k in enumerate_keys("default", [arch])}
        wanted = []
        if arch == "sm90a":
            wanted += [w4a8.kernel_key(arch, d, parse_tile_field(label), weight_element=_U4)
                       for label in [label for _, label in w4a8._TILES] + [w4a8._WIDE_DECODE_TILE]
                       for d in (torch.bfloat16, torch.float16)]
        acts = ("int8",) if arch in ("sm80", "sm90a") else ("int8", "float8e4m3")
        wanted += [w4a8.kernel_key(arch, d, parse_tile_field(label), act, _U4) for _, label in w4a8._SYNC_TILES
                   for d in (torch.bfloat16, torch.float16) for act in acts]
        missing = [key.name for key in wanted if key.name not in names]
        assert not missing, missing


def test_generated_source():
    key = w4a8.kernel_key("sm90a", torch.bfloat16, w4a8.select_tile(1024), weight_element=_U4)
    text = codegen.kernel_source(key)
    assert "humming_aot::numerics::Uint4ZeroPointToE4m3" in text and "kOverlapped == false" in text
    # 7 slots of 128 x 128 activation bytes + 128 x 72 (codes and entries) -> 25 KB, the staging tile after them
    assert f"Kernel::kSmemBytes == {7 * 25600 + 128 * 136 * 2 + 1024}" in text
    sync = codegen.kernel_source(w4a8.kernel_key("sm80", torch.bfloat16, w4a8.select_sync_tile(32), "int8", _U4))
    assert "humming_aot::mma::S8SyncCodes" in sync and "humming_aot::numerics::Uint4ZeroPointToS8" in sync


@pytest.mark.slow
@needs_nvcc
def test_nvcc_compiles_the_table_tiles_keeping_their_k_loops_in_registers(tmp_path):
    """Every table tile of both bodies builds; none spills, except the 192-token wgmma-w4a8 tile,
    whose 16 bytes (ptxas 13.0) are stored before its K loop and read after it: none inside a
    K loop (checked in the SASS where cuobjdump is on PATH)."""
    import shutil

    from test_build_nvcc import _loads_and_stores_in_wgmma_loops, _ptxas_report, _spill_bytes

    keys = [w4a8.kernel_key("sm90a", torch.bfloat16, parse_tile_field(label), weight_element=_U4)
            for label in sorted({label for _, label in w4a8._TILES} | {w4a8._WIDE_DECODE_TILE})]
    keys += [w4a8.kernel_key(arch, torch.bfloat16, parse_tile_field(label), act, _U4) for _, label in w4a8._SYNC_TILES
             for arch, act in (("sm80", "int8"), ("sm89", "float8e4m3"))]
    for key in keys:
        report = _ptxas_report(key, tmp_path)
        assert "serialized" not in report, (key.name, report)
        if key.tile.block_m == 192:
            assert _spill_bytes(report) <= 32, (key.name, report)
            if shutil.which("cuobjdump"):
                assert not _loads_and_stores_in_wgmma_loops(tmp_path / f"{key.symbol}.cubin"), key.name
        else:
            assert _spill_bytes(report) == 0, (key.name, report)


def test_the_layer_and_the_custom_op():
    from humming_aot.nn import QuantizedLinear, W8A8Linear

    gen = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(256, 100)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    for act in ("float8e4m3:token", "int8:token"):
        layer = QuantizedLinear.from_linear(linear, "uint4:g128:zp", activations=act)
        assert isinstance(layer, W8A8Linear) and layer.packed.element == _U4
        qa = ops.quantize_activation(x, act)
        expected = w4a8.gemm(qa, w4a8.pack(quant.quantize(linear.weight.detach().float(), "uint4:g128:zp")),
                             bias=linear.bias.detach().to(torch.bfloat16))
        assert torch.equal(layer(x), expected)
        again = W8A8Linear.from_linear(torch.nn.Linear(256, 100), "uint4:g128:zp", activations=act)
        again.load_state_dict(layer.state_dict())
        assert torch.equal(again(x), layer(x))

    _, _, _, packed, qa2 = _operands(6, 100, 256, seed=3, act="int8:token")
    assert_w4a8_op_compiles_and_fakes(qa2, packed)
