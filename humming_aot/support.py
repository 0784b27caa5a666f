"""What each arch allows, and why not: the one place that answers support questions.

The data is ``catalog/support.toml``: a list of *pairings*, each a set of operand tuples (every
combination of its lists) allowed on its archs, plus the names of the problem rules (predicates
below) that a call with that pairing must meet. ``is_supported`` / ``why_unsupported`` answer for a
GemmSpec on an arch; ``problem_errors`` checks the run-time shape against the pairing's rules. The
README's support table is rendered from the same data (``render_support_markdown``).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable

from humming_aot.catalog_data import load_toml
from humming_aot.spec import (
    DTYPE_SHORT,
    ActivationScale,
    GemmSpec,
    GemmType,
    ScaleGranularity,
    ZeroPoint,
    parse_arch,
)

SAME_AS_A = "same_as_a"
"""A dtype field tied to the activation dtype (scales and output in the activation's dtype)."""

SUPPORT_FILE = "support.toml"
_PAIRING_KEYS = {
    "name", "doc", "archs", "gemm_type", "a_dtype", "a_scale", "a_scale_dtype", "w_dtype", "w_scale",
    "w_scale_dtype", "w_zero_point", "out_dtype", "rules",
}


# ---------------------------------------------------------------------------------------------
# Problem rules: what a tuple cannot say. Each takes the run-time shape and returns None when the
# rule holds, else a message saying what is wrong and what to do.


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ProblemShape:
    """The run-time shape a rule checks: out[m, n] = a[m, k] @ w[n, k]^T."""

    m: int
    n: int
    k: int
    group_size: int | None  # K elements per weight scale group; None, -1 or k: one group (per channel)

    @property
    def per_channel(self) -> bool:
        return self.group_size is None or self.group_size == -1 or self.group_size == self.k


def n_multiple_of_64(p: ProblemShape) -> str | None:
    """N (output channels) is a multiple of 64: each warp owns one packed 64-column unit."""
    if p.n % 64:
        return (
            f"N={p.n} is not a multiple of 64: pad the weight's output channels to a multiple of 64 "
            "(humming_aot.pack does), and slice the padded columns off the output"
        )
    return None


def k_multiple_of_64(p: ProblemShape) -> str | None:
    """K (input channels) is a multiple of 64, the K depth of one pipeline stage."""
    if p.k % 64:
        return (
            f"K={p.k} is not a multiple of 64: pad the weight's input channels (humming_aot.pack does) and "
            "the activation's last dimension with zeros to a multiple of 64 (zeros add nothing to the products)"
        )
    return None


def k_multiple_of_group(p: ProblemShape) -> str | None:
    """K is a whole number of scale groups (per-channel scales always are)."""
    if p.per_channel or p.group_size <= 0:
        return None  # a non-positive group size is group_size_fits_k_tiles' message
    if p.k % p.group_size:
        return (
            f"K={p.k} is not a multiple of the group size {p.group_size}: pad K to a multiple of "
            f"{p.group_size} (zero weights, one more scale group) or quantize with a group size that divides K"
        )
    return None


def group_size_fits_k_tiles(p: ProblemShape) -> str | None:
    """The group size is a multiple of 16 that divides 64 (16, 32, 64) or a multiple of 64; a
    per-channel scale (one group spanning K) always fits."""
    if p.per_channel:
        return None
    g = p.group_size
    if g <= 0:
        return (
            f"group size {g} is not positive: give the number of K elements per scale group, or -1 "
            "for per-channel scales"
        )
    if g % 16 or not (64 % g == 0 or g % 64 == 0):
        return (
            f"group size {g} does not fit the kernel's 64-wide K tiles: quantize with a group size of "
            "16, 32, 64 or a multiple of 64 (128 is the common choice), or with per-channel scales"
        )
    return None


PREDICATES: dict[str, Callable[[ProblemShape], str | None]] = {
    "n_multiple_of_64": n_multiple_of_64,
    "k_multiple_of_64": k_multiple_of_64,
    "k_multiple_of_group": k_multiple_of_group,
    "group_size_fits_k_tiles": group_size_fits_k_tiles,
}


# ---------------------------------------------------------------------------------------------
# Pairings


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Pairing:
    """One entry of support.toml: every combination of these lists is allowed on ``archs``."""

    name: str
    doc: str
    archs: tuple[str, ...]
    gemm_type: tuple[GemmType, ...]
    a_dtype: tuple[str, ...]
    a_scale: tuple[ActivationScale, ...] = (ActivationScale.NONE,)  # quantized activations: their scales
    a_scale_dtype: tuple[str, ...] | None = None  # None: no activation scale (16-bit activations)
    w_dtype: tuple[str, ...]
    w_scale: tuple[ScaleGranularity, ...]
    w_scale_dtype: tuple[str, ...] | None  # None: same as a_dtype
    w_zero_point: tuple[ZeroPoint, ...]
    out_dtype: tuple[str, ...] | None  # None: same as a_dtype
    rules: tuple[str, ...]

    def mismatches(self, spec: GemmSpec) -> list[str]:
        """What keeps this pairing from allowing ``spec`` (ignoring the arch), one phrase per field."""
        out = []

        def check(field: str, value, allowed) -> None:
            if value not in allowed:
                shown = ", ".join(str(getattr(a, "value", a)).lower() for a in allowed)
                out.append(f"{field} in [{shown}] (got {str(getattr(value, 'value', value)).lower()})")

        check("gemm_type", spec.gemm_type, self.gemm_type)
        check("a_dtype", spec.a_dtype, self.a_dtype)
        check("a_scale", spec.a_scale, self.a_scale)
        if spec.a_scale_dtype is not None or self.a_scale_dtype is not None:
            check("a_scale_dtype", spec.a_scale_dtype, self.a_scale_dtype or (None,))
        check("w_dtype", spec.w_dtype, self.w_dtype)
        check("w_scale", spec.w_scale, self.w_scale)
        check("w_zero_point", spec.w_zero_point, self.w_zero_point)
        for field, allowed in (("w_scale_dtype", self.w_scale_dtype), ("out_dtype", self.out_dtype)):
            value = getattr(spec, field)
            if allowed is None and value != spec.a_dtype:
                out.append(f"{field} = a_dtype ({spec.a_dtype}) (got {value})")
            elif allowed is not None:
                check(field, value, allowed)
        return out

    def allows(self, spec: GemmSpec) -> bool:
        return not self.mismatches(spec)

    def specs(self, *, a_dtypes: list[str] | None = None, w_dtypes: list[str] | None = None) -> list[GemmSpec]:
        """Every GemmSpec this pairing allows, optionally restricted to some a / w dtypes."""
        for what, subset, full in (("a_dtype", a_dtypes, self.a_dtype), ("w_dtype", w_dtypes, self.w_dtype)):
            extra = sorted(set(subset or ()) - set(full))
            if extra:
                raise ValueError(
                    f"{what} {extra} is not in pairing {self.name!r} (it allows {', '.join(full)})"
                )
        specs = set()
        for gemm_type, a, w, scale, zp in itertools.product(
            self.gemm_type,
            [d for d in self.a_dtype if a_dtypes is None or d in a_dtypes],
            [d for d in self.w_dtype if w_dtypes is None or d in w_dtypes],
            self.w_scale,
            self.w_zero_point,
        ):
            for scale_dtype, out_dtype, a_scale, a_scale_dtype in itertools.product(
                self.w_scale_dtype or (a,), self.out_dtype or (a,), self.a_scale, self.a_scale_dtype or (None,)
            ):
                specs.add(GemmSpec(gemm_type=gemm_type, a_dtype=a, a_scale=a_scale, a_scale_dtype=a_scale_dtype,
                                   w_dtype=w, w_scale=scale, w_scale_dtype=scale_dtype, w_zero_point=zp,
                                   out_dtype=out_dtype))
        return sorted(specs, key=_spec_sort_key)


def _spec_sort_key(spec: GemmSpec) -> tuple:
    return (spec.gemm_type.value, spec.a_dtype, spec.a_scale.value, spec.a_scale_dtype or "", spec.w_dtype,
            spec.w_scale.value, spec.w_scale_dtype, spec.w_zero_point.value, spec.out_dtype)


def _dtype_list(pairing: str, field: str, value, *, tie_allowed: bool) -> tuple[str, ...] | None:
    if tie_allowed and value == SAME_AS_A:
        return None
    values = [value] if isinstance(value, str) else list(value)
    for v in values:
        if v not in DTYPE_SHORT:
            raise ValueError(f"{SUPPORT_FILE}: pairing {pairing!r}: {field} {v!r} is not a known dtype name")
    return tuple(values)


def _enum_list(pairing: str, field: str, enum, values) -> tuple:
    try:
        return tuple(enum(v) for v in values)
    except ValueError:
        allowed = ", ".join(repr(e.value) for e in enum)
        raise ValueError(f"{SUPPORT_FILE}: pairing {pairing!r}: {field} {values!r} must use {allowed}") from None


def _parse_pairing(entry: dict) -> Pairing:
    name = entry.get("name", "<unnamed>")
    unknown = sorted(set(entry) - _PAIRING_KEYS)
    missing = sorted({"name", "archs", "a_dtype", "w_dtype", "w_scale_dtype", "out_dtype"} - set(entry))
    if unknown or missing:
        raise ValueError(f"{SUPPORT_FILE}: pairing {name!r}: unknown keys {unknown}, missing keys {missing}")
    for arch in entry["archs"]:
        parse_arch(arch)
    rules = tuple(entry.get("rules", ()))
    for rule in rules:
        if rule not in PREDICATES:
            raise ValueError(
                f"{SUPPORT_FILE}: pairing {name!r}: rule {rule!r} is not a predicate in "
                f"humming_aot.support.PREDICATES ({', '.join(PREDICATES)})"
            )
    return Pairing(
        name=name,
        doc=entry.get("doc", ""),
        archs=tuple(entry["archs"]),
        gemm_type=_enum_list(name, "gemm_type", GemmType, entry.get("gemm_type", ["dense"])),
        a_dtype=_dtype_list(name, "a_dtype", entry["a_dtype"], tie_allowed=False),
        a_scale=_enum_list(name, "a_scale", ActivationScale, entry.get("a_scale", ["none"])),
        a_scale_dtype=(_dtype_list(name, "a_scale_dtype", entry["a_scale_dtype"], tie_allowed=False)
                       if "a_scale_dtype" in entry else None),
        w_dtype=_dtype_list(name, "w_dtype", entry["w_dtype"], tie_allowed=False),
        w_scale=_enum_list(name, "w_scale", ScaleGranularity, entry.get("w_scale", ["g"])),
        w_scale_dtype=_dtype_list(name, "w_scale_dtype", entry["w_scale_dtype"], tie_allowed=True),
        w_zero_point=_enum_list(name, "w_zero_point", ZeroPoint, entry.get("w_zero_point", ["none"])),
        out_dtype=_dtype_list(name, "out_dtype", entry["out_dtype"], tie_allowed=True),
        rules=rules,
    )


@functools.cache
def pairings() -> tuple[Pairing, ...]:
    """Every pairing of support.toml, in file order (validated)."""
    result = tuple(_parse_pairing(entry) for entry in load_toml(SUPPORT_FILE).get("pairing", []))
    names = [p.name for p in result]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{SUPPORT_FILE}: pairing names {duplicates} appear more than once")
    return result


def pairing_by_name(name: str) -> Pairing:
    for p in pairings():
        if p.name == name:
            return p
    raise ValueError(
        f"unknown pairing {name!r}: {SUPPORT_FILE} has {', '.join(p.name for p in pairings())}"
    )


def supported_archs() -> list[str]:
    """Every arch some pairing covers, sorted."""
    return sorted({arch for p in pairings() for arch in p.archs}, key=arch_sort_key)


def arch_sort_key(arch: str) -> tuple[int, str]:
    """Numeric order for arch names: sm80 < sm89 < sm90a < sm120."""
    return parse_arch(arch)


def pairing_for(spec: GemmSpec, arch: str) -> Pairing | None:
    """The first pairing that allows ``spec`` on ``arch``, or None."""
    for p in pairings():
        if arch in p.archs and p.allows(spec):
            return p
    return None


def is_supported(spec: GemmSpec, arch: str) -> bool:
    return pairing_for(spec, arch) is not None


def describe_spec(spec: GemmSpec) -> str:
    """'a=bfloat16 w=int4 scale=group/bfloat16 zero_point=zpi out=bfloat16' (plus the gemm type
    when it is not dense)."""
    a_text = spec.a_dtype if not spec.a_is_quantized else (
        f"{spec.a_dtype} a_scale={spec.a_scale.name.lower()}/{spec.a_scale_dtype}")
    text = (
        f"a={a_text} w={spec.w_dtype} scale={spec.w_scale.name.lower()}/{spec.w_scale_dtype} "
        f"zero_point={spec.w_zero_point.value} out={spec.out_dtype}"
    )
    return text if spec.gemm_type is GemmType.DENSE else f"gemm_type={spec.gemm_type.value} {text}"


def why_unsupported(spec: GemmSpec, arch: str) -> str | None:
    """None when some pairing allows ``spec`` on ``arch``; else why not, naming the pairing and rule."""
    try:
        parse_arch(arch)
    except ValueError as e:
        return str(e)
    on_arch = [p for p in pairings() if arch in p.archs]
    if not on_arch:
        return (
            f"arch {arch} has no pairing in the support matrix ({SUPPORT_FILE}): "
            f"archs with pairings are {', '.join(supported_archs())}"
        )
    if any(p.allows(spec) for p in on_arch):
        return None
    elsewhere = [p for p in pairings() if p.allows(spec)]
    if elsewhere:
        p = elsewhere[0]
        return f"pairing {p.name!r} allows {describe_spec(spec)} only on {', '.join(p.archs)}, not on {arch}"
    closest = min(on_arch, key=lambda p: (len(p.mismatches(spec)), p.name))
    reason = (
        f"no pairing allows {describe_spec(spec)} on {arch}; the closest, {closest.name!r}, needs "
        + "; ".join(closest.mismatches(spec))
    )
    formats = sorted(
        {(s.w_dtype, s.w_zero_point.value, p.name) for p in on_arch for s in p.specs() if s.a_dtype == spec.a_dtype}
    )
    if formats:
        shown = ", ".join(f"{w} (zero point {zp}, pairing {name})" for w, zp, name in formats)
        return f"{reason}; allowed weight formats for {spec.a_dtype} activations on {arch}: {shown}"
    a_dtypes = sorted({a for p in on_arch for a in p.a_dtype})
    return f"{reason}; activation dtypes allowed on {arch}: {', '.join(a_dtypes)}"


def problem_errors(spec: GemmSpec, arch: str, m: int, n: int, k: int, group_size: int | None) -> list[str]:
    """Every failing rule's message for this problem (empty when the call can run).

    An unsupported spec gives the single ``why_unsupported`` message. ``group_size`` is the number
    of K elements per weight scale group; None, -1 or K mean per-channel scales.
    """
    pairing = pairing_for(spec, arch)
    if pairing is None:
        return [why_unsupported(spec, arch)]
    errors = []
    if m < 0 or n <= 0 or k <= 0:
        errors.append(f"shape M={m} N={n} K={k} is empty or negative: N and K must be positive, M at least 0")
        return errors
    shape = ProblemShape(m=m, n=n, k=k, group_size=group_size)
    for rule in pairing.rules:
        message = PREDICATES[rule](shape)
        if message is not None:
            errors.append(f"{message} [rule {rule} of pairing {pairing.name}]")
    return errors


def supported_specs(arch: str, gemm_type: GemmType | None = None) -> list[GemmSpec]:
    """Every GemmSpec some pairing allows on ``arch`` (of one GEMM type, when given), sorted and
    without duplicates."""
    specs = {s for p in pairings() if arch in p.archs for s in p.specs()
             if gemm_type is None or s.gemm_type is gemm_type}
    return sorted(specs, key=_spec_sort_key)


# ---------------------------------------------------------------------------------------------
# Docs

SUPPORT_TABLE_START = "<!-- support-matrix:start -->"
SUPPORT_TABLE_END = "<!-- support-matrix:end -->"


def render_support_markdown() -> str:
    """The support matrix as Markdown (a table of pairings, then the rules they name)."""

    def tied(values: tuple[str, ...] | None) -> str:
        return "same as activation" if values is None else ", ".join(values)

    lines = [
        "| Pairing | GEMM types | Activations | Weights | Scales | Zero point | Output | Archs | Rules |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    used_rules = []
    for p in pairings():
        scales = ", ".join(s.name.lower() for s in p.w_scale) + f" ({tied(p.w_scale_dtype)})"
        zero_points = ", ".join(zp.name.lower() for zp in p.w_zero_point)
        lines.append(
            f"| `{p.name}` | {', '.join(t.value for t in p.gemm_type)} | {', '.join(p.a_dtype)} "
            f"| {', '.join(p.w_dtype)} | {scales} | {zero_points} "
            f"| {tied(p.out_dtype)} | {', '.join(p.archs)} | {', '.join(f'`{r}`' for r in p.rules)} |"
        )
        used_rules += [r for r in p.rules if r not in used_rules]
    lines.append("")
    for p in pairings():
        if p.doc:
            lines.append(f"- `{p.name}`: {p.doc}.")
    lines.append("")
    lines.append("Rules checked against each call's shape:")
    lines.append("")
    for rule in used_rules:
        doc = " ".join((PREDICATES[rule].__doc__ or "").split())
        lines.append(f"- `{rule}`: {doc}")
    return "\n".join(lines) + "\n"


def replace_support_section(text: str) -> str:
    """``text`` (a README) with the part between the support-matrix markers regenerated."""
    start, end = text.find(SUPPORT_TABLE_START), text.find(SUPPORT_TABLE_END)
    if start < 0 or end < start:
        raise ValueError(
            f"the file has no '{SUPPORT_TABLE_START}' ... '{SUPPORT_TABLE_END}' section: add both "
            "markers where the support table belongs"
        )
    body = (
        f"{SUPPORT_TABLE_START}\n<!-- generated from catalog/{SUPPORT_FILE} by tools/gen_support_table.py;"
        f" do not edit -->\n\n{render_support_markdown()}\n"
    )
    return text[:start] + body + text[end:]
