"""Thin Python face of the launcher extension ``humming_aot._C``.

The extension is imported on first use, not at ``import humming_aot``; when it is missing (a source
checkout that was never built) the first use raises an ImportError that says how to build it.
Importing the extension needs no driver or GPU: ``libcuda.so.1`` is loaded by the first call that
needs it, and its absence raises :class:`DriverNotFoundError` there.

Handles (library, kernel, stream) are plain ints. Every driver failure raises :class:`CudaError`
(a RuntimeError) whose message names the call, what it was doing, the CUDA error name and the
driver's description; ``.code`` holds the CUresult and ``.error_name`` its name.

Callers go through this module's functions (``_launcher.launch(...)``), never through ``_C``
directly, so that tests can replace them with fakes.
"""
from __future__ import annotations

import enum
from types import ModuleType

# Anything with the C-contiguous buffer protocol (also ctypes structures); bytes take the fastest path.
BytesLike = bytes | bytearray | memoryview

__all__ = [  # noqa: F822 (CudaError, DriverNotFoundError: module __getattr__, from the extension)
    "CudaError",
    "DeviceAttribute",
    "DriverNotFoundError",
    "FunctionAttribute",
    "alloc_zeroed_for_process",
    "device_attribute",
    "driver_available",
    "driver_unavailable_reason",
    "driver_version",
    "encode_tensor_map_2d",
    "get_kernel",
    "image_problem",
    "kernel_attribute",
    "launch",
    "load_library",
    "read_global",
    "set_max_dynamic_smem",
    "supports_programmatic_launch",
    "unload_library",
]

_extension: ModuleType | None = None


def _c() -> ModuleType:
    global _extension
    if _extension is None:
        try:
            from humming_aot import _C
        except ImportError as error:
            raise ImportError(
                "humming_aot's launcher extension humming_aot._C is not built or cannot be loaded "
                f"({error}). In a source checkout run `pip install -e .` or "
                "`python setup.py build_ext --inplace`; otherwise reinstall the humming_aot wheel for this "
                "Python version."
            ) from error
        _extension = _C
    return _extension


def __getattr__(name: str):
    # The exception classes live in the extension; importing it here keeps `import _launcher` free.
    if name in ("CudaError", "DriverNotFoundError"):
        return getattr(_c(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class FunctionAttribute(enum.IntEnum):
    """CUfunction_attribute values for :func:`kernel_attribute` (CUDA driver API ABI)."""

    MAX_THREADS_PER_BLOCK = 0
    """Most threads per block a launch may use (limited by registers and launch bounds)."""
    SHARED_SIZE_BYTES = 1
    """Static shared memory per block, in bytes."""
    CONST_SIZE_BYTES = 2
    """User __constant__ memory of the kernel, in bytes."""
    LOCAL_SIZE_BYTES = 3
    """Local memory per thread, in bytes (non-zero means register spills or stack arrays)."""
    NUM_REGS = 4
    """Registers per thread."""
    PTX_VERSION = 5
    """PTX ISA version the kernel was compiled for (major * 10 + minor)."""
    BINARY_VERSION = 6
    """SASS architecture of the loaded binary (major * 10 + minor, e.g. 90)."""
    MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
    """Most dynamic shared memory a launch may ask for, in bytes (set by set_max_dynamic_smem)."""


class DeviceAttribute(enum.IntEnum):
    """CUdevice_attribute values for :func:`device_attribute` (CUDA driver API ABI)."""

    MAX_THREADS_PER_BLOCK = 1
    """Most threads per block."""
    WARP_SIZE = 10
    """Threads per warp."""
    MULTIPROCESSOR_COUNT = 16
    """Streaming multiprocessors (SMs)."""
    L2_CACHE_SIZE = 38
    """L2 cache, in bytes."""
    COMPUTE_CAPABILITY_MAJOR = 75
    """Compute capability, major (9 for sm_90)."""
    COMPUTE_CAPABILITY_MINOR = 76
    """Compute capability, minor (0 for sm_90)."""
    MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
    """Shared memory per SM, in bytes."""
    MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
    """Most shared memory one block may opt in to, in bytes (the limit for set_max_dynamic_smem)."""


def driver_available() -> bool:
    """Whether a usable NVIDIA driver is present (libcuda.so.1 loads, cuInit(0) succeeds).

    Never raises for a missing driver (only ImportError when the extension itself is not built).
    """
    return _c().driver_available()


def supports_programmatic_launch() -> bool:
    """Whether :func:`launch` can honour ``programmatic_dependent_launch=True``: a usable driver with
    cuLaunchKernelEx. Says nothing about the device (PDL needs sm_90+). Never raises for a missing driver.
    """
    return _c().supports_programmatic_launch()


def driver_unavailable_reason() -> str:
    """Why :func:`driver_available` is False, e.g. dlopen's error text; '' when it is True."""
    return _c().driver_unavailable_reason()


def driver_version() -> int:
    """cuDriverGetVersion: 1000 * major + 10 * minor of the driver's CUDA version (13000 for 13.0)."""
    return _c().driver_version()


def image_problem(image: BytesLike) -> str:
    """'' when ``image`` is a complete fatbin or cubin, else what is wrong with it. Needs no driver."""
    return _c().image_problem(image)


def encode_tensor_map_2d(address: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int,
                         box_cols: int) -> bytes:
    """The 128 bytes of a TMA tensor map over a row-major (rows, cols) matrix of 16-bit elements at
    device address `address` (rows `row_stride_bytes` apart, both multiples of 16), read in boxes of
    (box_rows, box_cols = 64) with the 128-byte swizzle, rows past the end read as zeros."""
    return _c().encode_tensor_map_2d(address, rows, cols, row_stride_bytes, box_rows, box_cols)


def load_library(image: BytesLike, what: str) -> int:
    """Load a fatbin or cubin (bytes-like; the driver keeps its own copy); returns the CUlibrary.

    Context-independent (cuLibraryLoadData): the library serves every device and context. ``what``
    names the image in error messages, e.g. ``"kernel gemm_dense_sm90a_..."``. Raises ValueError for
    an image that is not a complete fatbin / cubin, CudaError (e.g. CUDA_ERROR_NO_BINARY_FOR_GPU)
    when the driver refuses it.
    """
    return _c().load_library(image, what)


def unload_library(library: int) -> None:
    """cuLibraryUnload: every kernel handle obtained from ``library`` becomes invalid."""
    _c().unload_library(library)


def get_kernel(library: int, name: str) -> int:
    """The CUkernel of the ``extern "C"`` kernel ``name`` in ``library`` (CUDA_ERROR_NOT_FOUND if absent)."""
    return _c().get_kernel(library, name)


def read_global(library: int, name: str, device: int) -> bytes:
    """The bytes of the ``__constant__`` / ``__device__`` variable ``name`` as loaded on ``device``.

    Synchronous (cuMemcpyDtoH), so not allowed during CUDA-graph capture. Makes ``device``'s primary
    context current when the calling thread has no current context.
    """
    return _c().read_global(library, name, device)


def set_max_dynamic_smem(kernel: int, device: int, nbytes: int) -> None:
    """Allow launches of ``kernel`` on ``device`` to use up to ``nbytes`` of dynamic shared memory."""
    _c().set_max_dynamic_smem(kernel, device, nbytes)


def kernel_attribute(kernel: int, attribute: int, device: int) -> int:
    """cuKernelGetAttribute; ``attribute`` is a :class:`FunctionAttribute`."""
    return _c().kernel_attribute(kernel, attribute, device)


def max_active_clusters(kernel: int, block: tuple[int, int, int], smem: int, cluster: tuple[int, int, int],
                        device: int) -> int:
    """cuOccupancyMaxActiveClusters: how many thread-block clusters of shape ``cluster`` of ``kernel``
    (``block`` threads, ``smem`` bytes of dynamic shared memory, placed as :func:`launch` places
    them) ``device`` holds at once; 0 when the driver cannot say."""
    return _c().max_active_clusters(kernel, block, smem, cluster, device)


def device_attribute(device: int, attribute: int) -> int:
    """cuDeviceGetAttribute; ``attribute`` is a :class:`DeviceAttribute`."""
    return _c().device_attribute(device, attribute)


def alloc_zeroed_for_process(device: int, nbytes: int) -> int:
    """The address of ``nbytes`` (a positive multiple of 4) of device memory on ``device``, zero
    when this returns and never freed. It is allocated and zeroed outside any CUDA-graph capture
    (the calling thread's capture mode relaxed for the call, a memset synchronized on a private
    stream), so a buffer first asked for inside a capture is neither in the graph's memory pool nor
    zeroed only when that graph replays. ValueError for a bad size; CudaError from the driver."""
    return _c().alloc_zeroed_for_process(device, nbytes)


def launch(
    kernel: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    smem: int,
    stream: int,
    params: BytesLike,
    device: int,
    *,
    programmatic_dependent_launch: bool = False,
    cluster: tuple[int, int, int] = (1, 1, 1),
) -> None:
    """Launch ``kernel`` asynchronously on ``stream``; ``params`` are the bytes of its one by-value struct.

    ``grid`` and ``block`` are (x, y, z) counts; ``smem`` is dynamic shared memory in bytes (at most
    what :func:`set_max_dynamic_smem` allowed); ``stream`` is a CUstream as an int
    (``torch.cuda.current_stream(device).cuda_stream``; 0 is the legacy default stream of the
    current context). ``params`` must be exactly the kernel's parameter size: the driver reads that
    many bytes. If the thread has no current context, ``device``'s primary context is made current.

    ``programmatic_dependent_launch=True`` (ask for it on sm_90+ devices only) launches with
    Programmatic Dependent Launch: the kernel may start while the previous kernel in ``stream``
    finishes, so it must execute ``griddepcontrol.wait`` before reading what that kernel writes.
    Without cuLaunchKernelEx in the driver (:func:`supports_programmatic_launch`) it is an ordinary
    launch; results are the same either way.

    ``cluster`` other than (1, 1, 1) launches thread-block clusters of that shape (sm_90+ devices;
    each grid dimension must be a multiple of it): a kernel may rely on its cluster, so without
    cuLaunchKernelEx this raises ValueError instead of launching without one.
    """
    (_extension or _c()).launch(
        kernel, grid, block, smem, stream, params, device, programmatic_dependent_launch=programmatic_dependent_launch,
        cluster=cluster,
    )


def planned_launch(kernel: int, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, device: int,
                   programmatic_dependent_launch: bool, cluster: tuple[int, int, int], params_template: bytes,
                   pointer_offsets: tuple[int, ...], lda_offset: int, ldo_offset: int, global_scale_offset: int,
                   tensor_map_offset: int):
    """A launch of ``kernel`` with everything but its per-call fields decided (a ``_C.PlannedLaunch``):
    ``params_template`` is its Params bytes with those fields zero, the offsets say where they go
    (humming_aot.params_abi; -1: no tensor map). Its ``launch(stream, a, w, w_scale, w_zero_point,
    bias, out, workspace, lda, ldo, global_scale, tensor_map)`` writes them into a copy and launches
    as :func:`launch` would, in one call into the extension; ``params(...)`` gives those bytes."""
    return (_extension or _c()).PlannedLaunch(
        kernel, grid, block, smem, device, programmatic_dependent_launch, cluster, params_template, pointer_offsets,
        lda_offset, ldo_offset, global_scale_offset, tensor_map_offset,
    )

