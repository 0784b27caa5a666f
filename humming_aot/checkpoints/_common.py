"""Helpers the schema modules share: scale dtypes, bias, and turning GPTQ-style offset codes into
the canonical form."""
from __future__ import annotations

import torch

from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader

# safetensors dtype -> (torch dtype, humming_aot scale dtype name)
FLOAT_SCALE_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
E8M0_DTYPES = ("U8", "F8_E8M0")
FLOAT_DTYPES = ("F16", "BF16", "F32")


def float_scales(reader: CheckpointReader, name: str, shape=None, what: str = "") -> tuple[torch.Tensor, str]:
    """A float16/bfloat16/float32 scale tensor as exact float32 values, and its dtype name."""
    t = reader.tensor(name, tuple(FLOAT_SCALE_DTYPES), shape, what)
    return t.to(torch.float32), FLOAT_SCALE_DTYPES[reader.dtype_name(name)]


def check_scales_positive(reader: CheckpointReader, name: str, scales: torch.Tensor) -> None:
    if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
        bad = float(scales[~(torch.isfinite(scales) & (scales > 0))].flatten()[0])
        raise CheckpointError(f"{reader.file_of(name)}: tensor {name!r} holds a scale of {bad}; scales must be positive "
                              "and finite (the file is corrupt, or was written by a broken exporter)")


def scalar_scale(reader: CheckpointReader, name: str, dtypes: tuple[str, ...], what: str,
                 why: str = "it holds one value") -> torch.Tensor:
    """A positive, finite one-value scale tensor (0-d or of one element) as a 0-d float32 tensor;
    `why` ends the error for any other shape."""
    t = reader.tensor(name, dtypes, None, what).to(torch.float32)
    if t.numel() != 1:
        raise CheckpointError(f"{reader.file_of(name)}: tensor {name!r} has shape {tuple(t.shape)}; {why}")
    check_scales_positive(reader, name, t)
    return t.reshape(())


def e8m0_scales(reader: CheckpointReader, name: str, shape=None, what: str = "") -> torch.Tensor:
    """uint8 / float8_e8m0fnu biased exponents as float32 2^(e - 127); 0xFF (NaN) is refused."""
    from humming_aot.checkpoints.bitstream import e8m0_to_float32

    t = reader.tensor(name, E8M0_DTYPES, shape, what)
    raw = t.view(torch.uint8)
    if bool((raw == 0xFF).any()):
        raise CheckpointError(f"{reader.file_of(name)}: tensor {name!r} holds the e8m0 NaN code 0xFF; a scale must be "
                              "finite (the file is corrupt)")
    return e8m0_to_float32(raw)


def optional_bias(reader: CheckpointReader, prefix: str, n: int) -> torch.Tensor | None:
    name = f"{prefix}.bias"
    if not reader.has(name):
        return None
    return reader.tensor(name, FLOAT_DTYPES, (n,), "a bias")


def offset_to_signed(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Offset codes u (zero point 2^(b-1)) as two's complement bits c of the same value:
    u - 2^(b-1) == decode_int(c) with c = u XOR 2^(b-1)."""
    return codes ^ (1 << (bits - 1))


def group_format(element: str, k: int, group_size: int, scale_dtype: str, zero_point: str = "") -> str:
    """'int4:g128:s=float16', or ':channel' when one group spans K."""
    gran = "channel" if group_size in (-1, 0, k) else f"g{group_size}"
    zp = f":{zero_point}" if zero_point else ""
    return f"{element}:{gran}{zp}:s={scale_dtype}"
