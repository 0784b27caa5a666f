"""compute-sanitizer memcheck and racecheck over one kernel of each tile kind (the catalog's, else the
JIT's), launched in a subprocess on a small problem (racecheck runs each kernel ~100x slower): the
8-row swapped tile with its split-K slices summed in a thread-block cluster and through the global
workspace, the 16-row and 32-row mma.sync tiles, and on sm90a the 16-token swapped tile (like the
8-row), the wgmma tile and the warp-specialized TMA wgmma tile (ragged M:
one row short of its tile, N = 320 a part tile), each split over K in two; synccheck too. And the
W8A8 body's kinds (wgmma-ss: a wave of CTAs walking tiles, stream-K, K slices). Any error or
hazard the tool reports fails the test, with the tool's report."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from humming_aot.spec import KernelKey, MmaKind

REPO = Path(__file__).resolve().parents[2]


def _find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else beside the nvcc the catalog builds with (the toolkit's bin/)."""
    on_path = shutil.which("compute-sanitizer")
    if on_path:
        return on_path
    from humming_aot.aot.ninja import NvccNotFoundError, find_nvcc

    try:
        beside = find_nvcc().resolve().parent / "compute-sanitizer"
    except NvccNotFoundError:
        return None
    return str(beside) if beside.is_file() else None


SANITIZER = _find_sanitizer()
# Weight dtypes to take a kernel of, in order of preference: the mxfp4 family in which racecheck
# once found hazards (issue 25), then int4.
PREFERRED_W = ("float4e2m1", "int4")

# The child: launch each (key name, M, N, K, cluster_reduction, stream_k) of argv[1] (JSON) once,
# then sync: in two K slices, or with stream_k CTAs (the wgmma-ws body's stream-K schedule and its
# fix-up) where that is not None.
CHILD = r"""
import json, sys, torch, humming_aot
from humming_aot import dispatch, ops
from humming_aot.spec import KernelKey, ZeroPoint

for name, m, n, k, cluster, stream_k in json.loads(sys.argv[1]):
    key = KernelKey.from_name(name)
    act = getattr(torch, key.spec.a_dtype)
    zp = {ZeroPoint.NONE: "", ZeroPoint.INTEGER: ":zp", ZeroPoint.FLOAT: ":zpf"}[key.spec.w_zero_point]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
    packed = humming_aot.pack(humming_aot.quantize(w, f"{key.spec.w_dtype}:g64{zp}"), act_dtype=act)
    a = torch.randn(m, k, device="cuda", generator=gen).to(act)
    bias = torch.randn(n, device="cuda", generator=gen).to(act)
    out = torch.full((m, n), float("nan"), dtype=act, device="cuda")
    schedule = {"stream_k": stream_k} if stream_k is not None else {"splits": 2, "cluster_reduction": cluster}
    dispatch.launch_gemm(a, packed, bias, ops.gemm_spec(packed), tile=key.tile, out=out, **schedule)
    torch.cuda.synchronize()
    assert not out.isnan().any(), name
    print("launched", name, f"stream-K over {stream_k}" if stream_k else "cluster" if cluster else "workspace",
          flush=True)
"""


def _kinds() -> dict[str, KernelKey] | None:
    """One key per tile kind on this GPU (None without a GPU or a catalog): the catalog's where it
    holds one, else the same spec with a tile of that kind, which the launch builds with the JIT
    (the sm90a table serves M <= 16 with the swapped tiles and larger M with wgmma-ws, so its
    catalog holds no 16- or 32-row CTA-pipeline tile and no plain wgmma one)."""
    if not torch.cuda.is_available():
        return None
    from humming_aot import dispatch, heuristics
    from humming_aot.catalog import installed_catalog
    from humming_aot.enumerate import parse_tile_field

    catalog = installed_catalog()
    if catalog is None:
        return None
    arch = dispatch.device_info(torch.cuda.current_device()).arches[0]
    keys = [KernelKey.from_name(name) for name in catalog.keys_for(arch) if name.startswith("gemm_dense_")]
    keys = [key for key in keys if key.spec.a_dtype == "bfloat16" and key.spec.w_dtype in PREFERRED_W]
    # the tiles the table picks for 4-bit codes at M = 1, 16, 32 and 64 first
    table = {heuristics.select_tile(arch, m, w_bits=4) for m in (1, 16, 32, 64)}
    keys.sort(key=lambda key: (PREFERRED_W.index(key.spec.w_dtype), key.tile not in table, key.name))
    if not keys:
        return None
    number = arch[2:].rstrip("af")
    mma_table = f"sm{number}" if arch.endswith("a") else arch  # the mma.sync table of the arch
    # kind -> (whether a tile is of it, the tile to take where the catalog holds none)
    kinds = {
        "8-row": (lambda t: t.mma is MmaKind.MMA_SYNC and t.block_m == 8, parse_tile_field("8x128x256_w1x2x4_s2")),
        "16-row": (lambda t: t.mma is MmaKind.MMA_SYNC and t.block_m == 16, heuristics.select_tile(mma_table, 16)),
        "32-row": (lambda t: t.mma is MmaKind.MMA_SYNC and t.block_m == 32, heuristics.select_tile(mma_table, 32)),
    }
    if arch == "sm90a":
        kinds |= {
            "16-swapped": (lambda t: t.mma is MmaKind.MMA_SWAPPED, parse_tile_field("mma-sw:16x64x256_w1x1x4_s2")),
            "wgmma": (lambda t: t.mma is MmaKind.WGMMA, parse_tile_field("wgmma:256x128x64_w1x8_s5")),
            "wgmma-ws": (lambda t: t.mma is MmaKind.WGMMA_WS and t.warps_n == 4,
                         parse_tile_field("wgmma-ws:128x128x64_w1x4_s4")),
            # two consumer warpgroups (their barrier, the staging tile's placement)
            "wgmma-ws-2wg": (lambda t: t.mma is MmaKind.WGMMA_WS and t.warps_n == 8,
                             parse_tile_field("wgmma-ws:128x128x64_w1x8_s6")),
        }
    chosen = {}
    for kind, (fits, fallback) in kinds.items():
        held = next((key for key in keys if fits(key.tile)), None)
        chosen[kind] = held or KernelKey(arch=arch, spec=keys[0].spec, tile=fallback)
    return chosen


def _launches(kinds: dict[str, KernelKey]) -> list[tuple[str, int, int, int, bool | None, int | None]]:
    """(name, M, N, K, cluster_reduction, stream_k): small problems, two K slices each; N = 320 leaves
    a part tile; the swapped kinds twice, their slices summed in a cluster (where they can) and in the
    workspace; the wgmma-ws kinds twice, the second time over 7 stream-K CTAs (ranges cut inside
    tiles, whose heads add the other CTAs' partials)."""
    launches = []
    for kind, key in kinds.items():
        k = 4 * key.tile.block_k
        m = min(key.tile.block_m, 64) - 1
        if kind in ("8-row", "16-swapped"):
            if key.reduces_splits_in_cluster and torch.cuda.get_device_capability()[0] >= 9:
                launches.append((key.name, m, 320, k, True, None))
            launches.append((key.name, m, 320, k, False, None))
        else:
            launches.append((key.name, m, 320, k, None, None))
        if key.tile.mma is MmaKind.WGMMA_WS:
            launches.append((key.name, m, 320, k, None, 7))
    return launches


def _count(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text)
    return None if found is None else int(found.group(1))


def _sanitize(tool: str, child: str, launches: list, what: list) -> None:
    """Run `child` over `launches` (JSON in argv[1]) under the tool; fail on anything it reports."""
    # only our kernels are instrumented (torch's run at full speed), and failing CUDA API calls of
    # torch's own probing are not ours to report
    command = [SANITIZER, "--tool", tool, "--kernel-name", "kns=gemm_dense", "--report-api-errors", "no",
               "--print-limit", "20", sys.executable, "-c", child, json.dumps(launches)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    report = result.stdout + result.stderr
    context = f"{' '.join(command[:-4])} over {what}:\n{report[-8000:]}"
    assert result.returncode == 0, context
    assert report.count("launched ") == len(launches), context
    errors = _count(r"ERROR SUMMARY: (\d+) error", report)
    hazards = _count(r"RACECHECK SUMMARY: (\d+) hazard", report)
    if tool == "racecheck" and hazards is not None:
        assert hazards == 0 and errors in (None, 0), context
    else:
        assert errors == 0, context  # the summary line is missing or counts errors


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_finds_nothing_in_one_kernel_of_each_tile_kind(tool):
    if SANITIZER is None:
        pytest.skip("compute-sanitizer is neither on PATH nor beside nvcc (it comes with the CUDA toolkit's bin/)")
    kinds = _kinds()
    assert kinds, "a GPU is present but no kernel catalog is installed: build one (tools/device_check.sh)"
    launches = _launches(kinds)
    _sanitize(tool, CHILD, launches, [(name, cluster, stream_k) for name, _, _, _, cluster, stream_k in launches])


# The W8A8 child: (tile, pairing, M, N, K, stream_k, persistent) per launch, NaN-poisoned outputs.
W8A8_CHILD = r"""
import json, sys, torch
from humming_aot import ops, quant, w4a8, w8a8

FORMATS = {"channel": ("float8e4m3:channel", "float8e4m3:token"), "blocks": ("float8e4m3:b128x128", "float8e4m3:g128"),
           "int8": ("int8:channel", "int8:token"), "w4a8": ("int4:g128", "float8e4m3:token")}
for tile, pairing, m, n, k, stream_k, persistent in json.loads(sys.argv[1]):
    fmt, act = FORMATS[pairing]
    module = w4a8 if pairing == "w4a8" else w8a8
    gen = torch.Generator().manual_seed(0)
    packed = module.pack(quant.quantize(torch.randn(n, k, generator=gen), fmt)).to("cuda")
    qa = ops.quantize_activation(torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16), act)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    module.gemm(qa, packed, out=out, tile=tile, stream_k=stream_k, persistent=persistent)
    torch.cuda.synchronize()
    assert not out.isnan().any(), tile
    print("launched", tile, flush=True)
"""

# 1100 x 2048 in 128 x 128 tiles: 144 tiles for 132 walking CTAs (the staging tile after the ring
# with the overlapped promotion; over it with block scales; int8's sums in one set); the decode
# tile under stream-K (float8 and int8); the 64-token tile's K slices summed in the workspace; the
# W4A8 body (the same roles, its codes made e4m3 in registers) walking, under stream-K, split.
W8A8_LAUNCHES = [
    ("wgmma-ss:128x128x128_w1x8_s5", "channel", 1100, 2048, 256, 0, True),
    ("wgmma-ss:128x128x128_w1x8_s6", "blocks", 1100, 2048, 256, 0, True),
    ("wgmma-ss:8x128x128_w1x4_s6", "channel", 5, 1024, 1024, None, None),
    ("wgmma-ss:64x128x128_w1x8_s6", "channel", 63, 320, 2048, 0, False),
    ("wgmma-ss:128x128x128_w1x8_s5", "int8", 1100, 2048, 256, 0, True),
    ("wgmma-ss:8x128x128_w1x4_s6", "int8", 5, 1024, 1024, 24, None),
    ("wgmma-w4a8:128x128x128_w1x8_s7", "w4a8", 1100, 2048, 256, 0, True),
    ("wgmma-w4a8:8x128x128_w1x4_s8", "w4a8", 5, 1024, 1024, 24, None),
    ("wgmma-w4a8:64x128x128_w1x8_s8", "w4a8", 63, 320, 2048, 0, False),
    # stream-K on the tiles whose staging tile lies after the ring (the fix-up beside the store)
    ("wgmma-ss:128x128x128_w1x8_s5", "channel", 300, 2048, 1024, 24, None),
    ("wgmma-w4a8:128x128x128_w1x8_s7", "w4a8", 300, 2048, 1024, 24, None),
]


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_finds_nothing_in_the_w8a8_body(tool):
    if SANITIZER is None:
        pytest.skip("compute-sanitizer is neither on PATH nor beside nvcc (it comes with the CUDA toolkit's bin/)")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the W8A8 kernels are sm90a ones")
    _sanitize(tool, W8A8_CHILD, W8A8_LAUNCHES, [launch[:2] for launch in W8A8_LAUNCHES])


# The FP4 W4A4 child: (tile, recipe, M, N, K) per launch through the emulated sm90a build (the
# staging, the scale tiles and the writer are the native kernel's), NaN-poisoned outputs.
FP4_CHILD = r"""
import json, sys, torch
from humming_aot import fp4, ops, quant

for tile, recipe, m, n, k in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(0)
    packed = fp4.pack(quant.quantize(torch.randn(n, k, generator=gen), recipe)).to("cuda")
    qa = ops.quantize_activation(torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16), recipe)
    out = torch.full((m, packed.n), float("nan"), dtype=torch.bfloat16, device="cuda")
    fp4.gemm(qa, packed, out=out, tile=tile, arch="sm90a")
    torch.cuda.synchronize()
    assert not out[:, :n].isnan().any(), tile
    print("launched", tile, recipe, "k slices", list(fp4._plans.values())[-1].splits, flush=True)
"""

# Each table tile once per recipe at ragged M, N and K: the 16- and 32-row tiles with 3 output
# tiles over 4096 of K (8 K slices reduced in the workspace), the 64-row tile at 100 x 330 x 992
# (K tiles past the codes' own, rows and columns past M and N zero-filled, 2 K slices).
FP4_LAUNCHES = [
    ("mma-fp4:16x128x128_w1x4_s4", "nvfp4", 5, 320, 4096),
    ("mma-fp4:32x128x128_w1x4_s4", "mxfp4", 27, 330, 4096),
    ("mma-fp4:64x128x128_w2x4_s3", "nvfp4", 100, 330, 992),
    ("mma-fp4:64x128x128_w2x4_s3", "mxfp4", 100, 330, 992),
]


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_finds_nothing_in_the_fp4_body(tool):
    if SANITIZER is None:
        pytest.skip("compute-sanitizer is neither on PATH nor beside nvcc (it comes with the CUDA toolkit's bin/)")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FP4 test build is an sm90a one (the native kernels need sm_120a / sm_121a)")
    _sanitize(tool, FP4_CHILD, FP4_LAUNCHES, [launch[:2] for launch in FP4_LAUNCHES])
