"""Load a kernel image, check its self-description, and keep loaded kernels in memory.

Step 4 of a call ("obtain") ends here: whoever found the image (the catalog in the wheel, the JIT
disk cache, a fresh NVRTC compile) hands its bytes and its manifest entry to
:func:`load_kernel_image`, through :func:`get_loaded` so that each (kernel, device) loads once per
process.

Every kernel exports ``extern "C" __constant__ KernelMetadata <symbol>_metadata`` beside it
(spec.metadata_symbol; an image may hold several kernels, each with its own; 256 bytes,
little-endian)::

    struct KernelMetadata {
      uint32_t magic;           // KERNEL_METADATA_MAGIC: the bytes 'HAOT'
      uint32_t params_version;  // humming_aot::kernel::kParamsVersion (== PARAMS_VERSION)
      uint32_t params_bytes;    // sizeof(GemmParams): the bytes each launch passes
      uint32_t threads;         // threads per block
      uint32_t smem_bytes;      // dynamic shared memory per block, in bytes
      uint32_t block_m, block_n, block_k;  // tile shape
      char name[224];           // the kernel's KernelKey name, NUL-terminated
    };

The metadata is checked against the manifest entry before the kernel is used: a mismatch means a
stale or corrupt catalog or cache, and is an error naming the kernel and the field, never a launch
with the wrong configuration.
"""
from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from humming_aot import _launcher, env
from humming_aot.params_abi import PARAMS_VERSION
from humming_aot.spec import kernel_symbol, metadata_symbol

__all__ = [
    "KERNEL_METADATA_BYTES",
    "KERNEL_METADATA_MAGIC",
    "KernelMetadata",
    "KernelMetadataError",
    "LoadedKernel",
    "check_kernel_metadata",
    "clear_loaded_kernels",
    "get_loaded",
    "load_kernel_image",
    "parse_kernel_metadata",
]

KERNEL_METADATA_MAGIC = 0x544F4148
"""``KernelMetadata.magic``: the bytes ``b'HAOT'`` read as a little-endian uint32."""
_METADATA_LAYOUT = struct.Struct("<8I224s")
KERNEL_METADATA_BYTES = _METADATA_LAYOUT.size  # 256

# Manifest fields that must equal the image's metadata. "params_bytes" and the tile shape are
# compared too when the manifest entry has them.
_REQUIRED_FIELDS = ("threads", "smem_bytes")
_OPTIONAL_FIELDS = ("params_bytes", "block_m", "block_n", "block_k")

_REBUILD_HINT = (
    "the catalog or JIT cache entry is stale or corrupt: reinstall the humming_aot wheel, rebuild it with "
    "`humming-aot build`, or delete the JIT cache entry so that it is compiled again"
)


class KernelMetadataError(ValueError):
    """A kernel image's self-description differs from what the manifest (or this package) expects.

    ``kernel`` is the kernel's name, ``field`` the metadata field that differs, ``found`` the image's
    value and ``expected`` the manifest's (or this package's).
    """

    def __init__(self, message: str, *, kernel: str, field: str, found: object = None, expected: object = None):
        super().__init__(message)
        self.kernel = kernel
        self.field = field
        self.found = found
        self.expected = expected


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelMetadata:
    """The decoded KernelMetadata of one kernel (see the module docstring)."""

    magic: int
    params_version: int
    params_bytes: int
    threads: int
    smem_bytes: int
    block_m: int
    block_n: int
    block_k: int
    name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedKernel:
    """A kernel ready to launch on one device. Handles are the launcher's ints (CUlibrary, CUkernel)."""

    name: str  # KernelKey name, also the kernel's symbol
    library: int  # CUlibrary holding the image
    kernel: int  # CUkernel
    threads: int  # threads per block: every launch uses block (threads, 1, 1)
    smem_bytes: int  # dynamic shared memory per block, in bytes (already allowed on `device`)
    params_bytes: int  # size of the Params struct each launch passes
    device: int  # CUDA device ordinal the kernel was prepared for
    # Launch with Programmatic Dependent Launch: HUMMING_AOT_PDL is on and `device` is sm_90+
    programmatic_launch: bool = False
    # Thread-block clusters can be launched: `device` is sm_90+ and the driver has cuLaunchKernelEx
    cluster_launch: bool = False

    def launch(self, grid: tuple[int, int, int], stream: int, params: bytes,
               cluster: tuple[int, int, int] = (1, 1, 1)) -> None:
        """Launch on ``stream`` (a CUstream int, e.g. ``torch.cuda.current_stream().cuda_stream``).

        ``params`` are the bytes of the kernel's Params struct, exactly ``params_bytes`` long. With
        ``programmatic_launch`` the kernel may start while the previous kernel in ``stream`` finishes.
        ``cluster`` other than (1, 1, 1) (only where ``cluster_launch``) groups the CTAs into
        thread-block clusters of that shape.
        """
        if cluster != (1, 1, 1) and not self.cluster_launch:
            raise ValueError(
                f"kernel {self.name}: cluster {cluster} asked on device {self.device}, which cannot launch "
                "thread-block clusters (they need an sm_90+ device and a driver with cuLaunchKernelEx)"
            )
        if len(params) != self.params_bytes:
            raise ValueError(
                f"kernel {self.name}: params are {len(params)} bytes but the kernel takes {self.params_bytes}; "
                "the Python Params layout differs from the C++ GemmParams"
            )
        try:
            _launcher.launch(
                self.kernel, grid, (self.threads, 1, 1), self.smem_bytes, stream, params, self.device,
                programmatic_dependent_launch=self.programmatic_launch, cluster=cluster,
            )
        except Exception as error:
            error.add_note(f"launching kernel {self.name} on device {self.device}")
            raise


def parse_kernel_metadata(raw: bytes, *, kernel: str) -> KernelMetadata:
    """Decode the bytes of kernel ``kernel``'s KernelMetadata (``metadata_symbol(kernel)``) read from its image."""
    if len(raw) != KERNEL_METADATA_BYTES:
        raise KernelMetadataError(
            f"kernel {kernel}: {metadata_symbol(kernel)} is {len(raw)} bytes, expected {KERNEL_METADATA_BYTES}: "
            f"the image was built against a different KernelMetadata layout; {_REBUILD_HINT}",
            kernel=kernel,
            field="size",
            found=len(raw),
            expected=KERNEL_METADATA_BYTES,
        )
    magic, params_version, params_bytes, threads, smem_bytes, block_m, block_n, block_k, name = (
        _METADATA_LAYOUT.unpack(raw)
    )
    try:
        decoded_name = name.split(b"\0", 1)[0].decode("ascii")
    except UnicodeDecodeError:
        decoded_name = repr(name.split(b"\0", 1)[0])
    return KernelMetadata(
        magic=magic,
        params_version=params_version,
        params_bytes=params_bytes,
        threads=threads,
        smem_bytes=smem_bytes,
        block_m=block_m,
        block_n=block_n,
        block_k=block_k,
        name=decoded_name,
    )


_ABSENT = object()


def _manifest_value(expected: Mapping[str, object] | object, field: str) -> object:
    if isinstance(expected, Mapping):
        return expected.get(field, _ABSENT)
    return getattr(expected, field, _ABSENT)


def check_kernel_metadata(metadata: KernelMetadata, *, name: str, expected: Mapping[str, object] | object) -> None:
    """Raise :class:`KernelMetadataError` unless ``metadata`` describes kernel ``name`` as ``expected`` says.

    ``expected`` is the kernel's manifest entry, as a dict or as an object with attributes (e.g.
    ``catalog.CatalogEntry``): it must have "threads" and "smem_bytes"; "params_bytes", "block_m",
    "block_n" and "block_k" are compared when present. The magic and the params version are checked
    against this package's constants.
    """
    if metadata.magic != KERNEL_METADATA_MAGIC:
        raise KernelMetadataError(
            f"kernel {name}: {metadata_symbol(name)}.magic is {metadata.magic:#010x}, expected "
            f"{KERNEL_METADATA_MAGIC:#010x} ('HAOT'): the image is not a humming_aot kernel or was built by an "
            f"incompatible version; {_REBUILD_HINT}",
            kernel=name,
            field="magic",
            found=metadata.magic,
            expected=KERNEL_METADATA_MAGIC,
        )
    if metadata.name != name:
        raise KernelMetadataError(
            f"kernel {name}: the image describes itself as {metadata.name!r}: the file holds a different kernel "
            f"than its manifest entry says; {_REBUILD_HINT}",
            kernel=name,
            field="name",
            found=metadata.name,
            expected=name,
        )
    if metadata.params_version != PARAMS_VERSION:
        raise KernelMetadataError(
            f"kernel {name}: built for GemmParams version {metadata.params_version}, but this humming_aot passes "
            f"version {PARAMS_VERSION}; launching it would pass a wrong argument struct; {_REBUILD_HINT}",
            kernel=name,
            field="params_version",
            found=metadata.params_version,
            expected=PARAMS_VERSION,
        )
    for field in _REQUIRED_FIELDS + _OPTIONAL_FIELDS:
        wanted = _manifest_value(expected, field)
        if wanted is _ABSENT:
            if field in _OPTIONAL_FIELDS:
                continue
            raise KernelMetadataError(
                f"kernel {name}: the manifest entry has no {field!r} ({expected!r}); the manifest was "
                "written by an incompatible humming_aot version; " + _REBUILD_HINT,
                kernel=name,
                field=field,
            )
        found = getattr(metadata, field)
        if found != wanted:
            raise KernelMetadataError(
                f"kernel {name}: metadata field {field!r} is {found} in the image but {wanted} in the manifest; "
                + _REBUILD_HINT,
                kernel=name,
                field=field,
                found=found,
                expected=wanted,
            )


# ---- Loaded images: one CUlibrary per image (a catalog file holds a few kernels) ----

# sha256 of an image -> the CUlibrary (for every device: cuLibrary*) of a kernel that loaded from it
_libraries: dict[str, int] = {}
_libraries_guard = threading.Lock()


def load_kernel_image(
    image: bytes | Callable[[], bytes], *, name: str, expected: Mapping[str, object] | object, device: int,
    image_digest: str | None = None,
) -> LoadedKernel:
    """Load ``image`` (fatbin or cubin bytes), check its metadata, prepare kernel ``name`` for ``device``.

    ``expected`` is the manifest entry (see :func:`check_kernel_metadata`). An image another kernel
    was loaded from is not loaded again: its library is shared (``image_digest``: the image's
    sha256 where the caller knows it, as the catalog does; else it is computed). ``image`` may be
    a function that returns the bytes: with ``image_digest`` given it is called only where no
    kernel has loaded the image yet, so a catalog file's later kernels read nothing. On any failure a
    library loaded by this call is unloaded again and the error propagates: KernelMetadataError for
    a metadata mismatch, ``_launcher.CudaError`` for a driver failure (e.g.
    CUDA_ERROR_NO_BINARY_FOR_GPU when the image has no code for this GPU),
    ``_launcher.DriverNotFoundError`` without a driver, ValueError for a bad HUMMING_AOT_PDL or
    HUMMING_AOT_CLUSTERS.
    """
    if image_digest is None:
        image = image() if callable(image) else image
        image_digest = hashlib.sha256(image).hexdigest()
    with _libraries_guard:
        library = _libraries.get(image_digest)
    shared = library is not None
    if not shared:
        library = _launcher.load_library(image() if callable(image) else image, f"kernel {name}")
    try:
        kernel = _launcher.get_kernel(library, kernel_symbol(name))
        metadata = parse_kernel_metadata(_launcher.read_global(library, metadata_symbol(name), device), kernel=name)
        check_kernel_metadata(metadata, name=name, expected=expected)
        _allow_dynamic_smem(kernel, name=name, device=device, nbytes=metadata.smem_bytes)
        programmatic_launch, cluster_launch = _launch_features(device)
    except BaseException as error:
        if not isinstance(error, KernelMetadataError):
            error.add_note(f"while loading kernel {name} on device {device}")
        if not shared:  # (a library another kernel already uses stays)
            try:
                _launcher.unload_library(library)
            except Exception as unload_error:  # report, but keep the original error in front
                error.add_note(f"unloading its library failed too: {unload_error}")
        raise
    if not shared:  # (kept once a kernel of it loaded: the image's other kernels take it)
        with _libraries_guard:
            _libraries.setdefault(image_digest, library)
    return LoadedKernel(
        name=name,
        library=library,
        kernel=kernel,
        threads=metadata.threads,
        smem_bytes=metadata.smem_bytes,
        params_bytes=metadata.params_bytes,
        device=device,
        programmatic_launch=programmatic_launch,
        cluster_launch=cluster_launch,
    )


def _launch_features(device: int) -> tuple[bool, bool]:
    """(Programmatic Dependent Launch, thread-block clusters) for kernels on ``device``: both exist
    from sm_90 on (griddepcontrol; clusters), each has its setting, and only cuLaunchKernelEx
    takes a cluster shape."""
    pdl, clusters = env.pdl_enabled(), env.clusters_enabled()
    sm90 = (pdl or clusters) and (
        _launcher.device_attribute(device, _launcher.DeviceAttribute.COMPUTE_CAPABILITY_MAJOR) >= 9
    )
    return pdl and sm90, clusters and sm90 and _launcher.supports_programmatic_launch()


def _allow_dynamic_smem(kernel: int, *, name: str, device: int, nbytes: int) -> None:
    try:
        _launcher.set_max_dynamic_smem(kernel, device, nbytes)
    except Exception as error:
        try:
            limit = _launcher.device_attribute(device, _launcher.DeviceAttribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        except Exception:
            limit = "unknown"
        error.add_note(
            f"kernel {name} needs {nbytes} bytes of dynamic shared memory; device {device} lets a block opt in to "
            f"at most {limit} (minus the kernel's static shared memory): this kernel's tile does not fit this GPU"
        )
        raise


# ---- In-memory cache: (kernel name, device) -> LoadedKernel ----

_loaded: dict[tuple[str, int], LoadedKernel] = {}
_key_locks: dict[tuple[str, int], threading.Lock] = {}
_key_locks_guard = threading.Lock()


def get_loaded(name: str, device: int, loader: Callable[[], LoadedKernel]) -> LoadedKernel:
    """The kernel ``name`` loaded on ``device``, calling ``loader()`` only the first time.

    Thread-safe: concurrent callers for one key wait for a single ``loader()`` call, while other keys
    load in parallel. A loader that raises caches nothing (the next call tries again).
    """
    key = (name, device)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    with _key_locks_guard:
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:
        hit = _loaded.get(key)
        if hit is None:
            hit = loader()
            if not isinstance(hit, LoadedKernel) or hit.name != name or hit.device != device:
                raise TypeError(
                    f"the loader for kernel {name} on device {device} returned {hit!r}, "
                    "not a LoadedKernel for that kernel and device"
                )
            _loaded[key] = hit
    return hit


def clear_loaded_kernels() -> None:
    """Forget every cached LoadedKernel and loaded image (for tests). Libraries stay loaded: launches
    may still use them."""
    with _key_locks_guard:
        _loaded.clear()
        _key_locks.clear()
    with _libraries_guard:
        _libraries.clear()
