"""The float-code decode the kernels will use (csrc/include/humming_aot/numerics/float_codes.cuh,
compiled for the host) against humming_aot.formats: for every signed float format of at most 8
bits with an exponent field, both activation dtypes it fits, and every code, the placed 16-bit
number times 2^kCompensation is the format's value exactly (finite codes; Inf and NaN codes of
IEEE-like formats stay Inf and NaN), both one code at a time and two codes per word."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_packed_codes import INCLUDE, _compiler

from humming_aot import formats

TARGETS = {"bfloat16": (8, 7), "float16": (5, 10)}


def _cases() -> list[tuple[str, str]]:
    cases = []
    for name in formats.all_names():
        fmt = formats.get(name)
        if fmt.kind is not formats.FormatKind.FLOAT or not fmt.is_signed or fmt.exponent_bits < 1 or fmt.bits > 8:
            continue
        for target, (exp, man) in TARGETS.items():
            # a finite-only code with the target's exponent width would place its top binade on
            # the target's Inf/NaN: such formats need the code's exponent to be narrower
            top_binade_ok = fmt.exponent_bits < exp or fmt.has_inf
            if fmt.exponent_bits <= exp and fmt.mantissa_bits <= man and top_binade_ok:
                cases.append((name, target))
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def placer(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("float_codes")
    branches = []
    for i, (name, target) in enumerate(CASES):
        fmt = formats.get(name)
        t = "true" if target == "bfloat16" else "false"
        branches.append(f"    case {i}: return run<{fmt.exponent_bits}, {fmt.mantissa_bits}, {t}>();")
    source = out / "place.cpp"
    source.write_text(r"""
#include <cstdio>
#include <cstdlib>
#include <humming_aot/numerics/float_codes.cuh>
using humming_aot::u32;
template <int E, int M, bool B>
int run() {
  using F = humming_aot::numerics::FloatCodes<E, M, B>;
  const u32 n = 1u << F::kBits;
  std::printf("%d\n", F::kCompensation);
  for (u32 c = 0; c < n; ++c) {
    const u32 pair = F::place_pair(c | (((c * 7u + 3u) % n) << 16));
    std::printf("%04x %04x %04x\n", F::place(c), pair & 0xFFFFu, pair >> 16);
  }
  return 0;
}
int main(int argc, char** argv) {
  switch (std::atoi(argv[1])) {
""" + "\n".join(branches) + r"""
  }
  return 2;
}
""")
    binary = out / "place"
    subprocess.run([_compiler(), "-std=c++17", "-O1", "-I", str(INCLUDE), str(source), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    return binary


def _to_float(bits: list[int], target: str) -> np.ndarray:
    raw = np.array(bits, dtype=np.uint32)
    if target == "bfloat16":
        return (raw << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.uint16).view(np.float16).astype(np.float64)


def test_every_small_float_format_is_covered():
    names = {name for name, _ in CASES}
    for name in ("float4e2m1", "float5e2m2", "float6e3m2", "float6e2m3", "float7e3m3", "float8e4m3", "float8e5m2"):
        assert (name, "bfloat16") in CASES, name
    assert ("float8e4m3", "float16") in CASES and ("float8e5m2", "float16") in CASES
    assert not any(formats.get(name).exponent_bits > 5 for name, target in CASES if target == "float16")
    assert ("float7e5m1", "float16") not in CASES  # finite-only E5: its top binade is f16's Inf/NaN
    assert len(names) >= 20


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{n}-{t}" for n, t in CASES])
def test_placed_codes_decode_exactly(placer, case):
    name, target = CASES[case]
    fmt = formats.get(name)
    lines = subprocess.run([str(placer), str(case)], capture_output=True, text=True, check=True).stdout.split("\n")
    compensation = int(lines[0])
    rows = [line.split() for line in lines[1:] if line]
    n = 1 << fmt.bits
    assert len(rows) == n
    codes = torch.arange(n)
    expected = fmt.decode(codes).double().numpy()
    with np.errstate(invalid="ignore"):  # NaN codes stay NaN
        single = _to_float([int(r[0], 16) for r in rows], target) * 2.0**compensation
        low = _to_float([int(r[1], 16) for r in rows], target) * 2.0**compensation
        high = _to_float([int(r[2], 16) for r in rows], target) * 2.0**compensation
    partner = fmt.decode((codes * 7 + 3) % n).double().numpy()
    finite = np.isfinite(expected)
    # With the target's exponent width, IEEE-like codes place their Inf and NaN on the target's;
    # otherwise special codes place as finite numbers (the quantizer never produces them)
    special = ~finite
    if fmt.has_inf and fmt.exponent_bits == TARGETS[target][0]:
        np.testing.assert_array_equal(np.isnan(single[special]), np.isnan(expected[special]))
        np.testing.assert_array_equal(single[np.isinf(expected)], expected[np.isinf(expected)])
    np.testing.assert_array_equal(single[finite], expected[finite], err_msg=f"{name} -> {target}")
    np.testing.assert_array_equal(low[finite], expected[finite], err_msg=f"{name} -> {target}, low half")
    pf = np.isfinite(partner)
    np.testing.assert_array_equal(high[pf], partner[pf], err_msg=f"{name} -> {target}, high half")
    # signed zeros keep their sign
    assert np.signbit(single[n // 2]) and not np.signbit(single[0])
