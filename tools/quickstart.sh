#!/usr/bin/env bash
# Fresh machine -> the core and a smoke kernel catalog for one arch, built from this checkout,
# served as a local package index and installed into the running Python's environment (a venv,
# a conda env or a system Python alike), then a demo GEMM checked against a float64 reference
# (on the GPU where there is one, else the CPU reference path).
#   bash tools/quickstart.sh [ARCH]     (ARCH defaults to sm90a; e.g. sm80, sm86, sm89, sm100, sm120)
# PYTHON picks the interpreter (default python3); QUICKSTART_DIR where the wheels, the index and
# the build files go (default .quickstart/ in the checkout).
set -euo pipefail
ARCH="${1:-sm90a}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
WORK="${QUICKSTART_DIR:-$REPO/.quickstart}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

# torch first, pinned: a bare `torch` requirement can pull a multi-GB CUDA build
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install torch==2.13.0
"$PY" -m pip install pybind11 ninja wheel "setuptools>=70"

# The core wheel (for this Python) and one catalog wheel for ARCH, as a PEP 503 index in $WORK/index.
PYTHONPATH="$REPO" "$PY" -m humming_aot build --arch "$ARCH" --catalog smoke \
    --out "$WORK/dist" --build-dir "$WORK/build" --index "$WORK/index"

# Installed into $PY's own environment: no second venv, whose --system-site-packages would see the
# base interpreter's packages instead of this environment's (torch among them). The packages just
# built first, replacing earlier installs of the same version; then pip resolves the extra, which
# names the catalog of ARCH.
KERNELS=$(cd "$WORK/index" && ls -d humming-aot-kernels-"$ARCH"-cu*)
"$PY" -m pip install --no-deps --force-reinstall --index-url "file://$WORK/index" humming_aot $KERNELS
"$PY" -m pip install --index-url "file://$WORK/index" "humming_aot[$ARCH]"

cd /tmp  # import the installed package, not the source checkout
"$PY" -m humming_aot list
"$PY" "$REPO/tools/demo.py"
