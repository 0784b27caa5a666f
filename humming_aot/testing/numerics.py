"""The one tolerance rule for GEMM outputs, and the small data helpers every GEMM test uses.

The rule: the reference is a float64 matmul of exactly the operands the kernel multiplies
(dequantized weights, quantized activations), and a kernel may be off from it by at most
``M_acc`` times what a float32-accumulating ``torch.matmul`` rounded to the output dtype gets
wrong on the same operands *in the same output tile* (``TILE_ROWS`` x ``TILE_COLS``), plus one
ulp of the output at the reference's magnitude. ``M_acc`` comes from
``ACCUMULATION_ERROR_MULTIPLIER``, keyed by how the kernel accumulates, never from a test.
Quantization error never sits inside this tolerance: it is in the operands, so the reference
has it too.

Why per tile: a bound taken from the largest baseline error of the whole output grows with M
(at M = 4096 in bfloat16 it allowed about a tenth of a typical element), so an error confined to
one kernel tile, or a wrong scale in one group, hid under the rounding of the largest outputs
elsewhere. The tile is the smallest output block a kernel writes (16 rows of an MMA, 64
columns of the narrowest N tile); the same tiles carry an RMS check of their own.

Everything here runs on whichever device its tensors are on (CPU in CI, CUDA on the GPU box).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch

ACCUMULATION_ERROR_MULTIPLIER: dict[str, float] = {
    # fp32 accumulators in any order (mma.sync / wgmma with 16-bit operands, split-K through an
    # fp32 workspace). The error is dominated by the final rounding to the output dtype, exactly
    # as for cuBLAS; the slack covers a different summation order and an extra fp32 rounding of
    # the scale or bias epilogue.
    "fp32": 4.0,
    # int32 accumulators (int8 x int8 MMA): products and sums are exact, so the only rounding is
    # the fp32 scale epilogue and the output cast, both no worse than the baseline's.
    "int32": 2.0,
}
"""M_acc: how many times the baseline's (torch.matmul in the output dtype) error a kernel may
make, per accumulation mode of the kernel. Add a mode here, with the reason, never in a test."""

RMS_ULP_FLOOR = 0.5
"""The RMS check allows this many ulps (RMS over the output, each at the reference's magnitude)
on top of M_acc x the baseline's RMS error, so that an exact baseline (small-integer inputs) does
not demand a bitwise-exact kernel."""

TILE_ROWS = 16
TILE_COLS = 64
"""The output tile that scopes the baseline error an element may be compared with (the smallest
block of rows and columns a kernel computes together; partial tiles at the edges are smaller)."""

_WORST_SHOWN = 8  # how many of the worst coordinates a failure message lists

__all__ = [
    "ACCUMULATION_ERROR_MULTIPLIER",
    "RMS_ULP_FLOOR",
    "TILE_COLS",
    "TILE_ROWS",
    "reference_gemm",
    "assert_gemm_close",
    "assert_bitwise_equal",
    "poison_like",
    "random_activation",
    "tile_max",
    "ulp",
    "with_every_code",
]


def reference_gemm(a: torch.Tensor, w_eff: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ w_eff.T (+ bias)`` in float64, on the operands' device.

    Args:
        a: (M, K) activation, any float or integer dtype, exactly as the kernel reads it (already
            quantized and with any activation scale folded in if the kernel multiplies those).
        w_eff: (N, K) effective weight, exactly what the kernel multiplies with (for example
            ``PackedWeight.dequantized()``).
        bias: optional (N,) bias added to every row.

    Returns:
        (M, N) float64. Cast it to the output dtype once, if at all; never accumulate in it.
    """
    _check_gemm_operands(a, w_eff, bias)
    ref = a.to(torch.float64) @ w_eff.to(torch.float64).T
    if bias is not None:
        ref += bias.to(device=ref.device, dtype=torch.float64)
    return ref


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype``'s representable numbers at the magnitude of each element of ``x``.

    ``x`` is any float tensor (typically the float64 reference); the result is float64 of the same
    shape: ``2**floor(log2|x|) * eps(dtype)`` for normal magnitudes, the subnormal spacing
    ``tiny * eps`` below that (and at zero). Non-finite elements give NaN.
    """
    if not dtype.is_floating_point:
        raise TypeError(
            f"ulp() needs a floating-point dtype, got {dtype}; integer results are exact: compare them with assert_bitwise_equal"
        )
    info = torch.finfo(dtype)
    mag = x.to(torch.float64).abs()
    _, exponent = torch.frexp(mag)  # mag = m * 2**exponent with m in [0.5, 1)
    spacing = torch.ldexp(torch.full_like(mag, info.eps), exponent - 1)
    spacing = torch.where(mag < info.tiny, torch.full_like(mag, info.tiny * info.eps), spacing)
    return torch.where(torch.isfinite(mag), spacing, torch.full_like(mag, math.nan))


@contextlib.contextmanager
def _full_precision_matmul() -> Iterator[None]:
    """cuBLAS with fp32 accumulation and no TF32, so the baseline is the accurate one a kernel
    with fp32 accumulators is measured against (the flags only affect CUDA)."""
    flags = torch.backends.cuda.matmul
    saved = (flags.allow_tf32, flags.allow_fp16_reduced_precision_reduction, flags.allow_bf16_reduced_precision_reduction)
    flags.allow_tf32 = False
    flags.allow_fp16_reduced_precision_reduction = False
    flags.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (flags.allow_tf32, flags.allow_fp16_reduced_precision_reduction, flags.allow_bf16_reduced_precision_reduction) = saved


def _baseline_gemm(a: torch.Tensor, w_eff: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """torch's own float32-accumulating matmul on the same operands, rounded once to ``dtype``.

    The operands go in as float32, which holds every operand a kernel reads exactly: 16-bit,
    8-bit and small-integer values, and the unrounded ``(q - z) * s`` weight of a
    ``scales_in_fp32`` kernel (an 8-bit integer times a 16-bit scale). Casting that weight to the
    16-bit output dtype instead would add a rounding the kernel does not make and widen the bound.
    For anything float32 does not hold (a float64 global scale folded into ``w_eff``) the cast
    loosens the bound by at most a float32 ulp per operand; it never tightens it."""
    a32 = a.to(torch.float32)
    w32 = w_eff.to(device=a.device, dtype=torch.float32)
    with _full_precision_matmul():
        if bias is None:
            out = torch.matmul(a32, w32.T)
        else:
            out = torch.addmm(bias.to(device=a.device, dtype=torch.float32), a32, w32.T)
    return out.to(dtype)


def _tile_view(x: torch.Tensor) -> torch.Tensor:
    """(M, N) -> (ceil(M / TILE_ROWS), TILE_ROWS, ceil(N / TILE_COLS), TILE_COLS), zero-padded."""
    m, n = x.shape
    pad_m, pad_n = -m % TILE_ROWS, -n % TILE_COLS
    padded = torch.nn.functional.pad(x, (0, pad_n, 0, pad_m))
    return padded.reshape((m + pad_m) // TILE_ROWS, TILE_ROWS, (n + pad_n) // TILE_COLS, TILE_COLS)


def _per_tile(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A (tiles_m, tiles_n) value per tile, spread back over the (M, N) elements of each tile."""
    m, n = shape
    return x.repeat_interleave(TILE_ROWS, dim=0)[:m].repeat_interleave(TILE_COLS, dim=1)[:, :n]


def tile_max(x: torch.Tensor) -> torch.Tensor:
    """(M, N) -> (M, N): each element replaced by the largest element of its output tile
    (``TILE_ROWS`` x ``TILE_COLS``, aligned at (0, 0)). ``x`` must be non-negative."""
    return _per_tile(_tile_view(x).amax(dim=(1, 3)), x.shape)


def _tile_rms(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """(tiles_m, tiles_n) RMS of x over each tile's ``count`` counted elements (zeros elsewhere)."""
    return ((_tile_view(x * x).sum(dim=(1, 3))) / count.clamp(min=1)).sqrt()


def _nonfinite_kind(x: torch.Tensor) -> torch.Tensor:
    """0 finite, 1 NaN, 2 +Inf, 3 -Inf (int8, same shape)."""
    kind = torch.zeros(x.shape, dtype=torch.int8, device=x.device)
    kind[torch.isnan(x)] = 1
    kind[torch.isposinf(x)] = 2
    kind[torch.isneginf(x)] = 3
    return kind


def _coords(flat_indices: torch.Tensor, shape: Sequence[int]) -> list[tuple[int, ...]]:
    coords = []
    for flat in flat_indices.tolist():
        coord = []
        for size in reversed(shape):
            coord.append(flat % size)
            flat //= size
        coords.append(tuple(reversed(coord)))
    return coords


def _header(context: str, out: torch.Tensor, accumulation: str, m_acc: float) -> str:
    where = f"[{context}] " if context else ""
    return (
        f"{where}GEMM output {tuple(out.shape)} {str(out.dtype).removeprefix('torch.')} on {out.device}, "
        f"accumulation={accumulation!r} (M_acc={m_acc:g})"
    )


def assert_gemm_close(
    out: torch.Tensor,
    ref64: torch.Tensor,
    *,
    a: torch.Tensor,
    w_eff: torch.Tensor,
    bias: torch.Tensor | None = None,
    accumulation: str = "fp32",
    context: str = "",
) -> None:
    """Assert that a GEMM output is as accurate as torch's own matmul would be, up to M_acc.

    Args:
        out: (M, N) kernel output, a floating-point dtype (the output dtype the rule is about).
        ref64: (M, N) float64 reference from ``reference_gemm(a, w_eff, bias)``.
        a: (M, K) the activation exactly as the kernel read it.
        w_eff: (N, K) the effective weight exactly as the kernel multiplied it.
        bias: optional (N,) bias the kernel added.
        accumulation: the kernel's accumulation mode, a key of ``ACCUMULATION_ERROR_MULTIPLIER``.
        context: what to print on failure: the kernel key, problem shape, seed, a repro line.

    Checks, in order:
      1. NaN / +Inf / -Inf positions of ``out`` equal those of ``ref64`` rounded to ``out.dtype``.
      2. Elementwise on finite positions: ``|out - ref| <= M_acc * tile_max|base - ref| + ulp(ref)``,
         where ``base`` is torch.matmul (addmm with bias) with float32 operands and accumulation,
         rounded to ``out.dtype``, on the same device, and ``tile_max`` is the largest baseline
         error in the element's ``TILE_ROWS`` x ``TILE_COLS`` output tile.
      3. Per tile: ``rms|out - ref| <= M_acc * rms|base - ref| + RMS_ULP_FLOOR * rms(ulp(ref))``
         over the tile's finite elements, which catches an error spread over a tile (a wrong
         scale, a 1% bias) that stays under the elementwise bound.
      4. The same RMS rule over the whole output (a small systematic error everywhere).

    Raises:
        AssertionError naming ``context``, the bound, and the worst coordinates with their values.
        KeyError for an unknown ``accumulation``; TypeError / ValueError for malformed arguments.
    """
    if accumulation not in ACCUMULATION_ERROR_MULTIPLIER:
        raise KeyError(
            f"unknown accumulation mode {accumulation!r}; expected one of {sorted(ACCUMULATION_ERROR_MULTIPLIER)} "
            "(add a new mode, with its reason, to ACCUMULATION_ERROR_MULTIPLIER in humming_aot/testing/numerics.py)"
        )
    m_acc = ACCUMULATION_ERROR_MULTIPLIER[accumulation]
    if not out.dtype.is_floating_point:
        raise TypeError(
            f"assert_gemm_close needs a floating-point output, got {out.dtype}; compare integer outputs with assert_bitwise_equal"
        )
    if ref64.dtype != torch.float64:
        raise TypeError(f"ref64 must be the float64 result of reference_gemm, got {ref64.dtype}")
    _check_gemm_operands(a, w_eff, bias)
    expected_shape = (a.shape[0], w_eff.shape[0])
    if tuple(out.shape) != expected_shape or tuple(ref64.shape) != expected_shape:
        raise ValueError(
            f"shape mismatch: out {tuple(out.shape)}, ref64 {tuple(ref64.shape)}, expected (M, N) = {expected_shape} from a and w_eff"
        )
    header = _header(context, out, accumulation, m_acc)
    if out.numel() == 0:
        return

    ref64 = ref64.to(out.device)
    out64 = out.to(torch.float64)
    _assert_nonfinite_match(out, out64, ref64, header)

    finite = torch.isfinite(ref64.to(out.dtype))
    base64 = _baseline_gemm(a.to(out.device), w_eff, bias, out.dtype).to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=out.device)
    err = torch.where(finite, (out64 - ref64).abs(), zero)
    base_err = torch.where(finite & torch.isfinite(base64), (base64 - ref64).abs(), zero)
    ref_ulp = torch.where(finite, ulp(ref64, out.dtype), zero)

    base_local = tile_max(base_err)
    allowed = m_acc * base_local + ref_ulp
    excess = err - allowed
    n_bad = int((excess > 0).sum().item())

    count = _tile_view(finite.to(torch.float64)).sum(dim=(1, 3))
    tile_err, tile_base, tile_ulp = (_tile_rms(t, count) for t in (err, base_err, ref_ulp))
    tile_bound = m_acc * tile_base + RMS_ULP_FLOOR * tile_ulp
    tile_excess = torch.where(count > 0, tile_err - tile_bound, torch.full_like(tile_err, -math.inf))
    n_bad_tiles = int((tile_excess > 0).sum().item())

    n_finite = max(int(finite.sum().item()), 1)
    err_rms, base_rms, ulp_rms = (math.sqrt((t * t).sum().item() / n_finite) for t in (err, base_err, ref_ulp))
    rms_bound = m_acc * base_rms + RMS_ULP_FLOOR * ulp_rms

    if n_bad == 0 and n_bad_tiles == 0 and err_rms <= rms_bound:
        return

    lines = [header]
    tiles = f"{TILE_ROWS} x {TILE_COLS} output tile"
    if n_bad:
        lines.append(
            f"  {n_bad} of {out.numel()} elements exceed |out-ref| <= {m_acc:g} * (max baseline error in the "
            f"element's {tiles}) + ulp(ref)"
        )
    if n_bad_tiles:
        worst_tile = int(torch.argmax(tile_excess).item())
        ti, tj = divmod(worst_tile, tile_excess.shape[1])
        lines.append(
            f"  {n_bad_tiles} of {tile_excess.numel()} {tiles}s exceed rms|out-ref| <= {m_acc:g} * (baseline rms) + "
            f"{RMS_ULP_FLOOR:g} * (rms ulp); worst: rows {ti * TILE_ROWS}.., cols {tj * TILE_COLS}.. with rms error "
            f"{tile_err[ti, tj].item():.4g} vs bound {tile_bound[ti, tj].item():.4g} = {m_acc:g} * "
            f"{tile_base[ti, tj].item():.4g} + {RMS_ULP_FLOOR:g} * {tile_ulp[ti, tj].item():.4g}"
        )
    if not n_bad and not n_bad_tiles:
        lines.append("  every element and every tile is within its bound, but the RMS error of the whole output is not:")
    lines.append(
        f"  max error {err.max().item():.4g} (max baseline error {base_err.max().item():.4g}); "
        f"rms error {err_rms:.4g} vs bound {rms_bound:.4g} = {m_acc:g} * {base_rms:.4g} (baseline rms) + "
        f"{RMS_ULP_FLOOR:g} * {ulp_rms:.4g} (rms ulp)"
    )
    lines.append("  worst coordinates (by error beyond the allowed bound):")
    flat_excess = excess.reshape(-1)
    k = min(_WORST_SHOWN, flat_excess.numel())
    worst = torch.topk(flat_excess, k).indices
    for coord, flat in zip(_coords(worst.cpu(), out.shape), worst.tolist()):
        lines.append(
            f"    {coord}: out={out64.reshape(-1)[flat].item():.8g} ref={ref64.reshape(-1)[flat].item():.8g} "
            f"baseline={base64.reshape(-1)[flat].item():.8g} err={err.reshape(-1)[flat].item():.4g} "
            f"allowed={allowed.reshape(-1)[flat].item():.4g}"
        )
    raise AssertionError("\n".join(lines))


def _assert_nonfinite_match(out: torch.Tensor, out64: torch.Tensor, ref64: torch.Tensor, header: str) -> None:
    """NaN/Inf must appear exactly where the correctly rounded reference has them (a stale
    NaN from ``poison_like`` shows up here as an unwritten element)."""
    got = _nonfinite_kind(out)
    want = _nonfinite_kind(ref64.to(out.dtype))
    mismatch = got != want
    n_bad = int(mismatch.sum().item())
    if n_bad == 0:
        return
    names = ("finite", "NaN", "+Inf", "-Inf")
    flat = mismatch.reshape(-1).nonzero().reshape(-1)[:_WORST_SHOWN]
    lines = [header, f"  NaN/Inf mismatch at {n_bad} of {out.numel()} elements (NaN in out where ref is finite = element never written?):"]
    for coord, i in zip(_coords(flat.cpu(), out.shape), flat.tolist()):
        lines.append(
            f"    {coord}: out={out64.reshape(-1)[i].item():.8g} ({names[got.reshape(-1)[i].item()]}) "
            f"ref={ref64.reshape(-1)[i].item():.8g} ({names[want.reshape(-1)[i].item()]})"
        )
    raise AssertionError("\n".join(lines))


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, context: str = "") -> None:
    """Assert two tensors have the same shape, dtype and bytes (NaN payloads and -0.0 included):
    for exact-tier tests and for "two runs give identical results"."""
    where = f"[{context}] " if context else ""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise AssertionError(f"{where}not comparable bitwise: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
    if x.numel() == 0:
        return
    y = y.to(x.device)
    x_bytes = x.contiguous().reshape(-1).view(torch.uint8).reshape(x.numel(), -1)
    y_bytes = y.contiguous().reshape(-1).view(torch.uint8).reshape(y.numel(), -1)
    differs = (x_bytes != y_bytes).any(dim=1)
    n_bad = int(differs.sum().item())
    if n_bad == 0:
        return
    flat = differs.nonzero().reshape(-1)[:_WORST_SHOWN]
    x_flat, y_flat = x.reshape(-1), y.reshape(-1)
    lines = [f"{where}{n_bad} of {x.numel()} elements differ bitwise ({tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}):"]
    for coord, i in zip(_coords(flat.cpu(), x.shape), flat.tolist()):
        lines.append(
            f"    {coord}: {x_flat[i].item()!r} (0x{x_bytes[i].flip(0).cpu().numpy().tobytes().hex()}) vs "
            f"{y_flat[i].item()!r} (0x{y_bytes[i].flip(0).cpu().numpy().tobytes().hex()})"
        )
    raise AssertionError("\n".join(lines))


def poison_like(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
    """A tensor to pass as a kernel's output buffer: NaN everywhere, so an element the kernel
    never writes fails the NaN-mask check. Integer dtypes (no NaN) get the dtype's minimum."""
    fill = math.nan if dtype.is_floating_point else torch.iinfo(dtype).min
    return torch.full(tuple(shape), fill, dtype=dtype, device=device)


def random_activation(
    m: int,
    k: int,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Fresh (M, K) standard-normal activations rounded to ``dtype``, drawn from ``generator``
    (pass a seeded one and print its seed: every call advances it, so each call is new data).
    A generator on another device than ``device`` draws there and the result is moved."""
    draw_device = generator.device if generator is not None else device
    a = torch.randn((m, k), generator=generator, dtype=torch.float32, device=draw_device)
    return a.to(device=device, dtype=dtype)


def with_every_code(qw, generator: torch.Generator | None = None):
    """``qw`` (a ``humming_aot.quant.QuantizedWeight``) with its integer codes replaced by codes
    drawn uniformly over every value of the element, on the codes' device, the first
    ``num_codes`` of them (in row-major order) being every code once, so each is present whatever
    the draw. Quantized noise leaves the extreme codes rare, and the symmetric int1 recipe rounds
    every weight to 0, which any kernel that writes zeros would match. Scales and zero points
    are kept; float elements are returned unchanged (some of their bit patterns are NaN).
    """
    import dataclasses

    from humming_aot import formats

    element = formats.get(qw.format.element)
    if not element.is_integer:
        return qw
    if qw.codes.numel() < element.num_codes:
        raise ValueError(
            f"with_every_code: a {tuple(qw.codes.shape)} weight holds fewer than the {element.num_codes} codes of "
            f"{element.name}; use a weight of at least {element.num_codes} elements"
        )
    draw_device = generator.device if generator is not None else qw.codes.device
    codes = torch.randint(0, element.num_codes, qw.codes.shape, generator=generator, device=draw_device)
    codes.view(-1)[: element.num_codes] = torch.arange(element.num_codes, device=draw_device)
    return dataclasses.replace(qw, codes=codes.to(device=qw.codes.device, dtype=torch.uint8))


def _check_gemm_operands(a: torch.Tensor, w_eff: torch.Tensor, bias: torch.Tensor | None) -> None:
    if a.dim() != 2 or w_eff.dim() != 2 or a.shape[1] != w_eff.shape[1]:
        raise ValueError(f"expected a (M, K) and w_eff (N, K) with the same K, got a {tuple(a.shape)} and w_eff {tuple(w_eff.shape)}")
    if bias is not None and tuple(bias.shape) != (w_eff.shape[0],):
        raise ValueError(f"expected bias of shape (N,) = ({w_eff.shape[0]},), got {tuple(bias.shape)}")
