#pragma once
// The warp-specialized Hopper W8A8 body: out[m, n] = (sum_k a[m, k] w[n, k]) x a_scale[m] x
// w_scale[n] x global scale (+ bias) on wgmma (SM90a), with e4m3 activation and weight codes, fp32
// token and channel scales, and a 16-bit output.
//
// Both operands are in shared memory: nothing is dequantized, so wgmma reads each through a
// descriptor (mma/wgmma_e4m3.cuh), the weights as its A (64-channel units, M) and the tokens as
// its B (N), which keeps a few tokens cheap. Roles as in kernel/dense_wgmma_ws.cuh: one producer
// warpgroup whose first thread issues, per K tile of 128, one TMA box of weight codes (kBlockN
// rows) and one of activation codes (kBlockM rows), both 128 bytes a row with the 128-byte swizzle
// and zero-filled past N, M and K; one or two consumer warpgroups.
//
// Promotion: Hopper's fp8 wgmma keeps fewer accumulator bits than fp32, so each K tile's four
// wgmma steps (128 of K) go into a scratch set that the first step overwrites, which is added to
// the fp32 accumulators once the tile's wgmma have completed (the error bound then holds at
// K = 16384: tests/gpu/test_w8a8_gpu.py). The slot is released at that point, before the add.
// Twice the accumulator registers: a consumer warpgroup holds at most 64 channels x 160 tokens,
// or 128 x 80.
//
// Schedules (tail split or stream-K, schedule/work_units.cuh) and the epilogue (fixup or split-K
// reduction in fp32, then the staging tile of epilogue/column_major_writer.cuh) are the 16-bit
// body's; the token and channel scales multiply the reduced fp32 sums just before the store.

#include <humming_aot/epilogue/column_major_writer.cuh>
#include <humming_aot/epilogue/fragment_split_k.cuh>
#include <humming_aot/epilogue/stream_k_fixup.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/mma/wgmma_e4m3.cuh>
#include <humming_aot/ptx/bulk_copy.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/ptx/warpgroup.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/work_units.cuh>

namespace humming_aot::kernel {

template <class Out,               // Float16 or BFloat16: output (and bias) dtype
          int kBlockM,             // tokens per CTA: the wgmma N (8, 16, 32, 64, 96, 128, 160 or 192)
          int kBlockN,             // weight channels per CTA: 64 x kUnitsPerWarpGroup x consumer warpgroups
          int kUnitsPerWarpGroup,  // 64-channel units each consumer warpgroup multiplies (1 or 2)
          int kStages>             // slots of the mbarrier ring
struct DenseWgmmaSs {
  static constexpr int kBlockK = 128;  // one 128-byte row of e4m3 codes per stage, one promotion
  static constexpr int kK32Steps = kBlockK / 32;
  static constexpr int kUnits = kBlockN / 64;
  static constexpr int kConsumerWarpGroups = kUnits / kUnitsPerWarpGroup;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpGroups;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup, last

  static_assert(kBlockN % 64 == 0 && (kUnitsPerWarpGroup == 1 || kUnitsPerWarpGroup == 2), "one or two units");
  static_assert(kUnits % kUnitsPerWarpGroup == 0 && (kConsumerWarpGroups == 1 || kConsumerWarpGroups == 2),
                "one or two consumer warpgroups (the register split below assumes it)");
  static_assert(kBlockN <= 256 && kBlockM <= 256, "a TMA box has at most 256 rows");
  static_assert(kStages >= 2, "a ring of at least two slots");

  using Mma = mma::WgmmaE4m3<kBlockM>;
  using Units = schedule::WorkUnits<kBlockM, kBlockN, kBlockK>;
  using StreamK = typename Units::StreamK;
  using Fragments = epilogue::WarpgroupFragments<kBlockM, kUnitsPerWarpGroup>;
  using ConsumerBarrier = ptx::NamedBarrier<kConsumerThreads, 1>;
  using Writer = epilogue::ColumnMajorWriter<Out, kBlockM, kBlockN, kConsumerThreads, Fragments, ConsumerBarrier>;
  using SplitK = epilogue::FragmentSplitK<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;
  using Fixup = epilogue::StreamKFixup<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;

  // A slot: the weight box (kBlockN rows of 128 bytes: a multiple of 8 KB, so the activation box
  // after it keeps the 1024-byte alignment the swizzle repeats on), then the activation box.
  static constexpr int kWeightBytes = kBlockN * 128;
  static constexpr int kStageTx = (kBlockN + kBlockM) * 128;
  static constexpr int kStageBytes = (kStageTx + 1023) / 1024 * 1024;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes =
      (kPipelineBytes > Writer::kStagingBytes ? kPipelineBytes : Writer::kStagingBytes) + 1024;
  static constexpr bool kScalesInFp32 = true;  // the scales multiply fp32 sums

  static constexpr int kUnitAccumulators = Mma::kAccumulators;
  static constexpr int kAccumulators = kUnitsPerWarpGroup * kUnitAccumulators;
  static constexpr int kMinBlocksPerSm = kConsumerWarpGroups == 1 ? 2 : 1;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kLaunchRegisters = (65536 / kMinBlocksPerSm / kThreads) / 8 * 8;
  static constexpr int kConsumerRegisters =
      ((kLaunchRegisters * kThreads - kProducerRegisters * 128) / kConsumerThreads) / 8 * 8;
  static constexpr int kConsumerRegistersHeld = kConsumerRegisters > 240 ? 240 : kConsumerRegisters;
  // accumulators and their scratch set, and what the loop and the epilogue need beside them
  static_assert(kConsumerRegistersHeld >= 2 * kAccumulators + 40,
                "the consumers' registers hold the accumulators, the promotion's scratch set and the loop");

  // The producer: one thread issues the copies of `count` K tiles from k_tile0 on of the tile at (m0, n0).
  static __device__ __forceinline__ void produce(const ScaledTmaGemmParams& params, int m0, int n0, int k_tile0,
                                                 int count, u32 smem_base, u32 full0, u32 empty0, u32& fills) {
    for (int it = 0; it < count; ++it, ++fills) {
      const u32 slot = fills % kStages, lap = fills / kStages;
      const u32 full = full0 + 8 * slot;
      // lap f of the slot waits for the consumers' release of lap f - 1: the empty barrier's phase f - 1
      if (lap > 0) ptx::mbarrier_wait(empty0 + 8 * slot, (lap + 1) & 1u);
      const u32 stage = smem_base + slot * kStageBytes;
      ptx::mbarrier_arrive_expect_tx(full, kStageTx);
      const int pair0 = (k_tile0 + it) * (kBlockK / 2);  // the maps count 16-bit pairs of codes
      ptx::tensor_copy_2d_g2s(stage, &params.w_map, pair0, n0, full);
      ptx::tensor_copy_2d_g2s(stage + kWeightBytes, &params.tma.a_map, pair0, m0, full);
    }
  }

  struct ConsumerRing {
    int slot = 0;
    u32 full_parity = 0;
  };

  // The consumers: `count` K tiles into acc (zeroed first), each promoted from the scratch set once
  // its wgmma have completed; every slot is released once read, so the ring is free at the end.
  static __device__ __forceinline__ void consume(int count, u32 smem_base, u32 full0, u32 empty0, ConsumerRing& ring,
                                                 float (&acc)[kAccumulators]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int unit0 = (warp >> 2) * kUnitsPerWarpGroup;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    float scratch[kAccumulators];
    for (int it = 0; it < count; ++it) {
      ptx::mbarrier_wait(full0 + 8 * ring.slot, ring.full_parity);
      const u32 stage = smem_base + ring.slot * kStageBytes;
      // K step kk: 32 codes = 32 bytes further along each row, 2 in the descriptors' address field
      const u64 tokens = mma::k_major_sw128_descriptor(stage + kWeightBytes);
      const u64 channels = mma::k_major_sw128_descriptor(stage + unit0 * (64 * 128));
      mma::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kK32Steps; ++kk) {
#pragma unroll
        for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
          // unit u's 64 rows start 8 KB (512 in the address field) after unit u - 1's
          Mma::mma(*reinterpret_cast<float (*)[kUnitAccumulators]>(scratch + u * kUnitAccumulators),
                   channels + static_cast<u64>(512 * u + 2 * kk), tokens + static_cast<u64>(2 * kk), kk > 0);
        }
      }
      mma::wgmma_commit_group();
      mma::wgmma_wait_group<0>();
      mma::wgmma_fence_operands(scratch);
      if (lane == 0) ptx::mbarrier_arrive(empty0 + 8 * ring.slot);
#pragma unroll
      for (int i = 0; i < kAccumulators; ++i) acc[i] += scratch[i];
      if (++ring.slot == kStages) {
        ring.slot = 0;
        ring.full_parity ^= 1u;
      }
    }
  }

  // The fp32 sums of the tile at (m0, n0) times its tokens' and channels' scales (rows and channels
  // past M and N get 0: never stored).
  static __device__ __forceinline__ void apply_scales(const ScaledTmaGemmParams& params, float (&acc)[kAccumulators],
                                                      int m0, int n0) {
    const GemmParams& p = params.tma.gemm;
    const float* channel_scales = static_cast<const float*>(p.w_scale);
    Fragments::for_each([&](int i, int token, int col) {
      const float a_scale = m0 + token < p.m ? params.a_scale[m0 + token] : 0.f;
      const float w_scale = n0 + col < p.n ? channel_scales[n0 + col] : 0.f;
      acc[i] *= a_scale * w_scale;
    });
  }

  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    const TmaGemmParams& tma = params.tma;
    const GemmParams& p = tma.gemm;
    extern __shared__ __align__(1024) char smem_raw[];
    __shared__ __align__(8) u64 full_barriers[kStages];
    __shared__ __align__(8) u64 empty_barriers[kStages];
    __shared__ __align__(8) u64 staging_free;  // stream-K: a unit's staged store is done
    __shared__ int arrival_flag;
    const u32 raw_base = memory::shared_address(smem_raw);
    const u32 smem_base = (raw_base + 1023u) & ~1023u;
    char* smem = smem_raw + (smem_base - raw_base);
    const u32 full0 = memory::shared_address(full_barriers), empty0 = memory::shared_address(empty_barriers);
    const u32 staging_barrier = memory::shared_address(&staging_free);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        ptx::mbarrier_init(full0 + 8 * s, 1);                // the producer's arrive.expect_tx (+ the bytes)
        ptx::mbarrier_init(empty0 + 8 * s, kConsumerWarps);  // lane 0 of every consumer warp
      }
      ptx::mbarrier_init(staging_barrier, 1);  // consumer thread 0, after the consumers' barrier
      ptx::fence_barrier_init();
    }
    __syncthreads();
    // Activations, weights, scales and the output may belong to the previous kernel in the stream (PDL).
    schedule::wait_for_upstream_grid();

    typename StreamK::Unit unit, next;
    if (warp >= kConsumerWarps) {
      ptx::warpgroup_release_registers<kProducerRegisters>();
      if (warp == kConsumerWarps && lane == 0) {
        ptx::prefetch_tensor_map(&tma.a_map);
        ptx::prefetch_tensor_map(&params.w_map);
        Units units(tma);
        u32 fills = 0, staging_parity = 0;
        bool more = units.next(next);
        while (more) {
          unit = next;
          more = units.next(next);
          produce(params, unit.m_tile * kBlockM, unit.n_tile * kBlockN, unit.k_begin, unit.k_end - unit.k_begin,
                  smem_base, full0, empty0, fills);
          if (more && unit.k_begin == 0) {  // its tile is stored through the ring: wait for that
            ptx::mbarrier_wait(staging_barrier, staging_parity);
            staging_parity ^= 1u;
          }
        }
      }
      return;
    }
    ptx::warpgroup_claim_registers<kConsumerRegistersHeld>();

    float acc[kAccumulators];
    ConsumerRing ring;
    Units units(tma);
    bool more = units.next(next);
    while (more) {
      unit = next;
      more = units.next(next);
      consume(unit.k_end - unit.k_begin, smem_base, full0, empty0, ring, acc);
      if (!more) schedule::release_dependent_grid();
      if (units.stream_k) {
        if (unit.k_begin > 0) {  // a later part of a tile whose head another CTA holds
          Fixup::publish(p, acc, blockIdx.x, p.tile_counters + unit.tile);
          continue;
        }
        if (unit.k_end < static_cast<int>(units.range.k_tiles)) {
          Fixup::accumulate(p, acc, blockIdx.x + 1, units.range.partials_of(unit.tile), p.tile_counters + unit.tile);
        }
      }
      ConsumerBarrier::sync();  // every consumer warpgroup is done with the ring: the staging tile reuses it
      if (!units.stream_k && units.splits > 1 &&
          !SplitK::reduce(p, acc, units.split_index, units.slice, units.splits, &arrival_flag)) {
        return;
      }
      const int m0 = unit.m_tile * kBlockM, n0 = unit.n_tile * kBlockN;
      apply_scales(params, acc, m0, n0);
      Writer::store_tile(p, acc, m0, n0, smem);
      if (more) {  // the producer waits for the staging tile's last read before it refills the ring
        mma::fence_shared_for_async_proxy();
        ConsumerBarrier::sync();
        if (threadIdx.x == 0) ptx::mbarrier_arrive(staging_barrier);
      }
    }
  }
};

}  // namespace humming_aot::kernel
