"""W4A8: symmetric int4 weights (GPTQ-style, -8 .. 7) with a float32 scale per channel per group
of K, or MXFP4 weights (e2m1 with an e8m0 scale per 32 of K: gpt-oss), x float8e4m3 activations
with a float32 scale per token (or per tensor), 16-bit output, on the sm90a wgmma-w4a8 body
(csrc/include/humming_aot/kernel/dense_wgmma_w4a8.cuh):

    qw = humming_aot.quant.quantize(w, "int4:g128")
    packed = humming_aot.w4a8.pack(qw)                  # the kernel's packed codes, fp32 scales
    qa = humming_aot.ops.quantize_activation(x, "float8e4m3:token")
    y = humming_aot.w4a8.gemm(qa, packed)               # (M, N) bfloat16

``gemm`` computes ``out[m, n] = sum_g (sum_{k in g} a[m, k] w[n, k]) w_scale[n, g] a_scale[m]
(+ bias)``: every int4 value is exact in e4m3, so the kernel turns the codes into e4m3 with
integer adds and multiplies at the 8-bit tensor-core rate; each K tile of 128 is summed apart and
weighed by its group's scale in fp32, so groups must be whole K tiles: g128, g256, ..., a scale per
channel or per tensor. On CPU tensors it runs the float64 reference of the same operands (decoded
from the packed layout the kernel reads), rounded once to the output dtype. float8e4m3
activations run on the sm90a wgmma-w4a8 body, or off sm90a on the portable mma-w4a8 body (sm89 and
later); int8 activations (``"int8:token"``) on mma-w4a8 from sm80, the codes widened to s8.

uint4 weights less an integer zero point per group of a multiple of 128 (AWQ, ``"uint4:g128:zp"``)
take both activation elements: the kernels make e4m3 bytes of (q - z) x 2^-9, or s8 bytes of q - z,
in registers (numerics/uint4_zero_point.cuh; packed layout: humming_aot.w4a8_uint4).

MXFP4 weights (``pack(quant.quantize(w, "mxfp4"))``, float8e4m3 activations only) are exact too:
every e2m1 value times its group's scale relative to its span's is an e4m3 value while the group
scales of a channel's span (K tiles of 128, as many as keep that exact, up to eight) lie within
2^11 of each other, so pack stores per channel and K tile the span's fp32 scale 2^b and four bytes
8 (e_g - b + 5) (b = the span's largest group exponent less 6), and the kernel builds each group's
e4m3 table from its byte (numerics/e2m1_e4m3.cuh) and promotes each span's sums once
(humming_aot.w4a8_mxfp4). A K tile whose groups lie further apart (with nonzero codes) is refused
by pack, which says to run the weight with 16-bit activations.

The packed layout (version 2): for each K tile of 128 and each 64-channel unit, 4096 bytes in the
order the consumer threads load them (one 16-byte load a thread per two k32 steps: the 8-bit
wgmma A fragment, mainloop/int4_e4m3_groups.cuh), each code stored as a sign and a magnitude
(``encode``) at the bits from which the kernel makes e4m3 bytes with integer adds
(numerics/int4_e4m3.cuh); MXFP4 codes in the same order, eight to a word as
numerics/e2m1_e4m3.cuh reads them. N is padded to a multiple of 64 and K to a multiple of 128 with
zero codes. (Version 1, a lookup table's indices in another byte order, is converted when a layer's
state dict is loaded: ``upgrade_packed``.)
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot import w4a8_mxfp4
from humming_aot.quant.activation import ActivationGranularity, QuantizedActivation
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import ScaleGranularity, ZeroPointKind
from humming_aot.spec import ActivationScale, GemmSpec, KernelKey, TileConfig, ZeroPoint
from humming_aot.spec import ScaleGranularity as ScaleGranularitySpec
from humming_aot.w8a8 import (
    PackedRows,
    reference,  # (the float64 product of any 8-bit-activation operands)
    table_tile,
)

__all__ = ["LAYOUT_VERSION", "PackedW4A8Weight", "decode_packed", "decode_packed_mxfp4", "encode", "gemm", "gemm_spec",
           "mxfp4_group_scales", "pack", "reference", "select_sync_tile", "select_tile", "upgrade_packed"]

WEIGHT_ELEMENT = "int4"
MXFP4_ELEMENT = "float4e2m1"
UINT4_ELEMENT = "uint4"
# the weight elements the kernels take: int4 (float32 group scales; both activation elements),
# uint4 (float32 group scales and integer zero points; both) and MXFP4's float4e2m1 (e8m0 scales
# per 32 of K; float8e4m3 activations)
WEIGHT_ELEMENTS = (WEIGHT_ELEMENT, UINT4_ELEMENT, MXFP4_ELEMENT)
ACT_ELEMENT = "float8e4m3"
# the activation elements the kernels take: float8e4m3 (wgmma-w4a8 on sm90a, mma-w4a8 from sm89),
# int8 (mma-w4a8 from sm80)
ACT_ELEMENTS = ("float8e4m3", "int8")
LAYOUT_VERSION = 2
_OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
N_ALIGN = 64  # channels of a packed unit (pack pads N with zero codes and zero scales)
K_TILE = 128  # K of a packed tile and of a kernel stage (pack pads K with zero codes)
K_ALIGN = 16  # the activation codes' rows are 16-byte aligned (TMA); the kernel reads zeros past K

# A stored code (``encode``): bit 3 the sign, bits 0-2 the magnitude m, v = m or v = -(m + 1); the
# kernel (numerics/int4_e4m3.cuh) turns it into the e4m3 byte of v x 2^-9 with integer adds and
# puts the 2^9 back with the token scales.


def encode(values: torch.Tensor) -> torch.Tensor:
    """Stored codes (uint8, 0..15: bit 3 the sign, bits 0-2 v or -v - 1) of int4 values (any integer
    dtype, -8..7)."""
    v = values.to(torch.int64)
    if v.numel() and (int(v.min()) < -8 or int(v.max()) > 7):
        raise ValueError(f"encode takes int4 values -8..7, got values from {int(v.min())} to {int(v.max())}")
    return torch.where(v < 0, 8 | (-v - 1), v).to(torch.uint8)


def _value_of_code(codes: torch.Tensor) -> torch.Tensor:
    """int8 values of stored codes (the inverse of ``encode``)."""
    c = codes.to(torch.int64)
    return torch.where(c >= 8, -(c & 7) - 1, c).to(torch.int8)


def _values_of_twos_complement(codes: torch.Tensor) -> torch.Tensor:
    """int4 values (int64) of QuantizedWeight codes (two's complement nibbles: -1 is 0x0F)."""
    c = codes.to(torch.int64) & 0xF
    return torch.where(c >= 8, c - 16, c)


@dataclasses.dataclass(frozen=True, eq=False)
class PackedW4A8Weight(PackedRows):
    """An int4, uint4 (zero points) or MXFP4 weight as the W4A8 kernels read it, on one device.

    w:          (k_tiles, n / 64, 4096) uint8, the packed codes (module docstring)
    w_scale:    int4: (groups, n) float32, each channel's scale per group of K (0 past n_valid);
                uint4: (groups, n, 2) int32, the float32 bits of that scale and the group's zero
                point in every byte (humming_aot.w4a8_uint4);
                MXFP4: (k_tiles, n, 2) int32, per K tile and channel the float32 bits of its scale
                2^b and its four groups' bytes 8 (e_g - b + 5) (module docstring)
    n:          the kernel's N (a multiple of 64)
    k:          the weight's own K (the activations' K; a multiple of K_ALIGN)
    group_size: K per row of w_scale, a multiple of 128 (k_tiles x 128 for a scale per channel;
                MXFP4: 128 x the K tiles of the span its scales are folded over, its entries one row
                per K tile: humming_aot.w4a8_mxfp4)
    format:     the WeightFormat string it was packed from
    n_valid:    the weight's own N where pack padded it, else None
    layout_version: the packed layout of w (LAYOUT_VERSION from pack; None: not recorded, refused)
    element:    the weight codes' element: "int4", "uint4" or "float4e2m1" (MXFP4)
    """

    w: torch.Tensor
    w_scale: torch.Tensor
    n: int
    k: int
    group_size: int
    format: str
    n_valid: int | None = None
    layout_version: int | None = None
    element: str = WEIGHT_ELEMENT

    @property
    def k_tiles(self) -> int:
        return self.w.shape[0]

    def effective_weight(self) -> torch.Tensor:
        """(out_features, K) float64: the values decoded from the packed layout x their group
        scales, what gemm multiplies with."""
        if self.element == UINT4_ELEMENT:
            from humming_aot import w4a8_uint4

            return w4a8_uint4.effective_weight(self.w, self.w_scale, self.group_size)[:self.out_features, : self.k]
        if self.element == MXFP4_ELEMENT:
            values = decode_packed_mxfp4(self.w)
            scales = mxfp4_group_scales(self.w_scale).t().repeat_interleave(MXFP4_GROUP, 1)
        else:
            values = decode_packed(self.w).to(torch.float64)  # (n, k_tiles x 128)
            scales = self.w_scale.to(torch.float64).t().repeat_interleave(self.group_size, 1)
        n = self.out_features
        return (values * scales[:, : values.shape[1]])[:n, : self.k]


# The packed order of one K tile's codes of one 64-channel unit, as dims of the (n, k) codes:
# n = 16 w + 8 r + g (warp, upper rows, lane group), k = 32 (2 h + s) + 16 q + 4 t + j (K step
# pair, step in it, upper K half, lane in group, code); bytes in the order (w, h, g, t, s, q, j):
# one 32-bit word per (s, q) holds the codes of A registers 2 q (rows r = 0) and 2 q + 1 (r = 1),
# byte j their code j: the r = 0 code's magnitude in bits 0-2 and sign in bit 7, the r = 1 code's
# magnitude in bits 4-6 and its sign in bit 3 of byte j + 1 (mod 4), where the kernel's rotation
# of the word by 4 bits brings it (numerics/int4_e4m3.cuh).
_UNIT_DIMS = (4, 2, 8)  # w, r, g
_TILE_DIMS = (2, 2, 2, 4, 4)  # h, s, q, t, j


def _pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(n, k_tiles x 128) stored codes (0..15) -> (k_tiles, n / 64, 4096) packed bytes."""
    n, k = codes.shape
    units, k_tiles = n // 64, k // K_TILE
    c = codes.reshape(units, *_UNIT_DIMS, k_tiles, *_TILE_DIMS)  # u w r g kt h s q t j
    c = c.permute(4, 0, 1, 5, 3, 8, 6, 7, 9, 2)  # kt u w h g t s q j r
    low, high = c[..., 0], c[..., 1]  # (..., 4): byte j of a word
    high_sign = torch.roll(high >> 3, 1, dims=-1)  # byte j carries the sign of high code j - 1
    packed = (low & 7) | (high_sign << 3) | ((high & 7) << 4) | ((low >> 3) << 7)
    return packed.reshape(k_tiles, units, 4096).contiguous()


def decode_packed(w: torch.Tensor) -> torch.Tensor:
    """(n, k_tiles x 128) int8 values of packed codes: the inverse of pack's layout and encoding."""
    k_tiles, units, _ = w.shape
    b = w.to(torch.int64).reshape(k_tiles, units, 4, 2, 8, 4, 2, 2, 4)  # kt u w h g t s q j
    low = (b & 7) | ((b >> 7) << 3)
    high = ((b >> 4) & 7) | (torch.roll((b >> 3) & 1, -1, dims=-1) << 3)
    codes = torch.stack((low, high), dim=-1)  # kt u w h g t s q j r
    codes = codes.permute(1, 2, 9, 4, 0, 3, 6, 7, 5, 8)  # u w r g kt h s q t j
    return _value_of_code(codes.reshape(units * 64, k_tiles * K_TILE))


# Layout version 1's table (a code is an index m, bits 0-2, into the first row or, with bit 3, the
# second) and byte order (w, h, g, t, s, q, r, j / 2; the even j in the low nibble).
_V1_VALUES = torch.tensor((0, 2, 4, 6, -1, -3, -5, -7, 1, 3, 5, 7, -2, -4, -6, -8), dtype=torch.int8)


def upgrade_packed(w: torch.Tensor, version: int) -> torch.Tensor:
    """Packed codes of an earlier layout version in this version's layout (the same values)."""
    if version == LAYOUT_VERSION:
        return w
    if version != 1 or w.dim() != 3 or w.shape[2] != 4096 or w.dtype != torch.uint8:
        raise ValueError(f"packed W4A8 codes of layout version {version} and shape {tuple(w.shape)} ({w.dtype}) cannot "
                         f"be converted to version {LAYOUT_VERSION}: pack the quantized weight again (w4a8.pack)")
    k_tiles, units, _ = w.shape
    nibbles = torch.stack((w & 0xF, w >> 4), dim=-1).reshape(k_tiles, units, 4, 2, 8, 4, 2, 2, 2, 4)
    codes = nibbles.permute(1, 2, 8, 4, 0, 3, 6, 7, 5, 9).reshape(units * 64, k_tiles * K_TILE)
    return _pack_codes(encode(_V1_VALUES.to(w.device)[codes.to(torch.int64)]))


# MXFP4's packed codes and entries: humming_aot.w4a8_mxfp4 (names kept here for callers)
MXFP4_GROUP, MXFP4_WINDOW = w4a8_mxfp4.GROUP, w4a8_mxfp4.WINDOW
_pack_mxfp4_codes = w4a8_mxfp4.pack_codes
decode_packed_mxfp4 = w4a8_mxfp4.decode_codes
mxfp4_group_scales = w4a8_mxfp4.group_scales


def _pack_mxfp4(qw: QuantizedWeight, span: int | None) -> PackedW4A8Weight:
    n, k = qw.codes.shape
    device = qw.codes.device
    n_pad = -(-n // N_ALIGN) * N_ALIGN
    k_tiles = -(-k // K_TILE)
    codes = torch.zeros((n_pad, k_tiles * K_TILE), dtype=torch.uint8, device=device)  # code 0 is the value 0
    codes[:n, :k] = qw.codes
    entries, span = w4a8_mxfp4.entries(codes, qw.scales.reshape(n, -1), n, span)
    return PackedW4A8Weight(w=w4a8_mxfp4.pack_codes(codes), w_scale=entries, n=n_pad, k=k, group_size=span * K_TILE,
                            format=str(qw.format), n_valid=n if n_pad != n else None, layout_version=LAYOUT_VERSION,
                            element=MXFP4_ELEMENT)


def pack(qw: QuantizedWeight, *, mxfp4_span: int | None = None) -> PackedW4A8Weight:
    """The W4A8 kernels' operands from a symmetric int4 weight quantized per group of a multiple of
    128, per channel or per tensor (``quant.quantize(w, "int4:g128")``, a GPTQ checkpoint's
    QuantizedWeight), from a uint4 weight with an integer zero point of the same granularities
    (``"uint4:g128:zp"``, an AWQ checkpoint's), or from an MXFP4 weight (``quant.quantize(w,
    "mxfp4")``), on its device. int4 and uint4 scales of any scale dtype are widened to float32
    (exactly). mxfp4_span: the K tiles of 128 an MXFP4 weight's scales are folded over (a power of
    two; default the longest up to w4a8_mxfp4.MAX_SPAN over which the fold is exact:
    humming_aot.w4a8_mxfp4)."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"pack takes a humming_aot.quant.QuantizedWeight, got {type(qw).__name__}")
    fmt = qw.format
    mxfp4 = (fmt.element == MXFP4_ELEMENT and fmt.granularity is ScaleGranularity.GROUP
             and fmt.group_size == MXFP4_GROUP and fmt.scale_dtype == "float8e8m0" and qw.global_scale is None)
    grouped = fmt.granularity is ScaleGranularity.GROUP and fmt.group_size % K_TILE == 0
    whole = fmt.granularity in (ScaleGranularity.CHANNEL, ScaleGranularity.TENSOR)
    zero_point = {WEIGHT_ELEMENT: ZeroPointKind.NONE, UINT4_ELEMENT: ZeroPointKind.INTEGER}.get(fmt.element)
    if not mxfp4 and (zero_point is None or not (grouped or whole)
                      or fmt.zero_point is not zero_point or qw.global_scale is not None):
        raise ValueError(
            f"the W4A8 kernels take symmetric int4 weights or uint4 ones with an integer zero point, with a scale per "
            f"group of a multiple of {K_TILE}, per channel or per tensor, or MXFP4 weights, got {fmt}; quantize with "
            "'int4:g128', 'uint4:g128:zp', 'int4:channel' or 'mxfp4' (a finer-grouped weight, a float zero point, a "
            "global scale or another 4-bit float format runs with 16-bit activations: humming_aot.ops.gemm)"
        )
    if qw.codes.dim() != 2:
        raise ValueError(f"pack takes one (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    n, k = qw.codes.shape
    if k % K_ALIGN:
        raise ValueError(f"K={k}: the W4A8 kernels need K to be a multiple of {K_ALIGN} (TMA rows of the activation "
                         "codes are 16-byte aligned); pad the weight's K with zero columns and the activations' K with "
                         "zeros")
    if mxfp4_span is not None and (not mxfp4 or isinstance(mxfp4_span, bool) or not isinstance(mxfp4_span, int)
                                   or mxfp4_span < 1 or mxfp4_span & (mxfp4_span - 1)):
        raise ValueError(f"mxfp4_span={mxfp4_span!r}: it takes a power of two of K tiles (1, 2, 4, ...), for MXFP4 "
                         f"weights only (this one is {fmt})")
    if mxfp4:
        return _pack_mxfp4(qw, mxfp4_span)
    device = qw.codes.device
    n_pad = -(-n // N_ALIGN) * N_ALIGN
    k_tiles = -(-k // K_TILE)
    if fmt.element == UINT4_ELEMENT:
        from humming_aot import w4a8_uint4

        group_size = fmt.group_size if grouped else k_tiles * K_TILE
        w, w_scale = w4a8_uint4.pack_parts(qw, n_pad, k_tiles, group_size)
        return PackedW4A8Weight(w=w, w_scale=w_scale, n=n_pad, k=k, group_size=group_size, format=str(fmt),
                                n_valid=n if n_pad != n else None, layout_version=LAYOUT_VERSION,
                                element=UINT4_ELEMENT)
    stored = torch.zeros((n_pad, k_tiles * K_TILE), dtype=torch.uint8, device=device)  # code 0 is the value 0
    stored[:n, :k] = encode(_values_of_twos_complement(qw.codes))
    scales = qw.scales.to(torch.float32)
    if grouped:
        group_size = fmt.group_size
        scales = scales.reshape(n, -1)
    else:
        group_size = k_tiles * K_TILE
        scales = scales.reshape(-1, 1).expand(n, 1)
    w_scale = torch.zeros((scales.shape[1], n_pad), dtype=torch.float32, device=device)
    w_scale[:, :n] = scales.t()
    return PackedW4A8Weight(w=_pack_codes(stored), w_scale=w_scale, n=n_pad, k=k, group_size=group_size,
                            format=str(fmt), n_valid=n if n_pad != n else None, layout_version=LAYOUT_VERSION)


def gemm_spec(out_dtype: torch.dtype, act_element: str = ACT_ELEMENT, weight_element: str = WEIGHT_ELEMENT) -> GemmSpec:
    """The GemmSpec of the W4A8 kernels with this output dtype, activation and weight element
    (int4: float32 group scales; uint4: those and integer zero points; float4e2m1: MXFP4's e8m0
    scales)."""
    scale_dtype = "float8e8m0" if weight_element == MXFP4_ELEMENT else "float32"
    zero_point = ZeroPoint.INTEGER if weight_element == UINT4_ELEMENT else ZeroPoint.NONE
    return GemmSpec(a_dtype=act_element, a_scale=ActivationScale.TOKEN, a_scale_dtype="float32",
                    w_dtype=weight_element, w_scale=ScaleGranularitySpec.GROUP, w_scale_dtype=scale_dtype,
                    w_zero_point=zero_point, out_dtype=_OUT_DTYPES[out_dtype])


def kernel_key(arch: str, out_dtype: torch.dtype, tile: TileConfig, act_element: str = ACT_ELEMENT,
               weight_element: str = WEIGHT_ELEMENT) -> KernelKey:
    return KernelKey(arch=arch, spec=gemm_spec(out_dtype, act_element, weight_element), tile=tile)


# (most tokens, tile), from H200 sweeps (docs/performance/log.md sections 36 and 37): the W8A8
# rows' shapes up to 1536 tokens, with more stages (a slot holds half the weight bytes of W8A8's): one consumer
# warpgroup of two units up to 32 tokens (two CTAs per SM), two warpgroups of one unit with 64
# tokens up to 128 while those tiles fit in one wave of N, then 128 tokens with seven stages (two
# scratch sets: the promotion beside the next K tile's wgmma); above 1536, 192 tokens with one
# scratch set, whose conversion of the codes serves half as many tokens again: 4-10 % faster at
# 4096 and 8192 tokens, 2-6 % slower at 512 and 1024 (section 36); with the integer conversion
# (section 37) 1.2-4.4 % faster at 2048 on three of four layers (0.8 % slower on 4096 x 14336) and
# still 1-5 % slower at 1024, so the rows meet between the two.
_TILES = (
    (8, "wgmma-w4a8:8x128x128_w1x4_s8"),
    (16, "wgmma-w4a8:16x128x128_w1x4_s8"),
    (32, "wgmma-w4a8:32x128x128_w1x4_s8"),
    (128, "wgmma-w4a8:64x128x128_w1x8_s8"),
    (1536, "wgmma-w4a8:128x128x128_w1x8_s7"),
    (1 << 62, "wgmma-w4a8:192x128x128_w1x8_s5"),
)


# Decode (at most 16 tokens) on layers of at least 8192 channels: two consumer warpgroups of 128
# channels each. A K tile's codes then take eight warps to convert instead of four, which is what
# bounds decode (the conversion is the same work per weight at any M): 8192 x 8192, 10240 x 8192,
# 28672 x 4096 and 57344 x 8192 at 1 token 14.3 / 17.2 / 20.9 / 66.6 us against 16.1 / 19.5 / 24.3 /
# 69.8 with 8 x 128 under stream-K; on 4096 channels (16 CTAs) 17.5 against 14.6 (log section 36).
_WIDE_DECODE_TILE = "wgmma-w4a8:16x256x128_w1x8_s6"
WIDE_DECODE_N = 8192


# MXFP4 codes take the 192-token row from this many tokens on where its rows padded to 192 are at
# most 5 % more than to 128 (384, 768, 1152-1344, 1536: MXFP4_WIDE_ROWS), then above 1536 as the
# integer codes do. Their conversion (a table per group of 32) costs more per code than the integer
# ones', so converting each code for half as many tokens again pays where the padding does not
# take it back. H100, session 83 (log section 88), with the scales folded over spans of 8 K tiles,
# seven layers (8192 x 8192, 10240 x 8192, 28672 x 4096, 57344 x 8192, 36864 x 7168, 4096 x 14336,
# 5760 x 2880), 192 x 128 against 128 x 128: at 384 tokens 5-27 % less time on six and 2 % more on
# one; at 768 7-16 % less on six, level on one; at 1280 6-11 % less on six, level on one; at 1536
# 10-16 % less on all; at 512 (12.5 % more rows) 7-31 % more on four, 1-3 % less on three; at 1024
# (12.5 % more) 2-20 % more on four, 0.4-5 % less on three. Given N, only where the 128-token tiles
# pass one wave of the SMs (on fewer tiles 192 tokens a CTA would idle more SMs).
MXFP4_WIDE_FROM = 257
MXFP4_WIDE_ROWS = 1.05


def _mxfp4_wide_rows(m: int) -> bool:
    """Whether m tokens padded to 192-token rows are at most MXFP4_WIDE_ROWS times those padded to 128."""
    return -(-m // 192) * 192 <= MXFP4_WIDE_ROWS * (-(-m // 128) * 128)


def select_tile(m: int, n: int | None = None, num_sms: int = 132, weight_element: str = WEIGHT_ELEMENT) -> TileConfig:
    """The wgmma-w4a8 tile for m tokens: _TILES' row, and given N (and the device's SMs) the
    64-token row only where its tiles fit in one wave (above that 128 tokens a CTA), and at most 16
    tokens on at least WIDE_DECODE_N channels the two-warpgroup decode tile. MXFP4 weights
    (weight_element) take the last row (192 tokens) from MXFP4_WIDE_FROM tokens where its padded
    rows are few (_mxfp4_wide_rows) and N is not given or the 128-token row's tiles pass one wave."""
    from humming_aot.enumerate import parse_tile_field

    if n is not None and m <= 16 and n >= WIDE_DECODE_N:
        return parse_tile_field(_WIDE_DECODE_TILE)
    if weight_element == MXFP4_ELEMENT and m >= MXFP4_WIDE_FROM and _mxfp4_wide_rows(m):
        narrow = parse_tile_field(_TILES[-2][1])  # the 128-token row
        if n is None or -(-m // narrow.block_m) * -(-n // narrow.block_n) > num_sms:
            return parse_tile_field(_TILES[-1][1])
    for i, (limit, label) in enumerate(_TILES):
        if m <= limit:
            tile = parse_tile_field(label)
            if (n is not None and tile.block_m == 64 and m > 64 and i + 1 < len(_TILES)
                    and -(-m // 64) * -(-n // tile.block_n) > num_sms):
                return parse_tile_field(_TILES[i + 1][1])
            return tile
    raise AssertionError("the last row takes every m")


def select_sync_tile(m: int) -> TileConfig:
    """The mma-w4a8 tile (the portable body: int8 activations anywhere, float8 ones off sm90a) for
    m tokens, from _SYNC_TILES."""
    return table_tile(_SYNC_TILES, m)


# (most tokens, tile) of the mma-w4a8 body, every arch alike: rings within the 99 KB a block takes
# on sm86 / sm89 / sm120, warp tiles of at most 32 tokens x 32 channels (bodies/mma_w4a8.py: wider
# ones spill), K split (heuristics.split_k_factor) where the tiles leave SMs idle. A rule from
# those limits, not a tuning run (docs/performance/log.md section 44).
_SYNC_TILES = (
    (16, "mma-w4a8:16x128x128_w1x4_s4"),
    (32, "mma-w4a8:32x128x128_w1x4_s4"),
    (64, "mma-w4a8:64x128x128_w2x4_s4"),
    (1 << 62, "mma-w4a8:128x64x128_w4x2_s4"),
)


def _check_activation(qa: QuantizedActivation, packed: PackedW4A8Weight) -> None:
    if not isinstance(qa, QuantizedActivation):
        raise TypeError(f"gemm takes a humming_aot.quant.QuantizedActivation (ops.quantize_activation), got "
                        f"{type(qa).__name__}")
    if not isinstance(packed, PackedW4A8Weight):
        raise TypeError(f"gemm takes a PackedW4A8Weight (humming_aot.w4a8.pack), got {type(packed).__name__}")
    if qa.element not in ACT_ELEMENTS or qa.scale_dtype != "float32" \
            or qa.granularity not in (ActivationGranularity.TOKEN, ActivationGranularity.TENSOR):
        raise ValueError(
            f"the {packed.element} weight ({packed.format}) takes float8e4m3 or int8 activations with a float32 scale per token "
            f"or per tensor, got {qa.element} per {qa.granularity.value} with {qa.scale_dtype} scales; quantize with "
            "'float8e4m3:token', 'int8:token' or either ':tensor'"
        )
    if qa.codes.shape[-1] != packed.k:
        raise ValueError(f"activations have K={qa.codes.shape[-1]} but the weight has K={packed.k}")
    _check_packed(packed)
    if packed.element == MXFP4_ELEMENT and qa.element != ACT_ELEMENT:
        raise ValueError(f"the MXFP4 weight ({packed.format}) takes float8e4m3 activations, got {qa.element}; quantize "
                         "with 'float8e4m3:token' (or run it with 16-bit activations: humming_aot.ops.gemm)")
    if qa.codes.device != packed.w.device or qa.scales.device != packed.w.device:
        raise ValueError(f"activation codes are on {qa.codes.device} and their scales on {qa.scales.device}, but "
                         f"the weight is on {packed.w.device}: move them together")


def _check_packed(packed: PackedW4A8Weight) -> None:
    """The packed tensors agree with n, k and group_size (the kernel reads them by these alone), in
    this version's packed layout."""
    if packed.layout_version != LAYOUT_VERSION:
        got = "records no packed layout version" if packed.layout_version is None else \
            f"holds codes in packed layout version {packed.layout_version}"
        raise ValueError(
            f"a PackedW4A8Weight that {got}, but this humming_aot's W4A8 kernels read version {LAYOUT_VERSION}: make it "
            "with humming_aot.w4a8.pack (codes packed in version 1: humming_aot.w4a8.upgrade_packed(w, 1))")
    if packed.element not in WEIGHT_ELEMENTS:
        raise ValueError(f"a PackedW4A8Weight of element {packed.element!r}: the W4A8 kernels take "
                         f"{' or '.join(WEIGHT_ELEMENTS)} codes; make it with humming_aot.w4a8.pack")
    k_tiles = -(-packed.k // K_TILE)
    groups = -(-k_tiles * K_TILE // packed.group_size) if packed.group_size > 0 else 0
    w, s = packed.w, packed.w_scale
    if packed.element == MXFP4_ELEMENT:
        span = packed.group_size // K_TILE
        scale_dtype, scale_shape = torch.int32, (k_tiles, packed.n, 2)
        group_ok = packed.group_size % K_TILE == 0 and span & (span - 1) == 0
        what = f"int32 entries of shape {scale_shape} (group_size {K_TILE} x a power of two: the fold's span)"
    elif packed.element == UINT4_ELEMENT:
        scale_dtype, scale_shape, group_ok = torch.int32, (groups, packed.n, 2), packed.group_size % K_TILE == 0
        what = f"int32 entries of shape {scale_shape} (group_size a multiple of {K_TILE})"
    else:
        scale_dtype, scale_shape, group_ok = torch.float32, (groups, packed.n), packed.group_size % K_TILE == 0
        what = f"float32 scales of shape {scale_shape} (group_size a multiple of {K_TILE})"
    if (packed.n % N_ALIGN or packed.group_size <= 0 or not group_ok or w.dtype != torch.uint8
            or tuple(w.shape) != (k_tiles, packed.n // N_ALIGN, 4096) or s.dtype != scale_dtype
            or tuple(s.shape) != scale_shape or not w.is_contiguous() or not s.is_contiguous()):
        raise ValueError(
            f"a PackedW4A8Weight of {packed.element} codes, n={packed.n}, k={packed.k}, group_size={packed.group_size} "
            f"holds contiguous uint8 codes of shape ({k_tiles}, {packed.n // N_ALIGN}, 4096) and {what} (n a multiple "
            f"of {N_ALIGN}), got {w.dtype} {tuple(w.shape)} and {s.dtype} {tuple(s.shape)}: make it with "
            "humming_aot.w4a8.pack")


def gemm(qa: QuantizedActivation, packed: PackedW4A8Weight, *, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
         tile: TileConfig | str | None = None, stream_k: int | None = None,
         persistent: bool | None = None) -> torch.Tensor:
    """(*lead, out_features) = decode(qa) @ decode(packed)^T x scales (+ bias) in out_dtype.

    The arguments are w8a8.gemm's (``tile``: a wgmma-w4a8 tile label, float8 activations on sm90a,
    or an mma-w4a8 one, the portable body: int8 activations from sm80, float8 from sm89). Under torch.compile and
    torch's modes it is the custom op ``humming_aot::gemm_w4a8`` (with a fake implementation);
    out, tile, stream_k and persistent are eager only.
    """
    from humming_aot.ops import _no_torch_modes

    if torch.compiler.is_compiling() or not _no_torch_modes():
        if out is not None or tile is not None or stream_k is not None or persistent is not None:
            raise ValueError("out, tile, stream_k and persistent are eager-only arguments of w4a8.gemm (tests and "
                             "tuning)")
        _check_activation(qa, packed)
        return torch.ops.humming_aot.gemm_w4a8(qa.codes, qa.scales, packed.w, packed.w_scale, bias, packed.k,
                                                packed.group_size, packed.out_features, qa.granularity.value,
                                                out_dtype, qa.element, packed.element)
    return _gemm(qa, packed, bias=bias, out_dtype=out_dtype, out=out, tile=tile, stream_k=stream_k,
                 persistent=persistent)


def _gemm(qa: QuantizedActivation, packed: PackedW4A8Weight, *, bias: torch.Tensor | None = None,
          out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
          tile: TileConfig | str | None = None, stream_k: int | None = None,
          persistent: bool | None = None) -> torch.Tensor:
    """gemm without the dispatcher (eager, or inside the custom op)."""
    from humming_aot.w8a8 import run_checked

    _check_activation(qa, packed)
    return run_checked(qa, packed, reference, bias=bias, out_dtype=out_dtype, out=out, tile=tile, stream_k=stream_k,
                       persistent=persistent)


_LIBRARY = torch.library.Library("humming_aot", "FRAGMENT")
_LIBRARY.define(
    "gemm_w4a8(Tensor codes, Tensor scales, Tensor w, Tensor w_scale, Tensor? bias, int k, int group_size, "
    "int n_valid, str granularity, ScalarType out_dtype, str element=\"float8e4m3\", str weight=\"int4\") -> Tensor"
)


_OP_FORMATS = {WEIGHT_ELEMENT: "int4", UINT4_ELEMENT: "uint4:zp", MXFP4_ELEMENT: "mxfp4"}  # (messages only)


def _gemm_w4a8_op(codes, scales, w, w_scale, bias, k, group_size, n_valid, granularity, out_dtype,
                  element=ACT_ELEMENT, weight=WEIGHT_ELEMENT):
    # (the op's w is in this version's packed layout: gemm checks a PackedW4A8Weight's version first)
    qa = QuantizedActivation(element=element, granularity=ActivationGranularity(granularity), group_size=None,
                             scale_dtype="float32", codes=codes, scales=scales)
    n = w.shape[1] * N_ALIGN
    packed = PackedW4A8Weight(w=w, w_scale=w_scale, n=n, k=k, group_size=group_size,
                              format=_OP_FORMATS[weight],
                              n_valid=n_valid if n_valid != n else None, layout_version=LAYOUT_VERSION, element=weight)
    return _gemm(qa, packed, bias=bias, out_dtype=out_dtype)


def _gemm_w4a8_fake(codes, scales, w, w_scale, bias, k, group_size, n_valid, granularity, out_dtype,
                    element=ACT_ELEMENT, weight=WEIGHT_ELEMENT):
    return codes.new_empty((*codes.shape[:-1], n_valid), dtype=out_dtype)


_LIBRARY.impl("gemm_w4a8", _gemm_w4a8_op, "CPU")
_LIBRARY.impl("gemm_w4a8", _gemm_w4a8_op, "CUDA")
torch.library.register_fake("humming_aot::gemm_w4a8", _gemm_w4a8_fake, lib=_LIBRARY)
