"""The `humming-aot` command: build catalog wheels, one per arch (with --index, plus the core and a
simple index; or the in-place catalog), list the installed catalogs, report which catalog serves
this machine's GPU (info), and check the JIT fallback (doctor).

Errors a user can cause (a bad arch, an unknown catalog, no nvcc) print one line and exit 2;
a kernel that fails to compile prints nvcc's output and exits 1. HUMMING_AOT_LOG_LEVEL=DEBUG shows
tracebacks instead.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from humming_aot import env
from humming_aot._version import __version__

EXIT_USAGE = 2
EXIT_BUILD_FAILED = 1


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse would print the usage too)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"-j {text!r} is not a positive number of parallel nvcc jobs")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="humming-aot", description="humming_aot: precompiled quantized GEMM kernels")
    parser.add_argument("--version", action="version", version=f"humming_aot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    build = sub.add_parser("build", help="compile a kernel catalog into one wheel per arch (or in place)")
    build.add_argument("--arch", action="append", required=True, metavar="ARCH",
                       help="target to compile for, e.g. sm80, sm89, sm90a, sm120 (repeat for several)")
    build.add_argument("--catalog", default="default", metavar="default|dense|moe|smoke|PATH",
                       help="which kernels: a built-in catalog name or a catalog .toml file (default: default, "
                            "the dense and the grouped MoE GEMMs; dense or moe: one of the two)")
    build.add_argument("--model", type=Path, default=None, metavar="MODEL_DIR",
                       help="build only the kernels this quantized checkpoint's layers need (instead of --catalog)")
    build.add_argument("-j", "--jobs", type=_jobs, default=None, help="parallel nvcc jobs (default: CPU count)")
    build.add_argument("--out", type=Path, default=Path("dist"), help="directory for the wheels (default: ./dist)")
    build.add_argument("--build-dir", type=Path, default=None,
                       help="intermediate files, reused by later builds (default: ./build/humming_aot_kernels)")
    build.add_argument("--inplace", action="store_true",
                       help="write kernels + manifest into this checkout's humming_aot/_catalog instead of wheels")
    build.add_argument("--fatbin-compression", choices=("auto", "none", "size"), default="auto",
                       help="how the fatbins store their kernels: none (nvcc's default), size (nvcc "
                            "--compress-mode=size, CUDA 12.8+: about a quarter of the bytes, decompressed by "
                            "the driver as each kernel loads: on an H200 140-240 us more per kernel's first load), "
                            "or auto (default): size for the grouped row-expert MoE kernels and for the weight formats "
                            "checkpoints seldom ship (1-bit and 5-7-bit codes, the small floats other than e4m3, "
                            "e5m2, e2m1, e2m3 and e3m2: aot.ninja.PLAIN_W_DTYPES), none for the rest")
    build.add_argument("--index", type=Path, default=None, metavar="DIR",
                       help="also write the core wheel and serve every wheel as a PEP 503 simple index in DIR "
                            "(pip install --index-url file://DIR 'humming_aot[sm89]')")

    listing = sub.add_parser("list", help="show the kernels of the installed catalog")
    listing.add_argument("--json", action="store_true", help="machine-readable output")

    inspect = sub.add_parser("inspect", help="list a quantized checkpoint's layers and whether they can run here")
    inspect.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="directory with config.json + safetensors")
    inspect.add_argument("--arch", default=None, metavar="ARCH",
                         help="target to check, e.g. sm89 (default: this machine's first GPU)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")

    sub.add_parser("info", help="show this machine's GPUs and which catalog arch serves each")
    sub.add_parser("doctor", help="check the run-time compiler (NVRTC), headers, JIT cache and catalog vs GPU")
    return parser


def _cmd_build(args: argparse.Namespace) -> int:
    if args.model is not None:
        import tempfile

        from humming_aot.aot.model_catalog import write_model_catalog

        if args.catalog != "default":
            raise ValueError("--model and --catalog both choose the kernels: pass one of them")
        with tempfile.TemporaryDirectory() as tmp:
            name = "".join(c if c.isalnum() else "_" for c in args.model.resolve().name)
            args.catalog = str(write_model_catalog(args.model, args.arch, Path(tmp) / f"model_{name}.toml"))
            return _run_build(args)
    return _run_build(args)


def _run_build(args: argparse.Namespace) -> int:
    from humming_aot.aot.wheel import WHEEL_SIZE_BUDGET, build

    summary = build(archs=args.arch, catalog=args.catalog, jobs=args.jobs, out_dir=args.out,
                    build_dir=args.build_dir, inplace=args.inplace, index_dir=args.index, stream=sys.stderr,
                    compression=args.fatbin_compression)
    per_arch = ", ".join(f"{arch}: {n}" for arch, n in summary.kernels_per_arch.items())
    print(f"built {_count(summary.kernels, 'kernel')} ({per_arch}) of catalog {summary.catalog!r} with CUDA "
          f"{summary.cuda_version} in {summary.seconds:.1f} s")
    for arch, count in summary.kernels_per_arch.items():
        print(f"  {arch}: {_count(count, 'kernel')}, {summary.fatbin_bytes_per_arch[arch]:,} bytes of fatbins, "
              f"{summary.nvcc_seconds_per_arch[arch]:.1f} nvcc-seconds")
    if summary.skipped_tiles:
        print(f"left out {summary.skipped_tiles} tiles whose shared memory exceeds their arch's limit")
    if not summary.wheels:
        print(f"catalog written to {summary.catalog_dir}")
    for path in [*summary.wheels.values(), *([summary.core_wheel] if summary.core_wheel else [])]:
        size = path.stat().st_size
        print(f"wheel: {path} ({size:,} bytes)")
        if size > WHEEL_SIZE_BUDGET:
            print(f"warning: {path.name} exceeds PyPI's default {WHEEL_SIZE_BUDGET:,}-byte file limit", file=sys.stderr)
    if summary.index_dir is not None:
        extras = ",".join(summary.wheels)
        print(f"index: {summary.index_dir} (pip install --index-url file://{summary.index_dir} "
              f"'humming_aot[{extras}]')")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from humming_aot.catalog import installed_catalog

    catalog = installed_catalog()
    if args.json:
        data = {"catalogs": [], "archs": {}}
        if catalog is not None:
            data["catalogs"] = [
                {"directory": str(m.directory), "catalog": m.catalog, "cuda_version": m.cuda_version,
                 "toolkit": m.toolkit, "kernels": m.kernel_count, "package": m.package,
                 "archs": list(m.archs)} for m in catalog.manifests
            ]
            data["archs"] = {arch: catalog.keys_for(arch) for arch in catalog.archs}
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    if catalog is None:
        print("no kernel catalog is installed: every kernel would be compiled at run time (JIT); "
              "install one (`pip install 'humming_aot[sm90a]'`) or build one with `humming-aot build --arch <sm..>`")
        return 0
    for m in catalog.manifests:
        source = f"package {m.package}" if m.package else "directory"
        print(f"{source}: catalog {m.catalog!r} for {', '.join(m.archs)} in {m.directory}: "
              f"{_count(m.kernel_count, 'kernel')}, CUDA {m.cuda_version} ({m.toolkit})")
    for arch in catalog.archs:
        names = catalog.keys_for(arch)
        print(f"{arch}: {_count(len(names), 'kernel')}")
        for name in names:
            print(f"  {name}")
    return 0


def _gpus() -> tuple[list[tuple[int, str, int, int]], str | None]:
    """[(index, name, major, minor)] of the visible CUDA GPUs, or ([], why there are none)."""
    try:
        import torch
    except ImportError:
        return [], "unknown (torch is not importable)"
    if not torch.cuda.is_available():
        cuda = torch.version.cuda or "none (CPU-only build)"
        return [], f"no CUDA GPU visible (torch {torch.__version__}, CUDA {cuda})"
    return [(i, torch.cuda.get_device_name(i), *torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())], None


def _catalog_line(catalog) -> str:
    if catalog is None:
        return "catalog: none installed (kernels would be compiled at run time)"
    return (f"catalog: {_count(len(catalog), 'kernel')} for {', '.join(catalog.archs)} "
            f"(CUDA {', '.join(sorted({m.cuda_version for m in catalog.manifests}))})")


def _serving_table(catalog_archs: list[str]) -> list[str]:
    """Per compute capability: the catalog arch whose SASS runs there, its package, installed or not."""
    from humming_aot.arch import PLAIN_TARGETS, serving_arch
    from humming_aot.distribution import EXTRAS_CUDA_MAJOR, default_catalog_archs, kernel_dist_name

    shipped = default_catalog_archs()
    lines = ["which catalog serves each GPU (SASS for sm_XY runs on X.Z, Z >= Y; 'a' targets only on X.Y):"]
    for number in PLAIN_TARGETS:
        major, minor = divmod(number, 10)
        installed = serving_arch(catalog_archs, major, minor)
        arch = installed or serving_arch(shipped, major, minor)
        if arch is None:
            lines.append(f"  {major}.{minor}: no catalog (the JIT compiles for it)")
            continue
        state = "installed" if installed else f"not installed: pip install 'humming_aot[{arch}]'"
        borrowed = "" if arch.rstrip("a") == f"sm{number}" else f" ({arch} SASS runs on {major}.{minor})"
        lines.append(f"  {major}.{minor}: {arch}{borrowed}, {kernel_dist_name(arch, EXTRAS_CUDA_MAJOR)}: {state}")
    return lines


def _cmd_info(args: argparse.Namespace) -> int:
    from humming_aot.arch import archs_for_capability, serving_arch
    from humming_aot.catalog import installed_catalog

    print(f"humming_aot {__version__}")
    catalog = installed_catalog()
    catalog_archs = catalog.archs if catalog is not None else []
    print(_catalog_line(catalog))
    for m in catalog.manifests if catalog is not None else ():
        print(f"  {m.package or m.directory}: {', '.join(m.archs)}, {_count(m.kernel_count, 'kernel')}")
    gpus, no_gpu = _gpus()
    if no_gpu:
        print(f"GPU: {no_gpu}")
    for index, name, major, minor in gpus:
        arch = serving_arch(catalog_archs, major, minor)
        served = f"served by catalog arch {arch}" if arch else (
            f"no catalog arch serves it (would use {', '.join(archs_for_capability(major, minor))})")
        print(f"GPU {index}: {name}, compute capability {major}.{minor}, {served}")
    for line in _serving_table(catalog_archs):
        print(line)
    print(f"JIT: {'enabled' if env.jit_enabled() else 'disabled (HUMMING_AOT_JIT=0)'}; cache {env.cache_dir()}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    import dataclasses

    from humming_aot import checkpoints

    arch, why_no_arch = args.arch, None
    if arch is None:
        from humming_aot.arch import archs_for_capability

        gpus, no_gpu = _gpus()
        if gpus:
            arch = archs_for_capability(gpus[0][2], gpus[0][3])[0]
        else:
            why_no_arch = f"not checked: {no_gpu}; pass --arch"
    try:
        rows = checkpoints.inspect(args.model_dir, arch=arch)
    except checkpoints.CheckpointError as e:
        print(f"humming-aot: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps({"arch": arch, "layers": [dataclasses.asdict(r) for r in rows]}, indent=2))
        return 0
    if not rows:
        print(f"{args.model_dir}: no quantized layers (no quantization_config, or every layer is excluded)")
        return 0
    print(f"{args.model_dir}: {_count(len(rows), 'quantized layer')} (schema {rows[0].schema}); "
          f"serving checked for {arch or 'no arch'}")
    for r in rows:
        if r.error:
            print(f"  {r.prefix}: cannot load: {r.error}")
            continue
        shape = f"{r.experts} x {r.n} x {r.k}" if r.experts else f"{r.n} x {r.k}"
        step = {"gather": ", gathers activations (act-order)", "scale": ", scales activations (pre_quant_scale)"}
        acts = f", activations {r.activations}" if r.activations else ""
        w8a8 = f"; with its activations quantized (W8A8): {r.served_w8a8}" if r.served_w8a8 else ""
        print(f"  {r.prefix}: {r.format}, N x K = {shape}{step.get(r.activation_step, '')}{acts}; "
              f"{arch or 'served'}: {r.served or why_no_arch}{w8a8}")
    return 0


def _size(nbytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Everything the JIT fallback needs, one line each; always exits 0 (problems are reported)."""
    from humming_aot.arch import archs_for_capability, serving_arch
    from humming_aot.catalog import installed_catalog
    from humming_aot.catalog_data import find_include_dir
    from humming_aot.jit import cache, nvrtc
    from humming_aot.support import supported_archs

    print(f"humming_aot {__version__}")
    nvrtc_ok = False
    try:
        lib = nvrtc.load_nvrtc()
        archs = lib.supported_archs()
        targets = f"sm_{min(archs)}..sm_{max(archs)}"
        print(f"NVRTC: {lib.version_string} at {lib.path} (from {lib.source}; targets {targets})")
        nvrtc_ok = True
    except (nvrtc.NvrtcNotFoundError, nvrtc.NvrtcError) as e:
        print(f"NVRTC: not found: {e}")
    try:
        include_dir = find_include_dir()
        headers = sorted((include_dir / "humming_aot").rglob("*.cuh"))
        print(f"headers: {include_dir} ({_count(len(headers), 'header')} under humming_aot/)")
        headers_ok = True
    except FileNotFoundError as e:
        print(f"headers: missing: {e}")
        headers_ok = False
    use = cache.usage()
    held = f"{_count(use.entries, 'kernel')}, {_size(use.bytes)}" if use.exists else "not created yet"
    print(f"JIT cache: {use.root} ({held}; set HUMMING_AOT_CACHE_DIR to move it)")
    try:
        enabled = env.jit_enabled()
    except ValueError as e:
        print(f"JIT: {e}")
        enabled = False
    else:
        if not enabled:
            print("JIT: off (HUMMING_AOT_JIT=0): a kernel outside the catalog is an error naming the build command")
        elif nvrtc_ok and headers_ok:
            print("JIT: allowed (HUMMING_AOT_JIT=1) and ready: kernels outside the catalog are compiled and cached")
        else:
            print("JIT: allowed (HUMMING_AOT_JIT=1) but not ready: fix NVRTC / headers above, or every kernel "
                  "must come from the catalog")
    catalog = installed_catalog()
    print(_catalog_line(catalog))
    gpus, no_gpu = _gpus()
    if no_gpu:
        print(f"GPU: {no_gpu}")
    for index, name, major, minor in gpus:
        arch = serving_arch(catalog.archs if catalog is not None else [], major, minor)
        served = f"catalog arch {arch} serves it" if arch else "no catalog arch serves it"
        jit_archs = [a for a in archs_for_capability(major, minor) if a in supported_archs()]
        if not jit_archs:
            fallback = "humming_aot supports no arch of this GPU"
        elif enabled and nvrtc_ok and headers_ok:
            fallback = f"the JIT compiles missing kernels for {jit_archs[0]}"
        else:
            fallback = "no JIT fallback"
        print(f"GPU {index}: {name}, compute capability {major}.{minor}: {served}; {fallback}")
    return 0


_COMMANDS = {"build": _cmd_build, "list": _cmd_list, "inspect": _cmd_inspect, "info": _cmd_info,
             "doctor": _cmd_doctor}


def main(argv: list[str] | None = None) -> int:
    from humming_aot.aot.ninja import CompileError, FatbinTargetError
    from humming_aot.catalog import CatalogIntegrityError

    try:
        level = env.log_level()
    except ValueError as e:
        print(f"humming-aot: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=level, format="%(name)s: %(levelname)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (CompileError, FatbinTargetError, CatalogIntegrityError) as e:
        if level <= logging.DEBUG:
            raise
        print(f"humming-aot: error: {e}", file=sys.stderr)
        return EXIT_BUILD_FAILED
    except (ValueError, FileNotFoundError) as e:
        if level <= logging.DEBUG:
            raise
        print(f"humming-aot: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("humming-aot: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `humming-aot list | head`: stop quietly (Python docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
