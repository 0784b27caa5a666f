"""The launcher extension ``humming_aot._C`` and the non-Python files a wheel carries.

One definition, used by ``setup.py`` (``pip install``, ``setup.py build_ext --inplace``) and by the
wheel assembler (:func:`build_launcher_extension`). The extension needs only a C++17 compiler and
pybind11: no CUDA toolkit, no torch; it finds the driver (``libcuda.so.1``) at run time.

This module must stay importable by file path from ``setup.py``, before the package is installed:
it imports nothing from ``humming_aot``.
"""
from __future__ import annotations

from pathlib import Path

EXTENSION_NAME = "humming_aot._C"
LAUNCHER_SOURCE_DIR = Path("csrc") / "launcher"

# -g0: pybind11 debug info would add megabytes to every wheel; -fvisibility=hidden as pybind11 asks.
COMPILE_ARGS = ["-O2", "-std=c++17", "-fvisibility=hidden", "-g0", "-Wall", "-Wextra"]
LINK_ARGS = ["-ldl"]

_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def launcher_extension(source_root: Path | str = _SOURCE_ROOT):
    """The setuptools ``Extension`` for ``humming_aot._C``.

    ``source_root`` is the repository root; pass ``Path(".")`` from ``setup.py`` so that the source
    paths are relative, as setuptools wants them for sdists.
    """
    import pybind11
    from setuptools import Extension

    source_root = Path(source_root)
    launcher_dir = source_root / LAUNCHER_SOURCE_DIR
    sources = sorted(launcher_dir.glob("*.cpp"))
    if not sources:
        raise FileNotFoundError(
            f"no launcher sources (*.cpp) under {launcher_dir.resolve()}: building humming_aot._C needs a "
            "source checkout of humming_aot"
        )
    return Extension(
        EXTENSION_NAME,
        sources=[path.as_posix() for path in sources],
        depends=[path.as_posix() for path in sorted(launcher_dir.glob("*.h"))],
        include_dirs=[pybind11.get_include()],
        extra_compile_args=COMPILE_ARGS,
        extra_link_args=LINK_ARGS,
        language="c++",
    )


def package_data_files(source_root: Path | str = _SOURCE_ROOT) -> dict[str, Path]:
    """Non-Python files of the wheel: path inside the wheel -> file in the source tree.

    - ``csrc/include/humming_aot/**`` -> ``humming_aot/include/humming_aot/**`` (the headers NVRTC
      compiles against on the JIT path)
    - ``catalog/*.toml`` -> ``humming_aot/catalog_files/*.toml`` (read by ``humming_aot.catalog_data``)

    Prebuilt kernels (``humming_aot/_catalog/**``) already sit inside the package and are not listed.
    """
    source_root = Path(source_root)
    files: dict[str, Path] = {}
    include_dir = source_root / "csrc" / "include"
    for path in sorted((include_dir / "humming_aot").rglob("*")):
        if path.is_file():
            files[f"humming_aot/include/{path.relative_to(include_dir).as_posix()}"] = path
    for path in sorted((source_root / "catalog").glob("*.toml")):
        files[f"humming_aot/catalog_files/{path.name}"] = path
    return files


def build_launcher_extension(build_dir: Path, *, force: bool = False) -> Path:
    """Compile ``humming_aot._C`` for the running Python into ``build_dir``; return the ``.so`` path.

    The result is ``build_dir/humming_aot/_C<EXT_SUFFIX>`` (e.g. ``_C.cpython-311-x86_64-linux-gnu.so``);
    object files go to ``build_dir/temp``. An up-to-date build is reused unless ``force``.
    Raises ``FileNotFoundError`` outside a source checkout, ``ImportError`` without pybind11, and
    setuptools' ``CompileError`` / ``LinkError`` when the compiler fails.
    """
    try:
        import pybind11  # noqa: F401  (fail here with the reason rather than deep in setuptools)
    except ImportError as error:
        raise ImportError(
            "building humming_aot._C needs pybind11: `pip install pybind11` (or `pip install humming_aot[build]`)"
        ) from error
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    build_dir = Path(build_dir).resolve()
    extension = launcher_extension()
    distribution = Distribution({"name": "humming_aot", "ext_modules": [extension]})
    command = build_ext(distribution)
    command.build_lib = str(build_dir)
    command.build_temp = str(build_dir / "temp")
    command.inplace = False
    command.force = force
    command.ensure_finalized()
    command.run()
    built = Path(command.get_ext_fullpath(extension.name))
    if not built.is_file():
        raise FileNotFoundError(f"building {EXTENSION_NAME} reported success but {built} does not exist")
    return built
