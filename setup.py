"""Builds humming_aot: the launcher extension humming_aot._C, plus the CUDA headers and catalog data.

Metadata lives in pyproject.toml. This file adds what setuptools cannot say declaratively:
- the pybind11 extension (defined once in humming_aot/aot/extension.py),
- a build_py that copies csrc/include/humming_aot/** to humming_aot/include/humming_aot/** and
  catalog/*.toml to humming_aot/catalog_files/*.toml in the build tree (never in the source tree),
- prebuilt kernels under humming_aot/_catalog/** (manifest.json, fatbins) when present,
- the dependencies and extras (humming_aot[sm90a], humming_aot[all], ...: humming_aot/distribution.py).

`pip install -e .` and `python setup.py build_ext --inplace` both work; an editable install reads
the headers and catalog data from the checkout instead of copies.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _load_module(relative: str):
    # By file path, so that building does not execute humming_aot/__init__.py.
    name = Path(relative).stem
    path = ROOT / "humming_aot" / relative
    spec = importlib.util.spec_from_file_location(f"_humming_aot_build_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_extension = _load_module("aot/extension.py")
_distribution = _load_module("distribution.py")
_VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "humming_aot" / "_version.py").read_text()).group(1)


class BuildPyWithData(build_py):
    """build_py that also places the CUDA headers and the catalog data inside the package."""

    # Regenerated on every build: a header or kernel deleted from the source must not survive in a
    # build/ directory that pip reuses.
    _GENERATED_DIRS = ("humming_aot/include", "humming_aot/catalog_files", "humming_aot/_catalog")

    def run(self):
        for generated in self._GENERATED_DIRS:
            shutil.rmtree(Path(self.build_lib) / generated, ignore_errors=True)
        super().run()
        if self.editable_mode:
            return  # the editable package finds csrc/include and catalog/ in the checkout
        for destination, source in self._data_files().items():
            target = Path(self.build_lib) / destination
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs += [str(Path(self.build_lib) / destination) for destination in self._data_files()]
        return outputs

    @staticmethod
    def _data_files() -> dict[str, Path]:
        return _extension.package_data_files(ROOT)


setup(
    ext_modules=[_extension.launcher_extension(Path(os.path.relpath(ROOT)))],  # relative, as sdists need
    cmdclass={"build_py": BuildPyWithData},
    package_data={"humming_aot": ["_catalog/**/*"]},
    zip_safe=False,
    install_requires=_distribution.INSTALL_REQUIRES,
    extras_require=_distribution.core_extras(_VERSION, _distribution.default_catalog_archs(ROOT)),
)
