"""MoE experts with 8-bit activations (humming_aot.moe.gemm_masked_a8_kernel and
gemm_grouped_a8_kernel: the grouped masked schedule and its offsets form around the portable
mma-w4a8 and mma-ss bodies, through forced tiles; the default tiles of float8 W4A8 on sm90a are
the wgmma-w4a8 body's, tests/gpu/test_moe_a8_ws_gpu.py) on the GPU, for int4, uint4 with zero points and MXFP4 experts x int8
and float8e4m3 codes, and float8 (per channel and per 128 x 128 block) and int8 experts: each
expert's rows against the float64 product of its exact operands (the dense pairing's sum bound),
under skewed and empty routing, with E past one window of the experts' walk (256), odd N (padded
by pack), K off the K tile of 128 (the codes' own K inside the last tile), NaN-poisoned outputs
whose rows of no expert must stay NaN, every table tile, the slab and offsets forms giving the
same bits, K slices giving the same bits twice, a bias with float16 output, per-tensor activation
scales, and CUDA graph replays (the kernels and the layer). Fresh random data each run (seed
printed)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from humming_aot import ops, quant, w4a8, w8a8
from humming_aot.enumerate import parse_tile_field
from humming_aot.moe import a8 as moe_a8
from humming_aot.moe import a8_launch, gemm_grouped_a8_kernel, gemm_masked_a8_kernel, pack_a8_experts
from humming_aot.spec import GemmType
from humming_aot.testing.w8a8 import (
    assert_graph_replay_is_eager,
    assert_offsets_rows_match_slabs,
    assert_within_sum_bound,
    skip_without_portable_kernels,
)
from humming_aot.testing.w8a8 import fresh_seed as _seed

pytestmark = pytest.mark.gpu

_W4_TILES = sorted({label for _, label in w4a8._SYNC_TILES})
_W8_TILES = sorted({w8a8.select_sync_tile(m).label for m in (1, 32, moe_a8.W8A8_MAX_TILE_ROWS)})
# weight format per case; the activation element is the test's `element` parameter
_FORMATS = {"int4": "int4:g128", "uint4": "uint4:g128:zp", "float4e2m1": "mxfp4",
            "float8e4m3": "float8e4m3:channel", "blocks": "float8e4m3:b128x128", "int8": "int8:channel"}
_CASES = [(w, e) for w in ("int4", "uint4", "float4e2m1") for e in ("int8", "float8e4m3")
          if not (w == "float4e2m1" and e == "int8")] + [("float8e4m3", "float8e4m3"), ("blocks", "float8e4m3"),
                                                         ("int8", "int8")]


def _act_format(weight: str, element: str, granularity: str = "token") -> str:
    return "float8e4m3:g128" if weight == "blocks" else f"{element}:{granularity}"


def _key(arch: str, weight: str, element: str, label: str, dtype: torch.dtype, gemm_type: GemmType):
    """The MoE key, or None where its body refuses it (float8 mma-ss MoE where ptxas emulates e4m3)."""
    tile = parse_tile_field(label)
    try:
        key = (w8a8.kernel_key(arch, dtype, tile, weight == "blocks", element) if _w8(weight)
               else w4a8.kernel_key(arch, dtype, tile, element, weight))
        return dataclasses.replace(key, spec=dataclasses.replace(key.spec, gemm_type=gemm_type))
    except ValueError as error:
        assert "ptxas emulates" in str(error), error
        return None


def _w8(weight: str) -> bool:
    return weight in ("float8e4m3", "blocks", "int8")


def _on_device(spec) -> bool:
    """Whether an arch serving this GPU supports the spec (the library's own test before a launch:
    ops._unsupported_on_device; e.g. on an RTX 50xx sm120 does where sm120a, its first, does not)."""
    return ops._unsupported_on_device(spec, torch.cuda.current_device()) is None


def _keys(arch: str, elements) -> list:
    """The MoE keys the tests run on this arch: every case's tiles, both GEMM types and output
    dtypes, of the pairings this GPU supports (float8 W8A8 MoE: sm89 and sm120 only)."""
    keys = [_key(arch, weight, element, label, dtype, gemm_type)
            for weight, element in _CASES if element in elements for label in _tiles(weight)
            for dtype in (torch.bfloat16, torch.float16) for gemm_type in (GemmType.MASKED, GemmType.GROUPED)]
    if arch == "sm90a":  # the default tiles of float8 W4A8 and channel-scaled W8A8 there (masked)
        keys += [_key(arch, weight, element, label, dtype, GemmType.MASKED)
                 for weight, element in (("int4", "float8e4m3"), ("uint4", "float8e4m3"), ("float4e2m1", "float8e4m3"),
                                         ("float8e4m3", "float8e4m3"), ("int8", "int8")) if element in elements
                 for _, label in (a8_launch.W8A8_WS_TILES if _w8(weight) else a8_launch.WS_TILES)
                 for dtype in (torch.bfloat16, torch.float16)]
    return [key for key in keys if key is not None and _on_device(key.spec)]


def _skip_unsupported(weight: str, element: str) -> None:
    """pytest.skip where this GPU cannot run the case: no mma.sync on its codes (float8 below sm89),
    or no MoE kernels of its pairing (float8 W8A8 off sm89 and sm120: its e4m3 mma.sync is emulated
    there), after checking that the call says so."""
    from humming_aot.bodies.mma_ss import FIRST_ARCH
    from humming_aot.spec import parse_arch
    from humming_aot.testing.w8a8 import portable_arch

    arch = portable_arch()
    if parse_arch(arch)[0] < FIRST_ARCH[element]:
        pytest.skip(f"mma.sync on {element} codes needs sm{FIRST_ARCH[element]}; this GPU is {arch}")
    key = _key(arch, weight, element, _tiles(weight)[0], torch.bfloat16, GemmType.MASKED)
    if key is not None and _on_device(key.spec):
        return
    experts = _experts(weight, 2, 64, 256, torch.Generator().manual_seed(0))
    qa = _activations((2, 16, 256), _act_format(weight, element), torch.Generator().manual_seed(1))
    counts = torch.tensor([16, 0], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="not supported on|ptxas emulates"):
        gemm_masked_a8_kernel(qa, experts, counts, tile=_tiles(weight)[0])
    pytest.skip(f"{_FORMATS[weight]} x {element} MoE has no mma-ss kernels on {arch} (refused as it should be; "
                "sm90a's wgmma-ss ones: tests/gpu/test_moe_a8_ws_gpu.py)")


@pytest.fixture
def _kernels(request):
    skip_without_portable_kernels(request, "MoE mma-w4a8 / mma-ss", _keys)
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if "weight" in params:
        _skip_unsupported(params["weight"], params.get("element", "int8"))


def _experts(weight: str, e: int, n: int, k: int, gen: torch.Generator):
    w = torch.randn(e, n, k, generator=gen) * (0.02 + 0.1 * torch.rand(e, n, 1, generator=gen))
    return pack_a8_experts(quant.quantize(w.cuda(), _FORMATS[weight]))


def _activations(shape, fmt: str, gen: torch.Generator):
    x = torch.randn(*shape, generator=gen) * (0.5 + torch.rand(*shape[:-1], 1, generator=gen))
    return ops.quantize_activation(x.cuda().to(torch.bfloat16), fmt,
                                   **({"static_scale": 0.02} if fmt.endswith(":tensor") else {}))


def _tiles(weight: str) -> list[str]:
    return _W8_TILES if _w8(weight) else _W4_TILES


def _check_rows(y: torch.Tensor, qa_rows, experts, e: int, bias=None, out_dtype=torch.bfloat16) -> None:
    """y (rows, n_valid) of expert e against the float64 product of its rows' exact operands (the
    W4A8 sum bound, which w4a8.reference / w8a8.reference alike serve: effective_weight())."""
    assert_within_sum_bound(y, qa_rows, experts.expert(e), None if bias is None else bias[e], out_dtype)


@pytest.mark.parametrize("weight,element", _CASES)
@pytest.mark.parametrize("tile", range(4))
def test_masked_rows_match_float64_and_leave_the_rest(_kernels, weight, element, tile):
    if tile >= len(_tiles(weight)):
        pytest.skip(f"the {weight} experts' table has {len(_tiles(weight))} tiles")
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 5, 37, 150, 384
    experts = _experts(weight, e, n, k, gen)
    qa = _activations((e, max_m, k), _act_format(weight, element), gen)
    counts = torch.tensor([37, 0, 5, 16, 1], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_masked_a8_kernel(qa, experts, counts, out=out, tile=_tiles(weight)[tile])
    torch.cuda.synchronize()
    assert y.shape == (e, max_m, n)
    for ex, count in enumerate(counts.tolist()):
        if count:
            _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex)
        assert torch.isnan(out[ex, count:]).all(), f"expert {ex}: rows past its count were written"


@pytest.mark.parametrize("weight,element", _CASES)
def test_offsets_rows_match_float64_and_the_slab_form_bit_for_bit(_kernels, weight, element):
    """Rows by prefix offsets (rows of no expert at both ends stay NaN), against float64; with one
    K slice the same bits as the slab form's on the same rows and tile; two K slices give the
    same bits twice."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k = 4, 256, 512
    experts = _experts(weight, e, n, k, gen)
    bounds = [3, 3, 40, 41, 60]
    rows = 64
    qa = _activations((rows, k), _act_format(weight, element), gen)
    offsets = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    tile = _tiles(weight)[0]
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=16, out=out, tile=tile, splits=1)
    torch.cuda.synchronize()
    assert torch.isnan(y[:3]).all() and torch.isnan(y[60:]).all(), "rows of no expert were written"
    assert_offsets_rows_match_slabs(y, qa, experts, bounds, tile)  # (and the slab form's bits)
    first = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=16, tile=tile, splits=2)
    again = gemm_grouped_a8_kernel(qa, experts, offsets, expected_m=16, tile=tile, splits=2)
    torch.cuda.synchronize()
    assert torch.equal(first, again), "two K slices gave different bits on two runs"
    for ex in range(e):
        lo, hi = bounds[ex], bounds[ex + 1]
        if hi > lo:
            _check_rows(first[lo:hi], moe_a8._rows(qa, slice(lo, hi)), experts, ex)


@pytest.mark.parametrize("weight,element", [("int4", "int8"), ("int4", "float8e4m3"), ("uint4", "int8"),
                                            ("float4e2m1", "float8e4m3"), ("float8e4m3", "float8e4m3"),
                                            ("int8", "int8")])
def test_k_off_the_k_tile(_kernels, weight, element):
    """K = 400 (416 for MXFP4's groups of 32): the codes' own K ends inside the last K tile of 128,
    whose codes past it the bodies zero-fill; per-channel scales (one group spanning K), both
    forms, NaN-poisoned outputs."""
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 3, 24, 128, 416 if weight == "float4e2m1" else 400
    fmt = {"int4": "int4:channel", "uint4": "uint4:channel:zp"}.get(weight, _FORMATS[weight])
    w = torch.randn(e, n, k, generator=gen) * 0.05
    experts = pack_a8_experts(quant.quantize(w.cuda(), fmt))
    qa = _activations((e, max_m, k), f"{element}:token", gen)
    counts = torch.tensor([24, 3, 0], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_masked_a8_kernel(qa, experts, counts, out=out)
    rows = dataclasses.replace(qa, codes=qa.codes.reshape(e * max_m, k), scales=qa.scales.reshape(e * max_m, 1))
    offsets = torch.tensor([0, 24, 27, 27], dtype=torch.int32, device="cuda")
    grouped = gemm_grouped_a8_kernel(rows, experts, offsets, expected_m=9)
    torch.cuda.synchronize()
    for ex, count in enumerate(counts.tolist()):
        if count:
            _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex)
        assert torch.isnan(out[ex, count:]).all()
    for ex, (lo, hi) in enumerate(((0, 24), (24, 27))):
        _check_rows(grouped[lo:hi], moe_a8._rows(rows, slice(lo, hi)), experts, ex)


@pytest.mark.parametrize("element", ["int8", "float8e4m3"])
def test_many_experts_few_tokens_past_one_walk_window(_kernels, element):
    """E = 300 (two windows of the walk), 6 tokens top-4 routed at random, by offsets at the
    default tile and K slices; int4 experts."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k, tokens, top_k = 300, 128, 256, 6, 4
    experts = _experts("int4", e, n, k, gen)
    ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(tokens)]).reshape(-1)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=e)
    bounds = [0] + torch.cumsum(counts, 0).tolist()
    x = _activations((tokens, k), f"{element}:token", gen)
    rows = dataclasses.replace(x, codes=x.codes[order // top_k].contiguous(),
                               scales=x.scales[order // top_k].contiguous())
    offsets = torch.tensor(bounds, dtype=torch.int64, device="cuda")
    y = gemm_grouped_a8_kernel(rows, experts, offsets, expected_m=1)
    torch.cuda.synchronize()
    for ex in torch.nonzero(counts).reshape(-1).tolist():
        lo, hi = bounds[ex], bounds[ex + 1]
        _check_rows(y[lo:hi], moe_a8._rows(rows, slice(lo, hi)), experts, ex)


@pytest.mark.parametrize("element", ["float8e4m3"])  # (the fixture skips it below sm89)
def test_bias_float16_and_a_per_tensor_scale(_kernels, element):
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 3, 20, 96, 256
    experts = _experts("uint4", e, n, k, gen)
    qa = _activations((e, max_m, k), "float8e4m3:tensor", gen)
    bias = (torch.randn(e, n, generator=gen) * 0.1).to(torch.float16).cuda()
    counts = torch.tensor([20, 7, 0], dtype=torch.int32, device="cuda")
    y = gemm_masked_a8_kernel(qa, experts, counts, bias=bias, out_dtype=torch.float16)
    torch.cuda.synchronize()
    assert y.dtype == torch.float16
    for ex, count in enumerate(counts.tolist()):
        if count:
            _check_rows(y[ex, :count], moe_a8._rows(qa, (ex, slice(0, count))), experts, ex, bias, torch.float16)


@pytest.mark.parametrize("element", ["float8e4m3"])  # (the fixture skips it below sm89)
def test_a_cuda_graph_replays_both_forms(_kernels, element):
    gen = torch.Generator().manual_seed(_seed())
    e, max_m, n, k = 8, 16, 128, 256
    experts = _experts("float4e2m1", e, n, k, gen)
    qa = _activations((e, max_m, k), "float8e4m3:token", gen)
    counts = torch.randint(0, max_m + 1, (e,), generator=gen, dtype=torch.int32).cuda()
    assert_graph_replay_is_eager(lambda: gemm_masked_a8_kernel(qa, experts, counts, expected_m=4))
    rows = dataclasses.replace(qa, codes=qa.codes.reshape(e * max_m, k), scales=qa.scales.reshape(e * max_m, 1))
    offsets = torch.arange(0, e * max_m + 1, max_m, dtype=torch.int32, device="cuda")
    assert_graph_replay_is_eager(lambda: gemm_grouped_a8_kernel(rows, experts, offsets, expected_m=16))


@pytest.mark.parametrize("fmt,act", [("int4:g128", "int8:token"), ("int4:g128", "float8e4m3:token"),
                                     ("float8e4m3:b128x128", "float8e4m3:g128"), ("int8:channel", "int8:token")])
def test_the_layer_on_the_kernels_matches_its_reference_path_and_replays(_kernels, fmt, act):
    """A8MoE on the GPU (quantize, gather, both GEMMs on the offsets form, silu_and_mul, combine)
    against the same module's CPU path (the float64 reference of each expert's operands): the
    intermediate re-quantization may round a code the other way where the two GEMM1 results
    straddle a step, so the bound is a few code steps of the output's scale; then a CUDA graph
    replay of the forward gives the eager bits."""
    from humming_aot.nn import QuantizedMoE

    weight = {"float8e4m3:b128x128": "blocks", "int8:channel": "int8"}.get(fmt, "int4")
    _skip_unsupported(weight, act.split(":")[0])
    gen = torch.Generator().manual_seed(_seed())
    e, h, i, tokens, top_k = 16, 512, 256, 64, 4
    gate_up = torch.randn(e, 2 * i, h, generator=gen) * 0.05
    down = torch.randn(e, h, i, generator=gen) * 0.05
    layer = QuantizedMoE.from_experts(gate_up, down, fmt, activations=act)
    x = torch.randn(tokens, h, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    expected = layer(x, ids, weights).double()
    layer = layer.to("cuda")
    y = layer(x.cuda(), ids.cuda(), weights.cuda())
    torch.cuda.synchronize()
    assert not torch.isnan(y).any()
    step = 2.0**-4 if act.startswith("float8") else 2.0**-6  # (relative to the largest output)
    assert (y.double().cpu() - expected).abs().max().item() <= step * expected.abs().max().item()
    args = (x.cuda(), ids.cuda(), weights.cuda())
    assert_graph_replay_is_eager(lambda: layer(*args))


@pytest.mark.parametrize("weight,element", [("int4", "int8"), ("uint4", "float8e4m3"), ("blocks", "float8e4m3")])
def test_the_indexed_layout_on_the_kernel(_kernels, weight, element):
    """gemm_indexed_a8 on align_block_size's layout through the grouped kernel (gather, offsets form,
    scatter): each slot's row against float64, and a CUDA graph replay."""
    from humming_aot.moe import align_block_size, gemm_indexed_a8

    gen = torch.Generator().manual_seed(_seed())
    e, n, k, tokens, top_k = 16, 256, 384, 37, 4
    experts = _experts(weight, e, n, k, gen)
    ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(tokens)]).cuda()
    routing = align_block_size(ids, e, 16)
    qa = _activations((tokens, k), _act_format(weight, element), gen)
    y = gemm_indexed_a8(qa, experts, routing, a_rows_per_token=top_k)
    torch.cuda.synchronize()
    flat = ids.reshape(-1).tolist()
    for ex in range(e):
        slots = [t for t in range(tokens * top_k) if flat[t] == ex]
        if slots:
            index = torch.tensor(slots, device="cuda")
            rows = moe_a8._rows(dataclasses.replace(qa, codes=qa.codes[index // top_k].contiguous(),
                                                    scales=qa.scales[index // top_k].contiguous()), slice(None))
            _check_rows(y[index], rows, experts, ex)
    assert_graph_replay_is_eager(lambda: gemm_indexed_a8(qa, experts, routing, a_rows_per_token=top_k))


@pytest.mark.parametrize("weight,element", [("int4", "int8"), ("float4e2m1", "float8e4m3"), ("blocks", "float8e4m3"),
                                            ("int8", "int8")])
def test_the_row_expert_form(_kernels, weight, element):
    """DeepGEMM's contiguous layout: every expert's rows padded to blocks of 128 with row expert
    -1 (a block of padding only skipped, its NaN-poisoned output rows left), on the row-expert
    schedule (kernel/grouped_contiguous.cuh) at the table's tile, against float64 on the real rows;
    the same bits as the offsets form on those rows at the same tile."""
    gen = torch.Generator().manual_seed(_seed())
    e, n, k = 4, 256, 384
    experts = _experts(weight, e, n, k, gen)
    counts = [70, 0, 130, 5]
    blocks = [-(-c // 128) for c in counts]
    rows = 128 * (sum(blocks) + 1)  # (and one block of padding only at the end)
    qa = _activations((rows, k), _act_format(weight, element), gen)
    row_expert = torch.full((rows,), -1, dtype=torch.int32)
    starts, at = [], 0
    for ex, (c, b) in enumerate(zip(counts, blocks)):
        starts.append(at)
        row_expert[at:at + c] = ex
        at += 128 * b
    row_expert = row_expert.cuda()
    out = torch.full((rows, experts.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = gemm_grouped_a8_kernel(qa, experts, row_expert=row_expert, expected_m=64, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(out[-128:]).all(), "the block of padding only was written"
    # (both forms pick the same table tile for 64 rows: on sm90a the wgmma one, float8 W4A8's 32 rows)
    assert 128 % moe_a8.grouped_a8_block_m(experts, 64, qa) == 0
    for ex, (c, start) in enumerate(zip(counts, starts)):
        if c:
            _check_rows(y[start:start + c], moe_a8._rows(qa, slice(start, start + c)), experts, ex)
            sub = moe_a8._rows(qa, slice(start, start + c))
            offsets = torch.tensor([0] * (ex + 1) + [c] * (e - ex), dtype=torch.int32, device="cuda")
            by_offsets = gemm_grouped_a8_kernel(sub, experts, offsets, expected_m=64, splits=1)
            assert torch.equal(by_offsets, y[start:start + c]), f"expert {ex}: the two forms' bits differ"
