"""GPTQ checkpoints (``quant_method: gptq``; GPTQModel, AutoGPTQ, optimum; auto-round's
``auto_round:auto_gptq`` export).

Per layer with weight (N, K), b bits, group size g::

    qweight  int32 (ceil(K b / 32), N)   codes along K, an LSB-first bitstream per column
    qzeros   int32 (K / g, ceil(N b / 32)) zero points along N, the same bitstream
    scales   float16 (K / g, N)          multipliers
    g_idx    int32 (K,)                  group of each k (optional; k // g when absent)
    W[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]

Zero points: ``checkpoint_format`` (or ``format``) ``gptq`` (v1, the default) stores z - 1, written
by subtracting 0x55555555 / 0x11111111 / 0x01010101 (2 / 4 / 8 bits) from whole int32 words; it
is undone here by adding the same constant word-wise before unpacking, which is exact even when a
zero of 0 borrowed from the next field. 3 bits (fields that straddle words) add 1 per field.
``gptq_v2`` stores z.

Act-order (``g_idx`` not equal to k // g): K is sorted by group at load time and the permutation
is returned as ``CheckpointLayer.input_perm``; the layer gathers its activations with it.
"""
from __future__ import annotations

import torch

from humming_aot.checkpoints._common import float_scales, group_format, offset_to_signed, optional_bias
from humming_aot.checkpoints.bitstream import unpack_bitstream, words_to_int64
from humming_aot.checkpoints.config import QuantConfig
from humming_aot.checkpoints.layer import CheckpointLayer
from humming_aot.checkpoints.reader import CheckpointError, CheckpointReader
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import WeightFormat

__all__ = ["MARKER", "load_layer"]

MARKER = ".qweight"
BITS = (2, 3, 4, 8)
_V1_WORD_OFFSET = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}


def _settings(qc: QuantConfig, prefix: str) -> tuple[int, int, bool, str]:
    cfg = {**qc.config, **qc.gptq_overrides(prefix)}
    bits = cfg.get("bits")
    if bits not in BITS:
        fmt = cfg.get("format", cfg.get("checkpoint_format"))
        hint = " (GPTQModel writes 5/6/7 bits, and 3 bits under 'gptq_p', in a planar layout)" if bits in (5, 6, 7) \
            or fmt == "gptq_p" else ""
        raise qc.key_error("bits", f"is {bits!r}; humming_aot loads GPTQ with {BITS} bits{hint}")
    group = cfg.get("group_size", 128)
    if not isinstance(group, int) or (group < 1 and group != -1):
        raise qc.key_error("group_size", f"is {group!r}; expected a positive integer or -1 (per channel)")
    pack_dtype = str(cfg.get("pack_dtype", "int32")).replace("torch.", "")
    if pack_dtype != "int32":
        raise qc.key_error("pack_dtype", f"is {pack_dtype!r}; humming_aot loads int32-packed GPTQ only "
                                         "(re-save with pack_dtype=int32)")
    version = str(cfg.get("checkpoint_format") or cfg.get("format") or "gptq")
    if version not in ("gptq", "gptq_v2"):
        raise qc.key_error("checkpoint_format", f"is {version!r}; humming_aot loads 'gptq' (v1) and 'gptq_v2'")
    return bits, group, bool(cfg.get("sym", True)), version


def _zeros(reader: CheckpointReader, name: str, bits: int, n: int, groups: int, version: str) -> torch.Tensor:
    words = reader.tensor(name, ("I32",), (groups, -(-n * bits // 32)), f"GPTQ qzeros of {bits}-bit N={n}")
    if version == "gptq_v2":
        return unpack_bitstream(words, bits, n)
    if bits in _V1_WORD_OFFSET:
        restored = (words_to_int64(words) + _V1_WORD_OFFSET[bits]) & 0xFFFFFFFF
        return unpack_bitstream(restored.to(torch.int64), bits, n)
    return (unpack_bitstream(words, bits, n) + 1) & ((1 << bits) - 1)


def _fold_negative_scales(scales: torch.Tensor, zeros: torch.Tensor, codes: torch.Tensor, bits: int, k: int,
                          group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """auto-round's symmetric RTN writes negative scales (its scale is the signed extreme / -2^(b-1)).
    (q - z) s == ((M - q) - (M - z)) (-s) with M = 2^b - 1, so such groups keep their value with
    mirrored codes and zero point and a positive scale: exact, and the result has a zero point."""
    negative = scales < 0  # (N, G)
    if not bool(negative.any()):
        return scales, zeros, codes
    top = (1 << bits) - 1
    g = k if group == -1 else group
    per_code = negative.repeat_interleave(g, dim=1)  # (N, K)
    codes = torch.where(per_code, top - codes, codes).to(torch.uint8)
    zeros = torch.where(negative, top - zeros, zeros).to(torch.uint8)
    return scales.abs(), zeros, codes


def load_layer(reader: CheckpointReader, qc: QuantConfig, prefix: str) -> CheckpointLayer:
    bits, group, sym, version = _settings(qc, prefix)
    qweight_name = prefix + MARKER
    rows, n = reader.shape(qweight_name) if len(reader.shape(qweight_name)) == 2 else (None, None)
    if n is None:
        raise CheckpointError(f"{reader.file_of(qweight_name)}: tensor {qweight_name!r} has shape "
                              f"{reader.shape(qweight_name)}, expected (K * {bits} / 32, N)")
    scales_name = f"{prefix}.scales"
    groups = reader.shape(scales_name)[0] if reader.has(scales_name) else None
    scales, scale_dtype = float_scales(reader, scales_name, (None, n), "GPTQ scales (K / group, N)")
    k = rows * 32 // bits
    if group != -1 and groups * group != k:
        raise CheckpointError(f"{reader.file_of(scales_name)}: tensor {scales_name!r} has {groups} groups, but "
                              f"qweight holds K={k} and group_size is {group}; the file does not match its config")
    words = reader.tensor(qweight_name, ("I32",), (k * bits // 32, n), f"GPTQ qweight of {bits}-bit")
    codes = unpack_bitstream(words.t(), bits, k)  # (N, K) offset codes
    zeros = _zeros(reader, f"{prefix}.qzeros", bits, n, groups, version).t().contiguous()  # (N, groups)
    if not bool(torch.isfinite(scales).all()) or bool((scales == 0).any()):
        raise CheckpointError(f"{reader.file_of(scales_name)}: tensor {scales_name!r} holds a zero or non-finite "
                              "scale; the file is corrupt")
    g = k if group == -1 else group
    input_perm = None
    g_idx_name = f"{prefix}.g_idx"
    if reader.has(g_idx_name):
        g_idx = reader.tensor(g_idx_name, ("I32", "I64"), (k,), "GPTQ g_idx (K,)").to(torch.int64)
        plain = torch.arange(k, dtype=torch.int64) // g
        if not torch.equal(g_idx, plain):
            counts = torch.bincount(g_idx, minlength=groups) if bool((g_idx >= 0).all()) else None
            if counts is None or counts.numel() != groups or bool((counts != g).any()):
                raise CheckpointError(f"{reader.file_of(g_idx_name)}: tensor {g_idx_name!r} does not give each of "
                                      f"the {groups} groups exactly {g} rows of K; the file is corrupt")
            input_perm = torch.argsort(g_idx, stable=True)
            codes = codes[:, input_perm].contiguous()
    # K is now in group order (k // g is the group of column k)
    scales, zeros, codes = _fold_negative_scales(scales.t().contiguous().reshape(n, -1), zeros, codes, bits, k,
                                                 group)
    implicit = 1 << (bits - 1)
    if sym and bool((zeros == implicit).all()):
        fmt = group_format(f"int{bits}", k, group, scale_dtype)
        qw = QuantizedWeight(format=WeightFormat.parse(fmt), codes=offset_to_signed(codes, bits),
                             scales=scales)
    else:
        fmt = group_format(f"uint{bits}", k, group, scale_dtype, "zp")
        qw = QuantizedWeight(format=WeightFormat.parse(fmt), codes=codes,
                             scales=scales, zero_points=zeros)
    return CheckpointLayer(prefix=prefix, schema="gptq", weight=qw, input_perm=input_perm,
                           bias=optional_bias(reader, prefix, n))
