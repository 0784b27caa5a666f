"""Helpers for the tests of tools/trace's instrumenting scripts (apply_trace.py, apply_ws_trace.py,
apply_ws16_trace.py): copy the tree, run a script on the copy, and compile one kernel against its
headers with nvcc."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def copy_tree(root: Path, into: Path, files: tuple[str, ...]) -> Path:
    """A copy of the tree at `root` for a script to instrument, under `into`: the named files and
    every header (csrc/include)."""
    copy = into / "copy"
    for name in files:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / name, copy / name)
    shutil.copytree(root / "csrc" / "include", copy / "csrc" / "include", dirs_exist_ok=True)
    return copy


def apply(script: Path, root: Path) -> subprocess.CompletedProcess:
    """Run an instrumenting script on `root` (a copy of the tree, or a checkout it must refuse)."""
    return subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True)


def compile_against(include: Path, key_name: str, workdir: Path) -> subprocess.CompletedProcess:
    """nvcc -cubin (sm90a) of the kernel `key_name` with the headers under `include`; the test
    fails when there is no nvcc (CI has nvcc 13.0)."""
    import pytest

    from humming_aot import codegen
    from humming_aot.aot import ninja as driver
    from humming_aot.spec import KernelKey

    try:
        nvcc = driver.find_nvcc()
    except driver.NvccNotFoundError:
        pytest.fail("nvcc not found: the CI machine has nvcc 13.0 (set HUMMING_AOT_NVCC)")
    source = workdir / "k.cu"
    source.write_text(codegen.kernel_source(KernelKey.from_name(key_name)))
    return subprocess.run([str(nvcc), "-cubin", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90a",
                           "-I", str(include), "-o", str(workdir / "k.cubin"), str(source)],
                          capture_output=True, text=True)
