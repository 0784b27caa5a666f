#pragma once
// The roles of the warp-specialized Hopper bodies with 8-bit activations (kernel/dense_wgmma_ss.cuh,
// W8A8; kernel/dense_wgmma_w4a8.cuh, W4A8), which differ only in what a ring slot holds and how
// the consumers multiply it: one producer warpgroup whose first thread fills the mbarrier ring
// (Body::produce), one or two consumer warpgroups that empty it (Body::Consumer::consume) into
// fp32 sums, then the schedules' fix-up or split-K reduction in fp32, the scales that come after
// the sums (Body::scale_sums) and the staging tile's store (epilogue/column_major_writer.cuh).
// Schedules: schedule/work_units.cuh (tail split with walking CTAs, or stream-K). The staging tile
// lies after the ring (Body::kSeparateStaging: the producer fills the ring with the next tile's K
// tiles while the consumers store one) or over it (the producer then waits for the store).
//
// Body provides: kRingStages, kTileM, kTileN, kConsumerWarps, kEmptyArrivals (the arrivals that release
// a slot: lane 0 of each consumer warp, or every consumer thread), kProducerRegisters, kConsumerRegistersHeld,
// kAccumulators, kSeparateStaging, kStagingOffset, kWeightMap (prefetch params.w_map), the types
// Units, StreamK, Consumer, ConsumerState, Fixup, SplitK, ConsumerBarrier, Writer, and
// produce(params, m0, n0, k_tile0, count, smem_base, full0, empty0, fills),
// prefetch_weights(params, n0, k_tile0, count) (L2 prefetches of the first of those K tiles'
// weights, or none, by the producer's thread before its wait for the upstream grid) and
// scale_sums(params, acc, m0, n0).

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/mma/wgmma.cuh>
#include <humming_aot/ptx/bulk_copy.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/ptx/warpgroup.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::kernel {

// Where a body's output staging tile goes: after the ring where both fit in a CTA that has the SM
// to itself (two consumer warpgroups), leaving 1 KB of sm_90's 227 KB per block for the static
// shared memory, so that the producer fills the ring with the next tile's K tiles while the
// consumers store this one; else over the ring, which the producer then leaves alone until the
// store is done. kSmemBytes: the dynamic shared memory (+1024: the base is aligned up at run time).
template <int kPipelineBytes, int kStagingBytes, int kConsumerWarpGroups>
struct StagingPlacement {
  static constexpr int kMaxSmemBytes = 232448;
  static constexpr bool kSeparate =
      kConsumerWarpGroups == 2 && kPipelineBytes + kStagingBytes + 1024 <= kMaxSmemBytes - 1024;
  static constexpr int kOffset = kSeparate ? kPipelineBytes : 0;
  static constexpr int kSmemBytes =
      (kSeparate ? kPipelineBytes + kStagingBytes : (kPipelineBytes > kStagingBytes ? kPipelineBytes : kStagingBytes)) +
      1024;
};

// The register split of a CTA of kThreads built for kMinBlocksPerSm per SM: the producer warpgroup
// keeps 40 (setmaxnreg), the consumers take the rest, at most 240 each (kHeld).
template <int kThreads, int kConsumerThreads, int kMinBlocksPerSm>
struct RegisterSplit {
  static constexpr int kProducer = 40;
  static constexpr int kLaunch = (65536 / kMinBlocksPerSm / kThreads) / 8 * 8;
  static constexpr int kConsumer = ((kLaunch * kThreads - kProducer * 128) / kConsumerThreads) / 8 * 8;
  static constexpr int kHeld = kConsumer > 240 ? 240 : kConsumer;
};

template <class Body>
struct ScaledWsDriver {
  static __device__ __forceinline__ void run(const ScaledTmaGemmParams& params) {
    constexpr int kStages = Body::kRingStages, kConsumerWarps = Body::kConsumerWarps;
    constexpr bool kSeparateStaging = Body::kSeparateStaging;
    using Units = typename Body::Units;
    using ConsumerBarrier = typename Body::ConsumerBarrier;
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
        ptx::mbarrier_init(full0 + 8 * s, 1);                      // the producer's arrive.expect_tx (+ the bytes)
        ptx::mbarrier_init(empty0 + 8 * s, Body::kEmptyArrivals);  // consumer warps or threads
      }
      ptx::mbarrier_init(staging_barrier, 1);  // consumer thread 0, after the consumers' barrier
      ptx::fence_barrier_init();
    }
    __syncthreads();

    typename Body::StreamK::Unit unit, next;
    if (warp >= kConsumerWarps) {
      ptx::warpgroup_release_registers<Body::kProducerRegisters>();
      if (warp == kConsumerWarps && lane == 0) {
        ptx::prefetch_tensor_map(&tma.a_map);
        if constexpr (Body::kWeightMap) ptx::prefetch_tensor_map(&params.w_map);
        Units units(tma);  // (from the parameters alone)
        u32 fills = 0, staging_parity = 0;
        bool more = units.next(next);
        // While the previous kernel of the stream runs (PDL: the activations' quantization at
        // decode), the first K tiles of the CTA's first unit may head for L2: weights no kernel
        // of this library writes (schedule/grid_dependency.cuh). Its loads then find them there.
        if (more) Body::prefetch_weights(params, next.n_tile * Body::kTileN, next.k_begin, next.k_end - next.k_begin);
        // Activations, scales and the output may belong to the previous kernel in the stream.
        schedule::wait_for_upstream_grid();
        while (more) {
          unit = next;
          more = units.next(next);
          Body::produce(params, unit.m_tile * Body::kTileM, unit.n_tile * Body::kTileN, unit.k_begin,
                        unit.k_end - unit.k_begin, smem_base, full0, empty0, fills);
          if (!kSeparateStaging && more && unit.k_begin == 0) {  // its tile is stored through the ring
            ptx::mbarrier_wait(staging_barrier, staging_parity);
            staging_parity ^= 1u;
          }
        }
      }
      return;
    }
    schedule::wait_for_upstream_grid();
    ptx::warpgroup_claim_registers<Body::kConsumerRegistersHeld>();

    float acc[Body::kAccumulators];
    typename Body::ConsumerState ring;
    Units units(tma);
    bool more = units.next(next);
    while (more) {
      unit = next;
      more = units.next(next);
      const int m0 = unit.m_tile * Body::kTileM, n0 = unit.n_tile * Body::kTileN;
      Body::Consumer::consume(params, m0, n0, unit.k_begin, unit.k_end - unit.k_begin, smem_base, full0, empty0, ring,
                              acc);
      if (!more) schedule::release_dependent_grid();
      if (units.stream_k) {
        if (unit.k_begin > 0) {  // a later part of a tile whose head another CTA holds
          Body::Fixup::publish(p, acc, blockIdx.x, p.tile_counters + unit.tile);
          continue;
        }
        if (unit.k_end < static_cast<int>(units.range.k_tiles)) {
          Body::Fixup::accumulate(p, acc, blockIdx.x + 1, units.range.partials_of(unit.tile),
                                  p.tile_counters + unit.tile);
        }
      }
      // every consumer warpgroup is done with the ring, which the staging tile may reuse, and with
      // the previous tile's store, whose staging tile this one overwrites
      ConsumerBarrier::sync();
      if (!units.stream_k && units.splits > 1 &&
          !Body::SplitK::reduce(p, acc, units.split_index, units.slice, units.splits, &arrival_flag)) {
        return;
      }
      Body::scale_sums(params, acc, m0, n0);
      Body::Writer::store_tile(p, acc, m0, n0, smem + Body::kStagingOffset);
      if (!kSeparateStaging &&
          more) {  // the producer waits for the staging tile's last read before it refills the ring
        mma::fence_shared_for_async_proxy();
        ConsumerBarrier::sync();
        if (threadIdx.x == 0) ptx::mbarrier_arrive(staging_barrier);
      }
    }
  }
};

}  // namespace humming_aot::kernel
