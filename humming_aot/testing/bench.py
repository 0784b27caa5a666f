"""The timing helpers of the project's benchmarks: CUDA-graph replays timed with CUDA events,
over inputs rotated through enough buffer sets that every call starts with a cold L2, median of
repeats; and host-bound eager calls timed by the wall clock (eager_per_call_us).

Benchmarks never assert: a timing that cannot be taken is reported, not raised, by the caller.
"""
from __future__ import annotations

import importlib.util
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "eager_per_call_us",
    "graph_replay_per_call_us",
    "l2_cache_bytes",
    "buffer_sets_for_cold_l2",
    "time_cuda_graph",
    "gemm_flops",
    "tflops",
    "gbps",
    "sibling_tool",
    "finite",
    "resume_run",
]

_TARGET_REPLAY_US = 2000.0  # auto `inner`: make one replay about this long so event overhead vanishes
_MAX_CALLS_PER_GRAPH = 512  # bound the captured graph (its launch and memory) for tiny kernels


def eager_per_call_us(fn: Callable[[], Any], calls: int, repeats: int, *, sync: bool = True,
                      warmup: int = 20) -> float:
    """Eager calls as a host issues them: best over `repeats` of (`calls` calls, then one
    synchronize when `sync`) / calls, in us, by the wall clock, after `warmup` calls. What an
    eager caller pays per call when the host, not the GPU, is the limit."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def graph_replay_per_call_us(fn: Callable[[], Any], calls: int, replays: int, repeats: int = 1) -> float:
    """`calls` calls of `fn` captured in one CUDA graph (after 3 eager warm-up calls), then best
    over `repeats` of (`replays` replays, one synchronize), per call, in us, by the wall clock: the
    back-to-back GPU time of the calls with no host cost, beside eager_per_call_us."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best / (replays * calls) * 1e6


def l2_cache_bytes(device: torch.device | int | None = None) -> int:
    """The L2 size of ``device`` (default: the current CUDA device), in bytes."""
    return int(torch.cuda.get_device_properties(_device_index(device)).L2_cache_size)


def buffer_sets_for_cold_l2(bytes_per_set: int, device: torch.device | int | None = None, l2_multiple: float = 2.0) -> int:
    """How many distinct buffer sets (each ``bytes_per_set`` bytes: everything one call reads and
    writes) a rotation needs so that the bytes touched between two uses of the same set exceed
    ``l2_multiple`` x L2 (counting the set's own call, so a single set already that large is
    enough: it evicts itself)."""
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    return max(1, math.ceil(l2_multiple * l2_cache_bytes(device) / bytes_per_set))


def time_cuda_graph(
    fn_per_buffer: Sequence[Callable[[], Any]],
    repeats: int = 30,
    inner: int | None = None,
    warmup_replays: int = 3,
    warmup_passes: int = 2,
    warmup_ms: float = 100.0,
) -> dict[str, Any]:
    """Per-call GPU time of a rotation of closures, from CUDA-graph replays.

    Args:
        fn_per_buffer: one closure per buffer set, each doing one call on its own inputs; their
            count should come from ``buffer_sets_for_cold_l2`` so each call meets a cold L2. They
            must be CUDA-graph capturable after being called once eagerly (lazy set-up, JIT
            compiles and allocator growth happen in that eager warm-up, outside the timing).
        repeats: timed replays; the statistics are over these.
        inner: passes over the rotation inside one graph (calls per replay = inner x sets).
            ``None`` picks it from an eager timing so that one replay lasts about 2 ms.
        warmup_replays: untimed replays before the timed ones, at least.
        warmup_passes: eager passes over the rotation before capture.
        warmup_ms: more untimed replays, about this much GPU time in all (their count estimated
            from the first replays, which a slow clock makes long, so somewhat less): a GPU that idled
            (a benchmark's host-side reference, operand set-up) comes back at low clocks, and
            the first implementation timed after such a pause measured 8-10 % slow on
            weight-streaming shapes with the fixed replays alone (docs/performance/log.md
            section 35).

    Returns:
        ``{"median_us", "p10_us", "p90_us", "samples_us", "calls_per_replay", "mode"}``: times per
        call in microseconds; ``mode`` is ``"graph"``, or ``"eager: <why>"`` when capture failed and
        the closures were timed as an eager loop between events instead (which adds host launch
        time whenever the GPU outruns the CPU).
    """
    fns = list(fn_per_buffer)
    if not fns:
        raise ValueError("time_cuda_graph needs at least one closure")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as graph capture asks
        for _ in range(max(1, warmup_passes)):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    if inner is None:
        inner = _auto_inner(fns)
    calls_per_replay = inner * len(fns)

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(inner):
                for fn in fns:
                    fn()
        mode = "graph"
        run = graph.replay
    except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager timing
        torch.cuda.synchronize()
        mode = f"eager: capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
        graph = None

        def run() -> None:
            for _ in range(inner):
                for fn in fns:
                    fn()

    warm_start, warm_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    warm_start.record()
    for _ in range(max(1, warmup_replays)):
        run()
    warm_end.record()
    warm_end.synchronize()
    warm = warm_start.elapsed_time(warm_end)
    if warm < warmup_ms:
        per_replay = warm / max(1, warmup_replays)
        for _ in range(min(1000, math.ceil((warmup_ms - warm) / max(per_replay, 1e-3)))):
            run()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends):
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    samples = [start.elapsed_time(end) * 1e3 / calls_per_replay for start, end in zip(starts, ends)]
    del graph
    return {
        "median_us": statistics.median(samples),
        "p10_us": _quantile(samples, 0.10),
        "p90_us": _quantile(samples, 0.90),
        "samples_us": samples,
        "calls_per_replay": calls_per_replay,
        "mode": mode,
    }


FRONTS = ("chain", "torch")


def add_front_argument(parser, before: str = "a model's norm") -> None:
    """The benches' --front option (with_front's choices); ``before``: what the torch kernel stands
    for in that bench's help."""
    parser.add_argument("--front", default="chain", choices=FRONTS,
                        help="in front of every timed call: nothing (chain: each call behind the previous one, PDL "
                             f"overlapping their ends) or a torch kernel (torch: {before}, nothing overlaps)")


def add_quant_split_argument(parser) -> None:
    """The W4A8 / W8A8 benches' --quant-split option (apply_quant_split)."""
    parser.add_argument("--quant-split", default=None, metavar="MIN_PARTS,SPLIT_CTAS",
                        help="the quantization's token-row split rule for humming_aot+quant (humming_aot.quant."
                             "cuda_quant.MIN_PARTS and SPLIT_CTAS), to time rules against each other in one tree; "
                             "default: the library's")


def apply_quant_split(text: str | None) -> tuple[int, int]:
    """Set cuda_quant's row-split rule from ``"MIN_PARTS,SPLIT_CTAS"`` (None keeps it) for this
    process; returns the rule in force. ValueError for anything but two positive ints."""
    from humming_aot.quant import cuda_quant

    if text is not None:
        try:
            min_parts, split_ctas = (int(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"--quant-split {text!r}: expected MIN_PARTS,SPLIT_CTAS, two ints such as 4,32") from None
        if min_parts < 1 or split_ctas < 1:
            raise ValueError(f"--quant-split {text!r}: both values must be at least 1")
        cuda_quant.MIN_PARTS, cuda_quant.SPLIT_CTAS = min_parts, split_ctas
    return cuda_quant.MIN_PARTS, cuda_quant.SPLIT_CTAS


def with_front(fns: Sequence[Callable[[], Any]], front: str) -> list[Callable[[], Any]]:
    """What runs in front of each timed call. ``chain``: nothing, so each call follows the previous
    call of the rotation, and a kernel launched with Programmatic Dependent Launch overlaps its
    launch and prologue with that call's tail (as in a chain of this library's kernels). ``torch``:
    a one-element torch kernel first, which lets nothing start before it completes: a model's layer,
    whose input comes from a norm or an elementwise kernel (the extra kernel's own time is in every
    implementation's figure alike)."""
    if front == "chain":
        return list(fns)
    if front != "torch":
        raise ValueError(f"front {front!r}: one of {', '.join(FRONTS)}")
    bump = torch.zeros(1, device="cuda")

    def fronted(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            bump.add_(1.0)
            return fn()
        return call
    return [fronted(fn) for fn in fns]


def _auto_inner(fns: Sequence[Callable[[], Any]]) -> int:
    """Passes per replay so a replay lasts ~_TARGET_REPLAY_US, from one eager pass (an upper bound
    on GPU time when launch-bound, so this errs towards fewer passes)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for fn in fns:
        fn()
    end.record()
    end.synchronize()
    pass_us = max(start.elapsed_time(end) * 1e3, 1e-3)
    by_time = math.ceil(_TARGET_REPLAY_US / pass_us)
    by_size = max(1, _MAX_CALLS_PER_GRAPH // len(fns))
    return max(1, min(by_time, by_size))


def _quantile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _device_index(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def gemm_flops(m: int, n: int, k: int) -> int:
    """Multiply-adds of an (M, K) x (K, N) GEMM, counted as 2 flops each."""
    return 2 * m * n * k


def tflops(flops: float, us: float) -> float:
    """TFLOP/s of ``flops`` done in ``us`` microseconds."""
    return flops / (us * 1e-6) / 1e12 if us > 0 else math.nan


def gbps(nbytes: float, us: float) -> float:
    """GB/s (10^9 bytes) of ``nbytes`` moved in ``us`` microseconds."""
    return nbytes / (us * 1e-6) / 1e9 if us > 0 else math.nan


def write_json(path: str | Path, payload: dict) -> None:
    """Write a benchmark's JSON payload to a ``.partial`` file beside `path`, then rename it over
    `path`: a run killed mid-write (a device call's time limit) leaves the last whole file."""
    import json
    import os

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    os.replace(partial, path)


def finite(value: Any) -> Any:
    """NaN / Inf -> None throughout a JSON payload, so that it is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


# resume_run: the arguments that make one shape's points; a run resumed with other values would
# mix points that were not measured alike (the shapes may differ: that is what is resumed)
RESUME_ARGS = ("m", "formats", "impls", "dtype", "codes", "tile")


def resume_run(path: str | Path, args: dict, device: str) -> tuple[list, list, list]:
    """(results, unavailable, shapes done) of an earlier run's JSON at `path` (bench_gemm.py
    --resume): the points of the shapes it finished ("shapes_done", [N, K] pairs), so that a run
    cut short by a time limit goes on with the shapes it had left, on another call. Nothing where
    the file does not exist yet. A ValueError where the file was written on another device or with
    other values of RESUME_ARGS than `args` has."""
    import json

    path = Path(path)
    if not path.exists():
        return [], [], []
    payload = json.loads(path.read_text())
    old = payload.get("args", {})
    differ = [key for key in RESUME_ARGS if old.get(key) != args.get(key)]
    if differ:
        raise ValueError(f"{path} was written with other {', '.join(differ)} ("
                         + ", ".join(f"{key}={old.get(key)!r} against {args.get(key)!r}" for key in differ)
                         + "): resume with the same arguments, or write a new --json file")
    if payload.get("device") != device:
        raise ValueError(f"{path} was written on {payload.get('device')!r}, this is {device!r}: its points and "
                         "this run's would not be one run; write a new --json file")
    done = [list(shape) for shape in payload.get("shapes_done", [])]

    def kept(rows: list) -> list:
        return [row for row in rows if [row.get("n"), row.get("k")] in done]

    return kept(payload.get("results", [])), kept(payload.get("unavailable", [])), done


def write_results_json(path: str | Path, results: list, **extra) -> None:
    """A benchmark's JSON file: {"device": this GPU's name, **extra, "results": results} (write_json)."""
    import torch

    write_json(path, {"device": torch.cuda.get_device_name(), **extra, "results": results})


def sibling_tool(name: str, beside: str) -> ModuleType:
    """The benchmark script ``<name>.py`` in the directory of the file ``beside`` (a tool's
    ``__file__``), imported once per process as module ``name``: registered in sys.modules before
    it runs, since dataclasses look their module up there, and taken from there when a tool or a
    test loaded it first."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(name, Path(beside).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
