"""W4A8 with MXFP4 weights (e2m1 codes, an e8m0 scale per 32 of K: gpt-oss) and float8e4m3
activations: the packed layout that humming_aot.w4a8.pack writes for them, and its inverse.

The fold. Every e2m1 value times 2^d, d in -5 .. 6, is a normal e4m3 value whose byte is the
value's own plus 8 d (numerics/e2m1_e4m3.cuh). So a group's scale 2^e_g goes into its codes
relative to a base 2^b of its span (b = the span's largest e_g with nonzero codes, less 6), and
only 2^b multiplies the span's fp32 sums. A span is a run of K tiles of 128: every K tile's entry
holds its span's 2^b and its own four groups' bytes 8 (e_g - b + 5). The kernels' K loops add a
span's K tiles into one scratch set of sums and promote them once (mainloop/int4_e4m3_groups.cuh,
with one scratch set); a K tile promoted alone is right too (its entry holds the span's scale), as
the other loops do. The kernels read the span from the packed weight's group_size (128 x its K
tiles). pack takes the longest span up to MAX_SPAN K tiles in which every channel's groups (of
nonzero codes) lie within 2^MXFP4_WINDOW of each other: the fold stays exact for every weight it
takes. A weight whose groups lie further apart within one K tile is refused (run it with 16-bit
activations).

Codes: a packed word holds eight codes, nibble n the magnitude (bits 0-2) of code n % 4 of A
register r = n // 4 and the sign (bit 3) of code n // 2 of register r = n % 2; the words are in the
int4 layout's order (humming_aot.w4a8, _UNIT_DIMS and _TILE_DIMS: (s, q) a word, j and r its
codes). Entries: (k_tiles, n, 2) int32, per K tile and channel the float32 bits of 2^b and the four
group bytes; channels past the weight's N have 2^b = 0.
"""
from __future__ import annotations

import torch

ELEMENT = "float4e2m1"
GROUP = 32  # K per e8m0 scale
WINDOW = 11  # binades a span's group scales may span: d_g = e_g - b in -5 .. 6, b = max e_g - 6
_D_MIN, _D_MAX = -5, 6
# The longest span pack folds over, in K tiles of 128: fp8 wgmma keeps about 14 bits of a running
# sum, so a span's sums run over at most this much K before their fp32 promotion.
MAX_SPAN = 8


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(n, k_tiles x 128) e2m1 codes (0..15: bit 3 the sign) -> (k_tiles, n / 64, 4096) packed bytes."""
    from humming_aot.w4a8 import _TILE_DIMS, _UNIT_DIMS, K_TILE

    n, k = codes.shape
    units, k_tiles = n // 64, k // K_TILE
    c = codes.reshape(units, *_UNIT_DIMS, k_tiles, *_TILE_DIMS)  # u w r g kt h s q t j
    c = c.permute(4, 0, 1, 5, 3, 8, 6, 7, 9, 2)  # kt u w h g t s q j r
    lead = c.shape[:-2]
    magnitudes = (c & 7).transpose(-1, -2).reshape(*lead, 8)  # nibble n = 4 r + j
    signs = (c >> 3).reshape(*lead, 8)  # nibble n = 2 j + r
    nibbles = magnitudes | (signs << 3)
    packed = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)  # little-endian bytes of the word
    return packed.reshape(k_tiles, units, 4096).contiguous()


def decode_codes(w: torch.Tensor) -> torch.Tensor:
    """(n, k_tiles x 128) float64 e2m1 values of packed MXFP4 codes: the inverse of pack_codes."""
    from humming_aot import formats
    from humming_aot.w4a8 import K_TILE

    k_tiles, units, _ = w.shape
    b = w.to(torch.int64).reshape(k_tiles, units, 4, 2, 8, 4, 2, 2, 4)  # kt u w h g t s q byte
    nibbles = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)  # (..., 8): nibble n
    magnitudes = (nibbles & 7).reshape(*nibbles.shape[:-1], 2, 4).transpose(-1, -2)  # (j, r)
    signs = (nibbles >> 3).reshape(*nibbles.shape[:-1], 4, 2)  # (j, r)
    codes = magnitudes | (signs << 3)  # kt u w h g t s q j r
    codes = codes.permute(1, 2, 9, 4, 0, 3, 6, 7, 5, 8).reshape(units * 64, k_tiles * K_TILE)
    return formats.get(ELEMENT).decode(codes.to(torch.uint8)).to(torch.float64)


def group_scales(w_scale: torch.Tensor) -> torch.Tensor:
    """(k_tiles x 4, n) float64 scales of the groups of 32 from packed entries (k_tiles, n, 2)."""
    base = w_scale[..., 0].contiguous().view(torch.float32).to(torch.float64)  # (k_tiles, n)
    offsets = w_scale[..., 1].to(torch.int64)
    d = torch.stack([((offsets >> (8 * g)) & 0xFF) // 8 - 5 for g in range(4)], dim=1)  # (k_tiles, 4, n)
    return (base[:, None, :] * torch.pow(2.0, d.to(torch.float64))).reshape(-1, base.shape[1])


_FLOOR = torch.iinfo(torch.int64).min // 2  # the exponent of a group of zero codes


def _exponents(codes: torch.Tensor, scales: torch.Tensor, n: int) -> torch.Tensor:
    """(n_pad, k_tiles x 4) int64 exponents e_g of the groups' scales 2^e_g, _FLOOR for groups of
    zero codes (their scale never matters), from (n_pad, k_tiles x 128) codes and (n, k / 32)
    power-of-two scales."""
    n_pad, k_padded = codes.shape
    groups = k_padded // GROUP
    exponents = torch.zeros((n_pad, groups), dtype=torch.int64, device=codes.device)
    exponents[:n, : scales.shape[1]] = torch.frexp(scales).exponent.to(torch.int64) - 1  # s = 2^e
    nonzero = (codes.reshape(n_pad, groups, GROUP) & 7).amax(-1) > 0
    return torch.where(nonzero, exponents, _FLOOR)


def _spans(e: torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exponents (n_pad, k_tiles x 4) in spans of `span` K tiles, (n_pad, spans, 4 span) (the
    last padded with _FLOOR), and each span's b (n_pad, spans, 1): its largest exponent less 6, 0
    for a span of zero codes."""
    n_pad, groups = e.shape
    width = 4 * span
    padded = torch.full((n_pad, -(-groups // width) * width), _FLOOR, dtype=e.dtype, device=e.device)
    padded[:, :groups] = e
    s = padded.reshape(n_pad, -1, width)
    top = s.amax(-1, keepdim=True)
    return s, torch.where(top > _FLOOR, top - _D_MAX, 0)


def _folds(e: torch.Tensor, span: int) -> torch.Tensor:
    """(n_pad, spans) bool: the spans of `span` K tiles whose groups of nonzero codes all lie
    within the window of their largest."""
    s, b = _spans(e, span)
    return ((s == _FLOOR) | (s - b >= _D_MIN)).all(-1)


def _longest_span(e: torch.Tensor, longest: int) -> int:
    """The longest span (a power of two of K tiles, at most `longest`, and none longer than needed
    to cover K) over which every channel's groups of exponents e (_exponents) fold exactly; 1
    also where a K tile does not fold (entries then says which)."""
    k_tiles, span = e.shape[1] // 4, 1
    while 2 * span <= longest and span < k_tiles and bool(_folds(e, 2 * span).all()):
        span *= 2
    return span


def entries(codes: torch.Tensor, scales: torch.Tensor, n: int, span: int | None = None) -> tuple[torch.Tensor, int]:
    """(k_tiles, n_pad, 2) int32 entries from (n_pad, k_tiles x 128) e2m1 codes and (n, k / 32)
    power-of-two scales, folded over spans of `span` K tiles (None: the longest up to MAX_SPAN that
    folds exactly), and the span: per K tile and channel the float32 bits of its span's 2^b and the
    bytes 8 (e_g - b + 5) of its groups (those of zero codes: 8 x 5). Raises where a group of
    nonzero codes lies more than WINDOW binades below its span's largest."""
    from humming_aot.w4a8 import K_TILE

    n_pad, k_padded = codes.shape
    k_tiles = k_padded // K_TILE
    e = _exponents(codes, scales, n)
    if span is None:
        span = _longest_span(e, MAX_SPAN)
    s, b = _spans(e, span)
    d = torch.where(s > _FLOOR, s - b, 0)
    low = (d < _D_MIN).any(-1)  # (n_pad, spans)
    if bool(low.any()):
        where = low.nonzero()
        channel, first = int(where[0, 0]), int(where[0, 1]) * span * K_TILE
        last = min(first + span * K_TILE, k_tiles * K_TILE) - 1
        raise ValueError(
            f"this MXFP4 weight has {where.shape[0]} channel spans of {span} K tile(s) (the first: channel {channel}, "
            f"K {first} .. {last}) whose group scales lie more than 2^{WINDOW} apart; the W4A8 kernels fold a group's "
            "scale into its e4m3 codes only within that window of the largest. Run it with 16-bit activations "
            "(humming_aot.ops.gemm, or QuantizedLinear without activations=)"
            + ("" if span == 1 else ", or pack it with a shorter span (humming_aot.w4a8.pack(qw, mxfp4_span=1))"))
    b_tiles = b.expand(-1, -1, span).reshape(n_pad, -1)[:, :k_tiles]  # each K tile's span's b
    base = torch.pow(2.0, b_tiles.to(torch.float64)).to(torch.float32)  # 2^b >= 2^-133: exact
    base[n:] = 0.0
    d = d.reshape(n_pad, -1)[:, : k_tiles * 4].reshape(n_pad, k_tiles, 4)
    offsets = sum((8 * (d[..., g] - _D_MIN)) << (8 * g) for g in range(4))
    packed = torch.stack((base.view(torch.int32).to(torch.int64), offsets), dim=-1)  # (n_pad, k_tiles, 2)
    return packed.transpose(0, 1).to(torch.int32).contiguous(), span
