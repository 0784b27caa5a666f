#!/usr/bin/env bash
# Fresh machine -> a smoke wheel for one arch, installed into its own venv, and (where a GPU is
# present) a demo GEMM checked against a float64 reference.
#   bash tools/quickstart.sh [ARCH]     (ARCH defaults to sm90a; e.g. sm80, sm86, sm89, sm120)
set -euo pipefail
ARCH="${1:-sm90a}"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

# torch first, pinned: a bare `torch` requirement can pull a multi-GB CUDA build
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install torch==2.13.0
"$PY" -m pip install pybind11 ninja wheel "setuptools>=70"
"$PY" -m pip install --no-build-isolation --no-deps -e .

"$PY" -m humming_aot build --arch "$ARCH" --catalog smoke --out dist
WHEEL=$(ls -t dist/humming_aot-*"$ARCH"*.whl | head -n 1)

VENV=.venv-quickstart
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install --no-deps --force-reinstall "$WHEEL"
cd /tmp  # import the installed wheel, not the source checkout
"$OLDPWD/$VENV/bin/humming-aot" list
"$OLDPWD/$VENV/bin/python" "$OLDPWD/tools/demo.py"
