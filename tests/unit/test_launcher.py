"""The launcher extension humming_aot._C on a machine without a GPU.

What runs here: the import needs no driver; every CUDA entry point raises the clear "no NVIDIA
driver" error instead of crashing; images are checked before they reach the driver; the driver-API
values and struct layouts declared in csrc/launcher agree with the toolkit's cuda.h. The GPU path is
covered by tests/gpu.
"""
from __future__ import annotations

import importlib.util
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import humming_aot
from humming_aot import _launcher

REPO_ROOT = Path(__file__).resolve().parents[2]
CUDA_HEADER = Path("/usr/local/cuda/include/cuda.h")
FATBIN_MAGIC = 0xBA55ED50


def _fatbin(payload: bytes = b"\0" * 16) -> bytes:
    """A well-formed fatbin header around `payload` (enough for the launcher's image check)."""
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(payload)) + payload


@pytest.fixture(scope="module")
def extension():
    """humming_aot._C: the in-place build if there is one, else one built now into a temp dir."""
    try:
        from humming_aot import _C
    except ImportError:
        _C = None
    if _C is not None:
        yield _C
        return
    if importlib.util.find_spec("pybind11") is None:
        pytest.skip("humming_aot._C is not built and pybind11 is missing, so it cannot be built here")
    from humming_aot.aot.extension import build_launcher_extension

    build_dir = Path(tempfile.mkdtemp(prefix="humming_aot_launcher_"))
    so_path = build_launcher_extension(build_dir)
    spec = importlib.util.spec_from_file_location("humming_aot._C", so_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["humming_aot._C"] = module
    yield module
    sys.modules.pop("humming_aot._C", None)
    _launcher._extension = None
    shutil.rmtree(build_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def no_driver(extension):
    if extension.driver_available():
        pytest.skip("an NVIDIA driver is present: the no-driver path is exercised on driverless CI machines")
    return extension


def test_import_needs_no_driver(extension):
    # A fresh interpreter: importing must not touch libcuda (it would raise or print here otherwise).
    code = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("humming_aot._C", {extension.__file__!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(type(module.driver_available()).__name__)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "bool"


def test_driver_available_is_a_bool(extension):
    available = extension.driver_available()
    assert isinstance(available, bool)
    reason = extension.driver_unavailable_reason()
    assert (reason == "") == available, reason


def test_exception_hierarchy(extension):
    assert issubclass(extension.CudaError, RuntimeError)
    assert issubclass(extension.DriverNotFoundError, extension.CudaError)
    assert extension.CudaError.__module__ == "humming_aot._C"
    assert extension.CudaError.code is None and extension.CudaError.error_name is None


def test_driver_is_reported_missing(no_driver):
    assert no_driver.driver_available() is False
    reason = no_driver.driver_unavailable_reason()
    assert "no NVIDIA driver was found" in reason
    assert "libcuda.so.1" in reason  # dlerror's text names the library it could not open


def test_programmatic_launch_is_unsupported_without_a_driver(no_driver, monkeypatch):
    assert no_driver.supports_programmatic_launch() is False  # a bool, not DriverNotFoundError
    monkeypatch.setattr(_launcher, "_extension", no_driver)
    assert _launcher.supports_programmatic_launch() is False


def test_programmatic_launch_needs_a_usable_driver(extension):
    supported = extension.supports_programmatic_launch()
    assert isinstance(supported, bool)
    assert not supported or extension.driver_available()


_DRIVER_CALLS = {
    "driver_version": lambda c: c.driver_version(),
    "load_library": lambda c: c.load_library(_fatbin(), "kernel gemm_test"),
    "unload_library": lambda c: c.unload_library(1),
    "get_kernel": lambda c: c.get_kernel(1, "gemm_test"),
    "read_global": lambda c: c.read_global(1, "gemm_test_metadata", 0),
    "set_max_dynamic_smem": lambda c: c.set_max_dynamic_smem(1, 0, 100_000),
    "kernel_attribute": lambda c: c.kernel_attribute(1, _launcher.FunctionAttribute.NUM_REGS, 0),
    "device_attribute": lambda c: c.device_attribute(0, _launcher.DeviceAttribute.MULTIPROCESSOR_COUNT),
    "max_active_clusters": lambda c: c.max_active_clusters(1, (128, 1, 1), 0, (1, 2, 1), 0),
    "alloc_zeroed_for_process": lambda c: c.alloc_zeroed_for_process(0, 4096),
    "launch": lambda c: c.launch(1, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 64, 0),
    "launch-programmatic": lambda c: c.launch(
        1, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 64, 0, programmatic_dependent_launch=True
    ),
}


@pytest.mark.parametrize("call", sorted(_DRIVER_CALLS), ids=str)
def test_every_driver_call_raises_driver_not_found(no_driver, call):
    with pytest.raises(no_driver.DriverNotFoundError, match="no NVIDIA driver was found") as caught:
        _DRIVER_CALLS[call](no_driver)
    assert isinstance(caught.value, RuntimeError)
    assert "libcuda.so.1" in str(caught.value)
    assert caught.value.code is None


def test_python_wrapper_reexports_the_extension(no_driver, monkeypatch):
    monkeypatch.setattr(_launcher, "_extension", no_driver)
    assert _launcher.CudaError is no_driver.CudaError
    assert _launcher.driver_available() is False
    with pytest.raises(_launcher.DriverNotFoundError, match="no NVIDIA driver"):
        _launcher.load_library(_fatbin(), "kernel gemm_test")
    with pytest.raises(_launcher.DriverNotFoundError, match="no NVIDIA driver"):
        _launcher.launch(1, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 64, 0, programmatic_dependent_launch=True)


def test_wrapper_says_how_to_build_a_missing_extension(monkeypatch):
    monkeypatch.setattr(_launcher, "_extension", None)
    # `from humming_aot import _C` fails when neither the package attribute nor the module is there.
    monkeypatch.delattr(humming_aot, "_C", raising=False)
    monkeypatch.setitem(sys.modules, "humming_aot._C", None)
    with pytest.raises(ImportError, match=r"pip install -e \.") as caught:
        _launcher.driver_available()
    assert "setup.py build_ext --inplace" in str(caught.value)


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        (b"", "neither a fatbin nor a cubin"),
        (b"// PTX text is not accepted\0", "neither a fatbin nor a cubin"),
        (_fatbin()[:-1], "truncated"),
        (struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, 1 << 40), "truncated"),
        (b"\x7fELF" + b"\0" * 10, "truncated"),
        (b"\x7fELF\x01\x01" + b"\0" * 58, "not a 64-bit little-endian cubin"),
    ],
    ids=["empty", "ptx", "short-fatbin", "huge-fatbin-size", "short-elf", "elf32"],
)
def test_bad_images_are_refused_before_the_driver(extension, image, problem):
    assert problem in extension.image_problem(image)
    with pytest.raises(ValueError, match=f"load_library\\(kernel gemm_test\\): .*{problem}"):
        extension.load_library(image, "kernel gemm_test")


def test_elf_sections_must_lie_inside_the_image(extension):
    # A 64-bit ELF header whose one section claims bytes beyond the end of the buffer.
    header = bytearray(64)
    header[0:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<QQ", header, 0x20, 0, 64)  # no program headers; section headers at 64
    struct.pack_into("<HHHH", header, 0x36, 56, 0, 64, 1)
    section = bytearray(64)
    struct.pack_into("<I", section, 0x04, 1)  # SHT_PROGBITS
    struct.pack_into("<QQ", section, 0x18, 100, 1000)
    image = bytes(header + section)
    assert "truncated" in extension.image_problem(image)
    struct.pack_into("<QQ", section, 0x18, 0, 128)
    assert extension.image_problem(bytes(header + section)) == ""


def test_images_from_nvcc_pass_the_check(extension, tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    source = tmp_path / "k.cu"
    source.write_text('extern "C" __global__ void k(int x) {}\n')
    for kind in ("fatbin", "cubin"):
        out = tmp_path / f"k.{kind}"
        subprocess.run([nvcc, f"-{kind}", "-arch=sm_80", str(source), "-o", str(out)], check=True)
        image = out.read_bytes()
        assert extension.image_problem(image) == ""
        assert extension.image_problem(memoryview(image)[: len(image) - 8]) != ""


def test_launch_refuses_null_kernel_and_empty_params(extension):
    with pytest.raises(ValueError, match="kernel handle is 0"):
        extension.launch(0, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 8, 0)
    with pytest.raises(ValueError, match="params is empty"):
        extension.launch(1, (1, 1, 1), (128, 1, 1), 0, 0, b"", 0)
    with pytest.raises(TypeError):
        extension.launch(1, (1, 1), (128, 1, 1), 0, 0, b"\0" * 8, 0)  # grid needs three dims


def test_launch_takes_programmatic_dependent_launch_by_keyword_only(extension):
    # The arguments are checked before the driver is needed, so this runs with or without one.
    with pytest.raises(ValueError, match="kernel handle is 0"):
        extension.launch(0, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 8, 0, programmatic_dependent_launch=True)
    with pytest.raises(ValueError, match="kernel handle is 0"):
        extension.launch(0, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 8, 0, programmatic_dependent_launch=False)
    with pytest.raises(TypeError):
        extension.launch(0, (1, 1, 1), (128, 1, 1), 0, 0, b"\0" * 8, 0, True)


def test_driver_api_values_match_cuda_h(tmp_path):
    """The types and enum values declared in csrc/launcher/cuda_driver.h equal the toolkit's."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if not CUDA_HEADER.is_file() or compiler is None:
        pytest.skip(f"needs {CUDA_HEADER} and a C++ compiler to compare against")
    names = {
        "CUresult": [
            "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_STUB_LIBRARY",
            "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INVALID_DEVICE", "CUDA_ERROR_NO_BINARY_FOR_GPU",
            "CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_NOT_FOUND",
        ],
        "CUdevice_attribute": [
            "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
        ],
        "CUfunction_attribute": [
            "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK", "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES",
            "CU_FUNC_ATTRIBUTE_NUM_REGS", "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
        ],
        "CUlaunchAttributeID": ["CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION"],
        "CUstream_flags": ["CU_STREAM_NON_BLOCKING"],
        "CUstreamCaptureMode": ["CU_STREAM_CAPTURE_MODE_RELAXED"],
    }
    checks = [f"static_assert((int)hcu::{n} == (int)::{n}, \"{n}\");" for group in names.values() for n in group]
    checks += [
        f"static_assert((int)::CU_FUNC_ATTRIBUTE_{member.name} == {int(member)}, \"{member.name}\");"
        for member in _launcher.FunctionAttribute
    ]
    checks += [
        f"static_assert((int)::CU_DEVICE_ATTRIBUTE_{member.name} == {int(member)}, \"{member.name}\");"
        for member in _launcher.DeviceAttribute
    ]
    for ours, theirs in [("CUdeviceptr", "CUdeviceptr"), ("CUdevice", "CUdevice"), ("CUresult", "CUresult"),
                         ("CUdevice_attribute", "CUdevice_attribute"), ("CUfunction_attribute", "CUfunction_attribute"),
                         ("CUcontext", "CUcontext"), ("CUstream", "CUstream"),
                         ("CUstreamCaptureMode", "CUstreamCaptureMode")]:
        checks.append(f"static_assert(sizeof(hcu::{ours}) == sizeof(::{theirs}), \"sizeof {ours}\");")
    # cuLaunchKernelEx reads these records by <cuda.h>'s layout: every member at the same offset and size.
    layouts = {
        "CUlaunchAttributeValue": ["programmaticStreamSerializationAllowed"],
        "CUlaunchAttribute": ["id", "value"],
        "CUlaunchConfig": ["gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
                           "sharedMemBytes", "hStream", "attrs", "numAttrs"],
    }
    for struct_name, members in layouts.items():
        for what in ("sizeof", "alignof"):
            checks.append(f"static_assert({what}(hcu::{struct_name}) == {what}(::{struct_name}), "
                          f"\"{what} {struct_name}\");")
        checks += [
            f"static_assert(offsetof(hcu::{struct_name}, {member}) == offsetof(::{struct_name}, {member}) && "
            f"sizeof(hcu::{struct_name}::{member}) == sizeof(::{struct_name}::{member}), \"{struct_name}::{member}\");"
            for member in members
        ]
    source = tmp_path / "abi_check.cpp"
    source.write_text(
        "#include <cuda.h>\n"
        f'#include "{REPO_ROOT / "csrc" / "launcher" / "cuda_driver.h"}"\n'
        "namespace hcu = humming_aot::launcher::cu;\n" + "\n".join(checks) + "\n"
    )
    result = subprocess.run(
        [compiler, "-std=c++17", "-fsyntax-only", f"-I{CUDA_HEADER.parent}", str(source)],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_build_launcher_extension_into_a_directory(tmp_path):
    if importlib.util.find_spec("pybind11") is None:
        pytest.skip("pybind11 is missing")
    from humming_aot.aot.extension import build_launcher_extension

    built = build_launcher_extension(tmp_path)
    assert built.is_file()
    assert built.parent == tmp_path / "humming_aot"
    assert built.name.startswith("_C.") and built.suffix == ".so"
    result = subprocess.run(
        [sys.executable, "-c",
         "import importlib.util, sys; "
         f"spec = importlib.util.spec_from_file_location('humming_aot._C', {str(built)!r}); "
         "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(m.driver_available())"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("True", "False")


@pytest.mark.parametrize("nbytes", [0, 6])
def test_zeroed_device_memory_refuses_a_size_that_is_not_whole_words(extension, nbytes):
    """alloc_zeroed_for_process checks its size before it needs a driver."""
    with pytest.raises(ValueError, match=f"bytes must be a positive multiple of 4, got {nbytes}"):
        extension.alloc_zeroed_for_process(0, nbytes)
