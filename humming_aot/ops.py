"""Public GEMM ops, registered as torch custom ops (with fake implementations, so torch.compile
traces them and CUDA graphs capture them).

A public op reads: validate -> build spec -> (dispatch: select -> obtain -> launch). CUDA tensors
run a precompiled kernel; CPU tensors run the exact reference path (dequantize + float64 matmul,
one rounding to the output dtype), so integrations and CI work without a GPU.
"""
from __future__ import annotations

import functools

import torch

from humming_aot.formats import round_to
from humming_aot.packing import PackedWeight, unpack
from humming_aot.spec import GemmSpec, TileConfig, ZeroPoint

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def gemm_spec(packed: PackedWeight) -> GemmSpec:
    """The GemmSpec of a dense GEMM with this packed weight (output and scales in the act dtype)."""
    act = _DTYPE_NAMES[packed.act_dtype]
    return GemmSpec(
        a_dtype=act,
        w_dtype=packed.w_dtype,
        w_scale_dtype=act,
        w_zero_point=packed.zero_point,
        out_dtype=act,
    )


def _validate(a: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> None:
    if not isinstance(packed, PackedWeight):
        raise TypeError(f"gemm: expected a PackedWeight from humming_aot.pack(), got {type(packed).__name__}")
    packed.check_layout()
    if not isinstance(a, torch.Tensor):
        raise TypeError(f"gemm: a must be a torch.Tensor, got {type(a).__name__}")
    if a.dtype != packed.act_dtype:
        repack = f" or pack the weight with act_dtype={a.dtype}" if a.dtype in (torch.float16, torch.bfloat16) else ""
        raise ValueError(
            f"gemm: a.dtype={a.dtype} but the weight was packed for {packed.act_dtype} activations: "
            f"cast a with a.to({packed.act_dtype}){repack}"
        )
    if packed.w_scale.dtype != packed.act_dtype or (
            packed.w_zero_point is not None and packed.w_zero_point.dtype != packed.act_dtype):
        raise ValueError(
            f"gemm: the packed weight's scales are {packed.w_scale.dtype} but it was packed for {packed.act_dtype} "
            "activations (the kernel reads them as such): a cast of the packed tensors changed them; pack the "
            "weight again, or move a PackedWeight with PackedWeight.to(device)"
        )
    if a.dim() < 1 or a.shape[-1] != packed.in_features:
        raise ValueError(
            f"gemm: a has shape {tuple(a.shape)}; its last dimension must be the weight's K={packed.in_features}"
        )
    if a.device != packed.device:
        raise ValueError(
            f"gemm: a is on {a.device} but the packed weight is on {packed.device}: move one of them "
            "(PackedWeight.to(device))"
        )
    if a.numel() and a.stride(-1) != 1:
        raise ValueError(
            f"gemm: a must have unit stride along K (got strides {a.stride()}): pass a.contiguous()"
        )
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (packed.out_features,):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"gemm: bias must be a tensor of shape ({packed.out_features},), got {shape}")
        if bias.dtype != packed.act_dtype or bias.device != a.device or not bias.is_contiguous():
            raise ValueError(
                f"gemm: bias must be a contiguous {packed.act_dtype} tensor on {a.device}, got "
                f"{bias.dtype} on {bias.device}{'' if bias.is_contiguous() else ' (non-contiguous)'}"
            )


def _validate_cuda(a2: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> None:
    """Checks that need real pointers or the device (run inside the op, never traced)."""
    if bias is not None and bias.data_ptr() % 4:
        raise ValueError("gemm: bias must start on a 4-byte boundary: pass bias.contiguous().clone()")
    if a2.numel() and (a2.data_ptr() % 16 or (a2.shape[0] > 1 and a2.stride(0) % 8)):
        raise ValueError(
            "gemm: a's rows must start on 16-byte boundaries (data pointer and row stride a multiple "
            f"of 8 elements; got row stride {a2.stride(0)}): pass a.contiguous()"
        )
    device = a2.device.index if a2.device.index is not None else torch.cuda.current_device()
    reason = _unsupported_on_device(gemm_spec(packed), device)
    if reason:
        raise ValueError(reason)


@functools.cache
def _unsupported_on_device(spec: GemmSpec, device: int) -> str | None:
    """Why no arch serving this GPU supports `spec` (None if one does); cached, so the support
    matrix is walked once per (spec, device), not on every call."""
    from humming_aot import dispatch, support

    info = dispatch.device_info(device)
    reasons = [support.why_unsupported(spec, arch) for arch in info.arches]
    return f"gemm: not supported on {info.name}: {reasons[0]}" if all(reasons) else None


def _op_packed(a, w, w_scale, w_zero_point, w_dtype, n, k, group_size, global_scale, float_zero_point):
    """The PackedWeight the op's flat arguments describe (the op takes tensors and scalars only)."""
    return PackedWeight(
        w=w, w_scale=w_scale, w_zero_point=w_zero_point, n=n, k=k, group_size=group_size,
        w_dtype=w_dtype, act_dtype=a.dtype, format="", global_scale=global_scale,
        float_zero_point=float_zero_point,
    )


def _gemm_wna16_cpu(a, w, w_scale, w_zero_point, bias, w_dtype, n, k, group_size, global_scale, float_zero_point):
    """The exact reference: float64 product with the kernel's operand, rounded once."""
    packed = _op_packed(a, w, w_scale, w_zero_point, w_dtype, n, k, group_size, global_scale, float_zero_point)
    out = a.reshape(-1, k).to(torch.float64) @ packed.effective_weight().t()
    if bias is not None:
        out = out + bias.to(torch.float64)
    return round_to(out, a.dtype).reshape(*a.shape[:-1], n)


# Registered with the low-level torch.library API rather than torch.library.custom_op: the latter
# wraps the implementation in a dynamo-disable shim whose first call imports torch._dynamo (1.5-4 s),
# which would dominate the cold start of the first GEMM.
_LIBRARY = torch.library.Library("humming_aot", "DEF")
_LIBRARY.define(
    "gemm_wna16(Tensor a, Tensor w, Tensor w_scale, Tensor? w_zero_point, Tensor? bias, str w_dtype, "
    "int n, int k, int group_size, float global_scale, bool float_zero_point) -> Tensor"
)


def _gemm_wna16_cuda(a, w, w_scale, w_zero_point, bias, w_dtype, n, k, group_size, global_scale, float_zero_point):
    out = _gemm_planned(a, w, w_scale, w_zero_point, bias, w_dtype, a.dtype, n, k, group_size, global_scale,
                        float_zero_point, None)
    if out is not None:
        return out
    from humming_aot import dispatch

    packed = _op_packed(a, w, w_scale, w_zero_point, w_dtype, n, k, group_size, global_scale, float_zero_point)
    a2 = a.reshape(-1, k)
    _validate_cuda(a2, packed, bias)
    out = dispatch.launch_gemm(a2, packed, bias, gemm_spec(packed))
    return out.reshape(*a.shape[:-1], n)


# Launch plans of the planned path, per (w_dtype, act dtype, zero point kind, layout version, N, K,
# group, M, device, stream): made the first time (after every check of _validate and
# _validate_cuda), then found with one dict lookup.
_plans: dict[tuple, object] = {}
_dispatch = None  # humming_aot.dispatch once a CUDA GEMM ran (imported on first use, as everywhere here)


def _import_dispatch():
    global _dispatch
    from humming_aot import dispatch

    _dispatch = dispatch
    return dispatch


def _gemm_planned(a, w, w_scale, w_zero_point, bias, w_dtype, act_dtype, n, k, group_size, global_scale,
                  float_zero_point, version, bound=None):
    """The GEMM on a CUDA device through a cached LaunchPlan, or None where the general path must
    run instead: any argument it does not check cheaply as fine (the general path then raises the
    error that argument deserves, or handles it: M = 0, a view of `a` that needs a copy).

    Per call it checks what the plan cannot know: a's dtype (and the scales': a cast of the packed
    tensors), K, unit stride along K, device, row alignment, and the bias's shape, dtype, device,
    contiguity and alignment. What the plan proved (the weight's layout version and support on
    this device, the tile, split-K) it holds.
    `version`: the weight's packed-layout version (None: the op's flat arguments, which carry
    none; the op then assumes the current one, as it always did). `bound`: a PackedWeight's dict of
    bound launches (_bound_launches), which gets this call's where the plan allows one."""
    shape, strides = a.shape, a.stride()
    if a.dtype != act_dtype or w_scale.dtype != act_dtype or not shape or shape[-1] != k or strides[-1] != 1:
        return None
    device_index = a.get_device()
    if device_index < 0 or w.get_device() != device_index:
        return None
    dims = len(shape)
    if dims == 2:
        m, lda = shape[0], strides[0]
    elif a.is_contiguous():
        m, lda = a.numel() // k, k
    else:
        return None
    if m == 0 or a.data_ptr() % 16 or (m > 1 and lda % 8):
        return None
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.dim() == 1 and bias.shape[0] == n
                                 and bias.dtype == act_dtype and bias.get_device() == device_index
                                 and bias.is_contiguous() and bias.data_ptr() % 4 == 0):
        return None
    dispatch = _dispatch or _import_dispatch()
    stream = dispatch.current_stream(device_index)
    plan_key = (w_dtype, act_dtype, w_zero_point is None, float_zero_point, version, n, k, group_size, m,
                device_index, stream)
    plan = _plans.get(plan_key)
    if plan is None:
        packed = PackedWeight(
            w=w, w_scale=w_scale, w_zero_point=w_zero_point, n=n, k=k, group_size=group_size, w_dtype=w_dtype,
            act_dtype=act_dtype, format="", global_scale=global_scale, float_zero_point=float_zero_point,
            layout_version=version,
        )
        _validate(a, packed, bias)
        _validate_cuda(a.reshape(-1, k), packed, bias)
        plan = dispatch.launch_plan(gemm_spec(packed), device_index, stream, m, n, k, group_size)
        if len(_plans) >= dispatch.MAX_PLANS:
            _plans.clear()
        _plans[plan_key] = plan
    # sizes as separate ints: torch.empty parses them ~1 us faster than a tuple
    if dims == 2:
        out = torch.empty(m, n, dtype=act_dtype, device=plan.device)
    else:
        out = torch.empty(*shape[:-1], n, dtype=act_dtype, device=plan.device)
    plan.launch(a, lda, w, w_scale, w_zero_point, bias, out, n, global_scale)
    if bound is not None and lda == k and plan.workspace_shape is None and plan.dp_ctas is None:
        # a contiguous input of a plan with no per-call allocation or tensor map: the next call of
        # this shape on this device and stream launches with four ints (_gemm_bound)
        if len(bound) >= _BOUND_LAUNCHES:
            bound.clear()
        addresses = (w.data_ptr(), w_scale.data_ptr(), 0 if w_zero_point is None else w_zero_point.data_ptr())
        launch = plan.planned.bind(stream, *addresses, n, global_scale)
        bound[(shape, device_index, stream)] = (launch, (*shape[:-1], n), plan.device, addresses)
    return out


# Bound launches kept per PackedWeight (one per input shape, device and stream it ran with).
_BOUND_LAUNCHES = 64


def _bound_launches(packed: PackedWeight) -> dict:
    """The PackedWeight's bound launches: {(a.shape, device index, stream): (_C.BoundLaunch with the
    weight's pointers, output shape, device, the three addresses bound)}, in the instance's __dict__
    (PackedWeight is frozen, so its tensors stay the same objects; their storage may still be
    swapped in place, `.data =` or load_state_dict(assign=True), so each call compares the
    addresses. PackedWeight.__getstate__ leaves the dict out)."""
    bound = packed.__dict__.get("_bound_launches")
    if bound is None:
        bound = packed.__dict__["_bound_launches"] = {}
    return bound


def _gemm_bound(a, packed, bias, device_index):
    """The eager GEMM through a launch bound to `packed` (made by an earlier call of the same
    shape, device and stream that took the planned path), or None where there is none or an
    argument needs a check only the planned path makes. Per call: a's dtype, contiguity and
    alignment, the bias's shape, dtype, device, contiguity and alignment, and that the weight's
    tensors still hold the storage bound."""
    bound = packed.__dict__.get("_bound_launches")
    if bound is None:
        return None
    entry = bound.get((a.shape, device_index, (_dispatch or _import_dispatch()).current_stream(device_index)))
    if entry is None or a.dtype is not packed.act_dtype or not a.is_contiguous():
        return None
    address = a.data_ptr()
    if address % 16:
        return None
    bias_address = 0
    if bias is not None:
        if not (type(bias) is torch.Tensor and bias.shape == (packed.n,) and bias.dtype is packed.act_dtype
                and bias.get_device() == device_index and bias.is_contiguous()):
            return None
        bias_address = bias.data_ptr()
        if bias_address % 4:
            return None
    launch, out_shape, device, (w, w_scale, w_zero_point) = entry
    if packed.w.data_ptr() != w or packed.w_scale.data_ptr() != w_scale or (
            w_zero_point and packed.w_zero_point.data_ptr() != w_zero_point):
        del bound[(a.shape, device_index, launch.stream)]  # storage swapped in place: plan again
        return None
    out = torch.empty(*out_shape, dtype=packed.act_dtype, device=device)
    launch.launch(address, bias_address, out.data_ptr(), packed.k)
    return out


def _gemm_wna16_fake(a, w, w_scale, w_zero_point, bias, w_dtype, n, k, group_size, global_scale, float_zero_point):
    return a.new_empty((*a.shape[:-1], n))


# The packed weight's dequantized() as an op of its own, so that a traced backward (torch.compile,
# AOT autograd) holds it as one node rather than tracing the unpacking's data-dependent steps.
_LIBRARY.define("dequantize_packed(Tensor w, Tensor w_scale, Tensor? w_zero_point, str w_dtype, int n, int k, "
                "int group_size, bool float_zero_point) -> Tensor")


def _dequantize_packed(w, w_scale, w_zero_point, w_dtype, n, k, group_size, float_zero_point):
    """(N, K) in the scales' dtype (the activation dtype): PackedWeight.dequantized()."""
    return PackedWeight(w=w, w_scale=w_scale, w_zero_point=w_zero_point, n=n, k=k, group_size=group_size,
                        w_dtype=w_dtype, act_dtype=w_scale.dtype, format="",
                        float_zero_point=float_zero_point).dequantized().contiguous()


def _dequantize_packed_fake(w, w_scale, w_zero_point, w_dtype, n, k, group_size, float_zero_point):
    return w_scale.new_empty((n, k))


_LIBRARY.impl("dequantize_packed", _dequantize_packed, "CPU")
_LIBRARY.impl("dequantize_packed", _dequantize_packed, "CUDA")
torch.library.register_fake("humming_aot::dequantize_packed", _dequantize_packed_fake, lib=_LIBRARY)


def _gemm_wna16_setup_context(ctx, inputs, output) -> None:
    a, w, w_scale, w_zero_point, bias, w_dtype, n, k, group_size, global_scale, float_zero_point = inputs
    ctx.save_for_backward(w, w_scale, w_zero_point)
    ctx.weight_args = (w_dtype, n, k, group_size, global_scale, float_zero_point)
    ctx.act_dtype, ctx.bias_dtype = a.dtype, None if bias is None else bias.dtype


def _gemm_wna16_backward(ctx, grad: torch.Tensor):
    """Gradients of the activations and the bias (the packed weight is frozen): grad_a = grad @
    W, W the exact weight the forward multiplied with (dequantized(), times the global scale),
    summed in float32 and rounded once. It materializes W (N x K) for the call, as a 16-bit
    layer's backward holds its weight: a correct gradient for adapters over a quantized layer,
    not a fast one."""
    w, w_scale, w_zero_point = ctx.saved_tensors
    w_dtype, n, k, group_size, global_scale, float_zero_point = ctx.weight_args
    rows = grad.reshape(-1, n)
    grad_a = grad_bias = None
    if ctx.needs_input_grad[0]:
        weight = torch.ops.humming_aot.dequantize_packed(w, w_scale, w_zero_point, w_dtype, n, k, group_size,
                                                         float_zero_point).float()
        grad_a = (rows.float() @ weight).mul_(global_scale).to(ctx.act_dtype).reshape(*grad.shape[:-1], k)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[4]:
        grad_bias = rows.float().sum(0).to(ctx.bias_dtype)
    return grad_a, None, None, None, grad_bias, None, None, None, None, None, None


_LIBRARY.impl("gemm_wna16", _gemm_wna16_cpu, "CPU")
_LIBRARY.impl("gemm_wna16", _gemm_wna16_cuda, "CUDA")
torch.library.register_fake("humming_aot::gemm_wna16", _gemm_wna16_fake, lib=_LIBRARY)
torch.library.register_autograd("humming_aot::gemm_wna16", _gemm_wna16_backward,
                                setup_context=_gemm_wna16_setup_context, lib=_LIBRARY)


def gemm(a: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """out = a @ dequant(w)^T (+ bias).

    a:      (..., K) float16 or bfloat16 (the dtype the weight was packed for), unit stride along K
    packed: PackedWeight from humming_aot.pack(), on a's device
    bias:   (N,) in a's dtype, or None
    returns (..., N) in a's dtype

    Differentiable in ``a`` and ``bias`` (the packed weight is frozen): the backward multiplies by
    the forward's exact weight, dequantized for the call (N x K in float32 at its peak), for
    adapters trained over a quantized layer; correct, not fast.

    W8A8: ``a`` a QuantizedActivation (``quantize_activation(x, "float8e4m3:token")``) and ``packed``
    a ``humming_aot.w8a8.PackedW8A8Weight`` run ``humming_aot.w8a8.gemm`` (bfloat16 output, or the
    bias's dtype); the same with a ``humming_aot.w4a8.PackedW4A8Weight`` (W4A8) runs
    ``humming_aot.w4a8.gemm``.
    """
    if (not _is_compiling() and type(a) is torch.Tensor and type(packed) is PackedWeight and a.is_cuda
            and not a.requires_grad and (bias is None or not bias.requires_grad) and _no_torch_modes()):
        # eager on a CUDA device: straight to a bound launch or the launch plan, past the
        # dispatcher (which would add nothing here: no autograd, no mode, no tracing)
        out = _gemm_bound(a, packed, bias, a.get_device())
        if out is not None:
            return out
        if getattr(packed, "layout_version", None) is not None and packed.k_valid is None and packed.n_valid is None:
            out = _gemm_planned(
                a, packed.w, packed.w_scale, packed.w_zero_point, bias, packed.w_dtype, packed.act_dtype, packed.n,
                packed.k, packed.group_size, packed.global_scale, packed.float_zero_point, packed.layout_version,
                _bound_launches(packed),
            )
            if out is not None:
                return out
    from humming_aot import w4a8, w8a8

    for module, name in ((w8a8, "PackedW8A8Weight"), (w4a8, "PackedW4A8Weight")):
        if isinstance(packed, getattr(module, name)):
            if bias is not None and bias.dtype not in (torch.bfloat16, torch.float16):
                raise ValueError(f"a {module.__name__.rsplit('.', 1)[1].upper()} GEMM's bias is bfloat16 or float16 (the "
                                 f"output takes its dtype), got {bias.dtype}")
            return module.gemm(a, packed, bias=bias, out_dtype=torch.bfloat16 if bias is None else bias.dtype)
    _validate(a, packed, bias)
    if packed.padded:
        return _padded(gemm, a, packed, bias)
    return torch.ops.humming_aot.gemm_wna16(
        a, packed.w, packed.w_scale, packed.w_zero_point, bias, packed.w_dtype, packed.n, packed.k,
        packed.group_size, packed.global_scale, packed.float_zero_point,
    )


def _padded(run, a: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None, **kwargs) -> torch.Tensor:
    """A GEMM with a weight pack padded to the kernels' multiple of 64 (PackedWeight.n_valid /
    k_valid): the activations' K padded with zeros (one copy), the bias's N with zeros, and the
    output's padded columns dropped (a view of the kernel's output)."""
    pad_k = packed.k - packed.in_features
    if pad_k:
        a = torch.nn.functional.pad(a, (0, pad_k))
    if bias is not None and packed.n != packed.out_features:
        bias = torch.nn.functional.pad(bias, (0, packed.n - packed.out_features))
    out = run(a, packed.unpadded_view(), bias, **kwargs)
    return out[..., :packed.out_features] if packed.n != packed.out_features else out


def _no_torch_modes() -> bool:
    """Whether no torch function or dispatch mode (FakeTensorMode, make_fx's proxy mode, a
    ``with torch.device(...)`` block, ...) and no functorch transform (vmap, grad) is active: only
    then may ops.gemm skip the dispatcher, whose modes must see the op."""
    return not (_function_mode_enabled() or _dispatch_stack_len() or _functorch_active())


_is_compiling = torch.compiler.is_compiling
_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active


def gemm_with_tile(a: torch.Tensor, packed: PackedWeight, tile: TileConfig | str,
                   bias: torch.Tensor | None = None, splits: int | None = None,
                   stream_k: int | None = None) -> torch.Tensor:
    """gemm with a forced tile (for tuning and benchmarks): the catalog's kernel of that tile, else
    the JIT's (an error naming the kernel when HUMMING_AOT_JIT=0). ``tile`` may be a TileConfig
    or its label ('16x128x64_w1x2_s4', 'wgmma:128x256x64_w1x16_s4'). ``splits`` forces a split-K
    factor; ``stream_k`` (wgmma-ws tiles) the persistent CTAs of the stream-K schedule, 0 for none."""
    from humming_aot import dispatch
    from humming_aot.enumerate import parse_tile_field

    _validate(a, packed, bias)
    if not a.is_cuda:
        raise ValueError("gemm_with_tile: a forced tile only means something on a CUDA device")
    if packed.padded:
        return _padded(gemm_with_tile, a, packed, bias, tile=tile, splits=splits, stream_k=stream_k)
    _validate_cuda(a.reshape(-1, packed.k), packed, bias)
    if isinstance(tile, str):
        tile = parse_tile_field(tile)
    out = dispatch.launch_gemm(a.reshape(-1, packed.k), packed, bias, gemm_spec(packed), tile=tile, splits=splits,
                               stream_k=stream_k)
    return out.reshape(*a.shape[:-1], packed.n)


def effective_weight(packed: PackedWeight, m: int) -> torch.Tensor:
    """(N, K) float64: the weight ``gemm`` multiplies m rows of activations with, on the packed
    weight's device, times its global scale, so that ``a @ W^T`` in float64 is exactly what the
    kernel computes before its fp32 roundings (for tests and error analysis). The kernel the
    dispatcher picks for m decides whether the scales are rounded with the weights
    (``KernelKey.scales_in_fp32``); the CPU path rounds them."""
    if packed.device.type != "cuda":
        return packed.effective_weight()
    from humming_aot import dispatch
    from humming_aot import obtain as kernel_obtain

    device_index = packed.device.index if packed.device.index is not None else torch.cuda.current_device()
    # the key dispatch.obtain would load for this problem, without loading (or compiling) it
    key = kernel_obtain.select_key(gemm_spec(packed), dispatch.device_info(device_index), m, k=packed.k,
                                   group=packed.group_size, n=packed.n)
    return packed.effective_weight(scales_in_fp32=key.scales_in_fp32)


def quantize_activation(a: torch.Tensor, fmt, *, static_scale: torch.Tensor | float | None = None,
                        global_scale: torch.Tensor | float | None = None):
    """Quantize activations ``a`` ((*lead, K), floating) by ``fmt`` (an ActivationFormat or its string,
    e.g. "float8e4m3:token", "int8:token", "float8e4m3:g128", "float8e4m3:tensor") -> a
    humming_aot.quant.QuantizedActivation (uint8 codes of a's shape, float32 scales).

    On a GPU the recipes humming_aot.quant.cuda_quant takes run as one kernel (two for a dynamic
    per-tensor scale), with no host round trip when ``static_scale`` is a tensor or absent (CUDA-
    graph capturable); their codes and scales are the reference's bit for bit, but non-finite
    activations are not refused there (their codes are unspecified). Everything else (the CPU,
    other elements and scale dtypes, NVFP4 / MXFP4, HUMMING_AOT_HELPERS=0) runs the exact reference,
    humming_aot.quant.activation. ``static_scale``: a per-tensor recipe's calibrated scale (a float or
    a one-element tensor); ``global_scale``: a two-level (float8e4m3-scaled) recipe's second level.
    A torch custom op (humming_aot::quantize_activation, with a fake implementation) under
    torch.compile and torch's modes.
    """
    from humming_aot.quant import ActivationFormat, QuantizedActivation

    fmt = ActivationFormat.parse(fmt)
    if not torch.compiler.is_compiling() and _no_torch_modes():
        return _quantize_activation(a, fmt, static_scale, global_scale)

    def as_tensor(value):
        return value if value is None or isinstance(value, torch.Tensor) else torch.tensor(float(value))

    codes, scales, glob = torch.ops.humming_aot.quantize_activation(a, str(fmt), as_tensor(static_scale),
                                                                      as_tensor(global_scale))
    return QuantizedActivation(element=fmt.element, granularity=fmt.granularity, group_size=fmt.group_size,
                               scale_dtype=fmt.scale_dtype, codes=codes, scales=scales,
                               global_scale=glob if fmt.has_global_scale else None)


def _quantize_activation(a, fmt, static_scale, global_scale):
    """ops.quantize_activation's work: the kernels where they apply, else the reference."""
    from humming_aot.quant.activation import ActivationGranularity, _as_scale

    if isinstance(a, torch.Tensor) and a.is_cuda and a.is_floating_point():
        from humming_aot.quant import cuda_quant

        def as_scale(value, name):
            if torch.cuda.is_current_stream_capturing() and isinstance(value, torch.Tensor):
                # no read-back while capturing: the tensor is the caller's to keep positive and finite
                return value.to(device=a.device, dtype=torch.float32).reshape(())
            return _as_scale(value, name, a.device)

        scale = glob = None
        if static_scale is not None and fmt.granularity is ActivationGranularity.TENSOR:
            scale = as_scale(static_scale, "static_scale")
        if global_scale is not None and fmt.has_global_scale:
            glob = as_scale(global_scale, "global_scale")
        if (static_scale is None or scale is not None) and (global_scale is None or glob is not None):
            out = cuda_quant.quantize(a, fmt, scale, glob)
            if out is not None:
                return out
    return fmt.quantize(a, static_scale=static_scale, global_scale=global_scale)


_LIBRARY.define(
    "quantize_activation(Tensor a, str fmt, Tensor? static_scale, Tensor? global_scale) -> (Tensor, Tensor, Tensor)"
)


def _quantize_activation_op(a, fmt, static_scale, global_scale):
    from humming_aot.quant import ActivationFormat

    q = _quantize_activation(a, ActivationFormat.parse(fmt), static_scale, global_scale)
    glob = q.global_scale.clone() if q.global_scale is not None else torch.ones((), device=a.device)
    return q.codes, q.scales, glob  # a format without a global scale returns 1.0 there


def _quantize_activation_fake(a, fmt, static_scale, global_scale):
    from humming_aot.quant import ActivationFormat
    from humming_aot.quant.activation import _scale_shape

    fmt = ActivationFormat.parse(fmt)
    return (a.new_empty(a.shape, dtype=torch.uint8),
            a.new_empty(_scale_shape(fmt.granularity, fmt.group_size, tuple(a.shape)), dtype=torch.float32),
            a.new_empty((), dtype=torch.float32))


_LIBRARY.impl("quantize_activation", _quantize_activation_op, "CPU")
_LIBRARY.impl("quantize_activation", _quantize_activation_op, "CUDA")
torch.library.register_fake("humming_aot::quantize_activation", _quantize_activation_fake, lib=_LIBRARY)


__all__ = ["effective_weight", "gemm", "gemm_spec", "gemm_with_tile", "quantize_activation", "ZeroPoint", "unpack"]
