#!/usr/bin/env bash
# Prepare the base tree of an A/B run on the GPU box: a `git archive` copy of REV in DIR (default
# .ab/base; it must lie under .ab/, which git ignores; carry it to the box with the device tool's
# carry [".ab"]). Several bases (tools/ab_base.sh REV2 .ab/other) are compared one call each, with
# AB_BASE=.ab/other DEVICE_STEPS=ab. Then, there:
#
#   tools/ab_base.sh 1c6eec4
#   DEVICE_STEPS=launcher,catalog,ab HUMMING_AOT_DEVICE_CATALOG=<small toml> \
#       AB_ARGS="--shapes 8192x8192 --impls humming_aot --formats int1:g128 --m 1,8" tools/device_check.sh OUTDIR
#
# (tools/device_check.sh, step ab: both trees built with the same catalog and benchmarked in turns).
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 REV [DIR under .ab/, default .ab/base]" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${2:-.ab/base}
dir=${dir%/}
if [[ "$dir" != .ab/?* || "$dir" == *..* ]]; then
    echo "DIR must be a folder under .ab/ (git ignores .ab), got '$dir'" >&2
    exit 2
fi
rev=$(git rev-parse --verify "$1^{commit}")
rm -rf "$dir"
mkdir -p "$dir"
git archive "$rev" | tar -x -C "$dir"
echo "$rev" >"$dir/.ab_rev"
echo "base tree of $rev in $dir ($(du -sh "$dir" | cut -f1)); carry .ab to the GPU box"
