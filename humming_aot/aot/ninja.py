"""The nvcc driver: one .cu per KernelKey, a build.ninja, parallel nvcc with progress, and a check
that each fatbin holds SASS for exactly the arch its key names.

Layout of a build directory::

    src/<name>.cu            codegen.kernel_source(key), rewritten only when the text changes
    kernels/<name>.fatbin    nvcc -fatbin output: SASS for key.arch only, no PTX
    build.ninja              one edge per key; header dependencies come from nvcc -MD, so an
                             edited header rebuilds exactly the kernels that include it
"""
from __future__ import annotations

import dataclasses
import os
import queue
import re
import shlex
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from humming_aot import env
from humming_aot.arch import nvcc_gencode
from humming_aot.aot import codegen
from humming_aot.spec import KernelKey, parse_arch

DEFAULT_CUDA_ROOTS = (Path("/usr/local/cuda"),)  # searched after PATH and $CUDA_HOME
NVCC_FLAGS = ("-fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr")
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_STATUS_PREFIX = "@@humming_aot"  # NINJA_STATUS marker: "@@humming_aot <finished> <total>@@ "
_STATUS_RE = re.compile(r"^@@humming_aot (\d+) (\d+)@@ ?(.*)$")
_FAILED_RE = re.compile(r"kernels/(\S+?)\.fatbin")


class NvccNotFoundError(FileNotFoundError):
    """No nvcc to build with (a user-fixable setup problem)."""


class NinjaNotFoundError(FileNotFoundError):
    """No ninja executable."""


class CompileError(RuntimeError):
    """nvcc failed for one or more kernels; the message names each key and shows nvcc's output."""


class FatbinTargetError(RuntimeError):
    """A fatbin does not hold exactly the SASS its key asks for."""


# ---------------------------------------------------------------------------------------------
# Tools


def find_include_dir() -> Path:
    """The directory to pass as -I: it holds humming_aot/kernel/... .

    A source checkout's csrc/include comes first (the headers being edited), then the copy an
    installed wheel carries in humming_aot/include.
    """
    for candidate in (_PACKAGE_DIR.parent / "csrc" / "include", _PACKAGE_DIR / "include"):
        if (candidate / "humming_aot").is_dir():
            return candidate
    raise FileNotFoundError(
        f"humming_aot's CUDA headers are missing: neither {_PACKAGE_DIR.parent / 'csrc' / 'include'} "
        f"nor {_PACKAGE_DIR / 'include'} has a humming_aot/ folder; reinstall the package"
    )


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


def fatbin_path(out_dir: Path, key: KernelKey) -> Path:
    return out_dir / "kernels" / f"{key.name}.fatbin"


def write_build_files(keys: list[KernelKey], out_dir: Path, *, nvcc: Path, include_dir: Path) -> Path:
    """Write src/<name>.cu for each key and the build.ninja that compiles them; returns its path."""
    (out_dir / "src").mkdir(parents=True, exist_ok=True)
    (out_dir / "kernels").mkdir(parents=True, exist_ok=True)
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
    for key in sorted(keys):
        _write_if_changed(out_dir / "src" / f"{key.name}.cu", codegen.kernel_source(key))
        lines += [
            f"build kernels/{key.name}.fatbin: nvcc src/{key.name}.cu",
            f"  gencode = {' '.join(nvcc_gencode(key.arch))}",
            f"  name = {key.name}",
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


def run_ninja(out_dir: Path, *, jobs: int, stream: TextIO | None = None) -> int:
    """Run ninja in ``out_dir`` with progress on ``stream``; returns how many kernels it compiled
    (0: all up to date). CompileError names each failed kernel with nvcc's output."""
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
        text = "\n\n".join(f"nvcc failed for {name}:\n{log.strip()}" for name, log in failures)
        raise CompileError(f"{text}\n\n(build directory: {out_dir}; rerun `ninja -C {out_dir}` to see the commands)")
    return progress.done


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompileResult:
    out_dir: Path
    fatbins: dict[str, Path]  # key name -> kernels/<name>.fatbin
    nvcc: NvccInfo
    seconds: float


def kernel_build_seconds(out_dir: Path) -> dict[str, float]:
    """Seconds nvcc took for each kernel under ``out_dir`` (key name -> seconds), from ninja's own
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
) -> CompileResult:
    """Generate, compile and check one fatbin per key under ``out_dir`` (incremental)."""
    stream = stream or sys.stderr
    info = nvcc_info(nvcc)
    include_dir = include_dir or find_include_dir()
    jobs = jobs or os.cpu_count() or 1
    out_dir = Path(out_dir).resolve()
    start = time.monotonic()
    write_build_files(keys, out_dir, nvcc=info.path, include_dir=include_dir)
    noun = "kernel" if len(keys) == 1 else "kernels"
    stream.write(f"compiling {len(keys)} {noun} with nvcc {info.cuda_version} (-j {jobs}) in {out_dir}\n")
    stream.flush()
    if run_ninja(out_dir, jobs=jobs, stream=stream) == 0:
        stream.write("all kernels are up to date\n")
    fatbins = {}
    for key in sorted(keys):
        path = fatbin_path(out_dir, key)
        check_fatbin_target(path.read_bytes(), key.arch, what=str(path))
        fatbins[key.name] = path
    return CompileResult(out_dir=out_dir, fatbins=fatbins, nvcc=info, seconds=time.monotonic() - start)


# ---------------------------------------------------------------------------------------------
# Fatbin / ELF reader
#
# A fatbin is one or more containers: a 16-byte header (u32 magic 0xBA55ED50, u16 version,
# u16 header size, u64 size of the entries that follow), then entries, each with its own header
# (u16 kind: 1 = PTX, 2 = ELF cubin; u32 header size; u64 payload size; ...; u32 sm number;
# ...; u64 flags) and its payload. NOTE: the flag bits for arch-specific (0x100000, 'a') and
# family (0x200000, 'f') targets and for compression (0x2000, 0x8000) are what nvcc 13.0 writes;
# they are not documented. The cubin's ELF header cannot tell sm_120 from sm_120a at all.

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
_FLAG_ARCH_SPECIFIC, _FLAG_FAMILY = 0x100000, 0x200000
_FLAG_COMPRESSED = 0x2000 | 0x8000
_CONTAINER = struct.Struct("<IHHQ")
# kind, _, header size, payload size, compressed size, _, minor, major, sm, name offset, name length, flags
_ENTRY = struct.Struct("<HHIQIIHHIIIQ")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FatbinEntry:
    kind: int  # KIND_PTX or KIND_ELF
    sm: int  # 90 for sm_90 / sm_90a
    suffix: str  # "", "a" or "f", from the entry flags
    compressed: bool
    elf_sm: int | None  # the sm number in the cubin's ELF e_flags (None: PTX or compressed)

    @property
    def arch(self) -> str:
        return f"sm{self.sm}{self.suffix}"


def elf_sm(elf: bytes) -> int:
    """The sm number a CUDA cubin (ELF64, OS ABI 0x41) is built for, from e_flags: bits 0-7 up to
    ELF ABI version 7, bits 8-15 from ABI version 8 (CUDA 12.8+ toolkits)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise FatbinTargetError("payload is not a 64-bit ELF file")
    if elf[7] != 0x41:
        raise FatbinTargetError(f"ELF OS ABI is {elf[7]:#x}, not CUDA's 0x41")
    (e_flags,) = struct.unpack_from("<I", elf, 0x30)
    return (e_flags >> 8) & 0xFF if elf[8] >= 8 else e_flags & 0xFF


def read_fatbin(data: bytes) -> list[FatbinEntry]:
    """Every entry of a fatbin image; FatbinTargetError when the bytes are not one."""
    entries = []
    offset = 0
    while offset + _CONTAINER.size <= len(data):
        magic, _version, header_size, size = _CONTAINER.unpack_from(data, offset)
        if magic != FATBIN_MAGIC:
            if entries and not any(data[offset:]):  # trailing padding
                break
            raise FatbinTargetError(f"no fatbin container at byte {offset} (magic {magic:#x})")
        pos, end = offset + header_size, offset + header_size + size
        if end > len(data):
            raise FatbinTargetError(f"fatbin container at byte {offset} runs past the end of the file")
        while pos < end:
            fields = _ENTRY.unpack_from(data, pos)
            kind, entry_header, payload_size, compressed_size, sm, flags = (fields[i] for i in (0, 2, 3, 4, 8, 11))
            payload = data[pos + entry_header: pos + entry_header + payload_size]
            compressed = bool(flags & _FLAG_COMPRESSED) or compressed_size != 0
            suffix = "a" if flags & _FLAG_ARCH_SPECIFIC else "f" if flags & _FLAG_FAMILY else ""
            entries.append(FatbinEntry(
                kind=kind, sm=sm, suffix=suffix, compressed=compressed,
                elf_sm=elf_sm(payload) if kind == KIND_ELF and not compressed else None,
            ))
            pos += entry_header + payload_size
        offset = end
    if not entries:
        raise FatbinTargetError("the file holds no fatbin entries")
    return entries


def check_fatbin_target(data: bytes, arch: str, *, what: str = "fatbin") -> None:
    """FatbinTargetError unless ``data`` holds exactly one SASS cubin, for ``arch``, and no PTX."""
    number, suffix = parse_arch(arch)
    try:
        entries = read_fatbin(data)
    except (FatbinTargetError, struct.error) as e:
        raise FatbinTargetError(f"{what}: not a readable fatbin ({e})") from None
    found = ", ".join(f"{'PTX' if e.kind == KIND_PTX else 'SASS'} {e.arch}" for e in entries)
    problems = []
    if len(entries) != 1 or entries[0].kind != KIND_ELF:
        problems.append("expected exactly one SASS entry and no PTX")
    for e in entries:
        if e.kind == KIND_ELF and (e.sm != number or e.suffix != suffix):
            problems.append(f"entry is for {e.arch}")
        if e.elf_sm is not None and e.elf_sm != number:
            problems.append(f"its cubin's ELF header says sm_{e.elf_sm}")
    if problems:
        raise FatbinTargetError(f"{what}: expected SASS for {arch} only, found {found}: {'; '.join(problems)}")
