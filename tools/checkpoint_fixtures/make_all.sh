#!/usr/bin/env bash
# Write the checkpoint fixtures of tests/fixtures/checkpoints with the real producer packages, each
# in its own virtual environment (their torch / transformers / compressed-tensors pins conflict),
# CPU only. Not run by CI: the outputs are committed. About 15 minutes on 2 cores, most of it
# GPTQModel (7 runs) and AutoAWQ.
#
#   tools/checkpoint_fixtures/make_all.sh [OUT_DIR]      (default: tests/fixtures/checkpoints)
#
# Every venv sees the system torch 2.13.0 (CPU build) through --system-site-packages, and pip is
# constrained to it so that no producer pulls another torch.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$(realpath -m "${1:-$HERE/../../tests/fixtures/checkpoints}")"
WORK="${WORK:-/tmp/humming_aot_fixtures}"
PY="${PYTHON:-python3}"
mkdir -p "$WORK" "$OUT"
echo "torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')" > "$WORK/torch-pin.txt"
export HF_HUB_OFFLINE=1 GPTQMODEL_CPU_WORKERS=2

venv() {  # venv NAME PIP-ARGS...: create (once) and install
    local dir="$WORK/venv-$1"; shift
    if [[ ! -x "$dir/bin/python" ]]; then
        "$PY" -m venv --system-site-packages "$dir"
        "$dir/bin/pip" install -q -c "$WORK/torch-pin.txt" "$@"
    fi
}

# compressed-tensors, HQQ, transformers (fp8, gpt-oss), ModelOpt
venv main compressed-tensors==0.20.0 transformers==5.24.0 einops termcolor nvidia-modelopt==0.47.0 requests
"$WORK/venv-main/bin/pip" install -q --no-deps hqq==0.2.8.post1
# GPTQModel 7.7.0 asks for torch >= 2.14.1 but imports and runs on 2.13: --no-deps, then its deps
venv gptq --no-deps gptqmodel==7.7.0
"$WORK/venv-gptq/bin/pip" install -q -c "$WORK/torch-pin.txt" accelerate numpy safetensors "transformers>=5.20.2" \
    threadpoolctl packaging device-smi protobuf pillow requests pypcre tokenicer logbar jinja2 datasets pyarrow dill \
    defuser
# AutoAWQ 0.2.9 with its last tested transformers
venv awq --no-deps autoawq==0.2.9
"$WORK/venv-awq/bin/pip" install -q -c "$WORK/torch-pin.txt" transformers==4.51.3 tokenizers accelerate \
    "datasets>=2.20" zstandard "huggingface_hub<1.0"
venv autoround auto-round==0.15.1 transformers==5.24.0

"$WORK/venv-gptq/bin/python" "$HERE/base_model.py" "$WORK/base"
"$WORK/venv-main/bin/python" "$HERE/ct_fixtures.py" "$OUT"
"$WORK/venv-main/bin/python" "$HERE/hqq_fixtures.py" "$OUT"
"$WORK/venv-main/bin/python" "$HERE/transformers_fixtures.py" "$WORK/base" "$OUT"
"$WORK/venv-main/bin/python" "$HERE/modelopt_fixtures.py" "$WORK/base" "$WORK" "$OUT"
"$WORK/venv-autoround/bin/python" "$HERE/autoround_fixtures.py" "$WORK/base" "$WORK" "$OUT"
"$WORK/venv-gptq/bin/python" "$HERE/gptqmodel_fixtures.py" "$WORK/base" "$WORK" "$OUT"
"$WORK/venv-awq/bin/python" "$HERE/autoawq_fixtures.py" "$WORK" "$OUT"
"$WORK/venv-main/bin/python" "$HERE/ct_converter_fixtures.py" "$OUT"
du -sh "$OUT"
