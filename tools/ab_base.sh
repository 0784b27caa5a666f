#!/usr/bin/env bash
# Prepare the base tree of an A/B run on the GPU box: a `git archive` copy of REV in .ab/base
# (ignored by git; carry it to the box with the device tool's carry [".ab"]). Then, there:
#
#   tools/ab_base.sh 1c6eec4
#   DEVICE_STEPS=launcher,catalog,ab HUMMING_AOT_DEVICE_CATALOG=<small toml> \
#       AB_ARGS="--shapes 8192x8192 --impls humming_aot --formats int1:g128 --m 1,8" tools/device_check.sh OUTDIR
#
# (tools/device_check.sh, step ab: both trees built with the same catalog and benchmarked in turns).
set -euo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: $0 REV" >&2
    exit 2
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rev=$(git rev-parse --verify "$1^{commit}")
rm -rf .ab/base
mkdir -p .ab/base
git archive "$rev" | tar -x -C .ab/base
echo "$rev" >.ab/base/.ab_rev
echo "base tree of $rev in .ab/base ($(du -sh .ab/base | cut -f1)); carry .ab to the GPU box"
