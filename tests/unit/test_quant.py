"""humming_aot.quant: WeightFormat strings, quantize/dequantize against the producers' recipes
re-implemented here, nearest-grid properties (hypothesis), zero-safety, activation quantization."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from humming_aot import formats
from humming_aot.packing import pack
from humming_aot.quant import (
    PRESETS,
    ActivationGranularity,
    QuantizedWeight,
    ScaleGranularity,
    WeightFormat,
    ZeroPointKind,
    dequantize,
    dequantize_activation,
    quantize,
    quantize_activation,
)
from humming_aot.testing.numerics import assert_bitwise_equal, with_every_code

CANONICAL = [
    "int4:g128", "int4:channel", "int8:channel", "uint4:g128:zp", "uint4:g64:zp", "mxfp4", "nvfp4",
    "float8e4m3:channel", "float8e4m3:tensor", "float8e4m3:b128x128", "mxfp8", "float6e3m2:g32",
    "int4:g128:s=bfloat16", "uint4:g32:zpf:s=float16", "mxfp6e2m3", "mxfp6e3m2", "int2:b16x32",
    "float4e2m1:g32:s=float8e4m3", "float8e5m2:channel:s=float16", "uint8:tensor:zp",
]
# Formats for the property tests; {g} is filled with a drawn group size.
TEMPLATES = [
    "int4:g{g}", "int4:channel", "int8:channel", "int2:g{g}", "int3:g{g}:s=bfloat16", "int1:g{g}",
    "int8:tensor", "int4:g{g}:s=float8e8m0", "int5:b{g}x{g}:s=float16",
    "uint4:g{g}:zp", "uint8:channel:zp", "uint2:g{g}:zp:s=bfloat16", "uint3:g{g}:zpf:s=float16", "uint4:b8x{g}:zp",
    "mxfp4", "mxfp6e2m3", "mxfp6e3m2", "mxfp8", "nvfp4", "float4e2m1:g{g}+global:s=float8e4m3",
    "float8e4m3:channel", "float8e4m3:tensor", "float8e4m3:b{g}x{g}", "float8e4m3:b16x32:s=bfloat16",
    "float8e5m2:channel", "float6e3m2:g{g}", "float4e0m3:g{g}", "float3e1m1:channel:s=float8e4m3",
]


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn cast by ml_dtypes (round to nearest even, saturating), as uint8 codes."""
    return torch.from_numpy(x.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).copy())


def random_weight(seed: int, shape: tuple[int, ...], magnitude: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * magnitude


def per_element(qw: QuantizedWeight, tile_values: torch.Tensor) -> torch.Tensor:
    """Expands a (*lead, grid_n, grid_k)-shaped per-tile tensor to every element."""
    rows, cols = qw.format.tile_shape(qw.shape)
    *lead, n, k = qw.shape
    grid = tile_values.reshape(*lead, -(-n // rows), -(-k // cols))
    return grid.repeat_interleave(rows, dim=-2)[..., :n, :].repeat_interleave(cols, dim=-1)[..., :k]


def grid_candidates(qw: QuantizedWeight) -> torch.Tensor:
    """(*shape, C) float32: every value each element could have taken, in dequantize's order."""
    elem = formats.get(qw.format.element)
    values = elem.values()
    values = values[torch.isfinite(values)]
    cand = values.expand(*qw.shape, -1)
    if qw.zero_points is not None:
        cand = cand - per_element(qw, qw.zero_points.float())[..., None]
    cand = cand * per_element(qw, qw.scales)[..., None]
    if qw.global_scale is not None:
        cand = cand * qw.global_scale.reshape(*qw.global_scale.shape, 1, 1, 1)
    return cand


def assert_nearest_grid_point(w: torch.Tensor, qw: QuantizedWeight) -> None:
    """dequantize(qw) is, element by element, a nearest point of the element's own grid."""
    deq = dequantize(qw)
    assert deq.shape == w.shape and deq.dtype == torch.float32 and bool(torch.isfinite(deq).all())
    best = (grid_candidates(qw) - w[..., None]).abs().min(dim=-1).values
    err = (deq - w).abs()
    slack = w.abs() * 2.0**-20 + 1e-35  # float32 rounding of w / scale
    worst = int(torch.argmax(err - best - slack))
    assert bool((err <= best + slack).all()), (
        f"{qw.format}: element {worst} w={w.flatten()[worst].item()} got {deq.flatten()[worst].item()}, "
        f"a grid point is {best.flatten()[worst].item()} away"
    )


# ------------------------------------------------------------------------------ WeightFormat
@pytest.mark.parametrize("text", CANONICAL)
def test_weight_format_string_round_trip(text):
    fmt = WeightFormat.parse(text)
    assert str(fmt) == text and WeightFormat.parse(str(fmt)) == fmt


def test_weight_format_fields_of_the_listed_forms():
    assert WeightFormat.parse("int4:g128") == WeightFormat(element="int4", granularity=ScaleGranularity.GROUP, group_size=128)
    assert WeightFormat.parse("uint4:g64:zp").zero_point is ZeroPointKind.INTEGER
    assert WeightFormat.parse("float8e4m3:b128x128").block_n == 128
    nvfp4 = WeightFormat.parse("nvfp4")
    assert (nvfp4.element, nvfp4.granularity, nvfp4.group_size, nvfp4.scale_dtype) == (
        "float4e2m1", ScaleGranularity.GROUP_WITH_GLOBAL, 16, "float8e4m3")
    assert WeightFormat.parse("float4e2m1:g32:s=float8e8m0") == PRESETS["mxfp4"]
    assert str(WeightFormat.parse("float8e4m3:g32:s=float8e8m0")) == "mxfp8"
    assert str(WeightFormat.parse("uint4:g128:s=bfloat16:zp")) == "uint4:g128:zp:s=bfloat16"
    assert WeightFormat.parse("int4:g128").scale_dtype == "float32"


@pytest.mark.parametrize(
    "text,message",
    [
        ("", r"cannot parse weight format '': it has no granularity field"),
        ("int4", r"no granularity field.*int4:g128"),
        ("int4:g0", r"'g0' is not a granularity"),
        ("int4:q128", r"'q128' is not a granularity"),
        ("int4:g128:foo", r"'foo' is not an option"),
        ("int4:g128:zp", r"zero points need unsigned integer elements.*uint4"),
        ("uint4:g128", r"only hold non-negative weights.*int4.*:zp"),
        ("int4:g128:s=float64", r"scale dtype 'float64' is not supported"),
        ("uint4:g128:zp:zp", r"repeats an earlier one"),
        ("float8e4m3:g16+global", r"s=float8e4m3, or drop \+global"),
        ("fp8:channel", r"did you mean 'float8e4m3'"),
        ("float8e8m0:g32", r"not an element format"),
        ("bfloat16:channel", r"not an element format"),
        ("uint4:g32:zpf:s=float8e8m0", r"cannot hold 0"),
        ("mxfp4:g32", r"preset 'mxfp4' takes no fields.*float4e2m1:g32:s=float8e8m0"),
        ("nvfp4:zp", r"float4e2m1:g16\+global:s=float8e4m3"),
    ],
)
def test_weight_format_bad_strings(text, message):
    with pytest.raises(ValueError, match=message):
        WeightFormat.parse(text)


def test_weight_format_bad_fields():
    with pytest.raises(ValueError, match="positive integer group_size"):
        WeightFormat(element="int4", granularity=ScaleGranularity.GROUP)
    with pytest.raises(ValueError, match="group_size=128 means nothing for channel"):
        WeightFormat(element="int4", granularity=ScaleGranularity.CHANNEL, group_size=128)
    with pytest.raises(ValueError, match="positive integer block_n"):
        WeightFormat(element="float8e4m3", granularity=ScaleGranularity.BLOCK, group_size=128)
    with pytest.raises(ValueError, match="must be a ScaleGranularity"):
        WeightFormat(element="int4", granularity="group", group_size=128)
    with pytest.raises(ValueError, match=r"K=200 is not a multiple of the group size 128.*pad K .* 256"):
        WeightFormat.parse("int4:g128").scale_shape((8, 200))
    fmt = WeightFormat.parse("float8e4m3:b128x128")
    assert fmt.scale_shape((3, 200, 300)) == (3, 2, 3) and fmt.tile_shape((200, 300)) == (128, 128)


# ----------------------------------------------------------------------- producers' recipes
def test_int4_matches_gptq_symmetric():
    w = random_weight(0, (32, 256))
    qw = quantize(w, "int4:g128")
    # GPTQ Quantizer(sym=True): xmax = max(|xmin|, xmax), scale = (xmax - -xmax) / maxq, zero = 8.
    xmax = w.reshape(32, 2, 128).abs().amax(dim=-1)
    scale = (xmax - -xmax) / 15
    u = torch.clamp(torch.round(w.reshape(32, 2, 128) / scale[..., None]) + 8, 0, 15).reshape(32, 256)
    assert torch.equal(qw.scales, scale)
    assert torch.equal(qw.codes, u.to(torch.uint8) ^ 8)  # two's complement = offset code ^ 2^(b-1)
    gptq_dequant = (scale[..., None] * (u.reshape(32, 2, 128) - 8)).reshape(32, 256)
    assert torch.equal(dequantize(qw), gptq_dequant)
    assert formats.get("int4").decode(qw.codes).min() >= -8 and qw.codes.max() <= 15


def test_uint4_zero_point_matches_awq():
    w = random_weight(1, (16, 256)) + 0.3
    qw = quantize(w, "uint4:g64:zp")
    g = w.reshape(16, 4, 64)
    max_val, min_val = g.amax(dim=-1, keepdim=True), g.amin(dim=-1, keepdim=True)
    assert bool((min_val < 0).all())  # AWQ does not widen the range to 0; these groups span 0 anyway
    scales = (max_val - min_val).clamp(min=1e-5) / 15
    zeros = (-torch.round(min_val / scales)).clamp_(0, 15)
    u = torch.clamp(torch.round(g / scales) + zeros, 0, 15)
    assert torch.equal(qw.scales, scales[..., 0]) and torch.equal(qw.zero_points, zeros[..., 0].to(torch.uint8))
    assert torch.equal(qw.codes, u.reshape(16, 256).to(torch.uint8))
    assert torch.equal(dequantize(qw), ((u - zeros) * scales).reshape(16, 256))


def test_mxfp4_matches_ocp_recipe():
    w = random_weight(2, (24, 256), magnitude=3.0)
    w[0, :32] *= 1e-3
    qw = quantize(w, "mxfp4")
    blocks = w.reshape(24, 8, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # OCP MX v1.0 6.3: X = 2^(floor(log2(amax)) - emax_elem), emax_elem = 2 for FP4 E2M1.
    scale = torch.exp2(torch.floor(torch.log2(amax.double())) - 2).float()
    codes = e2m1_codes((blocks / scale).reshape(24, 256))
    assert torch.equal(qw.scales, scale[..., 0]) and torch.equal(qw.codes, codes)
    e8m0 = scale.numpy().astype(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(e8m0, scale.numpy())
    assert torch.equal(dequantize(qw), (formats.get("float4e2m1").decode(codes).reshape(24, 8, 32) * scale).reshape(24, 256))


def test_nvfp4_matches_two_level_recipe():
    w = random_weight(3, (32, 128), magnitude=0.05)
    w[1] *= 40
    qw = quantize(w, "nvfp4")
    global_scale = w.abs().amax() / (448 * 6)
    blocks = w.reshape(32, 8, 16)
    block_scale = (blocks.abs().amax(dim=-1, keepdim=True) / 6 / global_scale).to(torch.float8_e4m3fn)
    codes = e2m1_codes((blocks / (block_scale.float() * global_scale)).reshape(32, 128))
    assert torch.equal(qw.global_scale, global_scale) and qw.global_scale.shape == ()
    assert torch.equal(qw.scales, block_scale.float()[..., 0]) and torch.equal(qw.codes, codes)
    deq = formats.get("float4e2m1").decode(codes).reshape(32, 8, 16) * block_scale.float() * global_scale
    assert torch.equal(dequantize(qw), deq.reshape(32, 128))


@pytest.mark.parametrize("fmt,tile", [("float8e4m3:channel", (1, 300)), ("float8e4m3:tensor", (200, 300)),
                                      ("float8e4m3:b128x128", (128, 128))])
def test_fp8_matches_amax_over_448(fmt, tile):
    w = random_weight(4, (200, 300), magnitude=0.02)
    qw = quantize(w, fmt)
    scales = torch.empty(qw.scales.shape).reshape(-(-200 // tile[0]), -(-300 // tile[1]))
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            scales[i, j] = w[i * tile[0] : (i + 1) * tile[0], j * tile[1] : (j + 1) * tile[1]].abs().max() / 448
    full = scales.repeat_interleave(tile[0], 0)[:200].repeat_interleave(tile[1], 1)[:, :300]
    assert torch.equal(qw.scales, scales.reshape(qw.scales.shape))
    assert torch.equal(qw.codes, (w / full).to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(dequantize(qw), (w / full).to(torch.float8_e4m3fn).float() * full)


@pytest.mark.parametrize("fmt", ["nvfp4", "float8e4m3:tensor", "uint4:g32:zp", "float8e4m3:b128x128", "int4:g64"])
def test_moe_weights_quantize_per_expert(fmt):
    w = torch.stack([random_weight(10 + e, (40, 192), magnitude=10.0**e) for e in range(3)])
    stacked = quantize(w, fmt)
    experts = [quantize(w[e], fmt) for e in range(3)]
    for name in ("codes", "scales", "zero_points", "global_scale"):
        if getattr(stacked, name) is None:
            assert getattr(experts[0], name) is None
        else:
            assert torch.equal(getattr(stacked, name), torch.stack([getattr(q, name) for q in experts])), name
    assert torch.equal(dequantize(stacked), torch.stack([dequantize(q) for q in experts]))


@pytest.mark.parametrize("fmt", ["nvfp4", "float8e4m3:tensor", "uint4:g32:zp", "uint4:g32:zpf", "float8e4m3:b128x128",
                                 "int4:g64", "mxfp4", "int8:channel"])
@pytest.mark.parametrize("chunk_experts", [1, 2, 4])
def test_stacked_experts_quantize_a_few_at_a_time_to_the_same_bits(monkeypatch, fmt, chunk_experts):
    # quantize takes at most QUANTIZE_CHUNK_BYTES of float32 experts at once (a 15 GB expert stack
    # ran an 80 GB GPU out of memory in one piece): the same codes, scales, zero points and global
    # scales as one piece, with chunks of 1, 2 and 4 of 5 experts (a short last chunk)
    from humming_aot.quant import weight as weight_module

    w = torch.stack([random_weight(20 + e, (40, 192), magnitude=10.0 ** (e - 2)) for e in range(5)])
    whole = quantize(w, fmt)
    monkeypatch.setattr(weight_module, "QUANTIZE_CHUNK_BYTES", chunk_experts * 4 * w[0].numel())
    chunked = quantize(w, fmt)
    for name in ("codes", "scales", "zero_points", "global_scale"):
        if getattr(whole, name) is None:
            assert getattr(chunked, name) is None, name
        else:
            assert torch.equal(getattr(chunked, name), getattr(whole, name)), name
    # a non-finite value in a later chunk is named by its index in the whole stack
    w[3, 7, 11] = float("inf")
    with pytest.raises(ValueError, match=r"must be finite, but element \(3, 7, 11\) is inf"):
        quantize(w, fmt)


# ------------------------------------------------------------------------------ properties
@st.composite
def weight_cases(draw, templates=tuple(TEMPLATES)):
    template = draw(st.sampled_from(templates))
    group = draw(st.sampled_from([8, 16, 32, 64]))
    fmt = WeightFormat.parse(template.format(g=group))
    n = draw(st.integers(1, 24))
    if fmt.granularity in (ScaleGranularity.GROUP, ScaleGranularity.GROUP_WITH_GLOBAL):
        k = fmt.group_size * draw(st.integers(1, 4))
    else:
        k = draw(st.integers(1, 150))
    lead = draw(st.sampled_from([(), (2,)]))
    magnitude = 10.0 ** draw(st.integers(-4, 4))
    w = random_weight(draw(st.integers(0, 2**31)), (*lead, n, k), magnitude)
    if draw(st.booleans()):
        w[..., : max(1, n // 3), :] = 0  # all-zero groups
    if draw(st.booleans()):
        w = w + magnitude * 0.7  # one-sided groups
    return fmt, w


@settings(max_examples=120, deadline=None)
@given(weight_cases())
def test_dequantize_is_nearest_point_of_each_grid(case):
    fmt, w = case
    qw = quantize(w, fmt)
    qw.validate()
    assert qw.codes.dtype == torch.uint8 and qw.shape == tuple(w.shape)
    assert qw.scales.shape == fmt.scale_shape(w.shape)
    assert_nearest_grid_point(w, qw)


# Integer grids chosen from amax (MX power-of-two scales clip by design, so they are left out).
INT_TEMPLATES = tuple(t for t in TEMPLATES if "int" in t and "float8e8m0" not in t)


@settings(max_examples=60, deadline=None)
@given(weight_cases(INT_TEMPLATES))
def test_integer_error_within_half_a_step(case):
    fmt, w = case
    elem = formats.get(fmt.element)
    assert elem.is_integer
    qw = quantize(w, fmt)
    step = per_element(qw, qw.scales)
    # The scale was rounded to the scale dtype (by at most half an ulp, or half the subnormal
    # spacing), which can move the clipped edge of the grid by up to 2^b times that.
    scale_fmt = formats.get(fmt.scale_dtype)
    scale_error = torch.clamp(step * 2.0 ** -(scale_fmt.mantissa_bits + 1), min=scale_fmt.smallest_positive / 2)
    bound = step * 0.5 + elem.num_codes * scale_error + w.abs() * 2.0**-20
    assert bool(((dequantize(qw) - w).abs() <= bound).all())
    if qw.zero_points is not None:
        zeros = w == 0
        assert bool((dequantize(qw)[zeros] == 0).all())  # 0 is exactly on every zero-point grid


@pytest.mark.parametrize("text", CANONICAL + ["int1:g16", "float4e0m3:g16", "float3e1m1:channel:s=float8e4m3"])
def test_all_zero_groups_are_safe(text):
    fmt = WeightFormat.parse(text)
    k = 2 * (fmt.group_size or 64)
    w = random_weight(5, (2, 256, k))
    w[0] = 0
    w[1, :128] = 0
    qw = quantize(w, fmt)
    qw.validate()
    deq = dequantize(qw)
    assert bool(torch.isfinite(qw.scales).all()) and bool((qw.scales > 0).all())
    assert bool(torch.isfinite(deq).all()) and bool((deq[0] == 0).all()) and bool((deq[1, :128] == 0).all())
    zero_tile_scales = qw.scales[0]
    assert bool((zero_tile_scales == 1.0).all())
    if qw.global_scale is not None:
        assert qw.global_scale[0].item() == 1.0


def test_underflowing_scale_gets_smallest_positive():
    w = random_weight(6, (2, 32))
    w[1] *= 1e-9  # its block scale, amax / 6 / global, is far below float8e4m3's smallest 2^-9
    qw = quantize(w, "nvfp4")
    qw.validate()
    assert qw.scales[1].tolist() == [2.0**-9, 2.0**-9]
    assert bool(torch.isfinite(dequantize(qw)).all())


def test_quantize_rejects_bad_weights():
    with pytest.raises(ValueError, match=r"must be finite, but element \(1, 2\) is nan"):
        w = torch.zeros(4, 32)
        w[1, 2] = math.nan
        quantize(w, "int4:g32")
    with pytest.raises(ValueError, match="weights have shape"):
        quantize(torch.zeros(32), "int4:g32")
    with pytest.raises(ValueError, match="non-empty floating point"):
        quantize(torch.zeros(4, 32, dtype=torch.int32), "int4:g32")
    with pytest.raises(ValueError, match="K=48 is not a multiple of the group size 32"):
        quantize(torch.zeros(4, 48), "int4:g32")


def test_quantized_weight_checks():
    qw = quantize(random_weight(7, (8, 64)), "uint4:g32:zp")
    fields = dict(format=qw.format, codes=qw.codes, scales=qw.scales, zero_points=qw.zero_points)
    with pytest.raises(ValueError, match=r"scales must have shape \(8, 2\)"):
        QuantizedWeight(**{**fields, "scales": qw.scales[:, :1]})
    with pytest.raises(ValueError, match="codes must be torch.uint8"):
        QuantizedWeight(**{**fields, "codes": qw.codes.to(torch.int32)})
    with pytest.raises(ValueError, match="zero_points must be a torch.uint8"):
        QuantizedWeight(**{**fields, "zero_points": None})
    with pytest.raises(ValueError, match="has no global scale"):
        QuantizedWeight(**fields, global_scale=torch.tensor(1.0))
    with pytest.raises(ValueError, match="use WeightFormat.parse"):
        QuantizedWeight(**{**fields, "format": "uint4:g32:zp"})
    with pytest.raises(ValueError, match=r"codes lie in \[0, 15\]"):
        QuantizedWeight(**{**fields, "codes": qw.codes | 16}).validate()
    with pytest.raises(ValueError, match="must be positive"):
        QuantizedWeight(**{**fields, "scales": -qw.scales}).validate()
    with pytest.raises(ValueError, match="exactly representable in bfloat16"):
        bf16 = WeightFormat.parse("uint4:g32:zp:s=bfloat16")
        QuantizedWeight(**{**fields, "format": bf16, "scales": torch.full((8, 2), 1 + 2.0**-12)}).validate()
    nan_codes = quantize(random_weight(7, (8, 64)), "float8e4m3:channel")
    with pytest.raises(ValueError, match="NaN encodings"):
        QuantizedWeight(format=nan_codes.format, codes=nan_codes.codes | 0x7F, scales=nan_codes.scales).validate()
    moved = qw.to("cpu")
    assert moved.format == qw.format and torch.equal(moved.codes, qw.codes) and moved.device.type == "cpu"


# ------------------------------------------------------------------------------ activations
def test_int8_per_token_matches_vllm_reference():
    a = random_weight(8, (3, 5, 64), magnitude=4.0)
    qa = quantize_activation(a, "int8", "token")
    scale = a.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.round(a / scale).clamp(-128, 127)
    assert torch.equal(qa.scales, scale) and torch.equal(qa.codes.view(torch.int8).float(), q)
    assert torch.equal(dequantize_activation(qa), q * scale)


@pytest.mark.parametrize("granularity,group_size", [("token", None), ("group", 128), ("tensor", None)])
def test_fp8_activation_matches_amax_over_448(granularity, group_size):
    a = random_weight(9, (7, 256), magnitude=3.0)
    qa = quantize_activation(a, "float8e4m3", granularity, group_size=group_size)
    cols = {"token": 256, "group": 128, "tensor": 256}[granularity]
    amax = a.reshape(7, -1, cols).abs().amax(dim=-1, keepdim=True)
    if granularity == "tensor":
        amax = amax.amax()
    scale = amax / 448
    expected = (a.reshape(7, -1, cols) / scale).to(torch.float8_e4m3fn)
    assert torch.equal(qa.codes, expected.view(torch.uint8).reshape(7, 256))
    assert torch.equal(qa.scales.flatten(), scale.flatten())
    assert torch.equal(dequantize_activation(qa), (expected.float() * scale).reshape(7, 256))


def test_static_per_tensor_activation():
    a = random_weight(10, (4, 64), magnitude=100.0)
    qa = quantize_activation(a, "float8e4m3", ActivationGranularity.TENSOR, static_scale=0.125)
    assert qa.scales.tolist() == [0.125]
    saturated = (a / 0.125).clamp(-448, 448)  # torch's cast saturates only from torch 2.12 on
    assert torch.equal(qa.codes, saturated.to(torch.float8_e4m3fn).view(torch.uint8))
    qa5 = quantize_activation(a, "float8e5m2", "tensor", static_scale=torch.tensor([2.0]))
    assert torch.equal(qa5.codes, formats.get("float8e5m2").encode(a / 2.0))


@pytest.mark.parametrize("element", ["float8e5m2", "float8e4m3", "float4e2m1"])
def test_a_quotient_past_float32_saturates(element):
    """A static scale small enough that a / s overflows float32 gives the largest code with the
    value's sign, as a finite quotient past the largest value does (and as the kernels'
    cvt.satfinite), not float8e5m2's inf."""
    a = torch.tensor([[3.0e38, -3.0e38, 1.0e30, -2.0, 0.0, 1.0e-3, 7.0, -1.0e36]])
    qa = quantize_activation(a, element, "tensor", static_scale=1.0e-20)
    elem = formats.get(element)
    top = elem.encode(torch.tensor([elem.max_value, -elem.max_value]))
    expected = torch.where(a > 0, top[0], top[1])
    expected[0, 4] = elem.encode(torch.tensor([0.0]))[0]
    assert torch.equal(qa.codes, expected.to(qa.codes.dtype))
    assert torch.isfinite(dequantize_activation(qa)).all()


def test_mxfp4_and_nvfp4_activations():
    a = random_weight(11, (6, 128), magnitude=2.0)
    mx = quantize_activation(a, "float4e2m1", "group", group_size=32, scale_dtype="float8e8m0")
    assert torch.equal(mx.codes, quantize(a, "mxfp4").codes) and torch.equal(mx.scales, quantize(a, "mxfp4").scales)
    nv = quantize_activation(a, "float4e2m1", "group", group_size=16, scale_dtype="float8e4m3", global_scale=0.002)
    g = torch.tensor(0.002)
    block_scale = (a.reshape(6, 8, 16).abs().amax(dim=-1, keepdim=True) / 6 / g).clamp(max=448)
    block_scale = block_scale.to(torch.float8_e4m3fn).float()  # this global scale is too small: saturates
    assert torch.equal(nv.scales, block_scale[..., 0]) and nv.global_scale.item() == g.item()
    assert torch.equal(nv.codes, e2m1_codes((a.reshape(6, 8, 16) / (block_scale * g)).reshape(6, 128)))
    dynamic = quantize_activation(a, "float4e2m1", "group", group_size=16, scale_dtype="float8e4m3")
    assert torch.equal(dynamic.global_scale, a.abs().amax() / (448 * 6))
    assert torch.equal(quantize(a, "nvfp4").codes, dynamic.codes)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["int8", "int4", "float8e4m3", "float8e5m2", "float4e2m1"]),
       st.sampled_from([("token", None), ("group", 16), ("group", 32), ("tensor", None)]),
       st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**31), st.integers(-3, 3))
def test_activation_dequantize_is_nearest(element, gran, rows, groups, seed, exponent):
    granularity, group_size = gran
    a = random_weight(seed, (rows, 32 * groups), 10.0**exponent)
    a[0] = 0
    qa = quantize_activation(a, element, granularity, group_size=group_size)
    deq = dequantize_activation(qa)
    values = formats.get(element).values()
    values = values[torch.isfinite(values)]
    per_elem = qa.scales if granularity == "tensor" else qa.scales.repeat_interleave(32 * groups // qa.scales.shape[-1], dim=-1)
    best = (values * per_elem[..., None] - a[..., None]).abs().min(dim=-1).values
    assert bool(((deq - a).abs() <= best + a.abs() * 2.0**-20).all()) and bool((deq[0] == 0).all())


def test_activation_errors():
    a = torch.randn(4, 64)
    with pytest.raises(ValueError, match="signed format of 2 to 8 bits"):
        quantize_activation(a, "uint8", "token")
    with pytest.raises(ValueError, match="signed format of 2 to 8 bits"):
        quantize_activation(a, "int1", "token")
    with pytest.raises(ValueError, match="K=64 is not a multiple of the activation group size 48"):
        quantize_activation(a, "int8", "group", group_size=48)
    with pytest.raises(ValueError, match="static scale is one per-tensor scale"):
        quantize_activation(a, "int8", "token", static_scale=1.0)
    with pytest.raises(ValueError, match="second level of float8e4m3 scales"):
        quantize_activation(a, "float4e2m1", "group", group_size=16, global_scale=1.0)
    with pytest.raises(ValueError, match="positive and finite"):
        quantize_activation(a, "float8e4m3", "tensor", static_scale=0.0)
    with pytest.raises(ValueError, match="needs no second level"):
        quantize_activation(a, "float8e4m3", "tensor", scale_dtype="float8e4m3")
    with pytest.raises(ValueError, match="must be finite"):
        quantize_activation(torch.full((2, 8), math.inf), "int8", "token")
    with pytest.raises(ValueError, match="'row' is not a valid ActivationGranularity"):
        quantize_activation(a, "int8", "row")


# ------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_gives_the_same_bits_as_the_cpu():
    """Guards the tensor-by-tensor divisions and exact powers of two: CUDA's division by a Python
    scalar and torch.ldexp both round differently from the CPU."""
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(50000, generator=gen) * torch.exp2(torch.randint(-30, 30, (50000,), generator=gen).float())
    for name in formats.all_names()[:-3]:
        fmt = formats.get(name)
        codes = fmt.encode(x)
        assert torch.equal(fmt.encode(x.cuda()).cpu(), codes), name
        decoded = fmt.decode(codes.cuda()).cpu()
        assert torch.equal(decoded.nan_to_num(7.0), fmt.decode(codes).nan_to_num(7.0)), name
    w = random_weight(13, (2, 256, 512))
    for text in CANONICAL:
        cpu, gpu = quantize(w, text), quantize(w.cuda(), text)
        for field in ("codes", "scales", "zero_points", "global_scale"):
            expected, actual = getattr(cpu, field), getattr(gpu, field)
            assert (expected is None) == (actual is None) and (expected is None or torch.equal(actual.cpu(), expected)), (text, field)
        assert torch.equal(dequantize(gpu).cpu(), dequantize(cpu)), text
    a = random_weight(14, (64, 512))
    for args, kwargs in [(("int8", "token"), {}), (("float8e4m3", "group"), {"group_size": 128}),
                         (("float4e2m1", "group"), {"group_size": 16, "scale_dtype": "float8e4m3"})]:
        cpu, gpu = quantize_activation(a, *args, **kwargs), quantize_activation(a.cuda(), *args, **kwargs)
        assert torch.equal(gpu.codes.cpu(), cpu.codes) and torch.equal(gpu.scales.cpu(), cpu.scales), args
        assert torch.equal(dequantize_activation(gpu).cpu(), dequantize_activation(cpu)), args


# Every code width of every element kind (integer, integer and float zero points, float), for the
# packed layout's folds: 1-3 and 5-7-bit codes are folded into 4- or 8-bit words differently.
EVERY_WIDTH = ([f"int{b}:g64" for b in range(1, 9)] + [f"uint{b}:g64:zp" for b in range(1, 9)]
               + [f"uint{b}:g64:zpf:s=bfloat16" for b in range(1, 9)]
               + ["float3e1m1:g32", "float4e2m1:g32", "float5e2m2:g32", "float6e3m2:g32", "float7e3m3:g32",
                  "float8e4m3:g32"])


def _pack_fields(packed) -> list[tuple[str, object]]:
    return [(name, getattr(packed, name)) for name in
            ("w", "w_scale", "w_zero_point", "n", "k", "group_size", "w_dtype", "act_dtype", "format",
             "global_scale", "float_zero_point", "layout_version")]


def _assert_same_pack(cpu_qw, gpu_qw, act, what):
    """pack on the CPU and on CUDA give the same fields, bit for bit; or both refuse, alike."""
    try:
        cpu = pack(cpu_qw, act_dtype=act)
    except ValueError as refused:
        with pytest.raises(ValueError) as also:
            pack(gpu_qw, act_dtype=act)
        assert str(also.value) == str(refused), what
        return
    gpu = pack(gpu_qw, act_dtype=act)
    assert gpu.w.is_cuda, what
    for (name, expected), (_, actual) in zip(_pack_fields(cpu), _pack_fields(gpu)):
        if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
            assert actual is not None and expected is not None, (what, name)
            assert_bitwise_equal(actual.cpu(), expected, f"{what} {name}")
        else:
            assert actual == expected, (what, name, actual, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("text", CANONICAL + EVERY_WIDTH)
def test_cuda_packs_the_same_bits_as_the_cpu(text, act):
    """pack(quantize(w)) on CUDA equals the CPU's bit for bit, for every canonical format and every
    code width: the quantizer's own codes, then every code of the element (with_every_code: the
    quantizer's int1 codes are all one value, which leaves the fold untested). A format pack
    refuses (uint8:tensor:zp has no kernel) must be refused alike on both."""
    w = random_weight(15, (256, 512))
    _assert_same_pack(quantize(w, text), quantize(w.cuda(), text), act, f"{text} quantized")
    every = with_every_code(quantize(w, text), torch.Generator().manual_seed(16))
    _assert_same_pack(every, every.to("cuda"), act, f"{text} every code")
