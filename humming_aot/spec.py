"""What a kernel computes (GemmSpec), how it is tiled (TileConfig), and which compiled kernel that
is (KernelKey, with a name grammar that round-trips).

Nothing here depends on torch or on a GPU: the enumerator, codegen, the CLI and the run time all
share these types. Support rules live in ``support.py``; tile choices in ``heuristics/``.

Kernel names have fixed, ``_``-separated fields (``-`` separates parts inside a field)::

    gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x64_w1x2_s8
    |    |     |     |   |      |            |      |         |    stages
    |    |     |     |   |      |            |      |         warps (M x N)
    |    |     |     |   |      |            |      block M x N x K
    |    |     |     |   |      |            output dtype
    |    |     |     |   |      weight: element, scale granularity, scale dtype[, zero point]
    |    |     |     |   activation: dtype[, scale granularity, scale dtype] (a-e4m3-k-f32)
    |    |     |     mma kind
    |    |     target arch
    |    gemm type
"""
from __future__ import annotations

import dataclasses
import re
from enum import Enum

# Weight code formats a kernel reads: integers of 1-8 bits, and signed floats float{B}e{E}m{M}
# (B = 1 + E + M, 2 <= B <= 8; E = 0: sign-magnitude integers).
INT_WEIGHT_DTYPES = tuple(f"{sign}int{bits}" for sign in ("", "u") for bits in range(1, 9))
FLOAT_WEIGHT_DTYPES = tuple(
    f"float{1 + e + m}e{e}m{m}" for e in range(8) for m in range(8) if 2 <= 1 + e + m <= 8
)

# Canonical dtype names <-> the short forms used in kernel names.
DTYPE_SHORT = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float8e8m0": "ue8m0",
    **{name: name[len("float") + 1:] for name in FLOAT_WEIGHT_DTYPES},  # float4e2m1 -> e2m1
    **{name: ("u" if name.startswith("u") else "s") + name[-1] for name in INT_WEIGHT_DTYPES},  # int4 -> s4
}
DTYPE_LONG = {short: long for long, short in DTYPE_SHORT.items()}

_ARCH_RE = re.compile(r"^sm(\d{2,3})([af]?)$")
_BITS_RE = re.compile(r"^(?:u?int|float)(\d)")
_FLOAT_RE = re.compile(r"^float\de(\d)m(\d)$")


class GemmType(str, Enum):
    """Which rows of the activation meet which weight. DENSE, and the grouped MoE types MASKED
    and GROUPED (schedules around the mma.sync bodies, sm80 and later: support.toml's 16-bit
    pairings allow them, the "moe" catalog holds them); INDEXED has no kernel yet."""

    DENSE = "dense"
    """out[M, N] = a[M, K] @ w[N, K]^T: one weight for every row."""
    INDEXED = "indexed"
    """MoE, fused_moe style: out[r] = a[token(r)] @ w[expert(block(r))]^T over rows sorted and
    padded per expert (sorted token ids, one expert id per block of rows, -1 = skip)."""
    GROUPED = "grouped"
    """MoE, grouped contiguous: rows laid out expert after expert (a per-row expert index or prefix
    offsets), each block of rows multiplied by its expert's weight."""
    MASKED = "masked"
    """MoE, grouped masked: a[E, max_m, K] with a per-expert count of valid rows on the device."""


class ScaleGranularity(str, Enum):
    """How weight scales are shared along K and N (as compiled into a kernel)."""

    GROUP = "g"
    """One scale per output channel per group of K; the group size is a run-time argument, and a
    per-channel scale is the group that spans all of K."""
    BLOCK = "b"
    """One scale per 128 x 128 block of (N, K) (DeepSeek-V3's fp8 weights; the W8A8 body only)."""


class ActivationScale(str, Enum):
    """How a quantized activation's scales are shared (compiled into a kernel). 16-bit activations
    have none. Group sizes are run-time arguments, as for weights."""

    NONE = "none"
    """16-bit activations: no scale (the kernel name's activation field is just the dtype)."""
    TENSOR = "t"
    """One scale for the whole activation (static, calibrated, or dynamic)."""
    TOKEN = "k"
    """One scale per row (token), dynamic."""
    GROUP = "g"
    """One scale per row per group of K (DeepSeek-V3 1 x 128; NVFP4 16, MXFP4 32)."""


# Activation dtypes that need no scale: the kernels' 16-bit operands.
UNSCALED_ACT_DTYPES = ("float16", "bfloat16")


class ZeroPoint(str, Enum):
    """How the weight's zero point is given."""

    NONE = "none"
    """Symmetric: the implicit zero point of the element format (2^(b-1) for GPTQ-style ints)."""
    INTEGER = "zpi"
    """An explicit integer zero point per scale group (AWQ-style uint codes)."""
    FLOAT = "zpf"
    """A float zero point per scale group (HQQ-style uint codes), in the scale dtype."""


class MmaKind(str, Enum):
    """The tensor-core instruction family a kernel body is written on."""

    MMA_SYNC = "mma"
    """Warp-level mma.sync (SM80+ for bf16), the portable body."""
    MMA_SWAPPED = "mma-sw"
    """The mma.sync body's swapped-operand per-warp pipeline for 16 tokens (the 8-token tile is
    ``mma`` with block_m = 8): weights as the mma A operand, two n8 token fragments per weight tile."""
    WGMMA = "wgmma"
    """Warpgroup-level wgmma.mma_async (sm90a only): dequantized weights from registers, activations
    from shared memory; block_m is the wgmma N (tokens), 64 weight channels per warpgroup."""
    SIMT = "simt"
    """The naive reference body (any arch, test-only): one warp per CTA, fp32 FMAs on the CUDA cores
    over weights decoded by the same numerics as the tensor-core bodies."""
    WGMMA_WS = "wgmma-ws"
    """The warp-specialized wgmma body (sm90a only): a producer warpgroup feeds an mbarrier ring
    with TMA (activations, through a tensor map in the kernel's Params) and bulk copies (weights,
    scales); one or two consumer warpgroups of 64, 128 or 256 weight channels each (block_n / 64 units
    over warps_n / 4 warpgroups) dequantize and issue wgmma with block_m tokens as the wgmma N."""

    WGMMA_SS = "wgmma-ss"
    """The warp-specialized W8A8 body (sm90a only): e4m3 activation and weight codes both staged in
    shared memory by TMA, wgmma reading each through a descriptor (no register operand), K stages of
    128 promoted into fp32 accumulators; block_m tokens as the wgmma N, 64 or 128 weight channels per
    consumer warpgroup."""

    WGMMA_W4A8 = "wgmma-w4a8"
    """The warp-specialized W4A8 body (sm90a only): int4 weight codes turned into e4m3 in registers
    (wgmma's A) against e4m3 activation codes staged by TMA (its B), K stages of 128 weighed by
    their group scales into fp32 accumulators; block_m tokens as the wgmma N, 64 or 128 weight
    channels per consumer warpgroup."""

    MMA_SS = "mma-ss"
    """The portable W8A8 body on mma.sync (s8 SM80+, e4m3 SM89+): activation and weight codes both
    K-major in shared memory (cp.async), ldmatrix into m16n8k32 fragments, fp32 token x channel
    scales on the sums; the arches without wgmma run W8A8 here."""

    MMA_W4A8 = "mma-w4a8"
    """The portable W4A8 body on mma.sync: int4 codes of W4A8's packed layout widened in registers
    to s8 (int8 activations, SM80+) or e4m3 (float8 activations, SM89+) as the mma's A, the
    activation codes its B (cp.async, ldmatrix), fp32 group scales per K tile of 128."""

    MMA_FP4 = "mma-fp4"
    """The block-scaled FP4 body (W4A4 NVFP4 x NVFP4, MXFP4 x MXFP4; sm120a / sm121a): e2m1
    activation and weight codes two to a byte and their ue4m3 / ue8m0 block scales staged by
    cp.async, ldmatrix into mma.sync m16n8k64 .kind::mxf4nvf4 .block_scale, which applies the
    scales; fp32 sums per K tile of 256 codes into fp32 accumulators, global scales at the end."""

    @property
    def is_wgmma(self) -> bool:
        """A wgmma body (sm90a only; K stages of 64)."""
        return self in (MmaKind.WGMMA, MmaKind.WGMMA_WS)


def code_bits(w_dtype: str) -> int:
    """Bits per code of a weight dtype of INT_WEIGHT_DTYPES or FLOAT_WEIGHT_DTYPES."""
    return int(_BITS_RE.match(w_dtype).group(1))


def parse_arch(arch: str) -> tuple[int, str]:
    """'sm90a' -> (90, 'a'); raises ValueError for anything else."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise ValueError(
            f"arch {arch!r} is not a CUDA target name: expected e.g. 'sm80', 'sm89', 'sm90a', 'sm120'"
        )
    return int(m.group(1)), m.group(2)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GemmSpec:
    """What is computed: operand formats and the gemm type (no shapes, no tiles)."""

    gemm_type: GemmType = GemmType.DENSE
    a_dtype: str  # activation dtype, canonical name ("bfloat16", or quantized: "float8e4m3", "int8")
    a_scale: ActivationScale = ActivationScale.NONE  # quantized activations only
    a_scale_dtype: str | None = None  # quantized activations only ("float32", "float8e8m0", ...)
    w_dtype: str  # weight element format ("int4", "uint4", "int8", "float4e2m1")
    w_scale: ScaleGranularity = ScaleGranularity.GROUP
    w_scale_dtype: str  # dtype the scales are stored in
    w_zero_point: ZeroPoint = ZeroPoint.NONE
    out_dtype: str

    def __post_init__(self) -> None:
        for field in ("a_dtype", "w_dtype", "w_scale_dtype", "out_dtype"):
            value = getattr(self, field)
            if value not in DTYPE_SHORT:
                raise ValueError(f"GemmSpec.{field}={value!r} is not a known dtype name")
        if self.a_dtype in UNSCALED_ACT_DTYPES:
            if self.a_scale is not ActivationScale.NONE or self.a_scale_dtype is not None:
                raise ValueError(f"GemmSpec: {self.a_dtype} activations take no activation scale "
                                 f"(got a_scale={self.a_scale.value}, a_scale_dtype={self.a_scale_dtype})")
        elif self.a_scale is ActivationScale.NONE or self.a_scale_dtype not in DTYPE_SHORT:
            raise ValueError(f"GemmSpec: quantized {self.a_dtype} activations need a_scale (tensor, token or "
                             f"group) and a known a_scale_dtype (got {self.a_scale.value}, {self.a_scale_dtype!r})")

    @property
    def a_is_quantized(self) -> bool:
        """Activations of at most 8 bits with their own scales (W8A8, W4A8, W4A4)."""
        return self.a_scale is not ActivationScale.NONE

    @property
    def activation_field(self) -> str:
        """The kernel name's activation field: 'a-bf16', or 'a-e4m3-k-f32' (dtype, scale
        granularity, scale dtype) for quantized activations."""
        if not self.a_is_quantized:
            return f"a-{DTYPE_SHORT[self.a_dtype]}"
        return f"a-{DTYPE_SHORT[self.a_dtype]}-{self.a_scale.value}-{DTYPE_SHORT[self.a_scale_dtype]}"

    @property
    def w_bits(self) -> int:
        """Bits per weight code: 4 for int4, uint4 and float4e2m1."""
        return code_bits(self.w_dtype)

    @property
    def w_is_float(self) -> bool:
        """Sign / exponent / mantissa weight codes (float{B}e{E}m{M}) rather than integers."""
        return self.w_dtype.startswith("float")

    @property
    def w_exp_man(self) -> tuple[int, int]:
        """(E, M) of a float weight format (float4e2m1 -> (2, 1)); ValueError for integers."""
        m = _FLOAT_RE.match(self.w_dtype)
        if m is None:
            raise ValueError(f"{self.w_dtype} is not a float weight format")
        return int(m.group(1)), int(m.group(2))

    @property
    def weight_field(self) -> str:
        parts = ["w", DTYPE_SHORT[self.w_dtype], self.w_scale.value, DTYPE_SHORT[self.w_scale_dtype]]
        if self.w_zero_point is not ZeroPoint.NONE:
            parts.append(self.w_zero_point.value)
        return "-".join(parts)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TileConfig:
    """How a kernel tiles the problem. Every field is compiled in."""

    mma: MmaKind = MmaKind.MMA_SYNC
    block_m: int  # rows of the output per CTA (mma.sync: multiple of 16, or 8 = swapped operands; wgmma: 64, 128 or 256)
    # block_n: columns per CTA (mma.sync: 64 * warps_n; wgmma: 16 * warps_n, 64 per warpgroup;
    # wgmma-ws: 64, 128 or 256 per consumer warpgroup)
    block_n: int
    block_k: int = 64  # K per pipeline stage (mma.sync: 64, 128, 256 or 512; wgmma: 64; simt: 16)
    warps_m: int
    warps_n: int
    warps_k: int = 1  # warps splitting each stage's K steps (their partial sums meet in shared memory)
    stages: int  # cp.async pipeline depth

    def __post_init__(self) -> None:
        self.body.check_tile(self)

    @property
    def body(self):
        """The kernel body of this tile's kind (humming_aot.bodies): its tile rules, threads,
        shared memory and code generation."""
        from humming_aot.bodies import body_of  # the bodies ask spec only for types: no cycle at import

        return body_of(self.mma)

    @property
    def units_per_warpgroup(self) -> int:
        """wgmma-ws: 64-channel units each consumer warpgroup multiplies (1, 2 or 4)."""
        return self.block_n // 16 // self.warps_n

    @property
    def threads(self) -> int:
        """Threads per CTA (the body's: wgmma-ws adds its producer warpgroup)."""
        return self.body.threads(self)

    @property
    def field(self) -> str:
        """The tile part of a kernel name (the mma kind is a field of its own there)."""
        warps = f"w{self.warps_m}x{self.warps_n}" + (f"x{self.warps_k}" if self.warps_k > 1 else "")
        return f"{self.block_m}x{self.block_n}x{self.block_k}_{warps}_s{self.stages}"

    @property
    def label(self) -> str:
        """How catalogs and tools name the tile: the field, prefixed 'wgmma:' for the wgmma body."""
        return self.field if self.mma is MmaKind.MMA_SYNC else f"{self.mma.value}:{self.field}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelKey:
    """One compiled kernel: target arch + what it computes + how it is tiled."""

    arch: str  # "sm90a", "sm80", ...
    spec: GemmSpec
    tile: TileConfig

    def __post_init__(self) -> None:
        parse_arch(self.arch)
        only = self.tile.body.only_arch
        if only is not None and self.arch != only:
            raise ValueError(f"arch {self.arch!r}: {self.tile.mma.value} kernels exist only for {only}")
        self.tile.body.check_key(self)

    @property
    def name(self) -> str:
        s = self.spec
        return "_".join(
            [
                "gemm",
                s.gemm_type.value,
                self.arch,
                self.tile.mma.value,
                s.activation_field,
                s.weight_field,
                f"o-{DTYPE_SHORT[s.out_dtype]}",
                self.tile.field,
            ]
        )

    @property
    def symbol(self) -> str:
        """The kernel's C symbol (the name with '-' spelled '_'); the exact name is in its metadata."""
        return kernel_symbol(self.name)

    @property
    def metadata_symbol(self) -> str:
        """The C symbol of the kernel's KernelMetadata (spec.metadata_symbol)."""
        return metadata_symbol(self.name)

    @property
    def scales_in_fp32(self) -> bool:
        """Whether the kernel applies the weight scales to fp32 partial sums, so that the weight it
        multiplies with is (q - z) * s unrounded, instead of (q - z) * s rounded once to the
        activation dtype (``PackedWeight.effective_weight(scales_in_fp32=...)`` gives either).
        The swapped-operand mma.sync tiles (8 tokens, or 16 under mma-sw) do so for integer codes
        without a float zero point (mainloop/swapped_warp_pipeline.cuh, kScalesInFp32; the generated source checks that both
        sides agree)."""
        return self.tile.body.scales_in_fp32(self)

    @property
    def reduces_splits_in_cluster(self) -> bool:
        """Whether the kernel sums its split-K slices inside a thread-block cluster when launched
        with cluster dims (1, k_splits, 1): through distributed shared memory, without the global
        workspace and counters (epilogue/cluster_exchange.cuh). The swapped-operand mma.sync tiles
        (8 tokens, or 16 under mma-sw) do so when compiled for sm_90 or later; launched without clusters, it uses the
        workspace as every other kernel does."""
        return self.tile.body.reduces_splits_in_cluster(self)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_name(cls, name: str) -> "KernelKey":
        """Inverse of ``.name``; raises ValueError naming the field that does not parse."""
        return _parse_name(name)

    def __lt__(self, other: "KernelKey") -> bool:
        return self.name < other.name


def kernel_symbol(name: str) -> str:
    """C identifier of the kernel named `name`: '-' is not allowed in identifiers."""
    return name.replace("-", "_")


def metadata_symbol(name: str) -> str:
    """C identifier of the ``__constant__ KernelMetadata`` that describes kernel `name` (one per
    kernel: a catalog's fatbin holds several kernels, each with its own)."""
    return f"{kernel_symbol(name)}_metadata"


def _short_to_long(name: str, short: str, what: str) -> str:
    if short not in DTYPE_LONG:
        raise ValueError(f"{name!r}: {what} {short!r} is not a known dtype short name")
    return DTYPE_LONG[short]


def _enum_value(enum: type[Enum], value: str, name: str, what: str):
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(e.value) for e in enum)
        raise ValueError(f"{name!r}: {what} {value!r} is not one of {allowed}") from None


# The kernel-name grammar, versioned so that names can grow without breaking the old ones:
#
#   gemm_<gemm type>_<arch>_<tile kind>_<a-field>_<w-field>_o-<dtype>[_<tag>-<value>...]_<MxNxK>_<warps>_s<stages>
#
# Version 1: ten fields, no tagged field. A later version adds a property as a tagged field
# "<tag>-<value>" between the output field and the tile (a schedule, an expert layout, ...),
# left out of the name when it has its default, so every version-1 name keeps its meaning. A
# parser that meets a tag it does not know refuses the name, naming the field and the version it
# reads. The activation field already carries optional parts (a-<dtype>[-<scale>-<scale dtype>]).
KEY_GRAMMAR_VERSION = 1
_TAGGED_FIELDS: dict[str, str] = {}  # tag -> what it names; none in version 1

_BLOCK_RE = re.compile(r"^(\d+)x(\d+)x(\d+)$")
_WARPS_RE = re.compile(r"^w(\d+)x(\d+)(?:x(\d+))?$")
_STAGES_RE = re.compile(r"^s(\d+)$")


def _parse_name(name: str) -> KernelKey:
    fields = name.split("_")
    if len(fields) < 10 or fields[0] != "gemm":
        raise ValueError(
            f"{name!r} is not a kernel name: expected 10 '_'-separated fields starting with 'gemm' "
            f"(kernel-name grammar version {KEY_GRAMMAR_VERSION})"
        )
    for tagged in fields[7:-3]:
        tag = tagged.split("-", 1)[0]
        if tag not in _TAGGED_FIELDS:
            raise ValueError(
                f"{name!r}: field {tagged!r} is not part of kernel-name grammar version {KEY_GRAMMAR_VERSION}, which "
                f"this humming_aot reads (tagged fields it knows: {', '.join(sorted(_TAGGED_FIELDS)) or 'none'}); "
                "the name may come from a newer humming_aot: build or install the catalog with this version"
            )
    _, gemm_type, arch, mma, a_field, w_field, o_field = fields[:7]
    block, warps, stages = fields[-3:]
    if not a_field.startswith("a-") or not o_field.startswith("o-"):
        raise ValueError(f"{name!r}: activation and output fields must read 'a-<dtype>' and 'o-<dtype>'")
    a_parts = a_field.split("-")
    if len(a_parts) not in (2, 4):
        raise ValueError(f"{name!r}: activation field {a_field!r} must read 'a-<dtype>' or "
                         "'a-<dtype>-<scale granularity>-<scale dtype>'")
    a_scale, a_scale_dtype = ActivationScale.NONE, None
    if len(a_parts) == 4:
        a_scale = _enum_value(ActivationScale, a_parts[2], name, "activation scale granularity")
        if a_scale is ActivationScale.NONE:
            raise ValueError(f"{name!r}: a quantized activation field names its scale granularity (t, k or g)")
        a_scale_dtype = _short_to_long(name, a_parts[3], "activation scale dtype")
    w_parts = w_field.split("-")
    if w_parts[0] != "w" or len(w_parts) not in (4, 5):
        raise ValueError(f"{name!r}: weight field {w_field!r} must read 'w-<elem>-<scale>-<scale dtype>[-<zp>]'")
    zero_point = _enum_value(ZeroPoint, w_parts[4], name, "zero point") if len(w_parts) == 5 else ZeroPoint.NONE
    if zero_point is ZeroPoint.NONE and len(w_parts) == 5:
        raise ValueError(f"{name!r}: a symmetric weight has no zero-point part")
    spec = GemmSpec(
        gemm_type=_enum_value(GemmType, gemm_type, name, "gemm type"),
        a_dtype=_short_to_long(name, a_parts[1], "activation dtype"),
        a_scale=a_scale,
        a_scale_dtype=a_scale_dtype,
        w_dtype=_short_to_long(name, w_parts[1], "weight dtype"),
        w_scale=_enum_value(ScaleGranularity, w_parts[2], name, "scale granularity"),
        w_scale_dtype=_short_to_long(name, w_parts[3], "scale dtype"),
        w_zero_point=zero_point,
        out_dtype=_short_to_long(name, o_field[2:], "output dtype"),
    )
    mb, mw, ms = _BLOCK_RE.match(block), _WARPS_RE.match(warps), _STAGES_RE.match(stages)
    if not (mb and mw and ms):
        raise ValueError(f"{name!r}: tile fields must read '<M>x<N>x<K>_w<M>x<N>[x<K>]_s<stages>'")
    tile = TileConfig(
        mma=_enum_value(MmaKind, mma, name, "mma kind"),
        block_m=int(mb.group(1)),
        block_n=int(mb.group(2)),
        block_k=int(mb.group(3)),
        warps_m=int(mw.group(1)),
        warps_n=int(mw.group(2)),
        warps_k=int(mw.group(3) or 1),
        stages=int(ms.group(1)),
    )
    key = KernelKey(arch=arch, spec=spec, tile=tile)
    if key.name != name:  # e.g. leading zeros in a number
        raise ValueError(f"{name!r} is not in canonical form (expected {key.name!r})")
    return key
