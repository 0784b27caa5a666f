"""One small CUDA translation unit per KernelKey.

The same text is compiled by nvcc at build time and by NVRTC at run time (the JIT fallback), so it
includes only humming_aot's own headers, which include no CUDA toolkit header.
"""
from __future__ import annotations

from humming_aot.bodies.wgmma_ws import dense_producer_registers, masked_ctas_per_sm, masked_producer_registers, masked_smem_bytes
from humming_aot.heuristics.tiles import moe_bodies
from humming_aot.params_abi import PARAMS_VERSION
from humming_aot.spec import GemmType, KernelKey, MmaKind, ZeroPoint

_ACT_TYPES = {"float16": "humming_aot::numerics::Float16", "bfloat16": "humming_aot::numerics::BFloat16"}
# the wgmma-ss body's operand traits per 8-bit code dtype (both operands alike)
_CODE_TYPES = {"float8e4m3": "humming_aot::mma::E4m3Codes", "int8": "humming_aot::mma::S8Codes"}
# the mma-ss body's (mma/mma_sync_8bit.cuh)
_SYNC_CODE_TYPES = {"float8e4m3": "humming_aot::mma::E4m3SyncCodes", "int8": "humming_aot::mma::S8SyncCodes",
                    "int4": "humming_aot::mma::S4SyncCodes"}
# the W4A8 bodies' conversions of the weight codes, by weight dtype and activation dtype
# (numerics/int4_e4m3.cuh, int4_s8.cuh, e2m1_e4m3.cuh, uint4_zero_point.cuh)
_W4A8_WIDEN = {
    ("int4", "float8e4m3"): "humming_aot::numerics::Int4ToE4m3",
    ("int4", "int8"): "humming_aot::numerics::Int4ToS8",
    ("float4e2m1", "float8e4m3"): "humming_aot::numerics::E2m1ToE4m3",
    ("uint4", "float8e4m3"): "humming_aot::numerics::Uint4ZeroPointToE4m3",
    ("uint4", "int8"): "humming_aot::numerics::Uint4ZeroPointToS8",
}
_ZERO_POINT = {
    ZeroPoint.NONE: "humming_aot::numerics::ZeroPointKind::kImplicit",
    ZeroPoint.INTEGER: "humming_aot::numerics::ZeroPointKind::kInteger",
    ZeroPoint.FLOAT: "humming_aot::numerics::ZeroPointKind::kFloat",
}


def kernel_smem_bytes(key: KernelKey) -> int:
    """Dynamic shared memory of a key's kernel: its body's, or its MoE schedule's where that lays
    out its own (the masked schedule on the TMA body stages its output beside the ring and keeps
    its walk's table after it)."""
    has_zero_point = key.spec.w_zero_point is not ZeroPoint.NONE
    schedule = _moe_schedule(key) if key.spec.gemm_type in _MOE_SCHEDULES else None
    if schedule == _MOE_WS_SCHEDULE:
        return masked_smem_bytes(key.tile, key.spec.w_bits, has_zero_point)
    if schedule == _MOE_SCALED_WS_SCHEDULE:
        from humming_aot.bodies import wgmma_ss, wgmma_w4a8

        if key.tile.mma is MmaKind.WGMMA_W4A8:
            return wgmma_w4a8.key_masked_smem_bytes(key)
        return wgmma_ss.key_masked_smem_bytes(key)
    return key.tile.body.key_smem_bytes(key)


# The MoE GEMM types that are a schedule around a dense body taking GemmParams:
# gemm type -> (its kernel file, its schedule template, its Params struct)
_MOE_SCHEDULES = {
    GemmType.MASKED: ("grouped_masked.cuh", "GroupedMasked", "MaskedGemmParams"),
    GemmType.GROUPED: ("grouped_contiguous.cuh", "GroupedContiguous", "GroupedGemmParams"),
}


# The grouped masked GEMM on the warp-specialized TMA body: a schedule of its producer and
# consumers (no run_tile), whose Params add the tensor map of every activation row.
_MOE_WS_SCHEDULE = ("grouped_masked_ws.cuh", "GroupedMaskedWs", "MaskedTmaGemmParams")


# The grouped masked and contiguous GEMMs on the 8-bit-activation mma.sync bodies (W4A8, W8A8): the
# same schedules, whose Params add the rows' fp32 scales, the codes' K and the scales' row stride.
_MOE_SCALED_SCHEDULE = ("grouped_masked.cuh", "GroupedMasked", "MaskedScaledGemmParams")
_GROUPED_SCALED_SCHEDULE = ("grouped_contiguous.cuh", "GroupedContiguous", "GroupedScaledGemmParams")
# The grouped masked GEMM on the warp-specialized Hopper 8-bit-activation bodies (W4A8, W8A8): a
# schedule of their producer and consumers, whose Params add the tensor maps of every activation
# row's codes and (W8A8) of every expert's weight codes.
_MOE_SCALED_WS_SCHEDULE = ("grouped_masked_scaled_ws.cuh", "GroupedMaskedScaledWs", "MaskedScaledTmaGemmParams")
# Its walk for the grouped contiguous GEMM's row-expert form (a grouped key on those bodies): the
# blocks of rows and their first rows' experts in place of the masked and offsets forms' table.
_ROW_BLOCK_WALK = "humming_aot::schedule::RowBlockWalk"


def ws_row_expert(key: KernelKey) -> bool:
    """Whether a key is the row-expert form on a warp-specialized 8-bit-activation body (the
    scaled masked schedule over schedule/row_block_walk.cuh: no walk table)."""
    return key.spec.gemm_type is GemmType.GROUPED and key.tile.mma in (MmaKind.WGMMA_W4A8, MmaKind.WGMMA_SS)


def _moe_schedule(key: KernelKey) -> tuple[str, str, str] | None:
    """(kernel file, schedule template, Params struct) of a MoE key's schedule; None for a dense
    key. ValueError for a body the schedule does not take."""
    gemm_type, mma = key.spec.gemm_type, key.tile.mma
    if gemm_type not in _MOE_SCHEDULES:
        return None
    allowed = moe_bodies(gemm_type is GemmType.MASKED, key.spec.a_is_quantized)
    if mma not in allowed:
        raise ValueError(
            f"{key.name}: the {gemm_type.value} GEMM (kernel/{_MOE_SCHEDULES[gemm_type][0]}) takes the bodies "
            f"{', '.join(b.value for b in allowed) or 'none'} for {key.spec.a_dtype} activations, not {mma.value}"
        )
    if mma is MmaKind.WGMMA_WS:
        return _MOE_WS_SCHEDULE
    if mma in (MmaKind.WGMMA_W4A8, MmaKind.WGMMA_SS):
        return _MOE_SCALED_WS_SCHEDULE
    if mma in (MmaKind.MMA_W4A8, MmaKind.MMA_SS):
        return _MOE_SCALED_SCHEDULE if gemm_type is GemmType.MASKED else _GROUPED_SCALED_SCHEDULE
    return _MOE_SCHEDULES[gemm_type]


def params_type(key: KernelKey) -> str:
    """The C++ Params struct a key's kernel takes (kernel/params.cuh), its body's: TmaGemmParams
    (GemmParams + the schedule + the activation tensor map) for the TMA body, GemmParams for the
    others; for a grouped masked or contiguous GEMM its schedule's (GemmParams + the experts'
    counts or row experts, global scales and strides; on the TMA body, + the tensor map)."""
    schedule = _moe_schedule(key)
    if schedule is not None:
        return schedule[2]
    return key.tile.body.params_type


def weight_codes(spec) -> str:
    """The C++ weight code family of a spec (csrc/include/humming_aot/numerics/weight_codes.cuh)."""
    if spec.w_is_float:
        exp, man = spec.w_exp_man
        if spec.w_zero_point is not ZeroPoint.NONE:
            raise ValueError(f"{spec.w_dtype} weights take no zero point")
        return f"humming_aot::numerics::FloatWeights<{exp}, {man}>"
    return f"humming_aot::numerics::IntWeights<{spec.w_bits}>"


def _body_asserts(key: KernelKey) -> str:
    """The static_asserts of the rules a body's module repeats from its C++ (bodies/wgmma_w4a8.py:
    the promotion's scratch sets and the wgmma wait depth; bodies/wgmma_ws.py: the CTAs per SM the
    masked schedule on it is built for and its producer's registers, in the device pass, where the
    shared memory per SM is known)."""
    if key.spec.gemm_type in _MOE_SCHEDULES and _moe_schedule(key) == _MOE_WS_SCHEDULE:
        zero_point = key.spec.w_zero_point is not ZeroPoint.NONE
        ctas = masked_ctas_per_sm(key.tile, key.spec.w_bits, zero_point)
        producer = masked_producer_registers(key.tile, key.spec.w_bits, zero_point)
        return ("#ifdef __CUDA_ARCH__\n"
                f"static_assert(Kernel::kMinBlocksPerSm == {ctas}, "
                '"CTAs per SM differ from humming_aot.bodies.wgmma_ws.masked_ctas_per_sm");\n'
                f"static_assert(Kernel::kProducerRegisters == {producer}, "
                '"producer registers differ from humming_aot.bodies.wgmma_ws.masked_producer_registers");\n'
                "#endif\n")
    if key.tile.mma is MmaKind.WGMMA_WS and key.spec.gemm_type is GemmType.DENSE:
        return (f"static_assert(Kernel::kProducerRegisters == {dense_producer_registers(key.tile)}, "
                '"producer registers differ from humming_aot.bodies.wgmma_ws.dense_producer_registers");\n')
    if key.tile.mma is not MmaKind.WGMMA_W4A8:
        return ""
    from humming_aot.bodies.wgmma_w4a8 import overlapped, wait_depth

    body = "Kernel::Body::" if key.spec.gemm_type in _MOE_SCHEDULES else "Kernel::"  # (the MoE schedule's body)
    return (f'static_assert({body}kOverlapped == {"true" if overlapped(key.tile, key.spec.w_dtype) else "false"}, '
            '"scratch sets differ from humming_aot.bodies.wgmma_w4a8.overlapped");\n'
            f'static_assert({body}kWaitDepth == {wait_depth(key.tile)}, '
            '"wait depth differs from humming_aot.bodies.wgmma_w4a8.wait_depth");\n')


def kernel_source(key: KernelKey) -> str:
    """The generated .cu text for one key (deterministic: same key, same bytes): the translation
    unit the JIT compiles, and a catalog build's for a unit of one key."""
    return unit_source([key])


def unit_source(keys: list[KernelKey]) -> str:
    """One translation unit for several keys (a catalog build compiles a few kernels per nvcc run:
    aot.ninja.plan_units): each key's kernel, its static_asserts and its KernelMetadata in a
    namespace of its own, the headers included once. Deterministic in the order of ``keys``."""
    if not keys:
        raise ValueError("a translation unit needs at least one kernel key")
    names = [key.name for key in keys]
    if len(set(names)) != len(names):
        raise ValueError(f"a translation unit names a kernel twice: {sorted(names)}")
    includes, blocks = [], []
    for key in keys:
        key_includes, block = _kernel_block(key)
        includes += [line for line in key_includes if line not in includes]
        blocks.append(block)
    title = (f"for {names[0]}. Do not edit." if len(keys) == 1
             else f"for {len(keys)} kernels. Do not edit." + "".join(f"\n//   {name}" for name in names))
    return f"// Generated by humming_aot.codegen {title}\n" + "\n".join(includes) + "\n" + "".join(
        "\n" + block for block in blocks)


def _kernel_block(key: KernelKey) -> tuple[list[str], str]:
    """(the #include lines, the kernel's namespaced text) of one key."""
    spec, tile = key.spec, key.tile
    # the 8-bit-activation bodies (their check_key holds each to its pairings)
    quantized_body = tile.mma in (MmaKind.WGMMA_SS, MmaKind.WGMMA_W4A8, MmaKind.MMA_SS, MmaKind.MMA_W4A8,
                                  MmaKind.MMA_FP4)
    if ((spec.a_is_quantized and not quantized_body)
            or (spec.gemm_type is not GemmType.DENSE and spec.gemm_type not in _MOE_SCHEDULES)):
        raise ValueError(
            f"{key.name}: no kernel body takes {spec.a_dtype} activations or a {spec.gemm_type.value} GEMM yet on "
            f"{tile.mma.value} tiles (the bodies serve dense GEMMs with 16-bit activations, float8e4m3 x float8e4m3 "
            "on wgmma-ss and mma-ss tiles, int4, uint4 (zero point) or mxfp4 x float8e4m3 on wgmma-w4a8 tiles, int4 or "
            "uint4 x int8 or float8e4m3 and mxfp4 x float8e4m3 on mma-w4a8 tiles, block-scaled float4e2m1 x float4e2m1 on mma-fp4 "
            "tiles, and the grouped masked and contiguous ones "
            "around the mma.sync and wgmma-ws bodies, and around mma-w4a8, mma-ss, wgmma-w4a8 and wgmma-ss)"
        )
    schedule = _moe_schedule(key)  # (raises for a body the MoE schedule does not take)
    if not quantized_body and (spec.w_scale_dtype != spec.a_dtype or spec.out_dtype != spec.a_dtype):
        raise ValueError(f"{key.name}: the kernel bodies need scales and output in the activation dtype")
    smem = kernel_smem_bytes(key)
    name = key.name
    body = tile.body  # header, template and tile arguments (humming_aot.bodies)
    header, template, tile_args = body.header, body.template, body.template_args(tile)
    params = params_type(key)
    if tile.mma is MmaKind.WGMMA_W4A8:
        type_args = f"""{_ACT_TYPES[spec.out_dtype]},  // output dtype (fp32 scales)
    {_W4A8_WIDEN[spec.w_dtype, spec.a_dtype]},  // {spec.w_dtype} weight codes to e4m3"""
    elif tile.mma is MmaKind.MMA_W4A8:
        type_args = f"""{_ACT_TYPES[spec.out_dtype]},  // output dtype (fp32 scales)
    {_SYNC_CODE_TYPES[spec.a_dtype]},  // the activations' codes: {spec.a_dtype}
    {_W4A8_WIDEN[spec.w_dtype, spec.a_dtype]},  // the {spec.w_dtype} weight codes' conversion"""
    elif tile.mma is MmaKind.MMA_FP4:
        vec, recipe = (4, "NVFP4, ue4m3 per 16 of K") if spec.a_scale_dtype == "float8e4m3" else (2, "MXFP4, ue8m0 per 32")
        type_args = f"""{_ACT_TYPES[spec.out_dtype]},  // output dtype (fp32 sums)
    humming_aot::mma::Fp4BlockScaledSync<{vec}>,  // both operands' codes and block scales: {recipe}"""
    elif tile.mma is MmaKind.MMA_SS:
        blocks = "true" if body.block_scales(key) else "false"
        type_args = f"""{_ACT_TYPES[spec.out_dtype]},  // output dtype (fp32 scales)
    {_SYNC_CODE_TYPES[spec.a_dtype]},  // both operands' codes: {spec.a_dtype}
    {blocks},  // scales per 128 x 128 weight block and 1 x 128 token group"""
    elif quantized_body:
        blocks = "true" if body.block_scales(key) else "false"
        type_args = f"""{_ACT_TYPES[spec.out_dtype]},  // output dtype (fp32 scales)
    {_CODE_TYPES[spec.a_dtype]},  // both operands' codes: {spec.a_dtype}
    {blocks},  // scales per 128 x 128 weight block and 1 x 128 token group"""
    else:
        type_args = f"""{_ACT_TYPES[spec.a_dtype]},  // activation, scale and output dtype
    {weight_codes(spec)},  // weight codes: {spec.w_dtype}
    {_ZERO_POINT[spec.w_zero_point]},"""
    kernel = f"""humming_aot::kernel::{template}<
    {type_args}
    {", ".join(map(str, tile_args))}>"""
    includes = [f"#include <humming_aot/kernel/{header}>"]
    if schedule is not None:  # the schedule around the dense body (its rows and columns)
        schedule_header, template_name, _ = schedule
        walk = f", {_ROW_BLOCK_WALK}" if ws_row_expert(key) else ""
        kernel = f"humming_aot::kernel::{template_name}<{kernel}, {tile.block_m}, {tile.block_n}{walk}>"
        includes.append(f"#include <humming_aot/kernel/{schedule_header}>")
    return includes, f"""\
namespace {key.symbol}_unit {{  // {name}
using Kernel = {kernel};

static_assert(Kernel::kSmemBytes == {smem}, "shared memory differs from humming_aot.codegen.kernel_smem_bytes");
static_assert(Kernel::kThreads == {tile.threads}, "thread count differs from the TileConfig");
static_assert(Kernel::kScalesInFp32 == {"true" if key.scales_in_fp32 else "false"}, "scale rounding differs from KernelKey.scales_in_fp32");
static_assert(humming_aot::kernel::kParamsVersion == {PARAMS_VERSION}, "GemmParams version differs from codegen");
{_body_asserts(key)}
extern "C" __global__ void __launch_bounds__(Kernel::kThreads, Kernel::kMinBlocksPerSm)
{key.symbol}(const __grid_constant__ humming_aot::kernel::{params} params) {{
  Kernel::run(params);
}}

extern "C" __constant__ humming_aot::kernel::KernelMetadata {key.metadata_symbol} = {{
    humming_aot::kernel::kMetadataMagic,
    humming_aot::kernel::kParamsVersion,
    sizeof(humming_aot::kernel::{params}),
    Kernel::kThreads,
    Kernel::kSmemBytes,
    {tile.block_m}, {tile.block_n}, {tile.block_k},
    "{name}"}};
}}  // namespace {key.symbol}_unit
"""
