"""The kernel's own unfolding of stored weight words (csrc/include/humming_aot/numerics/
packed_codes.cuh, compiled for the host) against the packing (humming_aot/packed_layout.py): for every
code width 1..8 and every code value, the padded nibble or byte words the dequantizer reads are
exactly those of the 4- or 8-bit layout (in the code bits of each nibble, for codes of 1 to 3
bits: the dequantizers mask the rest; 1-bit codes at bit s of a register s, not 4 s)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from humming_aot import packed_layout as packing

INCLUDE = Path(__file__).resolve().parents[2] / "csrc" / "include"

_PROGRAM = r"""
#include <cstdio>
#include <humming_aot/numerics/packed_codes.cuh>
using humming_aot::u32;
template <int kBits, int kTile>
void unfold_tile(const u32 (&p)[kBits], u32* out) {
  using Codes = humming_aot::numerics::PackedCodes<kBits>;
  u32 tile[Codes::kTileWords];
  Codes::template unfold_tile<kTile>(p, tile);
  for (int e = 0; e < Codes::kTileWords; ++e) out[kTile * Codes::kTileWords + e] = tile[e];
}
template <int kBits>
int run(bool by_tile) {
  using Codes = humming_aot::numerics::PackedCodes<kBits>;
  u32 p[kBits], out[Codes::kPaddedWords];
  while (true) {
    for (int i = 0; i < kBits; ++i) if (std::scanf("%x", &p[i]) != 1) return 0;
    if (by_tile) {  // each tile from only the stored words tile_sources() names
      unfold_tile<kBits, 0>(p, out);
      unfold_tile<kBits, 1>(p, out);
      unfold_tile<kBits, 2>(p, out);
      unfold_tile<kBits, 3>(p, out);
    } else {
      Codes::unfold(p, out);
    }
    for (int i = 0; i < Codes::kPaddedWords; ++i) std::printf("%08x%c", out[i], i + 1 < Codes::kPaddedWords ? ' ' : '\n');
  }
}
int main(int argc, char** argv) {
  const bool by_tile = argc > 2;
  switch (argv[1][0] - '0') {
    case 1: return run<1>(by_tile); case 2: return run<2>(by_tile); case 3: return run<3>(by_tile);
    case 4: return run<4>(by_tile); case 5: return run<5>(by_tile); case 6: return run<6>(by_tile);
    case 7: return run<7>(by_tile); case 8: return run<8>(by_tile);
  }
  return 2;
}
"""


def _compiler() -> str:
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return name
    pytest.fail("no host C++ compiler (c++, g++ or clang++) on PATH: nvcc needs one too; install g++")


@pytest.fixture(scope="module")
def unfold_program(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("packed_codes")
    source = out / "unfold.cpp"
    source.write_text(_PROGRAM)
    binary = out / "unfold"
    subprocess.run([_compiler(), "-std=c++17", "-O1", "-I", str(INCLUDE), str(source), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    return binary


@pytest.mark.parametrize("bits", range(1, 9))
def test_kernel_unfold_matches_the_packed_layout(unfold_program, bits):
    n, k = 128, 16 * 24
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (n, k), generator=gen)
    codes[0, : 2**bits] = torch.arange(2**bits)  # every code value at least once
    stored = (packing.pack_codes(codes, bits).to(torch.int64) & 0xFFFFFFFF).reshape(-1, bits)
    text = "\n".join(" ".join(f"{int(x):08x}" for x in row) for row in stored.tolist()) + "\n"
    result = subprocess.run([str(unfold_program), str(bits)], input=text, capture_output=True, text=True, check=True)
    got = torch.tensor([[int(x, 16) for x in line.split()] for line in result.stdout.splitlines()], dtype=torch.int64)
    lane_bits = 4 if bits <= 4 else 8
    expected = packing._padded_words(codes, lane_bits).reshape(-1, 4 if lane_bits == 4 else 8)
    assert got.shape == expected.shape
    if bits == 1:  # the kernel's 1-bit padded words hold register s at bit s (kRegisterSpacing), not 4 s
        got = sum(((got >> s) & 0x00010001) << 4 * s for s in range(4))
    # codes of 1 to 3 bits: the nibble bits above the code are undefined (the dequantizers mask them)
    got = got & (((1 << bits) - 1) * 0x11111111 if bits < 4 else 0xFFFFFFFF)
    assert torch.equal(got, expected), f"{bits}-bit: {(got != expected).sum().item()} padded words differ"
    # and the padded words hold the codes themselves
    assert torch.equal(packing._codes_from_padded(got.reshape(k // 16, n // 64, 32, -1), n, k, lane_bits),
                       codes.to(torch.int32))


@pytest.mark.parametrize("bits", range(1, 9))
def test_each_tile_unfolds_from_only_its_source_words(unfold_program, bits):
    """unfold_tile<j> reads only the stored words tile_sources(j) names (the wgmma body loads no
    others): it must still give exactly tile j's padded words, for random stored words."""
    gen = torch.Generator().manual_seed(100 + bits)
    stored = torch.randint(0, 2**32, (512, bits), generator=gen, dtype=torch.int64)
    text = "\n".join(" ".join(f"{int(x):08x}" for x in row) for row in stored.tolist()) + "\n"
    full = subprocess.run([str(unfold_program), str(bits)], input=text, capture_output=True, text=True, check=True)
    tiles = subprocess.run([str(unfold_program), str(bits), "tiles"], input=text, capture_output=True, text=True,
                           check=True)
    assert len(full.stdout.splitlines()) == 512
    assert tiles.stdout == full.stdout


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_unpack_and_reference_agree_for_every_width(bits):
    n, k = 192, 48
    codes = torch.randint(0, 2**bits, (n, k), generator=torch.Generator().manual_seed(100 + bits))
    words = packing.pack_codes(codes, bits)
    assert words.shape == (k // 16, n * bits // 2) and words.dtype == torch.int32
    assert torch.equal(words, packing.reference_pack_codes(codes, bits))
    assert torch.equal(packing.unpack_codes(words, n, k, bits), codes.to(torch.int32))


@pytest.mark.parametrize("bits", [0, 9])
def test_other_widths_are_refused(bits):
    with pytest.raises(ValueError, match="1 to 8 bits"):
        packing.pack_codes(torch.zeros(64, 16, dtype=torch.int64), bits)
