#pragma once
// Shared -> register load and dequantization of one warp's wgmma A fragment: the packed 16 x 16
// weight tile `tile` (16 channels) of 64-column unit `unit` at K step kk of a staged K tile, with
// its scale pair (and zero points), in the register layout of wgmma's A operand (the same as
// mma.sync m16n8k16's A). Stage layout: memory/stage_loader.cuh (StageLayout). Used by every
// wgmma body (kernel/dense_wgmma.cuh, kernel/dense_wgmma_ws.cuh). SM90.

#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/memory/stage_loader.cuh>
#include <humming_aot/numerics/weight_codes.cuh>

namespace humming_aot::memory {

template <class Act,      // Float16 or BFloat16: activation and scale dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          class Layout,  // StageLayout of the stage the tile is read from
          int kBlockN,   // weight channels of the staged tile (scale row length)
          int kBlockK>   // K of the staged tile
struct WgmmaWeightFragment {
  static constexpr int kBits = Weights::kBits;
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;
  using Dequantizer = typename Weights::template Dequantizer<Act, kZeroPoint>;
  using Codes = numerics::PackedCodes<kBits>;

  // Folded widths: unfolding every tile of a K step to use one costs the most for 5-bit codes
  // (three of the eight byte words gather bits from five words), so 5-bit warps unfold only
  // their own tile, behind a warp-uniform branch. For 1-3, 6 and 7 bits the branch cost more than
  // it saved (docs/performance/log.md section 10: int3 at M = 4096 went from 956 to 1110 us).
  static constexpr bool kUnfoldOwnTileOnly = kBits == 5;

  // The padded words of tile kTile from the lane's stored words at w_addr, reading only the
  // stored words that tile is made of (numerics/packed_codes.cuh, tile_sources).
  template <int kTile>
  static __device__ __forceinline__ void unfold_tile(u32 w_addr, u32 (&words)[Dequantizer::kWordsPerTile]) {
    u32 stored[kBits];
#pragma unroll
    for (int i = 0; i < kBits; ++i) {
      stored[i] = 0u;
      if ((Codes::tile_sources(kTile) >> i) & 1u) {
        asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(stored[i]) : "r"(w_addr + 4 * i));
      }
    }
    Codes::template unfold_tile<kTile>(stored, words);
  }

  // The lane's scale pair of a tile (channels 16 tile + g and 16 tile + 8 + g, permuted per unit)
  // and its zero-point pair (0 without zero points).
  struct ScalePair {
    u32 scale2, zero2;
  };

  // Tile `tile`'s scale (and zero-point) pair of unit `unit` in staged scale row `row`.
  static __device__ __forceinline__ ScalePair scales(u32 stage_smem, int row, int unit, int tile) {
    const int lane = threadIdx.x & 31;
    const u32 s_smem = stage_smem + Layout::kABytes + Layout::kWBytes;
    const u32 s_offset = 2 * (row * kBlockN + unit * 64 + (lane >> 2) * 8 + 2 * tile);
    ScalePair s{0u, 0u};
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(s.scale2) : "r"(s_smem + s_offset));
    if constexpr (kHasZeroPoint) {
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(s.zero2) : "r"(s_smem + Layout::kSBytes + s_offset));
    }
    return s;
  }

  // Dequantize tile `tile` (0..3, warp-uniform) of unit `unit` at K step kk into a (wgmma A
  // fragment registers of this lane), with the scales of its row.
  static __device__ __forceinline__ void load(u32 stage_smem, int kk, int unit, int tile,
                                              const GroupWalk<kBlockK>& walk, u32 (&a)[4]) {
    load(stage_smem, kk, unit, tile, scales(stage_smem, kk >> walk.step_shift, unit, tile), a);
  }

  // The same with the tile's scale pair given (loaded once for the K steps of one scale row).
  static __device__ __forceinline__ void load(u32 stage_smem, int kk, int unit, int tile, const ScalePair& s,
                                              u32 (&a)[4]) {
    const int lane = threadIdx.x & 31;
    const u32 w_smem = stage_smem + Layout::kABytes;
    // the lane's kBits stored words of (kk, unit) hold the unit's 4 tiles
    u32 words[Dequantizer::kWordsPerTile];
    const u32 w_addr = w_smem + 4 * (((kk * Layout::kUnits + unit) * 32 + lane) * kBits);
    if constexpr (kBits == 4 || kBits == 8) {  // tile j is stored as is, at byte j * kBits
      lds_words(words, w_addr + tile * kBits);
    } else if constexpr (kBits == 1) {  // one shift by the warp's tile, no unfold-and-select
      u32 stored;
      asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(stored) : "r"(w_addr));
      words[0] = Codes::one_bit_tile_word(stored, tile);
    } else if constexpr (kUnfoldOwnTileOnly) {  // load and unfold only what this warp's tile is made of
      if (tile == 0) {                          // warp-uniform
        unfold_tile<0>(w_addr, words);
      } else if (tile == 1) {
        unfold_tile<1>(w_addr, words);
      } else if (tile == 2) {
        unfold_tile<2>(w_addr, words);
      } else {
        unfold_tile<3>(w_addr, words);
      }
    } else {  // unfold all 4 tiles, keep this warp's
      u32 stored[kBits], padded[Codes::kPaddedWords];
      lds_words(stored, w_addr);
      Codes::unfold(stored, padded);
      // select with constant indices (a run-time index would put `padded` in local memory)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < Dequantizer::kWordsPerTile; ++e) {
          if (j == tile) words[e] = padded[j * Dequantizer::kWordsPerTile + e];
        }
      }
    }
    u32 frag[2][2];  // frag[h][r]: channel g + 8 h, K half r
    Dequantizer::dequantize(words, s.scale2, s.zero2, frag);
    a[0] = frag[0][0];
    a[1] = frag[1][0];
    a[2] = frag[0][1];
    a[3] = frag[1][1];
  }
};

}  // namespace humming_aot::memory
