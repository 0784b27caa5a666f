"""Every catalog kernel of the WnA16 families (integer and float weights, mma.sync and wgmma
bodies) against a float64 reference of exactly the operands it multiplies: fresh
random data per run, NaN-poisoned outputs, odd shapes, split-K, bias, CUDA-graph capture, two runs
bitwise equal; and every weight format of the public API (MX, NVFP4, tensor and block scales)."""
from __future__ import annotations

import math
import os

import pytest
import torch

import humming_aot
from humming_aot import dispatch, formats, ops
from humming_aot.catalog import installed_catalog
from humming_aot.formats import round_to
from humming_aot.packing import _scale_compensation
from humming_aot.spec import KernelKey, MmaKind, ZeroPoint
from humming_aot.testing.numerics import assert_bitwise_equal, assert_gemm_close, reference_gemm, with_every_code

M_VALUES = (1, 3, 16, 129, 1024, 4096)
# (N, K, group): the minimum alignment, then non-power-of-two multiples (the last also splits K),
# each with another scale group (None = per channel). K as listed for tiles up to 128 wide;
# wider K stages scale it (_cases) so that every K is a whole number of stages.
CASES = ((64, 128, 32), (448, 384, 128), (1344, 1152, None), (192, 640, 64))


def _cases(key: KernelKey) -> list[tuple[int, int, int | None]]:
    scale = max(1, key.tile.block_k // 128)
    return [(n, k * scale, group) for n, k, group in CASES]


def _device_keys() -> list:
    if not torch.cuda.is_available():
        return [pytest.param(None, id="no-gpu")]
    catalog = installed_catalog()
    if catalog is None:
        return [pytest.param(None, id="no-catalog")]
    arches = dispatch.device_info(torch.cuda.current_device()).arches
    # the dense kernels (an installed moe catalog's grouped ones are test_moe_kernels_gpu.py's)
    # (16-bit activations only: the W8A8 and W4A8 keys of a default catalog are test_w8a8*_gpu.py's
    # and test_w4a8_gpu.py's)
    names = [name for arch in arches for name in catalog.keys_for(arch) if name.startswith("gemm_dense_")
             and KernelKey.from_name(name).spec.a_dtype in ("bfloat16", "float16")]
    if not names:  # the tests assert a key: this fails them, naming the missing catalog
        return [pytest.param(None, id=f"no-catalog-kernels-for-{'-'.join(arches)}")]
    return [pytest.param(KernelKey.from_name(name), id=name) for name in sorted(names)]


def _format(key: KernelKey, group: int | None) -> str:
    gran = "channel" if group is None else f"g{group}"
    element = key.spec.w_dtype  # int4, uint4 (with :zp or :zpf), float4e2m1, ...: float32 scales
    suffix = {ZeroPoint.NONE: "", ZeroPoint.INTEGER: ":zp", ZeroPoint.FLOAT: ":zpf"}[key.spec.w_zero_point]
    return f"{element}:{gran}{suffix}"


def _seed() -> int:
    """A fresh seed for a torch.Generator, printed (pytest shows it with a failure's output) and
    named in every failure message, so that a failing case can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return seed


def _make_weight(key, n, k, group, gen):
    act = getattr(torch, key.spec.a_dtype)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
    return humming_aot.pack(with_every_code(humming_aot.quantize(w, _format(key, group)), gen), act_dtype=act)


def _run(key, a, packed, bias):
    out = torch.full((a.shape[0], packed.n), float("nan"), dtype=a.dtype, device=a.device)
    return dispatch.launch_gemm(a, packed, bias, ops.gemm_spec(packed), tile=key.tile, out=out)


@pytest.mark.parametrize("key", _device_keys())
def test_kernel_matches_float64_reference(key):
    assert key is not None, "a GPU is present but no kernel catalog is installed: build one (tools/device_check.sh)"
    act = getattr(torch, key.spec.a_dtype)
    for n, k, group in _cases(key):
        seed = _seed()
        gen = torch.Generator(device="cuda").manual_seed(seed)
        packed = _make_weight(key, n, k, group, gen)
        w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
        for m in M_VALUES:
            a = torch.randn(m, k, device="cuda", generator=gen).to(act)
            bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m % 2 else None
            out = _run(key, a, packed, bias)
            context = f"key={key.name} m={m} n={n} k={k} group={group} seed={seed}"
            ref = reference_gemm(a, w_eff, bias)
            assert_gemm_close(out, ref, a=a, w_eff=w_eff, bias=bias, context=context)
            assert_bitwise_equal(out, _run(key, a, packed, bias), context)


def _none_skipped(params: list, what: str) -> list:
    """``params``, or, where the installed catalog has none of ``what``, one case skipped with that
    reason (an empty parametrization is a collection error: empty_parameter_set_mark)."""
    if params:
        return params
    reason = f"the installed kernel catalog has no {what} for this GPU (a smoke catalog?): build the default one"
    return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="none-in-catalog")]


def _cluster_keys() -> list:
    """The device keys that sum their split-K slices in a thread-block cluster (sm_90+ 8-row tiles)."""
    keys = _device_keys()
    if keys[0].values[0] is None:
        return keys
    return _none_skipped([param for param in keys if param.values[0].reduces_splits_in_cluster],
                         "kernel that sums split-K slices in a cluster (8-row mma.sync tiles, sm_90+)")


@pytest.mark.parametrize("key", _cluster_keys())
def test_cluster_and_workspace_split_k_give_the_same_bits(key):
    """Launched with its K slices as one thread-block cluster, the 8-row tile sums them through
    distributed shared memory instead of the global workspace: for every cluster size (2 to 8
    slices) and M up to 8, both reductions give the same bits, close to the float64 reference."""
    assert key is not None, "no kernel catalog"
    assert dispatch.device_info(torch.cuda.current_device()).arches[0].startswith(("sm9", "sm1")), (
        "an sm_90+ device serves keys that reduce in a cluster")
    act = getattr(torch, key.spec.a_dtype)
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n, k = 320, 8 * max(128, key.tile.block_k)  # N: two full 128-column tiles and a part one
    packed = _make_weight(key, n, k, 64, gen)
    w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
    spec = ops.gemm_spec(packed)
    for m in (1, 2, 7):
        a = torch.randn(m, k, device="cuda", generator=gen).to(act)
        bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m == 7 else None
        ref = reference_gemm(a, w_eff, bias)
        for splits in (2, 3, 5, 8):
            outs = []
            for clustered in (True, False):
                out = torch.full((m, n), float("nan"), dtype=act, device="cuda")
                outs.append(dispatch.launch_gemm(a, packed, bias, spec, tile=key.tile, out=out, splits=splits,
                                                 cluster_reduction=clustered))
            context = f"key={key.name} m={m} n={n} k={k} splits={splits} seed={seed}"
            assert_gemm_close(outs[0], ref, a=a, w_eff=w_eff, bias=bias, context=context)
            assert_bitwise_equal(outs[0], outs[1], context)


def _stream_k_keys() -> list:
    """The device keys of the warp-specialized TMA body, which also runs the stream-K schedule."""
    keys = _device_keys()
    if keys[0].values[0] is None:
        return keys
    return _none_skipped([param for param in keys if param.values[0].tile.mma is MmaKind.WGMMA_WS],
                         "wgmma-ws kernel (sm90a)")


@pytest.mark.parametrize("key", _stream_k_keys())
def test_stream_k_schedule_matches_the_reference_for_every_grid(key):
    """The stream-K schedule over G persistent CTAs: tiles cut between CTAs at every place the
    grid sizes below put the cuts (one CTA doing everything, CTAs of several whole tiles whose
    staged stores gate the producer, ranges inside one tile, ragged M and N, bias), close to the
    float64 reference, bitwise equal run to run, and the tile counters left at zero (the second
    launch would wait forever or sum stale partials otherwise)."""
    assert key is not None, "no kernel catalog"
    act = getattr(torch, key.spec.a_dtype)
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_sms = dispatch.device_info(torch.cuda.current_device()).num_sms
    for n, k, group in ((448, 1152, 128), (1344, 640, None)):
        packed = _make_weight(key, n, k, group, gen)
        spec = ops.gemm_spec(packed)
        w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
        for m in (1, 129, 300):
            a = torch.randn(m, k, device="cuda", generator=gen).to(act)
            bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m != 129 else None
            ref = reference_gemm(a, w_eff, bias)
            iterations = -(-m // key.tile.block_m) * -(-n // key.tile.block_n) * (k // key.tile.block_k)
            grids = sorted({g for g in (1, 2, 3, 7, 13, iterations - 1, iterations, num_sms)
                            if 1 <= g <= min(iterations, num_sms)})
            for ctas in grids:
                context = f"key={key.name} m={m} n={n} k={k} group={group} stream_k={ctas} seed={seed}"
                outs = []
                for _ in range(2):
                    out = torch.full((m, n), float("nan"), dtype=act, device="cuda")
                    outs.append(dispatch.launch_gemm(a, packed, bias, spec, tile=key.tile, out=out, stream_k=ctas))
                assert_gemm_close(outs[0], ref, a=a, w_eff=w_eff, bias=bias, context=context)
                assert_bitwise_equal(outs[0], outs[1], context)


@pytest.mark.parametrize("fmt", ["int4:g128", "uint4:g128:zp", "mxfp4"])
@pytest.mark.parametrize("m", [40, 100])
def test_default_schedule_streams_k_over_a_partial_last_wave(fmt, m):
    """Decode-sized problems of just over a wave of tiles (288 of 128 channels on 132 SMs of two
    CTAs each) run the default plan's stream-K over one wave (heuristics.partial_wave_stream_k):
    close to the float64 reference with NaN-poisoned outputs, bitwise equal run to run."""
    info = dispatch.device_info(torch.cuda.current_device())
    if "sm90a" not in info.arches:
        pytest.skip(f"the wgmma-ws body is sm90a's; {info.name} runs the mma.sync tiles")
    n, k = 2 * info.num_sms * 128 + 3 * 128, 1024  # a 9 % last wave at 2 CTAs per SM
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05, fmt),
                              act_dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    spec = ops.gemm_spec(packed)
    outs = []
    for _ in range(2):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(dispatch.launch_gemm(a, packed, None, spec, out=out))
    plan = next(p for p in dispatch._plans.values() if (p.key.spec, p.m, p.n, p.k) == (spec, m, n, k))
    context = f"fmt={fmt} m={m} n={n} k={k} tile={plan.key.tile.label} seed={seed}"
    assert plan.stream_k_ctas == 2 * info.num_sms, f"{context}: not stream-K over one wave ({plan.grid})"
    w_eff = ops.effective_weight(packed, m)
    assert_gemm_close(outs[0], reference_gemm(a, w_eff, None), a=a, w_eff=w_eff, context=context)
    assert_bitwise_equal(outs[0], outs[1], context)


EXACT_M = (1, 2, 8, 16, 129)  # 1 and 2: the 8-row tile's own offset path for tiles of at most two tokens
EXACT_SPLITS = range(1, 9)  # forced, on the global workspace and (where the key can) in a cluster
EXACT_STAGES = 8  # K in stages of the key's tile: every split count up to 8 gets whole stages


def _quantum(x: torch.Tensor) -> float:
    """The largest power of two that divides every nonzero element of float64 ``x``."""
    nonzero = x[x != 0].abs()
    mantissa, exponent = torch.frexp(nonzero)  # nonzero = mantissa * 2^exponent, mantissa in [0.5, 1)
    digits = (mantissa * 2.0**53).to(torch.int64)  # exact: a float64 significand
    lowest = torch.log2((digits & -digits).to(torch.float64)).round().to(torch.int64)
    return 2.0 ** int((exponent.to(torch.int64) - 53 + lowest).min().item())


def _exact_grid_problem(key, gen, group: int | None, scale_mantissa_bits: int = 7):
    """(packed, a, w_dyn) for a 129 x 320 x K problem, K = 8 stages of the key's tile, whose fp32
    products and partial sums are exact in any order, so that the kernel must equal the float64
    reference rounded once, bit for bit.

    Integer codes: every code of the element; float codes: the quantizer's codes of small
    integers (no subnormals). Scales 2^e x (1 + j / 128), e in four consecutive exponents (at
    most 2^0, lower where the float element's largest value would overflow the activation
    dtype) and j below 2^scale_mantissa_bits: exact in bf16 and f16, but with 8 significant
    bits, so that (q - z) * s and decode(code) * s need rounding. Float zero points get three
    fraction bits (z = i + f / 8), so that q - z needs rounding too. Activations: +-1, +-2 on
    a sparse random pattern, thinned row by row until every output's sum of |a| |w| stays
    within 2^24 quanta of the weights' grid (the exactness bound, checked here).
    ``w_dyn`` is the weight the kernel multiplies with, before the (power-of-two) global scale.
    """
    m, n, k = max(EXACT_M), 320, EXACT_STAGES * key.tile.block_k
    act = getattr(torch, key.spec.a_dtype)
    w = torch.randint(-7, 8, (n, k), device="cuda", generator=gen).float()
    packed = humming_aot.pack(with_every_code(humming_aot.quantize(w, _format(key, group)), gen), act_dtype=act)
    assert packed.group_size == (k if group is None else group)
    top = 0
    if key.spec.w_is_float:
        # keep decode * s and the float dequantizer's scale * 2^compensation (s < 2^(top + 1))
        # finite in the activation dtype, as pack does
        largest = max(formats.get(key.spec.w_dtype).max_value, 2.0 ** _scale_compensation(key.spec.w_dtype, act))
        top = min(0, math.floor(math.log2(torch.finfo(act).max / (2 * largest))))
    shape = packed.w_scale.shape
    mantissa = 1 + torch.randint(0, 2**scale_mantissa_bits, shape, device="cuda", generator=gen) / 128
    exponent = torch.randint(top - 3, top + 1, shape, device="cuda", generator=gen)
    packed.w_scale.copy_((mantissa * torch.exp2(exponent)).to(act))
    if packed.float_zero_point:
        levels = 2**key.spec.w_bits
        whole = torch.randint(0, levels, shape, device="cuda", generator=gen)
        eighths = torch.randint(0, 8, shape, device="cuda", generator=gen)
        packed.w_zero_point.copy_((whole + eighths / 8).to(act))
    global_scale = packed.global_scale
    assert global_scale == 2.0 ** round(math.log2(global_scale)), f"global scale {global_scale} is not a power of two"
    w_dyn = packed.effective_weight(scales_in_fp32=key.scales_in_fp32) / global_scale
    assert torch.isfinite(w_dyn).all(), "the drawn scales overflow the activation dtype"

    # sparse +-1, +-2 activations, as dense as the exactness bound allows
    limit = 2.0**24 * _quantum(w_dyn)
    density = min(1.0, limit / 4 / (k * 1.5 * w_dyn.abs().mean().item()))
    keep = torch.rand((m, k), device="cuda", generator=gen) < density
    values = torch.randint(1, 3, (m, k), device="cuda", generator=gen) * (torch.randint(0, 2, (m, k), device="cuda", generator=gen) * 2 - 1)
    a64 = torch.where(keep, values, 0).to(torch.float64)
    while True:
        worst = (a64.abs() @ w_dyn.abs().T).amax(dim=1)  # per row: the largest sum of |a| |w| over N
        over = worst > limit
        if not over.any():
            break
        thin = torch.rand((m, k), device="cuda", generator=gen) < 0.5
        a64[over.unsqueeze(1) & thin] = 0
    # Wide codes with fractional zero points (7-8 bits) span more quanta than the bound allows for
    # a sum of two terms, so thinning can empty a row: it gets one +-1, a lone product being exact
    # (16 significant bits at most, added to zero) whatever its size.
    empty = (a64 != 0).sum(dim=1) == 0
    if empty.any():
        rows = empty.nonzero().squeeze(1)
        cols = torch.randint(0, k, (rows.numel(),), device="cuda", generator=gen)
        a64[rows, cols] = torch.randint(0, 2, (rows.numel(),), device="cuda", generator=gen).to(torch.float64) * 2 - 1
    sums = (a64 != 0).sum(dim=1) > 1
    assert not sums.any() or (a64[sums].abs() @ w_dyn.abs().T).max() <= limit, "exactness bound"
    assert (a64 != 0).sum(dim=1).min() > 0, "every row has a nonzero activation"
    return packed, a64.to(act), w_dyn


def _exact_keys_and_groups() -> list:
    params = []
    for param in _device_keys():
        for group in (64, None):
            key = param.values[0]
            gran = "channel" if group is None else f"g{group}"
            params.append(pytest.param(key, group, id=f"{param.id}-{gran}"))
    return params


@pytest.mark.parametrize(("key", "group"), _exact_keys_and_groups())
def test_exact_grid_inputs_are_bitwise_exact(key, group):
    """Exact fp32 sums (see _exact_grid_problem): for M in 1, 2, 8, 16, 129 and every forced
    split-K count 1 to 8, on the global workspace and (keys that can) in a thread-block cluster,
    the kernel equals the float64 reference rounded once to the activation dtype, bit for bit.
    That checks the operand roundings the kernel documents: round((q - z) * s) (or, for
    KernelKey.scales_in_fp32 keys, (q - z) * s unrounded), round(round(q - z) * s) with float
    zero points, and round(decode(code) * s), with scales of 8 significant bits."""
    assert key is not None, "no kernel catalog"
    seed = _seed()
    packed, a_all, w_dyn = _exact_grid_problem(key, torch.Generator(device="cuda").manual_seed(seed), group)
    w_eff = w_dyn * packed.global_scale
    spec = ops.gemm_spec(packed)
    reductions = (True, False) if key.reduces_splits_in_cluster else (False,)
    for m in EXACT_M:
        a = a_all[:m]
        ref = round_to(reference_gemm(a, w_eff, None), a.dtype)
        for splits in EXACT_SPLITS:
            for clustered in reductions if splits > 1 else (False,):
                out = torch.full((m, packed.n), float("nan"), dtype=a.dtype, device="cuda")
                dispatch.launch_gemm(a, packed, None, spec, tile=key.tile, out=out, splits=splits,
                                     cluster_reduction=clustered)
                context = (f"key={key.name} group={group} m={m} k={packed.k} splits={splits} "
                           f"cluster={clustered} seed={seed}")
                assert_bitwise_equal(out, ref, context)


def _integer_keys() -> list:
    """The device keys with integer codes and no float zero point: the kernels whose scales may
    be applied either way (KernelKey.scales_in_fp32)."""
    keys = _device_keys()
    if keys[0].values[0] is None:
        return keys
    return _none_skipped([param for param in keys if not param.values[0].spec.w_is_float
                          and param.values[0].spec.w_zero_point is not ZeroPoint.FLOAT],
                         "kernel with integer codes and no float zero point")


@pytest.mark.parametrize("key", _integer_keys())
def test_scale_rounding_is_the_kernels_own(key):
    """Scales with 8 significant bits, so that (q - z) * s often does not fit bf16: the kernel
    equals its own operand model (KernelKey.scales_in_fp32: unrounded (q - z) * s, or rounded
    once to the activation dtype) bitwise on exact-grid inputs, and with bf16 activations the
    other model's result differs for codes of 3 bits or more, so that this test tells the two
    apart (1- and 2-bit codes have |q - z| <= 2: both models hold the same weights). The wgmma-ws
    tiles with a bfloat16 output run the tail split here: under stream-K their partials pass
    through scaled fp16 (epilogue/half_slot_vectors.cuh), whose rounding the exact-grid sums do
    not escape (tests/gpu/test_stream_k_partials_gpu.py bounds it); float16 outputs keep fp32
    partials and the default plan."""
    assert key is not None, "no kernel catalog"
    seed = _seed()
    packed, a, w_dyn = _exact_grid_problem(key, torch.Generator(device="cuda").manual_seed(seed), 64)
    out = torch.full((a.shape[0], packed.n), float("nan"), dtype=a.dtype, device=a.device)
    dispatch.launch_gemm(a, packed, None, ops.gemm_spec(packed), tile=key.tile, out=out,
                         stream_k=0 if key.tile.mma is MmaKind.WGMMA_WS and a.dtype is torch.bfloat16 else None)
    own = round_to(reference_gemm(a, w_dyn * packed.global_scale, None), a.dtype)
    assert_bitwise_equal(out, own, f"key={key.name} scales_in_fp32={key.scales_in_fp32} seed={seed}")
    if a.dtype is torch.bfloat16 and key.spec.w_bits >= 3:
        other_w = packed.effective_weight(scales_in_fp32=not key.scales_in_fp32)
        other = round_to(reference_gemm(a, other_w, None), a.dtype)
        assert not torch.equal(own, other), f"key={key.name} seed={seed}: both scale models gave one result"


PUBLIC_FORMATS = ("mxfp4", "nvfp4", "mxfp8", "mxfp6e2m3", "float8e4m3:tensor", "float8e4m3:b128x128",
                  "float8e5m2:channel", "int4:tensor", "int8:b64x128", "float4e0m3:g16")


@pytest.mark.parametrize("act", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("fmt", PUBLIC_FORMATS)
def test_public_formats_through_the_op(fmt, act):
    """Microscaled, two-level, tensor and block formats through pack + ops.gemm (heuristic tile,
    split-K at small M): the output equals the float64 product with humming_aot.dequantize's
    weights where the format's scales are exact in the activation dtype (MX, NVFP4: the global
    scale is applied to the fp32 sums), and the kernel's own operand always."""
    n, k = 384, 1024
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qw = humming_aot.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05, fmt)
    packed = humming_aot.pack(qw, act_dtype=act)
    if qw.format.scale_dtype in ("float8e8m0", "float8e4m3"):
        # NVFP4's dequantize rounds decode * scale * global to float32 once; MX is exact
        torch.testing.assert_close(packed.effective_weight(), humming_aot.dequantize(qw).double(), rtol=2**-23, atol=0)
    for m in (1, 3, 16, 129, 1024):
        w_eff = ops.effective_weight(packed, m)
        a = torch.randn(m, k, device="cuda", generator=gen).to(act)
        bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if m % 2 else None
        out = ops.gemm(a, packed, bias)
        context = f"fmt={fmt} act={act} m={m} seed={seed}"
        assert_gemm_close(out, reference_gemm(a, w_eff, bias), a=a, w_eff=w_eff, bias=bias, context=context)


def test_public_gemm_cuda_graph_and_split_k():
    """The public op (heuristic tile choice, split-K for small M) inside a CUDA graph equals eager."""
    n, k = 4096, 4096
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    packed = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16)
    for m in (1, 16, 200):
        a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        eager = ops.gemm(a, packed)
        graph = torch.cuda.CUDAGraph()
        static_out = None
        ops.gemm(a, packed)  # warm up outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            static_out = ops.gemm(a, packed)
        static_out.fill_(float("nan"))
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(static_out, eager, f"graph replay m={m} seed={seed}")
        w_eff = ops.effective_weight(packed, m)
        assert_gemm_close(eager, reference_gemm(a, w_eff, None), a=a, w_eff=w_eff, context=f"public gemm m={m} seed={seed}")


def test_quantized_linear_and_leading_dims():
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lin = torch.nn.Linear(512, 320, bias=True).cuda().to(torch.float16)
    with torch.no_grad():  # the layer's own init draws from the global generator: replace it
        lin.weight.copy_(torch.randn(320, 512, device="cuda", generator=gen) * 0.04)
        lin.bias.copy_(torch.randn(320, device="cuda", generator=gen) * 0.5)
    q = humming_aot.nn.QuantizedLinear.from_linear(lin, "uint4:g64:zp")
    x = torch.randn(2, 5, 512, device="cuda", generator=gen).to(torch.float16)
    y = q(x)
    assert y.shape == (2, 5, 320) and y.dtype == torch.float16
    w_eff = ops.effective_weight(q.packed, 10)
    ref = reference_gemm(x.reshape(-1, 512), w_eff, q.bias)
    assert_gemm_close(y.reshape(-1, 320), ref, a=x.reshape(-1, 512), w_eff=w_eff, bias=q.bias,
                      context=f"QuantizedLinear seed={seed}")


def test_torch_compile_traces_the_op():
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(256, 512, device="cuda", generator=gen) * 0.02
    packed = humming_aot.pack(humming_aot.quantize(w, "int8:channel"), act_dtype=torch.bfloat16)
    a = torch.randn(33, 512, device="cuda", generator=gen).to(torch.bfloat16)
    fn = torch.compile(lambda x: ops.gemm(x, packed) * 2, fullgraph=True)
    assert_bitwise_equal(fn(a), ops.gemm(a, packed) * 2, f"torch.compile seed={seed}")


def test_pack_on_gpu_matches_cpu_reference():
    from humming_aot.packed_layout import pack_codes, reference_pack_codes

    gen = torch.Generator().manual_seed(17)
    for bits in range(1, 9):  # 1-3 and 5-7 bits are folded into 4- and 8-bit words
        u = torch.randint(0, 2**bits, (320, 256), generator=gen)
        assert torch.equal(pack_codes(u.cuda(), bits).cpu(), reference_pack_codes(u, bits)), f"{bits}-bit codes"


@pytest.mark.parametrize("m", (1, 16, 200, 1024))
def test_back_to_back_gemms_see_their_inputs(m):
    """Each GEMM reads the previous one's output, launched back to back (programmatic dependent
    launch on SM90+: the next kernel starts early and must wait before reading activations or
    writing anything), eagerly and replayed from a CUDA graph."""
    layers = 4
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packs = [humming_aot.pack(humming_aot.quantize(torch.randn(2048, 2048, device="cuda", generator=gen) * 0.03,
                                                   "int4:g128"), act_dtype=torch.bfloat16) for _ in range(layers)]
    spec = ops.gemm_spec(packs[0])
    key, loaded = dispatch.obtain(spec, torch.cuda.current_device(), m)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert loaded.programmatic_launch, f"{key.name} is not launched with programmatic dependent launch"
    x = torch.randn(m, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    outs = [torch.full((m, 2048), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(layers)]

    def chain():
        h = x
        for packed, out in zip(packs, outs):
            h = dispatch.launch_gemm(h, packed, None, spec, out=out)

    def check(where):
        torch.cuda.synchronize()
        h = x
        for i, (packed, out) in enumerate(zip(packs, outs)):
            w_eff = ops.effective_weight(packed, m)
            ref = reference_gemm(h, w_eff, None)
            assert_gemm_close(out, ref, a=h, w_eff=w_eff, context=f"{where} layer {i} m={m} seed={seed}")
            h = out

    chain()
    check("eager")
    eager = [out.clone() for out in outs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    check("graph")
    for i, (out, ref) in enumerate(zip(outs, eager)):
        assert_bitwise_equal(out, ref, f"graph vs eager layer {i} m={m} seed={seed}")


@pytest.mark.parametrize("k,group", [(1088, 64), (1152, 192), (1088, None)])
def test_shapes_a_wide_k_tile_does_not_fit_use_its_twin(k, group):
    """K = 17 x 64 or a group straddling 128-wide stages: the public op must not pick a 128- or
    256-wide K tile (it would read past K or mix groups), and forcing one is a clear error."""
    from humming_aot import heuristics

    n, m = 320, 1
    seed = _seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fmt = "int4:channel" if group is None else f"int4:g{group}"
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05, fmt),
                              act_dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    key, _ = dispatch.obtain(ops.gemm_spec(packed), torch.cuda.current_device(), m, k=k, group=packed.group_size)
    assert heuristics.tile_fits(key.tile, k, packed.group_size), key.name
    out = ops.gemm(a, packed)
    w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
    assert_gemm_close(out, reference_gemm(a, w_eff, None), a=a, w_eff=w_eff, context=f"k={k} group={group} seed={seed}")
    wide = heuristics.select_tile(dispatch.device_info(torch.cuda.current_device()).arches[0], m)
    if wide.block_k > 64:
        with pytest.raises(ValueError, match=f"needs K % {wide.block_k} == 0"):
            ops.gemm_with_tile(a, packed, wide)


def test_public_gemm_backward_on_the_gpu():
    """ops.gemm with inputs that require gradients: the dispatcher's path (not the eager fast
    path, which would give none), grad_a = grad @ W of the forward's exact weight in float32,
    rounded once; grad_bias the rows' sum; the same as the CPU reference path's gradients."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    n, k = 448, 384
    qw = humming_aot.quantize(torch.randn(n, k, generator=gen) * 0.1, "int4:g128")
    grads = []
    for device in ("cpu", "cuda"):
        packed = humming_aot.pack(qw, act_dtype=torch.bfloat16, device=device)
        a = torch.randn(17, k, generator=torch.Generator().manual_seed(seed)).bfloat16().to(device).requires_grad_()
        bias = torch.zeros(n, dtype=torch.bfloat16, device=device, requires_grad=True)
        out = ops.gemm(a, packed, bias)
        assert out.grad_fn is not None, f"no graph on {device} (seed={seed})"
        out.backward(torch.ones_like(out))
        grads.append((a.grad.cpu(), bias.grad.cpu()))
    (a_cpu, bias_cpu), (a_gpu, bias_gpu) = grads
    torch.testing.assert_close(a_gpu, a_cpu, rtol=2**-8, atol=1e-5, msg=f"grad_a (seed={seed})")
    assert torch.equal(bias_gpu, bias_cpu), f"grad_bias (seed={seed})"
