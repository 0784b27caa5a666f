"""Helpers of the W8A8 GPU tests (tests/gpu/test_w8a8*_gpu.py): a fresh seed, the skip rule for
a machine without the kernels, and the tail-split schedule a launch gets."""
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
