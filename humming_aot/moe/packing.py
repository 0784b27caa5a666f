"""Stacked expert weights in kernel layout: ``pack_experts`` packs each expert of an (E, N, K)
``QuantizedWeight`` exactly as ``humming_aot.pack`` packs a dense one and stacks the tensors along
a leading expert dimension, so that expert e's slices are a dense ``PackedWeight`` the dense
kernels take as they are (``PackedExperts.expert(e)``), and a grouped kernel reads all of them
from one base pointer with a fixed stride per expert.

Every expert shares the format, N, K, group size and activation dtype; what differs per expert is
its global scale (NVFP4's per-expert global scale, and the power of two ``pack`` moves from an
expert's scales into it), kept as a host tuple and an fp32 device tensor (E,).
"""
from __future__ import annotations

import dataclasses

import torch

from humming_aot.packing import PackedWeight, PaddedShape, pack
from humming_aot.quant.weight import QuantizedWeight


@dataclasses.dataclass(frozen=True, eq=False)
class PackedExperts(PaddedShape):
    """E experts in kernel layout on one device.

    w:            (E, K / 16, N * bits / 2) int32, each expert's packed codes (packed_layout.py); N
                  and K are the kernel's, multiples of 64 (n_valid / k_valid: the experts' own,
                  where pack padded them)
    w_scale:      (E, K / group_size, N) act_dtype, unit-permuted per expert
    w_zero_point: (E, K / group_size, N) act_dtype, or None (symmetric)
    global_scales: each expert's fp32 global scale (PackedWeight.global_scale)
    global_scale_tensor: the same as an fp32 (E,) tensor on the weights' device
    """

    w: torch.Tensor
    w_scale: torch.Tensor
    w_zero_point: torch.Tensor | None
    experts: int
    n: int
    k: int
    group_size: int
    w_dtype: str
    act_dtype: torch.dtype
    format: str
    global_scales: tuple[float, ...]
    global_scale_tensor: torch.Tensor
    float_zero_point: bool
    layout_version: int
    n_valid: int | None = None  # the experts' own N and K where pack padded them (PackedWeight's)
    k_valid: int | None = None

    def expert(self, e: int) -> PackedWeight:
        """Expert e as a dense PackedWeight (views of the stacked tensors: no copy)."""
        if not 0 <= e < self.experts:
            raise IndexError(f"expert {e} of {self.experts}: expert indices lie in [0, {self.experts - 1}]")
        return PackedWeight(
            w=self.w[e], w_scale=self.w_scale[e], w_zero_point=None if self.w_zero_point is None else self.w_zero_point[e],
            n=self.n, k=self.k, group_size=self.group_size, w_dtype=self.w_dtype, act_dtype=self.act_dtype,
            format=self.format, global_scale=self.global_scales[e], float_zero_point=self.float_zero_point,
            layout_version=self.layout_version, n_valid=self.n_valid, k_valid=self.k_valid,
        )

    @property
    def device(self) -> torch.device:
        return self.w.device

    def effective_weight(self, e: int, scales_in_fp32: bool = False) -> torch.Tensor:
        """(N, K) float64: expert e's weight as the kernels multiply it, times its global scale."""
        return self.expert(e).effective_weight(scales_in_fp32=scales_in_fp32)


def expert_weight(qw: QuantizedWeight, e: int) -> QuantizedWeight:
    """Expert e of a stacked (E, N, K) QuantizedWeight, as a dense (N, K) one (views, no copy)."""
    if qw.codes.dim() != 3:
        raise ValueError(f"expert_weight: expected stacked (E, N, K) codes, got shape {tuple(qw.codes.shape)}")
    return QuantizedWeight(
        format=qw.format, codes=qw.codes[e], scales=qw.scales[e],
        zero_points=None if qw.zero_points is None else qw.zero_points[e],
        global_scale=None if qw.global_scale is None else qw.global_scale[e],
    )


def pack_experts(qw: QuantizedWeight, act_dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> PackedExperts:
    """Pack a stacked (E, N, K) QuantizedWeight: each expert as ``humming_aot.pack`` packs a dense
    weight (same rules, same errors, naming the expert), stacked along the expert dimension."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"pack_experts takes a stacked humming_aot.quant.QuantizedWeight (E, N, K), got "
                        f"{type(qw).__name__}: quantize the float experts first (humming_aot.quantize(w, 'int4:g128'))")
    if qw.codes.dim() != 3:
        raise ValueError(
            f"pack_experts: expected stacked expert codes (E, N, K), got shape {tuple(qw.codes.shape)}; "
            "a dense (N, K) weight is packed with humming_aot.pack"
        )
    experts = qw.codes.shape[0]
    if experts == 0:
        raise ValueError("pack_experts: the weight holds no expert (E = 0)")
    packed = []
    for e in range(experts):
        try:
            packed.append(pack(expert_weight(qw, e), act_dtype=act_dtype, device=device))
        except ValueError as error:
            raise ValueError(f"expert {e}: {error}") from None
    first = packed[0]
    zero_points = None if first.w_zero_point is None else torch.stack([p.w_zero_point for p in packed])
    global_scales = tuple(float(p.global_scale) for p in packed)
    return PackedExperts(
        w=torch.stack([p.w for p in packed]), w_scale=torch.stack([p.w_scale for p in packed]),
        w_zero_point=zero_points, experts=experts, n=first.n, k=first.k, group_size=first.group_size,
        w_dtype=first.w_dtype, act_dtype=act_dtype, format=first.format, global_scales=global_scales,
        global_scale_tensor=torch.tensor(global_scales, dtype=torch.float32, device=first.w.device),
        float_zero_point=first.float_zero_point, layout_version=first.layout_version,
        n_valid=first.n_valid, k_valid=first.k_valid,
    )


def quantized_experts(weights, fmt: str | None, what: str) -> list[QuantizedWeight]:
    """The stacked QuantizedWeights of a MoE layer's named expert weights ((name, weight), ...):
    each a QuantizedWeight (E, N, K) as given, or a float tensor quantized with `fmt`."""
    from humming_aot.quant import quantize

    weights = list(weights)
    if fmt is not None and not any(isinstance(w, torch.Tensor) for _, w in weights):
        given = ", ".join(f"{name} as {getattr(w, 'format', type(w).__name__)}" for name, w in weights)
        raise ValueError(f"{what}: fmt={fmt!r} quantizes float weights, but every weight given is already quantized "
                         f"({given}): leave fmt None")
    out = []
    for name, w in weights:
        if isinstance(w, torch.Tensor):
            if fmt is None:
                raise ValueError(f"{what}: {name} is a float tensor: give fmt to quantize it")
            w = quantize(w.float(), fmt)
        out.append(w)
    return out
