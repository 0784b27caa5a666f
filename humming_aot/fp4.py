"""W4A4 FP4: block-scaled e2m1 weights x block-scaled e2m1 activations, 16-bit output, on the
block-scaled mma.sync of sm120 / sm121 (RTX 50x0, RTX PRO 6000 Blackwell, DGX Spark): the mma-fp4
body (csrc/include/humming_aot/kernel/dense_mma_fp4.cuh), whose tensor cores apply both operands'
scales.

- NVFP4 x NVFP4: a float8e4m3 scale per 16 of K on each side and one float32 global scale each
  (ModelOpt's NVFP4 checkpoints: "nvfp4" weights, "nvfp4" activations);
- MXFP4 x MXFP4: a float8e8m0 scale per 32 of K on each side ("mxfp4" x "mxfp4").

    qw = humming_aot.quant.quantize(w, "nvfp4")
    packed = humming_aot.fp4.pack(qw)                   # codes two a byte, scale bytes per K tile
    qa = humming_aot.ops.quantize_activation(x, "nvfp4")
    y = humming_aot.fp4.gemm(qa, packed)                # (M, N) bfloat16

``gemm`` computes ``out[m, n] = sum_k a[m, k] sa[m, k / G] w[n, k] sw[n, k / G] x a_global x
w_global (+ bias)`` with fp32 sums (each K tile of 256 codes into fp32 accumulators). On CPU tensors
it runs the float64 reference of the same operands rounded once to the output dtype. On a GPU it
needs the block-scaled instruction: the kernels are built for sm120a and sm121a (the support
matrix's pairings w4a4_nvfp4 and w4a4_mxfp4); other GPUs are told to keep 16-bit activations
(W4A16 of the same weights) or, for MXFP4 on sm89 / sm90a, to use float8 activations (W4A8).

The kernel reads codes two to a byte (code 2 j in the low nibble of byte j) and each row's scale
bytes per K tile of 256 codes (16 NVFP4, 8 MXFP4; zero past K): pack writes the weight so, and the
launch lays out the activations' (one code a byte and float32 scales in a QuantizedActivation) so
before it runs the kernel.
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot import formats, params_abi
from humming_aot.bodies.mma_fp4 import ELEMENT, SCALES, native
from humming_aot.quant.activation import ActivationGranularity, QuantizedActivation
from humming_aot.quant.weight import QuantizedWeight
from humming_aot.quant.weight_format import ScaleGranularity, ZeroPointKind
from humming_aot.spec import ActivationScale, GemmSpec, KernelKey, MmaKind, TileConfig, parse_arch
from humming_aot.spec import ScaleGranularity as ScaleGranularitySpec
from humming_aot.w8a8 import PackedRows

__all__ = ["PackedFp4Weight", "gemm", "gemm_spec", "kernel_key", "pack", "reference", "select_tile"]

NVFP4_SCALES = "float8e4m3"
MXFP4_SCALES = "float8e8m0"
# N is padded to this many channels by pack (zero codes and scales), as the W8A8 weights are
N_ALIGN = 16
# K must be a multiple of this many codes: rows of codes two to a byte are 16-byte aligned (and
# K holds whole NVFP4 groups of 16 and MXFP4 groups of 32)
K_ALIGN = 32
# codes per K tile of the kernel (128 bytes)
TILE_CODES = 256
_OUT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
_RECIPES = {NVFP4_SCALES: "NVFP4", MXFP4_SCALES: "MXFP4"}


def tile_scale_bytes(scale_dtype: str) -> int:
    """Scale bytes of a row per K tile of 256 codes: 16 (NVFP4) or 8 (MXFP4)."""
    return SCALES[scale_dtype][1]


def group_size(scale_dtype: str) -> int:
    """Codes per scale: 16 (NVFP4) or 32 (MXFP4)."""
    return SCALES[scale_dtype][0]


def scale_codes(scales: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """float32 scales exactly representable in scale_dtype -> their uint8 codes (ue4m3: the
    float8e4m3 byte of a positive value; ue8m0: the float32 exponent field, 2^-127 included)."""
    if scale_dtype == NVFP4_SCALES:
        return scales.to(torch.float8_e4m3fn).view(torch.uint8)
    return ((scales.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def scale_values(codes: torch.Tensor, scale_dtype: str) -> torch.Tensor:
    """The inverse of scale_codes, as float64."""
    if scale_dtype == NVFP4_SCALES:
        return codes.view(torch.float8_e4m3fn).to(torch.float64)
    return torch.pow(2.0, codes.to(torch.float64) - 127)


def tiled_scales(scales: torch.Tensor, scale_dtype: str, k: int) -> torch.Tensor:
    """(rows, K / G) float32 scales -> the kernel's (rows, ceil(K / 256) x S) uint8 scale bytes,
    zero past K."""
    rows = scales.shape[0]
    per_tile = tile_scale_bytes(scale_dtype)
    out = torch.zeros((rows, -(-k // TILE_CODES) * per_tile), dtype=torch.uint8, device=scales.device)
    out[:, : scales.shape[1]] = scale_codes(scales, scale_dtype)
    return out


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) e2m1 codes, one a byte -> (..., K / 2), code 2 j in the low nibble of byte j."""
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_codes."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


@dataclasses.dataclass(frozen=True, eq=False)
class PackedFp4Weight(PackedRows):
    """An NVFP4 or MXFP4 weight as the mma-fp4 kernels read it, on one device.

    w:            (n, k / 2) uint8, e2m1 codes two a byte (code 2 j in the low nibble of byte j;
                  rows past n_valid zero)
    w_scale:      (n, ceil(k / 256) x S) uint8, each row's scale codes (ue4m3 or ue8m0), S = 16
                  (NVFP4) or 8 (MXFP4) per K tile of 256 codes, zero past K and n_valid
    global_scale: the weight's float32 global scale (NVFP4), 1.0 for MXFP4
    scale_dtype:  "float8e4m3" (NVFP4, per 16 of K) or "float8e8m0" (MXFP4, per 32)
    n, k:         the kernel's N (a multiple of N_ALIGN) and the weight's K (a multiple of K_ALIGN)
    n_valid:      the weight's own N where pack padded it, else None
    format:       the WeightFormat string it was packed from
    """

    w: torch.Tensor
    w_scale: torch.Tensor
    global_scale: float
    scale_dtype: str
    n: int
    k: int
    format: str
    n_valid: int | None = None

    @property
    def element(self) -> str:
        return ELEMENT

    @property
    def group_size(self) -> int:
        return group_size(self.scale_dtype)

    @property
    def recipe(self) -> str:
        """"NVFP4" or "MXFP4"."""
        return _RECIPES[self.scale_dtype]

    def effective_weight(self) -> torch.Tensor:
        """(out_features, K) float64: decode(codes) x block scale x global scale."""
        n, k = self.out_features, self.k
        codes = unpack_codes(self.w[:n])
        scales = scale_values(self.w_scale[:n, : k // self.group_size], self.scale_dtype)
        values = formats.get(ELEMENT).decode(codes).to(torch.float64)
        return values * scales.repeat_interleave(self.group_size, 1) * self.global_scale


def _recipe_of_weight(fmt) -> str | None:
    """The scale dtype of an NVFP4 / MXFP4 WeightFormat, else None."""
    if fmt.element != ELEMENT or fmt.zero_point is not ZeroPointKind.NONE:
        return None
    if fmt.granularity is ScaleGranularity.GROUP_WITH_GLOBAL and fmt.group_size == 16 \
            and fmt.scale_dtype == NVFP4_SCALES:
        return NVFP4_SCALES
    if fmt.granularity is ScaleGranularity.GROUP and fmt.group_size == 32 and fmt.scale_dtype == MXFP4_SCALES:
        return MXFP4_SCALES
    return None


def pack(qw: QuantizedWeight) -> PackedFp4Weight:
    """The mma-fp4 kernels' operands from an NVFP4 ("nvfp4": float4e2m1 per 16 with float8e4m3
    scales and a global scale) or MXFP4 ("mxfp4": per 32 with float8e8m0 scales) QuantizedWeight,
    on its device. N is padded to a multiple of N_ALIGN; K must be a multiple of K_ALIGN."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"pack takes a humming_aot.quant.QuantizedWeight, got {type(qw).__name__}")
    fmt = qw.format
    scale_dtype = _recipe_of_weight(fmt)
    if scale_dtype is None:
        raise ValueError(f"the FP4 W4A4 kernels take NVFP4 ('nvfp4': float4e2m1:g16:s=float8e4m3 with a global "
                         f"scale) or MXFP4 ('mxfp4': float4e2m1:g32:s=float8e8m0) weights, got {fmt}")
    if qw.codes.dim() != 2:
        raise ValueError(f"pack takes one (N, K) weight, got codes of shape {tuple(qw.codes.shape)}")
    n, k = qw.codes.shape
    if k % K_ALIGN:
        raise ValueError(f"K={k}: the FP4 W4A4 kernels need K to be a multiple of {K_ALIGN} (rows of codes two a "
                         "byte are 16-byte aligned); pad the weight's K with zero columns and the activations' with "
                         "zeros")
    n_pad = -(-n // N_ALIGN) * N_ALIGN
    w = torch.zeros((n_pad, k // 2), dtype=torch.uint8, device=qw.codes.device)
    w[:n] = pack_codes(qw.codes)
    w_scale = torch.zeros((n_pad, -(-k // TILE_CODES) * tile_scale_bytes(scale_dtype)), dtype=torch.uint8,
                          device=qw.codes.device)
    w_scale[:n] = tiled_scales(qw.scales.reshape(n, -1), scale_dtype, k)
    glob = 1.0 if qw.global_scale is None else float(qw.global_scale.reshape(()).item())
    return PackedFp4Weight(w=w, w_scale=w_scale, global_scale=glob, scale_dtype=scale_dtype, n=n_pad, k=k,
                           format=str(fmt), n_valid=n if n_pad != n else None)


def gemm_spec(out_dtype: torch.dtype, scale_dtype: str = NVFP4_SCALES) -> GemmSpec:
    """The GemmSpec of the mma-fp4 kernels with this output dtype and recipe (scale dtype)."""
    return GemmSpec(a_dtype=ELEMENT, a_scale=ActivationScale.GROUP, a_scale_dtype=scale_dtype, w_dtype=ELEMENT,
                    w_scale=ScaleGranularitySpec.GROUP, w_scale_dtype=scale_dtype, out_dtype=_OUT_DTYPES[out_dtype])


def kernel_key(arch: str, out_dtype: torch.dtype, tile: TileConfig, scale_dtype: str = NVFP4_SCALES) -> KernelKey:
    return KernelKey(arch=arch, spec=gemm_spec(out_dtype, scale_dtype), tile=tile)


# (most tokens, tile) of the mma-fp4 body: a rule from the tile sizes, not a tuning run (no sm120
# GPU has run it yet). Each ring fits sm120's 99 KB with NVFP4's scale bytes (144 bytes a row and
# stage): 16 and 32 tokens four stages deep over 128 channels (82,944 and 92,160 bytes), then 64 x
# 128 three deep (82,944; four would take 110,592) over eight warps of 32 x 32 outputs (under
# ptxas's cap of 255 registers with room: two warps of 32 x 64 took 250).
_TILES = (
    (16, "mma-fp4:16x128x128_w1x4_s4"),
    (32, "mma-fp4:32x128x128_w1x4_s4"),
    (1 << 62, "mma-fp4:64x128x128_w2x4_s3"),
)


def select_tile(m: int) -> TileConfig:
    """The mma-fp4 tile for m tokens, from _TILES."""
    from humming_aot.w8a8 import table_tile

    return table_tile(_TILES, m)


def _check_activation(qa: QuantizedActivation, packed: PackedFp4Weight) -> None:
    if not isinstance(qa, QuantizedActivation):
        raise TypeError(f"gemm takes a humming_aot.quant.QuantizedActivation (ops.quantize_activation), got "
                        f"{type(qa).__name__}")
    if not isinstance(packed, PackedFp4Weight):
        raise TypeError(f"gemm takes a PackedFp4Weight (humming_aot.fp4.pack), got {type(packed).__name__}")
    want = "nvfp4" if packed.scale_dtype == NVFP4_SCALES else "mxfp4"
    if qa.element != ELEMENT or qa.granularity is not ActivationGranularity.GROUP \
            or qa.group_size != packed.group_size or qa.scale_dtype != packed.scale_dtype:
        raise ValueError(
            f"the {packed.recipe} weight ({packed.format}) takes {packed.recipe} activations (float4e2m1 with a "
            f"{packed.scale_dtype} scale per {packed.group_size} of K), got {qa.element} per "
            f"{qa.granularity.value} (group {qa.group_size}) with {qa.scale_dtype} scales; quantize with "
            f"ops.quantize_activation(x, '{want}')"
        )
    if qa.codes.shape[-1] != packed.k:
        raise ValueError(f"activations have K={qa.codes.shape[-1]} but the weight has K={packed.k}")
    tensors = [qa.codes, qa.scales] + ([qa.global_scale] if qa.global_scale is not None else [])
    if any(t.device != packed.w.device for t in tensors):
        raise ValueError(f"the activation codes, scales and global scale are on "
                         f"{', '.join(str(t.device) for t in tensors)}, but the weight is on {packed.w.device}: move "
                         "them together")


def dequantized_activation(qa: QuantizedActivation, k: int) -> torch.Tensor:
    """(M, k) float64: decode(codes) x block scales (x the global scale)."""
    codes = qa.codes.reshape(-1, k)
    scales = qa.scales.to(torch.float64).reshape(codes.shape[0], -1).repeat_interleave(qa.group_size, 1)
    out = formats.get(ELEMENT).decode(codes).to(torch.float64) * scales
    if qa.global_scale is not None:
        out = out * qa.global_scale.to(torch.float64)
    return out


def reference(qa: QuantizedActivation, packed: PackedFp4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(M, out_features) float64: the exact product of the operands gemm sees (+ bias)."""
    out = dequantized_activation(qa, packed.k) @ packed.effective_weight().T
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out


def gemm(qa: QuantizedActivation, packed: PackedFp4Weight, *, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
         tile: TileConfig | str | None = None, arch: str | None = None) -> torch.Tensor:
    """(*lead, out_features) = decode(qa) @ decode(packed)^T (+ bias) in out_dtype.

    ``bias``: contiguous (out_features,) in out_dtype. ``out`` (GPU only, tests): a contiguous
    (M, packed.n) tensor to write instead of a new one. ``tile``: an mma-fp4 tile label to run
    instead of select_tile's. ``arch`` (tests): the kernel's target, one the GPU serves; on an
    sm90a GPU "sm90a" builds the kernel with the instruction emulated (mma/mma_sync_fp4.cuh).

    Under torch.compile and torch's modes it is the custom op ``humming_aot::gemm_fp4`` (with a
    fake implementation); out, tile and arch are eager only.
    """
    from humming_aot.ops import _no_torch_modes

    if torch.compiler.is_compiling() or not _no_torch_modes():
        if out is not None or tile is not None or arch is not None:
            raise ValueError("out, tile and arch are eager-only arguments of fp4.gemm (tests and tuning)")
        _check_activation(qa, packed)
        return torch.ops.humming_aot.gemm_fp4(qa.codes, qa.scales, qa.global_scale, packed.w, packed.w_scale,
                                              packed.global_scale, bias, packed.out_features, packed.k,
                                              packed.scale_dtype, out_dtype)
    return _gemm(qa, packed, bias=bias, out_dtype=out_dtype, out=out, tile=tile, arch=arch)


def _gemm(qa, packed, *, bias, out_dtype, out=None, tile=None, arch=None) -> torch.Tensor:
    """gemm without the dispatcher (eager, or inside the custom op)."""
    from humming_aot.w8a8 import run_checked

    _check_activation(qa, packed)
    if packed.device.type != "cuda" and arch is not None:
        raise ValueError("arch chooses the GPU kernel's target; leave it None on the CPU")
    return run_checked(qa, packed, reference, bias=bias, out_dtype=out_dtype, out=out, tile=tile,
                       stream_k=None, persistent=None, launch=lambda *args: _launch(*args, arch=arch))


# launch plans: (device, out dtype, scale dtype, tile argument, arch argument, m, n, k) -> _Plan
_plans: dict[tuple, "_Plan"] = {}


class _Plan:
    __slots__ = ("tile", "loaded", "splits", "grid", "workspace_shape", "schedule")

    def __init__(self, tile: TileConfig, loaded, info, m: int, n: int, k_tiles: int):
        from humming_aot import dispatch, heuristics
        from humming_aot.w8a8 import SCALED_PARAMS_BYTES

        if loaded.params_bytes != SCALED_PARAMS_BYTES:
            raise ValueError(f"kernel {loaded.name}: takes {loaded.params_bytes} bytes of params, not "
                             f"{SCALED_PARAMS_BYTES}; the Python ScaledTmaGemmParams layout differs from "
                             "kernel/params.cuh")
        tiles = -(-m // tile.block_m) * -(-n // tile.block_n)
        self.tile, self.loaded = tile, loaded
        self.splits = heuristics.split_k_factor(
            m=m, n=n, k=128 * k_tiles, tile=tile, num_sms=info.num_sms, max_tiles=dispatch.SPLIT_K_COUNTERS,
            ctas_per_sm=dispatch._resident_ctas(loaded, tile, info), target_ctas_per_sm=2)
        self.grid = (tiles, self.splits, 1)
        self.workspace_shape = (self.splits, m, n) if self.splits > 1 else None
        self.schedule = params_abi.TMA_SCHEDULE.pack(0, self.splits, 0)


def _kernel(info, out_dtype: torch.dtype, packed: PackedFp4Weight, tile, m: int, arch: str | None):
    """(tile, key) of a launch: the table's tile or the given one (an mma-fp4 label or
    TileConfig), for the GPU's block-scaled target (sm120a, sm121a) or the given arch."""
    from humming_aot.enumerate import parse_tile_field

    if arch is None:
        arches = [a for a in info.arches if native(a)]
        if not arches:
            hint = ("keep 16-bit activations (W4A16 NVFP4 runs from sm75)" if packed.scale_dtype == NVFP4_SCALES
                    else "keep 16-bit activations (W4A16 MXFP4 runs from sm75), or on sm89 and sm90a quantize the "
                         "activations with 'float8e4m3:token' (W4A8: humming_aot.w4a8)")
            raise RuntimeError(
                f"{packed.recipe} W4A4 needs the block-scaled FP4 mma of sm120 / sm121 (RTX 50x0, RTX PRO 6000 "
                f"Blackwell, DGX Spark; kernels for sm120a and sm121a); {info.name} is sm_{info.capability[0]}"
                f"{info.capability[1]}: {hint}")
        arch = arches[0]
    elif arch not in info.arches:
        raise ValueError(f"arch {arch!r}: {info.name} runs {', '.join(info.arches)}")
    if tile is None:
        tile = select_tile(m)
    elif isinstance(tile, str):
        tile = parse_tile_field(tile)
    if tile.mma is not MmaKind.MMA_FP4:
        raise ValueError(f"tile {tile.label}: the FP4 W4A4 kernels run mma-fp4 tiles (leave tile None for the "
                         "table's)")
    if parse_arch(arch)[0] < 80:
        raise ValueError(f"arch {arch!r}: the mma-fp4 kernels need sm80 or later")
    return tile, kernel_key(arch, out_dtype, tile, packed.scale_dtype)


def _launch(qa, packed: PackedFp4Weight, bias, out_dtype: torch.dtype, out, tile, stream_k, persistent, *,
            arch=None):
    from humming_aot import dispatch
    from humming_aot import obtain as _obtain
    from humming_aot.w8a8 import _pack_params

    k, n = packed.k, packed.n
    codes = qa.codes.reshape(-1, k)
    m = codes.shape[0]
    device = codes.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    info = dispatch.device_info(index)
    if out is not None and (out.shape != (m, n) or out.dtype != out_dtype or not out.is_contiguous()
                            or out.device != device):
        raise ValueError(f"out must be a contiguous ({m}, {n}) {out_dtype} tensor on {device}")
    k_tiles = -(-k // TILE_CODES)
    plan_key = (index, out_dtype, packed.scale_dtype, tile, arch, m, n, k)
    plan = _plans.get(plan_key)
    if plan is None:
        tile_config, key = _kernel(info, out_dtype, packed, tile, m, arch)
        if m == 0:
            return out if out is not None else torch.empty((0, n), dtype=out_dtype, device=device)
        # every check a caller can fail is above; the GPU work starts after
        plan = _Plan(tile_config, _obtain.load(key, info), info, m, n, k_tiles)
        if len(_plans) >= dispatch.MAX_PLANS:
            _plans.clear()
        _plans[plan_key] = plan
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=device)
    if bias is not None and packed.n_valid is not None:  # the kernel reads a bias for every padded column
        bias = torch.nn.functional.pad(bias, (0, n - packed.n_valid))
    a_codes = pack_codes(codes).contiguous()  # (m, k / 2): two codes a byte
    a_scales = tiled_scales(qa.scales.reshape(m, -1), packed.scale_dtype, k)
    a_global = None if qa.global_scale is None else qa.global_scale.to(torch.float32).contiguous()
    stream = dispatch.current_stream(index)
    workspace = counters = None
    if plan.workspace_shape is not None:
        workspace = torch.empty(plan.workspace_shape, dtype=torch.float32, device=device)
        counters = dispatch._split_k_counters(device, stream)
    gemm_params = params_abi.GEMM_PARAMS.pack(
        a_codes.data_ptr(), packed.w.data_ptr(), packed.w_scale.data_ptr(),
        0 if a_global is None else a_global.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
        0 if workspace is None else workspace.data_ptr(), 0 if counters is None else counters.data_ptr(),
        k // 2, out.stride(0), m, n, 128 * k_tiles, k // 2, plan.splits, packed.global_scale)
    params = _pack_params(gemm_params, plan.schedule, bytes(params_abi.TMA_MAP_BYTES),
                          bytes(params_abi.TMA_MAP_BYTES), a_scales.data_ptr())
    loaded = plan.loaded
    try:
        loaded.launch(plan.grid, stream, params)
    except Exception as error:
        error.add_note(f"launching kernel {loaded.name} on device {loaded.device}")
        raise
    return out


# The custom op: the QuantizedActivation and PackedFp4Weight as their tensors and fields.
_LIBRARY = torch.library.Library("humming_aot", "FRAGMENT")
_LIBRARY.define(
    "gemm_fp4(Tensor codes, Tensor scales, Tensor? a_global, Tensor w, Tensor w_scale, float w_global, Tensor? bias, "
    "int n_valid, int k, str scale_dtype, ScalarType out_dtype) -> Tensor"
)


def _gemm_fp4_op(codes, scales, a_global, w, w_scale, w_global, bias, n_valid, k, scale_dtype, out_dtype):
    qa = QuantizedActivation(element=ELEMENT, granularity=ActivationGranularity.GROUP,
                             group_size=group_size(scale_dtype), scale_dtype=scale_dtype, codes=codes, scales=scales,
                             global_scale=a_global)
    n = w.shape[0]
    packed = PackedFp4Weight(w=w, w_scale=w_scale, global_scale=float(w_global), scale_dtype=scale_dtype, n=n, k=k,
                             format="nvfp4" if scale_dtype == NVFP4_SCALES else "mxfp4",
                             n_valid=n_valid if n_valid != n else None)
    return _gemm(qa, packed, bias=bias, out_dtype=out_dtype)


def _gemm_fp4_fake(codes, scales, a_global, w, w_scale, w_global, bias, n_valid, k, scale_dtype, out_dtype):
    return codes.new_empty((*codes.shape[:-1], n_valid), dtype=out_dtype)


_LIBRARY.impl("gemm_fp4", _gemm_fp4_op, "CPU")
_LIBRARY.impl("gemm_fp4", _gemm_fp4_op, "CUDA")
torch.library.register_fake("humming_aot::gemm_fp4", _gemm_fp4_fake, lib=_LIBRARY)
