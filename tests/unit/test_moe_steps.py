"""The MoE steps' helper kernels without a GPU: the unit's generated source and its NVRTC build
for every arch family, the Params layouts against the headers' static_asserts, the host path of
each launch (recorded by a fake unit), and the torch references the kernels are held to (the
inverse row map, combine = weighted_sum of unpermute, the drop of ids out of range)."""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
import torch

from humming_aot import env, helper_kernels, moe
from humming_aot.jit.cubin import CubinError
from humming_aot.moe import cuda_steps

HEADERS = Path(__file__).resolve().parents[2] / "csrc" / "include" / "humming_aot" / "helpers"


def test_unit_source_is_deterministic_and_names_every_kernel():
    for arch in ("sm75", "sm80", "sm90a", "sm120a"):
        source = helper_kernels.unit_source("moe", arch)
        assert source == helper_kernels.unit_source("moe", arch)
        names = helper_kernels.kernel_names("moe", arch)
        assert len(names) == len(set(names))
        for name in names:
            assert f"\n{name}(const __grid_constant__" in source
    assert not any("bf16" in n for n in helper_kernels.kernel_names("moe", "sm75"))  # no bf16 cvt before sm_80
    assert "moe_combine_bf16_w32_v4" in helper_kernels.kernel_names("moe", "sm80")
    with pytest.raises(ValueError, match="no helper kernel unit 'dense'"):
        helper_kernels.unit_source("dense", "sm90a")


@pytest.mark.parametrize("struct_name,packer", [("RouteParams", cuda_steps._ROUTE),
                                                ("GatherParams", cuda_steps._GATHER),
                                                ("ActivationParams", cuda_steps._ACTIVATION),
                                                ("CombineParams", cuda_steps._COMBINE)])
def test_params_layouts_match_the_headers(struct_name, packer):
    text = "\n".join(p.read_text() for p in HEADERS.glob("*.cuh"))
    found = re.search(rf"static_assert\(sizeof\({struct_name}\) == (\d+), \"{struct_name} must match the Python "
                      rf"struct format ([^\"]+)\"", text)
    assert found, f"no size static_assert for {struct_name}"
    assert int(found.group(1)) == packer.size and found.group(2) == packer.format


def test_kernel_constants_match_the_headers():
    route = (HEADERS / "moe_route.cuh").read_text()
    assert f"kThreads = {cuda_steps.ROUTE_THREADS};" in route
    assert f"kChunk = {cuda_steps.ROUTE_CHUNK};" in route
    assert f"kMaxExperts = {cuda_steps.MAX_EXPERTS};" in route
    assert f"kThreads = {cuda_steps.ROUTE_SEGMENTS_THREADS};" in route
    assert f"kMaxExperts = {cuda_steps.ROUTE_SEGMENTS_MAX_EXPERTS};" in route
    assert f"kMaxStagedRows = {cuda_steps.ROUTE_SEGMENTS_MAX_STAGED_ROWS};" in route
    assert "kMaxSlots = kThreads * kPerLane;" in route and "kPerLane = 2;" in route
    assert cuda_steps.ROUTE_SEGMENTS_MAX_SLOTS == 2 * cuda_steps.ROUTE_SEGMENTS_THREADS
    for name in ("moe_activation.cuh", "moe_combine.cuh", "moe_gather.cuh"):
        assert f"kThreads = {cuda_steps.ELEMENTWISE_THREADS};" in (HEADERS / name).read_text()


@pytest.mark.parametrize("arch", ["sm75", "sm80", "sm90a", "sm120a"])
def test_unit_compiles_with_nvrtc_and_passes_its_check(arch, tmp_path, monkeypatch):
    from humming_aot import jit
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the unit is compiled by NVRTC", "to compile it")
    if why is not None:
        pytest.skip(why)
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(tmp_path))
    unit = helper_kernels.compile_unit("moe", arch)
    result = jit.cache.obtain(unit, include_dir=jit._include_dir(), nvrtc_lib=jit.nvrtc.load_nvrtc())
    assert result.compiled and result.data
    helper_kernels.check_unit_cubin(result.data, "moe", arch)
    again = jit.cache.obtain(unit, include_dir=jit._include_dir(), nvrtc_lib=jit.nvrtc.load_nvrtc())
    assert not again.compiled and again.data == result.data
    other = "sm80" if arch != "sm80" else "sm90a"
    with pytest.raises(CubinError, match="expected sm_"):
        helper_kernels.check_unit_cubin(result.data, "moe", other)
    with pytest.raises(CubinError, match="not a readable cubin"):
        helper_kernels.check_unit_cubin(b"\x7fELF" + bytes(60), "moe", arch)


class _Recorder:
    def __init__(self, arch: str):
        self.calls = []
        self.kernels = set(helper_kernels.kernel_names("moe", arch))

    def launch(self, device, symbol, grid, threads, smem, params):
        assert symbol in self.kernels
        self.calls.append(dict(symbol=symbol, grid=grid, threads=threads, smem=smem, params=params))


def _record(monkeypatch, arch: str) -> _Recorder:
    """Launches recorded instead of made, on CPU tensors, as if a GPU of ``arch`` held the unit."""
    recorder = _Recorder(arch)
    monkeypatch.setattr(cuda_steps, "usable", lambda *tensors: True)
    monkeypatch.setattr(cuda_steps, "_has", lambda device, symbol: symbol in recorder.kernels)
    monkeypatch.setattr(cuda_steps, "_launch", recorder.launch)
    return recorder


@pytest.fixture
def recorder(monkeypatch):
    return _record(monkeypatch, "sm90a")


def test_route_launches_count_then_place_over_chunks(recorder):
    ids = torch.randint(0, 256, (700, 8), dtype=torch.int64)  # 5600 slots: 3 chunks of 2048
    out = cuda_steps.route(ids, 256, 16, pad_slot=5600, slot_of_row32=True, block_expert_len=600, total=True)
    assert [c["symbol"] for c in recorder.calls] == ["moe_route_count_i64", "moe_route_place_i64"]
    count, place = recorder.calls
    assert count["grid"] == place["grid"] == (3, 1, 1) and count["threads"] == 256
    assert count["smem"] == 256 * 4 and place["smem"] == (256 * 9 + 8) * 4
    fields = cuda_steps._ROUTE.unpack(place["params"])
    assert fields[1:5] == (5600, 256, 16, 3) and fields[6:8] == (5600 + 256 * 15, 5600)
    assert out["slot_of_row32"].shape == (5600 + 256 * 15,) and out["block_expert"].shape == (600,)
    assert set(out) == {"slot_of_row32", "block_expert", "total"}
    assert fields[8] == 0 and fields[9] == out["slot_of_row32"].data_ptr() and fields[15] == 600
    recorder.calls.clear()
    small = torch.randint(0, 128, (256, 8), dtype=torch.int32)  # 2048 slots: one chunk, one CTA of 1024 threads
    out = cuda_steps.route(small, 128, 1, pad_slot=-1, slot_of_row64=True, row_of_slot=True, offsets32=True)
    assert [(c["symbol"], c["grid"], c["threads"]) for c in recorder.calls] == [
        ("moe_route_segments_i32", (1, 1, 1), 1024)]
    # the (32 warps + 1, E) table, the scan's sums and the total; its 2048 rows are staged over them
    assert recorder.calls[0]["smem"] == (128 * 33 + 33) * 4
    fields = cuda_steps._ROUTE.unpack(recorder.calls[0]["params"])
    assert fields[4:8] == (1, 0, 2048, -1)  # one chunk, no workspace
    assert set(out) == {"slot_of_row64", "row_of_slot", "offsets32"} and out["offsets32"].shape == (129,)
    for experts, block, ints in ((8, 1, 2048), (256, 16, 256 * 33 + 33), (64, 64, 2048 + 64 * 63), (8, 1281, 12288),
                                 (8, 1282, 8 * 33 + 33)):  # the rows where staged and more than the table
        recorder.calls.clear()
        cuda_steps.route(torch.randint(0, experts, (256, 8), dtype=torch.int32), experts, block, pad_slot=-1,
                         slot_of_row32=True)
        assert recorder.calls[0]["symbol"] == "moe_route_segments_i32" and recorder.calls[0]["smem"] == ints * 4
    for tokens, experts, symbol in ((64, 128, "single"), (65, 128, "segments"), (65, 257, "single")):
        recorder.calls.clear()  # 512 slots and fewer, or more than 256 experts: the 256-thread kernel
        cuda_steps.route(torch.randint(0, experts, (tokens, 8), dtype=torch.int32), experts, 1, pad_slot=-1,
                         offsets32=True)
        assert [c["symbol"] for c in recorder.calls] == [f"moe_route_{symbol}_i32"]


def test_elementwise_launches_pick_the_vector_width(recorder):
    x = torch.zeros(10, 512, dtype=torch.bfloat16)
    assert cuda_steps.activation(x, "silu").shape == (10, 256)
    assert recorder.calls[-1]["symbol"] == "moe_silu_and_mul_bf16_v4" and recorder.calls[-1]["grid"] == (10, 1, 1)
    assert cuda_steps.activation(torch.zeros(3, 12, dtype=torch.float16), "swiglu_oai").shape == (3, 6)
    assert recorder.calls[-1]["symbol"] == "moe_swiglu_oai_f16_v1"
    assert cuda_steps.activation(torch.zeros(3, 10, dtype=torch.float16), "silu") is None  # I odd
    assert cuda_steps.activation(torch.zeros(3, 8, dtype=torch.float32), "silu") is None  # fp32
    rows = torch.zeros(16, 7168, dtype=torch.bfloat16)
    out = cuda_steps.combine(rows, torch.zeros(16, dtype=torch.int32), torch.zeros(2, 8))
    assert out.shape == (2, 7168)
    call = recorder.calls[-1]
    assert call["symbol"] == "moe_combine_bf16_w32_v4" and call["grid"] == (2, 7, 1)
    assert cuda_steps._COMBINE.unpack(call["params"])[4:] == (2, 8, 7168, 7168, 7168)
    assert cuda_steps.combine(rows, torch.zeros(16, dtype=torch.int64), torch.zeros(2, 8)) is None
    hidden = torch.zeros(3, 2880, dtype=torch.float16)
    assert cuda_steps.gather(hidden, torch.zeros(5, dtype=torch.int64), 2).shape == (5, 2880)
    call = recorder.calls[-1]
    assert call["symbol"] == "moe_gather_v4" and call["grid"] == (5, 3, 1)
    assert cuda_steps._GATHER.unpack(call["params"])[3:] == (5, 2880, 2880, 2880, 2)
    assert cuda_steps.gather(hidden[:, :6], torch.zeros(5, dtype=torch.int64), 2).shape == (5, 6)
    assert recorder.calls[-1]["symbol"] == "moe_gather_v1"  # a row stride of 2880: 16-byte rows, but 6 columns
    assert cuda_steps.gather(hidden, torch.zeros(0, dtype=torch.int64), 2).shape == (0, 2880)
    assert recorder.calls[-1]["symbol"] == "moe_gather_v1"  # no launch for no rows
    # other dtypes as their 16-bit words: float32 rows of 2880 (5760 words), 8-bit codes of 8 (4 words)
    out = cuda_steps.gather(hidden.float(), torch.zeros(5, dtype=torch.int64), 2)
    assert out.dtype == torch.float32 and out.shape == (5, 2880)
    assert cuda_steps._GATHER.unpack(recorder.calls[-1]["params"])[3:] == (5, 5760, 5760, 5760, 2)
    codes = torch.zeros(3, 12, dtype=torch.uint8)[:, :8]
    out = cuda_steps.gather(codes, torch.zeros(5, dtype=torch.int64), 2)
    assert out.dtype == torch.uint8 and out.shape == (5, 8)
    assert cuda_steps._GATHER.unpack(recorder.calls[-1]["params"])[3:] == (5, 4, 6, 4, 2)
    for odd in (torch.zeros(3, 7, dtype=torch.uint8), torch.zeros(3, 6, dtype=torch.uint8)):  # (odd bytes, words)
        assert cuda_steps.gather(odd, torch.zeros(5, dtype=torch.int64), 2) is None


def test_bfloat16_steps_on_sm75_take_the_torch_path(monkeypatch):
    """An sm_75 unit has no bfloat16 kernels: those steps return None (the torch path), float16 runs."""
    recorder = _record(monkeypatch, "sm75")
    assert cuda_steps.activation(torch.zeros(2, 16, dtype=torch.bfloat16), "silu") is None
    assert cuda_steps.combine(torch.zeros(4, 16, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int32),
                              torch.zeros(2, 2)) is None
    assert recorder.calls == []
    assert cuda_steps.activation(torch.zeros(2, 16, dtype=torch.float16), "silu").shape == (2, 8)
    assert [c["symbol"] for c in recorder.calls] == ["moe_silu_and_mul_f16_v4"]


def test_usable_is_false_off_the_gpu_and_when_switched_off(monkeypatch):
    assert not cuda_steps.usable(torch.zeros(2))
    assert cuda_steps.activation(torch.zeros(2, 16, dtype=torch.bfloat16), "silu") is None  # CPU: torch path
    assert not cuda_steps.route_supported(torch.zeros(2, 2, dtype=torch.int32), 8)
    monkeypatch.setattr(cuda_steps, "usable", lambda *tensors: True)
    ids = torch.zeros(2, 2, dtype=torch.int32)
    assert cuda_steps.route_supported(ids, 1024, 16) and not cuda_steps.route_supported(ids, 1025, 16)
    assert not cuda_steps.route_supported(ids, 1024, 2**21)  # 1024 * (2^21 - 1) rows: past int32
    assert not cuda_steps.route_supported(ids.float(), 8)
    monkeypatch.setenv("HUMMING_AOT_HELPERS", "0")
    assert not env.helpers_enabled()
    monkeypatch.setenv("HUMMING_AOT_HELPERS", "maybe")
    with pytest.raises(ValueError, match="HUMMING_AOT_HELPERS='maybe'"):
        env.helpers_enabled()


def _routing(tokens: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices


def test_reference_row_of_slot_inverts_slot_of_row():
    ids = _routing(37, 16, 4, 1)
    r = moe.group_rows(ids, 16)
    assert torch.equal(r.slot_of_row[r.row_of_slot.long()], torch.arange(37 * 4))
    assert torch.equal(r.offsets_int32, r.offsets.int())
    g = moe.align_groups(ids, 16, 8)
    assert torch.equal(g.slot_of_row[g.row_of_slot.long()], torch.arange(37 * 4))
    grouped = moe.align_offsets(torch.tensor([2, 5, 5, 9]), 12, 4)  # rows 0, 1, 9, 10, 11 in no expert
    assert grouped.row_of_slot.tolist()[:2] == [-1, -1] and grouped.row_of_slot.tolist()[9:] == [-1, -1, -1]
    owned = grouped.row_of_slot[2:9].long()
    assert torch.equal(grouped.slot_of_row[owned], torch.arange(2, 9))


def test_permute_reference_zeros_rows_of_no_slot():
    hidden = torch.arange(12, dtype=torch.float32).reshape(3, 4).bfloat16()
    routing = moe.GroupedRouting(slot_of_row=torch.tensor([4, 0, 1, -1]), offsets=torch.tensor([0, 1, 3]),
                                 row_expert=torch.tensor([0, 1, 1, -1], dtype=torch.int32), top_k=2,
                                 row_of_slot=torch.tensor([1, 2, -1, -1, 0, -1], dtype=torch.int32),
                                 offsets_int32=torch.tensor([0, 1, 3], dtype=torch.int32))
    rows = moe.permute(hidden, routing)
    assert torch.equal(rows, torch.stack([hidden[2], hidden[0], hidden[0], torch.zeros(4).bfloat16()]))
    # slots 2, 3 and 5 have no row: unpermute gives zeros there, combine adds nothing for them
    # (not even a NaN weight's NaN), as the kernel skips them
    out = moe.unpermute(rows, routing)
    assert torch.equal(out.reshape(6, 4)[[2, 3, 5]], torch.zeros(3, 4).bfloat16())
    assert torch.equal(out.reshape(6, 4)[[0, 1, 4]], rows[[1, 2, 0]])
    weights = torch.tensor([[0.5, 0.25], [float("nan"), float("inf")], [2.0, float("nan")]])
    expect = torch.stack([rows[1].float() * 0.5 + rows[2].float() * 0.25, torch.zeros(4), rows[0].float() * 2.0])
    assert torch.equal(moe.combine(rows, routing, weights), expect.bfloat16())


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
def test_combine_reference_is_unpermute_then_weighted_sum(weights_dtype):
    ids = _routing(21, 32, 4, 2)
    gen = torch.Generator().manual_seed(3)
    weights = torch.rand(21, 4, generator=gen).to(weights_dtype)
    r = moe.group_rows(ids, 32)
    rows = torch.randn(84, 40, generator=gen).bfloat16()
    assert torch.equal(moe.combine(rows, r, weights), moe.weighted_sum(moe.unpermute(rows, r), weights))
    g = moe.align_groups(ids, 32, 16)
    padded = torch.randn(g.slot_of_row.shape[0], 40, generator=gen).bfloat16()
    assert torch.equal(moe.combine(padded, g, weights),
                       moe.weighted_sum(moe.unpermute_aligned(padded, g, 21), weights))
    with pytest.raises(ValueError, match=r"topk_weights \(M, 4\)"):
        moe.combine(rows, r, weights[:, :3])
    with pytest.raises(ValueError, match="the routing has 84 rows"):
        moe.combine(rows[:80], r, weights)


def test_align_block_size_total_stays_on_the_device_and_checks_block():
    ids = _routing(9, 8, 2, 4)
    indexed = moe.align_block_size(ids, 8, 4)
    assert indexed.num_tokens_post_padded.dtype == torch.int32 and indexed.num_tokens_post_padded.shape == (1,)
    counts = torch.bincount(ids.reshape(-1), minlength=8)
    assert int(indexed.num_tokens_post_padded) == int(((counts + 3) // 4 * 4).sum())
    with pytest.raises(ValueError, match="block_size must be at least 1"):
        moe.align_block_size(ids, 8, 0)


def _nvcc_or_none():
    from humming_aot.aot import ninja

    try:
        return ninja.find_nvcc()
    except ninja.NvccNotFoundError:
        return None


@pytest.fixture
def fresh_catalog():
    from humming_aot.catalog import installed_catalog

    installed_catalog.cache_clear()
    yield
    installed_catalog.cache_clear()


@pytest.mark.skipif(_nvcc_or_none() is None, reason="nvcc not found (set HUMMING_AOT_NVCC)")
def test_catalog_builds_carry_the_helper_units(tmp_path, monkeypatch, fresh_catalog):
    """A catalog build compiles the helper unit of its arch with nvcc into helpers/, lists it in the
    manifest, and the run time takes it from there with the JIT off; a corrupt file is an
    integrity error, and with neither a catalog nor the JIT the error says both are missing."""
    import io

    from humming_aot import manifest as mf
    from humming_aot.aot import ninja, wheel
    from humming_aot.catalog import CatalogIntegrityError, installed_catalog

    result = ninja.compile_keys([], tmp_path / "build", jobs=2, stream=io.StringIO(), helper_units=[("moe", "sm90a")])
    name = helper_kernels.unit_name("moe", "sm90a")
    assert set(result.helpers) == {name} and result.helpers[name][:2] == ("moe", "sm90a")
    manifest = mf.build_manifest(keys=[], fatbins={}, cuda_version="13.0", toolkit=result.nvcc.toolkit,
                                 catalog="test", archs=["sm90a"], helpers=result.helpers)
    assert mf.manifest_problems(manifest) == []
    assert manifest["helpers"][name]["file"] == f"helpers/{name}.fatbin"
    catalog_dir = tmp_path / "catalog"
    wheel._install_inplace(result.out_dir, manifest, catalog_dir)
    monkeypatch.setenv("HUMMING_AOT_CATALOG_DIR", str(catalog_dir))
    monkeypatch.setenv("HUMMING_AOT_JIT", "0")
    arch, image = helper_kernels.obtain_image("moe", ("sm90a", "sm90"))
    assert arch == "sm90a" and image == result.helpers[name][2].read_bytes()
    (catalog_dir / "helpers" / f"{name}.fatbin").write_bytes(image[:-1])
    installed_catalog.cache_clear()
    with pytest.raises(CatalogIntegrityError, match="sha256"):
        helper_kernels.obtain_image("moe", ("sm90a",))
    with pytest.raises(RuntimeError, match="in no installed catalog and cannot be compiled"):
        helper_kernels.obtain_image("moe", ("sm80",))
    broken = dict(manifest, helpers={name: {"file": "elsewhere"}})
    assert mf.manifest_problems(broken) == [f"helper unit {name!r} lacks sha256, arch, unit, toolkit, helpers_version"]


def test_rows_of_other_dtypes_go_to_the_gather_kernel_as_16_bit_words():
    """cuda_steps._as_16_bit: 8-bit codes and float32 scales as a bfloat16 view of their bytes (the
    gather kernel copies 16-bit words), the same storage and bytes back; None where a row's bytes
    or its stride are odd, or the base address is."""
    from humming_aot.moe import cuda_steps

    for dtype, k in ((torch.uint8, 16), (torch.float8_e4m3fn, 7168), (torch.int8, 2), (torch.float32, 1),
                     (torch.float32, 3)):
        size = torch.empty(0, dtype=dtype).element_size()
        x = torch.randint(0, 256, (5, (k + 4) * size), dtype=torch.uint8).view(dtype)[:, :k]  # (strided rows)
        words = cuda_steps._as_16_bit(x)
        assert words is not None and words.dtype == torch.bfloat16 and words.data_ptr() == x.data_ptr()
        assert words.shape == (5, k * x.element_size() // 2) and words.stride(0) * 2 == x.stride(0) * x.element_size()
        assert torch.equal(words.view(dtype).view(torch.uint8), x.view(torch.uint8))
    base = torch.zeros(5, 64, dtype=torch.uint8)
    for odd in (base[:, :7], base[:, 1:9], base.reshape(-1)[:63 * 5].reshape(5, 63)[:, :8], base[:, :8].t(),
                torch.zeros(5, 4, dtype=torch.bool), torch.zeros(4, dtype=torch.uint8)):
        assert cuda_steps._as_16_bit(odd) is None


@pytest.mark.parametrize(("arch", "setting", "programmatic"),
                         [("sm90a", None, True), ("sm120a", "1", True), ("sm90a", "0", False), ("sm89", None, False),
                          ("sm80", "1", False)])
def test_launches_take_pdl_from_sm90_builds_with_the_setting(monkeypatch, arch, setting, programmatic):
    """Every moe kernel waits for the upstream grid before it touches memory (from sm_90 builds:
    HELPERS_VERSION 7), so cuda_steps launches each with Programmatic Dependent Launch where the
    unit was loaded for sm_90+ with HUMMING_AOT_PDL on, and plainly otherwise."""
    if setting is None:
        monkeypatch.delenv("HUMMING_AOT_PDL", raising=False)
    else:
        monkeypatch.setenv("HUMMING_AOT_PDL", setting)
    launches = []

    class Unit:
        kernels = {"moe_gather_v4": 0}
        programmatic = helper_kernels.programmatic_launch(arch)  # what load() sets

        def launch(self, symbol, grid, threads, smem, stream, params, cluster=(1, 1, 1), *, programmatic=False):
            launches.append((symbol, programmatic))

    monkeypatch.setattr(cuda_steps, "_unit", lambda device: Unit())
    monkeypatch.setattr(cuda_steps, "_stream", lambda device: 0)
    monkeypatch.setattr(helper_kernels, "current_for", lambda index: contextlib.nullcontext())
    cuda_steps._launch(torch.device("cuda", 0), "moe_gather_v4", (1, 1, 1), 128, 0, b"")
    assert launches == [("moe_gather_v4", programmatic)]
