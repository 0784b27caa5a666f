# Sourced by tools/device_check.sh and tools/device_catalog.sh (not run alone): what both need.

# split_args VALUE: print VALUE's words one per line, split with shell quoting rules (shlex),
# so that an argument with spaces survives an environment variable.
split_args() {
    python3 -c 'import shlex, sys; print("\n".join(shlex.split(sys.argv[1])))' "$1"
}

# catalog_stamp CATALOG: what a catalog build of $ARCH is made from (arch, the catalog name and
# file, $DEVICE_BUILD_ARGS, the contents of the sources that generate and compile its kernels and
# the nvcc that compiles them), as one sha256. Run from the repository root. Two trees with the
# same stamp build the same kernels, so a catalog built in one serves the other: an in-place
# catalog kept on a warm box between calls, or a catalog wheel built on the CPU machine and
# carried to the box (tools/device_catalog.sh).
catalog_stamp() {
    {
        echo "$ARCH $CATALOG ${DEVICE_BUILD_ARGS:-}"
        [[ -f "$1" ]] && sha256sum "$1"
        find csrc catalog humming_aot -path humming_aot/_catalog -prune -o -type f \
            \( -name '*.py' -o -name '*.cuh' -o -name '*.h' -o -name '*.cu' -o -name '*.toml' \) -print |
            LC_ALL=C sort | xargs sha256sum
        nvcc --version 2>/dev/null | tail -n 1
    } | sha256sum | cut -d' ' -f1
}
