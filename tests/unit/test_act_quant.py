"""Activation quantization's kernels without a GPU: the quant unit's source and its NVRTC build
per arch family, its Params layout against the header, which recipes the kernels take, the host
path of each launch (recorded), and ops.quantize_activation's reference path on the CPU."""
from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import pytest
import torch

from humming_aot import helper_kernels, ops
from humming_aot.quant import ActivationFormat, cuda_quant

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "include" / "humming_aot" / "helpers" / "act_quant.cuh"


def test_quant_unit_kernels_per_arch():
    assert helper_kernels.quant_elements("sm80") == ("int8",)
    assert helper_kernels.quant_elements("sm89") == ("int8", "float8e4m3", "float8e5m2")
    assert sorted(helper_kernels.kernel_names("quant", "sm75")) == [
        "quant_fp4_mx_f16", "quant_group_f16_int8", "quant_group_f16_int8_wide", "quant_tensor_amax_f16",
        "quant_tensor_apply_f16_int8", "quant_token_f16_int8", "quant_token_f16_int8_wide"]
    names = helper_kernels.kernel_names("quant", "sm90a")
    # per activation dtype: 3 elements x (3 granularities + the wide token and group kernels), the
    # amax pass, mxfp4 and nvfp4
    assert len(names) == 2 * (3 * 5 + 1 + 2) and "quant_token_bf16_float8e4m3" in names
    assert "quant_token_bf16_float8e4m3_wide" in names and "quant_group_f16_int8_wide" in names
    assert "quant_fp4_nv_bf16" in names and "quant_fp4_nv_bf16" not in helper_kernels.kernel_names("quant", "sm80")
    source = helper_kernels.unit_source("quant", "sm90a")
    assert "#include <humming_aot/helpers/act_quant.cuh>" in source and source == helper_kernels.unit_source(
        "quant", "sm90a")
    assert "#include <humming_aot/helpers/act_quant_fp4.cuh>" in source


def test_params_layout_and_constants_match_the_header():
    text = HEADER.read_text()
    found = re.search(r'sizeof\(ActQuantParams\) == (\d+), "ActQuantParams must match the Python struct format ([^"]+)"',
                      text)
    assert found and int(found.group(1)) == cuda_quant._PARAMS.size and found.group(2) == cuda_quant._PARAMS.format
    assert f"int kCtaThreads = {cuda_quant.THREADS}>" in text and f"kVector = {cuda_quant.VECTOR};" in text
    assert helper_kernels.WIDE_THREADS <= 1024 and "kCtaThreads <= 1024" in text
    fp4 = (HEADER.parent / "act_quant_fp4.cuh").read_text()
    found = re.search(r'sizeof\(Fp4QuantParams\) == (\d+), "Fp4QuantParams must match the Python struct format '
                      r'([^"]+)"', fp4)
    assert found and int(found.group(1)) == cuda_quant._FP4_PARAMS.size and found.group(2) == cuda_quant._FP4_PARAMS.format


@pytest.mark.parametrize("arch", ["sm75", "sm89", "sm90a"])
def test_quant_unit_compiles_with_nvrtc(arch, tmp_path, monkeypatch):
    from humming_aot import jit
    from humming_aot.testing.jit import why_no_jit

    why = why_no_jit("the unit is compiled by NVRTC", "to compile it")
    if why is not None:
        pytest.skip(why)
    monkeypatch.setenv("HUMMING_AOT_CACHE_DIR", str(tmp_path))
    result = jit.cache.obtain(helper_kernels.compile_unit("quant", arch), include_dir=jit._include_dir(),
                              nvrtc_lib=jit.nvrtc.load_nvrtc())
    helper_kernels.check_unit_cubin(result.data, "quant", arch)


@pytest.mark.parametrize("text,shape,dtype,taken", [
    ("float8e4m3:token", (4, 4096), torch.bfloat16, True),
    ("int8:token", (2, 3, 2880), torch.float16, True),
    ("float8e4m3:g128", (4, 7168), torch.bfloat16, True),
    ("float8e4m3:g128", (4, 2880), torch.bfloat16, False),  # 128 does not divide K
    ("float8e4m3:g48", (4, 4800), torch.bfloat16, False),  # not a lane count a warp splits into
    ("float8e5m2:tensor", (4, 64), torch.bfloat16, True),
    ("float8e4m3:token", (4, 4100), torch.bfloat16, False),  # K not a multiple of 8
    ("float8e4m3:token", (4, 64), torch.float32, False),
    ("float8e4m3:token:s=bfloat16", (4, 64), torch.bfloat16, False),
    ("int4:token", (4, 64), torch.bfloat16, False),
    ("nvfp4", (4, 64), torch.bfloat16, True),
    ("mxfp4", (2, 3, 2880), torch.float16, True),
    ("mxfp4", (4, 48), torch.bfloat16, False),  # 32 does not divide K
    ("float4e2m1:g32", (4, 64), torch.bfloat16, False),  # float32 scales: the reference's
    ("float4e2m1:token", (4, 64), torch.bfloat16, False),
    ("float8e4m3:token", (0, 64), torch.bfloat16, False),
])
def test_which_recipes_the_kernels_take(text, shape, dtype, taken):
    assert cuda_quant.recipe_supported(dtype, shape, ActivationFormat.parse(text)) is taken
    assert not cuda_quant.supported(torch.zeros(shape, dtype=dtype), ActivationFormat.parse(text))  # CPU


class _Unit:
    def __init__(self, arch: str):
        self.arch = arch
        self.kernels = {name: i for i, name in enumerate(helper_kernels.kernel_names("quant", arch))}
        self.calls = []
        self.clusters = []
        self.pdl_launches = []

    def launch(self, symbol, grid, threads, smem, stream, params, cluster=(1, 1, 1), *, programmatic=False):
        assert symbol in self.kernels
        layout = cuda_quant._FP4_PARAMS if symbol.startswith("quant_fp4_") else cuda_quant._PARAMS
        self.calls.append((symbol, grid, threads, layout.unpack(params)))
        self.clusters.append(cluster)
        self.pdl_launches.append(programmatic)

    @property
    def programmatic(self):
        return helper_kernels.programmatic_launch(self.arch)


def _record(monkeypatch, arch: str, *, sms: int = 132, clusters: bool = True) -> _Unit:
    unit = _Unit(arch)
    monkeypatch.setattr(cuda_quant, "_sm_count", lambda device: sms)
    monkeypatch.setattr(cuda_quant, "_clusters", lambda u: clusters)
    monkeypatch.setattr(cuda_quant, "supported", lambda a, fmt: cuda_quant.recipe_supported(a.dtype, tuple(a.shape), fmt))
    monkeypatch.setattr(helper_kernels, "available", lambda name, device: True)
    monkeypatch.setattr(helper_kernels, "load", lambda name, device: unit)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda_quant, "_stream", lambda device: 0)
    return unit


def test_launches_per_granularity(monkeypatch):
    unit = _record(monkeypatch, "sm90a")
    a = torch.zeros(6, 4096, dtype=torch.bfloat16)
    q = cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:token"), None)
    assert q.codes.shape == (6, 4096) and q.codes.dtype == torch.uint8 and q.scales.shape == (6, 1)
    symbol, grid, threads, fields = unit.calls[-1]
    # few rows: a 1024-thread CTA a row; from WIDE_ROWS + 1 rows on, 256
    assert (symbol, grid, threads) == ("quant_token_bf16_float8e4m3_wide", (6, 1, 1), 1024)
    assert fields[3:5] == (0, 0) and fields[5:] == (6, 4096, 4096, 0)
    many = torch.zeros(cuda_quant.WIDE_ROWS + 1, 1024, dtype=torch.bfloat16)
    cuda_quant.quantize(many, ActivationFormat.parse("float8e4m3:token"), None)
    assert unit.calls[-1][:3] == ("quant_token_bf16_float8e4m3", (cuda_quant.WIDE_ROWS + 1, 1, 1), 256)
    cuda_quant.quantize(many[:-1], ActivationFormat.parse("int8:g64"), None)
    assert unit.calls[-1][:3] == ("quant_group_bf16_int8_wide", (cuda_quant.WIDE_ROWS, 1, 1), 1024)
    q = cuda_quant.quantize(a.reshape(2, 3, 4096), ActivationFormat.parse("int8:g128"), None)
    assert q.scales.shape == (2, 3, 32) and unit.calls[-1][0] == "quant_group_bf16_int8_wide"
    assert unit.calls[-1][3][-1] == 128
    unit.calls.clear()
    q = cuda_quant.quantize(a, ActivationFormat.parse("float8e5m2:tensor"), None)  # dynamic: amax, then apply
    assert [c[0] for c in unit.calls] == ["quant_tensor_amax_bf16", "quant_tensor_apply_bf16_float8e5m2"]
    assert unit.calls[0][3][4] != 0 and unit.calls[0][3][3] == 0 and q.scales.shape == (1,)
    unit.calls.clear()
    given = torch.tensor(0.5)
    cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:tensor"), given)
    assert [c[0] for c in unit.calls] == ["quant_tensor_apply_bf16_float8e4m3"]
    assert unit.calls[0][3][3] == given.data_ptr() and unit.calls[0][3][4] == 0


def test_fp4_launches(monkeypatch):
    unit = _record(monkeypatch, "sm90a")
    a = torch.zeros(6, 4096, dtype=torch.bfloat16)
    q = cuda_quant.quantize(a, ActivationFormat.parse("mxfp4"), None)
    assert q.scales.shape == (6, 128) and q.global_scale is None and q.scale_dtype == "float8e8m0"
    (symbol, grid, threads, fields), = unit.calls
    assert (symbol, grid, threads) == ("quant_fp4_mx_bf16", (6, 1, 1), 256)
    assert fields[3:5] == (0, 0) and fields[5:9] == (6, 4096, 4096, 32) and fields[9] == 0
    unit.calls.clear()  # nvfp4, dynamic global scale: the amax pass (ActQuantParams), then the groups
    q = cuda_quant.quantize(a, ActivationFormat.parse("nvfp4"), None)
    assert [c[0] for c in unit.calls] == ["quant_tensor_amax_bf16", "quant_fp4_nv_bf16"]
    amax_fields, fields = unit.calls[0][3], unit.calls[1][3]
    assert amax_fields == fields[:9] and fields[4] != 0 and fields[3] == 0 and fields[8] == 16
    assert q.global_scale is not None and fields[9] == q.global_scale.data_ptr() and q.scales.shape == (6, 256)
    unit.calls.clear()  # a given global scale: one launch reading it
    given = torch.tensor(0.25)
    q = cuda_quant.quantize(a, ActivationFormat.parse("nvfp4"), None, given)
    assert [c[0] for c in unit.calls] == ["quant_fp4_nv_bf16"] and unit.calls[0][3][3:5] == (given.data_ptr(), 0)
    assert cuda_quant.quantize(a, ActivationFormat.parse("mxfp4"), None, given) is None  # mxfp4 has none
    unit = _record(monkeypatch, "sm80")  # nvfp4's e4m3 scales need sm_89; mxfp4 runs anywhere
    assert cuda_quant.quantize(a, ActivationFormat.parse("nvfp4"), None) is None
    assert cuda_quant.quantize(a, ActivationFormat.parse("mxfp4"), None) is not None


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _encode_e2m1(q: float) -> int:
    """act_quant_fp4.cuh's encode_e2m1, step by step in Python (float32 values, 32-bit words)."""
    m = min(abs(q), 6.0)
    below_one = _f32_bits(m * 2.0 + 8388608.0) & 3  # exact in float64, then one float32 rounding
    u = _f32_bits(m)
    rounded = (u + 0x1FFFFF + ((u >> 22) & 1)) & 0xFFFFFFFF
    code = below_one if m < 1.0 else (rounded >> 22) - 252
    return code + (8 if math.copysign(1.0, q) < 0 else 0)


def _mx_scale(amax: float) -> float:
    """act_quant_fp4.cuh's mx_scale in Python: floor(log2) from the float32 bits."""
    if not amax > 0:
        return 1.0
    bits = struct.unpack("<I", struct.pack("<f", amax))[0]
    field = bits >> 23
    log2 = field - 127 if field else (bits.bit_length() - 1) - 149
    shared = min(max(log2 - 2, -127), 127)
    return 2.0 ** shared


def test_the_fp4_kernels_arithmetic_is_the_references():
    """The device formulas of act_quant_fp4.cuh (the e2m1 encode, MXFP4's scale), emulated on the
    CPU, against humming_aot.formats and the reference's scales, over edge values and random float32
    (the GPU test compares the kernels themselves)."""
    from humming_aot import formats
    from humming_aot.quant import _scaling

    e2m1 = formats.get("float4e2m1")
    gen = torch.Generator().manual_seed(3)
    edges = [0.0, -0.0, 0.25, 0.2500001, 0.24999999, 0.75, 0.7499999, 0.9999999, 1.0, 1.25, 1.75, 2.5, 3.5,
             4.9999995, 5.0, 5.0000005, 5.9999, 6.0, 7.0, 1e30, 1e-40, -0.25, -5.0, -1e-3]
    values = torch.tensor(edges + (torch.randn(4000, generator=gen) * torch.logspace(-3, 1, 4000)).tolist(),
                          dtype=torch.float32)
    ref = e2m1.encode(values)
    got = torch.tensor([_encode_e2m1(float(v)) for v in values], dtype=torch.uint8)
    assert torch.equal(got, ref), values[(got != ref).nonzero()[:5, 0]].tolist()
    amax = torch.tensor([0.0, 1e-45, 3e-39, 1.17549435e-38, 2.0 ** -125, 0.5, 1.0, 5.99, 6.0, 8.0, 3e38] +
                        (torch.rand(2000, generator=gen) * torch.logspace(-40, 38, 2000)).tolist(),
                        dtype=torch.float32)
    ref_scales = _scaling.mx_scales(amax, e2m1)
    got_scales = torch.tensor([_mx_scale(float(x)) for x in amax], dtype=torch.float32)
    assert torch.equal(got_scales, ref_scales.to(torch.float32))


def test_mxfp4_quotients_by_the_exact_reciprocal_are_the_divisions():
    """act_quant_fp4.cuh divides MXFP4's values by their scale 2^e as a product with 2^-e (exact
    for e in [-127, 127], subnormal 2^-127 included): the same float32 as the division, over random
    values and e2m1's rounding boundaries times the scale."""
    gen = torch.Generator().manual_seed(5)
    boundaries = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=torch.float32)
    for e in (-127, -126, -60, -2, 0, 3, 60, 126, 127):
        d = torch.tensor([2.0 ** e], dtype=torch.float32)
        r = torch.tensor([2.0 ** -e], dtype=torch.float32)
        assert float(d) * float(r) == 1.0
        values = torch.cat([torch.randn(3000, generator=gen) * 4 * d, boundaries * d, -boundaries * d,
                            torch.tensor([0.0, -0.0, 1e-40, float("inf")])])
        assert torch.equal(values * r, values / d)


def test_fp8_before_sm89_and_bf16_on_sm75_take_the_reference(monkeypatch):
    unit = _record(monkeypatch, "sm80")
    a = torch.zeros(2, 64, dtype=torch.bfloat16)
    assert cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:token"), None) is None
    assert cuda_quant.quantize(a, ActivationFormat.parse("int8:token"), None) is not None
    unit = _record(monkeypatch, "sm75")
    assert cuda_quant.quantize(a, ActivationFormat.parse("int8:token"), None) is None
    assert unit.calls == []


def test_ops_quantize_activation_runs_the_reference_on_the_cpu():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(5, 256, generator=gen).bfloat16()
    for text in ("float8e4m3:token", "int8:g64", "float8e4m3:tensor", "nvfp4"):
        got = ops.quantize_activation(a, text)
        ref = ActivationFormat.parse(text).quantize(a)
        assert torch.equal(got.codes, ref.codes) and torch.equal(got.scales, ref.scales)
    got = ops.quantize_activation(a, "int8:tensor", static_scale=0.25)
    assert torch.equal(got.scales, torch.tensor([0.25]))
    with pytest.raises(ValueError, match="cannot parse activation format"):
        ops.quantize_activation(a, "float8e4m3")


def test_quantize_activation_is_a_custom_op_under_torch_compile():
    a = torch.randn(4, 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    for text in ("float8e4m3:token", "int8:g64", "nvfp4"):
        eager = ops.quantize_activation(a, text)
        fn = torch.compile(lambda x, text=text: ops.quantize_activation(x, text), backend="eager")
        got = fn(a)
        assert torch.equal(got.codes, eager.codes) and torch.equal(got.scales, eager.scales)
        assert (got.global_scale is None) == (eager.global_scale is None)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        codes, scales, glob = torch.ops.humming_aot.quantize_activation(mode.from_tensor(a), "float8e4m3:g128",
                                                                       None, None)
        assert codes.shape == (4, 256) and codes.dtype == torch.uint8 and scales.shape == (4, 2)
    q = ops.quantize_activation(a, "int8:tensor", static_scale=torch.tensor([0.25]))
    op = torch.ops.humming_aot.quantize_activation(a, "int8:tensor", torch.tensor([0.25]), None)
    assert torch.equal(op[0], q.codes) and torch.equal(op[1], q.scales)


@pytest.mark.parametrize(("rows", "vectors", "sms", "parts"), [
    (1, 3584, 132, 8),   # a decode row of 28,672 elements: eight CTAs
    (4, 2304, 132, 8),   # 4 x 18,432: SPLIT_CTAS
    (5, 2304, 132, 4),   # the rows' CTAs at most SPLIT_CTAS
    (8, 4096, 132, 4),
    (9, 4096, 132, 1),   # two parts a row: fewer than MIN_PARTS, so whole
    (16, 2304, 132, 1),  # 16 x 18,432 whole (the pair with the GEMM after it: log section 78)
    (1, 1023, 132, 1),   # a row of fewer than SPLIT_VECTORS stays whole
    (1, 1024, 132, 4),   # a part at least PART_VECTORS
    (1, 100000, 132, 8),  # at most MAX_PARTS (a portable cluster)
    (4, 4096, 16, 4),    # the rows' CTAs at most the SMs
    (8, 4096, 16, 1),
])
def test_row_parts(rows, vectors, sms, parts):
    assert cuda_quant.row_parts(rows, vectors, sms) == parts


@pytest.mark.parametrize(("rows", "vectors", "parts"), [
    (1, 1024, 1),   # a token row's cluster costs more than a row of 8,192 elements saves
    (1, 2047, 1),
    (1, 2048, 8),   # from CLUSTER_SPLIT_VECTORS on
    (16, 2304, 1),  # 16 x 18,432: whole
    (4, 2304, 8),   # 4 x 18,432
    (1, 3584, 8),   # 1 x 28,672
    (8, 4096, 4),   # SPLIT_CTAS
])
def test_row_parts_of_a_token_row(rows, vectors, parts):
    assert cuda_quant.row_parts(rows, vectors, 132, cluster=True) == parts


def test_few_long_rows_split_into_parts(monkeypatch):
    """Few long rows: gridDim.y CTAs of 256 threads a row; a per-token row's parts one cluster,
    group and tensor rows' none; without clusters a token row stays one wide CTA."""
    unit = _record(monkeypatch, "sm90a")
    a = torch.zeros(1, 28672, dtype=torch.bfloat16)
    cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:token"), None)
    assert unit.calls[-1][:3] == ("quant_token_bf16_float8e4m3", (1, 8, 1), 256) and unit.clusters[-1] == (1, 8, 1)
    cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:g128"), None)
    assert unit.calls[-1][:3] == ("quant_group_bf16_float8e4m3", (1, 8, 1), 256) and unit.clusters[-1] == (1, 1, 1)
    unit.calls.clear()
    cuda_quant.quantize(a, ActivationFormat.parse("int8:tensor"), None)
    assert [c[:3] for c in unit.calls] == [("quant_tensor_amax_bf16", (1, 8, 1), 256),
                                          ("quant_tensor_apply_bf16_int8", (1, 8, 1), 256)]
    unit.calls.clear()
    cuda_quant.quantize(a, ActivationFormat.parse("nvfp4"), None)
    assert [c[:3] for c in unit.calls] == [("quant_tensor_amax_bf16", (1, 8, 1), 256),
                                          ("quant_fp4_nv_bf16", (1, 8, 1), 256)]
    b = torch.zeros(1, 8192, dtype=torch.bfloat16)  # a token row too short for a cluster, a group row split
    cuda_quant.quantize(b, ActivationFormat.parse("float8e4m3:token"), None)
    assert unit.calls[-1][:3] == ("quant_token_bf16_float8e4m3_wide", (1, 1, 1), 1024) and unit.clusters[-1] == (1, 1, 1)
    cuda_quant.quantize(b, ActivationFormat.parse("float8e4m3:g128"), None)
    assert unit.calls[-1][:3] == ("quant_group_bf16_float8e4m3", (1, 4, 1), 256)
    unit = _record(monkeypatch, "sm89", clusters=False)
    cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:token"), None)
    assert unit.calls[-1][:3] == ("quant_token_bf16_float8e4m3_wide", (1, 1, 1), 1024) and unit.clusters[-1] == (1, 1, 1)
    cuda_quant.quantize(a, ActivationFormat.parse("float8e4m3:g128"), None)  # no cluster needed
    assert unit.calls[-1][:3] == ("quant_group_bf16_float8e4m3", (1, 8, 1), 256)


def test_clusters_need_sm90_the_switch_and_the_driver(monkeypatch):
    """cuda_quant._clusters: a per-token row's parts only where the unit is an sm_90+ build,
    HUMMING_AOT_CLUSTERS is on and the driver has cuLaunchKernelEx."""
    from humming_aot import _launcher

    monkeypatch.setattr(_launcher, "supports_programmatic_launch", lambda: True)
    monkeypatch.delenv("HUMMING_AOT_CLUSTERS", raising=False)
    assert cuda_quant._clusters(_Unit("sm90a")) and cuda_quant._clusters(_Unit("sm120a"))
    assert not cuda_quant._clusters(_Unit("sm89")) and not cuda_quant._clusters(_Unit("sm80"))
    monkeypatch.setenv("HUMMING_AOT_CLUSTERS", "0")
    assert not cuda_quant._clusters(_Unit("sm90a"))
    monkeypatch.setenv("HUMMING_AOT_CLUSTERS", "1")
    monkeypatch.setattr(_launcher, "supports_programmatic_launch", lambda: False)
    assert not cuda_quant._clusters(_Unit("sm90a"))


@pytest.mark.parametrize(("arch", "setting", "programmatic"),
                         [("sm90a", None, True), ("sm120a", "1", True), ("sm90a", "0", False), ("sm89", None, False),
                          ("sm80", "1", False)])
def test_programmatic_launch_from_sm90_builds_with_the_setting(monkeypatch, arch, setting, programmatic):
    """Every quant kernel waits for the upstream grid before it reads (act_quant.cuh, from sm_90
    builds: HELPERS_VERSION 6), so every launch of every recipe takes Programmatic Dependent Launch
    there, unless HUMMING_AOT_PDL is off; an older arch's build has no wait and never takes it."""
    if setting is None:
        monkeypatch.delenv("HUMMING_AOT_PDL", raising=False)
    else:
        monkeypatch.setenv("HUMMING_AOT_PDL", setting)
    unit = _record(monkeypatch, arch)
    a = torch.zeros(3, 4096, dtype=torch.bfloat16)
    recipes = ["int8:token", "int8:tensor", "mxfp4"]
    if arch != "sm80":
        recipes += ["float8e4m3:token", "float8e4m3:g128", "nvfp4"]
    for recipe in recipes:
        cuda_quant.quantize(a, ActivationFormat.parse(recipe), None)
    assert len(unit.pdl_launches) == len(unit.calls) >= len(recipes) + 1  # (int8:tensor's amax pass too)
    assert set(unit.pdl_launches) == {programmatic}
