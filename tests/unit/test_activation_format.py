"""ActivationFormat (humming_aot/quant/activation_format.py): the activation side of a pairing,
spelled like WeightFormat, parsing what it prints, refusing what it cannot name, and quantizing
exactly as the references of humming_aot.quant.activation."""
from __future__ import annotations

import pytest
import torch

from humming_aot.quant import ACTIVATION_PRESETS, ActivationFormat, ActivationGranularity, quantize_activation


@pytest.mark.parametrize("text,element,granularity,group,scale_dtype", [
    ("float8e4m3:token", "float8e4m3", "token", None, "float32"),
    ("float8e4m3:tensor", "float8e4m3", "tensor", None, "float32"),
    ("float8e4m3:g128", "float8e4m3", "group", 128, "float32"),
    ("int8:token", "int8", "token", None, "float32"),
    ("int4:token", "int4", "token", None, "float32"),
    ("float8e5m2:token:s=bfloat16", "float8e5m2", "token", None, "bfloat16"),
    ("mxfp4", "float4e2m1", "group", 32, "float8e8m0"),
    ("mxfp8", "float8e4m3", "group", 32, "float8e8m0"),
    ("nvfp4", "float4e2m1", "group", 16, "float8e4m3"),
])
def test_formats_parse_and_print_back(text, element, granularity, group, scale_dtype):
    fmt = ActivationFormat.parse(text)
    assert (fmt.element, fmt.granularity, fmt.group_size, fmt.scale_dtype) == (
        element, ActivationGranularity(granularity), group, scale_dtype)
    assert str(fmt) == text and ActivationFormat.parse(str(fmt)) == fmt and ActivationFormat.parse(fmt) is fmt
    assert fmt.has_global_scale == (scale_dtype == "float8e4m3")


def test_spelled_out_presets_print_as_the_preset():
    assert str(ActivationFormat.parse("float4e2m1:g16:s=float8e4m3")) == "nvfp4"
    assert str(ActivationFormat.parse("float4e2m1:g32:s=float8e8m0")) == "mxfp4"
    assert ActivationFormat(element="float8e4m3", granularity="token") == ActivationFormat.parse("float8e4m3:token")
    assert set(ACTIVATION_PRESETS) == {"mxfp4", "mxfp8", "nvfp4"}


@pytest.mark.parametrize("text,message", [
    ("float8e4m3", "it has no granularity field"),
    ("float8e4m3:channel", "'channel' is not a granularity"),
    ("float8e4m3:g0", "'g0' is not a granularity"),
    ("float8e4m3:token:zp", "'zp' is not an option"),
    ("float8e4m3:token:s=float16:s=float16", "is not an option \\(or repeats one\\)"),
    ("nvfp4:g16", "the preset 'nvfp4' takes no fields"),
    ("uint8:token", "use a signed format of 2 to 8 bits"),
    ("bfloat16:token", "use a signed format of 2 to 8 bits"),
    ("float8e4m3:token:s=int8", "scale dtype 'int8' is not supported"),
    ("float8e4m3:tensor:s=float8e4m3", "one per-tensor scale needs no second level"),
    ("int9:token", "int9"),
])
def test_malformed_formats_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        ActivationFormat.parse(text)


def test_a_format_that_is_not_a_string_is_refused():
    with pytest.raises(ValueError, match="an activation format is a str like 'float8e4m3:token', got int"):
        ActivationFormat.parse(8)
    with pytest.raises(ValueError, match="granularity 'channel' is not one of tensor, token, group"):
        ActivationFormat(element="int8", granularity="channel")


@pytest.mark.parametrize("text", ["float8e4m3:token", "float8e4m3:g128", "int8:token", "mxfp4", "nvfp4"])
def test_quantize_is_the_reference_recipe_bit_for_bit(text):
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(5, 256, generator=gen).to(torch.bfloat16)
    fmt = ActivationFormat.parse(text)
    ours = fmt.quantize(a)
    ref = quantize_activation(a, fmt.element, fmt.granularity, group_size=fmt.group_size, scale_dtype=fmt.scale_dtype)
    assert torch.equal(ours.codes, ref.codes) and torch.equal(ours.scales, ref.scales)
    assert (ours.global_scale is None) == (ref.global_scale is None) == (not fmt.has_global_scale)


def test_static_and_global_scales_pass_through():
    a = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    static = ActivationFormat.parse("float8e4m3:tensor").quantize(a, static_scale=0.5)
    assert static.scales.tolist() == [0.5]
    two_level = ActivationFormat.parse("nvfp4").quantize(a, global_scale=0.25)
    assert float(two_level.global_scale) == 0.25
    with pytest.raises(ValueError, match="a static scale is one per-tensor scale"):
        ActivationFormat.parse("float8e4m3:token").quantize(a, static_scale=0.5)
