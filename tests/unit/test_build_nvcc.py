"""The nvcc/ninja driver and the fatbin reader.

- The driver tests compile against a stand-in kernel header written to a temp dir (seconds per
  kernel): progress, incremental rebuilds, header dependencies, failure reports, determinism.
- The `slow` test compiles the smoke catalog with the real header for sm80, sm89 and sm90a and
  checks every fatbin's target. It fails (never skips) when the real header is missing.
"""
from __future__ import annotations

import io
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from humming_aot import codegen
from humming_aot.aot import ninja as driver
from humming_aot.enumerate import enumerate_keys
from humming_aot.spec import GemmType, KernelKey, MmaKind, ZeroPoint, code_bits, parse_arch
from humming_aot.testing.nvcc import needs_nvcc

REPO = Path(__file__).resolve().parents[2]
REAL_HEADER = REPO / "csrc" / "include" / "humming_aot" / "kernel" / "dense_mma_sync.cuh"
H100_SMEM_PER_SM = 233472  # 228 KiB of shared memory per SM on H100 / H200


_STAND_IN = """\
#pragma once
// Stand-in for humming_aot/kernel/dense_mma_sync.cuh: the names codegen uses, a trivial body.
namespace humming_aot::numerics {
struct Float16 {};
struct BFloat16 {};
enum class ZeroPointKind { kImplicit, kInteger };
template <int kBits_> struct IntWeights { static constexpr int kBits = kBits_; };
template <int kExp, int kMan> struct FloatWeights { static constexpr int kBits = 1 + kExp + kMan; };
}  // namespace humming_aot::numerics
namespace humming_aot::kernel {
inline constexpr unsigned kParamsVersion = PARAMS_VERSION;
inline constexpr unsigned kMetadataMagic = 0x544F4148u;
struct GemmParams { int* out; int m; };
struct KernelMetadata {
  unsigned magic, params_version, params_bytes, threads, smem_bytes, block_m, block_n, block_k;
  char name[224];
};
template <class T, class Weights, numerics::ZeroPointKind kZp, int kBlockM, int kBlockN, int kBlockK, int kWarpsM,
          int kWarpsN, int kWarpsK, int kStages>
struct DenseMmaSync {
  static constexpr int kBits = Weights::kBits;
  FAILURE_HOOK
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN * kWarpsK;
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr bool kScalesInFp32 = kBlockM == 8;  // the smoke keys' integer codes
  static constexpr int kScaleRows = kZp == numerics::ZeroPointKind::kInteger ? 2 : 1;
  static constexpr int kSmemBytes =
      kStages * (kBlockM * kBlockK * 2 + kBlockN * kBlockK * kBits / 8 + kScaleRows * (kBlockK / 16) * kBlockN * 2);
  __device__ static void run(const GemmParams& p) {
    if (threadIdx.x == 0) p.out[blockIdx.x] = kBits * p.m + VERSION;
  }
};
}  // namespace humming_aot::kernel
"""


def write_stand_in(include_dir: Path, *, fail_bits: int | None = None, version: int = 0) -> Path:
    header = include_dir / "humming_aot" / "kernel" / "dense_mma_sync.cuh"
    header.parent.mkdir(parents=True, exist_ok=True)
    hook = f'static_assert(kBits != {fail_bits}, "stand-in failure for {fail_bits}-bit weights");' if fail_bits else ""
    text = _STAND_IN.replace("PARAMS_VERSION", str(codegen.PARAMS_VERSION))
    header.write_text(text.replace("FAILURE_HOOK", hook).replace("VERSION", str(version)))
    return include_dir


def smoke_keys(archs: list[str]) -> list[KernelKey]:
    return enumerate_keys("smoke", archs)


def int8_key(arch: str) -> KernelKey:
    return KernelKey.from_name(smoke_keys([arch])[0].name.replace("w-s4", "w-s8"))


# --- driver with the stand-in header -----------------------------------------------------------


@needs_nvcc
def test_driver_compiles_each_key_for_its_arch(tmp_path):
    include = write_stand_in(tmp_path / "include")
    keys = smoke_keys(["sm80", "sm89", "sm90a", "sm120"])
    log = io.StringIO()
    result = driver.compile_keys(keys, tmp_path / "out", jobs=2, include_dir=include, stream=log)
    assert sorted(result.fatbins) == [k.name for k in keys]
    for key in keys:
        number, suffix = parse_arch(key.arch)
        (entry,) = driver.read_fatbin(result.fatbins[key.name].read_bytes())
        assert (entry.kind, entry.sm, entry.suffix, entry.elf_sm) == (driver.KIND_ELF, number, suffix, number)
        assert (tmp_path / "out" / "src" / f"{result.fatbins[key.name].stem}.cu").is_file()
    text = log.getvalue()
    assert "compiling 4 kernels in 4 units with nvcc" in text  # (one arch a unit)
    assert "[4/4]" in text and "ETA" in text
    assert result.nvcc.toolkit.startswith("Cuda compilation tools, release ")


@needs_nvcc
def test_driver_is_incremental_and_follows_headers(tmp_path):
    include = write_stand_in(tmp_path / "include")
    keys = smoke_keys(["sm80"])
    out = tmp_path / "out"
    first = driver.compile_keys(keys, out, jobs=1, include_dir=include, stream=io.StringIO())
    fatbin = first.fatbins[keys[0].name]
    stamp = fatbin.stat().st_mtime_ns
    log = io.StringIO()
    driver.compile_keys(keys, out, jobs=1, include_dir=include, stream=log)
    assert fatbin.stat().st_mtime_ns == stamp
    assert "[1/1]" not in log.getvalue() and "all kernels are up to date" in log.getvalue()
    old_bytes = fatbin.read_bytes()
    write_stand_in(include, version=7)  # an edited header rebuilds the kernels that include it
    log = io.StringIO()
    driver.compile_keys(keys, out, jobs=1, include_dir=include, stream=log)
    assert "[1/1]" in log.getvalue()
    assert fatbin.read_bytes() != old_bytes


@needs_nvcc
def test_driver_output_is_deterministic(tmp_path):
    include = write_stand_in(tmp_path / "include")
    keys = smoke_keys(["sm90a"])
    a = driver.compile_keys(keys, tmp_path / "a", jobs=1, include_dir=include, stream=io.StringIO())
    b = driver.compile_keys(keys, tmp_path / "b", jobs=1, include_dir=include, stream=io.StringIO())
    name = keys[0].name
    assert a.fatbins[name].read_bytes() == b.fatbins[name].read_bytes()
    assert (tmp_path / "a" / "build.ninja").read_text().replace(str(tmp_path / "a"), "") == \
        (tmp_path / "b" / "build.ninja").read_text().replace(str(tmp_path / "b"), "")


@needs_nvcc
def test_failure_names_the_key_and_shows_nvcc_output(tmp_path):
    include = write_stand_in(tmp_path / "include", fail_bits=8)
    good, bad = smoke_keys(["sm80"])[0], int8_key("sm80")
    with pytest.raises(driver.CompileError) as info:
        driver.compile_keys([good, bad], tmp_path / "out", jobs=2, include_dir=include, stream=io.StringIO())
    message = str(info.value)
    unit = driver.plan_units([good, bad])[0].name  # (one unit holds both)
    assert f"nvcc failed for {unit} (the unit of {good.name}, {bad.name}):" in message
    assert "stand-in failure for 8-bit weights" in message


def test_missing_nvcc_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("HUMMING_AOT_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(driver, "DEFAULT_CUDA_ROOTS", (tmp_path,))
    with pytest.raises(driver.NvccNotFoundError, match="HUMMING_AOT_NVCC=/path/to/nvcc"):
        driver.find_nvcc()
    monkeypatch.setenv("HUMMING_AOT_NVCC", str(tmp_path / "nvcc"))
    with pytest.raises(driver.NvccNotFoundError, match="is not an executable file"):
        driver.find_nvcc()


@needs_nvcc
def test_check_rejects_ptx_and_other_archs(tmp_path):
    include = write_stand_in(tmp_path / "include")
    key = smoke_keys(["sm80"])[0]
    (unit,) = driver.plan_units([key])
    driver.write_build_files([unit], tmp_path, nvcc=driver.find_nvcc(), include_dir=include)
    source = tmp_path / "src" / f"{unit.name}.cu"
    out = tmp_path / "ptx.fatbin"
    subprocess.run([str(driver.find_nvcc()), *driver.NVCC_FLAGS, "-I", str(include),
                    "-gencode=arch=compute_80,code=[sm_80,compute_80]", "-o", str(out), str(source)], check=True)
    data = out.read_bytes()
    assert [e.kind for e in driver.read_fatbin(data)] == [driver.KIND_ELF, driver.KIND_PTX]
    with pytest.raises(driver.FatbinTargetError, match="found SASS sm80, PTX sm80"):
        driver.check_fatbin_target(data, "sm80")
    subprocess.run([str(driver.find_nvcc()), *driver.NVCC_FLAGS, "-I", str(include),
                    "-gencode=arch=compute_90,code=sm_90", "-o", str(out), str(source)], check=True)
    driver.check_fatbin_target(out.read_bytes(), "sm90")
    with pytest.raises(driver.FatbinTargetError, match="expected SASS for sm90a only, found SASS sm90"):
        driver.check_fatbin_target(out.read_bytes(), "sm90a")


# --- progress and ninja output parsing ---------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_rewrites_one_line_on_a_tty():
    stream = _Tty()
    progress = driver.Progress(stream)
    progress.update(1, 3, "gemm_a")
    progress.update(2, 3, "gemm_b")
    progress.finish()
    text = stream.getvalue()
    assert text.count("\r\x1b[K") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "[2/3]" in text and "ETA" in text


def test_progress_prints_periodic_lines_otherwise():
    stream = io.StringIO()
    progress = driver.Progress(stream, interval=3600)
    for done in range(1, 11):
        progress.update(done, 10, f"gemm_{done}")
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == ["[ 1/10", "[10/10"]  # first and last only


def test_parse_failures():
    output = [
        "@@humming_aot 1 3@@ gemm_ok",
        "@@humming_aot 2 3@@ gemm_bad",
        "FAILED: [code=2] kernels/gemm_bad.fatbin ",
        "/usr/local/bin/nvcc -fatbin ... -o kernels/gemm_bad.fatbin src/gemm_bad.cu",
        "src/gemm_bad.cu(3): error: boom",
        "1 error detected",
        "@@humming_aot 3 3@@ gemm_bad2",
        "FAILED: kernels/gemm_bad2.fatbin",
        "nvcc ...",
        "fatal: also boom",
        "ninja: build stopped: subcommand failed.",
    ]
    assert driver._parse_failures(output) == [
        ("gemm_bad", "src/gemm_bad.cu(3): error: boom\n1 error detected"),
        ("gemm_bad2", "fatal: also boom"),
    ]


# --- fatbin reader on synthetic bytes ---------------------------------------------------------


def _synthetic_fatbin(sm: int, *, flags: int = 0x11, elf_sm: int | None = None, kind: int = 2) -> bytes:
    elf = bytearray(64)
    elf[:4] = b"\x7fELF"
    elf[4], elf[7], elf[8] = 2, 0x41, 8
    struct.pack_into("<I", elf, 0x30, 0x6000004 | ((elf_sm or sm) << 8))
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(elf), 0, 0, 8, 1, sm, 0, 0, flags, 0, 0)
    entry = header + bytes(elf)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entry)) + entry


def test_reader_on_synthetic_fatbins():
    (entry,) = driver.read_fatbin(_synthetic_fatbin(90, flags=0x100011))
    assert entry.arch == "sm90a" and entry.elf_sm == 90
    driver.check_fatbin_target(_synthetic_fatbin(90, flags=0x100011), "sm90a")
    driver.check_fatbin_target(_synthetic_fatbin(120, flags=0x200011), "sm120f")
    with pytest.raises(driver.FatbinTargetError, match="ELF header says sm_86"):
        driver.check_fatbin_target(_synthetic_fatbin(89, elf_sm=86), "sm89")
    with pytest.raises(driver.FatbinTargetError, match="not a readable fatbin"):
        driver.check_fatbin_target(b"\x7fELF" + bytes(60), "sm80")
    with pytest.raises(driver.FatbinTargetError, match="not a readable fatbin"):
        driver.check_fatbin_target(_synthetic_fatbin(80)[:40], "sm80")


def test_elf_sm_reads_both_abi_versions():
    elf = bytearray(64)
    elf[:4], elf[4], elf[7] = b"\x7fELF", 2, 0x41
    elf[8] = 7
    struct.pack_into("<I", elf, 0x30, 0x500550)  # ABI 7: sm in bits 0-7
    assert driver.elf_sm(bytes(elf)) == 0x50
    elf[8] = 8
    struct.pack_into("<I", elf, 0x30, 0x6005A04)  # ABI 8: sm in bits 8-15
    assert driver.elf_sm(bytes(elf)) == 90


# --- the real kernel header --------------------------------------------------------------------


@pytest.mark.slow
def test_smoke_catalog_compiles_for_sm80_sm89_sm90a(tmp_path):
    assert REAL_HEADER.is_file(), f"{REAL_HEADER} does not exist yet: the smoke catalog cannot compile"
    keys = smoke_keys(["sm80", "sm89", "sm90a"])
    assert len(keys) == 3
    result = driver.compile_keys(keys, tmp_path, jobs=2, stream=io.StringIO())
    cuobjdump = shutil.which("cuobjdump")
    for key in keys:
        data = result.fatbins[key.name].read_bytes()
        number, suffix = parse_arch(key.arch)
        (entry,) = driver.read_fatbin(data)
        assert (entry.kind, entry.sm, entry.suffix, entry.compressed) == (driver.KIND_ELF, number, suffix, False)
        assert entry.elf_sm == number
        # the kernel is its own symbol, and it describes itself through its metadata constant
        assert key.name.encode() in data and key.metadata_symbol.encode() in data
        if cuobjdump:
            listing = subprocess.run([cuobjdump, "--list-elf", str(result.fatbins[key.name])],
                                     capture_output=True, text=True, check=True).stdout
            assert f"sm_{number}{suffix}" in listing


@pytest.mark.slow
@needs_nvcc
def test_turing_and_hopper_bodies_compile_with_the_real_headers(tmp_path):
    """SM75 (float16 on m16n8k8, synchronous copies), every weight width's unfolding, the float
    dequantizer (placed codes, sign-magnitude codes), float zero points and the wgmma-ws body: one
    default-catalog kernel each, compiled by nvcc into an sm_75 / sm_90a fatbin."""
    default = {key.name: key for key in enumerate_keys("default", ["sm75", "sm90a"])}
    names = [
        "gemm_dense_sm75_mma_a-f16_w-s3-g-f16_o-f16_16x128x64_w1x2x2_s3",
        "gemm_dense_sm75_mma_a-f16_w-u6-g-f16-zpi_o-f16_64x128x64_w1x2_s2",
        "gemm_dense_sm75_mma_a-f16_w-e0m3-g-f16_o-f16_16x128x64_w1x2x2_s3",
        "gemm_dense_sm90a_wgmma-ws_a-bf16_w-u5-g-bf16-zpi_o-bf16_64x128x64_w1x4_s6",
        "gemm_dense_sm90a_wgmma-ws_a-bf16_w-e3m2-g-bf16_o-bf16_64x128x64_w1x4_s6",
        "gemm_dense_sm90a_mma-sw_a-f16_w-e2m1-g-f16_o-f16_16x64x256_w1x1x4_s2",
        "gemm_dense_sm90a_wgmma-ws_a-f16_w-e2m1-g-f16_o-f16_32x128x64_w1x4_s8",
        "gemm_dense_sm90a_wgmma-ws_a-bf16_w-u8-g-bf16-zpf_o-bf16_128x256x64_w1x8_s4",
    ]
    keys = [default[name] for name in names]  # KeyError: the default catalog lost one of them
    # the 16-token swapped tile with 8 warps (no table row): its generated source static_asserts
    # the host's shared-memory size and numerics flags against the C++
    keys.append(KernelKey.from_name("gemm_dense_sm90a_mma-sw_a-bf16_w-u4-g-bf16-zpi_o-bf16_16x128x256_w1x2x4_s2"))
    # the grouped masked schedule around an 8-row and a 16-row mma.sync body (no catalog holds one yet)
    keys += [KernelKey.from_name("gemm_masked_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2"),
             KernelKey.from_name("gemm_masked_sm90a_mma_a-bf16_w-u4-g-bf16-zpi_o-bf16_16x128x256_w1x2x4_s2"),
             KernelKey.from_name("gemm_grouped_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2"),
             KernelKey.from_name("gemm_grouped_sm90_mma_a-bf16_w-e2m1-g-bf16_o-bf16_64x128x64_w1x2_s6"),
             # and around the warp-specialized TMA body (one and two consumer warpgroups)
             KernelKey.from_name("gemm_masked_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_64x128x64_w1x4_s4"),
             KernelKey.from_name("gemm_masked_sm90a_wgmma-ws_a-bf16_w-u4-g-bf16-zpi_o-bf16_128x128x64_w1x8_s4")]
    result = driver.compile_keys(keys, tmp_path, jobs=2, stream=io.StringIO())
    for key in keys:
        (entry,) = driver.read_fatbin(result.fatbins[key.name].read_bytes())
        number, suffix = parse_arch(key.arch)
        # the default compression (auto) stores the grouped row-expert kernels and the uncommon
        # formats' (here u5, u6, e0m3) compressed: no ELF to read
        compressed = key.spec.gemm_type is GemmType.GROUPED or key.spec.w_dtype not in driver.PLAIN_W_DTYPES
        assert (entry.kind, entry.sm, entry.suffix, entry.compressed) == (driver.KIND_ELF, number, suffix, compressed)
        assert entry.elf_sm == (None if compressed else number)


def test_kernel_build_seconds_reads_the_newest_ninja_log_entry(tmp_path):
    (tmp_path / ".ninja_log").write_text(
        "# ninja log v5\n"
        "0\t1500\t0\tkernels/a.fatbin\tdeadbeef\n"
        "10\t20\t0\tbuild.ninja\tcafe\n"
        "2000\t2250\t0\tkernels/a.fatbin\tdeadbeef\n"
        "0\t3000\t0\tkernels/b.fatbin\tfeed\n"
        "garbage line\n"
    )
    assert driver.kernel_build_seconds(tmp_path) == {"a": 0.25, "b": 3.0}
    assert driver.kernel_build_seconds(tmp_path / "missing") == {}


def _ptxas_report(key: KernelKey, directory: Path) -> str:
    """ptxas -v's report (registers, spills, shared memory) of key's generated source, built as the
    catalog builds it but into a cubin."""
    source = directory / f"{key.symbol}.cu"
    source.write_text(codegen.kernel_source(key))
    flags = ["-cubin" if flag == "-fatbin" else flag for flag in driver.NVCC_FLAGS]
    result = subprocess.run(
        [str(driver.find_nvcc()), *flags, "-Xptxas", "-v", "-I", str(driver.find_include_dir()),
         *driver.nvcc_gencode(key.arch), "-o", str(directory / f"{key.symbol}.cubin"), str(source)],
        capture_output=True, text=True, check=True,
    )
    return result.stdout + result.stderr


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("m,block_m", [(1, 8), (16, 16), (32, 32)])
def test_small_m_tiles_fit_their_ctas_per_sm_without_spills(tmp_path, m, block_m):
    """The sm90a table's 8-row (swapped, scales applied to fp32 sums for integer codes), 16-row
    (swapped, mma-sw) and 32-row tiles (mma-sw on few output tiles, else the TMA body's 32-token
    tile): for every code width and the heaviest dequantizers, in each tile the
    table picks for that width with groups of 128 (few output tiles, many output tiles, and a K
    that only 128-wide stages divide; 1- and 2-bit codes get 512-wide 8-row stages, with the run
    offset and its one-token path), ptxas must keep within the registers that __launch_bounds__
    allows (128 for 8 warps: two CTAs per SM, which split-K is sized for) without spilling, and
    two CTAs' shared memory must fit."""
    from humming_aot import heuristics

    # (activation, weight code + scale + zero point) of the key names, and the code's bits
    specs = [("bf16", f"s{bits}-g-bf16", bits) for bits in range(1, 9)] + [
        ("bf16", "e2m1-g-bf16", 4), ("bf16", "e4m3-g-bf16", 8), ("f16", "u8-g-f16-zpi", 8), ("bf16", "u8-g-bf16-zpf", 8)]
    stage_widths, labels = set(), set()
    for act, weight, bits in specs:
        tiles = {heuristics.select_tile("sm90a", m, k=k, group=128, w_bits=bits, n=n, num_sms=132)
                 for k, n in ((8192, 4096), (8192, 1 << 20), (8192 + 128, 4096))}
        for tile in tiles:
            warps = tile.warps_m * tile.warps_n * tile.warps_k
            assert tile.block_m == block_m, tile.label
            stage_widths.add(tile.block_k)
            labels.add(tile.label)
            name = f"gemm_dense_sm90a_{tile.mma.value}_a-{act}_w-{weight}_o-{act}_{tile.label.split(':')[-1]}"
            key = KernelKey.from_name(name)
            report = _ptxas_report(key, tmp_path)
            registers = [int(word) for line in report.splitlines() if "Used" in line
                         for word, unit in zip(line.split(), line.split()[1:]) if unit.startswith("registers")]
            limit = 128 if warps == 8 else 255
            assert registers and registers[0] <= limit, f"{key.name}: {report}"
            assert "0 bytes spill stores" in report and "0 bytes spill loads" in report, f"{key.name}: {report}"
            smem = heuristics.smem_bytes(tile, code_bits(key.spec.w_dtype), key.spec.w_zero_point is not ZeroPoint.NONE)
            assert heuristics.ctas_per_sm(tile, smem, H100_SMEM_PER_SM) >= 2, f"{key.name}: {smem} bytes of shared memory"
    if block_m == 8:
        assert 512 in stage_widths, f"no 512-wide 8-row tile was checked: {sorted(stage_widths)}"
    else:
        assert len(labels) >= 2, f"the 16-row rows were not all checked: {sorted(labels)}"


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("m", [64, 128, 4096])
def test_wgmma_ws_tiles_keep_their_accumulators_in_registers(tmp_path, m):
    """The sm90a table's warp-specialized wgmma tiles hand the producer warpgroup's registers to the
    consumers (setmaxnreg): with the heaviest dequantizers (5-bit unfolding, 8-bit float zero
    points, fp8 and fp4 floats) ptxas must not spill, and the register count at launch must be what
    __launch_bounds__ allows (two CTAs per SM for one consumer warpgroup, else one)."""
    from humming_aot import heuristics

    tile = heuristics.select_tile("sm90a", m, k=8192, group=128, w_bits=8)
    assert tile.mma is MmaKind.WGMMA_WS, tile.label
    launch_registers = 128 if tile.threads == 256 else 168
    for act, weight in [("bf16", "s5-g-bf16"), ("bf16", "u8-g-bf16-zpf"), ("bf16", "e4m3-g-bf16"), ("f16", "e2m1-g-f16")]:
        # the dense body, and the MoE masked schedule on it (kernel/grouped_masked_ws.cuh: a producer
        # of 56 registers that walks the experts, so 16 fewer for the consumers)
        for gemm in ("dense", "masked"):
            key = KernelKey.from_name(f"gemm_{gemm}_sm90a_wgmma-ws_a-{act}_w-{weight}_o-{act}_{tile.field}")
            report = _ptxas_report(key, tmp_path)
            assert f"Used {launch_registers} registers" in report, f"{key.name}: {report}"
            assert "0 bytes spill stores" in report and "0 bytes spill loads" in report, f"{key.name}: {report}"


@pytest.mark.slow
@needs_nvcc
def test_masked_eight_token_tile_runs_three_ctas_per_sm_where_they_fit(tmp_path):
    """The masked schedule's one-warpgroup 8-token TMA tile is built for three CTAs per SM where
    three fit the shared memory (kernel/grouped_masked_ws.cuh kThreePerSm): ptxas then holds the
    kernel to 80 registers at launch and the consumers claim 104 (setmaxnreg), without spills; where
    they do not fit (4-bit codes with zero points in 6 stages, 8-bit codes), 128 and two CTAs, as
    bodies/wgmma_ws.masked_ctas_per_sm says for both."""
    from humming_aot.bodies.wgmma_ws import masked_ctas_per_sm
    from humming_aot.enumerate import parse_tile_field

    cases = [("s4-g-bf16", 4, False, "s6", 3), ("e2m1-g-f16", 4, False, "s6", 3), ("s3-g-bf16", 3, False, "s6", 3),
             ("u4-g-bf16-zpf", 4, True, "s6", 2), ("u4-g-bf16-zpi", 4, True, "s5", 3), ("s8-g-bf16", 8, False, "s4", 2)]
    for weight, bits, zero_point, stages, ctas in cases:
        field = f"8x256x64_w1x4_{stages}"
        assert masked_ctas_per_sm(parse_tile_field(f"wgmma-ws:{field}"), bits, zero_point) == ctas, (weight, field)
        key = KernelKey.from_name(f"gemm_masked_sm90a_wgmma-ws_a-bf16_w-{weight}_o-bf16_{field}".replace(
            "a-bf16_w-e2m1-g-f16_o-bf16", "a-f16_w-e2m1-g-f16_o-f16"))
        report = _ptxas_report(key, tmp_path)
        launch = 80 if ctas == 3 else 128
        assert f"Used {launch} registers" in report, f"{key.name}: {report}"
        assert "0 bytes spill stores" in report and "0 bytes spill loads" in report, f"{key.name}: {report}"


@needs_nvcc
def test_masked_eight_token_two_warpgroup_tile_runs_two_ctas_per_sm_where_they_fit(tmp_path):
    """The masked schedule's 8 x 512 TMA tile of two consumer warpgroups is built for two CTAs per
    SM where two fit the shared memory (kernel/grouped_masked_ws.cuh kTwoOfTwoGroupsPerSm): 80
    registers at launch for its 384 threads, the producer keeping setmaxnreg's least so that the
    consumers hold 104 (a few words of its walk then go to local memory, never inside the K loop,
    as for the tiles of test_masked_wgmma_ws_tiles_at_the_register_limit_keep_their_wgmma_in_flight); where two do not
    fit (6 stages, 8-bit codes), one CTA and 168, as bodies/wgmma_ws.masked_ctas_per_sm says for
    both."""
    from humming_aot.bodies.wgmma_ws import masked_ctas_per_sm, masked_producer_registers
    from humming_aot.enumerate import parse_tile_field

    cases = [("s4-g-bf16", 4, False, "s4", 2), ("u4-g-bf16-zpi", 4, True, "s4", 2), ("s4-g-bf16", 4, False, "s6", 1),
             ("s8-g-bf16", 8, False, "s4", 1)]
    for weight, bits, zero_point, stages, ctas in cases:
        field = f"8x512x64_w1x8_{stages}"
        assert masked_ctas_per_sm(parse_tile_field(f"wgmma-ws:{field}"), bits, zero_point) == ctas, (weight, field)
        key = KernelKey.from_name(f"gemm_masked_sm90a_wgmma-ws_a-bf16_w-{weight}_o-bf16_{field}")
        report = _ptxas_report(key, tmp_path)
        launch = 80 if ctas == 2 else 168
        assert f"Used {launch} registers" in report, f"{key.name}: {report}"
        assert "C7512" not in report, f"{key.name}: wgmma serialized: {report}"
        least = masked_producer_registers(parse_tile_field(f"wgmma-ws:{field}"), bits, zero_point) == 24
        assert least == (ctas == 2) and _spill_bytes(report) <= (128 if least else 0), f"{key.name}: {report}"
        if _spill_bytes(report) and shutil.which("cuobjdump"):
            assert not _loads_and_stores_in_wgmma_loops(tmp_path / f"{key.symbol}.cubin"), key.name
    # 16 tokens keep one CTA: their 32 accumulators would leave their wgmma no slack in 104
    assert masked_ctas_per_sm(parse_tile_field("wgmma-ws:16x512x64_w1x8_s4"), 4, False) == 1


@needs_nvcc
def test_masked_two_warpgroup_tiles_run_two_ctas_per_sm_where_their_registers_keep_the_wgmma_slack(tmp_path):
    """Beyond 8 x 512: a masked two-warpgroup tile runs two CTAs per SM (80 registers at launch, 104
    a consumer) where two fit the shared memory and the consumers then hold the accumulators, the
    dequantization's spare and the wgmma's slack: 16 and 32 x 256 (16 / 32 accumulators), not 48 x
    256 (48: ptxas would serialize its wgmma, C7512) nor 16 x 512 (32 with four units' spare), as
    bodies/wgmma_ws.masked_ctas_per_sm says too."""
    from humming_aot.bodies.wgmma_ws import masked_ctas_per_sm
    from humming_aot.enumerate import parse_tile_field

    for field, ctas in (("16x256x64_w1x8_s4", 2), ("32x256x64_w1x8_s4", 2), ("48x256x64_w1x8_s4", 1)):
        assert masked_ctas_per_sm(parse_tile_field(f"wgmma-ws:{field}"), 4, False) == ctas, field
        key = KernelKey.from_name(f"gemm_masked_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_{field}")
        report = _ptxas_report(key, tmp_path)
        assert f"Used {80 if ctas == 2 else 168} registers" in report, f"{key.name}: {report}"
        assert "C7512" not in report, f"{key.name}: wgmma serialized: {report}"
        if _spill_bytes(report) and shutil.which("cuobjdump"):
            assert not _loads_and_stores_in_wgmma_loops(tmp_path / f"{key.symbol}.cubin"), key.name
    assert masked_ctas_per_sm(parse_tile_field("wgmma-ws:16x512x64_w1x8_s4"), 4, False) == 1


def _spill_bytes(report: str) -> int:
    """The spill stores ptxas -v reports (bytes)."""
    found = re.search(r"(\d+) bytes spill stores", report)
    assert found, report
    return int(found.group(1))


def _loads_and_stores_in_wgmma_loops(cubin: Path) -> list[str]:
    """The local-memory instructions (LDL / STL) inside the innermost loops that issue wgmma
    (HGMMA, QGMMA or IGMMA: 16-bit, fp8 or int8 operands) in a cubin's SASS: the K loops."""
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = [(int(m.group(1), 16), line) for line in sass.splitlines()
             if (m := re.search(r"/\*([0-9a-f]{4,})\*/\s+\S", line))]
    loops = []
    for address, line in lines:
        target = re.search(r"BRA (0x[0-9a-f]+)", line)
        if target and int(target.group(1), 16) < address:
            loops.append((int(target.group(1), 16), address))
    # the smallest loop around each wgmma (a wait's out-of-line retry also branches back into a K
    # loop, from past the epilogue: a larger range, never the smallest)
    innermost = set()
    for w in (address for address, line in lines if re.search(r"\b[HQI]GMMA\b", line)):
        around = [(a, b) for a, b in loops if a <= w <= b]
        if around:
            innermost.add(min(around, key=lambda loop: loop[1] - loop[0]))
    assert innermost, "no loop issues wgmma"
    return [line.strip() for address, line in lines
            if ("LDL" in line or "STL" in line) and any(a <= address <= b for a, b in innermost)]


@pytest.mark.slow
@needs_nvcc
def test_the_dense_176_token_tile_keeps_its_wgmma_in_flight(tmp_path):
    """The sm90a table's 176-token x 256-channel tile (integer codes of at most 4 bits, large M)
    holds 176 accumulators per consumer thread: with the producer warpgroup at the dense body's 40
    registers the consumers got 232 and ptxas serialized their wgmma (warning C7512), so the
    producer keeps setmaxnreg's least, 24 (bodies/wgmma_ws.dense_producer_registers), for the
    table's codes with the heaviest dequantizers: no C7512, a few words spilled, none inside a K
    loop (checked in the SASS where cuobjdump is on PATH)."""
    from humming_aot import heuristics
    from humming_aot.bodies.wgmma_ws import dense_producer_registers

    tile = heuristics.select_tile("sm90a", 8192, k=8192, group=128, w_bits=4, n=8192, num_sms=132)
    assert tile.block_m == 176 and dense_producer_registers(tile) == 24, tile.label
    for act, weight in [("bf16", "s4-g-bf16"), ("bf16", "u4-g-bf16-zpf"), ("f16", "u3-g-f16-zpi"), ("bf16", "s1-g-bf16")]:
        key = KernelKey.from_name(f"gemm_dense_sm90a_wgmma-ws_a-{act}_w-{weight}_o-{act}_{tile.field}")
        report = _ptxas_report(key, tmp_path)
        assert "C7512" not in report, f"{key.name}: wgmma serialized: {report}"
        assert _spill_bytes(report) <= 128, f"{key.name}: {report}"
        if shutil.which("cuobjdump"):
            assert not _loads_and_stores_in_wgmma_loops(tmp_path / f"{key.symbol}.cubin"), key.name


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("field", ["176x256x64_w1x8_s3", "160x256x64_w1x8_s4", "144x128x64_w1x4_s4", "64x512x64_w1x8_s3",
                                   "64x256x64_w1x4_s4", "8x512x64_w1x8_s4", "moe_tiles"])
def test_masked_wgmma_ws_tiles_at_the_register_limit_keep_their_wgmma_in_flight(tmp_path, field):
    """The masked MoE schedule's wgmma-ws tiles (the moe_tiles rows of sm90a) and the most tokens
    the register split holds (bodies/wgmma_ws.max_accumulators: 176 accumulators per thread with two
    consumer warpgroups, 152 with one; also with warpgroups of four 64-channel units), for the
    heaviest dequantizers: ptxas never serializes their wgmma (warning C7512) and does not spill,
    except where kernel/grouped_masked_ws.cuh gives the producer warpgroup setmaxnreg's least
    registers so that the consumers' wgmma stay in flight (bodies/wgmma_ws.masked_producer_registers:
    the 176-row tile, one-warpgroup tiles at their most accumulators): a few words then go to local
    memory, never inside the K loop (checked in the SASS where cuobjdump is on PATH)."""
    from humming_aot import heuristics
    from humming_aot.bodies.wgmma_ws import masked_producer_registers
    from humming_aot.enumerate import parse_tile_field

    for act, weight, bits, zero_point in [("bf16", "u8-g-bf16-zpf", 8, True), ("bf16", "s5-g-bf16", 5, False),
                                          ("f16", "e2m1-g-f16", 4, False), ("bf16", "u4-g-bf16-zpf", 4, True)]:
        if field != "moe_tiles" and bits == 4 and zero_point:
            continue  # (4-bit codes with zero points: their own rows, the one-warpgroup 48 and 64 of 4-bit codes)
        if field == "moe_tiles":  # the tiles the runtime picks for these codes
            table = heuristics.moe_tile_table("sm90a", bits, zero_point=zero_point)
            fields = [t.field for t in table if t.mma is MmaKind.WGMMA_WS]
            assert fields, "no wgmma-ws row in sm90a's moe_tiles"
        else:
            fields = [field]
        for tile_field in fields:
            key = KernelKey.from_name(f"gemm_masked_sm90a_wgmma-ws_a-{act}_w-{weight}_o-{act}_{tile_field}")
            report = _ptxas_report(key, tmp_path)
            assert "C7512" not in report, f"{key.name}: wgmma serialized: {report}"
            least = masked_producer_registers(parse_tile_field(f"wgmma-ws:{tile_field}"), bits, zero_point) == 24
            spilled = _spill_bytes(report)
            assert spilled <= (128 if least else 0), f"{key.name}: {report}"
            if spilled and shutil.which("cuobjdump"):
                assert not _loads_and_stores_in_wgmma_loops(tmp_path / f"{key.symbol}.cubin"), key.name
