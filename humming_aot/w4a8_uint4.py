"""W4A8 with uint4 weights less an integer zero point (AWQ: ``uint4:g128:zp``, any group of a
multiple of 128, or ``uint4:channel:zp`` / ``uint4:tensor:zp``): the packed layout that
humming_aot.w4a8.pack writes for them and its inverse. The kernels (numerics/uint4_zero_point.cuh)
make e4m3 bytes of (q - z) x 2^-9, or s8 bytes of q - z, in registers: every such value is exact in
either, so the products are the ones of the decoded weight.

Codes: the words are in the int4 layout's order (humming_aot.w4a8, _UNIT_DIMS and _TILE_DIMS), byte
j of a word holding code j of the low A register in bits 0-3 and code j of the high one in bits 4-7.
Entries: (groups, n, 2) int32, per group of K and channel the float32 bits of its scale and its
zero point z in every byte (z x 0x01010101); channels past the weight's N have scale 0 and z 0.
"""
from __future__ import annotations

import torch

from humming_aot.quant.weight import QuantizedWeight

ELEMENT = "uint4"
_ZERO_BYTES = 0x01010101  # a zero point in every byte of the entry's second word


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(n, k_tiles x 128) uint4 codes (0..15) -> (k_tiles, n / 64, 4096) packed bytes."""
    from humming_aot.w4a8 import _TILE_DIMS, _UNIT_DIMS, K_TILE

    n, k = codes.shape
    units, k_tiles = n // 64, k // K_TILE
    c = codes.reshape(units, *_UNIT_DIMS, k_tiles, *_TILE_DIMS)  # u w r g kt h s q t j
    c = c.permute(4, 0, 1, 5, 3, 8, 6, 7, 9, 2)  # kt u w h g t s q j r
    packed = (c[..., 0] & 0xF) | ((c[..., 1] & 0xF) << 4)
    return packed.reshape(k_tiles, units, 4096).contiguous()


def decode_codes(w: torch.Tensor) -> torch.Tensor:
    """(n, k_tiles x 128) int64 uint4 codes of packed bytes: the inverse of pack_codes."""
    k_tiles, units, _ = w.shape
    b = w.to(torch.int64).reshape(k_tiles, units, 4, 2, 8, 4, 2, 2, 4)  # kt u w h g t s q j
    codes = torch.stack((b & 0xF, b >> 4), dim=-1)  # kt u w h g t s q j r
    codes = codes.permute(1, 2, 9, 4, 0, 3, 6, 7, 5, 8)  # u w r g kt h s q t j
    return codes.reshape(units * 64, k_tiles * 128)


def entries(scales: torch.Tensor, zero_points: torch.Tensor, n_pad: int) -> torch.Tensor:
    """(groups, n_pad, 2) int32 entries from (n, groups) scales (any float dtype, widened to
    float32 exactly) and (n, groups) uint8 zero points."""
    n, groups = scales.shape
    out = torch.zeros((groups, n_pad, 2), dtype=torch.int32, device=scales.device)
    out[:, :n, 0] = scales.to(torch.float32).t().contiguous().view(torch.int32)
    out[:, :n, 1] = (zero_points.to(torch.int32) * _ZERO_BYTES).t()
    return out


def entry_scales(w_scale: torch.Tensor) -> torch.Tensor:
    """(groups, n) float32 scales of packed entries."""
    return w_scale[..., 0].contiguous().view(torch.float32)


def entry_zero_points(w_scale: torch.Tensor) -> torch.Tensor:
    """(groups, n) int64 zero points of packed entries (the low byte of the second word)."""
    return w_scale[..., 1].to(torch.int64) & 0xFF


def effective_weight(w: torch.Tensor, w_scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """(n_pad, k_tiles x 128) float64 (q - z) x scale of packed codes and entries."""
    values = decode_codes(w).to(torch.float64)
    zeros = entry_zero_points(w_scale).to(torch.float64).t().repeat_interleave(group_size, 1)
    scales = entry_scales(w_scale).to(torch.float64).t().repeat_interleave(group_size, 1)
    width = values.shape[1]
    return (values - zeros[:, :width]) * scales[:, :width]


def pack_parts(qw: QuantizedWeight, n_pad: int, k_tiles: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes, entries) of a uint4 weight with integer zero points, its groups of
    `group_size` (a multiple of 128; k_tiles x 128 for one group per channel or per tensor)."""
    from humming_aot.w4a8 import K_TILE

    n, k = qw.codes.shape
    for name, values in (("codes", qw.codes), ("zero_points", qw.zero_points)):
        if values.numel() and int(values.max()) > 15:
            raise ValueError(f"{qw.format}: {name} hold {int(values.max())}, but uint4 {name} lie in 0..15 (the "
                             "kernels keep one in each nibble or byte): check the QuantizedWeight "
                             "(QuantizedWeight.validate)")
    codes = torch.zeros((n_pad, k_tiles * K_TILE), dtype=torch.uint8, device=qw.codes.device)
    # padding: channels past N get code 0, zero point 0 and scale 0; K past the weight's own is
    # code 0, whose value -z x s is multiplied only by the zeros the kernels read past K
    codes[:n, :k] = qw.codes
    groups = -(-k_tiles * K_TILE // group_size)
    scales = qw.scales.reshape(n, -1) if qw.scales.numel() != 1 else qw.scales.reshape(1, 1).expand(n, 1)
    zeros = qw.zero_points.reshape(n, -1) if qw.zero_points.numel() != 1 else qw.zero_points.reshape(1, 1).expand(n, 1)
    if scales.shape[1] != groups or zeros.shape[1] != groups:
        raise AssertionError(f"{qw.format}: {scales.shape[1]} scale groups for {groups} packed ones")
    return pack_codes(codes), entries(scales, zeros, n_pad)
