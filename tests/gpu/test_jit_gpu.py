"""The NVRTC fallback on a GPU: an NVRTC build of a catalog key computes bitwise what the nvcc build
in the catalog computes, and a tile outside the catalog is served by the JIT through the public op.
The NVRTC compile time is printed (run with -s to see it); tests never assert timing."""
from __future__ import annotations

import os
import time

import pytest
import torch

import humming_aot
from humming_aot import dispatch, heuristics, jit, kernels, ops
from humming_aot import obtain as kernel_obtain
from humming_aot.catalog import installed_catalog
from humming_aot.enumerate import parse_tile_field
from humming_aot.spec import KernelKey, MmaKind, ZeroPoint
from humming_aot.testing.jit import why_no_jit
from humming_aot.testing.numerics import assert_bitwise_equal, assert_gemm_close, reference_gemm


def _why_no_jit() -> str | None:
    """Why this run cannot exercise the NVRTC fallback (these tests then skip), or None."""
    return why_no_jit("this run tests the catalog alone, and these tests exercise the NVRTC fallback",
                      "for the JIT fallback these tests exercise")


_WHY_NO_JIT = _why_no_jit()
pytestmark = pytest.mark.skipif(_WHY_NO_JIT is not None, reason=_WHY_NO_JIT or "")

SMOKE_TILE = "16x128x64_w1x2_s4"
JIT_ONLY_TILE = "16x128x64_w1x2_s3"  # in no catalog
# (m, n, k, group (None = per channel), splits (None = the heuristic))
PROBLEMS = ((1, 4096, 4096, 128, None), (37, 448, 384, 32, 1), (129, 1344, 1152, None, 3), (16, 192, 256, 64, 2))


@pytest.fixture(autouse=True)
def _private_jit_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(tmp_path / "jit-cache"))
    monkeypatch.delenv("HUMMING_AOT_JIT", raising=False)
    monkeypatch.setattr(dispatch, "_selected", {})
    kernels.clear_loaded_kernels()
    yield
    kernels.clear_loaded_kernels()


def _seed() -> int:
    """A fresh seed for a torch.Generator, printed and named in every failure message."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _format(key: KernelKey, group: int | None) -> str:
    granularity = "channel" if group is None else f"g{group}"
    zp = ":zp" if key.spec.w_zero_point is ZeroPoint.INTEGER else ""
    return f"{key.spec.w_dtype}:{granularity}{zp}"


def _catalog_key(device: int, mma: MmaKind, scales_in_fp32: bool = False) -> KernelKey:
    """A catalog kernel of one body for this GPU whose K stages fit every problem of PROBLEMS: for
    mma.sync the smoke tile if the catalog has it, else the first such key of that body (K warps
    first: nvcc and NVRTC schedule their shared epilogue differently); with scales_in_fp32, the
    first key that applies its scales to fp32 sums (the swapped 8-row tile's integer kernels)."""
    catalog = installed_catalog()
    assert catalog is not None, "a GPU is present but no kernel catalog is installed: build one (tools/device_check.sh)"
    keys = [KernelKey.from_name(name) for arch in dispatch.device_info(device).arches for name in catalog.keys_for(arch)
            if name.startswith("gemm_dense_")]
    fitting = [key for key in keys if key.tile.mma is mma and key.scales_in_fp32 == scales_in_fp32
               and all(heuristics.tile_fits(key.tile, k, group or k) for _, _, k, group, _ in PROBLEMS)]
    if not fitting and mma.is_wgmma and dispatch.device_info(device).arches[0] != "sm90a":
        pytest.skip(f"wgmma kernels exist only for sm90a, not {dispatch.device_info(device).name}")
    if not fitting and scales_in_fp32 and dispatch.device_info(device).arches[0] != "sm90a":
        pytest.skip(f"the default tables put the fp32-scale 8-row tile in sm90a catalogs only, "
                    f"not for {dispatch.device_info(device).name}")
    assert fitting, (f"the installed catalog has no {mma.value} kernel (scales_in_fp32={scales_in_fp32}) for "
                     f"{dispatch.device_info(device).name}")
    smoke = [key for key in fitting if key.name.endswith(SMOKE_TILE) and "_a-bf16_w-s4-" in key.name]
    return (smoke or sorted(fitting, key=lambda key: (key.tile.warps_k == 1, key.name)))[0]


@pytest.mark.parametrize("mma,scales_in_fp32", [(MmaKind.MMA_SYNC, False), (MmaKind.MMA_SYNC, True),
                                                (MmaKind.WGMMA_WS, False)],
                         ids=["mma", "mma-scales-in-fp32", "wgmma-ws"])
def test_nvrtc_kernel_is_bitwise_equal_to_the_catalog_kernel(mma, scales_in_fp32):
    device = torch.cuda.current_device()
    key = _catalog_key(device, mma, scales_in_fp32)
    catalog = installed_catalog()
    aot = kernels.load_kernel_image(catalog.read_image(key.name), name=key.name, expected=catalog.lookup(key.name),
                                    device=device)
    start = time.monotonic()
    result = jit.obtain_cubin(key)  # bypasses the catalog: a cold compile into the private cache
    seconds = time.monotonic() - start
    assert result.compiled
    print(f"\nNVRTC compile of {key.name}: {seconds:.2f} s ({len(result.data)} bytes; "
          f"catalog build: {catalog.lookup(key.name).toolkit})")
    nvrtc_kernel = kernels.load_kernel_image(result.data, name=key.name, expected=jit.expected_metadata(key),
                                             device=device)
    assert (nvrtc_kernel.threads, nvrtc_kernel.smem_bytes) == (aot.threads, aot.smem_bytes)
    act = getattr(torch, key.spec.a_dtype)
    for m, n, k, group, splits in PROBLEMS:
        seed = _seed()
        gen = torch.Generator(device="cuda").manual_seed(seed)
        w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
        packed = humming_aot.pack(humming_aot.quantize(w, _format(key, group)), act_dtype=act)
        a = torch.randn(m, k, device="cuda", generator=gen).to(act)
        bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m % 2 else None
        outs = []
        for loaded in (aot, nvrtc_kernel):
            out = torch.full((m, n), float("nan"), dtype=act, device="cuda")
            outs.append(dispatch.launch_gemm(a, packed, bias, ops.gemm_spec(packed), tile=key.tile, out=out,
                                             splits=splits, kernel=(key, loaded)))
        torch.cuda.synchronize()
        assert_bitwise_equal(outs[1], outs[0], f"NVRTC vs catalog key={key.name} m={m} n={n} k={k} "
                                               f"group={group} splits={splits} seed={seed}")


def test_a_tile_outside_the_catalog_is_served_by_the_jit(tmp_path):
    device = torch.cuda.current_device()
    info = dispatch.device_info(device)
    weight_seed = _seed()
    w = torch.randn(448, 1024, device="cuda", generator=torch.Generator(device="cuda").manual_seed(weight_seed)) * 0.05
    packed = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)
    spec = ops.gemm_spec(packed)
    tile = parse_tile_field(JIT_ONLY_TILE)
    key = KernelKey(arch=kernel_obtain.jit_arch(spec, info), spec=spec, tile=tile)
    catalog = installed_catalog()
    in_catalog = [a for a in info.arches
                  if catalog is not None and catalog.lookup(KernelKey(arch=a, spec=spec, tile=tile).name)]
    assert not in_catalog, f"{JIT_ONLY_TILE} is in the installed catalog for {in_catalog}: pick another tile"
    w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
    for m in (1, 16, 77):
        seed = _seed()
        gen = torch.Generator(device="cuda").manual_seed(seed)
        a = torch.randn(m, 1024, device="cuda", generator=gen).to(torch.bfloat16)
        start = time.monotonic()
        out = ops.gemm_with_tile(a, packed, JIT_ONLY_TILE)
        torch.cuda.synchronize()
        if m == 1:
            print(f"\nfirst call of {key.name} (NVRTC compile + load + launch): {time.monotonic() - start:.2f} s")
        ref = reference_gemm(a, w_eff, None)
        assert_gemm_close(out, ref, a=a, w_eff=w_eff, context=f"JIT key={key.name} m={m} seed={seed} weight seed={weight_seed}")
    cubins = list((tmp_path / "jit-cache" / "kernels" / key.arch).glob(f"{key.name}-*.cubin"))
    assert len(cubins) == 1, f"{key.name} was not compiled into the JIT cache"
