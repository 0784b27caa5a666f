#!/usr/bin/env bash
# The one script run on the GPU box (H200): build in place, run the GPU tests, benchmark.
#
#   tools/device_check.sh OUTDIR
#   DEVICE_STEPS=catalog,tests tools/device_check.sh OUTDIR      # only some steps
#
# Steps (DEVICE_STEPS, comma list, default all but tune, w8a8, moe, moelayer, moesteps, moeprof and ab, in this order):
#   env       nvidia-smi, python / torch / nvcc versions            -> summary.txt (top)
#   wheels    install carried wheels from ./.whl/ into /tmp/site    -> build.log (fails without one:
#             the benchmarks' Humming columns need humming-kernels)
#   launcher  python3 setup.py build_ext --inplace -j 16            -> build.log
#   catalog   python3 -m humming_aot build --arch sm90a --inplace   -> build.log (timed); kept, not
#             rebuilt, when this box built the same catalog from the same sources in an earlier call
#             (a warm box: the build outputs stay between calls; humming_aot/_catalog/.device_check_stamp),
#             or unpacked from a catalog wheel carried in .whl/catalog/ whose stamp matches this tree
#             (tools/device_catalog.sh builds it on the CPU machine: a fresh box then skips the build)
#   tests     pytest tests -m gpu (every gpu-marked test, tests/unit's too) -> tests.log, tests.xml;
#             DEVICE_TEST_PART=I/N runs the I-th of N equal contiguous slices of them (pytest --part,
#             tests/conftest.py): the whole suite (launcher ~20 s, dense catalog ~160 s, tests ~750-900 s
#             on an H100, log sections 85-86) does not fit one 600 s call, nor two: run it as
#             DEVICE_TEST_PART=1/3, then 2/3 and 3/3 on the warm box (the catalog is kept)
#   tune      tools/bench/tune_tiles.py (extra args: $TUNE_ARGS)   -> bench.log, tune.json
#   bench     tools/bench/bench_gemm.py (extra args: $BENCH_ARGS)  -> bench.log, bench.json
#   cold      tools/bench/cold_start.py (extra args: $COLD_ARGS)   -> bench.log, cold_start.json
#   eager     tools/bench/eager_overhead.py ($EAGER_ARGS): eager per-call cost vs F.linear and vs a
#             CUDA graph                                            -> bench.log, eager.json
#   w8a8      tools/bench/bench_w8a8.py (extra args: $W8A8_ARGS, e.g. --blocks): the W8A8 float8 GEMM
#             vs cuBLAS torch._scaled_mm and Humming's W8A8     -> bench.log, w8a8.json
#   moe       tools/bench/bench_moe.py (extra args: $MOE_ARGS): MoE expert GEMMs vs Humming and
#             torch._grouped_mm                                     -> bench.log, moe.json
#   moesteps  tools/bench/bench_moe_steps.py ($MOESTEPS_ARGS): the steps around the MoE GEMMs, helper
#             kernels against torch operations                      -> bench.log, moe_steps.json
#   moelayer  tools/bench/bench_moe_layer.py ($MOELAYER_ARGS): one QuantizedMoE layer end to end on
#             the grouped kernels, each step's share                -> bench.log, moe_layer.json
#   moeprof   ncu (clocks left alone) on tools/bench/profile_moe.py ($MOEPROF_ARGS: one bench_moe
#             point, ours or --impl humming): speed of light, occupancy, warp states, scheduler
#             and instruction statistics of its kernels, as CSV (MOEPROF_RAW=1: every metric of
#             ncu's full set, the stall reasons among them, one row per kernel; MOEPROF_SOURCE=1:
#             each SASS instruction's executed count and stall samples, summed up into bench.log
#             by tools/bench/ncu_source_summary.py; MOEPROF_COUNTERS=1: launch, DRAM, instruction and
#             stall counters per kernel, side by side in bench.log by tools/bench/ncu_counters.py)
#                                                                  -> bench.log, moe_profile.csv
#   ab        the base tree in $AB_BASE (default .ab/base; tools/ab_base.sh REV [DIR]) built with the same catalog
#             (AB_CARRIED_CATALOG=1: each tree keeps the humming_aot/_catalog built here and carried, which
#             saves the box's nvcc time), then $AB_TOOL (default tools/bench/bench_gemm.py; or bench_moe.py,
#             bench_w8a8.py, bench_w4a8.py) with $AB_ARGS from each tree in turns, $AB_ROUNDS (2) rounds
#             -> bench.log (the side-by-side table of tools/bench/ab_compare.py), ab.json
# Other knobs: HUMMING_AOT_DEVICE_CATALOG (default "dense": the default catalog without its MoE
# GEMMs, whose build would take the suite past one 600 s call; the MoE tests JIT their kernels;
# a comma list such as "dense,moe" builds the catalogs' families together), DEVICE_BUILD_ARGS (extra
# `humming_aot build` arguments, e.g. "--fatbin-compression size"), DEVICE_ARCH (default sm90a),
# DEVICE_JOBS (default 16), PYTEST_ARGS (extra pytest arguments). The *_ARGS values are split
# with shell quoting rules: PYTEST_ARGS="-k 'not fuzz'" passes -k and "not fuzz".
#
# A failing step does not stop the next; each step's exit code and duration go to summary.txt
# as soon as it ends (so a run cut short still says how far it got). At most 8 files are written
# to OUTDIR, as many as the device tool brings back: summary.txt build.log tests.log tests.xml
# bench.log (the tune, bench, cold, eager, moe, moesteps, moelayer, moeprof and ab steps) bench.json
# cold_start.json eager.json with the default steps; tune.json, moe.json, moe_layer.json,
# moe_steps.json, moe_profile.csv and ab.json come on top (tune, moe, moesteps, moelayer, moeprof and ab are not in the
# default list: a call that runs one should leave out a default step whose file it does not need). The tune
# step only makes sense with a catalog of tile variants
# (HUMMING_AOT_DEVICE_CATALOG=catalog/tuning_sm90a.toml).
# Nothing is written outside the repository and /tmp.
set -uo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
OUTDIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
# shellcheck source=tools/device_lib.sh
source tools/device_lib.sh

ALL_STEPS=env,wheels,launcher,catalog,tests,tune,bench,cold,eager,w8a8,moe,moesteps,moelayer,moeprof,ab
DEFAULT_STEPS=env,wheels,launcher,catalog,tests,bench,cold,eager
STEPS=",${DEVICE_STEPS:-$DEFAULT_STEPS},"
ARCH=${DEVICE_ARCH:-sm90a}
JOBS=${DEVICE_JOBS:-16}
CATALOG=${HUMMING_AOT_DEVICE_CATALOG:-dense}
SITE=/tmp/site
SUMMARY="$OUTDIR/summary.txt"

STEP_LIST=${DEVICE_STEPS:-$DEFAULT_STEPS}
for step in ${STEP_LIST//,/ }; do
    if [[ ",$ALL_STEPS," != *",$step,"* ]]; then
        echo "unknown step '$step' in DEVICE_STEPS; expected some of $ALL_STEPS" >&2
        exit 2
    fi
done

# The checkout first (in-place builds), then the carried wheels (humming-kernels for the benchmark).
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

declare -a RESULTS=()
TABLE_HEADER=$(printf '%-9s %4s %9s  %s' step rc seconds log)
echo "device_check $(date -u +%FT%TZ)  repo $REPO  steps ${DEVICE_STEPS:-$DEFAULT_STEPS}" >"$SUMMARY"

wanted() { [[ "$STEPS" == *",$1,"* ]]; }

# run_step NAME LOGFILE COMMAND...: run, append output to LOGFILE, record rc and seconds.
run_step() {
    local name=$1 log=$2
    shift 2
    local start end rc
    start=$(date +%s.%N)
    {
        echo
        echo "=== [$name] $(date -u +%FT%TZ): $*"
    } >>"$log"
    "$@" >>"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    echo "=== [$name] exit $rc after ${secs}s" >>"$log"
    local row
    row=$(printf '%-9s %4s %9s  %s' "$name" "$rc" "$secs" "$(basename "$log")")
    [[ ${#RESULTS[@]} -eq 0 ]] && printf '\n%s\n' "$TABLE_HEADER" >>"$SUMMARY"
    RESULTS+=("$row")
    echo "$row" >>"$SUMMARY"
    echo "[$name] exit $rc (${secs}s), log: $(basename "$log")"
    return 0
}

step_env() {
    nvidia-smi
    echo
    python3 - <<'PY'
import platform, sys
import torch
print("python", sys.version.split()[0], platform.machine())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "sm%d%d" % (props.major, props.minor), "SMs", props.multi_processor_count,
          "L2", props.L2_cache_size, "mem", props.total_memory)
PY
    nvcc --version | tail -n 2
    python3 -m pytest --version
    echo "git sha: $(git -C "$REPO" rev-parse --verify -q HEAD 2>/dev/null || echo n/a)"
}

step_wheels() {
    shopt -s nullglob
    local wheels=("$REPO"/.whl/*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
        # a failed step, not a note: the benchmarks' Humming columns would silently read n/a
        echo "no .whl/*.whl carried: Humming is not installed, so every benchmark's humming column will be n/a." \
            "Fetch it where there is a network (pip download --no-deps --only-binary=:all: --python-version 3.12" \
            "--implementation cp --platform manylinux_2_28_x86_64 -d .whl humming-kernels==0.1.19) and carry .whl" \
            "(it is git-ignored), or leave the wheels step out of DEVICE_STEPS."
        return 1
    fi
    printf '  %s\n' "${wheels[@]##*/}"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${wheels[@]}"
}

step_launcher() { python3 setup.py build_ext --inplace -j "$JOBS"; }

# unpack_carried_catalog STAMP STAMP_FILE: where tools/device_catalog.sh left a catalog wheel of
# $ARCH in .whl/catalog/ (built on the CPU machine) whose .stamp file equals STAMP, the wheel's
# catalog becomes this checkout's in-place catalog (humming_aot/_catalog) and STAMP_FILE is
# written, instead of a build (the dense sm90a catalog: ~160 s of the box's time). Fails, and
# changes nothing, where there is no such wheel; a wheel of other sources is named and left.
unpack_carried_catalog() {
    local stamp=$1 stamp_file=$2 wheel
    for wheel in .whl/catalog/humming_aot_kernels_"${ARCH}"_cu*.whl; do
        [[ -f "$wheel" ]] || continue
        if [[ "$(cat "$wheel.stamp" 2>/dev/null)" != "$stamp" ]]; then
            echo "catalog: $wheel was built from other sources or another catalog (its .stamp differs): not used"
            continue
        fi
        rm -rf humming_aot/_catalog
        python3 - "$wheel" "$ARCH" humming_aot/_catalog <<'PY' || return 1
import sys, zipfile
from pathlib import Path
wheel, arch, target = sys.argv[1], sys.argv[2], Path(sys.argv[3])
with zipfile.ZipFile(wheel) as z:
    prefixes = {name.split("/")[1] for name in z.namelist()
                if name.startswith("humming_aot_kernels/") and name.split("/")[1].startswith(arch + "_cu")}
    if len(prefixes) != 1:
        sys.exit(f"{wheel}: expected one humming_aot_kernels/{arch}_cu*/ directory, found {sorted(prefixes)}")
    root = f"humming_aot_kernels/{prefixes.pop()}/"
    for name in z.namelist():
        if name.startswith(root) and not name.endswith("/"):
            out = target / name[len(root):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(name))
    if not (target / "manifest.json").is_file():
        sys.exit(f"{wheel}: no manifest.json under {root}")
PY
        echo "$stamp" >"$stamp_file"
        return 0
    done
    return 1
}

step_catalog() {
    local start=$SECONDS
    local catalog=$CATALOG
    if [[ "$catalog" == *,* ]]; then
        # several catalogs (e.g. default,moe) in one build: their families in one file
        catalog=/tmp/device_check_catalog.toml
        python3 - "$CATALOG" "$catalog" <<'PY' || return 1
import sys
from humming_aot.catalog_data import catalog_file
names, target = sys.argv[1].split(","), sys.argv[2]
parts = ["schema_version = 1\n"]
for name in names:
    text = catalog_file(name).read_text()
    parts.append("\n".join(line for line in text.splitlines() if not line.startswith("schema_version")) + "\n")
open(target, "w").write("\n".join(parts))
PY
    fi
    local stamp_file="$REPO/humming_aot/_catalog/.device_check_stamp" stamp
    stamp=$(catalog_stamp "$catalog")
    if [[ -f "$REPO/humming_aot/_catalog/manifest.json" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
        echo "catalog ($ARCH, $CATALOG): kept, built on this box from the same sources by an earlier call"
        return 0
    fi
    if unpack_carried_catalog "$stamp" "$stamp_file"; then
        echo "catalog ($ARCH, $CATALOG): unpacked from the carried wheel in $((SECONDS - start)) s"
        return 0
    fi
    rm -f "$stamp_file"  # a build that fails half-way must not leave a stamp for what it overwrote
    local -a build_args=()
    [[ -n "${DEVICE_BUILD_ARGS:-}" ]] && mapfile -t build_args < <(split_args "$DEVICE_BUILD_ARGS")
    python3 -m humming_aot build --arch "$ARCH" --catalog "$catalog" --inplace -j "$JOBS" "${build_args[@]}"
    local rc=$?
    [[ $rc -eq 0 ]] && echo "$stamp" >"$stamp_file"
    echo "catalog build ($ARCH, $CATALOG, -j $JOBS): $((SECONDS - start)) s wall, exit $rc"
    return $rc
}

step_tests() {
    local -a extra=()
    [[ -n "${PYTEST_ARGS:-}" ]] && mapfile -t extra < <(split_args "$PYTEST_ARGS")
    [[ -n "${DEVICE_TEST_PART:-}" ]] && extra=(--part "$DEVICE_TEST_PART" "${extra[@]}")
    python3 -m pytest tests -m gpu -q -x --timeout 900 -p no:cacheprovider \
        --junitxml "$OUTDIR/tests.xml" "${extra[@]}"
}

step_tune() {
    local -a extra=()
    [[ -n "${TUNE_ARGS:-}" ]] && mapfile -t extra < <(split_args "$TUNE_ARGS")
    python3 tools/bench/tune_tiles.py --json "$OUTDIR/tune.json" "${extra[@]}"
}

step_bench() {
    local -a extra=()
    [[ -n "${BENCH_ARGS:-}" ]] && mapfile -t extra < <(split_args "$BENCH_ARGS")
    python3 tools/bench/bench_gemm.py --json "$OUTDIR/bench.json" "${extra[@]}"
}

step_cold() {
    local -a extra=()
    [[ -n "${COLD_ARGS:-}" ]] && mapfile -t extra < <(split_args "$COLD_ARGS")
    python3 tools/bench/cold_start.py --json "$OUTDIR/cold_start.json" "${extra[@]}"
}

step_eager() {
    local -a extra=()
    [[ -n "${EAGER_ARGS:-}" ]] && mapfile -t extra < <(split_args "$EAGER_ARGS")
    python3 tools/bench/eager_overhead.py --json "$OUTDIR/eager.json" "${extra[@]}"
}

step_w8a8() {
    local -a extra=()
    [[ -n "${W8A8_ARGS:-}" ]] && mapfile -t extra < <(split_args "$W8A8_ARGS")
    python3 tools/bench/bench_w8a8.py --json "$OUTDIR/w8a8.json" "${extra[@]}"
}

step_moe() {
    local -a extra=()
    [[ -n "${MOE_ARGS:-}" ]] && mapfile -t extra < <(split_args "$MOE_ARGS")
    python3 tools/bench/bench_moe.py --json "$OUTDIR/moe.json" "${extra[@]}"
}

step_moesteps() {
    local -a extra=()
    [[ -n "${MOESTEPS_ARGS:-}" ]] && mapfile -t extra < <(split_args "$MOESTEPS_ARGS")
    python3 tools/bench/bench_moe_steps.py --json "$OUTDIR/moe_steps.json" "${extra[@]}"
}

step_moelayer() {
    local -a extra=()
    [[ -n "${MOELAYER_ARGS:-}" ]] && mapfile -t extra < <(split_args "$MOELAYER_ARGS")
    python3 tools/bench/bench_moe_layer.py --json "$OUTDIR/moe_layer.json" "${extra[@]}"
}

step_moeprof() {
    local -a extra=() view=(--page details --section SpeedOfLight --section LaunchStats --section Occupancy
        --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis)
    [[ -n "${MOEPROF_ARGS:-}" ]] && mapfile -t extra < <(split_args "$MOEPROF_ARGS")
    # MOEPROF_RAW=1: every metric of the full set, one row per kernel (the stall reasons among them)
    [[ "${MOEPROF_RAW:-0}" == 1 ]] && view=(--page raw --set full)
    # MOEPROF_SOURCE=1: each SASS instruction's executed count and stall samples (where the
    # instructions of a kernel go), one table per kernel
    [[ "${MOEPROF_SOURCE:-0}" == 1 ]] && view=(--page source --print-source sass --section SourceCounters)
    # MOEPROF_COUNTERS=1: tools/bench/ncu_counters.py's metrics (launch, DRAM, instructions, stall
    # reasons), one column per kernel in bench.log
    [[ "${MOEPROF_COUNTERS:-0}" == 1 ]] && view=(--page raw --metrics "$(python3 tools/bench/ncu_counters.py --metric-list)")
    ncu --clock-control none --nvtx --nvtx-include "profile/" --csv "${view[@]}" \
        python3 tools/bench/profile_moe.py "${extra[@]}" >"$OUTDIR/moe_profile.csv" || return 1
    # the source page summed up where the warps wait (stall reasons, loops, the loads waited on)
    if [[ "${MOEPROF_SOURCE:-0}" == 1 ]]; then
        python3 tools/bench/ncu_source_summary.py "$OUTDIR/moe_profile.csv"
    fi
    if [[ "${MOEPROF_COUNTERS:-0}" == 1 ]]; then
        python3 tools/bench/ncu_counters.py "$OUTDIR/moe_profile.csv:$(printf '%s' "${MOEPROF_ARGS:-}" | tr -s ' ' '_')"
    fi
}

# A/B: the base tree (.ab/base, from tools/ab_base.sh) gets its own extension and the same catalog
# as this tree (build it with the catalog step first); then the two trees are benchmarked in
# turns, base first in each round, each from its own directory and with its own PYTHONPATH.
step_ab() {
    local base="$REPO/${AB_BASE:-.ab/base}"
    if [[ ! -f "$base/.ab_rev" ]]; then
        echo "no base tree in ${AB_BASE:-.ab/base}: run tools/ab_base.sh REV here and carry .ab to the box" >&2
        return 2
    fi
    local catalog=$CATALOG
    [[ "$catalog" != default && -f "$catalog" ]] && catalog=$(cd "$(dirname "$catalog")" && pwd)/$(basename "$catalog")
    if [[ -n "${AB_CARRIED_CATALOG:-}" ]]; then
        if [[ ! -f "$base/humming_aot/_catalog/manifest.json" || ! -f "$REPO/humming_aot/_catalog/manifest.json" ]]; then
            echo "AB_CARRIED_CATALOG is set but a tree has no humming_aot/_catalog: build both here and carry them" >&2
            return 2
        fi
        (cd "$base" && PYTHONPATH="$base:$SITE" python3 setup.py build_ext --inplace -j "$JOBS") || return 1
    else
        (cd "$base" && PYTHONPATH="$base:$SITE" python3 setup.py build_ext --inplace -j "$JOBS" &&
            PYTHONPATH="$base:$SITE" python3 -m humming_aot build --arch "$ARCH" --catalog "$catalog" --inplace -j "$JOBS") ||
            return 1
    fi
    local -a extra=() base_runs=() current_runs=()
    [[ -n "${AB_ARGS:-}" ]] && mapfile -t extra < <(split_args "$AB_ARGS")
    local round tmp tool=${AB_TOOL:-tools/bench/bench_gemm.py}  # or bench_moe.py, bench_w8a8.py, bench_w4a8.py
    tmp=$(mktemp -d)
    for ((round = 1; round <= ${AB_ROUNDS:-2}; round++)); do
        (cd "$base" && PYTHONPATH="$base:$SITE" python3 "$tool" --json "$tmp/base_$round.json" "${extra[@]}") || return 1
        python3 "$tool" --json "$tmp/current_$round.json" "${extra[@]}" || return 1
        base_runs+=("$tmp/base_$round.json")
        current_runs+=("$tmp/current_$round.json")
    done
    python3 tools/bench/ab_compare.py --merge "$OUTDIR/ab.json" --rev "$(cat "$base/.ab_rev")" \
        --current-rev "$(git -C "$REPO" rev-parse --verify -q HEAD 2>/dev/null || echo n/a) + working tree" \
        --base "${base_runs[@]}" --current "${current_runs[@]}"
}

# summary.txt: the environment first, then one row per step, appended as each step ends.
wanted env && run_step env "$SUMMARY" step_env
wanted wheels && run_step wheels "$OUTDIR/build.log" step_wheels
wanted launcher && run_step launcher "$OUTDIR/build.log" step_launcher
wanted catalog && run_step catalog "$OUTDIR/build.log" step_catalog
wanted tests && run_step tests "$OUTDIR/tests.log" step_tests
wanted tune && run_step tune "$OUTDIR/bench.log" step_tune
wanted bench && run_step bench "$OUTDIR/bench.log" step_bench
wanted cold && run_step cold "$OUTDIR/bench.log" step_cold
wanted eager && run_step eager "$OUTDIR/bench.log" step_eager
wanted w8a8 && run_step w8a8 "$OUTDIR/bench.log" step_w8a8
wanted moe && run_step moe "$OUTDIR/bench.log" step_moe
wanted moesteps && run_step moesteps "$OUTDIR/bench.log" step_moesteps
wanted moelayer && run_step moelayer "$OUTDIR/bench.log" step_moelayer
wanted moeprof && run_step moeprof "$OUTDIR/bench.log" step_moeprof
wanted ab && run_step ab "$OUTDIR/bench.log" step_ab

echo
echo "summary ($SUMMARY):"
echo "$TABLE_HEADER"
printf '%s\n' "${RESULTS[@]}"
failed=0
for row in "${RESULTS[@]}"; do
    read -r _ rc _ <<<"$row"
    [[ "$rc" != 0 ]] && failed=1
done
exit $failed
