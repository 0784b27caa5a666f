"""The warp-specialized Hopper W4A8 body (kernel/dense_wgmma_w4a8.cuh, sm90a): int4, uint4 (less an
integer zero point) or MXFP4 weight codes turned into e4m3 in the consumers' registers (wgmma's A) against e4m3 activation codes staged
by TMA (its B); fp32 scales per channel per group of K (MXFP4: per K tile, its groups' exponents in
the e4m3 codes) on each K tile's sums and per token on the reduced sums; the W8A8 body's Params
(ScaledTmaGemmParams, the weight map unused), roles and schedules (kernel/scaled_ws_driver.cuh)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body
from humming_aot.bodies.wgmma_ss import _HELD_LIMIT, _PRODUCER_REGISTERS, OUT_DTYPES, TOKENS

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig

# the pairings: e4m3 activations with a float32 scale per token x symmetric int4 weights with a
# float32 scale per channel per group of K, uint4 ones with an integer zero point beside it, or
# MXFP4 weights (e2m1, an e8m0 scale per 32 of K): (dtype, scale, scale dtype, zero point)
_ACTIVATIONS = ("float8e4m3", "k", "float32")
_WEIGHTS = (("int4", "g", "float32", "none"), ("uint4", "g", "float32", "zpi"), ("float4e2m1", "g", "float8e8m0", "none"))
# weight dtypes whose conversion takes per-row state from the entry's second word (Widen::kGroupTables)
_TABLE_DTYPES = ("float4e2m1", "uint4")


def entry_bytes(w_dtype: str) -> int:
    """Bytes of a channel's scale entry per K tile in a ring slot (Widen::kEntryBytes): the fp32
    scale, and for MXFP4 its four groups' exponent bytes (numerics/e2m1_e4m3.cuh), for uint4 its
    zero point in every byte of a word (numerics/uint4_zero_point.cuh)."""
    return 8 if w_dtype in _TABLE_DTYPES else 4
_MAX_SMEM = 232448  # dynamic shared memory per block on sm_90 (opt-in)
_SMEM_PER_SM = 233472  # shared memory per SM on sm_90 (each CTA also takes 1 KB of the driver's)


def _stage_bytes(tile: "TileConfig", entry: int = 4) -> int:
    """A ring slot: the activation box, 64 bytes of codes and `entry` of scale per channel, in KB."""
    return -(-(tile.block_m * 128 + tile.block_n * (64 + entry)) // 1024) * 1024


def _staging_bytes(tile: "TileConfig") -> int:
    return tile.block_m * (tile.block_n + 8) * 2


def separate_staging(tile: "TileConfig", entry: int = 4) -> bool:
    """Whether the output's staging tile lies after the ring (kSeparateStaging), with scale entries
    of `entry` bytes (entry_bytes)."""
    return (tile.warps_n == 8
            and tile.stages * _stage_bytes(tile, entry) + _staging_bytes(tile) + 1024 <= _MAX_SMEM - 1024)


def ctas_per_sm(tile: "TileConfig") -> int:
    """The CTAs the kernel is built to hold per SM (kMinBlocksPerSm): four for one consumer
    warpgroup of one 64-channel unit at most 16 tokens, two for other one-warpgroup tiles, one
    for two warpgroups."""
    if tile.warps_n == 8:
        return 1
    return 4 if tile.block_n == 64 and tile.block_m <= 16 else 2


def consumer_registers(tile: "TileConfig") -> int:
    """Registers per consumer thread after setmaxnreg (kernel/dense_wgmma_w4a8.cuh)."""
    threads = 32 * tile.warps_n + 128
    launch = 65536 // ctas_per_sm(tile) // threads // 8 * 8
    consumer = (launch * threads - _PRODUCER_REGISTERS * 128) // (32 * tile.warps_n) // 8 * 8
    return min(consumer, _HELD_LIMIT)


def wait_depth(tile: "TileConfig") -> int:
    """wgmma steps a consumer leaves in flight after each issue (kWaitDepth): three from 128
    tokens, else one."""
    return 3 if tile.block_m >= 128 else 1


def _loop_registers(tile: "TileConfig", w_dtype: str = "int4") -> int:
    """Registers beside the accumulator sets: the A fragments of wait depth + 1 K steps (four from
    128 tokens, else two) and half a K tile's codes per unit, and the loop; MXFP4 adds its group
    bytes and tables, uint4 its zero-point words: 4 per unit (kLoopRegisters of
    kernel/dense_wgmma_w4a8.cuh; for uint4 2 would do, but the 128-token tile then took two
    scratch sets and spilled 60 bytes in its K loop)."""
    tables = 4 if w_dtype in _TABLE_DTYPES else 0
    return (4 * wait_depth(tile) + 8 + tables) * tile.units_per_warpgroup + 16


def overlapped(tile: "TileConfig", w_dtype: str = "int4") -> bool:
    """Whether the tile's consumers hold two scratch sets, so that a K tile's promotion runs beside
    the next one's wgmma (kOverlapped), rather than one (w_dtype: the weight codes', int4 or
    float4e2m1, or uint4)."""
    accumulators = (tile.block_m // 2) * tile.units_per_warpgroup
    # strictly below: at equality ptxas spilled (64 x 256 with two scratch sets; MXFP4's 128 x 128
    # spilled 36 bytes at 228 of 232 before its tables were counted)
    return 3 * accumulators + _loop_registers(tile, w_dtype) < consumer_registers(tile)


def _register_need(tile: "TileConfig", w_dtype: str = "int4") -> int:
    """Registers a consumer thread needs at least: the accumulators, one scratch set and the loop's."""
    return 2 * (tile.block_m // 2) * tile.units_per_warpgroup + _loop_registers(tile, w_dtype)


# The masked MoE schedule's table of the experts' first tiles, after its staging tile
# (schedule/expert_table.cuh ExpertTable::kTableBytes, as for the 16-bit TMA body's schedule).
MOE_WALK_TABLE_BYTES = (2 * 256 + 1 + 3) * 4


def masked_smem_bytes(tile: "TileConfig", w_dtype: str, table: bool = True) -> int:
    """The grouped masked MoE schedule's shared memory on this body (kernel/grouped_masked_scaled_ws.cuh
    kSmemBytes): the ring, then a staging tile of its own after it whatever the dense body does (so
    that the next tile's slots fill while one is stored), +1024 to align the base, then the walk's
    table (table: the masked and offsets forms' ExpertTable; the row-expert form's walk has none)."""
    return (tile.stages * _stage_bytes(tile, entry_bytes(w_dtype)) + _staging_bytes(tile) + 1024
            + (MOE_WALK_TABLE_BYTES if table else 0))


def key_masked_smem_bytes(key: "KernelKey") -> int:
    """masked_smem_bytes of a key of the masked schedule: its masked and offsets forms with the walk
    table, a grouped key's row-expert form without."""
    return masked_smem_bytes(key.tile, key.spec.w_dtype, table=key.spec.gemm_type.value == "masked")


def masked_smem_limit(tile: "TileConfig") -> int:
    """The dynamic shared memory each of the tile's CTAs per SM may take on sm_90."""
    # (the per-block limit counts the 1 KB of static shared memory too)
    return _MAX_SMEM - 1024 if ctas_per_sm(tile) == 1 else _SMEM_PER_SM // ctas_per_sm(tile) - 2048


class WgmmaW4A8Body(Body):
    kind = "wgmma-w4a8"
    header = "dense_wgmma_w4a8.cuh"
    template = "DenseWgmmaW4A8"
    params_type = "ScaledTmaGemmParams"
    only_arch = "sm90a"
    fixed_block_k = True  # 128 of K a stage: one 128-byte row of e4m3 activation codes

    def check_tile(self, tile: "TileConfig") -> None:
        if tile.block_k != 128:
            raise ValueError(f"block_k={tile.block_k}: the wgmma-w4a8 body stages 128 K (one 128-byte row of e4m3 "
                             "activation codes)")
        if tile.block_m not in TOKENS:
            raise ValueError(f"block_m={tile.block_m}: the wgmma-w4a8 body takes {', '.join(map(str, TOKENS))} tokens "
                             "per CTA (the wgmma wrappers' N)")
        if tile.warps_m != 1 or tile.warps_k != 1 or tile.warps_n not in (4, 8):
            raise ValueError(
                f"warps {tile.warps_m}x{tile.warps_n}x{tile.warps_k}: the wgmma-w4a8 body runs 1 x 4 or 1 x 8 consumer "
                "warps (one or two consumer warpgroups; the producer warpgroup is not counted)"
            )
        if tile.block_n not in (16 * tile.warps_n, 32 * tile.warps_n):
            raise ValueError(f"block_n={tile.block_n} must be 64 or 128 channels per consumer warpgroup "
                             f"({16 * tile.warps_n} or {32 * tile.warps_n})")
        if tile.stages < 2:
            raise ValueError(f"stages={tile.stages}: the wgmma-w4a8 ring needs at least 2 slots")
        need, held = _register_need(tile), consumer_registers(tile)
        if need > held:
            raise ValueError(
                f"tile {tile.field}: a consumer thread needs {need} registers (two sets of {tile.block_m // 2} x "
                f"{tile.units_per_warpgroup} accumulators and the fragments); with {tile.warps_n // 4} consumer "
                f"warpgroup(s) it has {held}"
            )
        self._check_smem(tile, 4)

    def _check_smem(self, tile: "TileConfig", entry: int) -> None:
        limit = _MAX_SMEM if ctas_per_sm(tile) == 1 else _SMEM_PER_SM // ctas_per_sm(tile) - 2048
        need = self._smem(tile, entry)
        if need > limit:
            raise ValueError(f"tile {tile.field}: its ring ({tile.stages} slots of {_stage_bytes(tile, entry)} bytes), "
                             f"output staging tile and alignment need {need} bytes, more than the {limit} bytes of "
                             f"shared memory each of its {ctas_per_sm(tile)} CTA(s) per SM has on sm_90; take fewer "
                             "stages")

    def check_key(self, key: "KernelKey") -> None:
        s = key.spec
        weights = (s.w_dtype, s.w_scale.value, s.w_scale_dtype, s.w_zero_point.value)
        if ((s.a_dtype, s.a_scale.value, s.a_scale_dtype) != _ACTIVATIONS or weights not in _WEIGHTS
                or s.out_dtype not in OUT_DTYPES):
            raise ValueError(
                f"{key.name}: the wgmma-w4a8 body computes float8e4m3 activations with a float32 scale per token x "
                "symmetric int4 weights with a float32 scale per channel per group of K (a-e4m3-k-f32, w-s4-g-f32), "
                "uint4 ones with an integer zero point (w-u4-g-f32-zpi) or MXFP4 weights (w-e2m1-g-ue8m0), into "
                "bfloat16 or float16"
            )
        self._check_smem(key.tile, entry_bytes(s.w_dtype))
        if s.gemm_type.value in ("masked", "grouped") and key_masked_smem_bytes(key) > masked_smem_limit(key.tile):
            raise ValueError(f"{key.name}: the masked MoE schedule's ring, staging tile and walk table need "
                             f"{key_masked_smem_bytes(key)} bytes, more than the "
                             f"{masked_smem_limit(key.tile)} each of its {ctas_per_sm(key.tile)} CTA(s) per SM has on "
                             "sm_90; take fewer stages")
        need, held = _register_need(key.tile, s.w_dtype), consumer_registers(key.tile)
        if need > held:
            raise ValueError(f"{key.name}: a consumer thread needs {need} registers with {s.w_dtype} codes; it has "
                             f"{held}")

    def threads(self, tile: "TileConfig") -> int:
        return super().threads(tile) + 128  # + the producer warpgroup

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.units_per_warpgroup, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        return self._smem(tile, 4)

    def key_smem_bytes(self, key: "KernelKey") -> int:
        return self._smem(key.tile, entry_bytes(key.spec.w_dtype))

    @staticmethod
    def _smem(tile: "TileConfig", entry: int) -> int:
        pipeline = tile.stages * _stage_bytes(tile, entry)
        if separate_staging(tile, entry):
            return pipeline + _staging_bytes(tile) + 1024
        return max(pipeline, _staging_bytes(tile)) + 1024

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        return True


WGMMA_W4A8 = WgmmaW4A8Body()
