#pragma once
// The consumer side of the wgmma-ss body's mbarrier ring (kernel/dense_wgmma_ss.cuh): a slot holds
// one K tile of 128 8-bit codes, the weight box (kUnits x 64 rows of 128 bytes) first, then the
// activation box (kBlockM rows), both with the 128-byte swizzle. `issue` waits for the slot to be
// full and multiplies it into a set of accumulators with four k32 wgmma steps per 64-channel unit
// of this warpgroup (the weights wgmma's A, the tokens its N), or, kTokensAsA, per warpgroup's 64
// tokens (the tokens wgmma's A, all of the slot's channels its N: one unit), committed as one
// group; `release` gives the slot back to the producer once that group has completed. Contract:
// the consumer warpgroups walk the slots in the same order as the producer fills them, every slot
// once per lap; lane 0 of each consumer warp releases (the empty barriers count the consumer
// warps).

#include <humming_aot/mma/wgmma.cuh>
#include <humming_aot/ptx/mbarrier.cuh>

namespace humming_aot::mainloop {

template <class Mma,                // mma::WgmmaE4m3<kBlockM> or mma::WgmmaS8<kBlockM>
          int kUnitsPerWarpGroup,   // 64-channel units each consumer warpgroup multiplies
          int kStages,              // slots of the ring
          int kSlotBytes,           // bytes a slot takes (a multiple of 1024)
          int kWeightBytes,         // bytes of the weight box at the start of a slot (activations after it)
          bool kTokensAsA = false>  // warpgroup wg multiplies tokens 64 wg + [0, 64) by every channel
struct WgmmaSsRing {
  static_assert(!kTokensAsA || kUnitsPerWarpGroup == 1, "token-major: one unit of 64 tokens a warpgroup");
  static constexpr int kK32Steps = 128 / 32;
  static constexpr int kStageBytes = kSlotBytes;
  static constexpr int kUnitAccumulators = Mma::kAccumulators;
  static constexpr int kAccumulators = kUnitsPerWarpGroup * kUnitAccumulators;

  struct State {
    int slot = 0;
    u32 full_parity = 0;
    // the warpgroup's first unit, read once from lane 0 so that the compiler knows it is
    // warp-uniform: the descriptors built from it then live in uniform registers
    int unit0 = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) >> 7, 0) * kUnitsPerWarpGroup;
  };

  // K tile `ring.slot`'s wgmma into `into`, committed as one group: its first k32 step overwrites
  // `into` unless kAccumulate (then every step adds to it). Returns the slot and moves the ring on.
  template <bool kAccumulate, class Sum>
  static __device__ __forceinline__ int issue(u32 smem_base, u32 full0, State& ring, Sum (&into)[kAccumulators]) {
    const int unit0 = ring.unit0;
    const int slot = __shfl_sync(0xffffffffu, ring.slot, 0);  // (warp-uniform to the compiler)
    ptx::mbarrier_wait(full0 + 8 * slot, ring.full_parity);
    // The descriptors of slot 0, then moved to the slot in their address field (16-byte units; a
    // CTA's shared addresses stay below the field's 2^18 bytes, so the sum does not carry out of it)
    const u32 slot_field = static_cast<u32>(slot) * (kSlotBytes >> 4);
    // K step kk: 32 codes = 32 bytes further along each row, 2 in the descriptors' address field
    // B: the N rows; A: the warpgroup's 64 rows (channels of its units, or kTokensAsA its tokens)
    const u64 n_rows = mma::k_major_sw128_descriptor(kTokensAsA ? smem_base : smem_base + kWeightBytes) + slot_field;
    const u64 a_rows = mma::k_major_sw128_descriptor(kTokensAsA ? smem_base + kWeightBytes + unit0 * (64 * 128)
                                                                : smem_base + unit0 * (64 * 128)) +
                       slot_field;
    mma::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK32Steps; ++kk) {
#pragma unroll
      for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
        // unit u's 64 rows start 8 KB (512 in the address field) after unit u - 1's
        Mma::mma(*reinterpret_cast<Sum(*)[kUnitAccumulators]>(into + u * kUnitAccumulators),
                 a_rows + static_cast<u64>(512 * u + 2 * kk), n_rows + static_cast<u64>(2 * kk), kAccumulate || kk > 0);
      }
    }
    mma::wgmma_commit_group();
    if (++ring.slot == kStages) {
      ring.slot = 0;
      ring.full_parity ^= 1u;
    }
    return slot;
  }

  // Gives `slot` back to the producer: call once the wgmma that read it have completed (and any
  // shared loads of the slot were issued).
  static __device__ __forceinline__ void release(u32 empty0, int slot) {
    if ((threadIdx.x & 31) == 0) ptx::mbarrier_arrive(empty0 + 8 * slot);
  }
};

}  // namespace humming_aot::mainloop
