"""The bf16 biased decode's constants (csrc/include/humming_aot/numerics/int_dequantizer.cuh),
compiled for the host with nvcc and checked bit by bit: for every code of 1 to 4 bits in every
register s of a padded nibble word, the kernel's lop3 ((word >> shift) & mask | magic) gives the
bf16 bias_s + unit x q exactly, and the offset pair the body subtracts is bias_s + unit x z; so
(decoded - offset) / unit = q - z. The 1-bit nibble decode (two bias patterns, the high nibble
with a unit of 8, its bit 7 in the exponent) is checked the same way, from the stored word."""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from humming_aot.aot import ninja as driver

INCLUDE = Path(__file__).resolve().parents[2] / "csrc" / "include"

# One line per (kind, bits, register, low-half code, high-half code): the decoded register and
# the offset pair, as the kernel forms them (lop3 LUT 0xEA: (a & b) | c).
_PROGRAM = r"""
#include <cstdio>
#include <humming_aot/numerics/int_dequantizer.cuh>
using namespace humming_aot;
using namespace humming_aot::numerics;

template <int kBits>
void biased() {
  using D = IntDequantizer<BFloat16, kBits, ZeroPointKind::kImplicit>;
  using C = PackedCodes<kBits>;
  for (int s = 0; s < 4; ++s)
    for (u32 lo = 0; lo < (1u << kBits); ++lo)
      for (u32 hi = 0; hi < (1u << kBits); ++hi) {
        // the padded word: register s's code at bit kRegisterSpacing * s of each half, the other
        // code bits of the word set (the mask must drop them)
        const int at = C::kRegisterSpacing * s;
        const u32 others = ~((C::kCodeMask2 << at)) & 0xFFFFFFFFu;
        const u32 word = (lo << at) | (hi << (16 + at)) | others;
        const u32 x = ((word >> D::biased_shift(s)) & (C::kCodeMask2 << D::biased_position(s))) | D::biased_magic2(s);
        std::printf("biased %d %d %u %u %08x %08x %d\n", kBits, s, lo, hi, x, D::offset_pair(s), 1);
      }
}

template <bool kUpper>
void nibble() {
  using D = IntDequantizer<BFloat16, 1, ZeroPointKind::kImplicit>;
  for (int s = 0; s < 4; ++s)
    for (u32 lo = 0; lo < 2; ++lo)
      for (u32 hi = 0; hi < 2; ++hi) {
        const int at = s + 4 * kUpper;
        const u32 mask = 0x00010001u << at;
        const u32 word = (lo << at) | (hi << (16 + at)) | (~mask & 0xFFFFFFFFu);
        const u32 x = (word & mask) | (D::bf16_bits_of(D::nibble_bias(s, kUpper)) * 0x00010001u);
        std::printf("nibble%d 1 %d %u %u %08x %08x %d\n", kUpper ? 1 : 0, s, lo, hi, x, D::nibble_offset_pair(s, kUpper),
                    kUpper ? D::kUpperUnit : 1);
      }
}

int main() {
  biased<1>();
  biased<2>();
  biased<3>();
  biased<4>();
  nibble<false>();
  nibble<true>();
  return 0;
}
"""


def _bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


@pytest.fixture(scope="module")
def decode_lines(tmp_path_factory) -> list[list[str]]:
    try:
        nvcc = driver.find_nvcc()
    except driver.NvccNotFoundError:
        pytest.fail("nvcc not found (set HUMMING_AOT_NVCC): the decode's constants are checked through it")
    out = tmp_path_factory.mktemp("biased_decode")
    source = out / "decode.cu"
    source.write_text(_PROGRAM)
    binary = out / "decode"
    subprocess.run([str(nvcc), "-std=c++17", "-I", str(INCLUDE), str(source), "-o", str(binary)], check=True,
                   capture_output=True, text=True)
    result = subprocess.run([str(binary)], check=True, capture_output=True, text=True)
    return [line.split() for line in result.stdout.splitlines()]


def test_every_code_decodes_to_bias_plus_unit_times_code(decode_lines):
    seen = set()
    for kind, bits, s, lo, hi, x, offset, unit in decode_lines:
        bits, s, lo, hi, unit = int(bits), int(s), int(lo), int(hi), int(unit)
        x, offset = int(x, 16), int(offset, 16)
        zero = 1 << (bits - 1)
        offset_value = _bf16(offset)
        assert offset == (offset & 0xFFFF) * 0x00010001, f"{kind} {bits}-bit s={s}: offset pair differs per lane"
        bias = offset_value - unit * zero
        assert bias > 0 and bias == int(bias), f"{kind} {bits}-bit s={s}: bias {bias}"
        for half, code in ((x & 0xFFFF, lo), (x >> 16, hi)):
            value = _bf16(half)
            assert value == bias + unit * code, (
                f"{kind} {bits}-bit register {s}: code {code} decodes to {value}, not {bias} + {unit} x {code}")
            assert (value - offset_value) / unit == code - zero
        seen.add((kind, bits, s))
    assert len(seen) == 4 * 4 + 2 * 4, f"cases seen: {sorted(seen)}"
