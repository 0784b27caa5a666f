"""Helpers of the W8A8 and W4A8 GPU tests (tests/gpu/test_w8a8*_gpu.py, test_w4a8*_gpu.py): a fresh
seed, the skip rule for a machine without the kernels, the tail-split schedule a launch gets, and
the W4A8 error bounds."""
from __future__ import annotations

import os

import torch


def fresh_seed() -> int:
    """A random seed, printed so that a failing run can be repeated."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def skip_without_kernels(keys) -> None:
    """pytest.skip unless this is an sm_90 GPU that has every key (KernelKey) from the installed
    catalog or can build them (NVRTC)."""
    import pytest

    from humming_aot.catalog import installed_catalog
    from humming_aot.testing.jit import why_no_jit

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the W8A8 kernels are sm90a ones")
    why = why_no_jit("the W8A8 kernels must come from the installed catalog", "to build the W8A8 kernels")
    catalog = installed_catalog()
    if why is not None and (catalog is None or any(catalog.lookup(key.name) is None for key in keys)):
        pytest.skip(why)


def check_both_schedules(qa, packed, tile: str, check) -> None:
    """w8a8.gemm of the operands with `tile` under the heuristic's schedule and the tail split, each
    into a NaN-poisoned (M, packed.n) bfloat16 output, `check(y, qa, packed)` on its own columns."""
    from humming_aot import w8a8

    m = packed_rows(qa, packed.k)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    for stream_k in (None, 0):
        out.fill_(float("nan"))
        y = w8a8.gemm(qa, packed, out=out, tile=tile, stream_k=stream_k)
        check(y[:, : packed.out_features], qa, packed)


def packed_rows(qa, k: int) -> int:
    """The activation rows M of a QuantizedActivation of K = k."""
    return qa.codes.numel() // k


def schedule(tile: str | None, m: int, n: int, k: int, stream_k: int | None = None, persistent: bool | None = None,
             blocks: bool = False, element: str = "float8e4m3") -> tuple[str, int, int, int, int]:
    """(tile label, dp_ctas, splits, stream_k_ctas, walking CTAs) of the schedule a launch of this
    problem gets with these knobs (tile None: the table's)."""
    from humming_aot import dispatch, obtain, w8a8
    from humming_aot._w8a8_launch import _schedule
    from humming_aot.bodies.wgmma_ss import separate_staging, staged_scale_bytes
    from humming_aot.enumerate import parse_tile_field

    info = dispatch.device_info(torch.cuda.current_device())
    parsed = (w8a8.select_tile(m, blocks, n=n, num_sms=info.num_sms, element=element) if tile is None
              else parse_tile_field(tile))
    key = w8a8.kernel_key("sm90a", torch.bfloat16, parsed, blocks, element)
    loaded = obtain.load(key, info)
    return (parsed.label, *_schedule(loaded, parsed, info, m, n, -(-k // 128), stream_k, persistent,
                                     separate_staging(parsed, staged_scale_bytes(key))))


def tail_split(tile: str, m: int, n: int, k: int, persistent: bool, blocks: bool = False,
               element: str = "float8e4m3") -> tuple[int, int, int]:
    """(dp_ctas, splits, walking CTAs) of the tail split a launch of this problem gets."""
    from humming_aot import dispatch, obtain, w8a8
    from humming_aot._w8a8_launch import _schedule
    from humming_aot.enumerate import parse_tile_field

    info = dispatch.device_info(torch.cuda.current_device())
    parsed = parse_tile_field(tile)
    loaded = obtain.load(w8a8.kernel_key("sm90a", torch.bfloat16, parsed, blocks, element), info)
    dp_ctas, splits, _, walkers = _schedule(loaded, parsed, info, m, n, k // 128, 0, persistent, False)
    return dp_ctas, splits, walkers


def portable_arch() -> str:
    """The arch whose build the portable 8-bit-activation bodies (mma-ss, mma-w4a8) take on this
    GPU without a catalog key: the first that serves it (sm90a on an H100 / H200)."""
    from humming_aot import dispatch

    return dispatch.device_info(torch.cuda.current_device()).arches[0]


def skip_without_portable_kernels(request, body: str, keys_for) -> None:
    """pytest.skip unless this is a GPU with mma.sync on the codes of the test's `element`
    parameter (int8 without one) and every key of keys_for(arch, elements it has) comes from the
    installed catalog or can be built (NVRTC)."""
    import pytest

    from humming_aot.bodies.mma_ss import FIRST_ARCH
    from humming_aot.catalog import installed_catalog
    from humming_aot.spec import parse_arch
    from humming_aot.testing.jit import why_no_jit

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    arch = portable_arch()
    number = parse_arch(arch)[0]
    callspec = getattr(request.node, "callspec", None)
    element = callspec.params.get("element", "int8") if callspec is not None else "int8"
    if number < FIRST_ARCH[element]:
        pytest.skip(f"mma.sync on {element} codes needs sm{FIRST_ARCH[element]}; this GPU is sm{number}")
    why = why_no_jit(f"the {body} kernels must come from the installed catalog", f"to build the {body} kernels")
    catalog = installed_catalog()
    keys = keys_for(arch, [e for e in FIRST_ARCH if number >= FIRST_ARCH[e]])
    if why is not None and (catalog is None or any(catalog.lookup(key.name) is None for key in keys)):
        pytest.skip(why)


def first_tokens(qa, m: int):
    """The QuantizedActivation of qa's first m tokens (rows of its 2-D codes and scales)."""
    from humming_aot.quant import QuantizedActivation

    return QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=qa.group_size,
                               scale_dtype=qa.scale_dtype, codes=qa.codes[:m], scales=qa.scales[:m])


def assert_long_k_error_bound(qa, packed, run, ms=(256, 16, 1), bound: float = 1e-3) -> None:
    """For each m of `ms`, `run(first m tokens of qa, m)` (a float16 GEMM of them with `packed`:
    its rounding, 2^-11, leaves room to see the sums' own error) against w4a8.reference of the same
    operands: relative error (norm) at most `bound` (issue 22's 1e-3 at K = 16,384, which fp8 sums
    meet only with their fp32 promotion per K tile)."""
    from humming_aot import w4a8

    for m in ms:
        sub = first_tokens(qa, m)
        y = run(sub, m).double()
        ref = w4a8.reference(sub, packed)
        rel = ((y - ref).norm() / ref.norm()).item()
        print(f"m={m} relative error {rel:.2e}")
        assert rel <= bound, f"m={m}: relative error {rel:.2e} > {bound}"


def assert_within_sum_bound(y: torch.Tensor, qa, packed, bias=None, out_dtype=torch.bfloat16,
                            float8_sums: float = 2.0**-11) -> None:
    """y (NaN-free) against the float64 product of the W4A8 operands (w4a8.reference): the output's
    rounding (half an ulp of out_dtype) plus, per output, a share of the sum of |products|: for
    e4m3 activations `float8_sums` (the fp8 tensor cores keep about 14 bits of each K tile's sum:
    2^-11, tests/gpu/test_w8a8_gpu.py; MXFP4 weights folded over spans of K tiles sum a span
    before its promotion: that many times as much), for s8 ones 2^-20 (exact int32 sums; only the
    fp32 scale products and adds remain)."""
    from humming_aot import w4a8
    from humming_aot.w8a8 import dequantized_activation

    ref = w4a8.reference(qa, packed, bias)
    y = y.reshape(ref.shape).double()
    assert not torch.isnan(y).any(), "NaN in the output: some element was never written"
    eps = 2.0**-8 if out_dtype == torch.bfloat16 else 2.0**-11
    sums = float8_sums if qa.element == "float8e4m3" else 2.0**-20
    if getattr(packed, "element", None) == w4a8.MXFP4_ELEMENT:  # a span's K tiles share one sum: its length
        sums *= packed.group_size // w4a8.K_TILE
    a_abs = dequantized_activation(qa, packed.k).abs()
    bound = eps * ref.abs() + sums * (a_abs @ packed.effective_weight().abs().T)
    bad = (y - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outputs off; worst {(y - ref).abs().max().item()}"


def one_expert_slab(qa, experts: int, expert: int, lo: int, hi: int):
    """The grouped masked (slab) form of rows [lo, hi) of (R, K) 8-bit activations: (E, hi - lo, K)
    slabs where `expert`'s holds those rows (codes and scales) and the others zeros (scales 1), and
    the (E,) int32 counts (hi - lo for `expert`, 0 for the others), on the activations' device."""
    import dataclasses

    device = qa.codes.device
    codes = torch.zeros(experts, hi - lo, qa.codes.shape[-1], dtype=qa.codes.dtype, device=device)
    codes[expert] = qa.codes[lo:hi]
    scales = torch.ones(experts, hi - lo, qa.scales.shape[-1], dtype=torch.float32, device=device)
    scales[expert] = qa.scales[lo:hi]
    counts = torch.zeros(experts, dtype=torch.int32, device=device)
    counts[expert] = hi - lo
    return dataclasses.replace(qa, codes=codes, scales=scales), counts


def assert_offsets_rows_match_slabs(y: torch.Tensor, qa, experts, bounds, tile) -> None:
    """An offsets-form MoE output y (R, N) of the (R, K) activations with prefix bounds (E + 1):
    each expert's rows within the sum bound of its float64 product, and bit for bit the slab
    form's (gemm_masked_a8_kernel on one_expert_slab) on the same tile."""
    from humming_aot.moe import gemm_masked_a8_kernel
    from humming_aot.moe.a8 import _rows

    for ex in range(len(bounds) - 1):
        lo, hi = bounds[ex], bounds[ex + 1]
        if hi > lo:
            assert_within_sum_bound(y[lo:hi], _rows(qa, slice(lo, hi)), experts.expert(ex))
            slab, counts = one_expert_slab(qa, len(bounds) - 1, ex, lo, hi)
            masked = gemm_masked_a8_kernel(slab, experts, counts, tile=tile)
            assert torch.equal(masked[ex], y[lo:hi]), f"expert {ex}: the slab form's bits differ"


def assert_graph_replay_is_eager(run) -> None:
    """`run()` captured in a CUDA graph, its output NaN-poisoned and the graph replayed, gives the
    bits of an eager `run()`."""
    eager = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager), "the graph's replay differs from the eager call"


def assert_w4a8_op_compiles_and_fakes(qa, packed) -> None:
    """w4a8.gemm of the operands under torch.compile (fullgraph: the custom op humming_aot::gemm_w4a8)
    gives the eager bits, and the op's fake implementation gives the output's shape and dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from humming_aot import w4a8
    from humming_aot.quant import QuantizedActivation

    eager = w4a8.gemm(qa, packed)
    fn = torch.compile(lambda codes, scales: w4a8.gemm(
        QuantizedActivation(element=qa.element, granularity=qa.granularity, group_size=None,
                            scale_dtype="float32", codes=codes, scales=scales), packed),
        backend="eager", fullgraph=True)
    assert torch.equal(fn(qa.codes, qa.scales), eager)
    m = qa.codes.shape[0]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = torch.ops.humming_aot.gemm_w4a8(mode.from_tensor(qa.codes), mode.from_tensor(qa.scales), packed.w,
                                              packed.w_scale, None, packed.k, packed.group_size,
                                              packed.out_features, qa.granularity.value, torch.float16,
                                              qa.element, packed.element)
        assert out.shape == (m, packed.out_features) and out.dtype == torch.float16
