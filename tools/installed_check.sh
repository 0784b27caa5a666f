#!/usr/bin/env bash
# The catalog as a user installs it, on the GPU box: the core and the ARCH catalog package built here
# into a local index, installed into a fresh venv from that index alone, then the GPU tests run
# from outside the checkout with no CUDA toolkit on PATH, NVRTC out of reach and the JIT off
# (HUMMING_AOT_JIT=0: every kernel must come from the installed catalog; the JIT tests skip and
# say why).
#
#   bash tools/installed_check.sh OUTDIR        (ARCH=sm90a, CATALOG=default, JOBS=16 by default;
#                                                PYTEST_ARGS: more pytest words, split on spaces)
#
# MODEL=DIR builds `humming-aot build --model DIR` (the kernels that checkpoint's layers need)
# instead of a named catalog; TESTS (default tests/gpu) narrows the tests to what that package
# serves, e.g. MODEL=tests/fixtures/checkpoints/gptq_4bit_actorder_v1
# TESTS=tests/gpu/test_checkpoints_gpu.py PYTEST_ARGS="-k gptq_4bit_actorder_v1".
#
# Needs nvcc for the build step only, and a torch with CUDA in python3's environment (the venv sees
# python3's packages after its own; pip gets no index but the local one). Writes OUTDIR/build.log
# and OUTDIR/tests.log, OUTDIR/tests.xml; everything else goes to /tmp/installed_check.
set -euo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
OUTDIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=${ARCH:-sm90a}
CATALOG=${CATALOG:-default}
MODEL=${MODEL:-}
TESTS=${TESTS:-tests/gpu}
JOBS=${JOBS:-16}
WORK=/tmp/installed_check
rm -rf "$WORK"
mkdir -p "$WORK"
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

{
    start=$SECONDS
    if [[ -n "$MODEL" ]]; then
        kernels=(--model "$(cd "$REPO" && realpath "$MODEL")")
    else
        kernels=(--catalog "$CATALOG")
    fi
    PYTHONPATH="$REPO" python3 -m humming_aot build --arch "$ARCH" "${kernels[@]}" -j "$JOBS" \
        --out "$WORK/dist" --build-dir "$WORK/build" --index "$WORK/index"
    echo "build: $((SECONDS - start)) s wall"
    ls -l "$WORK/dist"
    # A venv that sees python3's packages (torch) after its own: a .pth file, since
    # --system-site-packages from a venv's interpreter would show the base interpreter's instead.
    python3 -m venv --without-pip "$WORK/venv"
    purelib=$("$WORK/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    python3 -c "import site; print('\n'.join(site.getsitepackages() + [site.getusersitepackages()]))" \
        > "$purelib/_outer_site_packages.pth"
    pip=("$WORK/venv/bin/python" -m pip install -q --index-url "file://$WORK/index")
    # the core from the index, over any humming_aot the base interpreter has; then pip resolves the extra
    "${pip[@]}" --no-deps --force-reinstall humming_aot
    "${pip[@]}" "humming_aot[$ARCH]"
} > "$OUTDIR/build.log" 2>&1

# run outside the checkout, so that `import humming_aot` is the venv's (pyproject.toml: the markers)
cp -r "$REPO/tests" "$WORK/tests"
cp "$REPO/pyproject.toml" "$WORK/"
cd "$WORK"
# No toolkit on PATH, no CUDA_HOME, and HUMMING_AOT_NVRTC pointing at nothing: humming_aot cannot
# reach an NVRTC even where torch's own nvidia packages bring one.
# (every PATH entry that names CUDA or holds an nvcc is dropped)
clean_path=$(tr ':' '\n' <<< "$PATH" | grep -v -i cuda | while read -r dir; do
    [[ -x "$dir/nvcc" ]] || echo "$dir"
done | paste -sd: -)
run() {
    env -u PYTHONPATH -u CUDA_HOME -u CUDA_PATH PATH="$WORK/venv/bin:$clean_path" HUMMING_AOT_JIT=0 \
        HUMMING_AOT_NVRTC=/nonexistent/libnvrtc.so "$@"
}
set +e
{
    echo "nvcc on PATH: $(run bash -c 'command -v nvcc || echo none')"
    run python -c "import humming_aot; print('humming_aot from', humming_aot.__file__)"
    run humming-aot info
    run humming-aot doctor
    # shellcheck disable=SC2086  # PYTEST_ARGS: extra words, e.g. "-x" or "-k catalog"
    run python -m pytest "$TESTS" -m gpu -q -p no:cacheprovider -rs --junitxml "$OUTDIR/tests.xml" ${PYTEST_ARGS:-}
} > "$OUTDIR/tests.log" 2>&1
rc=$?
tail -n 30 "$OUTDIR/tests.log"
exit $rc
