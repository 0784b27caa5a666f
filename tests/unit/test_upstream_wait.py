"""The params contract's programmatic-dependent-launch rule, in the SASS: from sm_90 on the launcher
may launch any GEMM kernel with programmatic stream serialization (humming_aot.kernels), so every
body must execute griddepcontrol.wait (SASS ACQBULK) before it reads what the previous kernel
of the stream writes (kernel/params.cuh, version 2). The quantization kernels and the GEMMs'
tails release their dependents early, so a body without the wait would read activations that are
still being written. One key of every (GEMM type, body) of the default catalog on sm90a and
sm120a, compiled with nvcc; the GPU tests of each body check the results."""
from __future__ import annotations

import io
import shutil
import subprocess

import pytest

from humming_aot.aot import ninja as driver
from humming_aot.enumerate import enumerate_keys
from humming_aot.testing.nvcc import needs_nvcc


def _one_key_per_body():
    """The first key (in the catalog's order) of each (GEMM type, arch, body) on the PDL archs."""
    chosen = {}
    for key in enumerate_keys("default", ["sm90a", "sm120a"]):
        chosen.setdefault((str(key.spec.gemm_type.value), key.arch, key.tile.body.kind), key)
    return chosen


def test_every_body_of_the_pdl_archs_is_covered():
    bodies = {(gemm, arch, body) for gemm, arch, body in _one_key_per_body()}
    # the bodies the GPU suite runs on sm_90 and the FP4 body of sm_120: none may drop out unseen
    for expected in [("dense", "sm90a", "wgmma-ws"), ("dense", "sm90a", "wgmma-ss"), ("dense", "sm90a", "wgmma-w4a8"),
                     ("dense", "sm90a", "mma-ss"), ("dense", "sm90a", "mma-w4a8"), ("dense", "sm90a", "mma"),
                     ("masked", "sm90a", "wgmma-ws"), ("dense", "sm120a", "mma-fp4")]:
        assert expected in bodies, expected


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump is not on PATH: the SASS cannot be read")
def test_every_body_waits_for_the_upstream_grid(tmp_path):
    keys = list(_one_key_per_body().values())
    # the W4A8 Hopper body at decode (kernel/dense_wgmma_w4a8.cuh): its producer's bulk L2
    # prefetches of the first weights come before its wait, so that they overlap the
    # quantization kernel in front
    decode_w4a8 = next(key for key in enumerate_keys("default", ["sm90a"])
                       if key.tile.body.kind == "wgmma-w4a8" and key.tile.block_m <= 16)
    result = driver.compile_keys(keys + [decode_w4a8], tmp_path, jobs=2, stream=io.StringIO())
    missing = []
    for key in keys + [decode_w4a8]:
        sass = subprocess.run(["cuobjdump", "-sass", "-fun", key.symbol, str(result.fatbins[key.name])], capture_output=True, text=True,
                              check=True).stdout
        if "ACQBULK" not in sass:
            missing.append(key.name)
        if key is decode_w4a8:
            lines = [line for line in sass.splitlines() if "UBLKPF.L2" in line or "ACQBULK" in line]
            assert any("UBLKPF.L2" in a and "ACQBULK" in b for a, b in zip(lines, lines[1:])), \
                f"{key.name}: no bulk L2 prefetch right before the producer's ACQBULK"
    assert not missing, f"no griddepcontrol.wait (ACQBULK) in: {missing}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump is not on PATH: the SASS cannot be read")
@pytest.mark.parametrize("unit", ["quant", "moe"])
def test_every_helper_kernel_waits_before_its_first_global_access(tmp_path, monkeypatch, unit):
    """cuda_quant and cuda_steps launch the quant and moe units' kernels with Programmatic Dependent
    Launch from sm_90 builds (HELPERS_VERSION 6 and 7), so each must execute griddepcontrol.wait
    (ACQBULK) before it touches global memory: no global load (LDG) or store (STG) above the wait in
    any of them (a store there could overwrite what the upstream kernel still reads)."""
    from humming_aot import helper_kernels, jit
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the unit is compiled by NVRTC", "to compile it")
    if why is not None:
        pytest.skip(why)
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(tmp_path))
    result = jit.cache.obtain(helper_kernels.compile_unit(unit, "sm90a"), include_dir=jit._include_dir(),
                              nvrtc_lib=jit.nvrtc.load_nvrtc())
    cubin = tmp_path / f"{unit}.cubin"
    cubin.write_bytes(result.data)
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    functions = {}
    name = None
    for line in sass.splitlines():
        if "Function :" in line:
            name = line.split("Function :")[1].strip()
            functions[name] = []
        elif name is not None and any(op in line for op in ("ACQBULK", "LDG", "STG")):
            functions[name].append("ACQBULK" if "ACQBULK" in line else "LDG/STG")
    assert set(functions) == set(helper_kernels.kernel_names(unit, "sm90a"))
    early = [f for f, ops in functions.items() if not ops or ops[0] != "ACQBULK"]
    assert not early, f"a global access before griddepcontrol.wait (or no wait) in: {early}"
