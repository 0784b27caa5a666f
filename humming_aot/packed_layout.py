"""The packed weight layout: b-bit codes (1 to 8 bits) -> the int32 words the kernels read, and
back. Bit-level only (no scales, no formats): humming_aot/packing.py builds PackedWeight on it.
``reference_pack_codes`` is an independent element-by-element statement of the same layout for
the tests.

Layout (read by csrc/include/humming_aot/mainloop/*.cuh and kernel/dense_wgmma.cuh, decoded
by numerics/int_dequantizer.cuh and float_dequantizer.cuh): every b-bit code is placed the same
way, whether it is an integer or a float's sign / exponent / mantissa bits. The weight is cut
into 16 (k) x 64 (n) units. In each unit, lane ``l`` of a warp (g = l // 4, t = l % 4) owns, for
each of the four 16-column tiles j, the 8 values it feeds to two m16n8k16 B fragments: columns
n = 16 j + 8 h + g (h = 0, 1) and rows k = 2 t + p + 8 q (p, q = 0, 1).

- 4-bit codes: one int32 word per (lane, j); nibble i = 4 p + 2 h + q.
- 8-bit codes: two int32 words per (lane, j), word h; byte i = 2 q + p.
- b-bit codes, b < 4: laid out as 4-bit codes in "nibble words" U_j (the 4-bit layout), whose
  unused high bits are then folded into b stored words P: b = 2: P_0 = U_0 | U_1 << 2,
  P_1 = U_2 | U_3 << 2; b = 3: P_j = U_j with bit j of each nibble of U_3 in bit 3 of that
  nibble (j < 3); b = 1: nibble s of each 16-bit half of U_j in bit 4 j + s of that half of P_0
  (a tile's four codes side by side: P_0 >> 4 j holds them at bits 0-3, where the bf16 biased
  decode reads each in place).
- b-bit codes, 4 < b < 8: laid out as 8-bit codes in "byte words" V_w (w = 2 j + h, the 8-bit
  layout), the last 8 - b of them folded into the spare high bits of the first b: b = 7: bit w
  of each byte of V_7 in bit 7 of that byte of P_w; b = 6: bits 2w, 2w+1 of V_6 in bits 6, 7 of
  P_w and those of V_7 in P_{3+w} (w < 3); b = 5: the 15 bits of V_5, V_6, V_7 fill bits 5-7
  of P_0..P_4 in order, in runs (bits 0-2 of V_5 in bits 5-7 of P_0, bits 3-4 in bits 5-6 of
  P_1, bit 0 of V_6 in bit 7 of P_1, ...: _FIVE_BIT_HOMES), so each is gathered from 2-3 words.
  numerics/packed_codes.cuh unfolds them (one shift and mask per word, a few more for the
  folded words) before the 4- or 8-bit dequantization.

The packed tensor is ``(K / 16, N * bits / 2)`` int32: row = 16-row K step, then units along N,
then 32 lanes, then ``bits`` words. Scales and zero points are ``(K / group, N)`` in the activation
dtype, with the columns of each 64-column unit reordered to ``g * 8 + 2 j + h`` so that one 16-byte
load gives a lane the scales of its 8 columns.
"""
from __future__ import annotations

import torch

# Packed-layout constants (mirrored by the C++ headers named above).
UNIT_N = 64
UNIT_K = 16

# The layout's version per code width, recorded with every packed weight (PackedWeight and
# QuantizedLinear's state) so that a weight packed under another version is refused instead of
# decoded wrongly. A change to where codes of some width go bumps that width's version.
# History: 1-bit codes 2 since November 2026 (a tile's four codes side by side, bit 4 j + s of
# each 16-bit half; version 1 had them at bit 4 s + j). Every other width: 1.
_LAYOUT_VERSIONS = {1: 2}
# The version a weight packed before versions were recorded has (for 1-bit codes: unknown, as
# 1 and 2 were both packed then; 1 is refused, so such a weight is re-packed, not trusted).
UNRECORDED_LAYOUT_VERSION = 1


def layout_version(bits: int) -> int:
    """The packed-layout version of b-bit codes that this humming_aot reads and writes."""
    if not 1 <= bits <= 8:
        raise ValueError(f"layout_version: codes have 1 to 8 bits, got {bits}")
    return _LAYOUT_VERSIONS.get(bits, 1)


def check_layout_version(version: int | None, bits: int, what: str) -> None:
    """Raise a ValueError unless `version` (None: not recorded) is the current layout of b-bit
    codes; `what` names the packed weight in the message."""
    current = layout_version(bits)
    found = UNRECORDED_LAYOUT_VERSION if version is None else version
    if found != current:
        recorded = "no layout version (packed before versions were recorded)" if version is None else (
            f"layout version {version}")
        raise ValueError(
            f"{what} holds {bits}-bit codes with {recorded}, but this humming_aot reads version {current} "
            f"of that layout: its words would decode to other weights. Pack the quantized weight again "
            f"(humming_aot.pack(quantized_weight)) or load it with the humming_aot version that packed it."
        )


def _unit_view(u: torch.Tensor) -> torch.Tensor:
    """(N, K) -> (unit, j, h, g, kstep, q, t, p) with n = 64 unit + 16 j + 8 h + g, k = 16 kstep + 8 q + 2 t + p."""
    n, k = u.shape
    return u.reshape(n // 64, 4, 2, 8, k // 16, 2, 4, 2)


def _lane_bits(bits: int) -> int:
    if not 1 <= bits <= 8:
        raise ValueError(f"{bits}-bit codes are not packed by the mma.sync layout (1 to 8 bits)")
    return 4 if bits <= 4 else 8


def _padded_words(u: torch.Tensor, lane_bits: int) -> torch.Tensor:
    """(N, K) codes -> (K / 16, N / 64, 32, 4 or 8) int64 nibble (U_j) or byte (V_w) words."""
    n, k = u.shape
    v = _unit_view(u.to(torch.int64))
    if lane_bits == 4:
        # -> (kstep, unit, g, t, j, p, h, q): lane = 4 g + t, word j, nibble 4 p + 2 h + q
        v = v.permute(4, 0, 3, 6, 1, 7, 2, 5).reshape(k // 16, n // 64, 32, 4, 8)
    else:
        # -> (kstep, unit, g, t, j, h, q, p): lane = 4 g + t, word 2 j + h, byte 2 q + p
        v = v.permute(4, 0, 3, 6, 1, 2, 5, 7).reshape(k // 16, n // 64, 32, 8, 4)
    shifts = torch.arange(0, 32, lane_bits, device=u.device, dtype=torch.int64)
    return (v << shifts).sum(dim=-1)


def _codes_from_padded(words: torch.Tensor, n: int, k: int, lane_bits: int) -> torch.Tensor:
    """Inverse of _padded_words: (K / 16, N / 64, 32, 4 or 8) -> (N, K) int32 codes."""
    shifts = torch.arange(0, 32, lane_bits, device=words.device, dtype=torch.int64)
    v = ((words.unsqueeze(-1) >> shifts) & ((1 << lane_bits) - 1)).reshape(k // 16, n // 64, 8, 4, 4, 2, 2, 2)
    if lane_bits == 4:  # (kstep, unit, g, t, j, p, h, q) -> (unit, j, h, g, kstep, q, t, p)
        v = v.permute(1, 4, 6, 2, 0, 7, 3, 5)
    else:  # (kstep, unit, g, t, j, h, q, p) -> (unit, j, h, g, kstep, q, t, p)
        v = v.permute(1, 4, 5, 2, 0, 6, 3, 7)
    return v.reshape(n, k).to(torch.int32)


_ONES4 = 0x11111111  # bit 0 of every nibble
_ONES8 = 0x01010101  # bit 0 of every byte
# 5-bit codes: where bit r of each byte of the folded byte words V_5, V_6, V_7 is stored, as
# (stored word P_i, bit of that byte); bits 5-7 of P_0..P_4 filled in order.
_FIVE_BIT_HOMES = {
    5: [(0, 5), (0, 6), (0, 7), (1, 5), (1, 6)],
    6: [(1, 7), (2, 5), (2, 6), (2, 7), (3, 5)],
    7: [(3, 6), (3, 7), (4, 5), (4, 6), (4, 7)],
}


def _fold(pad: torch.Tensor, bits: int) -> torch.Tensor:
    """Padded words (..., 4 or 8) -> the ``bits`` stored words (..., bits); see the module docstring."""
    w = [pad[..., i] for i in range(pad.shape[-1])]
    if bits in (4, 8):
        return pad
    if bits == 1:
        out = [sum(((w[j] >> 4 * s) & 0x00010001) << (4 * j + s) for j in range(4) for s in range(4))]
    elif bits == 2:
        out = [w[0] | w[1] << 2, w[2] | w[3] << 2]
    elif bits == 3:
        out = [w[j] | ((w[3] >> j) & _ONES4) << 3 for j in range(3)]
    elif bits == 7:
        out = [w[i] | ((w[7] >> i) & _ONES8) << 7 for i in range(7)]
    elif bits == 6:
        out = [w[i] | ((w[6] >> 2 * i) & 3 * _ONES8) << 6 for i in range(3)]
        out += [w[3 + i] | ((w[7] >> 2 * i) & 3 * _ONES8) << 6 for i in range(3)]
    else:  # 5
        out = [w[i] for i in range(5)]
        for word, homes in _FIVE_BIT_HOMES.items():
            for bit, (stored, shift) in enumerate(homes):
                out[stored] = out[stored] | ((w[word] >> bit) & _ONES8) << shift
    return torch.stack(out, dim=-1)


def _unfold(p: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of _fold: (..., bits) stored words -> (..., 4 or 8) padded words."""
    w = [p[..., i] for i in range(bits)]
    if bits in (4, 8):
        return p
    if bits == 1:
        out = [sum(((w[0] >> (4 * j + s)) & 0x00010001) << 4 * s for s in range(4)) for j in range(4)]
    elif bits == 2:
        out = [w[0] & 0x33333333, (w[0] >> 2) & 0x33333333, w[1] & 0x33333333, (w[1] >> 2) & 0x33333333]
    elif bits == 3:
        out = [w[j] & 0x77777777 for j in range(3)]
        out.append(sum(((w[j] >> (3 - j)) & (_ONES4 << j)) for j in range(3)))
    else:
        low = (1 << bits) - 1
        out = [w[i] & (low * _ONES8) for i in range(bits)]
        if bits == 7:
            out.append(sum((w[i] >> (7 - i)) & (_ONES8 << i) for i in range(7)))
        elif bits == 6:
            for base in (0, 3):
                out.append(sum((w[base + i] >> (6 - 2 * i)) & ((3 * _ONES8) << 2 * i) for i in range(3)))
        else:  # 5
            for word, homes in _FIVE_BIT_HOMES.items():
                out.append(sum(((w[stored] >> shift) & _ONES8) << bit for bit, (stored, shift) in enumerate(homes)))
    return torch.stack(out, dim=-1)


def pack_codes(u: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, K) unsigned codes (< 2^bits) -> (K / 16, N * bits / 2) int32 packed words."""
    n, k = u.shape
    words = _fold(_padded_words(u, _lane_bits(bits)), bits)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(k // 16, n * bits // 2)


def unpack_codes(w: torch.Tensor, n: int, k: int, bits: int) -> torch.Tensor:
    """Inverse of ``pack_codes``: (K / 16, N * bits / 2) int32 -> (N, K) int32 codes."""
    lane_bits = _lane_bits(bits)
    words = (w.to(torch.int64) & 0xFFFFFFFF).reshape(k // 16, n // 64, 32, bits)
    return _codes_from_padded(_unfold(words, bits), n, k, lane_bits)


def permute_unit_columns(x: torch.Tensor) -> torch.Tensor:
    """(G, N): within each 64-column unit, column 16 j + 8 h + g moves to g * 8 + 2 j + h."""
    rows, n = x.shape
    return x.reshape(rows, n // 64, 4, 2, 8).permute(0, 1, 4, 2, 3).reshape(rows, n)


def unpermute_unit_columns(x: torch.Tensor) -> torch.Tensor:
    rows, n = x.shape
    return x.reshape(rows, n // 64, 8, 4, 2).permute(0, 1, 3, 4, 2).reshape(rows, n)


def _bit_home(bits: int, word: int, bit: int, slot):
    """Where bit ``bit`` (0 <= bit < bits) of the code in nibble or byte ``slot`` of padded word
    ``word`` (U_j or V_w) is stored: (stored word, bit position in it). The module docstring in
    table form."""
    if bits == 1:  # nibble s = slot % 4 of 16-bit half slot // 4 of U_j: bit 4 j + s of that half
        return 0, 16 * (slot // 4) + 4 * word + slot % 4
    stored, shift = _nibble_or_byte_home(bits, word, bit)
    return stored, _lane_bits(bits) * slot + shift


def _nibble_or_byte_home(bits: int, word: int, bit: int) -> tuple[int, int]:
    """For codes of 2 to 8 bits: (stored word, shift of the bit inside its nibble or byte)."""
    if bits in (4, 8) or word < {2: 0, 3: 3, 5: 5, 6: 6, 7: 7}[bits]:
        return word, bit
    if bits == 2:
        return word // 2, 2 * (word % 2) + bit
    if bits == 5:
        return _FIVE_BIT_HOMES[word][bit]
    if bits == 3 or bits == 7:  # bit r of the folded word lives in stored word r
        return bit, bits + (word - bits)
    # bits == 6: V_6 in P_0..P_2, V_7 in P_3..P_5, two bits each
    return 3 * (word - 6) + bit // 2, 6 + bit % 2


def reference_pack_codes(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Element-by-element statement of the packed layout (CPU, for tests): each bit of each code is
    OR-ed into the word and bit position the module docstring gives for it."""
    n, k = u.shape
    lane_bits = _lane_bits(bits)
    out = torch.zeros(k // 16, n // 64 * 32 * bits, dtype=torch.int64)
    nn_, kk_ = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")
    unit, within = nn_ // 64, nn_ % 64
    j, h, g = within // 16, (within % 16) // 8, within % 8
    kstep, kin = kk_ // 16, kk_ % 16
    q, t, p = kin // 8, (kin % 8) // 2, kin % 2
    lane = 4 * g + t
    if lane_bits == 4:
        padded_word, slot = j, 4 * p + 2 * h + q
    else:
        padded_word, slot = 2 * j + h, 2 * q + p
    codes = u.to(torch.int64)
    flat = out.view(-1)
    for word in range(8 if lane_bits == 8 else 4):
        for bit in range(bits):
            sel = padded_word == word
            stored, position = _bit_home(bits, word, bit, slot[sel])
            values = ((codes[sel] >> bit) & 1) << position
            col = (unit[sel] * 32 + lane[sel]) * bits + stored
            flat.index_put_((kstep[sel] * out.shape[1] + col,), values, accumulate=True)
    out = torch.where(out >= 2**31, out - 2**32, out)
    return out.to(torch.int32)
