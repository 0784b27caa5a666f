"""W8A8Linear, the nn.Module of the quantized-activation kernels (humming_aot.nn re-exports it,
and pickles name it there): W8A8 (humming_aot.w8a8), W4A8 (humming_aot.w4a8), int4 W4A4 (w8a8)
and block-scaled FP4 W4A4 (humming_aot.fp4), its inputs quantized on the way in."""
from __future__ import annotations

import torch

from humming_aot import ops
from humming_aot.packed_buffers import PackedBuffersModule


class W8A8Linear(PackedBuffersModule):
    """y = gemm(quantize_activation(x, activations), W) (+ b): a layer with quantized (8- or 4-bit)
    activations (the float64 reference on the CPU): float8 or int8 W8A8 (humming_aot.w8a8), or W4A8 with
    int4 weights and float8 or int8 activations, or MXFP4 weights and float8 ones (humming_aot.w4a8). The output takes x's dtype when it is
    float16 or bfloat16, else bfloat16. Weight codes, scales and bias are buffers (``.to()`` moves
    them; a cast of the module leaves the codes' and scales' dtypes as packed: PackedBuffersModule)."""

    _PACKED = ("w", "w_scale", "global_scale", "static_scale")

    def __init__(self, packed, activations: str, bias: torch.Tensor | None = None,
                 static_scale: torch.Tensor | float | None = None):
        from humming_aot import fp4, w4a8
        from humming_aot.quant import ActivationFormat
        from humming_aot.quant.activation import ActivationGranularity

        super().__init__()
        fmt = ActivationFormat.parse(activations)
        w4 = isinstance(packed, w4a8.PackedW4A8Weight)
        block_fp4 = isinstance(packed, fp4.PackedFp4Weight)
        if w4:
            w4a8._check_packed(packed)  # (its layout version too: the layer records this version's)
        if block_fp4:  # W4A4 FP4: the weight's own recipe, its scales worked out on the fly
            if (fmt.element != fp4.ELEMENT or fmt.granularity is not ActivationGranularity.GROUP
                    or fmt.group_size != packed.group_size or fmt.scale_dtype != packed.scale_dtype):
                raise ValueError(f"W8A8Linear: activations {fmt} do not suit {packed.recipe} weights {packed.format}; "
                                 f"use {packed.recipe.lower()}")
            if static_scale is not None:
                raise ValueError(f"W8A8Linear: {packed.recipe} activations are quantized per group on the fly (leave "
                                 "static_scale None)")
        blocks = not w4 and not block_fp4 and packed.blocks
        wanted = ((ActivationGranularity.GROUP,) if blocks or block_fp4
                  else (ActivationGranularity.TOKEN, ActivationGranularity.TENSOR))
        elements = ((w4a8.ACT_ELEMENT,) if w4 and packed.element == w4a8.MXFP4_ELEMENT
                    else w4a8.ACT_ELEMENTS if w4 else (packed.element,))
        if not block_fp4 and (fmt.element not in elements or fmt.granularity not in wanted
                              or fmt.scale_dtype != "float32" or (blocks and fmt.group_size != 128)):
            hint = "float8e4m3:g128" if blocks else " or ".join(f"{e}:token or {e}:tensor" for e in elements)
            raise ValueError(f"W8A8Linear: activations {fmt} do not suit weights {packed.format}; use {hint}")
        if static_scale is not None and fmt.granularity is not ActivationGranularity.TENSOR:
            raise ValueError(f"W8A8Linear: a static activation scale is one per tensor; activations {fmt} are "
                             "quantized per token or group on the fly (leave static_scale None)")
        self.activations = str(fmt)
        self.in_features, self.out_features = packed.in_features, packed.out_features
        self._meta = {"n": packed.n, "k": packed.k, "format": packed.format, "n_valid": packed.n_valid,
                      "blocks": blocks, "w4a8": w4, "group_size": packed.group_size if w4 else None,
                      "element": packed.element if w4 else None}
        if block_fp4:  # (the global scale: a buffer for the state dict, and a float the launch passes)
            self._meta.update(fp4=True, scale_dtype=packed.scale_dtype, global_scale=packed.global_scale)
            self.register_buffer("global_scale", torch.tensor(packed.global_scale, dtype=torch.float32))
        self.register_buffer("w", packed.w)
        self.register_buffer("w_scale", packed.w_scale)
        self.register_buffer("bias", bias)
        if static_scale is not None:
            static_scale = torch.as_tensor(static_scale, dtype=torch.float32).to(packed.w.device).reshape(())
            if not bool(torch.isfinite(static_scale)) or float(static_scale) <= 0:
                raise ValueError(f"W8A8Linear: static_scale must be a positive finite number, got {float(static_scale)}")
        self.register_buffer("static_scale", static_scale)
        if w4:  # W4A8 codes are in a packed layout of their own: its version goes with them
            self.register_buffer("packed_layout_version",
                                 torch.tensor(w4a8.LAYOUT_VERSION, dtype=torch.int32, device=packed.w.device))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        from humming_aot import w4a8

        saved_global = state_dict.get(prefix + "global_scale")
        if self._meta.get("fp4") and isinstance(saved_global, torch.Tensor) and saved_global.numel() == 1:
            self._meta["global_scale"] = float(saved_global)  # (an FP4 weight's global scale goes with its codes)
        # a W4A8 layer's layout version is checked before any tensor is copied; version 1's codes
        # are converted (the same values in this version's layout)
        saved = state_dict.get(prefix + "packed_layout_version")
        codes = state_dict.get(prefix + "w")
        if self._meta["w4a8"] and saved is None and codes is not None:
            raise ValueError(
                f"the state dict of W8A8Linear {prefix.rstrip('.') or '(root)'} ({self._meta['format']}) holds W4A8 codes "
                "without their packed layout version (packed_layout_version): they cannot be read safely; pack the "
                "quantized weight again (humming_aot.w4a8.pack)")
        if (self._meta["w4a8"] and self._meta.get("element", w4a8.WEIGHT_ELEMENT) == w4a8.WEIGHT_ELEMENT
                and isinstance(saved, torch.Tensor)
                and int(saved) == 1 and isinstance(codes, torch.Tensor)):  # (version 1 held int4 codes only)
            state_dict[prefix + "w"] = w4a8.upgrade_packed(codes, 1)
            state_dict[prefix + "packed_layout_version"] = saved = torch.tensor(w4a8.LAYOUT_VERSION, dtype=torch.int32)
        if self._meta["w4a8"] and isinstance(saved, torch.Tensor) and int(saved) != w4a8.LAYOUT_VERSION:
            raise ValueError(
                f"the state dict of W8A8Linear {prefix.rstrip('.') or '(root)'} ({self._meta['format']}) holds W4A8 "
                f"codes in packed layout version {int(saved)}, but this humming_aot reads version "
                f"{w4a8.LAYOUT_VERSION}: pack the quantized weight again (humming_aot.w4a8.pack) or load it with "
                "the humming_aot version that packed it")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @staticmethod
    def _pack(weight, activations: str | None = None):
        """The weight as the quantized-activation kernels read it: 4-bit integers and floats for W4A8
        (whose pack says what it takes), int4 ones with int4 activations for W4A4 (w8a8's), NVFP4 /
        MXFP4 ones with float4e2m1 activations for FP4 W4A4 (fp4's), else W8A8."""
        from humming_aot import fp4, w4a8, w8a8
        from humming_aot.quant import ActivationFormat

        element = (ActivationFormat.parse(activations).element if activations not in (None, "checkpoint")
                   else None)
        if element == fp4.ELEMENT:  # FP4 x FP4: the block-scaled kernels
            return fp4.pack(weight)
        w4 = weight.format.element in ("int4", "uint4", "float4e2m1") and element != w8a8.INT4
        return (w4a8 if w4 else w8a8).pack(weight)

    @classmethod
    def from_checkpoint_layer(cls, layer, activations: str, device=None) -> "W8A8Linear":
        """A checkpoint layer (humming_aot.checkpoints.CheckpointLayer) on the W8A8 kernels (W4A8
        for int4, uint4 and MXFP4 weights, W4A4 for int4 weights with int4 activations), its inputs
        quantized by ``activations``: "checkpoint" (the producer's scheme, its static scale
        included) or an ActivationFormat string (dynamic)."""

        where = f"from_checkpoint: layer {layer.prefix!r}"
        scheme, static_scale = layer.activations, None
        if activations == "checkpoint":
            if scheme is None:
                raise ValueError(f"{where} ({layer.schema}, {layer.weight.format}) quantizes no activations: the "
                                 "checkpoint is weight-only; leave activations None for 16-bit activations, or name "
                                 "a format such as 'float8e4m3:token'")
            if scheme.format is None:
                raise ValueError(f"{where}: the checkpoint quantizes activations as {scheme.description}, which no "
                                 "humming_aot kernel takes yet; leave activations None for 16-bit activations")
            activations, static_scale = scheme.format, scheme.static_scale
        if layer.input_perm is not None or layer.input_scale is not None:
            raise ValueError(f"{where} gathers or scales its activations before the GEMM, which the W8A8 layer "
                             "does not; leave activations None")
        if layer.weight.codes.dim() != 2:
            raise ValueError(f"{where} is a stacked MoE weight of shape {tuple(layer.weight.shape)}; W8A8Linear "
                             "holds one (N, K) weight")
        weight = layer.weight if device is None else layer.weight.to(device)
        try:
            packed = cls._pack(weight, activations)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        bias = None if layer.bias is None else layer.bias.to(device=packed.w.device, dtype=torch.float32)
        return cls(packed, activations, bias, static_scale)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: str = "float8e4m3:channel",
                    activations: str | None = None) -> "W8A8Linear":
        """Quantize an nn.Linear's weight with `fmt` ("float8e4m3:channel", ":tensor" or
        ":b128x128", "int8:channel" or ":tensor", or for W4A8 "int4:g128", ":channel", "uint4:g128:zp" or
        "mxfp4"); activations default to the weight's element per token (float8e4m3 per token and 128
        of K for block weights, float8e4m3 per token for int4 and uint4 weights, which take int8 per
        token too, and with
        "int4:channel" or ":tensor" weights "int4:token" ones: W4A4)."""
        from humming_aot import w4a8
        from humming_aot.quant import quantize

        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear: expected torch.nn.Linear, got {type(linear).__name__}")
        packed = cls._pack(quantize(linear.weight.detach().float(), fmt), activations)
        if activations is None:
            if isinstance(packed, w4a8.PackedW4A8Weight):
                activations = f"{w4a8.ACT_ELEMENT}:token"
            else:
                activations = "float8e4m3:g128" if packed.blocks else f"{packed.element}:token"
        bias = None if linear.bias is None else linear.bias.detach().float()
        return cls(packed, activations, bias)

    @property
    def packed(self):
        from humming_aot import w4a8, w8a8

        meta = self._meta
        if meta.get("fp4"):
            from humming_aot import fp4

            return fp4.PackedFp4Weight(w=self.w, w_scale=self.w_scale, global_scale=meta["global_scale"],
                                       scale_dtype=meta["scale_dtype"], n=meta["n"], k=meta["k"],
                                       format=meta["format"], n_valid=meta["n_valid"])
        if meta["w4a8"]:
            return w4a8.PackedW4A8Weight(w=self.w, w_scale=self.w_scale, n=meta["n"], k=meta["k"],
                                         group_size=meta["group_size"], format=meta["format"], n_valid=meta["n_valid"],
                                         layout_version=w4a8.LAYOUT_VERSION,  # (load_state_dict checks the buffer)
                                         element=meta.get("element", w4a8.WEIGHT_ELEMENT))
        return w8a8.PackedW8A8Weight(w=self.w, w_scale=self.w_scale, n=meta["n"], k=meta["k"], format=meta["format"],
                                     n_valid=meta["n_valid"], blocks=meta["blocks"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from humming_aot import w4a8, w8a8

        out_dtype = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        bias = None if self.bias is None else self.bias.to(out_dtype)
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 1 and x.shape[-1] == self.in_features \
                and x.numel() == 0:  # no rows (the 16-bit layer's answer too): nothing to quantize
            return x.new_zeros((*x.shape[:-1], self.out_features), dtype=out_dtype)
        qa = ops.quantize_activation(x, self.activations, static_scale=self.static_scale)
        if self._meta.get("fp4"):
            from humming_aot import fp4

            return fp4.gemm(qa, self.packed, bias=bias, out_dtype=out_dtype)
        return (w4a8 if self._meta["w4a8"] else w8a8).gemm(qa, self.packed, bias=bias, out_dtype=out_dtype)

    def extra_repr(self) -> str:
        static = "" if self.static_scale is None else f", static_scale={float(self.static_scale):.6g}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self._meta['format']!r}, "
                f"activations={self.activations!r}{static}")


W8A8Linear.__module__ = "humming_aot.nn"  # (the name pickles and state dicts have always used)
