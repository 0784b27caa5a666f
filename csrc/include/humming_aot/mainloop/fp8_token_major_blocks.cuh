#pragma once
// The K loop of the wgmma-ss body's consumers for e4m3 codes with block scales (128 x 128 weight
// blocks, 1 x 128 token groups) where the tokens are wgmma's M (kernel/dense_wgmma_ss.cuh's
// token-major tile: warpgroup wg multiplies tokens 64 wg + [0, 64) by the CTA's 128 channels, one
// weight block). Each K tile's wgmma go into a scratch set that the first k32 step overwrites; two
// sets take turns, so that K tile t + 1's wgmma run while K tile t is promoted into the fp32
// accumulators. A thread's accumulators hold two tokens (epilogue/token_major_fragments.cuh), so
// the promotion weighs them with two factors, token scale x weight-block scale: two shared loads
// of the K block's token scales (staged in the slot after the codes by the producer) and the
// block's weight scale (a global load issued before the wait; in the MoE schedule a shared load:
// its gathering warp stages it after the token scales, kernel::StagedWeightScales), then one FFMA
// per accumulator. (The transposed tile, mainloop/fp8_promotion.cuh, holds 32 tokens a thread and
// spends 16 shared loads and 32 multiplies on its factors.)
// Contract: `consume` leaves acc with the warpgroup's scaled fp32 sums and every slot it took
// released.

#include <humming_aot/epilogue/token_major_fragments.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/wgmma_ss_ring.cuh>
#include <humming_aot/memory/shared_fragments.cuh>

namespace humming_aot::mainloop {

template <class Ring,      // mainloop::WgmmaSsRing over mma::WgmmaE4m3<128>, kTokensAsA
          int kCodeBytes,  // bytes of codes in a slot (the K block's token scales follow)
          int kTokens>     // the tile's tokens: floats of staged token scales (the weight block's scale follows)
struct Fp8TokenMajorBlocks {
  static constexpr int kAccumulators = Ring::kAccumulators;
  static constexpr int kBlockK = 128;
  using Fragments = epilogue::TokenMajorFragments<2 * kAccumulators>;

  // `count` K tiles from k_tile0 of the tile at (m0, n0) into acc (zeroed first). Params: what
  // kernel/params.cuh's scale_gemm reads (the dense body's ScaledTmaGemmParams, or the MoE
  // schedule's ScaledRows of the tile's expert, n0 within it).
  template <class Params>
  static __device__ __forceinline__ void consume(const Params& params, int /*m0*/, int n0, int k_tile0, int count,
                                                 u32 smem_base, u32 full0, u32 empty0, typename Ring::State& ring,
                                                 float (&acc)[kAccumulators]) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    if (count <= 0) return;
    const kernel::GemmParams& p = kernel::scale_gemm(params);
    // the CTA's 128 channels are one weight block (n0 is a multiple of 128 below N): its row of scales
    const float* block_scales = static_cast<const float*>(p.w_scale) + static_cast<i64>(n0 >> 7) * (p.k / kBlockK);
    constexpr bool kStagedWeight = kernel::StagedWeightScales<Params>::kValue;
    float even[kAccumulators], odd[kAccumulators];
    int even_slot = Ring::template issue<false>(smem_base, full0, ring, even), odd_slot;
    for (int it = 1; it < count; it += 2) {
      odd_slot = Ring::template issue<false>(smem_base, full0, ring, odd);  // K tile it
      retire_tile<1, kStagedWeight>(block_scales, k_tile0 + it - 1, smem_base, empty0, even_slot, even,
                                    acc);  // K tile it - 1
      if (it + 1 == count) {
        retire_tile<0, kStagedWeight>(block_scales, k_tile0 + it, smem_base, empty0, odd_slot, odd, acc);
        return;
      }
      even_slot = Ring::template issue<false>(smem_base, full0, ring, even);  // K tile it + 1
      retire_tile<1, kStagedWeight>(block_scales, k_tile0 + it, smem_base, empty0, odd_slot, odd, acc);
    }
    retire_tile<0, kStagedWeight>(block_scales, k_tile0 + count - 1, smem_base, empty0, even_slot, even, acc);
  }

  // Once at most kPending groups are in flight: add `from` (K block kb, in `slot`) weighed by its
  // tokens' and weight block's scales into acc, and release the slot. kStagedWeight: the weight
  // block's scale is in the slot after the token scales, else at block_scales[kb].
  template <int kPending, bool kStagedWeight>
  static __device__ __forceinline__ void retire_tile(const float* block_scales, int kb, u32 smem_base, u32 empty0,
                                                     int slot, float (&from)[kAccumulators],
                                                     float (&acc)[kAccumulators]) {
    // (shared loads on the 32-bit address: a generic pointer into shared memory costs two S2UR
    // per K tile)
    const u32 staged = staged_token_scales(smem_base, slot);
    const float weight_scale = kStagedWeight ? memory::lds_float(staged + 4 * kTokens) : __ldg(block_scales + kb);
    const u32 first = staged + 4 * Fragments::first_token();
    const float token_scale0 = memory::lds_float(first), token_scale1 = memory::lds_float(first + 32);
    mma::wgmma_wait_group<kPending>();
    mma::wgmma_fence_operands(from);
    // the shared loads above are issued before the release (the producer refills the slot after it)
    Ring::release(empty0, slot);
    const float scale0 = token_scale0 * weight_scale, scale1 = token_scale1 * weight_scale;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = fmaf(from[i], (i & 2) ? scale1 : scale0, acc[i]);
  }

  // The shared address of the K block's token scales in `slot` (after its codes; token t of the
  // tile at float t).
  static __device__ __forceinline__ u32 staged_token_scales(u32 smem_base, int slot) {
    return smem_base + slot * Ring::kStageBytes + kCodeBytes;
  }
};

}  // namespace humming_aot::mainloop
