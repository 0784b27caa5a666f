#!/usr/bin/env bash
# Build, on this (CPU) machine, the catalog that tools/device_check.sh's catalog step would build on
# the GPU box, as one wheel in .whl/catalog/ with a .stamp file beside it (tools/device_lib.sh's catalog_stamp:
# the arch, catalog, build arguments, kernel sources and nvcc). Carried to the box with .whl (which
# the device tool's carry takes: .whl is git-ignored), it replaces the box's build when its stamp
# matches the box's tree: the dense sm90a catalog is ~156 s of the box's 16 cores (log section 86)
# and a 23 MB wheel here. With another tree (a kernel source or any humming_aot/*.py changed
# since), the box names the stale wheel and builds as before.
#
#   tools/device_catalog.sh [BUILD_DIR]     # default build/device_catalog (kept: later builds
#                                           #   recompile only what changed)
#
# The same variables as device_check.sh: DEVICE_ARCH (sm90a), HUMMING_AOT_DEVICE_CATALOG (dense:
# one catalog name or .toml path; a comma list is built on the box only), DEVICE_BUILD_ARGS, and
# DEVICE_JOBS (here: this machine's CPU count). Run it after the last commit before a device call;
# the dense sm90a catalog from an empty build directory takes about 21 minutes on two cores.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2
ARCH=${DEVICE_ARCH:-sm90a}
CATALOG=${HUMMING_AOT_DEVICE_CATALOG:-dense}
BUILD_DIR=${1:-build/device_catalog}
if [[ "$CATALOG" == *,* ]]; then
    echo "HUMMING_AOT_DEVICE_CATALOG=$CATALOG: a comma list is built on the box (device_check.sh); name one catalog" >&2
    exit 2
fi
# shellcheck source=tools/device_lib.sh
source tools/device_lib.sh
stamp=$(catalog_stamp "$CATALOG")
out=.whl/catalog
rm -rf "$out"
mkdir -p "$out"
build_args=()
[[ -n "${DEVICE_BUILD_ARGS:-}" ]] && mapfile -t build_args < <(split_args "$DEVICE_BUILD_ARGS")
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python3 -m humming_aot build --arch "$ARCH" --catalog "$CATALOG" \
    --out "$out" --build-dir "$BUILD_DIR" -j "${DEVICE_JOBS:-$(nproc)}" "${build_args[@]}" || exit 1
wheels=("$out"/humming_aot_kernels_"${ARCH}"_cu*.whl)
if [[ ${#wheels[@]} -ne 1 || ! -f "${wheels[0]}" ]]; then
    echo "expected one humming_aot_kernels_${ARCH}_cu*.whl in $out, found: ${wheels[*]}" >&2
    exit 1
fi
if [[ "$(catalog_stamp "$CATALOG")" != "$stamp" ]]; then
    echo "the sources changed during the build: run it again" >&2
    rm -rf "$out"
    exit 1
fi
echo "$stamp" >"${wheels[0]}.stamp"
echo "catalog wheel for the box: ${wheels[0]} ($(stat -c %s "${wheels[0]}") bytes), stamp $stamp"
