"""Kernel loading (humming_aot.kernels) against a fake launcher: metadata parsing, every mismatch
error, unloading on failure, and the in-memory cache. The real driver path is covered by tests/gpu."""
from __future__ import annotations

import dataclasses
import struct
import threading
import time

import pytest

from humming_aot import _launcher, codegen, kernels
from humming_aot.spec import KernelKey, kernel_symbol

NAME = "gemm_dense_sm80_mma_a-f16_w-s4-g128_o-f16_16x64x64_s4"
MANIFEST_ENTRY = {"file": f"{NAME}.fatbin", "sha256": "0" * 64, "threads": 128, "smem_bytes": 49_152}


def metadata_bytes(**overrides) -> bytes:
    fields = {
        "magic": kernels.KERNEL_METADATA_MAGIC,
        "params_version": codegen.PARAMS_VERSION,
        "params_bytes": 192,
        "threads": 128,
        "smem_bytes": 49_152,
        "block_m": 16,
        "block_n": 64,
        "block_k": 64,
        "name": NAME,
    } | overrides
    name = fields.pop("name")
    return struct.pack("<8I224s", *fields.values(), name.encode("ascii"))


class FakeLauncher:
    """Stands in for humming_aot._launcher: one 'library' per load, holding one kernel and its metadata."""

    def __init__(self, metadata: bytes, *, kernel_names=(kernel_symbol(NAME),), fail_on: str | None = None,
                 compute_capability_major: int = 8):
        self.metadata = metadata
        self.kernel_names = kernel_names
        self.fail_on = fail_on
        self.attributes = {
            _launcher.DeviceAttribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232_448,
            _launcher.DeviceAttribute.COMPUTE_CAPABILITY_MAJOR: compute_capability_major,
        }
        self.loaded: dict[int, bytes] = {}
        self.unloaded: list[int] = []
        self.smem_calls: list[tuple[int, int, int]] = []
        self.launches: list[tuple] = []
        self.clusters: list[tuple[int, int, int]] = []  # the cluster shape of each launch
        self.has_launch_ex = True  # what supports_programmatic_launch says (the driver has cuLaunchKernelEx)
        self._next = 0x1000

    def _maybe_fail(self, call: str) -> None:
        if self.fail_on == call:
            raise RuntimeError(f"{call}: CUDA_ERROR_FAKE (injected)")

    def load_library(self, image, what):
        self._maybe_fail("load_library")
        assert what == f"kernel {NAME}"
        self._next += 0x10
        self.loaded[self._next] = bytes(image)
        return self._next

    def unload_library(self, library):
        assert library in self.loaded
        self.unloaded.append(library)

    def get_kernel(self, library, name):
        self._maybe_fail("get_kernel")
        if name not in self.kernel_names:
            raise RuntimeError(f"cuLibraryGetKernel({name}): CUDA_ERROR_NOT_FOUND (named symbol not found)")
        return library + 1

    def read_global(self, library, name, device):
        self._maybe_fail("read_global")
        assert name in {f"{symbol}_metadata" for symbol in self.kernel_names}  # (each kernel's own)
        return self.metadata

    def set_max_dynamic_smem(self, kernel, device, nbytes):
        self._maybe_fail("set_max_dynamic_smem")
        self.smem_calls.append((kernel, device, nbytes))

    def device_attribute(self, device, attribute):
        return self.attributes[attribute]

    def launch(self, kernel, grid, block, smem, stream, params, device, *, programmatic_dependent_launch=False,
               cluster=(1, 1, 1)):
        self.launches.append((kernel, grid, block, smem, stream, params, device, programmatic_dependent_launch))
        self.clusters.append(cluster)

    def supports_programmatic_launch(self) -> bool:
        return self.has_launch_ex

    def install(self, monkeypatch) -> FakeLauncher:
        for name in ("load_library", "unload_library", "get_kernel", "read_global", "set_max_dynamic_smem",
                     "device_attribute", "launch", "supports_programmatic_launch"):
            monkeypatch.setattr(_launcher, name, getattr(self, name))
        return self


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.delenv("HUMMING_AOT_PDL", raising=False)  # the default, whatever the caller's shell says
    monkeypatch.delenv("HUMMING_AOT_CLUSTERS", raising=False)
    kernels.clear_loaded_kernels()
    yield
    kernels.clear_loaded_kernels()


def load(expected=MANIFEST_ENTRY, device: int = 0) -> kernels.LoadedKernel:
    return kernels.load_kernel_image(b"image bytes", name=NAME, expected=expected, device=device)


# ---- Metadata layout ----

def test_metadata_is_256_bytes():
    assert kernels.KERNEL_METADATA_BYTES == 256
    assert struct.pack("<I", kernels.KERNEL_METADATA_MAGIC) == b"HAOT"


def test_parse_round_trip():
    metadata = kernels.parse_kernel_metadata(metadata_bytes(), kernel=NAME)
    assert metadata == kernels.KernelMetadata(
        magic=kernels.KERNEL_METADATA_MAGIC, params_version=codegen.PARAMS_VERSION, params_bytes=192,
        threads=128, smem_bytes=49_152, block_m=16, block_n=64, block_k=64, name=NAME,
    )


def test_parse_name_of_full_length():
    long_name = "k" * 223  # the longest name that still has its NUL terminator
    assert kernels.parse_kernel_metadata(metadata_bytes(name=long_name), kernel=long_name).name == long_name


@pytest.mark.parametrize("size", [0, 255, 257, 512])
def test_parse_refuses_wrong_size(size):
    with pytest.raises(kernels.KernelMetadataError, match=f"{NAME}: {kernel_symbol(NAME)}_metadata is {size} bytes") as caught:
        kernels.parse_kernel_metadata(b"\0" * size, kernel=NAME)
    assert (caught.value.field, caught.value.found, caught.value.expected) == ("size", size, 256)


def test_parse_keeps_a_non_ascii_name_visible():
    raw = metadata_bytes()[:32] + b"\xff\xfe" + b"\0" * 222
    metadata = kernels.parse_kernel_metadata(raw, kernel=NAME)
    assert metadata.name == repr(b"\xff\xfe")


# ---- load_kernel_image ----

def test_load_returns_a_prepared_kernel(monkeypatch):
    fake = FakeLauncher(metadata_bytes()).install(monkeypatch)
    loaded = load(device=1)
    library = next(iter(fake.loaded))
    assert loaded == kernels.LoadedKernel(
        name=NAME, library=library, kernel=library + 1, threads=128, smem_bytes=49_152, params_bytes=192, device=1
    )
    assert fake.smem_calls == [(library + 1, 1, 49_152)]
    assert fake.unloaded == []


def test_manifest_may_pin_params_bytes_and_tile(monkeypatch):
    FakeLauncher(metadata_bytes()).install(monkeypatch)
    entry = MANIFEST_ENTRY | {"params_bytes": 192, "block_m": 16, "block_n": 64, "block_k": 64}
    assert load(expected=entry).params_bytes == 192


MISMATCHES = {
    # case id: (metadata override, manifest override, field, found, expected, words in the message)
    "magic": ({"magic": 0xDEADBEEF}, {}, "magic", 0xDEADBEEF, kernels.KERNEL_METADATA_MAGIC, "0xdeadbeef"),
    "name": ({"name": "gemm_other"}, {}, "name", "gemm_other", NAME, "'gemm_other'"),
    "params_version": (
        {"params_version": codegen.PARAMS_VERSION + 1}, {}, "params_version",
        codegen.PARAMS_VERSION + 1, codegen.PARAMS_VERSION, "GemmParams version",
    ),
    "threads": ({"threads": 256}, {}, "threads", 256, 128, "'threads' is 256 in the image but 128"),
    "smem_bytes": ({"smem_bytes": 1024}, {}, "smem_bytes", 1024, 49_152, "'smem_bytes' is 1024"),
    "params_bytes": ({}, {"params_bytes": 200}, "params_bytes", 192, 200, "'params_bytes' is 192"),
    "block_n": ({}, {"block_n": 128}, "block_n", 64, 128, "'block_n' is 64"),
}


@pytest.mark.parametrize("case", sorted(MISMATCHES), ids=str)
def test_every_mismatch_is_named(monkeypatch, case):
    metadata_override, manifest_override, field, found, expected, words = MISMATCHES[case]
    fake = FakeLauncher(metadata_bytes(**metadata_override)).install(monkeypatch)
    with pytest.raises(kernels.KernelMetadataError) as caught:
        load(expected=MANIFEST_ENTRY | manifest_override)
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.kernel, error.field, error.found, error.expected) == (NAME, field, found, expected)
    message = str(error)
    assert message.startswith(f"kernel {NAME}: ")
    assert words in message
    assert "humming-aot build" in message  # says what to do
    assert fake.unloaded == list(fake.loaded)  # the library did not leak
    assert fake.smem_calls == []


def test_manifest_entry_may_be_an_object(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Entry:  # like humming_aot.catalog.CatalogEntry
        threads: int
        smem_bytes: int

    FakeLauncher(metadata_bytes()).install(monkeypatch)
    assert load(expected=Entry(threads=128, smem_bytes=49_152)).threads == 128
    with pytest.raises(kernels.KernelMetadataError, match="'smem_bytes' is 49152 in the image but 0"):
        load(expected=Entry(threads=128, smem_bytes=0))


@pytest.mark.parametrize("missing", ["threads", "smem_bytes"])
def test_manifest_entry_without_a_required_field(monkeypatch, missing):
    fake = FakeLauncher(metadata_bytes()).install(monkeypatch)
    entry = {k: v for k, v in MANIFEST_ENTRY.items() if k != missing}
    with pytest.raises(kernels.KernelMetadataError, match=f"manifest entry has no '{missing}'") as caught:
        load(expected=entry)
    assert caught.value.field == missing
    assert fake.unloaded == list(fake.loaded)


@pytest.mark.parametrize("call", ["get_kernel", "read_global", "set_max_dynamic_smem"])
def test_driver_failure_unloads_and_names_the_kernel(monkeypatch, call):
    fake = FakeLauncher(metadata_bytes(), fail_on=call).install(monkeypatch)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_FAKE") as caught:
        load(device=2)
    notes = "\n".join(caught.value.__notes__)
    assert f"while loading kernel {NAME} on device 2" in notes
    assert fake.unloaded == list(fake.loaded)


def test_smem_failure_reports_the_device_limit(monkeypatch):
    FakeLauncher(metadata_bytes(), fail_on="set_max_dynamic_smem").install(monkeypatch)
    with pytest.raises(RuntimeError) as caught:
        load()
    assert "needs 49152 bytes of dynamic shared memory; device 0 lets a block opt in to at most 232448" in "\n".join(
        caught.value.__notes__
    )


def test_load_failure_leaves_nothing_to_unload(monkeypatch):
    fake = FakeLauncher(metadata_bytes(), fail_on="load_library").install(monkeypatch)
    with pytest.raises(RuntimeError, match="load_library"):
        load()
    assert fake.unloaded == []


def test_missing_kernel_symbol(monkeypatch):
    fake = FakeLauncher(metadata_bytes(), kernel_names=("something_else",)).install(monkeypatch)
    with pytest.raises(RuntimeError, match=rf"cuLibraryGetKernel\({kernel_symbol(NAME)}\): CUDA_ERROR_NOT_FOUND"):
        load()
    assert fake.unloaded == list(fake.loaded)


class UnitFake(FakeLauncher):
    """One image holding two kernels, each with its own metadata (a catalog build unit)."""

    def __init__(self, names):
        super().__init__(b"", kernel_names=tuple(kernel_symbol(n) for n in names))
        self.metadata_of = {f"{kernel_symbol(n)}_metadata": metadata_bytes(name=n) for n in names}

    def load_library(self, image, what):
        self._next += 0x10
        self.loaded[self._next] = bytes(image)
        return self._next

    def read_global(self, library, name, device):
        return self.metadata_of[name]


def test_kernels_of_one_image_share_its_library(monkeypatch):
    other = NAME.replace("16x64x64", "32x64x64")
    fake = UnitFake([NAME, other]).install(monkeypatch)
    first = kernels.load_kernel_image(b"unit", name=NAME, expected=MANIFEST_ENTRY, device=0)
    second = kernels.load_kernel_image(b"unit", name=other, expected=MANIFEST_ENTRY, device=1)
    assert first.library == second.library and list(fake.loaded) == [first.library]
    assert (first.kernel, second.kernel) == (first.library + 1, first.library + 1)  # (the fake's one handle)
    # a kernel that fails to load leaves the shared library loaded; another image gets its own
    with pytest.raises(kernels.KernelMetadataError):
        kernels.load_kernel_image(b"unit", name=other, expected=MANIFEST_ENTRY | {"threads": 64}, device=0)
    assert fake.unloaded == []
    third = kernels.load_kernel_image(b"another unit", name=NAME, expected=MANIFEST_ENTRY, device=0)
    assert third.library != first.library and len(fake.loaded) == 2
    # an image whose only kernel failed is unloaded, and loaded afresh next time
    with pytest.raises(kernels.KernelMetadataError):
        kernels.load_kernel_image(b"third unit", name=NAME, expected=MANIFEST_ENTRY | {"threads": 64}, device=0)
    assert fake.unloaded == [max(fake.loaded)]
    fourth = kernels.load_kernel_image(b"third unit", name=NAME, expected=MANIFEST_ENTRY, device=0)
    assert fourth.library not in fake.unloaded and len(fake.loaded) == 4
    # a caller that knows the image's sha256 (the catalog's manifest) names it: no hashing
    fifth = kernels.load_kernel_image(b"fourth unit", name=NAME, expected=MANIFEST_ENTRY, device=0,
                                      image_digest="f" * 64)
    sixth = kernels.load_kernel_image(b"fourth unit", name=other, expected=MANIFEST_ENTRY, device=0,
                                      image_digest="f" * 64)
    assert fifth.library == sixth.library and len(fake.loaded) == 5
    # a reader of the image (the catalog's file) is called only for the image's first kernel
    reads = []

    def reader():
        reads.append(1)
        return b"fifth unit"

    seventh = kernels.load_kernel_image(reader, name=NAME, expected=MANIFEST_ENTRY, device=0, image_digest="e" * 64)
    eighth = kernels.load_kernel_image(reader, name=other, expected=MANIFEST_ENTRY, device=1, image_digest="e" * 64)
    assert seventh.library == eighth.library and reads == [1] and fake.loaded[seventh.library] == b"fifth unit"
    # without a digest the reader is called to hash the image
    ninth = kernels.load_kernel_image(reader, name=NAME, expected=MANIFEST_ENTRY, device=0)
    assert ninth.library != seventh.library and len(reads) == 2


# ---- LoadedKernel.launch ----

def test_launch_passes_the_kernel_configuration(monkeypatch):
    fake = FakeLauncher(metadata_bytes()).install(monkeypatch)
    loaded = load(device=3)
    params = bytes(192)
    loaded.launch((7, 2, 1), 0xABC, params)
    assert fake.launches == [(loaded.kernel, (7, 2, 1), (128, 1, 1), 49_152, 0xABC, params, 3, False)]


@pytest.mark.parametrize(
    ("major", "setting", "programmatic"),
    [(8, None, False), (9, None, True), (10, None, True), (9, "1", True), (9, "on", True), (9, "0", False),
     (9, "off", False), (9, "FALSE", False), (8, "1", False)],
    ids=str,
)
def test_programmatic_launch_needs_sm90_and_the_setting(monkeypatch, major, setting, programmatic):
    fake = FakeLauncher(metadata_bytes(), compute_capability_major=major).install(monkeypatch)
    if setting is not None:
        monkeypatch.setenv("HUMMING_AOT_PDL", setting)
    loaded = load()
    assert loaded.programmatic_launch is programmatic
    loaded.launch((1, 1, 1), 0, bytes(192))
    assert fake.launches[-1][-1] is programmatic  # passed as programmatic_dependent_launch


@pytest.mark.parametrize(
    ("major", "launch_ex", "setting", "clusters"),
    [(8, True, None, False), (9, True, None, True), (12, True, None, True), (9, False, None, False),
     (9, True, "0", False), (9, True, "on", True), (8, True, "1", False)],
    ids=str,
)
def test_cluster_launch_needs_sm90_launch_ex_and_the_setting(monkeypatch, major, launch_ex, setting, clusters):
    fake = FakeLauncher(metadata_bytes(), compute_capability_major=major).install(monkeypatch)
    fake.has_launch_ex = launch_ex
    if setting is not None:
        monkeypatch.setenv("HUMMING_AOT_CLUSTERS", setting)
    loaded = load()
    assert loaded.cluster_launch is clusters
    loaded.launch((4, 2, 1), 0, bytes(192))
    assert fake.clusters[-1] == (1, 1, 1)  # no cluster unless asked
    if clusters:
        loaded.launch((4, 2, 1), 0, bytes(192), cluster=(1, 2, 1))
        assert fake.clusters[-1] == (1, 2, 1)
    else:
        with pytest.raises(ValueError, match=f"kernel {NAME}: cluster \\(1, 2, 1\\) asked on device 0, which cannot "
                                             "launch thread-block clusters"):
            loaded.launch((4, 2, 1), 0, bytes(192), cluster=(1, 2, 1))
        assert len(fake.launches) == 1


@pytest.mark.parametrize(("variable", "value"), [("HUMMING_AOT_PDL", "maybe"), ("HUMMING_AOT_CLUSTERS", "sometimes")])
def test_a_bad_launch_setting_fails_the_load(monkeypatch, variable, value):
    fake = FakeLauncher(metadata_bytes(), compute_capability_major=9).install(monkeypatch)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=f"{variable}={value!r} is not one of 0/false/off or 1/true/on"):
        load()
    assert fake.unloaded == list(fake.loaded)


def test_launch_refuses_params_of_the_wrong_size(monkeypatch):
    fake = FakeLauncher(metadata_bytes()).install(monkeypatch)
    loaded = load()
    with pytest.raises(ValueError, match=f"kernel {NAME}: params are 190 bytes but the kernel takes 192"):
        loaded.launch((1, 1, 1), 0, bytes(190))
    assert fake.launches == []


def test_launch_failure_names_the_kernel(monkeypatch):
    FakeLauncher(metadata_bytes()).install(monkeypatch)
    loaded = load()

    def failing_launch(*args, **kwargs):
        raise RuntimeError("cuLaunchKernel(grid (1, 1, 1), ...): CUDA_ERROR_INVALID_VALUE (invalid argument)")

    monkeypatch.setattr(_launcher, "launch", failing_launch)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_VALUE") as caught:
        loaded.launch((1, 1, 1), 0, bytes(192))
    assert f"launching kernel {NAME} on device 0" in caught.value.__notes__


# ---- get_loaded cache ----

def _loaded(name: str = NAME, device: int = 0) -> kernels.LoadedKernel:
    return kernels.LoadedKernel(
        name=name, library=1, kernel=2, threads=128, smem_bytes=0, params_bytes=192, device=device
    )


def test_cache_calls_the_loader_once_per_name_and_device():
    calls = []

    def loader_for(device):
        def loader():
            calls.append(device)
            return _loaded(device=device)
        return loader

    first = kernels.get_loaded(NAME, 0, loader_for(0))
    assert kernels.get_loaded(NAME, 0, loader_for(0)) is first
    other_device = kernels.get_loaded(NAME, 1, loader_for(1))
    assert other_device is not first and other_device.device == 1
    assert calls == [0, 1]


def test_cache_is_thread_safe():
    calls = []
    start = threading.Barrier(8)

    def loader():
        calls.append(1)
        time.sleep(0.05)  # widen the window in which other threads would call it again
        return _loaded()

    results = []

    def worker():
        start.wait()
        results.append(kernels.get_loaded(NAME, 0, loader))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(results) == 8 and all(result is results[0] for result in results)


def test_cache_does_not_keep_failures():
    def failing():
        raise RuntimeError("no binary for this GPU")

    with pytest.raises(RuntimeError, match="no binary"):
        kernels.get_loaded(NAME, 0, failing)
    assert kernels.get_loaded(NAME, 0, _loaded).name == NAME


def test_cache_refuses_a_loader_for_another_kernel():
    with pytest.raises(TypeError, match="not a LoadedKernel for that kernel and device"):
        kernels.get_loaded(NAME, 0, lambda: _loaded(name="gemm_other"))
    with pytest.raises(TypeError, match="not a LoadedKernel"):
        kernels.get_loaded(NAME, 0, lambda: _loaded(device=1))


def test_tma_body_takes_the_tensor_map_params():
    from humming_aot import codegen, dispatch

    ws = KernelKey.from_name("gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_256x128x64_w1x8_s5")
    old = KernelKey.from_name("gemm_dense_sm90a_wgmma_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x8_s4")
    assert codegen.params_type(ws) == "TmaGemmParams" and codegen.params_type(old) == "GemmParams"
    source = codegen.kernel_source(ws)
    assert "const __grid_constant__ humming_aot::kernel::TmaGemmParams params" in source
    assert "sizeof(humming_aot::kernel::TmaGemmParams)" in source
    # GemmParams, the schedule's two ints, zero padding to byte 128, then the 128-byte map (kernel/params.cuh)
    assert dispatch._PARAMS.size + dispatch._TMA_SCHEDULE.size + len(dispatch._TMA_PADDING) == 128
    assert dispatch._TMA_PARAMS_BYTES == 256
