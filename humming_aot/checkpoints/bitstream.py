"""Bit-level helpers shared by the schemas: LSB-first bitstreams in int32 words, nibbles in bytes,
and scale dtypes. Pure integer torch arithmetic: no code passes through a float."""
from __future__ import annotations

import torch

__all__ = ["e8m0_to_float32", "unpack_bitstream", "unpack_nibbles", "unpack_padded_words", "words_to_int64"]


def words_to_int64(words: torch.Tensor) -> torch.Tensor:
    """int32 words as their unsigned 32-bit values, in int64."""
    return words.to(torch.int64) & 0xFFFFFFFF


def unpack_bitstream(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Codes (..., count) uint8 from int32 words (..., W) along the last axis, where code i sits at
    global bit i * bits of the row's words, least significant bit first (GPTQ "continuous",
    compressed-tensors >= 0.19). For 2, 4 and 8 bits this is word r holding codes r * 32 / bits + j
    at bit shift bits * j; for 3 bits, codes may straddle two words."""
    w = words_to_int64(words)
    index = torch.arange(count, device=words.device, dtype=torch.int64) * bits
    word, shift = index // 32, index % 32
    low = w[..., word] >> shift
    # the bits that spill into the next word (only for widths that do not divide 32)
    spill = (shift + bits - 32).clamp(min=0)
    if bool((spill > 0).any()):
        nxt = torch.clamp(word + 1, max=w.shape[-1] - 1)
        high = w[..., nxt] << (bits - spill)
        low = torch.where(spill > 0, low | high, low)
    return (low & ((1 << bits) - 1)).to(torch.uint8)


def unpack_padded_words(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Codes (..., count) from int32 words holding 32 // bits codes each at shifts bits * j, with the
    top bits unused (compressed-tensors <= 0.12 for 3/5/6/7 bits)."""
    per_word = 32 // bits
    index = torch.arange(count, device=words.device, dtype=torch.int64)
    w = words_to_int64(words)[..., index // per_word] >> ((index % per_word) * bits)
    return (w & ((1 << bits) - 1)).to(torch.uint8)


def unpack_nibbles(data: torch.Tensor, *, low_first: bool = True) -> torch.Tensor:
    """uint8 (..., C) -> uint8 (..., 2C): element 2c from the low nibble of byte c, 2c + 1 from the
    high one (reversed when ``low_first`` is False)."""
    low, high = data & 0x0F, data >> 4
    first, second = (low, high) if low_first else (high, low)
    return torch.stack((first, second), dim=-1).reshape(*data.shape[:-1], 2 * data.shape[-1])


def e8m0_to_float32(exponents: torch.Tensor) -> torch.Tensor:
    """float32 2^(e - 127) of uint8 (or float8_e8m0fnu) biased exponents; 0xFF (NaN) must be
    refused by the caller first."""
    e = exponents.view(torch.uint8).to(torch.int32) if exponents.dtype != torch.uint8 else exponents.to(torch.int32)
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - 127)
