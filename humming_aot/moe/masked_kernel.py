"""The grouped masked MoE GEMM on its kernel (csrc/include/humming_aot/kernel/grouped_masked.cuh):
``gemm_masked_kernel(a, experts, masked_m)`` computes what ``expert_loop.gemm_masked`` defines,
in one launch whose shapes do not depend on the counts (CUDA-graph capturable: the counts are
read on the device).

The kernel is the masked schedule around a dense mma.sync body (``heuristics.select_masked_tile``:
the tile for the expected rows per expert), from the installed catalog or the JIT. One K slice per
tile. Not yet the path ``QuantizedMoE`` takes: that switches once the GPU suite has held it to the
expert loop (issue 23).
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot import params_abi
from humming_aot.moe.packing import PackedExperts
from humming_aot.spec import GemmType, TileConfig

_ELEMENT_BYTES = 2  # activations, scales, zero points, bias and output: 16-bit
MAX_EXPERTS = 65535  # gridDim.z


def gemm_masked_kernel(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor, *,
                       expected_m: int | None = None, bias: torch.Tensor | None = None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """out[e, :masked_m[e]] = a[e, :masked_m[e]] @ W[e]^T (+ bias[e]) for every expert e.

    a:          (E, max_m, K) contiguous, the experts' activation dtype, on their CUDA device
    masked_m:   (E,) int32 on the same device: each expert's valid rows, 0 <= count <= max_m (the
                kernel reads them there; a count outside that range is the caller's error and is
                not checked, so that the call needs no host round trip)
    expected_m: the rows an expert is expected to hold, which picks the tile (default max_m)
    bias:       (E, N) in the activation dtype, or None
    out:        (E, max_m, N) contiguous to write into (rows past each count are left as they
                are); default a new zero tensor
    """
    _check(a, experts, masked_m, bias, out)
    from humming_aot import dispatch, heuristics, ops

    dense = experts.expert(0)
    dense.check_layout()  # words in the packed layout this humming_aot reads
    device_index = a.device.index
    reason = ops._unsupported_on_device(ops.gemm_spec(dense), device_index)  # the dense pairing's rules
    if reason:
        raise ValueError(reason.replace("gemm:", "gemm_masked_kernel:", 1))
    if torch.cuda.get_device_capability(device_index) < (8, 0):
        raise ValueError("gemm_masked_kernel: the masked schedule wraps the mma.sync bodies of sm_80 and later; "
                         "on this GPU, humming_aot.moe.gemm_masked computes the same")
    e, max_m, k = a.shape
    if out is None:
        out = torch.zeros(e, max_m, experts.n, dtype=a.dtype, device=a.device)
    if max_m == 0:
        return out
    spec = dataclasses.replace(ops.gemm_spec(dense), gemm_type=GemmType.MASKED)
    info = dispatch.device_info(device_index)
    rows = max_m if expected_m is None else max(1, min(int(expected_m), max_m))
    tile = heuristics.select_masked_tile(info.arches[0], rows, k, experts.group_size, spec.w_bits)
    _, loaded = dispatch.obtain(spec, device_index, rows, tile, k, experts.group_size, n=experts.n)
    grid, params = launch_arguments(a, experts, masked_m, bias, out, tile)
    loaded.launch(grid, dispatch.current_stream(device_index), params)
    return out


def launch_arguments(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor, bias: torch.Tensor | None,
                     out: torch.Tensor, tile: TileConfig) -> tuple[tuple[int, int, int], bytes]:
    """The grid (the dense tiles of a full slab, 1, E) and the MaskedGemmParams bytes of one call:
    expert 0's GemmParams (m = max_m, one K slice, global scale unused), then the counts and
    global scales pointers and the byte strides between experts."""
    e, max_m, k = a.shape
    n = experts.n
    tiles = -(-max_m // tile.block_m) * -(-n // tile.block_n)
    zero_points = experts.w_zero_point
    gemm = params_abi.GEMM_PARAMS.pack(
        a.data_ptr(), experts.w.data_ptr(), experts.w_scale.data_ptr(),
        0 if zero_points is None else zero_points.data_ptr(), 0 if bias is None else bias.data_ptr(),
        out.data_ptr(), 0, 0,  # no workspace, no counters: one K slice
        k, n, max_m, n, k, experts.group_size, 1, 1.0,
    )
    tail = params_abi.MASKED_TAIL.pack(
        masked_m.data_ptr(), experts.global_scale_tensor.data_ptr(),
        max_m * k * _ELEMENT_BYTES, max_m * n * _ELEMENT_BYTES,
        experts.w[0].numel() * experts.w.element_size(),
        experts.w_scale[0].numel() * _ELEMENT_BYTES,
        0 if zero_points is None else zero_points[0].numel() * _ELEMENT_BYTES,
        0 if bias is None else n * _ELEMENT_BYTES,
    )
    return (tiles, 1, e), gemm + tail


def _check(a: torch.Tensor, experts: PackedExperts, masked_m: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor | None) -> None:
    what = "gemm_masked_kernel"
    if not isinstance(a, torch.Tensor) or a.dim() != 3 or a.shape[0] != experts.experts or a.shape[2] != experts.k:
        raise ValueError(f"{what}: a must be ({experts.experts}, max_m, {experts.k}), got "
                         f"{tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__}")
    if a.dtype != experts.act_dtype or not a.is_contiguous():
        raise ValueError(f"{what}: a must be a contiguous {experts.act_dtype} tensor (the experts were packed for "
                         f"it), got {a.dtype}{'' if a.is_contiguous() else ', not contiguous'}")
    if not a.is_cuda or a.device != experts.device:
        raise ValueError(f"{what}: a ({a.device}) and the experts ({experts.device}) must be on one CUDA device; "
                         "on the CPU, humming_aot.moe.gemm_masked computes the same")
    if (not isinstance(masked_m, torch.Tensor) or masked_m.shape != (experts.experts,)
            or masked_m.dtype != torch.int32 or masked_m.device != a.device or not masked_m.is_contiguous()):
        raise ValueError(f"{what}: masked_m must be ({experts.experts},) int32, contiguous, on {a.device} (the kernel "
                         f"reads the counts there), got {_describe(masked_m)}")
    if experts.experts > MAX_EXPERTS:
        raise ValueError(f"{what}: {experts.experts} experts: at most {MAX_EXPERTS} (one grid z index each)")
    if a.data_ptr() % 16:
        raise ValueError(f"{what}: a's data must start 16-byte aligned (got address {a.data_ptr():#x}); pass a "
                         "fresh tensor or .clone() it")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (experts.experts, experts.n)
                             or bias.dtype != a.dtype or bias.device != a.device or not bias.is_contiguous()
                             or bias.data_ptr() % 4):
        raise ValueError(f"{what}: bias must be ({experts.experts}, {experts.n}) {a.dtype}, contiguous, on "
                         f"{a.device}, starting on a 4-byte boundary, got {_describe(bias)}")
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (*a.shape[:2], experts.n)
                            or out.dtype != a.dtype or out.device != a.device or not out.is_contiguous()
                            or out.data_ptr() % 4):
        raise ValueError(f"{what}: out must be ({a.shape[0]}, {a.shape[1]}, {experts.n}) {a.dtype}, contiguous, "
                         f"on {a.device}, starting on a 4-byte boundary, got {_describe(out)}")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype} on {value.device}"
    return type(value).__name__
