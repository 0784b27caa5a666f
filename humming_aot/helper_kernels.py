"""Kernels that are not GEMMs: fixed sources under csrc/include/humming_aot/helpers/, one
translation unit per (unit, arch), each unit a handful of ``extern "C"`` kernels.

The ``moe`` unit holds the steps around the MoE GEMMs (routing, permute, activation, combine:
humming_aot.moe.cuda_steps launches them); the ``quant`` unit quantizes activations
(humming_aot.quant.cuda_quant). A unit's source is generated here, like a GEMM key's
(codegen.py). Every catalog build (``humming-aot build``) compiles the units of its archs with
nvcc into ``helpers/<unit>_<arch>.fatbin`` beside its kernels, listed in its manifest; outside a
catalog, NVRTC compiles the same source into the JIT disk cache on first use (``jit.cache``, the
same content-hash keyed cache as the GEMMs'). A library is loaded once per device. ``available``
says whether a device can get a unit now; callers fall back to their torch path when it cannot
(``HUMMING_AOT_JIT=0`` without a build of the unit), so a helper kernel is never the only way.
"""
from __future__ import annotations

import dataclasses
import logging
import threading

from humming_aot import _launcher
from humming_aot.jit.cubin import EM_CUDA, STT_FUNC, CubinError, read_cubin
from humming_aot.spec import parse_arch

logger = logging.getLogger(__name__)

# Bumped when a helper Params struct or a kernel's contract changes (part of every unit's source,
# so a cached cubin of another version is never loaded). 6: the quant unit's kernels wait for the
# upstream grid before they read, so they may be launched with Programmatic Dependent Launch. 7: the
# moe unit's kernels too (an older catalog's moe unit has no wait and is not loaded: the JIT serves it).
HELPERS_VERSION = 7

_ACTS = {"f16": "humming_aot::numerics::Float16", "bf16": "humming_aot::numerics::BFloat16"}


def _moe_kernels(arch: str) -> list[tuple[str, str, str, str]]:
    """(symbol, Params struct, class, member) of every kernel of the moe unit on ``arch``."""
    kernels = []
    for id_name, id_type in (("i32", "int"), ("i64", "humming_aot::i64")):
        route = f"humming_aot::helpers::MoeRoute<{id_type}>"
        kernels.append((f"moe_route_count_{id_name}", "RouteParams", route, "count"))
        kernels.append((f"moe_route_place_{id_name}", "RouteParams", route, "place"))
        kernels.append((f"moe_route_single_{id_name}", "RouteParams", route, "single"))
        kernels.append((f"moe_route_segments_{id_name}", "RouteParams",
                        f"humming_aot::helpers::MoeRouteSegments<{id_type}>", "segments"))
    for words in (4, 1):  # the gather copies 16-bit values of any dtype
        kernels.append((f"moe_gather_v{words}", "GatherParams", f"humming_aot::helpers::MoeGather<{words}>", "run"))
    number, _ = parse_arch(arch)
    acts = ("f16", "bf16") if number >= 80 else ("f16",)  # no bf16 conversions before sm_80
    for act in acts:
        for pairs in (4, 1):
            for kind, kind_name in (("kSiluAndMul", "silu_and_mul"), ("kSwigluOai", "swiglu_oai")):
                kernels.append((f"moe_{kind_name}_{act}_v{pairs}", "ActivationParams",
                                f"humming_aot::helpers::MoeActivation<{_ACTS[act]}, "
                                f"humming_aot::helpers::ActivationKind::{kind}, {pairs}>", "run"))
            for weights, fp32 in (("w32", "true"), ("wact", "false")):
                kernels.append((f"moe_combine_{act}_{weights}_v{pairs}", "CombineParams",
                                f"humming_aot::helpers::MoeCombine<{_ACTS[act]}, {fp32}, {pairs}>", "run"))
    return kernels


QUANT_ELEMENTS = {"int8": "kInt8", "float8e4m3": "kE4M3", "float8e5m2": "kE5M2"}
WIDE_THREADS = 1024  # the threads of a row's CTA in the quant unit's "_wide" kernels


def quant_elements(arch: str) -> tuple[str, ...]:
    """The activation elements the quant unit encodes on ``arch`` (fp8 needs sm_89's cvt.satfinite)."""
    number, _ = parse_arch(arch)
    return tuple(e for e in QUANT_ELEMENTS if e == "int8" or number >= 89)


def _quant_kernels(arch: str) -> list[tuple[str, str, str, str]]:
    """(symbol, Params struct, class, member) of every kernel of the quant unit on ``arch``."""
    number, _ = parse_arch(arch)
    kernels = []
    for act in ("f16", "bf16") if number >= 80 else ("f16",):
        for element in quant_elements(arch):
            cls = (f"humming_aot::helpers::ActQuant<{_ACTS[act]}, "
                   f"humming_aot::helpers::QuantElement::{QUANT_ELEMENTS[element]}")
            for member in ("token", "group", "tensor_apply"):
                kernels.append((f"quant_{member}_{act}_{element}", "ActQuantParams", f"{cls}>", member))
            # a row per CTA of 1024 threads rather than 256, for few rows (quantization's WIDE_ROWS)
            for member in ("token", "group"):
                kernels.append((f"quant_{member}_{act}_{element}_wide", "ActQuantParams", f"{cls}, {WIDE_THREADS}>",
                                member))
            if element == "int8":  # the amax pass does not depend on the element
                kernels.append((f"quant_tensor_amax_{act}", "ActQuantParams", f"{cls}>", "tensor_amax"))
        # 4-bit floats per group (act_quant_fp4.cuh): MXFP4 anywhere, NVFP4's e4m3 scales from sm_89
        for scale, name in (("kE8M0", "mx"), ("kE4M3Global", "nv")):
            if name == "mx" or number >= 89:
                kernels.append((f"quant_fp4_{name}_{act}", "Fp4QuantParams",
                                f"humming_aot::helpers::ActQuantFp4<{_ACTS[act]}, "
                                f"humming_aot::helpers::Fp4Scale::{scale}>", "group"))
    return kernels


_UNITS = {
    "moe": (("moe_route.cuh", "moe_gather.cuh", "moe_activation.cuh", "moe_combine.cuh"), _moe_kernels),
    "quant": (("act_quant.cuh", "act_quant_fp4.cuh"), _quant_kernels),
}


def unit_names() -> tuple[str, ...]:
    return tuple(_UNITS)


def _unit(unit: str):
    try:
        return _UNITS[unit]
    except KeyError:
        raise ValueError(f"no helper kernel unit {unit!r}; the units are {', '.join(_UNITS)}") from None


def kernel_names(unit: str, arch: str) -> list[str]:
    """The symbols a unit's library exports on ``arch``."""
    return [symbol for symbol, *_ in _unit(unit)[1](arch)]


def unit_source(unit: str, arch: str) -> str:
    """The generated .cu text of one unit for one arch (deterministic)."""
    headers, kernels = _unit(unit)
    includes = "\n".join(f"#include <humming_aot/helpers/{header}>" for header in headers)
    bodies = []
    for symbol, params, cls, member in kernels(arch):
        bodies.append(f"""extern "C" __global__ void __launch_bounds__({cls}::kThreads)
{symbol}(const __grid_constant__ humming_aot::helpers::{params} params) {{
  {cls}::{member}(params);
}}""")
    return f"""\
// Generated by humming_aot.helper_kernels for the {unit} unit on {arch}. Do not edit.
{includes}

extern "C" __constant__ int humming_aot_helpers_version = {HELPERS_VERSION};

""" + "\n\n".join(bodies) + "\n"


def unit_name(unit: str, arch: str) -> str:
    return f"helpers_{unit}_{arch}"


def check_unit_cubin(data: bytes, unit: str, arch: str) -> None:
    """CubinError unless ``data`` is a cubin for ``arch`` exporting every kernel of the unit."""
    name = unit_name(unit, arch)
    try:
        cubin = read_cubin(data)
    except CubinError as e:
        raise CubinError(f"{name}: not a readable cubin ({e})") from None
    number, _ = parse_arch(arch)
    if cubin.machine != EM_CUDA or cubin.sm != number:
        raise CubinError(f"{name}: the cubin is for sm_{cubin.sm} (machine {cubin.machine}), expected sm_{number}")
    missing = [s for s in kernel_names(unit, arch) if getattr(cubin.symbols.get(s), "type", None) != STT_FUNC]
    if missing:
        raise CubinError(f"{name}: the cubin lacks the kernels {', '.join(missing)}")


def compile_unit(unit: str, arch: str):
    """The unit's jit.cache.CompileUnit."""
    from humming_aot.jit.cache import CompileUnit

    return CompileUnit(name=unit_name(unit, arch), arch=arch, source=unit_source(unit, arch),
                       check=lambda data: check_unit_cubin(data, unit, arch))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LoadedUnit:
    """A unit's library on one device, with its kernels (symbol -> CUkernel)."""

    unit: str
    arch: str
    device: int
    library: int
    kernels: dict[str, int]
    programmatic: bool = False  # programmatic_launch(arch), when the unit was loaded

    def launch(self, symbol: str, grid: tuple[int, int, int], threads: int, smem: int, stream: int,
               params: bytes, cluster: tuple[int, int, int] = (1, 1, 1), *, programmatic: bool = False) -> None:
        """``cluster`` other than (1, 1, 1): thread-block clusters of that shape (sm_90+, a driver
        with cuLaunchKernelEx; _launcher.launch raises ValueError without). ``programmatic``: with
        Programmatic Dependent Launch, for a kernel that waits for the upstream grid before its
        reads (the quant and moe units', from sm_90 builds: ``self.programmatic``)."""
        try:
            kernel = self.kernels[symbol]
        except KeyError:
            raise ValueError(f"helper unit {self.unit} on {self.arch} has no kernel {symbol}") from None
        _launcher.launch(kernel, grid, (threads, 1, 1), smem, stream, params, self.device, cluster=cluster,
                         programmatic_dependent_launch=programmatic)


def programmatic_launch(arch: str) -> bool:
    """Whether a unit's kernels that wait for the upstream grid (griddepcontrol.wait, compiled in
    from sm_90 on) may be launched with Programmatic Dependent Launch: an sm_90+ build and
    HUMMING_AOT_PDL on (read when the unit is loaded, as for the GEMM kernels)."""
    from humming_aot import env

    return parse_arch(arch)[0] >= 90 and env.pdl_enabled()


_loaded: dict[tuple[str, int], LoadedUnit] = {}
_unavailable: dict[tuple[str, int], str] = {}
_lock = threading.Lock()


def obtain_image(unit: str, arches: tuple[str, ...] | list[str]) -> tuple[str, bytes]:
    """(arch, image) of a unit for a device that runs ``arches`` (best first): the installed
    catalog's fatbin of the first arch it holds (every catalog build carries the units of its
    archs), else an NVRTC build for the best arch through the JIT cache. RuntimeError saying why
    when neither can be had (HUMMING_AOT_JIT=0 and no catalog of these archs)."""
    from humming_aot import jit
    from humming_aot.catalog import installed_catalog

    catalog = installed_catalog()
    if catalog is not None:
        for arch in arches:
            if unit_name(unit, arch) in catalog.helpers:
                return arch, catalog.read_image(unit_name(unit, arch))
    arch = arches[0]
    ok, why = jit.jit_available(arch)
    if not ok:
        raise RuntimeError(f"helper kernels {unit_name(unit, arch)} are in no installed catalog and cannot be "
                           f"compiled: {why}")
    result = jit.cache.obtain(compile_unit(unit, arch), include_dir=jit._include_dir(),
                              nvrtc_lib=jit.nvrtc.load_nvrtc())
    return arch, result.data


def load(unit: str, device: int) -> LoadedUnit:
    """The unit's library loaded on ``device`` (compiled first if the JIT cache lacks it); raises
    RuntimeError saying why when it cannot be had."""
    key = (unit, device)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _loaded.get(key)
        if hit is not None:
            return hit
        from humming_aot.dispatch import device_info

        arch, image = obtain_image(unit, device_info(device).arches)
        library = _launcher.load_library(image, unit_name(unit, arch))
        kernels = {symbol: _launcher.get_kernel(library, symbol) for symbol in kernel_names(unit, arch)}
        hit = LoadedUnit(unit=unit, arch=arch, device=device, library=library, kernels=kernels,
                         programmatic=programmatic_launch(arch))
        _loaded[key] = hit
        return hit


def available(unit: str, device: int) -> bool:
    """Whether ``load(unit, device)`` succeeds (remembered per device: a unit that cannot be had is
    asked for once, and the reason logged once)."""
    key = (unit, device)
    if key in _loaded:
        return True
    if key in _unavailable:
        return False
    try:
        load(unit, device)
        return True
    except Exception as error:  # noqa: BLE001 (any failure means the torch path)
        _unavailable[key] = str(error)
        logger.warning("humming_aot: %s helper kernels unavailable on device %d, using torch operations: %s",
                       unit, device, error)
        return False


def clear() -> None:
    """Forget loaded units and remembered failures (tests)."""
    with _lock:
        _loaded.clear()
        _unavailable.clear()


def current_for(device: int):
    """A context in which ``device`` is the current CUDA device: nothing when it already is (the
    common case, one cheap query), else torch.cuda.device. A launch on the legacy default stream
    (0) runs in the current context, so a unit's kernels for tensors on another device launch
    inside this."""
    import contextlib

    import torch

    return contextlib.nullcontext() if device == torch.cuda.current_device() else torch.cuda.device(device)
