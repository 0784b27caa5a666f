"""nn.Module front end: QuantizedLinear (a drop-in for nn.Linear with a quantized weight)."""
from __future__ import annotations

import torch

from humming_aot import ops
from humming_aot.packed_layout import check_layout_version
from humming_aot.packing import PackedWeight, pack
from humming_aot.spec import code_bits


class QuantizedLinear(torch.nn.Module):
    """y = x @ dequant(W)^T (+ b) with W packed once for the kernels.

    The packed tensors are registered as buffers, so ``.to(device)`` moves them and
    ``state_dict()`` holds them, with the packed layout's version (``packed_layout_version``, an
    int32 scalar, so that tensor-only formats such as safetensors can hold it): ``load_state_dict``
    refuses packed tensors of another layout version before loading any.
    """

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features = packed.k
        self.out_features = packed.n
        self._meta = {
            "n": packed.n, "k": packed.k, "group_size": packed.group_size, "w_dtype": packed.w_dtype,
            "act_dtype": packed.act_dtype, "format": packed.format, "global_scale": packed.global_scale,
            "float_zero_point": packed.float_zero_point, "layout_version": packed.layout_version,
        }
        self.register_buffer("w", packed.w)
        self.register_buffer("w_scale", packed.w_scale)
        self.register_buffer("w_zero_point", packed.w_zero_point)
        self.register_buffer("bias", None if bias is None else bias.to(packed.act_dtype))
        self.register_buffer("packed_layout_version",
                             torch.tensor(packed.layout_version, dtype=torch.int32, device=packed.w.device))

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: str, act_dtype: torch.dtype | None = None) -> "QuantizedLinear":
        """Quantize an nn.Linear's weight with `fmt` (e.g. "int4:g128") and pack it.

        act_dtype defaults to the linear's dtype when it is float16 or bfloat16, else bfloat16.
        """
        from humming_aot.quant import quantize

        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear: expected torch.nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        if act_dtype is None:
            act_dtype = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        packed = pack(quantize(weight.float(), fmt), act_dtype=act_dtype)
        bias = None if linear.bias is None else linear.bias.detach().to(act_dtype)
        return cls(packed, bias)

    @property
    def packed(self) -> PackedWeight:
        m = self._meta
        return PackedWeight(
            w=self.w, w_scale=self.w_scale, w_zero_point=self.w_zero_point, n=m["n"], k=m["k"],
            group_size=m["group_size"], w_dtype=m["w_dtype"], act_dtype=m["act_dtype"], format=m["format"],
            global_scale=m["global_scale"], float_zero_point=m["float_zero_point"],
            layout_version=m["layout_version"],
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
        # One PackedWeight per set of buffers, made again only when a buffer was replaced
        # (.to(), .cuda(), assignment); load_state_dict copies into the same tensors.
        buffers = self._buffers
        packed = self.__dict__.get("_packed")
        if (packed is None or packed.w is not buffers["w"] or packed.w_scale is not buffers["w_scale"]
                or packed.w_zero_point is not buffers["w_zero_point"]):
            packed = self.packed
            self.__dict__["_packed"] = packed
        return ops.gemm(x, packed, buffers["bias"])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self._meta['format']!r}"
