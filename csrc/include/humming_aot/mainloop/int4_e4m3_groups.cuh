#pragma once
// The K loop of the W4A8 body's consumers (kernel/dense_wgmma_w4a8.cuh): 4-bit weight codes in a
// ring slot become e4m3 A fragments in registers (Widen: int4 codes by numerics/int4_e4m3.cuh,
// uint4 ones less their zero point by numerics/uint4_zero_point.cuh, MXFP4 ones by
// numerics/e2m1_e4m3.cuh, with a table per channel and group of 32) and meet the slot's
// e4m3 activation box on wgmma (mma/wgmma_e4m3_rs.cuh), four k32 steps per K tile of 128, one
// committed group per step, kWaitDepth of them left in flight. Each K tile's sums go into a scratch set that its first step
// overwrites; once they are complete they are weighed by the K tile's group scale of each channel
// (staged in the slot: one fp32 per channel, for MXFP4 followed by its four group bytes) and
// added into the fp32 accumulators, so that a
// group of 128 (or any multiple of it, or the whole K) is one promotion, and fp8 wgmma's short
// running sums never span more than 128 of K. Where registers allow (kOverlapped), two scratch
// sets take turns: K tile t is added once K tile t + 1's first kWaitDepth steps are issued, while
// the tensor cores run them; else one set is waited for and added after each K tile (the other
// consumer warpgroup's wgmma keep the tensor cores busy meanwhile).
//
// Slot layout (the kernel's producer fills it): the activation box (kBlockM rows of 128 codes,
// 128-byte swizzle) at 0; at kWeightOffset one 4096-byte block of codes per 64-channel unit, in
// which the 16 bytes at ((w * 2 + h) * 32 + lane) * 16 hold, for warp w of a consumer warpgroup,
// the lane's codes of K steps 2 h and 2 h + 1: per step two words, the first with the codes of
// A registers 0 and 1, the second of registers 2 and 3 (the 8-bit A fragment, mma/wgmma_e4m3_rs.cuh;
// byte j of a word holds code j of both, in packed layout version 2: numerics/int4_e4m3.cuh); at
// kScaleOffset the K tile's entry of each channel (Widen::kEntryBytes: the fp32 scale, then for
// MXFP4 its groups' bytes, for uint4 its zero point's; with Widen::kGroupTables the conversion
// takes a per-row Table that Widen::table makes from that second word for each K step).
// Spans (Widen::kSpans, MXFP4): pack may fold a channel's group scales over a span of several K
// tiles (params' group_size: 128 x the span's K tiles), each K tile's entry then holding the span's
// scale. With one scratch set the K tiles of a span share it: one wait and promotion per span, a
// span's earlier K tiles released once the next K tile's first kWaitDepth steps have been waited
// for. Promoting a K tile alone is right too (its entry holds its span's scale), which the two
// scratch sets, the mma.sync body and the ends of K slices do.
// Contract: `consume` leaves acc with the unit's group-scaled fp32 sums and every slot it took
// released; every consumer thread releases (the empty barriers count the consumer threads).

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/mma/wgmma_e4m3_rs.cuh>
#include <humming_aot/numerics/e2m1_e4m3.cuh>
#include <humming_aot/numerics/int4_e4m3.cuh>
#include <humming_aot/numerics/uint4_zero_point.cuh>
#include <humming_aot/ptx/mbarrier.cuh>

namespace humming_aot::mainloop {

template <class Widen,             // numerics::Int4ToE4m3, E2m1ToE4m3 or Uint4ZeroPointToE4m3: the codes' conversion
          int kBlockM,             // tokens per CTA: the wgmma N
          int kUnitsPerWarpGroup,  // 64-channel units each consumer warpgroup multiplies
          int kStages,             // slots of the ring
          int kStageBytes,         // bytes a slot takes (a multiple of 1024)
          int kWeightOffset,       // the codes' offset in a slot
          int kScaleOffset,        // the group scales' offset in a slot
          int kWaitDepth,          // wgmma steps left in flight after each step's issue: 1 or 3
          bool kOverlapped>        // two scratch sets (the promotion beside the next K tile), or one
struct Int4E4m3Groups {
  using Mma = mma::WgmmaE4m3Rs<kBlockM>;
  static constexpr int kUnitAccumulators = Mma::kAccumulators;
  static constexpr int kAccumulators = kUnitsPerWarpGroup * kUnitAccumulators;
  static constexpr int kUnitBytes = 4096;  // a 64-channel unit's codes of one K tile

  struct State {
    int slot = 0;
    u32 full_parity = 0;
  };

  // A fragments of kWaitDepth + 1 K steps: a step's are rewritten kWaitDepth + 1 steps later, once
  // the wgmma that read them has completed (every step waits until at most kWaitDepth groups, its
  // own included, are in flight). 1 or 3, so that a step's buffer is the same in every K tile.
  static_assert(kWaitDepth == 1 || kWaitDepth == 3, "a wait depth of 1 or 3 steps");
  static constexpr int kBuffers = kWaitDepth + 1;
  using Fragments = u32[kBuffers][kUnitsPerWarpGroup][4];

  // A K tile's group scales of the thread's two rows (row and row + 8) of each unit (and with
  // group tables their group bytes), read from its slot when the slot is taken, so that the loads'
  // latency passes before the conversion and the promotion need them.
  static constexpr int kTableUnits = Widen::kGroupTables ? kUnitsPerWarpGroup : 1;
  struct Scales {
    float low[kUnitsPerWarpGroup], high[kUnitsPerWarpGroup];
    u32 groups_low[kTableUnits], groups_high[kTableUnits];
  };
  static __device__ __forceinline__ void load_scales(u32 stage, Scales& scales) {
    const int lane = threadIdx.x & 31;
    const int unit0 = (static_cast<int>(threadIdx.x) >> 7) * kUnitsPerWarpGroup;
    const int row = ((static_cast<int>(threadIdx.x) >> 5) & 3) * 16 + (lane >> 2);  // and row + 8
    constexpr int kEntry = Widen::kEntryBytes;
    const u32 base = stage + kScaleOffset + kEntry * row;
#pragma unroll
    for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
      const u32 address = base + kEntry * 64 * (unit0 + u);
      if constexpr (Widen::kGroupTables) {
        u32 low, high;
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(low), "=r"(scales.groups_low[u]) : "r"(address));
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                     : "=r"(high), "=r"(scales.groups_high[u])
                     : "r"(address + 8 * kEntry));
        scales.low[u] = __uint_as_float(low);
        scales.high[u] = __uint_as_float(high);
      } else {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(scales.low[u]) : "r"(address));
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(scales.high[u]) : "r"(address + 32));
      }
    }
  }

  // Weigh the completed K tile `from` (in `slot`, whose scales are `scales`) into acc, and release the slot.
  static __device__ __forceinline__ void retire(u32 empty0, int slot, const Scales& scales,
                                                float (&from)[kAccumulators], float (&acc)[kAccumulators]) {
    const float (&low)[kUnitsPerWarpGroup] = scales.low;
    const float (&high)[kUnitsPerWarpGroup] = scales.high;
    mma::wgmma_fence_operands(from);
    // Every thread releases the slot after its own reads (its codes and scales: mbarrier arrive
    // has release semantics for the arriving thread's accesses). One elected lane after a
    // __syncwarp would do under the PTX memory model, but compute-sanitizer's racecheck cannot
    // follow that chain to the producer's bulk copies that refill the slot (it reports their
    // writes against these reads), and per-thread arrivals keep the racecheck step meaningful.
    ptx::mbarrier_arrive(empty0 + 8 * slot);
    // accumulator i of a unit holds row + 8 ((i >> 1) & 1)
#pragma unroll
    for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
#pragma unroll
      for (int i = 0; i < kUnitAccumulators; ++i) {
        const int a = u * kUnitAccumulators + i;
        acc[a] = fmaf(from[a], (i & 2) ? high[u] : low[u], acc[a]);
      }
    }
  }

  // K tile `ring.slot` into `into`; with kRetire, `from` (the previous K tile, in from_slot) is
  // retired once its last step has completed: after this tile's step kWaitDepth - 1 is issued and
  // waited for. Returns the slot and moves the ring on.
  // With `onto` (a span's later K tile), the K tile's sums are added onto `into`'s, and the
  // previous K tile's slot, left unreleased, is released where kRetire would retire.
  template <bool kRetire>
  static __device__ __forceinline__ int issue(u32 smem_base, u32 full0, u32 empty0, State& ring,
                                              float (&into)[kAccumulators], Scales& into_scales, Fragments& fragments,
                                              float (&from)[kAccumulators], int from_slot, const Scales& from_scales,
                                              float (&acc)[kAccumulators], bool onto = false) {
    const int lane = threadIdx.x & 31;
    const int unit0 = (static_cast<int>(threadIdx.x) >> 7) * kUnitsPerWarpGroup;
    const int warp = (static_cast<int>(threadIdx.x) >> 5) & 3;
    const int slot = ring.slot;
    ptx::mbarrier_wait(full0 + 8 * slot, ring.full_parity);
    const u32 stage = smem_base + slot * kStageBytes;
    const u64 tokens = mma::k_major_sw128_descriptor(stage);
    const u32 codes = stage + kWeightOffset + unit0 * kUnitBytes + (warp * 64 + lane) * 16;
    // both halves' codes and the K tile's scales first: only the first half's loads are waited for
    u32 words[2][kUnitsPerWarpGroup][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(words[h][u][0]), "=r"(words[h][u][1]), "=r"(words[h][u][2]), "=r"(words[h][u][3])
                     : "r"(codes + u * kUnitBytes + h * 512));
      }
    }
    load_scales(stage, into_scales);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int buffer = kk % kBuffers, half = kk & 1, pair = kk >> 1;
#pragma unroll
      for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
        u32(&a)[4] = fragments[buffer][u];
        if constexpr (Widen::kGroupTables) {  // K step kk is group kk of the K tile
          const typename Widen::Table low = Widen::table(into_scales.groups_low[u], kk);
          const typename Widen::Table high = Widen::table(into_scales.groups_high[u], kk);
          Widen::convert(words[pair][u][2 * half], low, high, a[0], a[1]);
          Widen::convert(words[pair][u][2 * half + 1], low, high, a[2], a[3]);
        } else {
          Widen::convert(words[pair][u][2 * half], a[0], a[1]);
          Widen::convert(words[pair][u][2 * half + 1], a[2], a[3]);
        }
      }
      mma::wgmma_fence();
#pragma unroll
      for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
        // K step kk: 32 codes = 32 bytes further along each token row, 2 in the address field
        Mma::mma(*reinterpret_cast<float (*)[kUnitAccumulators]>(into + u * kUnitAccumulators), fragments[buffer][u],
                 tokens + static_cast<u64>(2 * kk), kk > 0 || onto);
      }
      mma::wgmma_commit_group();
      mma::wgmma_wait_group<kWaitDepth>();
      // the previous K tile's groups are the ones before this tile's first kWaitDepth
      if (kRetire && kk == kWaitDepth - 1) retire(empty0, from_slot, from_scales, from, acc);
      if (!kRetire && kk == kWaitDepth - 1 && onto)
        ptx::mbarrier_arrive(empty0 + 8 * (slot > 0 ? slot - 1 : kStages - 1));
    }
    if (++ring.slot == kStages) {
      ring.slot = 0;
      ring.full_parity ^= 1u;
    }
    return slot;
  }

  // `count` K tiles from k_tile0 on, from the ring's next slot, into acc (zeroed first). (The params
  // give the span of Widen::kSpans; the tile is the schedules' consumer interface: the scales come
  // with the slots.)
  template <class Params>
  static __device__ __forceinline__ void consume(const Params& params, int, int, int k_tile0, int count, u32 smem_base,
                                                 u32 full0, u32 empty0, State& ring, float (&acc)[kAccumulators]) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    if (count <= 0) return;
    if constexpr (!kOverlapped) {  // one scratch set: each span waited for and added before the next
      float scratch[kAccumulators];
      Scales scales;
      Fragments fragments;
      if constexpr (!Widen::kSpans) {
        for (int it = 0; it < count; ++it) {
          const int slot =
              issue<false>(smem_base, full0, empty0, ring, scratch, scales, fragments, scratch, 0, scales, acc);
          mma::wgmma_wait_group<0>();
          retire(empty0, slot, scales, scratch, acc);
        }
      } else {
        // A span ends after the K tile that leaves `left` K tiles to go where (left & mask) ==
        // (end & mask), mask the span's K tiles less 1 (a power of two: humming_aot.w4a8_mxfp4; at
        // most 2^16 - 1, since promoting a K tile alone is right too), both in one word (bits 0-15
        // the mask, 16-31 end & mask).
        const int span = kernel::scale_gemm(params).group_size >> 7;
        const u32 mask = span > 1 ? static_cast<u32>(span - 1) & 0xFFFFu : 0u;
        const u32 ends = mask | ((static_cast<u32>(k_tile0 + count) & mask) << 16);
        bool onto = false;
        for (int left = count;;) {
          const int slot =
              issue<false>(smem_base, full0, empty0, ring, scratch, scales, fragments, scratch, 0, scales, acc, onto);
          --left;
          onto = ((static_cast<u32>(left) ^ (ends >> 16)) & ends & 0xFFFFu) != 0u && left > 0;
          if (!onto) {  // (the loop leaves only after a promotion: no wgmma is in flight past it)
            mma::wgmma_wait_group<0>();
            retire(empty0, slot, scales, scratch, acc);
            if (left == 0) break;
          }
        }
      }
      return;
    }
    float even[kAccumulators], odd[kAccumulators];
    Scales even_scales, odd_scales;
    Fragments fragments;
    int even_slot = issue<false>(smem_base, full0, empty0, ring, even, even_scales, fragments, odd, 0, odd_scales, acc),
        odd_slot;
    for (int it = 1; it < count; it += 2) {
      odd_slot =
          issue<true>(smem_base, full0, empty0, ring, odd, odd_scales, fragments, even, even_slot, even_scales, acc);
      if (it + 1 == count) {
        mma::wgmma_wait_group<0>();
        retire(empty0, odd_slot, odd_scales, odd, acc);
        return;
      }
      even_slot =
          issue<true>(smem_base, full0, empty0, ring, even, even_scales, fragments, odd, odd_slot, odd_scales, acc);
    }
    mma::wgmma_wait_group<0>();
    retire(empty0, even_slot, even_scales, even, acc);
  }
};

}  // namespace humming_aot::mainloop
