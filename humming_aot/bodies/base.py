"""The interface every kernel body's module implements (humming_aot/bodies/__init__.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from humming_aot.spec import KernelKey, TileConfig


class Body:
    """One kernel body. Subclasses set the class attributes and implement the methods that say
    what differs; the defaults are those of a body with one Params struct (GemmParams), no
    producer warps and no special numerics."""

    kind: str = ""  # MmaKind value, the tile-kind field of kernel names ("mma", "wgmma", ...)
    header: str = ""  # under csrc/include/humming_aot/kernel/
    template: str = ""  # the C++ body template in namespace humming_aot::kernel
    params_type: str = "GemmParams"  # the C++ Params struct of kernel/params.cuh it takes
    only_arch: str | None = None  # the one arch it compiles for (wgmma: "sm90a"), or None for any
    splits_k: bool = True  # whether its CTAs may take K slices of a tile (split-K); False: splits = 1
    fixed_block_k: bool = False  # its K per stage is one value (no 64-wide twin: heuristics.narrow_twin)

    def check_tile(self, tile: "TileConfig") -> None:
        """Raise ValueError saying what is wrong with a tile this body cannot run."""
        raise NotImplementedError

    def check_key(self, key: "KernelKey") -> None:
        """Raise ValueError saying what is wrong with a tile for this key's operands (the rules
        that depend on the code width or dtypes as well as the tile); nothing by default."""

    def threads(self, tile: "TileConfig") -> int:
        """Threads per CTA."""
        return 32 * tile.warps_m * tile.warps_n * tile.warps_k

    def template_args(self, tile: "TileConfig") -> tuple[int, ...]:
        """The body template's tile arguments, after the dtype, code and zero-point arguments."""
        raise NotImplementedError

    def smem_bytes(self, tile: "TileConfig", w_bits: int, has_zero_point: bool) -> int:
        """Dynamic shared memory of one CTA: must equal the C++ Kernel::kSmemBytes (the generated
        source static_asserts it)."""
        raise NotImplementedError

    def key_smem_bytes(self, key: "KernelKey") -> int:
        """Dynamic shared memory of a key's kernel: smem_bytes of its tile, code bits and zero
        point, unless the body stages something its operands decide (wgmma-ss: block scales)."""
        return self.smem_bytes(key.tile, key.spec.w_bits, key.spec.w_zero_point.value != "none")

    def scales_in_fp32(self, key: "KernelKey") -> bool:
        """Whether the kernel applies weight scales to fp32 partial sums (KernelKey.scales_in_fp32)."""
        return False

    def reduces_splits_in_cluster(self, key: "KernelKey") -> bool:
        """Whether split-K slices launched as one cluster sum in distributed shared memory."""
        return False

    def pipeline_per_warp(self, tile: "TileConfig") -> bool:
        """Whether each warp runs its own cp.async pipeline over its run of a stage's K
        (heuristics.narrow_twin keeps such a run at least 32 wide)."""
        return False


def check_block_k(tile: "TileConfig", allowed: tuple[int, ...]) -> None:
    """The K per pipeline stage of the tensor-core bodies (the message names every body's rule)."""
    if tile.block_k not in allowed:
        raise ValueError(
            f"block_k={tile.block_k}: the mma.sync body takes 64, 128, 256 or 512 K per stage, the wgmma body 64 "
            "(and wgmma-ws)"
        )


def stage_bytes(tile: "TileConfig", w_bits: int, has_zero_point: bool, run_k: int, columns: int) -> int:
    """Shared memory of one pipeline stage of one copy: activation rows (64-wide sub-tiles of
    128-byte rows, at least one), packed weights, and up to run_k / 16 scale (and zero-point) rows
    for the smallest group size (16)."""
    a_bytes = max(1, run_k // 64) * tile.block_m * 128
    w_bytes = columns * run_k * w_bits // 8
    scale_bytes = run_k // 16 * columns * 2
    zp_bytes = scale_bytes if has_zero_point else 0
    return a_bytes + w_bytes + scale_bytes + zp_bytes
