"""nn.Module front end: QuantizedLinear (a drop-in for nn.Linear with a quantized weight),
W8A8Linear (the same with 8- or 4-bit activations quantized on the way in: humming_aot.w8a8_layer)
and QuantizedMoE (a mixture-of-experts MLP with quantized experts)."""
from __future__ import annotations

import torch

from humming_aot import ops
from humming_aot.packed_buffers import PackedBuffersModule
from humming_aot.packed_layout import check_layout_version
from humming_aot.packing import PackedWeight, pack
from humming_aot.spec import code_bits
from humming_aot.w8a8_layer import W8A8Linear


class QuantizedLinear(PackedBuffersModule):
    """y = x @ dequant(W)^T (+ b) with W packed once for the kernels.

    The packed tensors are registered as buffers, so ``.to(device)`` moves them and
    ``state_dict()`` holds them, with the packed layout's version (``packed_layout_version``, an
    int32 scalar, so that tensor-only formats such as safetensors can hold it): ``load_state_dict``
    refuses packed tensors of another layout version before loading any. A cast of the module
    (``model.half()``, ``.to(torch.float32)``) moves them without changing their dtype: the kernels
    read scales, zero points, bias and input scale in the activation dtype the weight was packed for
    (``act_dtype``), so the layer keeps taking inputs of that dtype.
    """

    _PACKED = ("w", "w_scale", "w_zero_point", "bias", "input_scale")

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features = packed.in_features
        self.out_features = packed.out_features
        self._meta = {
            "n": packed.n, "k": packed.k, "group_size": packed.group_size, "w_dtype": packed.w_dtype,
            "act_dtype": packed.act_dtype, "format": packed.format, "global_scale": packed.global_scale,
            "float_zero_point": packed.float_zero_point, "layout_version": packed.layout_version,
            "n_valid": packed.n_valid, "k_valid": packed.k_valid,
        }
        self.register_buffer("w", packed.w)
        self.register_buffer("w_scale", packed.w_scale)
        self.register_buffer("w_zero_point", packed.w_zero_point)
        self.register_buffer("bias", None if bias is None else bias.to(packed.act_dtype))
        # set by from_checkpoint: GPTQ act-order gathers K, ModelOpt INT4_AWQ scales it
        self.register_buffer("input_perm", None)
        self.register_buffer("input_scale", None)
        self.register_buffer("packed_layout_version",
                             torch.tensor(packed.layout_version, dtype=torch.int32, device=packed.w.device))

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: str, act_dtype: torch.dtype | None = None,
                    activations: str | None = None) -> "QuantizedLinear | W8A8Linear":
        """Quantize an nn.Linear's weight with `fmt` (e.g. "int4:g128") and pack it.

        act_dtype defaults to the linear's dtype when it is float16 or bfloat16, else bfloat16.
        ``activations``: an ActivationFormat ("float8e4m3:token", "float8e4m3:g128", "int8:token",
        "int4:token", "nvfp4", "mxfp4") to quantize the inputs with: a W8A8Linear (float8e4m3 or int8
        weights of the same element; int4 weights with float8e4m3 or int8 activations, or "mxfp4"
        ones with float8e4m3: W4A8; "int4:channel" weights with int4 activations: W4A4; "nvfp4"
        weights with "nvfp4" activations, "mxfp4" with "mxfp4": FP4 W4A4, sm120a / sm121a).
        """
        from humming_aot.quant import quantize

        if activations is not None:
            if act_dtype is not None:
                raise ValueError("from_linear: act_dtype chooses the 16-bit activations' dtype; with activations= the "
                                 "W8A8 layer quantizes its input and answers in the input's dtype: leave it None")
            return W8A8Linear.from_linear(linear, fmt, activations)
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear: expected torch.nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        if act_dtype is None:
            act_dtype = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        packed = pack(quantize(weight.float(), fmt), act_dtype=act_dtype)
        bias = None if linear.bias is None else linear.bias.detach().to(act_dtype)
        return cls(packed, bias)

    @classmethod
    def from_checkpoint(cls, model_dir, prefix: str, act_dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None,
                        activations: str | None = None) -> "QuantizedLinear | W8A8Linear":
        """The layer ``prefix`` of a published quantized checkpoint (GPTQ, AWQ, compressed-tensors,
        fp8, ModelOpt, auto-round, HQQ; see humming_aot.checkpoints), packed for the kernels.

        act_dtype defaults to the checkpoint's scale dtype when that is float16 or bfloat16 (so the
        scales reach the kernel unrounded; GPTQ and AWQ store float16), else bfloat16. GPTQ act-order
        layers gather their activations with ``input_perm`` before the GEMM (one index_select over
        M x K elements; measured on an H200 it adds 6-8 us per call at M = 1 and 8-39 % at
        M = 1024, docs/CHECKPOINTS.md); ModelOpt INT4_AWQ layers multiply them by ``input_scale``
        (pre_quant_scale).

        ``activations``: None runs 16-bit activations whatever the checkpoint calibrated them for;
        "checkpoint" quantizes them as its producer did (compressed-tensors ``input_activations``,
        fp8 ``activation_scheme``, ModelOpt FP8: ``CheckpointLayer.activations``, a static
        per-tensor scale included) and returns a W8A8Linear; an ActivationFormat string
        ("float8e4m3:token") quantizes them that way, dynamically. A W8A8Linear's output takes its
        input's dtype, so act_dtype must be left None with activations."""
        from humming_aot.checkpoints import load_layer

        layer = load_layer(model_dir, prefix)
        if activations is not None:
            if act_dtype is not None:
                raise ValueError("from_checkpoint: act_dtype chooses the 16-bit activations' dtype; with activations= "
                                 "the W8A8 layer quantizes its input and answers in the input's dtype: leave it None")
            return W8A8Linear.from_checkpoint_layer(layer, activations, device)
        if layer.weight.codes.dim() != 2:
            raise ValueError(f"from_checkpoint: {prefix!r} is a stacked MoE weight of shape {layer.weight.shape}; "
                             "QuantizedLinear holds one (N, K) weight: load the layer's experts with "
                             "QuantizedMoE.from_checkpoint(model_dir, <the prefix before .gate_up_proj / .down_proj>)")
        if act_dtype is None:
            act_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(layer.weight.format.scale_dtype,
                                                                                  torch.bfloat16)
        weight = layer.weight if device is None else layer.weight.to(device)
        packed = pack(weight, act_dtype=act_dtype)
        bias = None if layer.bias is None else layer.bias.to(device=packed.w.device, dtype=act_dtype)
        module = cls(packed, bias)
        if layer.input_perm is not None:
            module.input_perm = layer.input_perm.to(packed.w.device)
        if layer.input_scale is not None:
            module.input_scale = layer.input_scale.to(device=packed.w.device, dtype=act_dtype)
        return module

    @property
    def packed(self) -> PackedWeight:
        m = self._meta
        return PackedWeight(
            w=self.w, w_scale=self.w_scale, w_zero_point=self.w_zero_point, n=m["n"], k=m["k"],
            group_size=m["group_size"], w_dtype=m["w_dtype"], act_dtype=m["act_dtype"], format=m["format"],
            global_scale=m["global_scale"], float_zero_point=m["float_zero_point"],
            layout_version=m["layout_version"], n_valid=m["n_valid"], k_valid=m["k_valid"],
        )

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # the layout version is checked before any tensor is copied
        key = prefix + "packed_layout_version"
        saved = state_dict.get(key)
        version = int(saved) if isinstance(saved, torch.Tensor) and saved.numel() == 1 else None
        what = f"the state dict of QuantizedLinear {prefix.rstrip('.') or '(root)'} ({self._meta['format']})"
        check_layout_version(version, code_bits(self._meta["w_dtype"]), what)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if saved is None and key in missing_keys:
            missing_keys.remove(key)  # saved before versions were recorded: accepted where the layout is unchanged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buffers = self._buffers
        if buffers.get("input_perm") is not None:  # GPTQ act-order: K was sorted by group at load time
            x = x.index_select(-1, buffers["input_perm"])
        if buffers.get("input_scale") is not None:  # ModelOpt INT4_AWQ pre_quant_scale
            x = (x * buffers["input_scale"]).contiguous()
        # One PackedWeight per set of buffers, made again only when a buffer was replaced
        # (.to(), .cuda(), assignment); load_state_dict copies into the same tensors.
        packed = self.__dict__.get("_packed")
        if (packed is None or packed.w is not buffers["w"] or packed.w_scale is not buffers["w_scale"]
                or packed.w_zero_point is not buffers["w_zero_point"]):
            packed = self.packed
            self.__dict__["_packed"] = packed
        return ops.gemm(x, packed, buffers["bias"])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self._meta['format']!r}"


_MOE_ACTIVATIONS = ("silu", "swiglu_oai")


class QuantizedMoE(torch.nn.Module):
    """A mixture-of-experts MLP with quantized experts: each token's top_k experts compute
    down(act(gate_up(x) + b1) ) + b2, and their outputs, times the routing weights, are summed.

    gate_up: PackedExperts (E, 2 I, H); down: PackedExperts (E, H, I) (humming_aot.moe.pack_experts)
    activation: "silu" (gate and up halves: silu(gate) * up, the Llama / DeepSeek / Qwen MLP) or
                "swiglu_oai" (gpt-oss: gate and up interleaved, clamped, alpha 1.702)
    gate_up_bias (E, 2 I), down_bias (E, H): optional, in the activation dtype (gpt-oss has them)

    forward(hidden (..., H), topk_ids (M, top_k), topk_weights (M, top_k)) -> (..., H), M the
    tokens of hidden. On a GPU of compute capability 8.0 or newer the experts run as the grouped
    kernels (humming_aot.moe.gemm_grouped_kernel on the routing's prefix offsets, no alignment),
    with the routing, permute, activation and combine of the helper kernels: no host round trip
    (capturable in a CUDA graph). Elsewhere, or with ``use_grouped_kernels = False``, they run in
    the grouped contiguous layout as a loop of dense GEMMs, one per expert with tokens
    (humming_aot.moe.expert_loop): correct on every device, with one host round trip per layer.
    ``use_grouped_kernels`` None (the default) chooses by the device; True or False forces. The
    grouped-kernel forward does not read the ids back to check them (that would stall every eager
    call): an expert id outside [0, E) there adds nothing for its slot (expert parallelism's -1),
    where the expert loop raises a ValueError naming the range.
    """

    def __init__(self, gate_up, down, activation: str = "silu", gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None):
        super().__init__()
        if activation not in _MOE_ACTIVATIONS:
            raise ValueError(f"QuantizedMoE: activation {activation!r} is not one of {', '.join(_MOE_ACTIVATIONS)}")
        gu_n, gu_k, down_n, down_k = gate_up.out_features, gate_up.in_features, down.out_features, down.in_features
        if gate_up.experts != down.experts or gu_n != 2 * down_k or down_n != gu_k:
            raise ValueError(
                f"QuantizedMoE: gate_up must be (E, 2 I, H) and down (E, H, I) of the same E, got gate_up "
                f"({gate_up.experts}, {gu_n}, {gu_k}) and down ({down.experts}, {down_n}, {down_k})"
            )
        if gate_up.act_dtype != down.act_dtype or gate_up.device != down.device:
            raise ValueError("QuantizedMoE: gate_up and down must be packed for one activation dtype on one device")
        self.activation = activation
        self.use_grouped_kernels: bool | None = None
        self.num_experts, self.hidden_size, self.intermediate_size = gate_up.experts, gu_k, down_k
        # the packed experts as buffers (they move with .to() and are in the state dict), with
        # what is not a tensor kept beside them
        self._moe_meta = {}
        for name, packed in (("gate_up", gate_up), ("down", down)):
            self._moe_meta[name] = {
                "experts": packed.experts, "n": packed.n, "k": packed.k, "group_size": packed.group_size,
                "w_dtype": packed.w_dtype, "act_dtype": packed.act_dtype, "format": packed.format,
                "float_zero_point": packed.float_zero_point, "layout_version": packed.layout_version,
                "n_valid": packed.n_valid, "k_valid": packed.k_valid,
            }
            self.register_buffer(f"{name}_w", packed.w)
            self.register_buffer(f"{name}_scale", packed.w_scale)
            self.register_buffer(f"{name}_zero_point", packed.w_zero_point)
            self.register_buffer(f"{name}_global_scale", packed.global_scale_tensor)
        for name, bias, n in (("gate_up_bias", gate_up_bias, gu_n), ("down_bias", down_bias, down_n)):
            if bias is not None and bias.shape != (gate_up.experts, n):
                raise ValueError(f"QuantizedMoE: {name} must be ({gate_up.experts}, {n}), got {tuple(bias.shape)}")
            self.register_buffer(name, None if bias is None else bias.to(device=gate_up.device,
                                                                           dtype=gate_up.act_dtype))

    def _packed(self, name: str):
        """The PackedExperts of `name` over the current buffers, made again only when one was
        replaced (.to(), load_state_dict into new tensors, assignment)."""
        from humming_aot.moe import PackedExperts

        buffers = self._buffers
        parts = tuple(buffers[f"{name}_{part}"] for part in ("w", "scale", "zero_point", "global_scale"))
        cached = self.__dict__.get(f"_{name}_packed")
        if cached is not None and all(x is y for x, y in zip(cached[0], parts)):
            return cached[1]
        meta = self._moe_meta[name]
        w, scale, zero_point, global_scale = parts
        if scale.dtype != meta["act_dtype"] or w.dtype != torch.int32:
            raise ValueError(f"QuantizedMoE: the {name} experts were packed for {meta['act_dtype']} activations, but "
                             f"their scales are now {scale.dtype}: pack them again (humming_aot.moe.pack_experts) "
                             "instead of casting the module")
        packed = PackedExperts(w=w, w_scale=scale, w_zero_point=zero_point,
                               global_scales=tuple(float(x) for x in global_scale.tolist()),
                               global_scale_tensor=global_scale, **meta)
        self.__dict__[f"_{name}_packed"] = (parts, packed)
        return packed

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        # the buffers were copied into in place: the host copy of the global scales is stale
        self.__dict__.pop("_gate_up_packed", None)
        self.__dict__.pop("_down_packed", None)

    @property
    def gate_up(self):
        return self._packed("gate_up")

    @property
    def down(self):
        return self._packed("down")

    @classmethod
    def from_experts(cls, gate_up, down, fmt: str | None = None, act_dtype: torch.dtype = torch.bfloat16,
                     activation: str = "silu", gate_up_bias: torch.Tensor | None = None,
                     down_bias: torch.Tensor | None = None, activations: str | None = None):
        """From stacked expert weights: QuantizedWeight (E, N, K) each (a checkpoint's, e.g. gpt-oss
        MXFP4 experts), or float tensors (E, N, K) quantized with `fmt` (e.g. "int4:g128"), packed
        on the weights' device (move the module with .to()). ``activations`` ("float8e4m3:token",
        "int8:token", "float8e4m3:g128" for 128 x 128 block-scaled float8 experts): the experts
        take 8-bit activations quantized on the way in, a humming_aot.moe.layer_a8.A8MoE (W4A8:
        int4, uint4 with zero points or MXFP4 experts; W8A8: float8 or int8 ones), whose hidden
        states and output are act_dtype."""
        from humming_aot.moe import pack_experts
        from humming_aot.moe.packing import quantized_experts

        if activations is not None:
            from humming_aot.moe.layer_a8 import A8MoE

            return A8MoE.from_experts(gate_up, down, activations, fmt, activation, gate_up_bias, down_bias,
                                      out_dtype=act_dtype)

        weights = [pack_experts(w, act_dtype=act_dtype)
                   for w in quantized_experts((("gate_up", gate_up), ("down", down)), fmt, "QuantizedMoE.from_experts")]
        return cls(weights[0], weights[1], activation, gate_up_bias, down_bias)

    @classmethod
    def from_checkpoint(cls, model_dir, prefix: str, act_dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None, activation: str | None = None,
                        activations: str | None = None):
        """The MoE experts under ``prefix`` (e.g. ``model.layers.3.mlp.experts``) of a published
        quantized checkpoint, packed for the kernels. Two layouts:

        - stacked (gpt-oss): ``<prefix>.gate_up_proj`` (E, 2 I, H) and ``<prefix>.down_proj`` (E, H,
          I), with their biases where it has them;
        - one layer per expert (DeepSeek, Qwen, Mixtral as exported by GPTQ, AWQ, compressed-tensors,
          fp8 and the other loaders of humming_aot.checkpoints): ``<prefix>.<e>.gate_proj``,
          ``up_proj`` and ``down_proj`` for e = 0, 1, ...; gate and up are fused as the gate_up
          rows (gate first, the "silu" layout).

        activation defaults to gpt-oss's "swiglu_oai" (gate and up interleaved) for stacked mxfp4
        experts, else "silu"; act_dtype to the scales' dtype where that is float16 or bfloat16,
        else bfloat16.

        ``activations``: None runs 16-bit activations (this class); "checkpoint" quantizes them as
        the producer calibrated them (DeepSeek-V3's fp8: float8e4m3 per token and 128 of K; a
        static per-tensor scheme with each GEMM's largest input_scale over its experts) and an
        ActivationFormat string ("float8e4m3:token") quantizes them that way, dynamically: either
        returns a humming_aot.moe.layer_a8.A8MoE (W8A8 for float8e4m3 / int8 experts, W4A8 for
        int4, uint4 and MXFP4 ones) whose hidden states and output are act_dtype (default
        bfloat16)."""
        from humming_aot import checkpoints
        from humming_aot.moe import pack_experts

        layers = checkpoints.quantized_layers(model_dir)
        if f"{prefix}.gate_up_proj" in layers:
            gate_up, down = (_stacked_layer(model_dir, f"{prefix}.{name}") for name in ("gate_up_proj", "down_proj"))
            default_activation = "swiglu_oai" if gate_up.schema == "mxfp4" else "silu"
        else:
            gate_up, down = _per_expert_layers(model_dir, prefix, set(layers))
            default_activation = "silu"
        activation = activation or default_activation
        if activations is not None:
            return _a8_moe(gate_up, down, prefix, activations, activation, act_dtype or torch.bfloat16, device)
        if act_dtype is None:
            act_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(
                gate_up.weight.format.scale_dtype, torch.bfloat16)
        packed, biases = [], []
        for layer in (gate_up, down):
            weight = layer.weight if device is None else layer.weight.to(device)
            packed.append(pack_experts(weight, act_dtype=act_dtype))
            biases.append(None if layer.bias is None else layer.bias.to(device=packed[-1].device, dtype=act_dtype))
        return cls(packed[0], packed[1], activation, biases[0], biases[1])

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        from humming_aot import moe

        act_dtype = self._packed("gate_up").act_dtype  # (refuses experts whose buffers a cast changed)
        if not isinstance(hidden, torch.Tensor) or hidden.dim() < 1 or hidden.shape[-1] != self.hidden_size \
                or hidden.dtype != act_dtype:
            got = f"{tuple(hidden.shape)} {hidden.dtype}" if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise ValueError(f"QuantizedMoE: hidden must be (..., {self.hidden_size}) {act_dtype} (the experts were "
                             f"packed for {act_dtype} activations), got {got}")
        if not isinstance(topk_ids, torch.Tensor) or not isinstance(topk_weights, torch.Tensor):
            raise ValueError(f"QuantizedMoE: topk_ids and topk_weights must be tensors, got "
                             f"{type(topk_ids).__name__} and {type(topk_weights).__name__}")
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        if topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"QuantizedMoE: topk_ids and topk_weights must be ({x.shape[0]}, top_k) for "
                             f"{x.shape[0]} tokens, got {tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
        grouped = self.use_grouped_kernels
        if grouped is None:  # the MoE schedules wrap the mma.sync bodies of sm_80 and newer
            grouped = x.is_cuda and torch.cuda.get_device_capability(x.device) >= (8, 0)
        if grouped and x.is_cuda:
            return self._forward_grouped_kernels(x, topk_ids, topk_weights).reshape(*shape[:-1], self.hidden_size)
        routing = moe.group_rows(topk_ids, self.num_experts)
        rows = moe.permute(x, routing)
        h = moe.gemm_grouped(rows, self.gate_up, offsets=routing.offsets, bias=self.gate_up_bias)
        h = moe.silu_and_mul(h) if self.activation == "silu" else moe.swiglu_oai(h)
        y = moe.gemm_grouped(h, self.down, offsets=routing.offsets, bias=self.down_bias)
        return moe.combine(y, routing, topk_weights).reshape(*shape[:-1], self.hidden_size)

    def _forward_grouped_kernels(self, x: torch.Tensor, topk_ids: torch.Tensor,
                                 topk_weights: torch.Tensor) -> torch.Tensor:
        """The forward on the grouped kernels' offsets form: the routed rows grouped expert after
        expert (moe.group_rows: every row belongs to an expert, so the outputs need no zero-fill),
        both GEMMs on the prefix offsets, with no alignment."""
        from humming_aot import moe

        slots = x.shape[0] * topk_ids.shape[1]
        expected = max(1, -(-slots // self.num_experts))
        routing = moe.group_rows(topk_ids, self.num_experts, check_range=False)  # no host round trip
        offsets = routing.offsets_int32
        rows = moe.permute(x, routing)
        h = moe.gemm_grouped_kernel(rows, self.gate_up, offsets=offsets, expected_m=expected, bias=self.gate_up_bias,
                                    out=rows.new_empty(slots, self.gate_up.out_features))
        h = moe.silu_and_mul(h) if self.activation == "silu" else moe.swiglu_oai(h)
        y = moe.gemm_grouped_kernel(h, self.down, offsets=offsets, expected_m=expected, bias=self.down_bias,
                                    out=h.new_empty(slots, self.down.out_features))
        return moe.combine(y, routing, topk_weights)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"format={self.gate_up.format!r}, activation={self.activation!r}")


def _a8_moe(gate_up, down, prefix: str, activations: str, activation: str, out_dtype: torch.dtype, device):
    """QuantizedMoE.from_checkpoint's A8MoE: the two stacked CheckpointLayers on the 8-bit-activation
    MoE GEMMs, their inputs quantized by `activations` ("checkpoint": the producer's scheme)."""
    from humming_aot.moe.layer_a8 import A8MoE

    where = f"QuantizedMoE.from_checkpoint: {prefix}"
    static = None
    if activations == "checkpoint":
        schemes = (gate_up.activations, down.activations)
        if any(scheme is None for scheme in schemes):
            raise ValueError(f"{where} ({gate_up.schema}, {gate_up.weight.format}) quantizes no activations: the "
                             "checkpoint is weight-only; leave activations None for 16-bit activations, or name a "
                             "format such as 'float8e4m3:token'")
        if any(scheme.format is None for scheme in schemes) or schemes[0].format != schemes[1].format:
            raise ValueError(f"{where}: the checkpoint quantizes the experts' inputs as "
                             f"{' and '.join(scheme.description for scheme in schemes)}, which the MoE GEMMs do not "
                             "take (one 8-bit format for both); leave activations None for 16-bit activations, or "
                             "name a format such as 'float8e4m3:token'")
        activations = schemes[0].format
        if schemes[0].static_scale is not None:
            static = tuple(float(scheme.static_scale) for scheme in schemes)
        elif activations.endswith(":tensor"):
            raise ValueError(f"{where}: the checkpoint quantizes the experts' inputs per tensor, dynamically; the MoE "
                             "GEMMs take per-tensor activations with static scales only: name a format such as "
                             "'float8e4m3:token' (dynamic, per token)")
    weights, biases = [], []
    for layer in (gate_up, down):
        weights.append(layer.weight if device is None else layer.weight.to(device))
        biases.append(None if layer.bias is None else layer.bias.to(device=weights[-1].codes.device, dtype=out_dtype))
    try:
        module = A8MoE.from_experts(weights[0], weights[1], activations, None, activation, biases[0], biases[1],
                                    out_dtype=out_dtype)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if static is not None:
        module.set_static_scales(*static)
    return module


def _stacked_layer(model_dir, prefix: str):
    """A checkpoint layer of stacked experts (E, N, K), or a ValueError naming what it is instead."""
    from humming_aot import checkpoints

    layer = checkpoints.load_layer(model_dir, prefix)
    if layer.weight.codes.dim() != 3:
        raise ValueError(f"QuantizedMoE.from_checkpoint: {prefix} is a dense weight of shape "
                         f"{tuple(layer.weight.shape)}, not stacked experts (E, N, K): load it with "
                         "QuantizedLinear.from_checkpoint")
    return layer


def _per_expert_layers(model_dir, prefix: str, layers: set[str]):
    """(gate_up, down) CheckpointLayers of stacked experts from one layer per expert: gate and up
    fused per expert (gate rows first), then the experts stacked."""
    from humming_aot import checkpoints
    from humming_aot.checkpoints.layer import CheckpointLayer

    count = 0
    while f"{prefix}.{count}.gate_proj" in layers:
        count += 1
    if count == 0:
        raise ValueError(
            f"QuantizedMoE.from_checkpoint: {model_dir} has neither {prefix}.gate_up_proj (stacked experts) nor "
            f"{prefix}.0.gate_proj (one layer per expert) among its quantized layers: give the prefix of the "
            "experts, e.g. model.layers.3.mlp.experts (`humming-aot inspect` lists the layers)")
    gate_ups, downs = [], []
    for e in range(count):
        fused = checkpoints.load_fused(model_dir, [f"{prefix}.{e}.gate_proj", f"{prefix}.{e}.up_proj"])
        down = checkpoints.load_layer(model_dir, f"{prefix}.{e}.down_proj")
        for layer in (fused, down):
            if layer.input_perm is not None or layer.input_scale is not None:
                step = ("gathers its activations (act-order)" if layer.input_perm is not None
                        else "scales its activations (pre_quant_scale)")
                raise ValueError(f"QuantizedMoE.from_checkpoint: expert {e} of {prefix} {step}, which differs per "
                                 "expert and so has no grouped GEMM: re-export the checkpoint without it")
        gate_ups.append(fused)
        downs.append(down)
    from humming_aot.checkpoints.fused import _fused_activations

    # the experts' common activation scheme (static per-tensor scales: their largest, which clips none)
    return tuple(CheckpointLayer(prefix=f"{prefix}.*.{name}", schema=layers_[0].schema,
                                 weight=_stack_weights([x.weight for x in layers_], f"{prefix}.*.{name}"),
                                 bias=_stack_biases([x.bias for x in layers_], f"{prefix}.*.{name}"),
                                 activations=_fused_activations(layers_, f"{prefix}.*.{name}"))
                 for name, layers_ in (("gate_up_proj", gate_ups), ("down_proj", downs)))


def _stack_weights(weights, what: str):
    """Stacked (E, N, K) QuantizedWeight of the experts' (N, K) ones (one format and shape)."""
    from humming_aot.quant import QuantizedWeight

    first = weights[0]
    for e, w in enumerate(weights):
        if str(w.format) != str(first.format) or w.shape != first.shape:
            raise ValueError(f"QuantizedMoE.from_checkpoint: {what}: expert {e} is {w.format} {w.shape}, expert 0 "
                             f"{first.format} {first.shape}: the experts must share one format and shape")

    def stack(parts):
        return None if parts[0] is None else torch.stack(parts)

    return QuantizedWeight(format=first.format, codes=stack([w.codes for w in weights]),
                           scales=stack([w.scales for w in weights]),
                           zero_points=stack([w.zero_points for w in weights]),
                           global_scale=stack([w.global_scale for w in weights]))


def _stack_biases(biases, what: str):
    if all(b is None for b in biases):
        return None
    if any(b is None for b in biases):
        raise ValueError(f"QuantizedMoE.from_checkpoint: {what}: some experts have a bias and some not")
    return torch.stack(biases)
