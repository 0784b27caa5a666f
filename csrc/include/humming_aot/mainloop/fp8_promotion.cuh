#pragma once
// The K loop of the wgmma-ss body's consumers for e4m3 codes (kernel/dense_wgmma_ss.cuh):
// Hopper's fp8 wgmma keeps fewer accumulator bits than fp32, so each K tile's four wgmma steps
// (128 of K) go into a scratch set that the first step overwrites, which is added to the fp32
// accumulators once the tile's wgmma have completed (the error bound then holds at K = 16384:
// tests/gpu/test_w8a8_gpu.py). The slot is released at that point, before the add (with block
// scales above 16 tokens after it: the add reads the slot's staged token scales).
// - serial: one scratch set; with block scales (kBlockScales) the add weighs the tile by its K
//   block's token and weight-block scales, loaded before the wait so that the wgmma hide them
//   (staged token scales, above 16 tokens: read from the slot pair by pair as the add goes, the
//   slot released after it, so that no register holds them: what lets 160 tokens fit);
// - overlapped (kOverlapped, where a third set of registers fits): two scratch sets take turns, so
//   that K tile t + 1's wgmma run while K tile t is added; with block scales (staged token scales
//   only: above 16 tokens) each add reads its K block's token scales from the slot, pair by pair,
//   and releases the slot after them, so that no register holds them across the loop.
// Contract: `consume` leaves acc with the unit's fp32 sums (blocks: already scaled) and every slot
// it took released.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mainloop/wgmma_ss_ring.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>

namespace humming_aot::mainloop {

template <class Ring,         // mainloop::WgmmaSsRing over mma::WgmmaE4m3<kBlockM>
          bool kBlockScales,  // scales per 128 x 128 weight block and 1 x 128 token group
          int kBlockM,        // tokens per CTA
          int kCodeBytes,     // bytes of codes in a slot (block scales: the token scales follow)
          bool kOverlapped>   // two scratch sets (with block scales: above 16 tokens only)
struct Fp8Promotion {
  static constexpr int kAccumulators = Ring::kAccumulators;
  static constexpr int kUnitAccumulators = Ring::kUnitAccumulators;
  static constexpr int kUnitsPerWarpGroup = kAccumulators / kUnitAccumulators;
  static constexpr int kBlockK = 128;
  // Blocks, above 16 tokens: the K block's token scales are staged in the slot after the codes
  // (the kernel's producer copies them); at 8 and 16 tokens each thread loads its own.
  static constexpr bool kStagedTokenScales = kBlockScales && kBlockM > 16;
  static constexpr int kTokenScales = kBlockM / 4;  // the tokens of a thread's accumulators
  // Whether the slot also holds the K block's weight-block scales (after the token scales, one
  // float per 128 channels of the CTA): the MoE schedule's (kernel::StagedWeightScales).
  template <class Params>
  static constexpr bool kStagedWeightScales = kStagedTokenScales && kernel::StagedWeightScales<Params>::kValue;
  static_assert(!kOverlapped || !kBlockScales || kStagedTokenScales,
                "the overlapped loop reads block scales' token scales from the slot only");

  // `count` K tiles from k_tile0 of the tile at (m0, n0) into acc (zeroed first). Params: with
  // block scales, what kernel/params.cuh's scale_gemm and token_scale_rows read (the dense body's
  // ScaledTmaGemmParams, or the MoE schedule's ScaledRows of the tile's expert, m0 and n0 within
  // it); without them any (unused).
  template <class Params>
  static __device__ __forceinline__ void consume(const Params& params, int m0, int n0, int k_tile0, int count,
                                                 u32 smem_base, u32 full0, u32 empty0, typename Ring::State& ring,
                                                 float (&acc)[kAccumulators]) {
    if constexpr (kOverlapped) {
      consume_overlapped(params, n0, k_tile0, count, smem_base, full0, empty0, ring, acc);
    } else {
      consume_serial(params, m0, n0, k_tile0, count, smem_base, full0, empty0, ring, acc);
    }
  }

  // Once at most kPending groups are in flight: add `from` (K block kb, in `slot`) into acc and
  // release the slot (channel scales: before the add; block scales: after it, whose token scales
  // it reads from the slot).
  template <int kPending, class Params>
  static __device__ __forceinline__ void retire_tile(const Params& params, int n0, int kb, u32 smem_base, u32 empty0,
                                                     int slot, float (&from)[kAccumulators],
                                                     float (&acc)[kAccumulators]) {
    if constexpr (kBlockScales) {
      const int unit0 = (static_cast<int>(threadIdx.x) >> 7) * kUnitsPerWarpGroup;
      float unit_scales[kUnitsPerWarpGroup];  // (global: their latency under the wait)
      if constexpr (kStagedWeightScales<Params>) {
        staged_unit_scales(smem_base, slot, unit0, unit_scales);
      } else {
        const kernel::GemmParams& p = kernel::scale_gemm(params);
        load_unit_scales(p, n0, unit0, kb, p.k / kBlockK, unit_scales);
      }
      mma::wgmma_wait_group<kPending>();
      mma::wgmma_fence_operands(from);
      add_weighed(staged_token_scales(smem_base, slot), unit_scales, from, acc);
      Ring::release(empty0, slot);
    } else {
      mma::wgmma_wait_group<kPending>();
      mma::wgmma_fence_operands(from);
      Ring::release(empty0, slot);
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] += from[i];
    }
  }

  template <class Params>
  static __device__ __forceinline__ void consume_overlapped(const Params& params, int n0, int k_tile0, int count,
                                                            u32 smem_base, u32 full0, u32 empty0,
                                                            typename Ring::State& ring, float (&acc)[kAccumulators]) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    if (count <= 0) return;
    float even[kAccumulators], odd[kAccumulators];
    int even_slot = Ring::template issue<false>(smem_base, full0, ring, even), odd_slot;
    for (int it = 1; it < count; it += 2) {
      odd_slot = Ring::template issue<false>(smem_base, full0, ring, odd);                    // K tile it
      retire_tile<1>(params, n0, k_tile0 + it - 1, smem_base, empty0, even_slot, even, acc);  // K tile it - 1
      if (it + 1 == count) {
        retire_tile<0>(params, n0, k_tile0 + it, smem_base, empty0, odd_slot, odd, acc);
        return;
      }
      even_slot = Ring::template issue<false>(smem_base, full0, ring, even);  // K tile it + 1
      retire_tile<1>(params, n0, k_tile0 + it, smem_base, empty0, odd_slot, odd, acc);
    }
    retire_tile<0>(params, n0, k_tile0 + count - 1, smem_base, empty0, even_slot, even, acc);
  }

  // Blocks, above 16 tokens: acc += from weighed by the staged token scales (`staged`: this
  // thread's first, staged_token_scales) and each unit's weight-block scale. Token 2 (lane % 4) +
  // 8 j + {0, 1}: one 8-byte pair per j, weighing accumulators 4 j .. 4 j + 3 of each unit, read
  // as the add goes so that no register holds them across it (the caller releases the slot after).
  static __device__ __forceinline__ void add_weighed(u32 staged, const float (&unit_scales)[kUnitsPerWarpGroup],
                                                     const float (&from)[kAccumulators], float (&acc)[kAccumulators]) {
#pragma unroll
    for (int j = 0; j < kTokenScales / 2; ++j) {
      // (a shared load on the 32-bit address: a generic pointer costs two S2UR a K tile)
      const float2 pair = memory::lds_float2(staged + 32 * j);
#pragma unroll
      for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
        const float even_scale = pair.x * unit_scales[u], odd_scale = pair.y * unit_scales[u];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int a = u * kUnitAccumulators + 4 * j + e;
          acc[a] = fmaf(from[a], (e & 1) ? odd_scale : even_scale, acc[a]);
        }
      }
    }
  }

  // Blocks, above 16 tokens: the shared address of this thread's first staged token scale in
  // `slot` (token 2 (lane % 4); its others follow 8 floats apart, in pairs).
  static __device__ __forceinline__ u32 staged_token_scales(u32 smem_base, int slot) {
    const int lane = threadIdx.x & 31;
    return smem_base + slot * Ring::kStageBytes + kCodeBytes + 8 * (lane & 3);
  }

  template <class Params>
  static __device__ __forceinline__ void consume_serial(const Params& params, int m0, int n0, int k_tile0, int count,
                                                        u32 smem_base, u32 full0, u32 empty0,
                                                        typename Ring::State& ring, float (&acc)[kAccumulators]) {
    [[maybe_unused]] const int unit0 = (static_cast<int>(threadIdx.x) >> 7) * kUnitsPerWarpGroup;
    [[maybe_unused]] int k_blocks = 0;
    if constexpr (kBlockScales) k_blocks = kernel::scale_gemm(params).k / kBlockK;  // K rounded up to the K tile
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    float scratch[kAccumulators];
    for (int it = 0; it < count; ++it) {
      // blocks: this K block's scales, loaded before the wait so that the wgmma hide their latency
      // (staged token scales: read pair by pair as the add goes, which then releases the slot)
      float token_scales[kBlockScales && !kStagedTokenScales ? kTokenScales : 1], unit_scales[kUnitsPerWarpGroup];
      if constexpr (kBlockScales && !kStagedTokenScales) {
        load_block_scales(params, m0, n0, unit0, k_tile0 + it, k_blocks, token_scales, unit_scales);
      } else if constexpr (kBlockScales && !kStagedWeightScales<Params>) {
        load_unit_scales(kernel::scale_gemm(params), n0, unit0, k_tile0 + it, k_blocks, unit_scales);
      }
      const int slot = Ring::template issue<false>(smem_base, full0, ring, scratch);
      if constexpr (kStagedWeightScales<Params>) staged_unit_scales(smem_base, slot, unit0, unit_scales);
      mma::wgmma_wait_group<0>();
      mma::wgmma_fence_operands(scratch);
      if constexpr (kStagedTokenScales) {
        add_weighed(staged_token_scales(smem_base, slot), unit_scales, scratch, acc);
        Ring::release(empty0, slot);
        continue;
      }
      // Lane 0 releases the slot for the warp before the add: nothing of it is read after this.
      Ring::release(empty0, slot);
      if constexpr (kBlockScales) {
        // acc[u * kUnitAccumulators + i] holds token 8 (i >> 2) + (i & 1) (+ this thread's first)
#pragma unroll
        for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
#pragma unroll
          for (int i = 0; i < kUnitAccumulators; ++i) {
            const int a = u * kUnitAccumulators + i;
            acc[a] = fmaf(scratch[a], token_scales[2 * (i >> 2) + (i & 1)] * unit_scales[u], acc[a]);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) acc[i] += scratch[i];
      }
    }
  }

  // Blocks, the MoE schedule's slots: the K block's scale of each of this thread's units' weight
  // block, staged in `slot` after the token scales (the CTA's first 128 channels' at float
  // kBlockM; n0 is a multiple of 128).
  static __device__ __forceinline__ void staged_unit_scales(u32 smem_base, int slot, int unit0,
                                                            float (&unit_scales)[kUnitsPerWarpGroup]) {
    const u32 staged = smem_base + slot * Ring::kStageBytes + kCodeBytes + 4 * kBlockM;
#pragma unroll
    for (int u = 0; u < kUnitsPerWarpGroup; ++u)
      unit_scales[u] = memory::lds_float(staged + 4 * ((64 * (unit0 + u)) >> 7));
  }

  // Blocks: the scales of K block kb for this thread's tokens (token_scale_rows: rows of
  // token_scale_row_stride floats; 0 past M) and for each of its units' 128-channel weight block
  // (w_scale rows of k_blocks, ceil(n / 128) of them; 0 past them, for a CTA wider than the rest of N).
  template <class Params>
  static __device__ __forceinline__ void load_block_scales(const Params& params, int m0, int n0, int unit0, int kb,
                                                           int k_blocks, float (&token_scales)[kTokenScales],
                                                           float (&unit_scales)[kUnitsPerWarpGroup]) {
    const kernel::GemmParams& p = kernel::scale_gemm(params);
    const int lane = threadIdx.x & 31;
    if constexpr (!kStagedTokenScales) {
      const float* a_scale = kernel::token_scale_rows(params) + kb;
      const int row_stride = kernel::token_scale_row_stride(params, k_blocks);
#pragma unroll
      for (int j = 0; j < kTokenScales; ++j) {
        const int m = m0 + 2 * (lane & 3) + 8 * (j >> 1) + (j & 1);
        token_scales[j] = m < p.m ? __ldg(a_scale + static_cast<i64>(m) * row_stride) : 0.f;
      }
    }
    load_unit_scales(p, n0, unit0, kb, k_blocks, unit_scales);
  }

  // Blocks: the scale of K block kb of each of this thread's units' 128-channel weight block
  // (w_scale rows of k_blocks, ceil(n / 128) of them; 0 past them, for a CTA wider than the rest of N).
  static __device__ __forceinline__ void load_unit_scales(const kernel::GemmParams& p, int n0, int unit0, int kb,
                                                          int k_blocks, float (&unit_scales)[kUnitsPerWarpGroup]) {
    const float* w_scale = static_cast<const float*>(p.w_scale) + kb;
    const int block_rows = (p.n + 127) >> 7;
#pragma unroll
    for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
      const int block = (n0 + 64 * (unit0 + u)) >> 7;
      unit_scales[u] = block < block_rows ? __ldg(w_scale + static_cast<i64>(block) * k_blocks) : 0.f;
    }
  }
};

}  // namespace humming_aot::mainloop
