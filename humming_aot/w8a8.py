"""W8A8: 8-bit weights x 8-bit activations of the same element, 16-bit output, on the sm90a
wgmma-ss body (csrc/include/humming_aot/kernel/dense_wgmma_ss.cuh):

- float8e4m3 per channel (or per tensor) weights x per token (or per tensor) activations, fp32
  scales;
- float8e4m3 with DeepSeek-V3's blocks: one fp32 scale per 128 x 128 weight block
  ("float8e4m3:b128x128") x one per token per 128 of K ("float8e4m3:g128" activations);
- int8 per channel (or per tensor) weights x int8 per token (or per tensor) activations
  (SmoothQuant-style, "int8:channel" x "int8:token"): exact int32 sums, fp32 scales after them;
- W4A4: int4 per channel (or per tensor) weights x int4 per token (or per tensor) activations
  ("int4:channel" x "int4:token"), on the portable mma-ss body only (mma.sync m16n8k64 s4: native
  on SM80-SM89, emulated by ptxas on later arches): exact int32 sums. The kernel reads two codes a
  byte (the lower K in the low nibble): pack stores the weight so, and the GEMM packs the
  activation codes (one per byte in a QuantizedActivation) before the launch.

    qw = humming_aot.quant.quantize(w, "float8e4m3:channel")
    packed = humming_aot.w8a8.pack(qw)                  # (N, K) codes, fp32 channel scales
    qa = humming_aot.ops.quantize_activation(x, "float8e4m3:token")
    y = humming_aot.w8a8.gemm(qa, packed)               # (M, N) bfloat16

``gemm`` computes ``out[m, n] = sum_k a[m, k] w[n, k] * a_scale[m] * w_scale[n] (+ bias)`` with
fp32 sums (the kernel promotes its fp8 wgmma partial sums into fp32 every 128 of K, and applies
block scales there; int8 sums are exact int32 over the CTA's K, made fp32 once). On CPU tensors
it runs the float64 reference of the same operands rounded once to the output dtype. On sm90a
(H100, H200) the wgmma-ss body runs it; elsewhere the portable mma-ss body (int8 from sm80,
float8e4m3 from sm89, in both of its scalings). The weights keep the
codes as the checkpoint has them, one byte each, rows of K: TMA and cp.async read them as they
are, so there is no packed layout to version (int4: two a byte, the format's own nibbles).
"""
from __future__ import annotations

import dataclasses
import struct

import torch

from humming_aot import formats, params_abi
from humming_aot.quant.activation import ActivationGranularity, QuantizedActivation
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import ScaleGranularity, ZeroPointKind
from humming_aot.spec import ActivationScale, GemmSpec, KernelKey, TileConfig
from humming_aot.spec import ScaleGranularity as ScaleGranularitySpec

__all__ = ["PackedW8A8Weight", "gemm", "gemm_spec", "pack", "reference", "select_sync_tile", "select_tile"]

ELEMENT = "float8e4m3"
# the 8-bit elements the kernels multiply (activations and weights alike)
ELEMENTS = ("float8e4m3", "int8")
# W4A4's element (the mma-ss body only: two codes a byte)
INT4 = "int4"
_OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# N is padded to this many channels by pack (zero codes, zero scales): the output tile's 16-byte
# row stores and the weights' rows need no edge case, and the kernel's output columns past the
# weight's own N are dropped.
N_ALIGN = 16
# K must be a multiple of this many codes: the TMA maps' rows are 16-byte aligned (the kernel reads
# zeros past K up to its K tile of 128); int4 codes are two a byte, so 32 of them.
K_ALIGN = 16
INT4_K_ALIGN = 32
# int8 sums are exact in int32 while K x 128 x 128 (-128 x -128 at every k) fits: the kernel does
# not check, so pack refuses a longer K.
INT8_MAX_K = (2**31 - 1) // (128 * 128)
SCALED_PARAMS_BYTES = 448  # kernel/params.cuh ScaledTmaGemmParams
_W_MAP_OFFSET = 256
_A_SCALE_OFFSET = 384


class PackedRows:
    """What the quantized-activation packed weights (PackedW8A8Weight, w4a8's PackedW4A8Weight,
    fp4's PackedFp4Weight) share: dataclasses with codes ``w`` and scales ``w_scale`` (tensors on
    one device), the kernel's N ``n``, K ``k`` and the weight's own N ``n_valid`` where pack
    padded it (else None)."""

    @property
    def out_features(self) -> int:
        return self.n if self.n_valid is None else self.n_valid

    @property
    def in_features(self) -> int:
        return self.k

    @property
    def device(self) -> torch.device:
        return self.w.device

    def to(self, device):
        """The same weight with its tensors on `device`."""
        return dataclasses.replace(self, w=self.w.to(device), w_scale=self.w_scale.to(device))


@dataclasses.dataclass(frozen=True, eq=False)
class PackedW8A8Weight(PackedRows):
    """A float8e4m3, int8 or (W4A4) int4 weight as the W8A8 kernels read it, on one device.

    w:        (n, k) uint8, the e4m3 or two's complement int8 codes row-major (rows past n_valid:
              zero codes); int4: (n, k / 2), two's complement nibbles, code 2 j in the low nibble
              of byte j
    w_scale:  (n,) float32, each output channel's scale (a per-tensor scale repeated; 0 past n_valid),
              or with ``blocks`` (ceil(n / 128), ceil(k / 128)) float32, one per 128 x 128 block
    n, k:     the kernel's N (a multiple of N_ALIGN) and K (the weight's own, a multiple of K_ALIGN;
              int4: of INT4_K_ALIGN)
    n_valid:  the weight's own N where pack padded it, else None
    format:   the WeightFormat string it was packed from
    """

    w: torch.Tensor
    w_scale: torch.Tensor
    n: int
    k: int
    format: str
    n_valid: int | None = None
    blocks: bool = False

    @property
    def element(self) -> str:
        """The codes' element: "float8e4m3", "int8" or "int4" (the format's)."""
        return self.format.split(":", 1)[0]

    @property
    def row_bytes(self) -> int:
        """Bytes of a row of codes: K, or K / 2 for int4 (the kernel's K)."""
        return self.k // 2 if self.element == INT4 else self.k

    def effective_weight(self) -> torch.Tensor:
        """(out_features, K) float64: decode(codes) x channel scale, what gemm multiplies with."""
        n = self.out_features
        scales = self.w_scale.to(torch.float64)
        codes = unpack_int4(self.w[:n]) if self.element == INT4 else self.w[:n]
        if self.blocks:
            scales = scales.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, : self.k]
            return _decode(codes, self.element) * scales
        return _decode(codes, self.element) * scales[:n, None]


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) int4 codes, one a byte (two's complement nibbles) -> (..., K / 2) bytes, code 2 j in
    the low nibble of byte j: the mma.sync s4 fragments' order (K even)."""
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: (..., K / 2) bytes -> (..., K) codes, one a byte."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _decode(codes: torch.Tensor, element: str) -> torch.Tensor:
    return formats.get(element).decode(codes).to(torch.float64)


def pack(qw: QuantizedWeight) -> PackedW8A8Weight:
    """The W8A8 kernels' operands from a float8e4m3 weight quantized per channel, per tensor or per
    128 x 128 block (``quant.quantize(w, "float8e4m3:channel")``, a checkpoint loader's
    QuantizedWeight), or an int8 one per channel or per tensor ("int8:channel"), on its device.
    Scales of any WeightFormat scale dtype are widened to float32 (exactly); N is padded to a
    multiple of N_ALIGN."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"pack takes a humming_aot.quant.QuantizedWeight, got {type(qw).__name__}")
    fmt = qw.format
    blocks = fmt.granularity is ScaleGranularity.BLOCK and (fmt.block_n, fmt.group_size) == (128, 128)
    channel = fmt.granularity in (ScaleGranularity.CHANNEL, ScaleGranularity.TENSOR)
    if not ((fmt.element == ELEMENT and (blocks or channel)) or (fmt.element in ("int8", INT4) and channel)) \
            or fmt.zero_point is not ZeroPointKind.NONE:
        raise ValueError(
            f"the W8A8 kernels take float8e4m3 weights with a scale per channel, per tensor or per 128 x 128 block, "
            f"or symmetric int8 or int4 (W4A4) weights with a scale per channel or per tensor, got {fmt}; quantize "
            "with 'float8e4m3:channel', 'float8e4m3:tensor', 'float8e4m3:b128x128', 'int8:channel', 'int8:tensor', "
            "'int4:channel' or 'int4:tensor' (int4 weights with groups of K run with float8e4m3 or int8 activations "
            "through humming_aot.w4a8)"
        )
    if qw.codes.dim() != 2:
        raise ValueError(f"pack takes one (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    n, k = qw.codes.shape
    align = INT4_K_ALIGN if fmt.element == INT4 else K_ALIGN
    if k % align:
        raise ValueError(f"K={k}: the W8A8 kernels need K to be a multiple of {align} (rows of codes are 16-byte "
                         "aligned); pad the weight's K with zero columns and the activations' K with zeros")
    if fmt.element == "int8" and k > INT8_MAX_K:
        raise ValueError(f"K={k}: int8 sums of more than {INT8_MAX_K} products of -128 x -128 overflow the kernel's "
                         "int32 accumulators; split K into slices and add their outputs")
    n_pad = -(-n // N_ALIGN) * N_ALIGN
    codes = pack_int4(qw.codes) if fmt.element == INT4 else qw.codes
    w = torch.zeros((n_pad, codes.shape[1]), dtype=torch.uint8, device=qw.codes.device)
    w[:n] = codes
    if blocks:  # (ceil(N / 128), ceil(K / 128)) already; padding N to 16 adds no 128-row block
        w_scale = qw.scales.to(torch.float32).contiguous()
    else:
        scales = qw.scales.to(torch.float32).reshape(-1)
        if fmt.granularity is ScaleGranularity.TENSOR:
            scales = scales.expand(n)
        w_scale = torch.zeros((n_pad,), dtype=torch.float32, device=qw.codes.device)
        w_scale[:n] = scales
    return PackedW8A8Weight(w=w, w_scale=w_scale, n=n_pad, k=k, format=str(fmt), n_valid=n if n_pad != n else None,
                            blocks=blocks)


def gemm_spec(out_dtype: torch.dtype, blocks: bool = False, element: str = ELEMENT) -> GemmSpec:
    """The GemmSpec of the W8A8 kernels with this output dtype and code element (blocks:
    DeepSeek-V3's scales, float8e4m3 only)."""
    return GemmSpec(a_dtype=element, a_scale=ActivationScale.GROUP if blocks else ActivationScale.TOKEN,
                    a_scale_dtype="float32", w_dtype=element,
                    w_scale=ScaleGranularitySpec.BLOCK if blocks else ScaleGranularitySpec.GROUP,
                    w_scale_dtype="float32", out_dtype=_OUT_DTYPES[out_dtype])


def select_tile(m: int, blocks: bool = False, n: int | None = None, num_sms: int = 132,
                element: str = ELEMENT, k: int | None = None) -> TileConfig:
    """The wgmma-ss tile for m tokens (catalog/tiles.toml has no rows for this body yet). With block
    scales at most 128 tokens per CTA (at 192 a thread has the registers neither for the overlapped
    promotion's three sets nor for the serial one's two beside its 48 token scales). Given N
    (and the device's SMs), channel x token scales take the 64-token tile for 65-128 tokens where
    its tiles fit in one wave (past one wave 128 tokens per CTA halve the tiles, and the waves,
    for as many products), and past 128 tokens too where they fit and K (given) is at most
    _WIDE_64_TOKEN_MAX_K: there twice the CTAs stream the weights where 128 tokens per CTA would
    leave SMs idle or split short K slices (H200, log section 47: 0.69-1.02x the time over 14
    points of five layers, geometric mean 0.81x; 4096 x 4096 at 256 tokens 11.9 us against 14.3).
    At longer K the 128-token tile's split K measured as fast or faster from 256 tokens (up to
    10 %)."""
    from humming_aot.enumerate import parse_tile_field

    table = _BLOCK_TILES if blocks else _INT8_TILES if element == "int8" else _TILES
    tile = table_tile(table, m)
    sixty_four = table_tile(table, 65)  # (block scales: their 128-token row, which this leaves alone)
    if n is None or m <= 64 or sixty_four.block_m != 64:
        return tile
    fits = -(-m // 64) * -(-n // sixty_four.block_n) <= num_sms
    if fits and (tile.block_m == 64 or (k is not None and k <= _WIDE_64_TOKEN_MAX_K)):
        return sixty_four
    return parse_tile_field(table[-1][1])  # the widest tokens' row: 128 per CTA


# (most tokens, tile), from H200 sweeps (docs/performance/log.md sections 33 and 34): one consumer
# warpgroup of two units (two CTAs per SM) up to 32 tokens, then two consumer warpgroups of one
# unit each: 64 tokens up to 128 (twice the CTAs of 128 tokens where N has few tiles; select_tile
# keeps it at any M while its tiles fit in one wave, and drops it past one), then 128
# tokens with five stages, whose staging tile fits after its ring (so that a CTA walking several
# tiles loads the next while it stores one) and whose promotion overlaps the next K tile's wgmma:
# faster than 192 tokens (no room for the overlap) at every M measured, 8192 included.
_TILES = (
    (8, "wgmma-ss:8x128x128_w1x4_s6"),
    (16, "wgmma-ss:16x128x128_w1x4_s6"),
    (32, "wgmma-ss:32x128x128_w1x4_s5"),
    (128, "wgmma-ss:64x128x128_w1x8_s6"),
    (1 << 62, "wgmma-ss:128x128x128_w1x8_s5"),
)
# select_tile's 64-token tile past its row (more than 128 tokens): only up to this K
_WIDE_64_TOKEN_MAX_K = 8192
# Block scales: the same up to 64 tokens, then 128 (its promotion overlapped since session 31: the
# add reads the token scales from the slot two at a time); five stages put the staging tile after
# the ring, which measured 0-10 % faster than six over it (most at short K, where a CTA walks the
# most tiles).
_BLOCK_TILES = (
    (8, "wgmma-ss:8x128x128_w1x4_s6"),
    (16, "wgmma-ss:16x128x128_w1x4_s6"),
    (32, "wgmma-ss:32x128x128_w1x4_s5"),
    (64, "wgmma-ss:64x128x128_w1x8_s6"),
    (1 << 62, "wgmma-ss:128x128x128_w1x8_s5"),
)
# int8: the float8 rows. Its sums need no promotion, so wider tiles fit (128 x 256, 256 tokens;
# they spill 8 and 68 bytes under ptxas), but in an H200 sweep over four layers at 64-8192 tokens
# none beat these rows by more than the noise, and most lost 5-20 % (docs/performance/log.md
# section 35).
_INT8_TILES = _TILES


def table_tile(table: tuple[tuple[int, str], ...], m: int) -> TileConfig:
    """The tile of the first (most tokens, tile label) row of `table` that takes m tokens."""
    from humming_aot.enumerate import parse_tile_field

    for limit, label in table:
        if m <= limit:
            return parse_tile_field(label)
    raise AssertionError("the last row takes every m")


def select_sync_tile(m: int) -> TileConfig:
    """The mma-ss tile (the portable body: GPUs without wgmma) for m tokens, from _SYNC_TILES."""
    return table_tile(_SYNC_TILES, m)


# (most tokens, tile) of the mma-ss body, every arch alike: each tile's ring fits the 99 KB of
# shared memory a block may take on sm86, sm89 and sm120 (98,304 bytes at most), its warps hold at
# most 32 x 64 outputs (e4m3: 128 fp32 registers of sums and accumulators), and K is split
# (heuristics.split_k_factor) where the tiles leave SMs idle. A rule from the tile sizes, not a
# tuning run: measured on an H200 through its sm_90 build only (docs/performance/log.md).
_SYNC_TILES = (
    (16, "mma-ss:16x128x128_w1x4_s4"),
    (32, "mma-ss:32x128x128_w1x4_s4"),
    (64, "mma-ss:64x128x128_w2x2_s4"),
    (1 << 62, "mma-ss:128x128x128_w2x4_s3"),
)


def _check_activation(qa: QuantizedActivation, packed: PackedW8A8Weight) -> None:
    if not isinstance(qa, QuantizedActivation):
        raise TypeError(f"gemm takes a humming_aot.quant.QuantizedActivation (ops.quantize_activation), got "
                        f"{type(qa).__name__}")
    if not isinstance(packed, PackedW8A8Weight):
        raise TypeError(f"gemm takes a PackedW8A8Weight (humming_aot.w8a8.pack), got {type(packed).__name__}")
    if packed.blocks:
        if qa.element != ELEMENT or qa.granularity is not ActivationGranularity.GROUP or qa.group_size != 128 \
                or qa.scale_dtype != "float32":
            raise ValueError(
                f"a weight with 128 x 128 block scales takes float8e4m3 activations with a float32 scale per token "
                f"per 128 of K, got {qa.element} per {qa.granularity.value} (group {qa.group_size}) with "
                f"{qa.scale_dtype} scales; quantize with 'float8e4m3:g128'"
            )
    elif qa.element != packed.element or qa.scale_dtype != "float32" \
            or qa.granularity not in (ActivationGranularity.TOKEN, ActivationGranularity.TENSOR):
        e = packed.element
        raise ValueError(
            f"the {e} weight ({packed.format}) takes {e} activations with a float32 scale per token or per tensor, got "
            f"{qa.element} per {qa.granularity.value} with {qa.scale_dtype} scales; quantize with '{e}:token' or "
            f"'{e}:tensor'" + (" (or pack the weight per 128 x 128 block for 'float8e4m3:g128')" if e == ELEMENT else "")
        )
    if qa.codes.shape[-1] != packed.k:
        raise ValueError(f"activations have K={qa.codes.shape[-1]} but the weight has K={packed.k}")
    if qa.codes.device != packed.w.device or qa.scales.device != packed.w.device:
        raise ValueError(f"activation codes are on {qa.codes.device} and their scales on {qa.scales.device}, but "
                         f"the weight is on {packed.w.device}: move them together")


def dequantized_activation(qa: QuantizedActivation, k: int) -> torch.Tensor:
    """(M, k) float64: decode(codes) x their scales (per token, per tensor or per token and 128 of K)."""
    codes = qa.codes.reshape(-1, k)
    scales = qa.scales.to(torch.float64)
    if qa.granularity is ActivationGranularity.GROUP:
        scales = scales.reshape(codes.shape[0], -1).repeat_interleave(qa.group_size, 1)
    else:
        scales = scales.reshape(-1, 1)  # (M, 1) or (1, 1)
    return _decode(codes, qa.element) * scales


def reference(qa: QuantizedActivation, packed: PackedW8A8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(M, out_features) float64: the exact product of the operands gemm sees (+ bias), for rows
    M = prod(qa.codes.shape[:-1]); also w4a8.reference (any packed weight with k and
    effective_weight())."""
    out = dequantized_activation(qa, packed.k) @ packed.effective_weight().T
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out


def gemm(qa: QuantizedActivation, packed: PackedW8A8Weight, *, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
         tile: TileConfig | str | None = None, stream_k: int | None = None,
         persistent: bool | None = None) -> torch.Tensor:
    """(*lead, out_features) = decode(qa) @ decode(packed)^T x scales (+ bias) in out_dtype.

    ``bias``: contiguous (out_features,) in out_dtype. ``out`` (GPU only, tests): a contiguous
    (M, packed.n) tensor to write instead of a new one (the padded columns are written too, and the
    result has packed.n columns). ``tile``: a wgmma-ss tile label to run instead of select_tile's;
    ``stream_k``: persistent CTAs of the stream-K schedule, 0 for the tail split, None for the
    heuristic's choice; ``persistent`` (tail split): whether at most one wave of resident CTAs walks
    the whole tiles (True), one CTA each (False), or the heuristic's choice (None).

    Under torch.compile and torch's modes (FakeTensorMode, make_fx, ...) it is the custom op
    ``humming_aot::gemm_w8a8`` (with a fake implementation); out, tile, stream_k and persistent are
    eager only.
    """
    from humming_aot.ops import _no_torch_modes

    if torch.compiler.is_compiling() or not _no_torch_modes():
        if out is not None or tile is not None or stream_k is not None or persistent is not None:
            raise ValueError("out, tile, stream_k and persistent are eager-only arguments of w8a8.gemm (tests and "
                             "tuning)")
        _check_activation(qa, packed)
        return torch.ops.humming_aot.gemm_w8a8(qa.codes, qa.scales, packed.w, packed.w_scale, bias,
                                                packed.out_features, packed.blocks, qa.granularity.value,
                                                qa.group_size or 0, out_dtype, packed.element)
    return _gemm(qa, packed, bias=bias, out_dtype=out_dtype, out=out, tile=tile, stream_k=stream_k,
                 persistent=persistent)


def _gemm(qa: QuantizedActivation, packed: PackedW8A8Weight, *, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
         tile: TileConfig | str | None = None, stream_k: int | None = None,
         persistent: bool | None = None) -> torch.Tensor:
    """gemm without the dispatcher (eager, or inside the custom op)."""
    _check_activation(qa, packed)
    return run_checked(qa, packed, reference, bias=bias, out_dtype=out_dtype, out=out, tile=tile, stream_k=stream_k,
                       persistent=persistent)


def run_checked(qa: QuantizedActivation, packed, reference_fn, *, bias, out_dtype, out, tile, stream_k,
                persistent, launch=None) -> torch.Tensor:
    """The quantized-activation GEMM of operands whose pairing its module has checked (w8a8, w4a8,
    fp4): the output dtype and bias checks, then on the CPU reference_fn(qa, packed, bias) rounded
    once, on a GPU the launch (humming_aot._w8a8_launch's, or `launch` with its arguments), shaped
    (*lead, N)."""
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    lead = tuple(qa.codes.shape[:-1])
    n = packed.out_features
    if bias is not None and (bias.shape != (n,) or bias.dtype != out_dtype or bias.device != packed.device
                             or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous ({n},) {out_dtype} tensor on {packed.device}, got "
                         f"{tuple(bias.shape)} {bias.dtype} on {bias.device} with stride {tuple(bias.stride())}")
    if packed.device.type != "cuda":
        if out is not None or tile is not None or stream_k is not None or persistent is not None:
            raise ValueError("out, tile, stream_k and persistent choose how the GPU kernel runs; leave them None on "
                             "the CPU")
        return formats.round_to(reference_fn(qa, packed, bias), out_dtype).reshape(*lead, n)
    if launch is None:
        from humming_aot import _w8a8_launch

        launch = _w8a8_launch.launch
    y = launch(qa, packed, bias, out_dtype, out, tile, stream_k, persistent)
    if out is not None:  # the caller's (M, packed.n) tensor, padded columns included
        return y.reshape(*lead, packed.n)
    if packed.n_valid is not None:
        y = y[:, :n]
    return y.reshape(*lead, n)


def _pack_params(gemm_params: bytes, schedule: bytes, a_map: bytes, w_map: bytes, a_scale: int,
                 a_scale_stride: int = 0) -> bytes:
    """ScaledTmaGemmParams' bytes (kernel/params.cuh): TmaGemmParams (GemmParams, the schedule,
    padding, the activations' map), the weights' map at byte 256, the activation scales' pointer
    at 384 and the row stride of their transposed form at 392."""
    head = gemm_params + schedule + params_abi.TMA_PADDING + a_map
    assert len(head) == _W_MAP_OFFSET and len(w_map) == params_abi.TMA_MAP_BYTES
    tail = struct.pack("<Qi", a_scale, a_scale_stride)
    params = head + w_map + tail
    return params + bytes(SCALED_PARAMS_BYTES - len(params))


def kernel_key(arch: str, out_dtype: torch.dtype, tile: TileConfig, blocks: bool = False,
               element: str = ELEMENT) -> KernelKey:
    return KernelKey(arch=arch, spec=gemm_spec(out_dtype, blocks, element), tile=tile)


# The custom op: the QuantizedActivation and PackedW8A8Weight as their tensors and fields.
_LIBRARY = torch.library.Library("humming_aot", "FRAGMENT")
_LIBRARY.define(
    "gemm_w8a8(Tensor codes, Tensor scales, Tensor w, Tensor w_scale, Tensor? bias, int n_valid, bool blocks, "
    "str granularity, int group_size, ScalarType out_dtype, str element=\"float8e4m3\") -> Tensor"
)


def _gemm_w8a8_op(codes, scales, w, w_scale, bias, n_valid, blocks, granularity, group_size, out_dtype,
                  element=ELEMENT):
    qa = QuantizedActivation(element=element, granularity=ActivationGranularity(granularity),
                             group_size=group_size or None, scale_dtype="float32", codes=codes, scales=scales)
    n, k = w.shape[0], w.shape[1] * (2 if element == INT4 else 1)  # (int4: two codes a byte)
    packed = PackedW8A8Weight(w=w, w_scale=w_scale, n=n, k=k,
                              format="float8e4m3:b128x128" if blocks else f"{element}:channel",
                              n_valid=n_valid if n_valid != n else None, blocks=blocks)
    return _gemm(qa, packed, bias=bias, out_dtype=out_dtype)


def _gemm_w8a8_fake(codes, scales, w, w_scale, bias, n_valid, blocks, granularity, group_size, out_dtype,
                    element=ELEMENT):
    return codes.new_empty((*codes.shape[:-1], n_valid), dtype=out_dtype)


_LIBRARY.impl("gemm_w8a8", _gemm_w8a8_op, "CPU")
_LIBRARY.impl("gemm_w8a8", _gemm_w8a8_op, "CUDA")
torch.library.register_fake("humming_aot::gemm_w8a8", _gemm_w8a8_fake, lib=_LIBRARY)
