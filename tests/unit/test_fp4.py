"""Block-scaled FP4 W4A4 on the host (humming_aot.fp4, bodies/mma_fp4.py, kernel/dense_mma_fp4.cuh):
pack's layout (codes two a byte, scale bytes per K tile), the scale codes of every ue4m3 / ue8m0
value, the CPU path against the float64 product of the quantized operands, every error a caller
can make, the keys and the body's rules, the launcher's choice of target (sm120a / sm121a; a clear
refusal elsewhere), the custom op, the layer, and (with nvcc) that every catalog kernel compiles
for sm_120a / sm_121a without spilling and its SASS holds the block-scaled mma (OMMA.SF) and no
other. The GPU runs: tests/gpu/test_fp4_gpu.py (on an H200 through the emulated sm90a build)."""
from __future__ import annotations

import io
import pickle
import re
import shutil
import subprocess
import types

import pytest
import torch

from humming_aot import codegen, formats, fp4, ops, quant
from humming_aot import nn as hnn
from humming_aot.aot import ninja as driver
from humming_aot.bodies.mma_fp4 import native
from humming_aot.enumerate import enumerate_keys, parse_tile_field
from humming_aot.spec import KernelKey, parse_arch
from humming_aot.testing.nvcc import needs_nvcc

RECIPES = {"nvfp4": fp4.NVFP4_SCALES, "mxfp4": fp4.MXFP4_SCALES}


def _weight(n: int, k: int, recipe: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.rand(n, k // 16, generator=gen).add(0.05).repeat_interleave(16, 1)
    return quant.quantize(w, recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_pack_writes_codes_two_a_byte_and_scale_bytes_per_k_tile(recipe):
    qw = _weight(40, 320, recipe)  # N padded to 48; K = 320: two K tiles of 256 codes, the second partial
    packed = fp4.pack(qw)
    group, per_tile = fp4.group_size(packed.scale_dtype), fp4.tile_scale_bytes(packed.scale_dtype)
    assert (packed.n, packed.k, packed.n_valid, packed.scale_dtype) == (48, 320, 40, RECIPES[recipe])
    assert packed.w.shape == (48, 160) and packed.w.dtype == torch.uint8
    assert torch.equal(packed.w[:40] & 0xF, qw.codes[:, 0::2]) and torch.equal(packed.w[:40] >> 4, qw.codes[:, 1::2])
    assert not packed.w[40:].any()
    assert packed.w_scale.shape == (48, 2 * per_tile) and per_tile == 256 // group
    scales = packed.w_scale[:40, : 320 // group]
    assert torch.equal(fp4.scale_values(scales, packed.scale_dtype), qw.scales.double())
    assert not packed.w_scale[:40, 320 // group:].any() and not packed.w_scale[40:].any()
    assert packed.global_scale == (1.0 if qw.global_scale is None else float(qw.global_scale))
    assert fp4.unpack_codes(packed.w[:40]).equal(qw.codes)


def test_scale_codes_of_every_value():
    e4m3 = torch.arange(0x7F, dtype=torch.uint8)  # every positive finite ue4m3 byte (0 included)
    values = e4m3.view(torch.float8_e4m3fn).float()
    assert torch.equal(fp4.scale_codes(values, fp4.NVFP4_SCALES), e4m3)
    e8m0 = torch.arange(255, dtype=torch.uint8)  # 2^-127 .. 2^127
    values = torch.pow(2.0, e8m0.double() - 127).float()
    assert torch.equal(fp4.scale_codes(values, fp4.MXFP4_SCALES), e8m0)
    assert torch.equal(fp4.scale_values(e8m0, fp4.MXFP4_SCALES), values.double())


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_cpu_gemm_is_the_float64_product_of_the_quantized_operands(recipe, out_dtype):
    qw = _weight(40, 352, recipe, seed=1)
    packed = fp4.pack(qw)
    gen = torch.Generator().manual_seed(2)
    qa = ops.quantize_activation(torch.randn(2, 3, 352, generator=gen), recipe)
    decode = formats.get("float4e2m1").decode
    group = fp4.group_size(RECIPES[recipe])
    w = decode(qw.codes).double() * qw.scales.double().repeat_interleave(group, 1)
    a = decode(qa.codes).double().reshape(6, 352) * qa.scales.double().reshape(6, -1).repeat_interleave(group, 1)
    if qw.global_scale is not None:
        w, a = w * qw.global_scale.double(), a * qa.global_scale.double()
    bias = torch.randn(40, generator=gen).to(out_dtype)
    want = a @ w.T + bias.double()
    assert torch.equal(fp4.reference(qa, packed, bias), want)
    y = fp4.gemm(qa, packed, bias=bias, out_dtype=out_dtype)
    assert y.shape == (2, 3, 40) and y.dtype == out_dtype
    assert torch.equal(y.reshape(6, 40), want.to(out_dtype))


def test_pack_refuses_what_the_kernels_cannot_take():
    w = torch.randn(32, 256)
    for fmt in ("int4:channel", "float4e2m1:g32:s=float8e4m3", "mxfp8", "float4e2m1:g16:s=float8e8m0"):
        with pytest.raises(ValueError, match="NVFP4 .*or MXFP4"):
            fp4.pack(quant.quantize(w, fmt))
    with pytest.raises(ValueError, match="K=48: .*multiple of 32"):
        fp4.pack(quant.quantize(torch.randn(32, 48), "nvfp4"))
    with pytest.raises(ValueError, match="one \\(N, K\\) weight"):
        fp4.pack(quant.quantize(torch.randn(2, 32, 64), "mxfp4"))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        fp4.pack(w)


def test_gemm_refuses_activations_of_another_recipe_or_shape():
    packed = fp4.pack(_weight(32, 256, "nvfp4"))
    x = torch.randn(4, 256)
    for act in ("mxfp4", "float8e4m3:token", "int4:token"):
        with pytest.raises(ValueError, match="NVFP4 weight .*takes NVFP4 activations.*'nvfp4'"):
            fp4.gemm(ops.quantize_activation(x, act), packed)
    with pytest.raises(ValueError, match="K=128 but the weight has K=256"):
        fp4.gemm(ops.quantize_activation(torch.randn(4, 128), "nvfp4"), packed)
    with pytest.raises(TypeError, match="PackedFp4Weight"):
        fp4.gemm(ops.quantize_activation(x, "nvfp4"), packed.w)
    with pytest.raises(ValueError, match="leave them None on the CPU"):
        fp4.gemm(ops.quantize_activation(x, "nvfp4"), packed, tile="mma-fp4:16x128x128_w1x4_s4")
    with pytest.raises(ValueError, match="arch chooses"):
        fp4.gemm(ops.quantize_activation(x, "nvfp4"), packed, arch="sm120a")


def test_keys_name_the_recipe_and_the_body_refuses_what_it_cannot_run():
    tile = parse_tile_field("mma-fp4:16x128x128_w1x4_s4")
    key = fp4.kernel_key("sm120a", torch.bfloat16, tile, fp4.NVFP4_SCALES)
    assert key.name == "gemm_dense_sm120a_mma-fp4_a-e2m1-g-e4m3_w-e2m1-g-e4m3_o-bf16_16x128x128_w1x4_s4"
    assert KernelKey.from_name(key.name) == key
    assert fp4.kernel_key("sm121a", torch.float16, tile, fp4.MXFP4_SCALES).name == \
        "gemm_dense_sm121a_mma-fp4_a-e2m1-g-ue8m0_w-e2m1-g-ue8m0_o-f16_16x128x128_w1x4_s4"
    # shared memory: codes and each row's scale bytes of a K tile, per stage
    assert tile.body.key_smem_bytes(key) == 4 * (16 + 128) * (128 + 16)
    assert tile.body.key_smem_bytes(fp4.kernel_key("sm120a", torch.bfloat16, tile, fp4.MXFP4_SCALES)) == \
        4 * (16 + 128) * (128 + 8)
    with pytest.raises(ValueError, match="arch-specific target \\(sm120a\\)"):
        fp4.kernel_key("sm120", torch.bfloat16, tile)
    with pytest.raises(ValueError, match="sm80 or later"):
        fp4.kernel_key("sm75", torch.bfloat16, tile)
    mixed = key.name.replace("w-e2m1-g-e4m3", "w-e2m1-g-ue8m0")
    with pytest.raises(ValueError, match="one dtype on both sides"):
        KernelKey.from_name(mixed)
    with pytest.raises(ValueError, match="one dtype on both sides"):
        KernelKey.from_name(key.name.replace("a-e2m1-g-e4m3", "a-e4m3-k-f32"))
    for label, message in (("mma-fp4:16x128x64_w1x4_s4", "stages 128 code bytes"),
                           ("mma-fp4:16x96x128_w1x4_s4", "pairs of n8"),
                           ("mma-fp4:16x128x128_w1x4_s1", "at least 2"),
                           ("mma-fp4:256x256x128_w2x2_s2", "sums and accumulators per thread")):
        with pytest.raises(ValueError, match=message):
            parse_tile_field(label)
    assert native("sm120a") and native("sm121a") and native("sm120f") and not native("sm120") \
        and not native("sm90a")


def test_the_table_tiles_fit_sm120_for_either_recipe():
    labels = [fp4.select_tile(m).label for m in (1, 16, 17, 32, 33, 8192)]
    assert labels == ["mma-fp4:16x128x128_w1x4_s4"] * 2 + ["mma-fp4:32x128x128_w1x4_s4"] * 2 + \
        ["mma-fp4:64x128x128_w2x4_s3"] * 2
    for _, label in fp4._TILES:
        for scales in RECIPES.values():
            key = fp4.kernel_key("sm120a", torch.bfloat16, parse_tile_field(label), scales)
            assert key.tile.body.key_smem_bytes(key) <= 101376 - 1024


def test_default_catalogs_hold_the_table_for_sm120a_and_sm121a_only():
    for arch in ("sm120a", "sm121a"):
        keys = enumerate_keys("default", [arch])
        assert {k.tile.label for k in keys} == {label for _, label in fp4._TILES}
        assert {(k.spec.a_scale_dtype, k.spec.out_dtype) for k in keys} == {
            (s, o) for s in RECIPES.values() for o in ("bfloat16", "float16")}
        assert len(keys) == len(fp4._TILES) * 4
    for arch in ("sm89", "sm90a", "sm120"):
        assert not [k for k in enumerate_keys("default", [arch]) if k.tile.mma.value == "mma-fp4"]


def _info(arches, capability):
    return types.SimpleNamespace(arches=arches, capability=capability, name="a GPU")


def test_the_launcher_picks_the_block_scaled_target_or_says_which_gpus_have_it():
    packed = fp4.pack(_weight(32, 256, "mxfp4"))
    tile, key = fp4._kernel(_info(["sm120a", "sm120"], (12, 0)), torch.bfloat16, packed, None, 40, None)
    assert key.arch == "sm120a" and tile.label == "mma-fp4:64x128x128_w2x4_s3"
    assert fp4._kernel(_info(["sm121a", "sm121", "sm120"], (12, 1)), torch.bfloat16, packed, None, 1,
                       None)[1].arch == "sm121a"
    with pytest.raises(RuntimeError, match="sm_90.*16-bit activations .*float8e4m3:token"):
        fp4._kernel(_info(["sm90a", "sm90"], (9, 0)), torch.bfloat16, packed, None, 1, None)
    with pytest.raises(RuntimeError, match="NVFP4 W4A4 needs .*sm120a and sm121a.*sm_89: keep 16-bit activations"):
        fp4._kernel(_info(["sm89", "sm86", "sm80"], (8, 9)), torch.bfloat16, fp4.pack(_weight(32, 256, "nvfp4")),
                    None, 1, None)
    # the tests' emulated build: any arch the GPU serves
    assert fp4._kernel(_info(["sm90a", "sm90"], (9, 0)), torch.bfloat16, packed, None, 1, "sm90a")[1].arch == "sm90a"
    with pytest.raises(ValueError, match="arch 'sm120a': a GPU runs sm90a, sm90"):
        fp4._kernel(_info(["sm90a", "sm90"], (9, 0)), torch.bfloat16, packed, None, 1, "sm120a")
    with pytest.raises(ValueError, match="run mma-fp4 tiles"):
        fp4._kernel(_info(["sm120a", "sm120"], (12, 0)), torch.bfloat16, packed, "mma-ss:16x128x128_w1x4_s4", 1,
                    None)


def test_the_custom_op_and_its_fake():
    packed = fp4.pack(_weight(40, 256, "nvfp4"))
    qa = ops.quantize_activation(torch.randn(3, 256), "nvfp4")
    y = torch.ops.humming_aot.gemm_fp4(qa.codes, qa.scales, qa.global_scale, packed.w, packed.w_scale,
                                       packed.global_scale, None, packed.out_features, packed.k, packed.scale_dtype,
                                       torch.bfloat16)
    assert torch.equal(y, fp4.gemm(qa, packed))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = fp4.gemm(qa, packed, out_dtype=torch.float16)
    assert fake.shape == (3, 40) and fake.dtype == torch.float16
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ValueError, match="eager-only"):
        fp4.gemm(qa, packed, arch="sm120a")


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_layer_quantizes_its_inputs_with_the_weights_recipe(recipe):
    linear = torch.nn.Linear(256, 40)
    layer = hnn.QuantizedLinear.from_linear(linear, recipe, activations=recipe)
    assert isinstance(layer, hnn.W8A8Linear) and layer.activations == recipe
    x = torch.randn(5, 256)
    y = layer(x)
    packed = layer.packed
    assert isinstance(packed, fp4.PackedFp4Weight) and packed.scale_dtype == RECIPES[recipe]
    assert torch.equal(y, fp4.gemm(ops.quantize_activation(x, recipe), packed, bias=linear.bias.detach().bfloat16()))
    again = hnn.QuantizedLinear.from_linear(torch.nn.Linear(256, 40), recipe, activations=recipe)
    again.load_state_dict(layer.state_dict())
    assert torch.equal(again(x), y) and torch.equal(pickle.loads(pickle.dumps(layer))(x), y)
    other = "mxfp4" if recipe == "nvfp4" else "nvfp4"
    with pytest.raises(ValueError, match=f"activations {other} do not suit .* use {recipe}"):
        hnn.QuantizedLinear.from_linear(linear, recipe, activations=other)
    with pytest.raises(ValueError, match="on the fly"):
        hnn.W8A8Linear(packed, recipe, static_scale=1.0)


def test_generated_source_names_the_recipe():
    tile = parse_tile_field("mma-fp4:32x128x128_w1x4_s4")
    for scales, vec in ((fp4.NVFP4_SCALES, 4), (fp4.MXFP4_SCALES, 2)):
        source = codegen.kernel_source(fp4.kernel_key("sm120a", torch.float16, tile, scales))
        assert f"humming_aot::mma::Fp4BlockScaledSync<{vec}>" in source
        assert "DenseMmaFp4" in source and "ScaledTmaGemmParams" in source


# --- nvcc: every catalog kernel, and the SASS of the block-scaled mma ---------------------------------------

_OMMA = {fp4.NVFP4_SCALES: "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X", fp4.MXFP4_SCALES: "OMMA.SF.16864.F32.E2M1.E2M1.E8"}


@pytest.fixture(scope="module")
def _compiled(tmp_path_factory):
    keys = enumerate_keys("default", ["sm120a"])
    keys = [k for k in keys if k.spec.out_dtype == "bfloat16"] + [
        k for k in enumerate_keys("default", ["sm121a"]) if k.tile.block_m == 16 and k.spec.out_dtype == "float16"]
    out = tmp_path_factory.mktemp("fp4")
    return keys, driver.compile_keys(keys, out, jobs=2, stream=io.StringIO())


@pytest.mark.slow
@needs_nvcc
def test_every_catalog_kernel_builds_its_fatbin(_compiled):
    keys, result = _compiled
    assert len(keys) == 8
    for key in keys:
        (entry,) = driver.read_fatbin(result.fatbins[key.name].read_bytes())
        assert entry.kind == driver.KIND_ELF and entry.elf_sm == parse_arch(key.arch)[0]


@pytest.mark.slow
@needs_nvcc
@pytest.mark.skipif(shutil.which("cuobjdump") is None or shutil.which("nvdisasm") is None,
                    reason="cuobjdump and nvdisasm are not on PATH: the SASS of the fatbins cannot be read")
def test_the_sass_holds_the_block_scaled_mma_and_no_emulation(_compiled):
    keys, result = _compiled
    for key in keys:
        sass = subprocess.run(["cuobjdump", "-sass", "-fun", key.symbol, str(result.fatbins[key.name])], capture_output=True, text=True,
                              check=True).stdout
        tile = key.tile
        per_k_tile = (tile.block_m // tile.warps_m // 16) * (tile.block_n // tile.warps_n // 8) * 4
        found = re.findall(r"OMMA\.SF\.[\w.]+", sass)
        assert found and set(found) == {_OMMA[key.spec.a_scale_dtype]}, (key.name, set(found))
        assert len(found) % per_k_tile == 0, key.name  # whole K tiles of the unrolled loop
        assert "SHFL" not in sass and "HMMA" not in sass and "IMMA" not in sass, f"{key.name}: an emulated mma"
        assert "STL" not in sass, f"{key.name}: spills to local memory"
