"""The tolerance helper itself (humming_aot.testing.numerics), on the CPU: it must pass rounding
noise (a different summation order, a correctly rounded result) and fail real errors (a wrong
element, an unwritten NaN element, 16-bit accumulation, a wrong scale group, a systematic bias)."""
from __future__ import annotations

import math

import pytest
import torch

from humming_aot.testing import numerics
from humming_aot.testing.numerics import (
    ACCUMULATION_ERROR_MULTIPLIER,
    assert_bitwise_equal,
    assert_gemm_close,
    poison_like,
    random_activation,
    reference_gemm,
    tile_max,
    ulp,
    with_every_code,
)

OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SEED = 1234


def _operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int = SEED):
    gen = torch.Generator().manual_seed(seed)
    a = random_activation(m, k, dtype, "cpu", gen)
    w_eff = random_activation(n, k, dtype, "cpu", gen)
    return a, w_eff


def _split_k_fp32(a: torch.Tensor, w_eff: torch.Tensor, chunk: int, out_dtype: torch.dtype, accumulate_in: torch.dtype = torch.float32):
    """A kernel-like GEMM: per-chunk fp32 products, summed in ``accumulate_in``, rounded once."""
    acc = torch.zeros(a.shape[0], w_eff.shape[0], dtype=accumulate_in)
    for start in range(0, a.shape[1], chunk):
        part = a[:, start : start + chunk].float() @ w_eff[:, start : start + chunk].float().T
        acc = (acc.float() + part).to(accumulate_in)
    return acc.to(out_dtype)


def test_reference_gemm_is_float64_matmul_with_bias():
    a, w_eff = _operands(5, 7, 32, torch.bfloat16)
    bias = torch.randn(7, generator=torch.Generator().manual_seed(1)).bfloat16()
    ref = reference_gemm(a, w_eff, bias)
    assert ref.dtype == torch.float64 and ref.shape == (5, 7)
    manual = a.double() @ w_eff.double().T + bias.double()
    assert torch.equal(ref, manual)


@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_passes_torch_matmul_and_correct_rounding(dtype):
    a, w_eff = _operands(48, 80, 512, dtype)
    ref = reference_gemm(a, w_eff)
    assert_gemm_close(torch.matmul(a, w_eff.T), ref, a=a, w_eff=w_eff, context=f"torch seed={SEED}")
    assert_gemm_close(ref.to(dtype), ref, a=a, w_eff=w_eff, context=f"rounded seed={SEED}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("chunk", [16, 64, 4096], ids=lambda c: f"chunk{c}")
def test_passes_other_fp32_summation_orders(dtype, chunk):
    a, w_eff = _operands(32, 64, 4096, dtype)
    out = _split_k_fp32(a, w_eff, chunk, dtype)
    assert_gemm_close(out, reference_gemm(a, w_eff), a=a, w_eff=w_eff, accumulation="fp32", context=f"chunk={chunk}")


def test_passes_with_bias():
    a, w_eff = _operands(16, 32, 256, torch.bfloat16)
    bias = (torch.randn(32, generator=torch.Generator().manual_seed(2)) * 10).bfloat16()
    out = (a.float() @ w_eff.float().T + bias.float()).bfloat16()  # one rounding, like an epilogue
    assert_gemm_close(out, reference_gemm(a, w_eff, bias), a=a, w_eff=w_eff, bias=bias)


def test_passes_exact_small_integer_operands():
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(-4, 5, (8, 64), generator=gen).bfloat16()
    w_eff = torch.randint(-8, 8, (16, 64), generator=gen).bfloat16()
    ref = reference_gemm(a, w_eff)
    assert_gemm_close(ref.to(torch.bfloat16), ref, a=a, w_eff=w_eff)


@pytest.mark.parametrize("dtype", OUT_DTYPES, ids=str)
def test_fails_on_one_wrong_element_and_names_it(dtype):
    a, w_eff = _operands(24, 40, 256, dtype)
    ref = reference_gemm(a, w_eff)
    out = torch.matmul(a, w_eff.T)
    out[7, 11] += 0.1 * ref.abs().max().item()  # ~13 ulps at the largest magnitude in bf16
    with pytest.raises(AssertionError) as failure:
        assert_gemm_close(out, ref, a=a, w_eff=w_eff, context="key=demo seed=1234")
    message = str(failure.value)
    assert "key=demo seed=1234" in message
    assert "(7, 11)" in message
    assert "1 of 960 elements" in message


def test_fails_on_unwritten_nan():
    a, w_eff = _operands(8, 16, 64, torch.bfloat16)
    out = torch.matmul(a, w_eff.T)
    out[2, 3] = math.nan
    with pytest.raises(AssertionError, match=r"(?s)NaN/Inf mismatch at 1 of 128.*\(2, 3\)"):
        assert_gemm_close(out, reference_gemm(a, w_eff), a=a, w_eff=w_eff)


def test_passes_matching_nan_and_inf():
    a, w_eff = _operands(4, 6, 32, torch.float32)
    a[1, 0] = math.nan  # row 1 is NaN everywhere
    a[2, 0] = math.inf
    w_eff[:, 0] = 1.0  # so row 2 is +Inf everywhere
    ref = reference_gemm(a, w_eff)
    out = ref.float()
    assert torch.isnan(out[1]).all() and torch.isposinf(out[2]).all()
    assert_gemm_close(out, ref, a=a, w_eff=w_eff)
    out[2, 0] = -math.inf
    with pytest.raises(AssertionError, match="NaN/Inf mismatch"):
        assert_gemm_close(out, ref, a=a, w_eff=w_eff)


def test_overflow_to_inf_is_expected_where_the_rounded_reference_overflows():
    a = torch.full((2, 4), 200.0, dtype=torch.float16)
    w_eff = torch.full((3, 4), 200.0, dtype=torch.float16)  # 4 * 40000 > 65504
    ref = reference_gemm(a, w_eff)
    assert_gemm_close(torch.matmul(a, w_eff.T), ref, a=a, w_eff=w_eff)


def test_fails_on_16bit_accumulation():
    a, w_eff = _operands(64, 96, 8192, torch.bfloat16)
    out = _split_k_fp32(a, w_eff, 16, torch.bfloat16, accumulate_in=torch.bfloat16)
    with pytest.raises(AssertionError, match="exceed"):
        assert_gemm_close(out, reference_gemm(a, w_eff), a=a, w_eff=w_eff, context="bf16 accumulators")


def test_fails_on_one_wrong_scale_group():
    a, w_eff = _operands(16, 64, 512, torch.bfloat16)
    w_kernel = w_eff.clone()
    w_kernel[5, 128:256] *= 1.5  # one group dequantized with its neighbour's scale
    out = torch.matmul(a, w_kernel.T)
    with pytest.raises(AssertionError):
        assert_gemm_close(out, reference_gemm(a, w_eff), a=a, w_eff=w_eff, context="wrong scale")


def test_fails_on_systematic_bias_below_the_elementwise_bound():
    a, w_eff = _operands(64, 128, 256, torch.bfloat16)
    ref = reference_gemm(a, w_eff)
    base_err = (_float32_baseline(a, w_eff, torch.bfloat16) - ref).abs()
    m_acc = ACCUMULATION_ERROR_MULTIPLIER["fp32"]
    out = (ref + 0.8 * m_acc * tile_max(base_err).min()).to(torch.bfloat16)  # every element off by the same amount
    err = (out.double() - ref).abs()
    assert (err <= m_acc * tile_max(base_err) + ulp(ref, torch.bfloat16)).all(), "precondition: within the elementwise bound"
    with pytest.raises(AssertionError, match="rms"):
        assert_gemm_close(out, ref, a=a, w_eff=w_eff)


def _float32_baseline(a: torch.Tensor, w_eff: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The helper's baseline, written out: float32 operands and sums, rounded once to dtype."""
    return (a.float() @ w_eff.float().T).to(dtype).double()


def _bound(a, w_eff, ref, dtype):
    """The documented elementwise bound, computed here from its definition (not by the helper):
    M_acc x the largest baseline error in the element's 16 x 64 output tile + ulp(ref)."""
    base_err = (_float32_baseline(a, w_eff, dtype) - ref).abs()
    m, n = ref.shape
    local = torch.zeros_like(base_err)
    for i in range(0, m, 16):
        for j in range(0, n, 64):
            local[i : i + 16, j : j + 64] = base_err[i : i + 16, j : j + 64].max()
    return ACCUMULATION_ERROR_MULTIPLIER["fp32"] * local + ulp(ref, dtype)


@pytest.mark.parametrize("factor", [0.9, 1.3], ids=lambda f: f"x{f}")
def test_elementwise_bound_is_pinned(factor):
    """One element off by `factor` times its documented bound: 0.9 passes, 1.3 fails. A helper
    whose elementwise term were doubled (or halved) gets one of the two wrong. Rows 16-31 of the
    activation are scaled by 2^-6 (exactly), so the element's tile has outputs 64 times smaller
    than the rest: a bound taken from the whole output's largest baseline error would pass it."""
    a, w_eff = _operands(48, 128, 512, torch.bfloat16)
    a[16:32] *= 2.0**-6
    ref = reference_gemm(a, w_eff)
    bound = _bound(a, w_eff, ref, torch.bfloat16)
    out = _float32_baseline(a, w_eff, torch.bfloat16).to(torch.bfloat16)
    # the element with the smallest |ref| in tile (1, 1), so that its own ulp is a small part of
    # the bound and the doubled M_acc term is what matters
    tile = ref[16:32, 64:128].abs()
    i, j = divmod(int(tile.argmin()), 64)
    i, j = 16 + i, 64 + j
    out[i, j] = (ref[i, j] + factor * bound[i, j]).to(torch.bfloat16)
    actual = (out[i, j].double() - ref[i, j]).abs() / bound[i, j]
    assert abs(actual - factor) < 0.05, f"precondition: the element is off by {actual:.3f} of its bound"
    assert bound[i, j] > 4 * ulp(ref[i, j], torch.bfloat16), "precondition: the M_acc term dominates the bound"
    if factor < 1:
        assert_gemm_close(out, ref, a=a, w_eff=w_eff, context=f"x{factor}")
    else:
        with pytest.raises(AssertionError, match=rf"1 of {48 * 128} elements exceed"):
            assert_gemm_close(out, ref, a=a, w_eff=w_eff, context=f"x{factor}")


@pytest.mark.parametrize(("row", "col"), [(0, 0), (2048, 128), (4080, 192)], ids=lambda v: str(v))
def test_fails_on_two_percent_in_one_tile_at_m4096(row, col):
    """A 2% error in one 16 x 64 output tile of a 4096-row bfloat16 GEMM (the kind of error a
    wrong fragment offset or a stale register makes): the per-tile checks see it although the
    tile is 1/1024 of the output."""
    a, w_eff = _operands(4096, 256, 512, torch.bfloat16)
    ref = reference_gemm(a, w_eff)
    out = torch.matmul(a, w_eff.T)
    assert_gemm_close(out, ref, a=a, w_eff=w_eff, context="precondition: the untouched output passes")
    out[row : row + 16, col : col + 64] = (ref[row : row + 16, col : col + 64] * 1.02).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="16 x 64 output tile"):
        assert_gemm_close(out, ref, a=a, w_eff=w_eff, context=f"2% in tile ({row}, {col})")


def test_fails_on_a_bias_confined_to_one_tile_below_the_elementwise_bound():
    """Every element of one 16 x 64 tile of a 4096-row output off by 0.6 of its elementwise
    bound, all the same way: each element passes, the whole output's RMS hardly moves (1/1024 of
    it), and only the tile's own RMS check sees it."""
    a, w_eff = _operands(4096, 256, 512, torch.bfloat16)
    ref = reference_gemm(a, w_eff)
    out = torch.matmul(a, w_eff.T)
    m_acc = ACCUMULATION_ERROR_MULTIPLIER["fp32"]
    local = tile_max((_float32_baseline(a, w_eff, torch.bfloat16) - ref).abs())
    rows, cols = slice(2048, 2064), slice(128, 192)
    out[rows, cols] = (ref[rows, cols] + 0.6 * m_acc * local[rows, cols]).to(torch.bfloat16)
    err = (out.double() - ref).abs()
    assert (err <= m_acc * local + ulp(ref, torch.bfloat16)).all(), "precondition: within the elementwise bound"
    with pytest.raises(AssertionError, match=r"1 of 1024 16 x 64 output tiles exceed rms") as failure:
        assert_gemm_close(out, ref, a=a, w_eff=w_eff, context="bias in one tile")
    assert "rows 2048.., cols 128.." in str(failure.value)


@pytest.mark.parametrize("m", [16, 4096])
def test_fails_on_a_neighbouring_groups_scale(m):
    """Group 3's scale applied to group 2 of one 64-column block of the weight, the two scales
    10% apart (an off-by-one group index in one N tile)."""
    gen = torch.Generator().manual_seed(SEED)
    n, k, group = 256, 512, 64
    codes = torch.randint(-7, 8, (n, k), generator=gen).double()
    scales = (torch.rand(n, k // group, generator=gen, dtype=torch.float64) + 0.5) * 2.0**-4
    scales[:, 3] = scales[:, 2] * 1.1
    expand = lambda s: s.repeat_interleave(group, dim=1)  # noqa: E731
    w_eff = (codes * expand(scales)).to(torch.bfloat16)
    wrong_scales = scales.clone()
    wrong_scales[64:128, 2] = scales[64:128, 3]
    w_kernel = (codes * expand(wrong_scales)).to(torch.bfloat16)
    a = random_activation(m, k, torch.bfloat16, "cpu", gen)
    ref = reference_gemm(a, w_eff)
    assert_gemm_close(torch.matmul(a, w_eff.T), ref, a=a, w_eff=w_eff, context="precondition: the right scales pass")
    with pytest.raises(AssertionError):
        assert_gemm_close(torch.matmul(a, w_kernel.T), ref, a=a, w_eff=w_eff, context=f"neighbouring group's scale m={m}")


def test_tile_max():
    x = torch.zeros(20, 70, dtype=torch.float64)
    x[3, 5], x[17, 2], x[1, 69] = 2.0, 5.0, 7.0
    local = tile_max(x)
    assert local.shape == (20, 70)
    assert (local[:16, :64] == 2.0).all() and (local[16:, :64] == 5.0).all()
    assert (local[:16, 64:] == 7.0).all() and (local[16:, 64:] == 0.0).all()


def test_unknown_accumulation_mode_is_an_error():
    a, w_eff = _operands(2, 2, 8, torch.bfloat16)
    with pytest.raises(KeyError, match="ACCUMULATION_ERROR_MULTIPLIER"):
        assert_gemm_close(torch.matmul(a, w_eff.T), reference_gemm(a, w_eff), a=a, w_eff=w_eff, accumulation="fp17")


def test_bad_arguments():
    a, w_eff = _operands(2, 3, 8, torch.bfloat16)
    ref = reference_gemm(a, w_eff)
    with pytest.raises(ValueError, match="same K"):
        reference_gemm(a, w_eff[:, :4])
    with pytest.raises(ValueError, match="shape mismatch"):
        assert_gemm_close(ref[:1].bfloat16(), ref[:1], a=a, w_eff=w_eff)
    with pytest.raises(TypeError, match="float64"):
        assert_gemm_close(ref.bfloat16(), ref.float(), a=a, w_eff=w_eff)
    with pytest.raises(TypeError, match="assert_bitwise_equal"):
        assert_gemm_close(ref.to(torch.int32), ref, a=a, w_eff=w_eff)


def test_baseline_flags_are_restored():
    flags = torch.backends.cuda.matmul
    before = (flags.allow_tf32, flags.allow_bf16_reduced_precision_reduction)
    a, w_eff = _operands(4, 4, 16, torch.bfloat16)
    assert_gemm_close(torch.matmul(a, w_eff.T), reference_gemm(a, w_eff), a=a, w_eff=w_eff)
    assert (flags.allow_tf32, flags.allow_bf16_reduced_precision_reduction) == before


def test_multiplier_table_is_the_only_source():
    # M_acc lives in one table; the helper reads it at call time.
    assert ACCUMULATION_ERROR_MULTIPLIER["fp32"] == 4.0
    assert numerics.ACCUMULATION_ERROR_MULTIPLIER is ACCUMULATION_ERROR_MULTIPLIER


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        (1.0, torch.bfloat16, 2.0**-7),
        (3.0, torch.bfloat16, 2.0**-6),
        (-1024.0, torch.float16, 1.0),
        (1.0, torch.float32, 2.0**-23),
        (0.0, torch.bfloat16, 2.0**-133),  # the subnormal spacing
        (1e-30, torch.float16, 2.0**-24),
    ],
)
def test_ulp(value, dtype, expected):
    assert ulp(torch.tensor([value], dtype=torch.float64), dtype).item() == expected


def test_assert_bitwise_equal():
    x = torch.tensor([1.0, math.nan, 0.0], dtype=torch.bfloat16)
    assert_bitwise_equal(x, x.clone(), "same")
    with pytest.raises(AssertionError, match=r"(?s)\[signed zero\] 1 of 3 elements differ bitwise.*\(2,\)"):
        assert_bitwise_equal(x, torch.tensor([1.0, math.nan, -0.0], dtype=torch.bfloat16), "signed zero")
    with pytest.raises(AssertionError, match="not comparable"):
        assert_bitwise_equal(x, x.float(), "dtype")
    assert_bitwise_equal(torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.arange(6, dtype=torch.int32).reshape(2, 3))


def test_poison_like():
    poisoned = poison_like((3, 4), torch.bfloat16, "cpu")
    assert poisoned.shape == (3, 4) and poisoned.dtype == torch.bfloat16 and torch.isnan(poisoned).all()
    assert (poison_like([2], torch.int32) == torch.iinfo(torch.int32).min).all()


def test_random_activation_is_fresh_per_call_and_seeded():
    gen = torch.Generator().manual_seed(7)
    first = random_activation(4, 16, torch.bfloat16, "cpu", gen)
    second = random_activation(4, 16, torch.bfloat16, "cpu", gen)
    assert first.shape == (4, 16) and first.dtype == torch.bfloat16
    assert not torch.equal(first, second)
    again = random_activation(4, 16, torch.bfloat16, "cpu", torch.Generator().manual_seed(7))
    assert_bitwise_equal(first, again, "same seed, same data")


@pytest.mark.parametrize("fmt", ["int1:g64", "int4:g32", "uint8:g64:zp", "uint3:channel:zpf"])
def test_with_every_code_holds_every_code(fmt):
    import humming_aot

    qw = humming_aot.quantize(torch.randn(64, 256, generator=torch.Generator().manual_seed(8)), fmt)
    if fmt.startswith("int1"):
        assert torch.equal(humming_aot.dequantize(qw), torch.zeros(64, 256)), "the int1 recipe's all-zero weight"
    drawn = with_every_code(qw, torch.Generator().manual_seed(9))
    bits = int(fmt.split(":")[0].removeprefix("u")[3:])
    assert torch.equal(torch.unique(drawn.codes), torch.arange(2**bits, dtype=torch.uint8))
    assert drawn.scales is qw.scales and drawn.zero_points is qw.zero_points
    again = with_every_code(qw, torch.Generator().manual_seed(9))
    assert_bitwise_equal(drawn.codes, again.codes, "same seed, same codes")
    assert not torch.equal(humming_aot.dequantize(drawn), torch.zeros(64, 256))


def test_with_every_code_keeps_float_codes_and_refuses_tiny_weights():
    import humming_aot

    qw = humming_aot.quantize(torch.randn(64, 64), "float4e2m1:g32")
    assert with_every_code(qw) is qw
    small = humming_aot.quantize(torch.randn(4, 32), "int8:channel")
    with pytest.raises(ValueError, match="fewer than the 256 codes of int8"):
        with_every_code(small)
