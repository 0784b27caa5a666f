"""``A8MoE``: the mixture-of-experts MLP of ``humming_aot.nn.QuantizedMoE`` with experts for 8-bit
activations quantized on the way in (``QuantizedMoE.from_experts(..., activations=...)``): W4A8
(int4, uint4 with zero points or MXFP4 experts x "float8e4m3:token" or "int8:token") or W8A8
("float8e4m3:channel" experts x "float8e4m3:token", DeepSeek-V3's "float8e4m3:b128x128" x
"float8e4m3:g128", "int8:channel" x "int8:token").

forward(hidden, topk_ids, topk_weights): the hidden states are quantized once per token (codes and
a scale per row), the routed rows gathered expert after expert with their scales (moe.group_rows,
no alignment), GEMM1 on the prefix offsets (moe.gemm_grouped_a8_kernel), the activation between
the GEMMs in the output dtype, its rows quantized again, GEMM2, and the weighted combine. On a CUDA
GPU every step is a kernel with no host round trip (capturable in a CUDA graph); elsewhere the
GEMMs are the loops of moe.gemm_grouped_a8 (the float64 reference of each expert's operands).
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot.moe.a8 import PackedW4A8Experts, PackedW8A8Experts
from humming_aot.packed_buffers import PackedBuffersModule
from humming_aot.quant import ActivationGranularity

_ACTIVATIONS = ("silu", "swiglu_oai")
_OUT_DTYPES = (torch.bfloat16, torch.float16)


class A8MoE(PackedBuffersModule):
    """A MoE MLP of experts for 8-bit activations: gate_up (E, 2 I, H) and down (E, H, I), both
    PackedW4A8Experts or both PackedW8A8Experts, of one device; the activation format (an
    ActivationFormat string the experts take: "float8e4m3:token", "int8:token", either per tensor
    with static scales, "float8e4m3:g128" for block-scaled W8A8); the MLP's activation ("silu" or
    "swiglu_oai") and optional biases (E, 2 I) and (E, H) in out_dtype, the dtype of the hidden
    states and output."""

    def __init__(self, gate_up, down, activations: str,
                 activation: str = "silu", gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        from humming_aot.quant import ActivationFormat

        if activation not in _ACTIVATIONS:
            raise ValueError(f"A8MoE: activation {activation!r} is not one of {', '.join(_ACTIVATIONS)}")
        if out_dtype not in _OUT_DTYPES:
            raise ValueError(f"A8MoE: out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
        kind = type(gate_up)
        if kind not in (PackedW4A8Experts, PackedW8A8Experts) or type(down) is not kind:
            raise TypeError(f"A8MoE: gate_up and down must both be PackedW4A8Experts or both PackedW8A8Experts "
                            f"(humming_aot.moe.pack_a8_experts), got {type(gate_up).__name__} and "
                            f"{type(down).__name__}")
        gu_n, gu_k, down_n, down_k = gate_up.out_features, gate_up.in_features, down.out_features, down.in_features
        if gate_up.experts != down.experts or gu_n != 2 * down_k or down_n != gu_k:
            raise ValueError(f"A8MoE: gate_up must be (E, 2 I, H) and down (E, H, I) of the same E, got gate_up "
                             f"({gate_up.experts}, {gu_n}, {gu_k}) and down ({down.experts}, {down_n}, {down_k})")
        if gate_up.device != down.device:
            raise ValueError(f"A8MoE: gate_up is on {gate_up.device}, down on {down.device}: pack them on one device")
        fmt = ActivationFormat.parse(activations) if isinstance(activations, str) else activations
        if not isinstance(fmt, ActivationFormat) or fmt.element not in ("float8e4m3", "int8"):
            raise ValueError(f"A8MoE: activations {activations!r}: the experts take 8-bit activations "
                             "('float8e4m3:token', 'int8:token', ...)")
        self._kind = kind
        self.activations = str(fmt)
        # the pairing's own checks (element, granularity, scales) on one row of zeros
        from humming_aot import ops
        from humming_aot.moe.a8 import _dense

        static = {"static_scale": 1.0} if fmt.granularity is ActivationGranularity.TENSOR else {}
        for packed in (gate_up, down):  # (GEMM2's input is the intermediate: its K must take the format too)
            try:
                probe = ops.quantize_activation(torch.zeros(1, packed.in_features, device=packed.device), fmt,
                                                **static)
                _dense(packed)._check_activation(probe, packed.expert(0))
            except ValueError as error:
                raise ValueError(f"A8MoE: activations {activations!r} do not suit the {packed.format} experts "
                                 f"(K = {packed.in_features}): {error}") from None
        self.activation, self.out_dtype = activation, out_dtype
        self.num_experts, self.hidden_size, self.intermediate_size = gate_up.experts, gu_k, down_k
        self._meta = {}
        for name, packed in (("gate_up", gate_up), ("down", down)):
            self._meta[name] = {field.name: getattr(packed, field.name) for field in dataclasses.fields(packed)
                                if field.name not in ("w", "w_scale", "global_scale_tensor")}
            self.register_buffer(f"{name}_w", packed.w)
            self.register_buffer(f"{name}_scale", packed.w_scale)
            self.register_buffer(f"{name}_global_scale", packed.global_scale_tensor)
        for name, bias, n in (("gate_up_bias", gate_up_bias, gu_n), ("down_bias", down_bias, down_n)):
            if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (gate_up.experts, n)):
                raise ValueError(f"A8MoE: {name} must be ({gate_up.experts}, {n}), got "
                                 f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
            self.register_buffer(name, None if bias is None else bias.to(device=gate_up.device, dtype=out_dtype)
                                 .contiguous())
        # per-tensor formats: (GEMM1's, GEMM2's) static activation scale, float32 (set_static_scales)
        self.register_buffer("static_scales", None)
        if kind is PackedW4A8Experts:  # W4A8 codes are in a packed layout of their own: its version goes with them
            from humming_aot import w4a8

            self.register_buffer("packed_layout_version",
                                 torch.tensor(w4a8.LAYOUT_VERSION, dtype=torch.int32, device=gate_up.device))

    def set_static_scales(self, gate_up: float, down: float) -> None:
        """The static activation scales of a per-tensor format (":tensor"): GEMM1's and GEMM2's,
        kept in the state dict."""
        device = self._buffers["gate_up_w"].device
        self.static_scales = torch.tensor([float(gate_up), float(down)], dtype=torch.float32, device=device)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # a layer made without static scales takes a saved module's
        saved = state_dict.get(prefix + "static_scales")
        if saved is not None and self.static_scales is None:
            self.static_scales = torch.empty_like(saved, device=self._buffers["gate_up_w"].device)
        if "packed_layout_version" in self._buffers:  # W4A8 codes: only this version's layout is read
            version = state_dict.get(prefix + "packed_layout_version")
            current = int(self._buffers["packed_layout_version"])
            if version is None or int(version) != current:
                got = "records no packed layout version" if version is None else \
                    f"holds W4A8 codes in packed layout version {int(version)}"
                raise ValueError(f"A8MoE: the state dict {got}, but this humming_aot reads version {current}: pack "
                                 "the experts again from their checkpoint (humming_aot.moe.pack_w4a8_experts)")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # the buffers whose dtype the kernels read as packed: a cast of the module moves them but keeps
    # their dtype (PackedBuffersModule; the biases and the output dtype follow a 16-bit cast)
    _PACKED = ("gate_up_w", "gate_up_scale", "gate_up_global_scale", "down_w", "down_scale", "down_global_scale",
               "static_scales")

    def _apply(self, fn, recurse=True):
        # (what the function makes of the output dtype: a 16-bit cast moves it, anything else not)
        target = fn(torch.empty(0, dtype=self.out_dtype, device=self._buffers["gate_up_w"].device)).dtype
        result = super()._apply(fn, recurse)  # (the packed buffers keep their dtypes)
        if target in _OUT_DTYPES:
            self.out_dtype = target
        for name in ("gate_up_bias", "down_bias"):
            bias = self._buffers.get(name)
            if bias is not None and bias.dtype != self.out_dtype:
                self._buffers[name] = bias.to(self.out_dtype)
        return result

    def _experts(self, name: str):
        return self._kind(w=self._buffers[f"{name}_w"], w_scale=self._buffers[f"{name}_scale"],
                          global_scale_tensor=self._buffers[f"{name}_global_scale"], **self._meta[name])

    @property
    def gate_up(self):
        return self._experts("gate_up")

    @property
    def down(self):
        return self._experts("down")

    @classmethod
    def from_experts(cls, gate_up, down, activations: str, fmt: str | None = None, activation: str = "silu",
                     gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype = torch.bfloat16) -> "A8MoE":
        """From stacked expert weights: QuantizedWeight (E, N, K) each, or float tensors quantized
        with `fmt` ("int4:g128", "uint4:g128:zp", "mxfp4", "float8e4m3:channel",
        "float8e4m3:b128x128", "int8:channel"), packed on the weights' device (moe.pack_a8_experts)."""
        from humming_aot.moe.a8 import pack_a8_experts
        from humming_aot.moe.packing import quantized_experts

        packed = [pack_a8_experts(w)
                  for w in quantized_experts((("gate_up", gate_up), ("down", down)), fmt, "A8MoE.from_experts")]
        return cls(packed[0], packed[1], activations, activation, gate_up_bias, down_bias, out_dtype)

    def _quantize(self, x: torch.Tensor, which: int):
        from humming_aot import ops

        static = None if self.static_scales is None else self.static_scales[which]
        if static is None and self.activations.endswith(":tensor"):
            raise ValueError("A8MoE: per-tensor activations need static scales: call "
                             "module.set_static_scales(gate_up's, down's)")
        return ops.quantize_activation(x, self.activations, **({} if static is None else {"static_scale": static}))

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        from humming_aot import moe
        from humming_aot.moe.routing import gather_rows

        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])
        if x.shape[-1] != self.hidden_size or x.dtype != self.out_dtype:
            raise ValueError(f"A8MoE: hidden must be (..., {self.hidden_size}) {self.out_dtype}, got "
                             f"{tuple(shape)} {hidden.dtype}")
        if topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"A8MoE: topk_ids and topk_weights must be ({x.shape[0]}, top_k) for {x.shape[0]} "
                             f"tokens, got {tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
        if x.shape[0] == 0:  # (an empty batch: one rank of several may have no token)
            return x.new_zeros(*shape[:-1], self.hidden_size)
        kernels = x.is_cuda
        routing = moe.group_rows(topk_ids, self.num_experts, check_range=not kernels)
        qx = _per_row(self._quantize(x, 0), x.shape[0])
        rows = dataclasses.replace(qx, codes=gather_rows(qx.codes, routing.slot_of_row, routing.top_k),
                                   scales=gather_rows(qx.scales, routing.slot_of_row, routing.top_k))
        slots = routing.slot_of_row.shape[0]
        expected = max(1, -(-slots // self.num_experts))
        gate_up, down = self.gate_up, self.down
        if kernels:
            h = moe.gemm_grouped_a8_kernel(rows, gate_up, routing.offsets_int32, expected_m=expected,
                                             bias=self.gate_up_bias, out_dtype=self.out_dtype)
        else:
            h = moe.gemm_grouped_a8(rows, gate_up, routing.offsets, bias=self.gate_up_bias, out_dtype=self.out_dtype)
        h = moe.silu_and_mul(h) if self.activation == "silu" else moe.swiglu_oai(h)
        qh = _per_row(self._quantize(h, 1), slots)
        if kernels:
            y = moe.gemm_grouped_a8_kernel(qh, down, routing.offsets_int32, expected_m=expected, bias=self.down_bias,
                                             out_dtype=self.out_dtype)
        else:
            y = moe.gemm_grouped_a8(qh, down, routing.offsets, bias=self.down_bias, out_dtype=self.out_dtype)
        return moe.combine(y, routing, topk_weights).reshape(*shape[:-1], self.hidden_size)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"format={self._meta['gate_up']['format']!r}, activations={self.activations!r}, "
                f"activation={self.activation!r}")


def _per_row(qa, rows: int):
    """Activations whose scales a gather can carry row by row: a per-tensor scale repeated per row
    (then per token); per-token and per-group scales as they are."""
    if qa.granularity is not ActivationGranularity.TENSOR:
        return qa
    return dataclasses.replace(qa, granularity=ActivationGranularity.TOKEN,
                               scales=qa.scales.reshape(1, 1).expand(rows, 1).contiguous())
