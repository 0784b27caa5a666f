"""support.py (pairings, reasons, problem rules, README table) and arch.py (who serves a GPU)."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from humming_aot import arch as arch_mod
from humming_aot import support
from humming_aot.spec import DTYPE_SHORT, ActivationScale, GemmSpec, GemmType, ScaleGranularity, ZeroPoint

BF16_INT4 = GemmSpec(a_dtype="bfloat16", w_dtype="int4", w_scale_dtype="bfloat16", out_dtype="bfloat16")
BF16_INT4_ZP = GemmSpec(
    a_dtype="bfloat16", w_dtype="int4", w_scale_dtype="bfloat16", w_zero_point=ZeroPoint.INTEGER, out_dtype="bfloat16"
)


@pytest.fixture
def fake_support(monkeypatch):
    """Swap support.toml for a dict; returns a setter."""

    def install(*pairings):
        monkeypatch.setattr(support, "load_toml", lambda name: {"schema_version": 1, "pairing": list(pairings)})
        support.pairings.cache_clear()

    yield install
    support.pairings.cache_clear()


def _pairing(**overrides):
    entry = {
        "name": "p", "archs": ["sm80"], "a_dtype": ["bfloat16"], "w_dtype": ["int4"], "w_scale": ["g"],
        "w_scale_dtype": "same_as_a", "w_zero_point": ["none"], "out_dtype": "same_as_a", "rules": [],
    }
    entry.update(overrides)
    return entry


# --- pairings from catalog/support.toml ------------------------------------------------------


@pytest.mark.parametrize("pairing", support.pairings(), ids=lambda p: p.name)
def test_every_pairing_tuple_is_supported_on_its_archs(pairing):
    specs = pairing.specs()
    assert specs
    for arch, spec in itertools.product(pairing.archs, specs):
        assert support.is_supported(spec, arch)
        assert support.why_unsupported(spec, arch) is None
        assert support.pairing_for(spec, arch) is not None


def test_same_as_a_ties_scale_and_output_dtype():
    for spec in support.supported_specs("sm80"):
        if not spec.a_is_quantized:  # (int8 W8A8: fp32 scales, a 16-bit output)
            assert spec.w_scale_dtype == spec.a_dtype and spec.out_dtype == spec.a_dtype
    mixed = GemmSpec(a_dtype="bfloat16", w_dtype="int4", w_scale_dtype="float16", out_dtype="bfloat16")
    reason = support.why_unsupported(mixed, "sm80")
    assert "w_scale_dtype = a_dtype (bfloat16) (got float16)" in reason


def test_pairing_for_names_the_pairing():
    assert support.pairing_for(BF16_INT4, "sm90a").name == "wna16_int_symmetric"
    uint4 = GemmSpec(a_dtype="float16", w_dtype="uint4", w_scale_dtype="float16",
                     w_zero_point=ZeroPoint.INTEGER, out_dtype="float16")
    assert support.pairing_for(uint4, "sm80").name == "wna16_uint_zero_point"
    assert support.pairing_for(BF16_INT4_ZP, "sm90a") is None


def test_reason_for_unsupported_tuple_names_pairing_and_alternatives():
    reason = support.why_unsupported(BF16_INT4_ZP, "sm90a")
    assert reason.startswith("no pairing allows a=bfloat16 w=int4")
    assert "zero_point=zpi out=bfloat16 on sm90a" in reason
    assert "'wna16_int_symmetric'" in reason and "w_zero_point in [none] (got zpi)" in reason
    assert "allowed weight formats for bfloat16 activations on sm90a" in reason
    assert "uint4 (zero point zpi, pairing wna16_uint_zero_point)" in reason


def test_reason_for_arch_without_pairings_lists_the_archs():
    reason = support.why_unsupported(BF16_INT4, "sm100a")
    assert reason.startswith("arch sm100a has no pairing")
    assert "sm75, sm80, sm86, sm89, sm90a, sm100, sm110, sm120" in reason  # numeric order


def test_turing_takes_float16_activations_only():
    assert not support.is_supported(BF16_INT4, "sm75")
    reason = support.why_unsupported(BF16_INT4, "sm75")
    assert "only on sm80, sm86, sm89, sm90a, sm100, sm110, sm120, not on sm75" in reason
    specs = support.supported_specs("sm75")
    assert len(specs) == 24 + 30 and {s.a_dtype for s in specs} == {"float16"}


def test_float_weights_float16_only_where_it_holds_every_code():
    def spec(act, w):
        return GemmSpec(a_dtype=act, w_dtype=w, w_scale_dtype=act, out_dtype=act)

    for w in ("float4e2m1", "float8e4m3", "float8e5m2", "float4e0m3", "float6e3m2"):
        assert support.is_supported(spec("float16", w), "sm89") and support.is_supported(spec("bfloat16", w), "sm89")
    for w in ("float7e5m1", "float8e6m1", "float8e7m0"):
        assert support.is_supported(spec("bfloat16", w), "sm90a")
        reason = support.why_unsupported(spec("float16", w), "sm90a")
        assert reason is not None and w in reason


def test_reason_for_bad_arch_name():
    assert "not a CUDA target name" in support.why_unsupported(BF16_INT4, "hopper")


def test_reason_for_unknown_activation_lists_allowed_ones():
    fp8 = GemmSpec(a_dtype="float8e4m3", a_scale=ActivationScale.TOKEN, a_scale_dtype="float32", w_dtype="int4",
                   w_scale_dtype="float8e4m3", out_dtype="float8e4m3")
    reason = support.why_unsupported(fp8, "sm86")
    assert "a_dtype in [" in reason and "(got float8e4m3)" in reason
    assert "activation dtypes allowed on sm86: bfloat16, float16, int4, int8" in reason


def test_is_supported_agrees_with_why_unsupported_everywhere():
    dtypes = ["float16", "bfloat16", "int4", "uint4", "int8", "float8e4m3"]
    archs = support.supported_archs() + ["sm90", "sm100a", "sm121a"]
    for a, w, zp, arch in itertools.product(dtypes, dtypes, list(ZeroPoint), archs):
        a_scale = {} if a in ("float16", "bfloat16") else dict(a_scale=ActivationScale.TOKEN, a_scale_dtype="float32")
        spec = GemmSpec(a_dtype=a, w_dtype=w, w_scale_dtype=a, w_zero_point=zp, out_dtype=a, **a_scale)
        reason = support.why_unsupported(spec, arch)
        assert support.is_supported(spec, arch) == (reason is None)
        assert reason is None or len(reason) > 20


def test_supported_specs_sorted_unique_and_supported():
    for arch in support.supported_archs():
        specs = support.supported_specs(arch)
        assert specs == sorted(specs, key=support._spec_sort_key) and len(specs) == len(set(specs))
        assert all(support.is_supported(s, arch) for s in specs)
        if arch in ("sm120a", "sm121a"):  # the block-scaled FP4 W4A4 targets: NVFP4 and MXFP4 x two outputs
            assert {(s.a_dtype, s.a_scale_dtype, s.w_dtype, s.w_scale_dtype, s.out_dtype, s.gemm_type) for s in specs} \
                == {("float4e2m1", sd, "float4e2m1", sd, o, GemmType.DENSE)
                    for sd in ("float8e4m3", "float8e8m0") for o in ("bfloat16", "float16")}
            continue
        # (2 activation dtypes, float16 only on sm75) x (int1..int8 symmetric + uint1..uint8 with
        # integer or float zero points), + float weights: every signed eXmY of 2..8 bits for
        # bfloat16 (35), those float16 holds exactly for float16 (30: E <= 4, and float8e5m2)
        dense = support.supported_specs(arch, GemmType.DENSE)
        # float8 x float8 in two scalings, int8 x int8 in one, int4 x float8, int4 x int8, uint4
        # (zero points) x float8 and x int8 and MXFP4 x float8 (W4A8) and int4 x int4 (W4A4) in one
        # each: all nine on sm90a and from sm89 (the portable bodies), the int8 and
        # int4-activation ones on sm80 and sm86; x two outputs
        w8a8 = [s for s in dense if s.a_is_quantized]
        number = int(arch[2:].rstrip("af"))
        assert len(w8a8) == (18 if number >= 89 else 8 if number >= 80 else 0)
        assert len(dense) == len(set(dense)) == (24 + 30 if arch == "sm75" else 48 + 35 + 30) + len(w8a8)
        # the MoE types (grouped masked and contiguous) for every 16-bit dense spec of sm80 and later,
        # and for the W4A8 and W8A8 specs: int4 / uint4 and int8 weights x int8 from sm80; with
        # float8 activations int4, uint4 and MXFP4 weights from sm89, and float8 weights (per channel
        # and per block) where mma.sync on e4m3 is native (sm89, sm120), and on sm90a float8 per
        # channel and per block in both types (the wgmma-ss schedule, its row-expert form over row
        # blocks): x two outputs, 6, 12 or 16 of each type (16 on sm90a); W4A4 has none
        for gemm_type in (GemmType.MASKED, GemmType.GROUPED):
            a8 = [s for s in specs if s.a_is_quantized and s.gemm_type is gemm_type]
            wgmma_ss = 4 if arch == "sm90a" else 0
            assert len(a8) == wgmma_ss + (16 if number in (89, 120) else 12 if number >= 89 else 6 if number >= 80
                                          else 0), arch
            assert all(s.w_dtype in ("int4", "uint4", "float4e2m1", "int8", "float8e4m3")
                       and s.a_dtype in ("int8", "float8e4m3") for s in a8)
        a8_moe = [s for s in specs if s.a_is_quantized and s.gemm_type is not GemmType.DENSE]
        assert len(specs) == len(set(specs)) == (len(dense) * (1 if arch == "sm75" else 3) - 2 * len(w8a8)
                                                 + len(a8_moe))
        assert {dataclasses.replace(s, gemm_type=GemmType.DENSE) for s in specs} == set(dense)
        assert specs == sorted(specs, key=support._spec_sort_key)
        assert all(support.is_supported(s, arch) for s in specs)
    assert support.supported_specs("sm70") == []


# --- problem rules -----------------------------------------------------------------------------


@pytest.mark.parametrize("group", [16, 32, 64, 128, 192, 256, 1024, None, -1])
def test_group_sizes_that_fit(group):
    assert support.problem_errors(BF16_INT4, "sm90a", 1, 4096, 3072, group) == []


@pytest.mark.parametrize("group", [8, 24, 48, 96, 100, 0, -2])
def test_group_sizes_that_do_not_fit(group):
    errors = support.problem_errors(BF16_INT4, "sm90a", 1, 4096, 3072, group)
    assert any("group_size_fits_k_tiles" in e for e in errors), errors


def test_per_channel_group_equal_to_k_fits():
    assert support.problem_errors(BF16_INT4, "sm80", 7, 128, 576, 576) == []


def test_problem_errors_say_what_and_what_to_do():
    errors = support.problem_errors(BF16_INT4, "sm90a", 1, 100, 4160, 128)
    assert len(errors) == 2
    n_error, group_error = errors
    assert n_error.startswith("N=100 is not a multiple of 64: pad the weight's output channels")
    assert "[rule n_multiple_of_64 of pairing wna16_int_symmetric]" in n_error
    assert group_error.startswith("K=4160 is not a multiple of the group size 128")


def test_k_not_multiple_of_64():
    errors = support.problem_errors(BF16_INT4, "sm80", 1, 128, 100, None)
    assert len(errors) == 1 and errors[0].startswith("K=100 is not a multiple of 64")


def test_problem_errors_for_unsupported_spec_is_the_reason():
    errors = support.problem_errors(BF16_INT4_ZP, "sm90a", 1, 128, 128, 128)
    assert errors == [support.why_unsupported(BF16_INT4_ZP, "sm90a")]


def test_empty_or_negative_shape():
    assert "negative" in support.problem_errors(BF16_INT4, "sm80", -1, 128, 128, 128)[0]
    assert support.problem_errors(BF16_INT4, "sm80", 0, 128, 128, 128) == []


def test_every_predicate_is_documented_and_used():
    used = {rule for p in support.pairings() for rule in p.rules}
    assert used == set(support.PREDICATES)
    for name, predicate in support.PREDICATES.items():
        assert predicate.__doc__, name
        assert predicate(support.ProblemShape(m=1, n=128, k=128, group_size=64)) is None


# --- support.toml validation ---------------------------------------------------------------


def test_unknown_rule_is_rejected(fake_support):
    fake_support(_pairing(rules=["k_is_prime"]))
    with pytest.raises(ValueError, match="rule 'k_is_prime' is not a predicate"):
        support.pairings()


def test_unknown_dtype_is_rejected(fake_support):
    fake_support(_pairing(w_dtype=["int9"]))
    with pytest.raises(ValueError, match="w_dtype 'int9' is not a known dtype"):
        support.pairings()


def test_unknown_key_is_rejected(fake_support):
    fake_support(_pairing(colour="red"))
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\]"):
        support.pairings()


def test_duplicate_pairing_names_are_rejected(fake_support):
    fake_support(_pairing(), _pairing())
    with pytest.raises(ValueError, match="more than once"):
        support.pairings()


def test_reason_when_allowed_only_on_other_archs(fake_support):
    fake_support(_pairing(name="narrow", archs=["sm90a"]), _pairing(name="other", w_dtype=["int8"], archs=["sm80"]))
    reason = support.why_unsupported(BF16_INT4, "sm80")
    assert reason == (
        "pairing 'narrow' allows a=bfloat16 w=int4 scale=group/bfloat16 zero_point=none out=bfloat16 "
        "only on sm90a, not on sm80"
    )


def test_explicit_dtype_lists(fake_support):
    fake_support(_pairing(w_scale_dtype=["float16", "bfloat16"], out_dtype="float16"))
    specs = support.pairings()[0].specs()
    assert {(s.w_scale_dtype, s.out_dtype) for s in specs} == {("float16", "float16"), ("bfloat16", "float16")}


# --- README table ------------------------------------------------------------------------------


def test_markdown_table_lists_every_pairing_and_rule():
    text = support.render_support_markdown()
    for p in support.pairings():
        assert f"`{p.name}`" in text
        for arch in p.archs:
            assert arch in text
    for rule in support.PREDICATES:
        assert f"`{rule}`" in text
    assert text == support.render_support_markdown()


def test_replace_support_section():
    readme = f"# t\n\n{support.SUPPORT_TABLE_START}\nstale\n{support.SUPPORT_TABLE_END}\n\ntail\n"
    updated = support.replace_support_section(readme)
    assert "stale" not in updated and updated.endswith(f"{support.SUPPORT_TABLE_END}\n\ntail\n")
    assert support.replace_support_section(updated) == updated
    with pytest.raises(ValueError, match="markers"):
        support.replace_support_section("# no markers\n")


# --- arch.py -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cc,expected",
    [
        ((9, 0), ["sm90a", "sm90"]),
        ((8, 6), ["sm86", "sm80"]),
        ((8, 9), ["sm89", "sm86", "sm80"]),
        ((8, 0), ["sm80"]),
        ((7, 5), ["sm75"]),
        ((10, 0), ["sm100a", "sm100"]),
        ((10, 3), ["sm103a", "sm103", "sm100"]),
        ((12, 0), ["sm120a", "sm120"]),
        ((12, 1), ["sm121a", "sm121", "sm120"]),
        ((6, 1), []),
    ],
)
def test_archs_for_capability(cc, expected):
    assert arch_mod.archs_for_capability(*cc) == expected


def test_serving_arches_takes_a_capability_tuple():
    assert arch_mod.serving_arches((8, 9)) == ["sm89", "sm86", "sm80"]


def test_serving_arch_picks_best_available():
    assert arch_mod.serving_arch(["sm80", "sm86", "sm89", "sm90a", "sm120"], 8, 9) == "sm89"
    assert arch_mod.serving_arch(["sm80", "sm90a"], 8, 9) == "sm80"
    assert arch_mod.serving_arch(["sm80", "sm90a"], 9, 0) == "sm90a"
    assert arch_mod.serving_arch(["sm90a"], 10, 0) is None  # 'a' targets serve exactly their CC
    assert arch_mod.serving_arch(["sm120"], 12, 1) == "sm120"


@pytest.mark.parametrize(
    "arch,flags",
    [
        ("sm90a", ["-gencode=arch=compute_90a,code=sm_90a"]),
        ("sm80", ["-gencode=arch=compute_80,code=sm_80"]),
        ("sm120", ["-gencode=arch=compute_120,code=sm_120"]),
        ("sm100f", ["-gencode=arch=compute_100f,code=sm_100f"]),
    ],
)
def test_nvcc_gencode_is_sass_only(arch, flags):
    assert arch_mod.nvcc_gencode(arch) == flags


@pytest.mark.parametrize("arch", ["sm91", "sm80a", "sm89f", "sm70", "sm_90"])
def test_unknown_targets_are_rejected(arch):
    with pytest.raises(ValueError):
        arch_mod.validate_target(arch)


def test_known_targets_cover_the_support_matrix():
    assert set(support.supported_archs()) <= set(arch_mod.known_targets())
    assert set(DTYPE_SHORT) >= {d for p in support.pairings() for d in p.a_dtype}


# --- quantized activations and grouped GEMM types: named by the data model, no kernels yet ----

FP8_TOKEN = GemmSpec(a_dtype="float8e4m3", a_scale=ActivationScale.TOKEN, a_scale_dtype="float32",
                     w_dtype="float8e4m3", w_scale_dtype="float32", out_dtype="bfloat16")


def test_quantized_activations_are_the_w8a8_and_w4a8_pairings_and_the_reason_says_which_field():
    assert support.why_unsupported(FP8_TOKEN, "sm90a") is None
    int8 = dataclasses.replace(FP8_TOKEN, a_dtype="int8", w_dtype="int8")
    w4a8 = dataclasses.replace(FP8_TOKEN, w_dtype="int4")
    mxfp4 = dataclasses.replace(FP8_TOKEN, w_dtype="float4e2m1", w_scale_dtype="float8e8m0")
    w4a4 = dataclasses.replace(FP8_TOKEN, a_dtype="int4", w_dtype="int4")
    uint4 = dataclasses.replace(FP8_TOKEN, w_dtype="uint4", w_zero_point=ZeroPoint.INTEGER)
    assert {s for s in support.supported_specs("sm90a", GemmType.DENSE) if s.a_is_quantized} == {
        dataclasses.replace(spec, out_dtype=out, **scales) for out in ("bfloat16", "float16")
        for spec, scales in ((FP8_TOKEN, {}), (int8, {}), (w4a8, {}),
                             (dataclasses.replace(w4a8, a_dtype="int8"), {}), (mxfp4, {}), (w4a4, {}),
                             (uint4, {}), (dataclasses.replace(uint4, a_dtype="int8"), {}),
                             (FP8_TOKEN, {"a_scale": ActivationScale.GROUP, "w_scale": ScaleGranularity.BLOCK}))}
    assert support.why_unsupported(mxfp4, "sm89") is None and "not on sm86" in support.why_unsupported(mxfp4, "sm86")
    assert support.why_unsupported(w4a4, "sm80") is None and "not on sm75" in support.why_unsupported(w4a4, "sm75")
    # per channel, the portable mma-ss body: int8 from sm80, float8 from sm89
    assert support.why_unsupported(FP8_TOKEN, "sm89") is None and support.why_unsupported(int8, "sm80") is None
    assert "only on sm89, sm90a, sm100, sm110, sm120, not on sm86" in support.why_unsupported(FP8_TOKEN, "sm86")
    assert "not on sm75" in support.why_unsupported(int8, "sm75")
    assert support.why_unsupported(w4a8, "sm89") is None  # (the portable mma-w4a8 body)
    assert "not on sm86" in support.why_unsupported(w4a8, "sm86")
    assert support.why_unsupported(dataclasses.replace(w4a8, a_dtype="int8"), "sm80") is None
    assert support.why_unsupported(dataclasses.replace(uint4, a_dtype="int8"), "sm80") is None
    assert support.why_unsupported(uint4, "sm89") is None and "not on sm86" in support.why_unsupported(uint4, "sm86")
    fp8_blocks = dataclasses.replace(FP8_TOKEN, a_scale=ActivationScale.GROUP, w_scale=ScaleGranularity.BLOCK)
    assert support.why_unsupported(fp8_blocks, "sm89") is None
    assert "not on sm86" in support.why_unsupported(fp8_blocks, "sm86")
    mixed = dataclasses.replace(FP8_TOKEN, w_dtype="int8")
    assert "w_dtype in [" in support.why_unsupported(mixed, "sm90a")
    blocks = dataclasses.replace(int8, a_scale=ActivationScale.GROUP, w_scale=ScaleGranularity.BLOCK)
    assert "int8 (zero point none, pairing w8a8_int8_channel)" in support.why_unsupported(blocks, "sm90a")
    assert "a=float8e4m3 a_scale=token/float32" in support.describe_spec(FP8_TOKEN)


def test_a_pairing_with_activation_scales_allows_exactly_its_tuples(fake_support):
    fake_support(_pairing(name="w8a8", archs=["sm90a"], a_dtype=["float8e4m3"], a_scale=["k", "t"],
                          a_scale_dtype=["float32"], w_dtype=["float8e4m3"], w_scale_dtype=["float32"],
                          out_dtype=["bfloat16"]))
    (pairing,) = support.pairings()
    specs = pairing.specs()
    assert {(s.a_scale, s.a_scale_dtype) for s in specs} == {(ActivationScale.TOKEN, "float32"),
                                                            (ActivationScale.TENSOR, "float32")}
    assert support.why_unsupported(FP8_TOKEN, "sm90a") is None
    group = dataclasses.replace(FP8_TOKEN, a_scale=ActivationScale.GROUP)
    assert "a_scale in [k, t] (got g)" in support.why_unsupported(group, "sm90a")
    bf16 = GemmSpec(a_dtype="bfloat16", w_dtype="int4", w_scale_dtype="bfloat16", out_dtype="bfloat16")
    assert "a_dtype in [float8e4m3]" in support.why_unsupported(bf16, "sm90a")


def test_moe_gemm_types_are_allowed_from_sm80_and_refused_with_the_pairings_field():
    for gemm_type in (GemmType.MASKED, GemmType.GROUPED):
        moe = dataclasses.replace(BF16_INT4, gemm_type=gemm_type)
        assert support.is_supported(moe, "sm90a") and support.is_supported(moe, "sm80")
        turing = dataclasses.replace(moe, a_dtype="float16", w_scale_dtype="float16", out_dtype="float16")
        reason = support.why_unsupported(turing, "sm75")
        assert reason is not None and f"gemm_type={gemm_type.value} a=float16 w=int4" in reason
        assert "only on sm80, sm86, sm89, sm90a, sm100, sm110, sm120, not on sm75" in reason
    indexed = dataclasses.replace(BF16_INT4, gemm_type=GemmType.INDEXED)
    reason = support.why_unsupported(indexed, "sm90a")
    assert reason is not None and "gemm_type in [dense, masked, grouped] (got indexed)" in reason
