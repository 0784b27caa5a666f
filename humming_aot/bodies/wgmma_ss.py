"""The warp-specialized Hopper W8A8 body (kernel/dense_wgmma_ss.cuh, sm90a): both operands, e4m3
(or s8) activation and weight codes, in shared memory through TMA, wgmma reading each through a
descriptor; fp32 token and channel scales on the fp32 sums; its Params add the weights' tensor map
and the token scales to the TMA body's (ScaledTmaGemmParams)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig

# the wgmma N (tokens per CTA) mma/wgmma_e4m3.cuh has wrappers for (mma/wgmma_s8.cuh: these and 256)
TOKENS = (8, 16, 32, 64, 96, 128, 160, 192)
S8_TOKENS = TOKENS + (256,)
_PRODUCER_REGISTERS = 40
_HELD_LIMIT = 240  # the consumers' setmaxnreg (kConsumerRegistersHeld)
_SPARE_REGISTERS = 40  # the loop and the epilogue beside the accumulators and their scratch set
_PAIR_REGISTERS = 8  # block scales above 16 tokens: the staged token scales' pair-by-pair add
# the pairings the body computes: e4m3 codes both sides, fp32 scales per token x per channel, or
# per 1 x 128 token group x per 128 x 128 weight block (kBlockScales)
_CHANNEL = (("float8e4m3", "k", "float32"), ("float8e4m3", "g", "float32"))
_BLOCKS = (("float8e4m3", "g", "float32"), ("float8e4m3", "b", "float32"))
# s8 codes both sides (exact int32 sums, no promotion), per token x per channel
_INT8_CHANNEL = (("int8", "k", "float32"), ("int8", "g", "float32"))
OUT_DTYPES = ("bfloat16", "float16")


def consumer_registers(consumer_warpgroups: int) -> int:
    """Registers per consumer thread after setmaxnreg (kernel/dense_wgmma_ss.cuh)."""
    threads = 128 * consumer_warpgroups + 128
    ctas = 2 if consumer_warpgroups == 1 else 1
    launch = 65536 // ctas // threads // 8 * 8
    consumer = (launch * threads - _PRODUCER_REGISTERS * 128) // (128 * consumer_warpgroups) // 8 * 8
    return min(consumer, _HELD_LIMIT)


def block_scales(key: "KernelKey") -> bool:
    """Whether the key scales per 128 x 128 weight block and 1 x 128 token group."""
    return key.spec.w_scale.value == "b"


def stages_token_scales(key: "KernelKey") -> bool:
    """Whether the key's kernel stages its token scales in the ring (block scales, more than 16
    tokens per CTA), reading them transposed: (K / 128) rows of M rounded up to 4 (kernel/params.cuh)."""
    return block_scales(key) and key.tile.block_m > 16


def staged_scale_bytes(key: "KernelKey") -> int:
    """Bytes of token scales a ring slot holds besides the codes."""
    return 4 * key.tile.block_m if stages_token_scales(key) else 0


def _stage_bytes(tile: "TileConfig", staged_scale_bytes: int) -> int:
    return -(-((tile.block_n + tile.block_m) * 128 + staged_scale_bytes) // 1024) * 1024


def _staging_bytes(tile: "TileConfig") -> int:
    return tile.block_m * (tile.block_n + 8) * 2


def separate_staging(tile: "TileConfig", staged_scale_bytes: int = 0) -> bool:
    """Whether the output's staging tile lies after the ring (kSeparateStaging): two consumer
    warpgroups, and ring, staging tile and 1 KB of alignment within sm_90's 227 KB less 1 KB."""
    return (tile.warps_n == 8
            and tile.stages * _stage_bytes(tile, staged_scale_bytes) + _staging_bytes(tile) + 1024 <= _MAX_SMEM - 1024)


_MAX_SMEM = 232448  # dynamic shared memory per block on sm_90 (opt-in)


# The masked MoE schedule's table of the experts' first tiles after its staging tile
# (schedule/expert_table.cuh ExpertTable::kTableBytes).
MOE_WALK_TABLE_BYTES = (2 * 256 + 1 + 3) * 4
_SMEM_PER_SM = 233472  # shared memory per SM on sm_90 (each CTA also takes 1 KB of the driver's)


def masked_smem_bytes(tile: "TileConfig", staged_scale_bytes: int = 0, table: bool = True) -> int:
    """The grouped masked MoE schedule's shared memory on this body (kernel/grouped_masked_scaled_ws.cuh
    kSmemBytes): the ring (its slots with staged_scale_bytes of token scales: staged_scale_bytes(key)),
    a staging tile of its own after it, +1024 to align the base, the walk's table (table: the masked
    and offsets forms' ExpertTable; the row-expert form's walk has none)."""
    return (tile.stages * _stage_bytes(tile, staged_scale_bytes) + _staging_bytes(tile) + 1024
            + (MOE_WALK_TABLE_BYTES if table else 0))


def key_masked_smem_bytes(key: "KernelKey") -> int:
    """masked_smem_bytes of a key of the masked schedule (its masked and offsets forms, or a
    grouped key's row-expert form; block scales above 16 rows stage their token scales)."""
    return masked_smem_bytes(key.tile, staged_scale_bytes(key), table=key.spec.gemm_type.value == "masked")


def masked_smem_limit(tile: "TileConfig") -> int:
    """The dynamic shared memory each of the tile's CTAs per SM may take on sm_90 (two CTAs for one
    consumer warpgroup, kernel/dense_wgmma_ss.cuh kMinBlocksPerSm)."""
    return _MAX_SMEM - 1024 if tile.warps_n == 8 else _SMEM_PER_SM // 2 - 2048  # (1 KB static)


class WgmmaSsBody(Body):
    kind = "wgmma-ss"
    header = "dense_wgmma_ss.cuh"
    template = "DenseWgmmaSs"
    params_type = "ScaledTmaGemmParams"
    only_arch = "sm90a"
    fixed_block_k = True  # 128 of K a stage: one 128-byte row of codes, one promotion

    def check_tile(self, tile: "TileConfig") -> None:
        if tile.block_k != 128:
            raise ValueError(f"block_k={tile.block_k}: the wgmma-ss body stages 128 K (one 128-byte row of 8-bit codes)")
        if tile.block_m not in S8_TOKENS:
            raise ValueError(f"block_m={tile.block_m}: the wgmma-ss body takes {', '.join(map(str, S8_TOKENS))} "
                             "tokens per CTA (the wgmma wrappers' N; 256 for int8 only)")
        if tile.warps_m != 1 or tile.warps_k != 1 or tile.warps_n not in (4, 8):
            raise ValueError(
                f"warps {tile.warps_m}x{tile.warps_n}x{tile.warps_k}: the wgmma-ss body runs 1 x 4 or 1 x 8 consumer "
                "warps (one or two consumer warpgroups; the producer warpgroup is not counted)"
            )
        if tile.block_n not in (16 * tile.warps_n, 32 * tile.warps_n):
            raise ValueError(f"block_n={tile.block_n} must be 64 or 128 channels per consumer warpgroup "
                             f"({16 * tile.warps_n} or {32 * tile.warps_n})")
        if tile.stages < 2:
            raise ValueError(f"stages={tile.stages}: the wgmma-ss ring needs at least 2 slots")
        accumulators = tile.block_m // 2 * tile.units_per_warpgroup
        limit = consumer_registers(tile.warps_n // 4) - _SPARE_REGISTERS
        if accumulators > limit:
            raise ValueError(
                f"tile {tile.field}: {accumulators} accumulators per thread; with {tile.warps_n // 4} consumer "
                f"warpgroup(s) the wgmma-ss body holds at most {limit} (float8e4m3: half that, for the promotion)"
            )

    def check_key(self, key: "KernelKey") -> None:
        s = key.spec
        operands = ((s.a_dtype, s.a_scale.value, s.a_scale_dtype), (s.w_dtype, s.w_scale.value, s.w_scale_dtype))
        if operands not in (_CHANNEL, _BLOCKS, _INT8_CHANNEL) or s.w_zero_point.value != "none" \
                or s.out_dtype not in OUT_DTYPES:
            raise ValueError(
                f"{key.name}: the wgmma-ss body computes float8e4m3 activations x float8e4m3 weights with float32 "
                "scales per token and per channel (a-e4m3-k-f32, w-e4m3-g-f32) or per 1 x 128 token group and per "
                "128 x 128 weight block (a-e4m3-g-f32, w-e4m3-b-f32), or int8 x int8 per token and per channel "
                "(a-s8-k-f32, w-s8-g-f32), no zero point, into bfloat16 or float16"
            )
        accumulators = key.tile.block_m // 2 * key.tile.units_per_warpgroup
        limit = (consumer_registers(key.tile.warps_n // 4) - _SPARE_REGISTERS) // 2
        if operands != _INT8_CHANNEL and (key.tile.block_m not in TOKENS or accumulators > limit):
            raise ValueError(
                f"{key.name}: float8e4m3 tiles hold {accumulators} fp32 accumulators per thread and as many for the "
                f"promotion; with {key.tile.warps_n // 4} consumer warpgroup(s) at most {limit} of each (block_m x "
                f"channels per warpgroup <= {2 * limit} x 64 or {limit} x 128, block_m one of "
                f"{', '.join(map(str, TOKENS))})"
            )
        if s.gemm_type.value in ("masked", "grouped") and key_masked_smem_bytes(key) > masked_smem_limit(key.tile):
            raise ValueError(f"{key.name}: the masked MoE schedule's ring, staging tile and walk table need "
                             f"{key_masked_smem_bytes(key)} bytes, more than the {masked_smem_limit(key.tile)} "
                             "each of its CTAs per SM has on sm_90; take fewer stages")
        if operands == _BLOCKS and key.tile.block_n % 128:
            raise ValueError(f"{key.name}: block scales need whole 128-channel blocks per CTA (block_n 128 or 256)")
        if operands == _BLOCKS:
            # At 8 and 16 tokens a thread holds its token scales beside the accumulators; above, the
            # K loop reads them from the slot pair by pair as it adds (mainloop/fp8_promotion.cuh),
            # which takes a few registers of its own (a pair, its two products: _PAIR_REGISTERS). 160
            # tokens fit with no spill; 192 leave none and spill in the MoE schedule.
            accumulators = key.tile.block_m // 2 * key.tile.units_per_warpgroup
            held = _PAIR_REGISTERS if stages_token_scales(key) else key.tile.block_m // 4
            limit = consumer_registers(key.tile.warps_n // 4) - _SPARE_REGISTERS - held
            if 2 * accumulators > limit:
                raise ValueError(f"{key.name}: with block scales a consumer thread also holds its token scales ({held} "
                                 f"registers): {2 * accumulators} accumulators exceed the {limit} registers left")

    @staticmethod
    def block_scales(key: "KernelKey") -> bool:
        """Whether the key scales per 128 x 128 weight block and 1 x 128 token group."""
        return block_scales(key)

    def threads(self, tile: "TileConfig") -> int:
        return super().threads(tile) + 128  # + the producer warpgroup

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        return (tile.block_m, tile.block_n, tile.units_per_warpgroup, tile.stages)

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool, staged_scale_bytes: int = 0) -> int:
        pipeline = tile.stages * _stage_bytes(tile, staged_scale_bytes)
        if separate_staging(tile, staged_scale_bytes):
            return pipeline + _staging_bytes(tile) + 1024
        return max(pipeline, _staging_bytes(tile)) + 1024

    def key_smem_bytes(self, key: "KernelKey") -> int:
        return self.smem_bytes(key.tile, 8, False, staged_scale_bytes(key))

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        return True


WGMMA_SS = WgmmaSsBody()
