"""The nvcc driver: the keys in units of a few kernels (plan_units), one .cu per unit, a
build.ninja, parallel nvcc with progress, and a check that each fatbin holds SASS for exactly the
arch its keys name.

Layout of a build directory::

    src/<unit>.cu            codegen.unit_source(keys), rewritten only when the text changes
    kernels/<unit>.fatbin    nvcc -fatbin output: SASS for the unit's arch only, no PTX
    build.ninja              one edge per unit; header dependencies come from nvcc -MD, so an
                             edited header rebuilds exactly the units that include it
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from humming_aot import codegen, env
from humming_aot.arch import nvcc_gencode
from humming_aot.catalog_data import find_include_dir  # noqa: F401  (the build's -I; tests reach it here)
from humming_aot.fatbin import (  # noqa: F401  (the check after each build; tests reach them here)
    FATBIN_MAGIC,
    KIND_ELF,
    KIND_PTX,
    FatbinEntry,
    FatbinTargetError,
    check_fatbin_target,
    elf_sm,
    read_fatbin,
)
from humming_aot.spec import GemmType, KernelKey

DEFAULT_CUDA_ROOTS = (Path("/usr/local/cuda"),)  # searched after PATH and $CUDA_HOME
NVCC_FLAGS = ("-fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr")
# How the fatbins' cubins are stored (--fatbin-compression of `humming-aot build`): "none" as nvcc
# writes them by default, or "size" (nvcc --compress-mode=size, CUDA 12.8+), about a quarter of the
# bytes (a sampled sm90a default catalog, 52-96 KB a kernel to 12-18 KB; deflated in a wheel, 91
# MB to 76 MB: log section 58), which the driver decompresses as it loads each kernel (H200: 140-240
# us more per kernel's first load, log section 59). "auto" (the default) stores with "size" the
# kernels of the grouped row-expert form (GemmType.GROUPED: the DeepGEMM-style per-row expert
# index, which nn.QuantizedMoE does not use; about 4.5 MB off the sm90a wheel, log section 74) and
# those of the weight formats outside PLAIN_W_DTYPES (the other small floats, 1-bit and 5-7-bit
# codes: about 2,650 of the sm90a catalog's other kernels, 18 % fewer deflated bytes each in a
# sample of 30, about 8 MB; log section 84), and the rest as "none", so the formats checkpoints
# ship load without the decompression. The sm90a catalog needs it to stay under 100 MB. With an
# nvcc older than 12.8 it compresses nothing.
FATBIN_COMPRESSION = ("none", "size", "auto")
# The weight formats whose kernels "auto" leaves uncompressed: GPTQ / AWQ / compressed-tensors
# integers of 2, 3, 4 and 8 bits (with or without zero points), FP8 (e4m3, e5m2), the FP4 of MXFP4
# and NVFP4 (e2m1) and the FP6 of MXFP6 (e2m3, e3m2).
PLAIN_W_DTYPES = frozenset({
    "int2", "int3", "int4", "int8", "uint2", "uint3", "uint4", "uint8",
    "float8e4m3", "float8e5m2", "float4e2m1", "float6e2m3", "float6e3m2",
})
_COMPRESS_MODE_SINCE = (12, 8)
# Kernels compiled by one nvcc run. Each run pays about 0.5-0.7 s before its first kernel (the
# host preprocessor and cicc's parse of cuda_runtime.h and our headers) of some 1.5-2.1 s a
# wgmma-ws kernel takes alone, so units of 8 take about a third off a catalog's nvcc time (8
# sm90a wgmma-ws keys on this project's build machine: 16.5 s one by one, 11.1 s as one unit;
# docs/performance/log.md section 86), while the units stay many more than a build's cores.
UNIT_KERNELS = 8
_STATUS_PREFIX = "@@humming_aot"  # NINJA_STATUS marker: "@@humming_aot <finished> <total>@@ "
_STATUS_RE = re.compile(r"^@@humming_aot (\d+) (\d+)@@ ?(.*)$")
_FAILED_RE = re.compile(r"kernels/(\S+?)\.fatbin")


class NvccNotFoundError(FileNotFoundError):
    """No nvcc to build with (a user-fixable setup problem)."""


class NinjaNotFoundError(FileNotFoundError):
    """No ninja executable."""


class CompileError(RuntimeError):
    """nvcc failed for one or more kernels; the message names each key and shows nvcc's output."""


# ---------------------------------------------------------------------------------------------
# Tools


def find_nvcc() -> Path:
    """HUMMING_AOT_NVCC, else nvcc on PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc."""
    override = env.nvcc_override()
    if override is not None:
        if override.is_file() and os.access(override, os.X_OK):
            return override
        raise NvccNotFoundError(f"HUMMING_AOT_NVCC={override} is not an executable file: point it at nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    for root in (env.cuda_home(), *DEFAULT_CUDA_ROOTS):
        if root is not None and (root / "bin" / "nvcc").is_file():
            return root / "bin" / "nvcc"
    raise NvccNotFoundError(
        "nvcc not found: install the CUDA toolkit (13.x for cu130 wheels, e.g. `apt install "
        "cuda-nvcc-13-0` from NVIDIA's repository), then put its bin/ on PATH or set "
        "HUMMING_AOT_NVCC=/path/to/nvcc"
    )


def find_ninja() -> Path:
    on_path = shutil.which("ninja")
    if on_path:
        return Path(on_path)
    try:
        import ninja  # the PyPI package ships the binary

        return Path(ninja.BIN_DIR) / "ninja"
    except ImportError:
        raise NinjaNotFoundError("ninja not found: `pip install ninja`") from None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NvccInfo:
    path: Path
    cuda_version: str  # "13.0"
    toolkit: str  # "Cuda compilation tools, release 13.0, V13.0.88"


def nvcc_info(nvcc: Path | None = None) -> NvccInfo:
    """The CUDA release of an nvcc, from `nvcc --version`."""
    nvcc = nvcc or find_nvcc()
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise NvccNotFoundError(f"{nvcc} --version failed ({e}): is it a working nvcc?") from None
    m = re.search(r"^(Cuda compilation tools, release (\d+\.\d+).*)$", out, re.MULTILINE)
    if not m:
        raise NvccNotFoundError(f"{nvcc} --version printed no 'Cuda compilation tools, release X.Y' line")
    return NvccInfo(path=nvcc, cuda_version=m.group(2), toolkit=m.group(1).strip())


# ---------------------------------------------------------------------------------------------
# build.ninja


def _ninja_value(text: str) -> str:
    return text.replace("$", "$$")


def _write_if_changed(path: Path, text: str) -> None:
    """Keep the mtime of an unchanged file so ninja does not rebuild it."""
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


@dataclasses.dataclass(frozen=True, slots=True)
class BuildUnit:
    """Kernels compiled together into one fatbin: one arch, one storage (key_compression)."""

    name: str
    keys: tuple[KernelKey, ...]

    @property
    def arch(self) -> str:
        return self.keys[0].arch


def plan_units(keys: list[KernelKey], *, size: int = UNIT_KERNELS) -> list[BuildUnit]:
    """The keys in units of about ``size`` kernels (at most 1.5 ``size``): grouped by arch and by
    how "auto" compression stores them (key_compression: so the units are the same under every
    compression choice, and one unit's kernels share their flags under each), in name order (a
    unit holds neighbours: one body and weight format, its tiles). A unit ends after a key whose
    name hashes to 0 modulo ``size``, or when full, so its bounds depend on the keys themselves,
    not on their positions: adding or removing a key changes (and rebuilds) only the unit it
    falls in, and now and then the next. A unit's name is its first key's and a digest of all of
    them."""
    if size < 1:
        raise ValueError(f"a build unit holds at least one kernel, not {size}")
    cap = max(1, size + size // 2)
    groups: dict[tuple[str, str], list[KernelKey]] = {}
    for key in sorted(set(keys)):
        groups.setdefault((key.arch, key_compression(key, "auto")), []).append(key)
    units = []
    for _, members in sorted(groups.items()):
        chunk: list[KernelKey] = []
        for key in members:
            chunk.append(key)
            ends = int.from_bytes(hashlib.sha256(key.name.encode()).digest()[:4], "little") % size == 0
            if ends or len(chunk) == cap or key is members[-1]:
                digest = hashlib.sha256("\n".join(k.name for k in chunk).encode()).hexdigest()[:12]
                units.append(BuildUnit(name=f"{chunk[0].name}.{len(chunk)}k-{digest}", keys=tuple(chunk)))
                chunk = []
    return units


def unit_fatbin_path(out_dir: Path, unit: BuildUnit) -> Path:
    return out_dir / "kernels" / f"{unit.name}.fatbin"


def helper_fatbin_path(out_dir: Path, name: str) -> Path:
    return out_dir / "helpers" / f"{name}.fatbin"


def compression_flags(compression: str, cuda_version: str) -> tuple[str, ...]:
    """nvcc's flags for a FATBIN_COMPRESSION choice, for the kernels it compresses; ValueError for
    an unknown one, or "size" with an nvcc older than CUDA 12.8 (no --compress-mode). "auto" gives
    the flags of the kernels key_compression picks, none below 12.8."""
    if compression not in FATBIN_COMPRESSION:
        raise ValueError(f"fatbin compression {compression!r}: choose one of {', '.join(FATBIN_COMPRESSION)}")
    if compression == "none":
        return ()
    major, minor = (int(part) for part in cuda_version.split(".")[:2])
    if (major, minor) < _COMPRESS_MODE_SINCE:
        if compression == "auto":
            return ()
        raise ValueError(f"fatbin compression {compression!r} needs nvcc's --compress-mode (CUDA 12.8 or later); "
                         f"this nvcc is CUDA {cuda_version}: build with --fatbin-compression none")
    return ("--compress-mode=size",)


def key_compression(key: KernelKey, compression: str) -> str:
    """How one kernel's fatbin is stored under a FATBIN_COMPRESSION choice: "none" or "size"."""
    if compression == "auto":
        plain = key.spec.gemm_type is not GemmType.GROUPED and key.spec.w_dtype in PLAIN_W_DTYPES
        return "none" if plain else "size"
    return compression


def write_build_files(units: list[BuildUnit], out_dir: Path, *, nvcc: Path, include_dir: Path,
                      helper_units: list[tuple[str, str]] = (), extra_flags: tuple[str, ...] = (),
                      compressed: frozenset[str] = frozenset()) -> Path:
    """Write src/<unit>.cu for each build unit (and each (unit, arch) of helper kernels,
    humming_aot.helper_kernels) and the build.ninja that compiles them (NVCC_FLAGS, then for the
    units whose keys are named in ``compressed``, extra_flags: compression_flags'); returns its path."""
    from humming_aot import helper_kernels

    (out_dir / "src").mkdir(parents=True, exist_ok=True)
    (out_dir / "kernels").mkdir(parents=True, exist_ok=True)
    if helper_units:
        (out_dir / "helpers").mkdir(parents=True, exist_ok=True)
    lines = [
        "# Generated by humming_aot.aot.ninja. Do not edit.",
        "ninja_required_version = 1.3",
        f"nvcc = {_ninja_value(shlex.quote(str(nvcc)))}",
        f"include_dir = {_ninja_value(shlex.quote(str(include_dir)))}",
        f"nvcc_flags = {' '.join(NVCC_FLAGS)}",
        "",
        "rule nvcc",
        "  command = $nvcc $nvcc_flags -I $include_dir $gencode -MD -MF $out.d -o $out $in",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = $name",
        "",
    ]
    for unit in units:
        squeezed = {key.name in compressed for key in unit.keys}
        if len(squeezed) != 1:
            raise ValueError(f"build unit {unit.name} mixes compressed and plain kernels: plan_units keeps them apart")
        _write_if_changed(out_dir / "src" / f"{unit.name}.cu", codegen.unit_source(list(unit.keys)))
        lines += [
            f"build kernels/{unit.name}.fatbin: nvcc src/{unit.name}.cu",
            f"  gencode = {' '.join(nvcc_gencode(unit.arch))}",
            f"  name = {unit.name}",
        ]
        if squeezed == {True} and extra_flags:  # (a build's own nvcc_flags: the others' commands stay as they were)
            lines.append(f"  nvcc_flags = {' '.join((*NVCC_FLAGS, *extra_flags))}")
    for unit, arch in sorted(helper_units):
        name = helper_kernels.unit_name(unit, arch)
        _write_if_changed(out_dir / "src" / f"{name}.cu", helper_kernels.unit_source(unit, arch))
        lines += [
            f"build helpers/{name}.fatbin: nvcc src/{name}.cu",
            f"  gencode = {' '.join(nvcc_gencode(arch))}",
            f"  name = {name}",
        ]
    path = out_dir / "build.ninja"
    _write_if_changed(path, "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Running ninja with progress


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Kernels done / total, elapsed and ETA: one rewritten line on a TTY, else a line every
    ``interval`` seconds (and at the first and last kernel)."""

    def __init__(self, stream: TextIO, *, interval: float = 10.0) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.interval = interval
        self.start = time.monotonic()
        self.done = self.total = 0
        self.last_name = ""
        self._last_print = 0.0
        self._dirty = False

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        eta = f"ETA {_clock(elapsed / self.done * (self.total - self.done))}" if self.done else "ETA --:--"
        width = len(str(self.total))
        return f"[{self.done:>{width}}/{self.total}] {_clock(elapsed)} elapsed, {eta}  {self.last_name}"

    def update(self, done: int, total: int, name: str) -> None:
        first = self.done == 0
        self.done, self.total, self.last_name = done, total, name
        if self.tty:
            self.tick()
        elif first or done == total or time.monotonic() - self._last_print >= self.interval:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._last_print = time.monotonic()

    def tick(self) -> None:
        """Refresh the TTY line (the elapsed time moves even while no kernel finishes)."""
        if self.tty and self.total:
            columns = shutil.get_terminal_size((100, 20)).columns
            self.stream.write("\r\x1b[K" + self.line()[: columns - 1])
            self.stream.flush()
            self._dirty = True

    def finish(self) -> None:
        if self._dirty:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty = False


def _parse_failures(lines: list[str]) -> list[tuple[str, str]]:
    """(kernel name, nvcc output) for each 'FAILED:' block of ninja's output."""
    failures = []
    current: tuple[str, list[str]] | None = None
    for line in lines:
        if line.startswith("FAILED:"):
            if current:
                failures.append((current[0], "\n".join(current[1][1:])))
            m = _FAILED_RE.search(line)
            current = (m.group(1) if m else line[len("FAILED:"):].strip(), [])
        elif _STATUS_RE.match(line) or line.startswith("ninja: "):
            if current:
                failures.append((current[0], "\n".join(current[1][1:])))  # [0] is the command
                current = None
        elif current:
            current[1].append(line)
    if current:
        failures.append((current[0], "\n".join(current[1][1:])))
    return failures


def run_ninja(out_dir: Path, *, jobs: int, stream: TextIO | None = None,
              units: dict[str, tuple[str, ...]] | None = None) -> int:
    """Run ninja in ``out_dir`` with progress on ``stream``; returns how many fatbins it compiled
    (0: all up to date). CompileError names each failed unit with nvcc's output, and the kernels
    ``units`` (unit name -> key names) says it holds."""
    stream = stream or sys.stderr
    progress = Progress(stream)
    proc = subprocess.Popen(
        [str(find_ninja()), "-C", str(out_dir), "-j", str(max(1, jobs))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env.subprocess_env(NINJA_STATUS=f"{_STATUS_PREFIX} %f %t@@ "),
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for raw in proc.stdout:
            lines.put(raw.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    output: list[str] = []
    try:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                progress.tick()
                continue
            if line is None:
                break
            output.append(line)
            m = _STATUS_RE.match(line)
            if m:
                progress.update(int(m.group(1)), int(m.group(2)), m.group(3))
    finally:
        rc = proc.wait()
        progress.finish()
    if rc != 0:
        failures = _parse_failures(output)
        if not failures:
            raise CompileError(f"ninja failed (exit {rc}) in {out_dir}:\n" + "\n".join(output[-40:]))
        def held(name: str) -> str:
            keys = (units or {}).get(name)
            return f" (the unit of {', '.join(keys)})" if keys else ""

        text = "\n\n".join(f"nvcc failed for {name}{held(name)}:\n{log.strip()}" for name, log in failures)
        raise CompileError(f"{text}\n\n(build directory: {out_dir}; rerun `ninja -C {out_dir}` to see the commands)")
    return progress.done


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompileResult:
    out_dir: Path
    fatbins: dict[str, Path]  # key name -> kernels/<unit>.fatbin (its unit's; several keys share one)
    nvcc: NvccInfo
    seconds: float
    helpers: dict[str, tuple[str, str, Path]] = dataclasses.field(default_factory=dict)
    # helper unit name (helper_kernels.unit_name) -> (unit, arch, helpers/<name>.fatbin)


def kernel_build_seconds(out_dir: Path) -> dict[str, float]:
    """Seconds nvcc took for each fatbin under ``out_dir`` (build unit name -> seconds), from ninja's own
    log (the newest entry per output; kernels built by an earlier run keep that run's time)."""
    log = Path(out_dir) / ".ninja_log"
    seconds: dict[str, float] = {}
    if not log.is_file():
        return seconds
    for line in log.read_text().splitlines():
        fields = line.split("\t")
        if line.startswith("#") or len(fields) < 4 or not fields[3].endswith(".fatbin"):
            continue
        try:
            start_ms, end_ms = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        seconds[Path(fields[3]).stem] = (end_ms - start_ms) / 1000.0
    return seconds


def compile_keys(
    keys: list[KernelKey],
    out_dir: Path,
    *,
    jobs: int | None = None,
    nvcc: Path | None = None,
    include_dir: Path | None = None,
    stream: TextIO | None = None,
    helper_units: list[tuple[str, str]] = (),
    compression: str = "auto",
) -> CompileResult:
    """Generate, compile and check one fatbin per build unit of the keys (plan_units), and one per
    (unit, arch) of ``helper_units``, under ``out_dir`` (incremental; a changed compression rebuilds
    the fatbins whose storage it changes: ninja keeps each output's command). ``compression``
    (FATBIN_COMPRESSION) picks each kernel's storage by key_compression; the helper kernels are
    stored as nvcc writes them."""
    from humming_aot import helper_kernels

    stream = stream or sys.stderr
    info = nvcc_info(nvcc)
    flags = compression_flags(compression, info.cuda_version)
    include_dir = include_dir or find_include_dir()
    jobs = jobs or os.cpu_count() or 1
    out_dir = Path(out_dir).resolve()
    start = time.monotonic()
    compressed = frozenset(key.name for key in keys if key_compression(key, compression) == "size")
    units = plan_units(keys)
    write_build_files(units, out_dir, nvcc=info.path, include_dir=include_dir, helper_units=helper_units,
                      extra_flags=flags, compressed=compressed)
    noun = "kernel" if len(keys) == 1 else "kernels"
    stream.write(f"compiling {len(keys)} {noun} in {len(units)} units with nvcc {info.cuda_version} (-j {jobs}) "
                 f"in {out_dir}\n")
    stream.flush()
    contents = {unit.name: tuple(key.name for key in unit.keys) for unit in units}
    if run_ninja(out_dir, jobs=jobs, stream=stream, units=contents) == 0:
        stream.write("all kernels are up to date\n")
    fatbins = {}
    for unit in units:
        path = unit_fatbin_path(out_dir, unit)
        check_fatbin_target(path.read_bytes(), unit.arch, what=str(path))
        for key in unit.keys:
            fatbins[key.name] = path
    helpers = {}
    for unit, arch in sorted(helper_units):
        name = helper_kernels.unit_name(unit, arch)
        path = helper_fatbin_path(out_dir, name)
        check_fatbin_target(path.read_bytes(), arch, what=str(path))
        helpers[name] = (unit, arch, path)
    return CompileResult(out_dir=out_dir, fatbins=fatbins, nvcc=info, seconds=time.monotonic() - start,
                         helpers=helpers)


