"""Activation quantization on a GPU: the ``quant`` unit of humming_aot.helper_kernels
(csrc/include/humming_aot/helpers/act_quant.cuh), bit for bit humming_aot.quant.activation's
references for the recipes it takes, in one launch (two for a dynamic per-tensor scale) and with
no host round trip.

It takes: float16 / bfloat16 activations (*lead, K), K a multiple of 8, rows 16-byte aligned;
int8 (any arch), float8e4m3 and float8e5m2 (sm_89+) elements; float32 scales per token, per
group of 16, 32, 64, 128 or 256 (dividing K), or per tensor (static or dynamic); and the 4-bit
float presets (act_quant_fp4.cuh): mxfp4 (float4e2m1, groups of 32, float8e8m0 scales, any arch)
and nvfp4 (groups of 16, float8e4m3 scales and a float32 global scale given or from the
tensor's amax, sm_89+). ``quantize`` returns None for anything else, and ops.quantize_activation
then runs the reference.
"""
from __future__ import annotations

import struct

import torch

from humming_aot import env, helper_kernels
from humming_aot.quant.activation import ActivationGranularity, QuantizedActivation, _scale_shape
from humming_aot.quant.activation_format import ActivationFormat

THREADS = 256  # ActQuant::kThreads
# At most this many rows take the "_wide" token and group kernels, one CTA of
# helper_kernels.WIDE_THREADS a row: with fewer rows than SMs a row's two passes and its correctly
# rounded divisions set the time, and four times the threads a row take a quarter of it.
WIDE_ROWS = 128
# Fewer rows than that, and long ones, split into parts (helpers/row_parts.cuh): gridDim.y CTAs of
# THREADS a row, each a contiguous part of it, the parts of a per-token row one thread-block
# cluster (sm_90+) that exchanges their amax. A power of two of them (row_parts), at most
# MAX_PARTS (a portable cluster), at least MIN_PARTS, at most SPLIT_CTAS in all (below), a part at
# least PART_VECTORS vectors, rows of fewer than SPLIT_VECTORS whole: one SM's work on a long row,
# not the memory, sets a few rows' time (a row of 28,672 elements: 3.7 us in one CTA of 1,024
# threads, 2.3 at 4,096).
# A token row's cluster costs ~0.3 us (its barriers and DSMEM reads, H200): it splits from
# CLUSTER_SPLIT_VECTORS on (log section 65, float8 / int8 token, whole against in parts: 1 x 8192
# 2.6 / 3.0 against 2.9 / 3.1 us, 16 x 18432 3.5 / 3.9 against 3.5 / 3.7, 1 x 28672 3.9 / 4.5
# against 3.3 / 3.4).
# A split takes at most SPLIT_CTAS CTAs over all rows, and at least MIN_PARTS a row (else the row
# stays whole, in the 1,024-thread kernel): the quantization runs in front of a GEMM, whose CTAs
# (launched early, PDL) take the SMs it leaves free, and a GEMM CTA of the Hopper bodies takes a whole
# SM. 16 token rows of 28,672 in 8 parts (128 CTAs) before a W4A8 GEMM added 4.0 us behind a torch
# kernel, whole rows 1.5 (H100, log section 78; in 2 parts, 256 threads each, 3.6).
MAX_PARTS = 8
MIN_PARTS = 4
SPLIT_CTAS = 32
PART_VECTORS = 256
SPLIT_VECTORS = 1024
CLUSTER_SPLIT_VECTORS = 2048
VECTOR = 8  # ActQuant::kVector
GROUP_SIZES = (16, 32, 64, 128, 256)  # 8 times a power-of-two lane count up to a warp
_PARAMS = struct.Struct("<9q")  # helpers::ActQuantParams
_FP4_PARAMS = struct.Struct("<10q")  # helpers::Fp4QuantParams: ActQuantParams, then the global scale's output
# the 4-bit float recipes: (group, scale dtype) -> the kernel's name part
FP4_RECIPES = {(32, "float8e8m0"): "mx", (16, "float8e4m3"): "nv"}
_ACT_NAMES = {torch.float16: "f16", torch.bfloat16: "bf16"}


def _rows(a: torch.Tensor) -> torch.Tensor | None:
    """a as (rows, K) with unit column stride, row stride a multiple of 8 and a 16-byte aligned
    start, or None."""
    k = a.shape[-1]
    x = a.reshape(-1, k)
    if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) % VECTOR) or x.data_ptr() % 16:
        return None
    return x


def recipe_supported(dtype: torch.dtype, shape: tuple[int, ...], fmt: ActivationFormat) -> bool:
    """Whether the kernels take activations of this dtype and shape by this recipe (the device and
    its arch aside: see ``quantize``)."""
    gran = fmt.granularity
    if not (dtype in _ACT_NAMES and len(shape) >= 1 and 0 not in shape and shape[-1] % VECTOR == 0):
        return False
    if fmt.element == "float4e2m1":
        return (gran is ActivationGranularity.GROUP and (fmt.group_size, fmt.scale_dtype) in FP4_RECIPES
                and shape[-1] % fmt.group_size == 0)
    return (fmt.scale_dtype == "float32" and fmt.element in helper_kernels.QUANT_ELEMENTS
            and (gran is not ActivationGranularity.GROUP
                 or (fmt.group_size in GROUP_SIZES and shape[-1] % fmt.group_size == 0)))


def supported(a: torch.Tensor, fmt: ActivationFormat) -> bool:
    """recipe_supported, on a CUDA device."""
    return a.device.type == "cuda" and recipe_supported(a.dtype, tuple(a.shape), fmt)


def quantize(a: torch.Tensor, fmt: ActivationFormat, static_scale: torch.Tensor | None,
             global_scale: torch.Tensor | None = None) -> QuantizedActivation | None:
    """``fmt.quantize(a, static_scale=static_scale, global_scale=global_scale)`` on the GPU, or
    None when the kernels do not take it (``supported``, the helper kernels off or not loadable,
    an element or scale this arch cannot encode). ``static_scale`` (per tensor only) and
    ``global_scale`` (nvfp4 only): a float32 tensor of one element on a's device."""
    if fmt.element == "float4e2m1":
        return _quantize_fp4(a, fmt, global_scale)
    if global_scale is not None:
        return None
    loaded = _unit_and_rows(a, fmt)
    if loaded is None:
        return None
    unit, x, device = loaded
    act = _ACT_NAMES[a.dtype]
    gran = fmt.granularity
    member = {ActivationGranularity.TOKEN: "token", ActivationGranularity.GROUP: "group",
              ActivationGranularity.TENSOR: "tensor_apply"}[gran]
    symbol = f"quant_{member}_{act}_{fmt.element}"
    if symbol not in unit.kernels:
        return None
    rows, k = x.shape
    threads = THREADS
    token = gran is ActivationGranularity.TOKEN
    parts = _parts(unit, rows, k, device, cluster=token)
    if parts == 1 and rows <= WIDE_ROWS and f"{symbol}_wide" in unit.kernels:  # (tensor_apply has none)
        symbol, threads = f"{symbol}_wide", helper_kernels.WIDE_THREADS
    grid, cluster = (rows, parts, 1), ((1, parts, 1) if token else (1, 1, 1))
    codes = torch.empty(rows, k, dtype=torch.uint8, device=a.device)
    scale_shape = _scale_shape(gran, fmt.group_size, tuple(a.shape))
    scales = torch.empty(scale_shape, dtype=torch.float32, device=a.device)
    amax = None
    if gran is ActivationGranularity.TENSOR and static_scale is None:
        amax = torch.zeros(1, dtype=torch.int32, device=a.device)  # the amax pass's float bits
    given = static_scale.reshape(1) if static_scale is not None else None
    params = _PARAMS.pack(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), 0 if given is None else given.data_ptr(),
                          0 if amax is None else amax.data_ptr(), rows, k, x.stride(0) if rows > 1 else k,
                          fmt.group_size or 0)

    pdl = unit.programmatic  # (the kernels wait for the upstream grid before their reads)
    with helper_kernels.current_for(device):  # a launch on stream 0 runs in the current context
        if amax is not None:
            unit.launch(f"quant_tensor_amax_{act}", grid, THREADS, 0, _stream(device), params, programmatic=pdl)
        unit.launch(symbol, grid, threads, 0, _stream(device), params, cluster, programmatic=pdl)
    return QuantizedActivation(element=fmt.element, granularity=gran, group_size=fmt.group_size,
                               scale_dtype=fmt.scale_dtype, codes=codes.reshape(a.shape), scales=scales)


def _unit_and_rows(a: torch.Tensor, fmt: ActivationFormat):
    """(the loaded quant unit, a as (rows, K), the device index) when the kernels may take a by
    fmt, else None: the recipe, the helper kernels on, the rows' layout, the unit loadable."""
    if not supported(a, fmt) or not env.helpers_enabled():
        return None
    x = _rows(a)
    device = a.device.index if a.device.index is not None else torch.cuda.current_device()
    if x is None or not helper_kernels.available("quant", device):
        return None
    return helper_kernels.load("quant", device), x, device


def _quantize_fp4(a: torch.Tensor, fmt: ActivationFormat, global_scale: torch.Tensor | None) -> QuantizedActivation | None:
    """quantize for mxfp4 and nvfp4 (act_quant_fp4.cuh): one launch, two for nvfp4 with the global
    scale from the tensor's amax (the amax pass of act_quant.cuh first)."""
    loaded = _unit_and_rows(a, fmt)
    if loaded is None:
        return None
    unit, x, device = loaded
    name = FP4_RECIPES[(fmt.group_size, fmt.scale_dtype)]
    if global_scale is not None and name != "nv":
        return None
    act = _ACT_NAMES[a.dtype]
    symbol = f"quant_fp4_{name}_{act}"
    if symbol not in unit.kernels:  # nvfp4's e4m3 scales before sm_89
        return None
    rows, k = x.shape
    grid = (rows, _parts(unit, rows, k, device, cluster=False), 1)
    codes = torch.empty(rows, k, dtype=torch.uint8, device=a.device)
    scales = torch.empty(_scale_shape(fmt.granularity, fmt.group_size, tuple(a.shape)), dtype=torch.float32,
                         device=a.device)
    glob = amax = given = None
    if name == "nv":
        glob = torch.empty((), dtype=torch.float32, device=a.device)
        if global_scale is None:
            amax = torch.zeros(1, dtype=torch.int32, device=a.device)  # the amax pass's float bits
        else:
            given = global_scale.reshape(1)
    base = _PARAMS.pack(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), 0 if given is None else given.data_ptr(),
                        0 if amax is None else amax.data_ptr(), rows, k, x.stride(0) if rows > 1 else k,
                        fmt.group_size)
    params = _FP4_PARAMS.pack(*_PARAMS.unpack(base), 0 if glob is None else glob.data_ptr())
    pdl = unit.programmatic  # (the kernels wait for the upstream grid before their reads)
    with helper_kernels.current_for(device):  # a launch on stream 0 runs in the current context
        if amax is not None:  # the amax pass takes ActQuantParams, the prefix of Fp4QuantParams
            unit.launch(f"quant_tensor_amax_{act}", grid, THREADS, 0, _stream(device), base, programmatic=pdl)
        unit.launch(symbol, grid, THREADS, 0, _stream(device), params, programmatic=pdl)
    return QuantizedActivation(element=fmt.element, granularity=fmt.granularity, group_size=fmt.group_size,
                               scale_dtype=fmt.scale_dtype, codes=codes.reshape(a.shape), scales=scales,
                               global_scale=glob)


def row_parts(rows: int, vectors: int, sms: int, *, cluster: bool = False) -> int:
    """The CTAs each of ``rows`` rows of ``vectors`` vectors is split into on a GPU of ``sms`` SMs
    (see MAX_PARTS): for rows of SPLIT_VECTORS vectors or more (CLUSTER_SPLIT_VECTORS where the
    parts are one cluster: ``cluster``), the largest power of two up to MAX_PARTS that keeps
    rows x parts <= min(sms, SPLIT_CTAS) and vectors / parts >= PART_VECTORS, if that is at least
    MIN_PARTS; else 1."""
    parts = 1
    if vectors >= (CLUSTER_SPLIT_VECTORS if cluster else SPLIT_VECTORS):
        ctas = min(sms, SPLIT_CTAS)
        while parts < MAX_PARTS and rows * parts * 2 <= ctas and vectors >= parts * 2 * PART_VECTORS:
            parts *= 2
    return parts if parts >= MIN_PARTS else 1


def _parts(unit, rows: int, k: int, device: int, *, cluster: bool) -> int:
    """row_parts on ``device``; 1 where the parts would need a cluster (``cluster``: a per-token
    amax) that cannot be had (_clusters)."""
    parts = row_parts(rows, k // VECTOR, _sm_count(device), cluster=cluster)
    return 1 if parts > 1 and cluster and not _clusters(unit) else parts


def _sm_count(device: int) -> int:
    from humming_aot.dispatch import device_info

    return device_info(device).num_sms


def _clusters(unit) -> bool:
    """Whether the unit's kernels may be launched in thread-block clusters: an sm_90+ build,
    HUMMING_AOT_CLUSTERS on, a driver with cuLaunchKernelEx."""
    from humming_aot import _launcher
    from humming_aot.spec import parse_arch

    return parse_arch(unit.arch)[0] >= 90 and env.clusters_enabled() and _launcher.supports_programmatic_launch()


def _stream(device: int) -> int:
    from humming_aot.dispatch import current_stream

    return current_stream(device)
