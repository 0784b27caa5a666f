"""humming_aot.quant.io: safetensors round trip and the errors a damaged file produces."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from humming_aot.quant import QuantizedWeight, dequantize, load_quantized, quantize, save_quantized
from humming_aot.quant.io import FORMAT_KEY, LAYOUT, LAYOUT_KEY


def sample(fmt: str, shape=(2, 64, 128)) -> QuantizedWeight:
    return quantize(torch.randn(shape, generator=torch.Generator().manual_seed(0)), fmt)


@pytest.mark.parametrize(
    "fmt,shape",
    [("int4:g128", (64, 128)), ("uint4:g64:zp", (2, 64, 128)), ("nvfp4", (64, 128)), ("nvfp4", (2, 64, 128)),
     ("mxfp4", (64, 128)), ("float8e4m3:b128x128", (200, 300)), ("uint3:g32:zpf:s=bfloat16", (64, 128)),
     ("float8e4m3:tensor", (2, 64, 128))],
)
def test_round_trip(tmp_path, fmt, shape):
    qw = sample(fmt, shape)
    path = tmp_path / "w.safetensors"
    save_quantized(qw, path)
    loaded = load_quantized(path, device="cpu")
    assert loaded.format == qw.format and str(loaded.format) == fmt
    for name in ("codes", "scales", "zero_points", "global_scale"):
        original, restored = getattr(qw, name), getattr(loaded, name)
        assert (original is None) == (restored is None), name
        if original is not None:
            assert restored.dtype == original.dtype and torch.equal(restored, original), name
    assert torch.equal(dequantize(loaded), dequantize(qw))


def rewrite(path, *, tensors=None, metadata=None):
    """Re-save the file at ``path`` with edited tensors and metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        old_metadata = f.metadata()
    new_tensors = load_file(str(path))
    new_tensors.update(tensors or {})
    new_tensors = {k: v for k, v in new_tensors.items() if v is not None}
    save_file(new_tensors, str(path), metadata={**old_metadata, **(metadata or {})})


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "w.safetensors"
    save_quantized(sample("uint4:g64:zp", (64, 128)), path)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_quantized(tmp_path / "absent.safetensors")


def test_not_a_safetensors_file(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_quantized(path)


def test_plain_safetensors_without_metadata(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file({"codes": torch.zeros(4, 4, dtype=torch.uint8)}, str(path))
    with pytest.raises(ValueError, match="not written by humming_aot.quant.save_quantized"):
        load_quantized(path)


def test_wrong_layout(saved):
    rewrite(saved, metadata={LAYOUT_KEY: "quantized_weight.v0"})
    with pytest.raises(ValueError, match=rf"{LAYOUT_KEY}='quantized_weight.v0'.*expected '{LAYOUT}'"):
        load_quantized(saved)


def test_bad_format_metadata(saved):
    rewrite(saved, metadata={FORMAT_KEY: "uint4:h64"})
    with pytest.raises(ValueError, match=r"bad humming_aot.weight_format metadata.*'h64' is not a granularity"):
        load_quantized(saved)


def test_format_that_does_not_fit_the_tensors(saved):
    rewrite(saved, metadata={FORMAT_KEY: "uint4:g32:zp"})
    with pytest.raises(ValueError, match=r"format uint4:g32:zp\): scales must have shape \(64, 4\).*got \(64, 2\)"):
        load_quantized(saved)


def test_missing_tensor(saved):
    rewrite(saved, tensors={"scales": None})
    with pytest.raises(ValueError, match="tensor 'scales' is missing"):
        load_quantized(saved)


def test_missing_zero_points(saved):
    rewrite(saved, tensors={"zero_points": None})
    with pytest.raises(ValueError, match="zero_points must be a torch.uint8 torch.Tensor"):
        load_quantized(saved)


def test_unexpected_tensor(saved):
    rewrite(saved, tensors={"bias": torch.zeros(64)})
    with pytest.raises(ValueError, match=r"unexpected tensors \['bias'\]"):
        load_quantized(saved)


def test_shape_mismatch(saved):
    rewrite(saved, tensors={"scales": torch.ones(32, 2)})
    with pytest.raises(ValueError, match=r"scales must have shape \(64, 2\)"):
        load_quantized(saved)


def test_values_are_validated(saved):
    rewrite(saved, tensors={"zero_points": torch.full((64, 2), 16, dtype=torch.uint8)})
    with pytest.raises(ValueError, match=r"zero points of uint4 lie in \[0, 15\], got 16"):
        load_quantized(saved)


def test_save_rejects_other_objects(tmp_path):
    with pytest.raises(ValueError, match="expects a QuantizedWeight"):
        save_quantized({"codes": torch.zeros(1)}, tmp_path / "x.safetensors")
