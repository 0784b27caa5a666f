"""Every committed fixture (tests/fixtures/checkpoints, written by the real producers; see its
README) loads, and the loader's dequantization equals the producer's own, bit for bit in the
producer's dtype (round-trip check 1)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from ckpt_fixture_utils import FIXTURES, fixture, fixture_names, original_weight, reference

from humming_aot import checkpoints
from humming_aot.quant import dequantize

# How each producer rounds when it dequantizes, where that is not one rounding of the exact
# product (the loader keeps the file's scales exactly; these emulate the producer's arithmetic):
# transformers' fp8 dequantizer casts the float32 scales to bfloat16 before multiplying, and HQQ
# computes (W_q - zero) and then * scale in bfloat16, rounding both steps.
SCALES_ROUNDED_FIRST = {"fp8_block_float"}
TWO_STEP_BF16 = {"hqq_4bit_g64_axis1"}
REFUSED = {"hqq_4bit_g64_axis0": "axis is 0"}  # checked in test_checkpoint_roundtrip


def _two_step(qw) -> torch.Tensor:
    g = qw.format.group_size
    codes = qw.codes.to(torch.bfloat16)
    zeros = qw.zero_points.repeat_interleave(g, dim=-1).to(torch.bfloat16)
    scales = qw.scales.repeat_interleave(g, dim=-1).to(torch.bfloat16)
    return (codes - zeros) * scales


@pytest.mark.parametrize("name", [n for n in fixture_names() if n not in REFUSED])
def test_loader_matches_producer_dequantization(name):
    ref = reference(name)
    layers = checkpoints.quantized_layers(fixture(name))
    assert layers, f"{name}: no quantized layer found"
    for prefix in layers:
        layer = checkpoints.load_layer(fixture(name), prefix)
        layer.weight.validate()
        expected = ref[prefix]
        if name in TWO_STEP_BF16:
            got = _two_step(layer.weight)
        elif name in SCALES_ROUNDED_FIRST:
            rounded = layer.weight.scales.to(expected.dtype).to(torch.float32)
            got = dequantize(dataclasses.replace(layer.weight, scales=rounded)).to(expected.dtype)
        else:
            got = layer.reference_weight().to(expected.dtype)
        assert got.shape == expected.shape, (name, prefix)
        bad = (got != expected) & ~(torch.isnan(got) & torch.isnan(expected))
        assert not bool(bad.any()), (
            f"{name} {prefix} ({layer.weight.format}): {int(bad.sum())} elements differ from the producer's "
            f"dequantization, first at {tuple(int(i) for i in bad.nonzero()[0])}")


@pytest.mark.parametrize("name", [n for n in fixture_names() if n not in REFUSED])
def test_inspect_lists_every_fixture_layer(name):
    rows = checkpoints.inspect(fixture(name))
    assert [r.prefix for r in rows] == checkpoints.quantized_layers(fixture(name))
    for row in rows:
        assert row.error is None and row.n > 0 and row.k > 0, row


# Producers without a dequantizer of their own export: the error against the float weight they
# quantized lies inside the format's band (docs/CHECKPOINTS.md), and the same weight with its
# scales inverted lies far outside it.
BANDS = {"float8e4m3": 0.03, "mxfp8": 0.03, "nvfp4": 0.11, "mxfp4": 0.13, "int4": 0.15, "uint4": 0.15}
BAND_FIXTURES = sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith(("modelopt_", "autoround_")))


@pytest.mark.parametrize("name", BAND_FIXTURES)
def test_error_band_against_the_original_weight(name):
    for prefix in checkpoints.quantized_layers(fixture(name)):
        layer = checkpoints.load_layer(fixture(name), prefix)
        layer.weight.validate()
        original = original_weight(name, prefix).to(torch.float64)
        fmt = layer.weight.format
        band = BANDS[str(fmt) if str(fmt) in BANDS else fmt.element]
        error = float((layer.reference_weight().to(torch.float64) - original).norm() / original.norm())
        assert error < band, f"{name} {prefix} ({fmt}): relative error {error:.4f} outside {band}"
        qw = layer.weight
        if qw.global_scale is not None:  # ModelOpt's weight_scale_2 read as compressed-tensors' divisor
            inverted = dataclasses.replace(qw, global_scale=1.0 / qw.global_scale)
        else:
            inverted = dataclasses.replace(qw, scales=1.0 / qw.scales)
        bad = dataclasses.replace(layer, weight=inverted).reference_weight().to(torch.float64)
        assert float((bad - original).norm() / original.norm()) > 1.0
