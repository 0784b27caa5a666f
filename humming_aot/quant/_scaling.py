"""Scale arithmetic shared by weight and activation quantization.

A "tile" is the (rows, cols) patch of a (*lead, N, K) tensor that shares one scale; a "grid" holds
one value per tile, shape (*lead, ceil(N / rows), ceil(K / cols)). All arithmetic is float32 in the
order the common producers (GPTQ, AWQ, llm-compressor, ModelOpt, vLLM) use, so that their rounding
is reproduced; the element encode then rounds the float32 quotient exactly.

Every division is tensor by tensor (:func:`divide`): PyTorch's CUDA division by a Python scalar
multiplies by the reciprocal, which can differ from the correctly rounded quotient in the last bit,
and the reference must give the same bits on the CPU and on a GPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from humming_aot import formats


def divide(numerator: torch.Tensor, denominator: float) -> torch.Tensor:
    """Correctly rounded ``numerator / denominator`` on every device (see the module docstring)."""
    return numerator / torch.full((), denominator, dtype=numerator.dtype, device=numerator.device)


def tile_reduce(x: torch.Tensor, rows: int, cols: int, reduce) -> torch.Tensor:
    """``reduce`` (torch.amax or torch.amin) over every tile; partial edge tiles are padded with 0,
    which never changes the result because every caller's range already contains 0."""
    *lead, n, k = x.shape
    grid_n, grid_k = -(-n // rows), -(-k // cols)
    if grid_n * rows != n or grid_k * cols != k:
        x = F.pad(x, (0, grid_k * cols - k, 0, grid_n * rows - n))
    return reduce(x.reshape(*lead, grid_n, rows, grid_k, cols), dim=(-3, -1))


def tile_expand(grid: torch.Tensor, rows: int, cols: int, n: int, k: int) -> torch.Tensor:
    """(*lead, grid_n, grid_k) -> (*lead, n, k): every element gets its tile's value."""
    *lead, grid_n, grid_k = grid.shape
    full = grid[..., :, None, :, None].expand(*lead, grid_n, rows, grid_k, cols)
    return full.reshape(*lead, grid_n * rows, grid_k * cols)[..., :n, :k]


def to_scale_format(raw: torch.Tensor, nonzero: torch.Tensor, scale_fmt: formats.ElementFormat) -> torch.Tensor:
    """float32 scales representable in ``scale_fmt``: ``raw`` rounded to nearest (even), saturated
    at the format's maximum; a tile with no nonzero value gets 1.0, and a nonzero tile whose scale
    underflows to 0 gets the smallest positive value of the format, so that nothing divides by 0."""
    scales = scale_fmt.nearest(raw).clamp_(max=scale_fmt.max_value)
    scales = torch.where((scales == 0) & nonzero, scale_fmt.smallest_positive, scales)
    return torch.where(nonzero, scales, 1.0)


def mx_scales(amax: torch.Tensor, elem: formats.ElementFormat) -> torch.Tensor:
    """OCP MX v1.0 shared scale: 2^(floor(log2(amax)) - emax_elem), clamped to float8e8m0's range
    [2^-127, 2^127]; emax_elem = floor(log2(largest element value)) (2 for float4e2m1, 8 for
    float8e4m3). A tile whose amax is 0 gets 1.0."""
    emax_elem = math.floor(math.log2(elem.max_value))
    _, exponent = torch.frexp(amax.to(torch.float64))  # amax = f * 2^exponent, f in [0.5, 1)
    shared = (exponent - 1 - emax_elem).clamp_(-127, 127)
    scales = formats.get("float8e8m0").decode((shared + 127).to(torch.uint8))
    return torch.where(amax > 0, scales, 1.0)


def symmetric_scales(
    amax: torch.Tensor,
    elem: formats.ElementFormat,
    scale_fmt: formats.ElementFormat,
    *,
    int_denominator: float,
    global_scale: torch.Tensor | None,
) -> torch.Tensor:
    """float32 scale grid from the tiles' amax grid (*lead, grid_n, grid_k).

    * float8e8m0 scales: :func:`mx_scales`.
    * with ``global_scale`` (*lead,) (NVFP4): nearest(amax / elem_max / global).
    * otherwise nearest(amax / d), d = ``int_denominator`` for integer elements and the largest
      element value for float elements.
    """
    nonzero = amax > 0
    if scale_fmt.kind is formats.FormatKind.EXPONENT:
        return mx_scales(amax, elem)
    if global_scale is not None:
        raw = divide(amax, elem.max_value) / global_scale[..., None, None]
    else:
        raw = divide(amax, int_denominator if elem.is_integer else elem.max_value)
    return to_scale_format(raw, nonzero, scale_fmt)


def dynamic_global_scale(
    amax: torch.Tensor, elem: formats.ElementFormat, scale_fmt: formats.ElementFormat
) -> torch.Tensor:
    """float32 (*lead,): amax / (scale_max * elem_max) per tensor (1.0 where amax is 0), so that the
    largest group scale lands on the scale format's maximum (448 * 6 for NVFP4)."""
    tensor_amax = amax.amax(dim=(-2, -1))
    raw = divide(tensor_amax, scale_fmt.max_value * elem.max_value)
    return torch.where(tensor_amax > 0, raw, 1.0).to(torch.float32)


def check_finite(x: torch.Tensor, what: str, first: int = 0) -> None:
    """ValueError naming the first non-finite element of ``x`` (``x`` being the slice from index
    ``first`` of a larger tensor's leading dimension, its index in that tensor)."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        index = tuple(int(i) for i in torch.nonzero(bad)[0])
        value = float(x[index])
        if first:
            index = (index[0] + first, *index[1:])
        raise ValueError(
            f"{what} must be finite, but element {index} is {value}: quantization scales "
            "come from the absolute maximum, so replace or clip non-finite values first"
        )
