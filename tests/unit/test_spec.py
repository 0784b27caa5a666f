"""KernelKey names: every catalog key round-trips; malformed names raise ValueError naming the field."""
from __future__ import annotations

import pytest

from humming_aot.enumerate import enumerate_keys, parse_tile_field
from humming_aot.spec import ActivationScale, GemmSpec, KernelKey, MmaKind, ScaleGranularity, TileConfig, ZeroPoint, parse_arch

DEFAULT_KEYS = enumerate_keys("default")
SMOKE_KEYS = enumerate_keys("smoke")
GOOD = "gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x64_w1x2_s8"


@pytest.mark.parametrize("arch", sorted({k.arch for k in DEFAULT_KEYS + SMOKE_KEYS}))
def test_name_round_trip(arch):
    """Every key of the default and smoke catalogs (thousands per arch: one test per arch)."""
    for key in (k for k in DEFAULT_KEYS + SMOKE_KEYS if k.arch == arch):
        parsed = KernelKey.from_name(key.name)
        assert parsed == key, key.name
        assert parsed.name == key.name
        assert str(parsed) == key.name


def test_round_trip_covers_every_field_value():
    names = {k.name for k in DEFAULT_KEYS}
    assert len(names) == len(DEFAULT_KEYS)
    assert {k.spec.w_zero_point for k in DEFAULT_KEYS} == set(ZeroPoint)
    assert {k.spec.w_is_float for k in DEFAULT_KEYS} == {False, True}
    assert {k.spec.a_dtype for k in DEFAULT_KEYS} == {"float16", "bfloat16", "float8e4m3", "int8", "int4",
                                                       "float4e2m1"}
    assert {k.spec.w_scale for k in DEFAULT_KEYS} == set(ScaleGranularity)
    assert {k.spec.a_scale for k in DEFAULT_KEYS} == {ActivationScale.NONE, ActivationScale.TOKEN,
                                                      ActivationScale.GROUP}
    assert len({k.tile for k in DEFAULT_KEYS}) > 1


def test_good_name_parses():
    key = KernelKey.from_name(GOOD)
    assert key.arch == "sm90a"
    assert key.spec == GemmSpec(a_dtype="bfloat16", w_dtype="int4", w_scale_dtype="bfloat16", out_dtype="bfloat16")
    assert key.tile == TileConfig(block_m=16, block_n=128, warps_m=1, warps_n=2, stages=8)
    assert key.tile.threads == 64


@pytest.mark.parametrize(
    "name",
    [
        "",
        "gemm",
        GOOD.replace("gemm_", "conv_", 1),
        GOOD + "_extra",
        GOOD.replace("_dense_", "_sparse_"),
        GOOD.replace("sm90a", "sm9x"),
        GOOD.replace("sm90a", "sm90z"),
        GOOD.replace("_mma_", "_wgmma_"),
        GOOD.replace("a-bf16", "a-bf17"),
        GOOD.replace("a-bf16", "act-bf16"),
        GOOD.replace("o-bf16", "out-bf16"),
        GOOD.replace("w-s4-g-bf16", "w-s4-g"),
        GOOD.replace("w-s4-g-bf16", "w-s4-x-bf16"),
        GOOD.replace("w-s4-g-bf16", "w-q4-g-bf16"),
        GOOD.replace("w-s4-g-bf16", "w-s4-g-bf16-none"),  # symmetric: no zero-point part
        GOOD.replace("w-s4-g-bf16", "w-s4-g-bf16-zpx"),  # no such zero point
        GOOD.replace("w-s4-g-bf16", "v-s4-g-bf16"),
        GOOD.replace("16x128x64", "16x128"),
        GOOD.replace("16x128x64", "016x128x64"),  # not canonical
        GOOD.replace("16x128x64", "16x192x64"),  # block_n != 64 * warps_n
        GOOD.replace("16x128x64", "16x128x32"),  # block_k must be 64
        GOOD.replace("16x128x64", "24x128x64"),  # block_m not a multiple of 16
        GOOD.replace("_w1x2_", "_1x2_"),
        GOOD.replace("_s8", "_s1"),  # fewer than 2 stages
        GOOD.replace("_s8", "_8"),
    ],
)
def test_bad_names_raise(name):
    with pytest.raises(ValueError):
        KernelKey.from_name(name)


def test_a_tagged_field_of_a_later_grammar_is_refused_by_name():
    """Kernel-name grammar version 1 has ten fields; a later version's tagged field (between the
    output field and the tile) is refused with the field and the version this package reads, and
    every version-1 name still parses to itself."""
    from humming_aot.spec import KEY_GRAMMAR_VERSION

    assert KEY_GRAMMAR_VERSION == 1
    later = GOOD.replace("_o-bf16_", "_o-bf16_sched-streamk_")
    with pytest.raises(ValueError, match="field 'sched-streamk' is not part of kernel-name grammar version 1"):
        KernelKey.from_name(later)
    with pytest.raises(ValueError, match="expected 10 '_'-separated fields starting with 'gemm'"):
        KernelKey.from_name("_".join(GOOD.split("_")[:9]))
    assert KernelKey.from_name(GOOD).name == GOOD


def test_bad_name_message_names_the_field():
    with pytest.raises(ValueError, match="weight dtype 'q4'"):
        KernelKey.from_name(GOOD.replace("w-s4", "w-q4"))
    with pytest.raises(ValueError, match="canonical"):
        KernelKey.from_name(GOOD.replace("16x128x64", "016x128x64"))


@pytest.mark.parametrize("arch,expected", [("sm80", (80, "")), ("sm90a", (90, "a")), ("sm100f", (100, "f"))])
def test_parse_arch(arch, expected):
    assert parse_arch(arch) == expected


@pytest.mark.parametrize("arch", ["", "90a", "sm_90a", "sm9", "SM90", "sm90b", "sm1000"])
def test_parse_arch_rejects(arch):
    with pytest.raises(ValueError, match="not a CUDA target name"):
        parse_arch(arch)


def test_unknown_dtype_in_spec():
    with pytest.raises(ValueError, match="a_dtype"):
        GemmSpec(a_dtype="float13", w_dtype="int4", w_scale_dtype="bfloat16", out_dtype="bfloat16")


def test_keys_sort_by_name():
    assert sorted(reversed(DEFAULT_KEYS)) == DEFAULT_KEYS


def test_warps_along_k_round_trip_and_default():
    name = "gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x64_w1x2x4_s4"
    key = KernelKey.from_name(name)
    assert key.tile.warps_k == 4 and key.tile.threads == 256 and key.name == name
    assert KernelKey.from_name(GOOD).tile.warps_k == 1  # omitted when 1
    with pytest.raises(ValueError, match="canonical"):
        KernelKey.from_name(GOOD.replace("_w1x2_", "_w1x2x1_"))


WGMMA = "gemm_dense_sm90a_wgmma_a-bf16_w-s4-g-bf16_o-bf16_256x128x64_w1x8_s5"


def test_wgmma_name_round_trips():
    key = KernelKey.from_name(WGMMA)
    assert key.tile.mma is MmaKind.WGMMA and key.tile.threads == 256 and key.name == WGMMA
    assert key.tile.label == "wgmma:256x128x64_w1x8_s5"


@pytest.mark.parametrize(
    "name,match",
    [
        (WGMMA.replace("sm90a", "sm80"), "wgmma kernels exist only for sm90a"),
        (WGMMA.replace("256x128x64", "96x128x64"), "64, 128 or 256 tokens"),
        (WGMMA.replace("256x128x64", "256x192x64"), "64 per warpgroup"),
        (WGMMA.replace("_w1x8_", "_w2x8_"), "one to four warpgroups"),
        (WGMMA.replace("_w1x8_", "_w1x6_"), "one to four warpgroups"),
        (WGMMA.replace("_s5", "_s2"), "at least 3 stages"),
    ],
)
def test_bad_wgmma_tiles_raise(name, match):
    with pytest.raises(ValueError, match=match):
        KernelKey.from_name(name)


def test_swapped_operand_tile_takes_block_m_8_with_one_warp_along_m():
    name = "gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x128_w1x2x4_s3"
    key = KernelKey.from_name(name)
    assert (key.tile.block_m, key.tile.block_k, key.tile.warps_k, key.tile.threads) == (8, 128, 4, 256)
    with pytest.raises(ValueError, match="swapped-operand tile"):
        KernelKey.from_name(name.replace("_w1x2x4_", "_w2x1x4_").replace("8x128x128", "8x64x128"))


@pytest.mark.parametrize(
    "name,expected",
    [
        ("gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2", True),
        ("gemm_dense_sm90a_mma_a-f16_w-u8-g-f16-zpi_o-f16_8x128x64_w1x2x4_s3", True),
        ("gemm_dense_sm80_mma_a-bf16_w-s1-g-bf16_o-bf16_8x128x128_w1x2x4_s3", True),
        ("gemm_dense_sm90a_mma_a-bf16_w-u4-g-bf16-zpf_o-bf16_8x128x256_w1x2x4_s2", False),  # q - z rounds
        ("gemm_dense_sm90a_mma_a-bf16_w-e2m1-g-bf16_o-bf16_8x128x256_w1x2x4_s2", False),  # placing multiply
        ("gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x256_w1x2x4_s2", False),  # no registers
        (WGMMA, False),
    ],
)
def test_scales_in_fp32_only_for_the_swapped_tile_with_integer_codes(name, expected):
    assert KernelKey.from_name(name).scales_in_fp32 is expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2", True),
        ("gemm_dense_sm90_mma_a-f16_w-e2m1-g-f16_o-f16_8x128x64_w1x2_s3", True),
        ("gemm_dense_sm120_mma_a-bf16_w-u4-g-bf16-zpf_o-bf16_8x128x256_w1x2x4_s2", True),
        ("gemm_dense_sm89_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2", False),  # no clusters before sm_90
        ("gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_16x128x256_w1x2x4_s2", False),  # the 16-row tile
        (WGMMA, False),
    ],
)
def test_only_the_8_row_tile_on_sm90_and_later_reduces_in_a_cluster(name, expected):
    assert KernelKey.from_name(name).reduces_splits_in_cluster is expected


def test_default_catalog_holds_kernels_of_both_scale_models():
    """The sm90a table serves M <= 16 (the swapped 8- and 16-token tiles) and M <= 32 on layers of
    few output tiles (the swapped 32-token tile) with fp32-scaled integer kernels and everything
    else rounded."""
    sm90a = [key for key in DEFAULT_KEYS if key.arch == "sm90a" and not key.spec.a_is_quantized]
    # (W8A8 keys scale fp32 sums at every M: their codes carry no scale to round with)
    assert all(key.scales_in_fp32 for key in DEFAULT_KEYS if key.spec.a_is_quantized)
    scaled = [key for key in sm90a if key.scales_in_fp32]
    assert scaled and all(key.tile.block_m <= 32 and key.tile.body.kind in ("mma", "mma-sw") for key in scaled)
    assert {key.tile.block_m for key in scaled} == {8, 16, 32}
    assert {key.spec.w_dtype for key in scaled} >= {f"int{bits}" for bits in range(1, 9)}
    assert any(key.tile.block_m == 8 and not key.scales_in_fp32 for key in sm90a)  # float codes


def test_wgmma_ws_tiles_count_the_producer_warpgroup_and_round_trip():
    name = "gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4"
    key = KernelKey.from_name(name)
    assert key.name == name and key.symbol == name.replace("-", "_")
    assert key.tile.mma is MmaKind.WGMMA_WS and key.tile.mma.is_wgmma
    assert key.tile.threads == 128 + 128 and key.tile.units_per_warpgroup == 2
    wide = KernelKey.from_name("gemm_dense_sm90a_wgmma-ws_a-f16_w-u4-g-f16-zpi_o-f16_256x128x64_w1x8_s5")
    assert wide.tile.threads == 256 + 128 and wide.tile.units_per_warpgroup == 1
    # four units per warpgroup: 256 channels of few tokens (decode, bytes in flight per CTA)
    four = KernelKey.from_name("gemm_masked_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_16x256x64_w1x4_s6")
    assert four.tile.threads == 128 + 128 and four.tile.units_per_warpgroup == 4
    assert not key.scales_in_fp32 and not key.reduces_splits_in_cluster


@pytest.mark.parametrize("tile,message", [
    (dict(block_m=100, block_n=128, warps_n=4), "a multiple of 8 tokens per CTA up to 120, or of 16 up to 256"),
    (dict(block_m=272, block_n=128, warps_n=8), "a multiple of 8 tokens per CTA up to 120, or of 16 up to 256"),
    (dict(block_m=136, block_n=128, warps_n=8), "a multiple of 8 tokens per CTA up to 120, or of 16 up to 256"),
    (dict(block_m=12, block_n=128, warps_n=4), "a multiple of 8 tokens per CTA up to 120, or of 16 up to 256"),
    (dict(block_m=128, block_n=128, warps_n=12), "one or two consumer warpgroups"),
    (dict(block_m=128, block_n=192, warps_n=4), "64, 128 or 256 channels per consumer warpgroup"),
    (dict(block_m=16, block_n=1024, warps_n=8), "64, 128 or 256 channels per consumer warpgroup"),
    (dict(block_m=80, block_n=256, warps_n=4), "at most 128"),
    (dict(block_m=80, block_n=512, warps_n=8), "at most 152"),
    (dict(block_m=192, block_n=256, warps_n=8), "at most 176"),
    (dict(block_m=160, block_n=128, warps_n=4), "at most 152"),
])
def test_wgmma_ws_tile_rules(tile, message):
    with pytest.raises(ValueError, match=message):
        TileConfig(mma=MmaKind.WGMMA_WS, warps_m=1, stages=4, **tile)


def test_wgmma_ws_kernels_exist_only_for_sm90a():
    with pytest.raises(ValueError, match="only for sm90a"):
        KernelKey.from_name("gemm_dense_sm100a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4")


def test_simt_reference_tiles_round_trip_and_keep_to_one_warp():
    """The test-only reference body (kernel/dense_simt.cuh): any arch, one warp, 64 channels, K
    16 rows at a time, no shared memory, no split-K."""
    from humming_aot import codegen

    for name in ("gemm_dense_sm80_simt_a-bf16_w-u4-g-bf16-zpi_o-bf16_8x64x16_w1x1_s1",
                 "gemm_dense_sm75_simt_a-f16_w-e2m1-g-f16_o-f16_3x64x16_w1x1_s1",
                 "gemm_dense_sm120_simt_a-bf16_w-u8-g-bf16-zpf_o-bf16_16x64x16_w1x1_s1"):
        key = KernelKey.from_name(name)
        assert key.name == name and key.tile.mma is MmaKind.SIMT and key.tile.threads == 32
        assert codegen.kernel_smem_bytes(key) == 0 and not key.tile.body.splits_k
        assert not key.scales_in_fp32 and not key.reduces_splits_in_cluster
        source = codegen.kernel_source(key)
        assert "kernel/dense_simt.cuh" in source and f"\n    {key.tile.block_m}>;" in source
    assert parse_tile_field("simt:8x64x16_w1x1_s1").field == "8x64x16_w1x1_s1"
    with pytest.raises(ValueError, match="1 to 16 tokens per warp"):
        TileConfig(mma=MmaKind.SIMT, block_m=32, block_n=64, block_k=16, warps_m=1, warps_n=1, stages=1)
    with pytest.raises(ValueError, match="<M>x64x16_w1x1_s1"):
        TileConfig(mma=MmaKind.SIMT, block_m=8, block_n=128, block_k=16, warps_m=1, warps_n=2, stages=1)
    with pytest.raises(ValueError, match="the mma.sync body takes 64, 128, 256 or 512 K per stage"):
        TileConfig(block_m=16, block_n=128, block_k=16, warps_m=1, warps_n=2, stages=3)


def test_swapped_16_token_tiles_round_trip_and_take_the_swapped_pipeline():
    """The mma-sw body (humming_aot/bodies/mma_swapped.py): the mma.sync kernel template with
    kSwapped = 1 at 16 tokens, one warp along M; its numerics flags and shared memory are the
    swapped tile's (two groups of 8 tokens), its twin keeps 2 K warps like the 8-token tile's."""
    from humming_aot import codegen, heuristics

    name = "gemm_dense_sm90a_mma-sw_a-bf16_w-s4-g-bf16_o-bf16_16x128x256_w1x2x4_s2"
    key = KernelKey.from_name(name)
    assert key.name == name and key.tile.mma is MmaKind.MMA_SWAPPED and key.tile.threads == 256
    assert key.scales_in_fp32 and key.reduces_splits_in_cluster  # as the 8-token tile's, on sm_90+
    source = codegen.kernel_source(key)
    assert "kernel/dense_mma_sync.cuh" in source and "16, 128, 256, 1, 2, 4, 2, 1>;" in source  # kSwapped = 1
    eight = parse_tile_field("8x128x256_w1x2x4_s2")
    sixteen = key.tile
    # the same pipeline stages as 8 tokens plus 8 more activation rows per warp region, and twice
    # the parked accumulators and exchanged fragments
    assert codegen.kernel_smem_bytes(key) > heuristics.smem_bytes(eight, 4, False)
    assert heuristics.narrow_twin(sixteen).label == "mma-sw:16x128x64_w1x2x2_s4"
    float_key = KernelKey.from_name("gemm_dense_sm90a_mma-sw_a-bf16_w-e2m1-g-bf16_o-bf16_16x128x256_w1x2x4_s2")
    assert not float_key.scales_in_fp32
    assert not KernelKey.from_name(name.replace("sm90a", "sm80")).reduces_splits_in_cluster
    thirty_two = parse_tile_field("mma-sw:32x64x256_w1x1x4_s2")
    assert thirty_two.block_m == 32 and heuristics.narrow_twin(thirty_two).label == "mma-sw:32x64x64_w1x1x2_s4"
    for bad in ("mma-sw:8x128x256_w1x2x4_s2", "mma-sw:64x128x256_w1x2x4_s2", "mma-sw:16x128x256_w2x2x4_s2"):
        with pytest.raises(ValueError, match="the mma-sw body holds 16 or 32 tokens in one warp along M"):
            parse_tile_field(bad)


def test_mma_sync_keys_whose_loader_would_need_over_32_copy_passes_are_refused():
    """The stage loader keeps a validity bit per copy pass in 32 bits: a swapped tile's warp staging
    512 of K of 8-bit codes (64 passes) is refused when the key is made, not by a static_assert in
    nvcc or NVRTC; 4-bit codes (32 passes) and more K warps are fine."""
    with pytest.raises(ValueError, match=r"8x128x512_w1x2_s2 with 8-bit codes: each of its 32 copy issuers would "
                                         r"make 64 passes per stage \(weights 64, activations 16\), over the "
                                         r"loader's 32; stage less K per warp"):
        KernelKey.from_name("gemm_dense_sm90a_mma_a-bf16_w-s8-g-bf16_o-bf16_8x128x512_w1x2_s2")
    with pytest.raises(ValueError, match="stage less K per CTA"):
        KernelKey.from_name("gemm_dense_sm80_mma_a-bf16_w-s8-g-bf16_o-bf16_16x128x512_w1x2_s2")
    for name in ("gemm_dense_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x512_w1x2_s2",
                 "gemm_dense_sm90a_mma_a-bf16_w-s8-g-bf16_o-bf16_8x128x512_w1x2x2_s2",
                 "gemm_dense_sm90a_mma-sw_a-bf16_w-s4-g-bf16_o-bf16_16x128x512_w1x2_s2"):
        assert KernelKey.from_name(name).name == name


def test_grouped_masked_keys_wrap_the_mma_sync_bodies():
    """A grouped masked GEMM (kernel/grouped_masked.cuh) is a schedule around a dense body that
    takes GemmParams: its source wraps the body's template and takes MaskedGemmParams (184 bytes:
    GemmParams, the counts pointer, ExpertWeights, the slabs' two strides, the experts and the
    offsets pointer); the masked
    schedule on the TMA body takes MaskedTmaGemmParams; the aligned grouped schedule on the TMA
    body and the indexed type have no kernel, and say so."""
    from humming_aot import codegen, params_abi
    from humming_aot.spec import GemmType

    for name in ("gemm_masked_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2",
                 "gemm_masked_sm90a_mma-sw_a-bf16_w-u4-g-bf16-zpi_o-bf16_16x128x256_w1x2x4_s2",
                 "gemm_masked_sm80_mma_a-f16_w-e2m1-g-f16_o-f16_16x128x64_w1x2x2_s3"):
        key = KernelKey.from_name(name)
        assert key.name == name and key.spec.gemm_type is GemmType.MASKED
        source = codegen.kernel_source(key)
        assert "#include <humming_aot/kernel/grouped_masked.cuh>" in source
        assert "humming_aot::kernel::GroupedMasked<humming_aot::kernel::DenseMmaSync<" in source
        assert f", {key.tile.block_m}, {key.tile.block_n}>;" in source
        assert "const __grid_constant__ humming_aot::kernel::MaskedGemmParams params" in source
        assert "sizeof(humming_aot::kernel::MaskedGemmParams)" in source
        assert codegen.params_type(key) == "MaskedGemmParams"
    assert params_abi.MASKED_PARAMS_BYTES == 184
    # on the warp-specialized TMA body, the masked schedule drives its producer and consumers
    # (kernel/grouped_masked_ws.cuh), with the activations' tensor map after MaskedGemmParams
    ws = KernelKey.from_name("gemm_masked_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4")
    source = codegen.kernel_source(ws)
    assert "#include <humming_aot/kernel/grouped_masked_ws.cuh>" in source
    assert "humming_aot::kernel::GroupedMaskedWs<humming_aot::kernel::DenseWgmmaWs<" in source
    assert "const __grid_constant__ humming_aot::kernel::MaskedTmaGemmParams params" in source
    assert codegen.params_type(ws) == "MaskedTmaGemmParams"
    from humming_aot.moe import kernels as moe_kernels

    assert moe_kernels.MASKED_TMA_MAP_OFFSET >= params_abi.MASKED_PARAMS_BYTES
    assert moe_kernels.MASKED_TMA_PARAMS_BYTES == moe_kernels.MASKED_TMA_MAP_OFFSET + 128
    with pytest.raises(ValueError, match="takes the bodies mma, mma-sw for bfloat16 activations, not wgmma-ws"):
        codegen.kernel_source(KernelKey.from_name(
            "gemm_grouped_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4"))
    # the grouped contiguous schedule (kernel/grouped_contiguous.cuh) the same way, with its own Params
    grouped = KernelKey.from_name("gemm_grouped_sm90a_mma_a-bf16_w-u4-g-bf16-zpi_o-bf16_8x128x256_w1x2x4_s2")
    source = codegen.kernel_source(grouped)
    assert "#include <humming_aot/kernel/grouped_contiguous.cuh>" in source
    assert "humming_aot::kernel::GroupedContiguous<humming_aot::kernel::DenseMmaSync<" in source
    assert "const __grid_constant__ humming_aot::kernel::GroupedGemmParams params" in source
    assert codegen.params_type(grouped) == "GroupedGemmParams" and params_abi.GROUPED_PARAMS_BYTES == 160
    with pytest.raises(ValueError, match="a indexed GEMM yet"):
        codegen.kernel_source(KernelKey.from_name("gemm_indexed_sm90a_mma_a-bf16_w-s4-g-bf16_o-bf16_8x128x256_w1x2x4_s2"))


def test_every_tile_kind_has_one_body_that_owns_its_rules():
    from humming_aot.bodies import BODIES, body_of

    assert sorted(BODIES) == sorted(kind.value for kind in MmaKind)
    for kind in MmaKind:
        body = body_of(kind)
        assert body.kind == kind.value and body is body_of(kind.value)
        assert body.header.endswith(".cuh") and body.template and body.params_type.endswith("Params")
    ws = parse_tile_field("wgmma-ws:128x128x64_w1x4_s4")
    assert ws.body is body_of(MmaKind.WGMMA_WS) and ws.threads == 256  # 128 consumers + the producer warpgroup
    with pytest.raises(ValueError, match="no kernel body for tile kind 'tcgen05'"):
        body_of("tcgen05")


def test_quantized_activation_names_round_trip_and_16_bit_names_are_unchanged():
    from humming_aot.spec import ActivationScale

    tile = parse_tile_field("wgmma-ws:128x128x64_w1x4_s4")
    fp8 = GemmSpec(a_dtype="float8e4m3", a_scale=ActivationScale.TOKEN, a_scale_dtype="float32",
                   w_dtype="float8e4m3", w_scale_dtype="float32", out_dtype="bfloat16")
    key = KernelKey(arch="sm90a", spec=fp8, tile=tile)
    assert key.name == "gemm_dense_sm90a_wgmma-ws_a-e4m3-k-f32_w-e4m3-g-f32_o-bf16_128x128x64_w1x4_s4"
    assert KernelKey.from_name(key.name) == key and fp8.a_is_quantized
    nvfp4 = GemmSpec(a_dtype="float4e2m1", a_scale=ActivationScale.GROUP, a_scale_dtype="float8e4m3",
                     w_dtype="float4e2m1", w_scale_dtype="float8e4m3", out_dtype="bfloat16")
    assert KernelKey.from_name(KernelKey(arch="sm120", spec=nvfp4, tile=parse_tile_field("16x128x64_w1x2_s4")).name).spec == nvfp4
    bf16 = "gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4"
    assert KernelKey.from_name(bf16).name == bf16 and not KernelKey.from_name(bf16).spec.a_is_quantized


@pytest.mark.parametrize("fields,message", [
    (dict(a_dtype="float8e4m3"), "quantized float8e4m3 activations need a_scale"),
    (dict(a_dtype="bfloat16", a_scale="k", a_scale_dtype="float32"), "bfloat16 activations take no activation scale"),
    (dict(a_dtype="int8", a_scale="k", a_scale_dtype="fp32"), "a known a_scale_dtype"),
])
def test_activation_scale_fields_must_agree_with_the_activation_dtype(fields, message):
    from humming_aot.spec import ActivationScale

    if "a_scale" in fields:
        fields = {**fields, "a_scale": ActivationScale(fields["a_scale"])}
    with pytest.raises(ValueError, match=message):
        GemmSpec(w_dtype="int4", w_scale_dtype="bfloat16", out_dtype="bfloat16", **fields)


def test_codegen_refuses_what_no_body_serves_yet():
    from humming_aot.codegen import kernel_source

    name = "gemm_dense_sm90a_wgmma-ws_a-e4m3-k-f32_w-e4m3-g-f32_o-bf16_128x128x64_w1x4_s4"
    with pytest.raises(ValueError, match="no kernel body takes float8e4m3 activations"):
        kernel_source(KernelKey.from_name(name))
    with pytest.raises(ValueError, match=r"the grouped GEMM \(kernel/grouped_contiguous.cuh\) takes the bodies "
                                         r"mma, mma-sw for bfloat16 activations, not wgmma-ws"):
        kernel_source(KernelKey.from_name("gemm_grouped_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4"))
