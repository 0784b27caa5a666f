#pragma once
// The warp-specialized Hopper dense mixed-input GEMM body: out[m, n] = a[m, k] @ dequant(w)[n, k]^T
// (+ bias) on wgmma (SM90a), with the operands, packed weight layout, stage layout, run-time
// shapes and alignment rules of the other bodies (kernel/dense_wgmma.cuh).
//
// Roles: one producer warpgroup (its first thread issues every copy; 40 registers) and one or two
// consumer warpgroups (the rest of the register file). Per K tile the producer waits for the
// slot's "empty" mbarrier, announces the stage's bytes on its "full" mbarrier and issues: one TMA
// box of activations (kBlockM rows x 64 K, 128-byte swizzle, rows past M zero-filled), one bulk
// copy per K step of the packed weights of the CTA's columns, one per staged scale (and zero-
// point) row. Consumers wait on "full", dequantize (memory/wgmma_weight_fragment.cuh) and issue
// wgmma with the weights as the register operand (kUnitsPerWarpGroup m64 wgmma per K step, one
// per 64-channel unit), and release the slot one K step into the next tile, once its last wgmma
// has completed. No CTA barrier after the set-up: the epilogue syncs the consumers only.
//
// Two schedules, chosen per launch (TmaGemmParams::stream_k):
// - tail split: one CTA per output tile, or per K slice of the tiles of a partial last wave
//   (schedule/tail_split_scheduler.cuh), whose slices are reduced deterministically through the
//   workspace in fragment order (epilogue/fragment_split_k.cuh);
// - stream-K: gridDim.x persistent CTAs, each walking a contiguous range of the problem's K-tile
//   iterations as units of one tile each (schedule/stream_k_scheduler.cuh); the producer's ring
//   runs on from one unit into the next, and the tiles split between CTAs are fixed up in slot
//   order (epilogue/stream_k_fixup.cuh).
// Tiles are written through a staging tile (epilogue/column_major_writer.cuh) that reuses the
// stage ring once every stage is consumed; under stream-K the producer waits for a unit's staged
// store ("staging free" mbarrier) before filling the ring for the next unit.

#include <humming_aot/epilogue/column_major_writer.cuh>
#include <humming_aot/epilogue/fragment_split_k.cuh>
#include <humming_aot/epilogue/stream_k_fixup.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/stage_loader.cuh>
#include <humming_aot/memory/wgmma_weight_fragment.cuh>
#include <humming_aot/mma/wgmma.cuh>
#include <humming_aot/ptx/bulk_copy.cuh>
#include <humming_aot/ptx/mbarrier.cuh>
#include <humming_aot/ptx/warpgroup.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/stream_k_scheduler.cuh>
#include <humming_aot/schedule/tail_split_scheduler.cuh>
#include <humming_aot/schedule/work_units.cuh>

namespace humming_aot::kernel {

template <class Act,      // Float16 or BFloat16: activation, scale and output dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,             // tokens per CTA: the wgmma N (a multiple of 8 to 120, of 16 to 256)
          int kBlockN,             // weight channels per CTA: 64 x kUnitsPerWarpGroup x consumer warpgroups
          int kUnitsPerWarpGroup,  // 64-channel units each consumer warpgroup multiplies (1, 2 or 4)
          int kStages>             // slots of the mbarrier ring
struct DenseWgmmaWs {
  static constexpr int kBits = Weights::kBits;  // weight code bits: 1 to 8
  // (for the schedules that drive produce and consume: kernel/grouped_masked_ws.cuh)
  static constexpr int kRingStages = kStages, kTileM = kBlockM, kTileN = kBlockN;
  static constexpr int kBlockK = 64;
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr int kUnits = kBlockN / 64;
  static constexpr int kConsumerWarpGroups = kUnits / kUnitsPerWarpGroup;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpGroups;
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup, last
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;

  static_assert(kBlockN % 64 == 0 && (kUnitsPerWarpGroup == 1 || kUnitsPerWarpGroup == 2 || kUnitsPerWarpGroup == 4),
                "one, two or four units per warpgroup");
  static_assert(kUnits % kUnitsPerWarpGroup == 0 && (kConsumerWarpGroups == 1 || kConsumerWarpGroups == 2),
                "one or two consumer warpgroups (the register split below assumes it)");
  static_assert((kBlockM % 8 == 0 && kBlockM >= 8 && kBlockM <= 120) || (kBlockM % 16 == 0 && kBlockM <= 256),
                "wgmma wrappers exist for N = every multiple of 8 up to 120 and of 16 up to 256");
  static_assert(kStages >= 2, "a ring of at least two slots");

  using Layout = memory::StageLayout<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint>;
  using WeightFragment = memory::WgmmaWeightFragment<Act, Weights, kZeroPoint, Layout, kBlockN, kBlockK>;
  using Mma = mma::Wgmma<Act, kBlockM>;
  using StreamK = schedule::StreamKScheduler<kBlockM, kBlockN, kBlockK>;
  using Fragments = epilogue::WarpgroupFragments<kBlockM, kUnitsPerWarpGroup>;
  using ConsumerBarrier = ptx::NamedBarrier<kConsumerThreads, 1>;
  using Writer = epilogue::ColumnMajorWriter<Act, kBlockM, kBlockN, kConsumerThreads, Fragments, ConsumerBarrier>;
  using SplitK = epilogue::FragmentSplitK<kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier>;
  // stream-K partials of a bfloat16 output as scaled fp16 (epilogue/half_slot_vectors.cuh): half
  // the bytes through L2, which is what the fix-up below one wave costs (docs/design.md)
  using Fixup = epilogue::StreamKFixup<
      kConsumerThreads, Fragments::kAccumulators, ConsumerBarrier,
      typename epilogue::CompactSlots<kConsumerThreads, Fragments::kAccumulators, Act::kIsBFloat16>::Type>;

  // Slots start on 1024-byte boundaries (the activation box's 128-byte swizzle repeats every 8 rows).
  static constexpr int kStageBytes = (Layout::kBytes + 1023) / 1024 * 1024;
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  // +1024: the dynamic shared memory base is aligned up to 1024 bytes at run time.
  static constexpr int kSmemBytes =
      (kPipelineBytes > Writer::kStagingBytes ? kPipelineBytes : Writer::kStagingBytes) + 1024;
  // the weights are rounded to the activation dtype with their scales (KernelKey.scales_in_fp32)
  static constexpr bool kScalesInFp32 = false;

  static constexpr int kUnitAccumulators = Mma::kAccumulators;
  static constexpr int kAccumulators = kUnitsPerWarpGroup * kUnitAccumulators;
  // Register budget: with one consumer warpgroup two CTAs share an SM (128 registers per thread at
  // launch), with two one CTA does (168). setmaxnreg then moves the producer's to the consumers.
  static constexpr int kMinBlocksPerSm = kConsumerWarpGroups == 1 ? 2 : 1;
  static constexpr int kLaunchRegisters = (65536 / kMinBlocksPerSm / kThreads) / 8 * 8;
  // what the consumers need beside the accumulators: the dequantization, and with four units twice
  // the weight fragments (bodies/wgmma_ws.py max_accumulators)
  static constexpr int kSpareRegisters = 48 + (kUnitsPerWarpGroup == 4 ? 24 : 0);
  // Below their accumulators, the spare and kWgmmaSlack more, ptxas serializes the consumers' wgmma
  // (warning C7512: each waits for the one before). The producer therefore keeps `preferred`
  // registers (this body's 40, the masked schedule's 56) where that leaves the consumers enough,
  // else setmaxnreg's least, 24: the 176 x 256 tile (176 accumulators), whose consumers get 240
  // instead of 232 and spill a few words outside the K loop (docs/performance/log.md sections 52, 53).
  static constexpr int kLeastProducerRegisters = 24;
  static constexpr int kWgmmaSlack = 16;
  // what setmaxnreg leaves each consumer thread when a CTA of `launch` registers per thread keeps
  // `producer` in its producer warpgroup
  static constexpr __host__ __device__ int consumer_registers(int launch, int producer) {
    return ((launch * kThreads - producer * 128) / kConsumerThreads) / 8 * 8;
  }
  static constexpr __host__ __device__ int producer_registers(int launch, int preferred) {
    return consumer_registers(launch, preferred) >= kAccumulators + kSpareRegisters + kWgmmaSlack
               ? preferred
               : kLeastProducerRegisters;
  }
  static constexpr int kProducerRegisters = producer_registers(kLaunchRegisters, 40);
  static constexpr int kConsumerRegisters = consumer_registers(kLaunchRegisters, kProducerRegisters);
  static_assert(kConsumerRegisters <= 256 && kConsumerRegisters >= kAccumulators + kSpareRegisters,
                "the consumers' registers hold the accumulators and the dequantization");

  // The producer: one thread issues the copies of `count` K tiles from k_tile0 on of the tile at
  // (m0, n0): the activation boxes at row m0 of a_map, the weights, scales and zero points of p's
  // pointers. `fills` counts the ring's fills so far (earlier units of a persistent CTA).
  static __device__ __forceinline__ void produce(const GemmParams& p, const TensorMap& a_map, int m0, int n0,
                                                 int k_tile0, int count, u32 smem_base, u32 full0, u32 empty0,
                                                 u32& fills) {
    // Columns past N (a last tile of a CTA wider than the rest of N) are not copied: their stale
    // shared memory only reaches outputs that are never stored. N is a multiple of 64.
    const int columns = p.n - n0 < kBlockN ? p.n - n0 : kBlockN;
    const u32 w_step_bytes = static_cast<u32>(columns) * kBits * 2;  // one K step of the CTA's packed columns
    const i64 w_row_bytes = static_cast<i64>(p.n) * kBits * 2;       // between K steps in global memory
    const char* w_src = static_cast<const char*>(p.w) + static_cast<i64>(k_tile0) * kK16Steps * w_row_bytes +
                        static_cast<i64>(n0) * kBits * 2;
    // Scale rows: one per K tile for groups of at least 64, else 64 / group, a power of two
    // (heuristics.tile_fits), so a shift (a division here becomes a helper call under NVRTC).
    const u32 group = static_cast<u32>(p.group_size);
    const int scale_rows = group >= kBlockK ? 1 : kBlockK >> (31 - __clz(static_cast<int>(group)));
    const u32 scale_bytes = static_cast<u32>(columns) * 2;
    const i64 scale_row_bytes = static_cast<i64>(p.n) * 2;
    const char* s_base = static_cast<const char*>(p.w_scale) + 2 * static_cast<i64>(n0);
    const char* z_base = kHasZeroPoint ? static_cast<const char*>(p.w_zero_point) + 2 * static_cast<i64>(n0) : nullptr;
    const u32 stage_tx = kBlockM * 128 + kK16Steps * w_step_bytes + scale_rows * scale_bytes * (kHasZeroPoint ? 2 : 1);

    for (int it = 0; it < count; ++it, ++fills) {
      const u32 slot = fills % kStages, lap = fills / kStages;
      const u32 full = full0 + 8 * slot;
      // lap f of the slot waits for the consumers' release of lap f - 1: the empty barrier's phase f - 1
      if (lap > 0) ptx::mbarrier_wait(empty0 + 8 * slot, (lap + 1) & 1u);
      const u32 stage = smem_base + slot * kStageBytes;
      ptx::mbarrier_arrive_expect_tx(full, stage_tx);
      const int k0 = (k_tile0 + it) * kBlockK;
      ptx::tensor_copy_2d_g2s(stage, &a_map, k0, m0, full);
#pragma unroll
      for (int kk = 0; kk < kK16Steps; ++kk) {
        ptx::bulk_copy_g2s(stage + Layout::kABytes + kk * (kBlockN * kBits * 2), w_src + kk * w_row_bytes, w_step_bytes,
                           full);
      }
      w_src += kK16Steps * w_row_bytes;
      const i64 scale_offset = static_cast<i64>(static_cast<u32>(k0) / group) * scale_row_bytes;
      for (int r = 0; r < scale_rows; ++r) {
        const u32 dst = stage + Layout::kABytes + Layout::kWBytes + r * (kBlockN * 2);
        ptx::bulk_copy_g2s(dst, s_base + scale_offset + r * scale_row_bytes, scale_bytes, full);
        if constexpr (kHasZeroPoint) {
          ptx::bulk_copy_g2s(dst + Layout::kSBytes, z_base + scale_offset + r * scale_row_bytes, scale_bytes, full);
        }
      }
    }
  }

  // wgmma groups a consumer keeps in flight after issuing a step's (wgmma.wait_group's N): at 1,
  // one step's dequantization hides behind the previous step's wgmma only. A depth of D needs
  // D + 1 fragment buffers (a step's buffer is rewritten D + 1 steps later), rounded up to the K
  // steps of a tile so that a step's buffer is the same in every K tile, and releases the
  // previous K tile's slot at step D - 1, once its last wgmma has completed. (A tuning knob:
  // docs/performance/log.md section 24.)
  static constexpr int kWaitDepth = 1;
  static constexpr int kFragmentBuffers = kWaitDepth == 1 ? 2 : kK16Steps;
  static_assert(kWaitDepth >= 1 && kWaitDepth < kK16Steps && kFragmentBuffers > kWaitDepth &&
                    kK16Steps % kFragmentBuffers == 0,
                "a wait depth of 1 to 3 over 4 K steps per tile");

  // The consumers' position in the ring, kept across the units of a persistent CTA.
  struct ConsumerRing {
    int slot = 0;
    u32 full_parity = 0;
  };

  // The consumers: `count` K tiles into acc (zeroed first), then wait for their last wgmma and
  // release the last slot, so that the ring is free for the next unit's fills.
  static __device__ __forceinline__ void consume(int count, u32 smem_base, u32 full0, u32 empty0,
                                                 const memory::GroupWalk<kBlockK>& walk, ConsumerRing& ring,
                                                 float (&acc)[kAccumulators]) {
    // groups of at least a K tile (step_shift >= 2: every step reads scale row 0): each unit's
    // scale pair loaded once per K tile rather than once per K step (a uniform branch, two loops)
    if (walk.step_shift >= 2) {
      consume_tiles<true>(count, smem_base, full0, empty0, walk, ring, acc);
    } else {
      consume_tiles<false>(count, smem_base, full0, empty0, walk, ring, acc);
    }
  }

  template <bool kOneScaleRow>  // every K step of a K tile reads scale row 0
  static __device__ __forceinline__ void consume_tiles(int count, u32 smem_base, u32 full0, u32 empty0,
                                                       const memory::GroupWalk<kBlockK>& walk, ConsumerRing& ring,
                                                       float (&acc)[kAccumulators]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int unit0 = (warp >> 2) * kUnitsPerWarpGroup, weight_tile = warp & 3;
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    int previous_slot = ring.slot;
    u32 a[kFragmentBuffers][kUnitsPerWarpGroup][4];
    for (int it = 0; it < count; ++it) {
      ptx::mbarrier_wait(full0 + 8 * ring.slot, ring.full_parity);
      const u32 stage_smem = smem_base + ring.slot * kStageBytes;
      typename WeightFragment::ScalePair scales[kUnitsPerWarpGroup];
      if constexpr (kOneScaleRow) {
#pragma unroll
        for (int u = 0; u < kUnitsPerWarpGroup; ++u)
          scales[u] = WeightFragment::scales(stage_smem, 0, unit0 + u, weight_tile);
      }
      // the K step's descriptor: the stage's plus 32 bytes a step (2 in the 16-byte address field,
      // which the stage's offset below 2^18 bytes leaves room for)
      const u64 desc0 = mma::k_major_sw128_descriptor(stage_smem);
#pragma unroll
      for (int kk = 0; kk < kK16Steps; ++kk) {
        // a[kk % kFragmentBuffers] was last read by the wgmma kFragmentBuffers steps back,
        // complete after the previous wait
#pragma unroll
        for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
          if constexpr (!kOneScaleRow) {
            scales[u] = WeightFragment::scales(stage_smem, kk >> walk.step_shift, unit0 + u, weight_tile);
          }
          WeightFragment::load(stage_smem, kk, unit0 + u, weight_tile, scales[u], a[kk % kFragmentBuffers][u]);
        }
        mma::wgmma_fence();
        const u64 desc = desc0 + static_cast<u64>(2 * kk);
#pragma unroll
        for (int u = 0; u < kUnitsPerWarpGroup; ++u) {
          Mma::mma(*reinterpret_cast<float (*)[kUnitAccumulators]>(acc + u * kUnitAccumulators),
                   a[kk % kFragmentBuffers][u], desc);
        }
        mma::wgmma_commit_group();
        mma::wgmma_wait_group<kWaitDepth>();
        // Every wgmma of the previous K tile has completed (at most this tile's first kWaitDepth
        // steps are in flight), and this warp's reads of it were done before them: the slot may
        // be refilled.
        if (kk == kWaitDepth - 1 && it > 0 && lane == 0) ptx::mbarrier_arrive(empty0 + 8 * previous_slot);
      }
      previous_slot = ring.slot;
      if (++ring.slot == kStages) {
        ring.slot = 0;
        ring.full_parity ^= 1u;
      }
    }
    mma::wgmma_wait_group<0>();
    mma::wgmma_fence_operands(acc);
    if (count > 0 && lane == 0) ptx::mbarrier_arrive(empty0 + 8 * previous_slot);
  }

  // The ring's mbarriers: a "full" and an "empty" one per slot, at full0 / empty0 + 8 x slot. For
  // thread 0, before fence_barrier_init and the CTA's barrier (init_barriers; the schedules that
  // drive produce and consume: kernel/grouped_masked_ws.cuh).
  static __device__ __forceinline__ void init_ring_barriers(u32 full0, u32 empty0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(full0 + 8 * s, 1);                // the producer's arrive.expect_tx (+ the bytes)
      ptx::mbarrier_init(empty0 + 8 * s, kConsumerWarps);  // lane 0 of every consumer warp
    }
  }

  // The ring's mbarriers and the staging one, set up by thread 0, then the CTA's only barrier: the
  // producer warpgroup may exit early after it.
  static __device__ __forceinline__ void init_barriers(u32 full0, u32 empty0, u32 staging_barrier) {
    if (threadIdx.x == 0) {
      init_ring_barriers(full0, empty0);
      ptx::mbarrier_init(staging_barrier, 1);  // consumer thread 0, after the consumers' barrier
      ptx::fence_barrier_init();
    }
    __syncthreads();
  }

  // The units of this CTA's work (a stream-K range, or the tail split's one tile or K slice).
  using Units = schedule::WorkUnits<kBlockM, kBlockN, kBlockK>;

  static __device__ __forceinline__ void run(const TmaGemmParams& params) {
    const GemmParams& p = params.gemm;
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

    init_barriers(full0, empty0, staging_barrier);
    // Activations, weights and the output may belong to the previous kernel in the stream (PDL).
    schedule::wait_for_upstream_grid();

    typename StreamK::Unit unit, next;
    if (warp >= kConsumerWarps) {
      ptx::warpgroup_release_registers<kProducerRegisters>();
      if (warp == kConsumerWarps && lane == 0) {
        ptx::prefetch_tensor_map(&params.a_map);
        Units units(params);
        u32 fills = 0, staging_parity = 0;
        bool more = units.next(next);
        while (more) {
          unit = next;
          more = units.next(next);
          produce(p, params.a_map, unit.m_tile * kBlockM, unit.n_tile * kBlockN, unit.k_begin,
                  unit.k_end - unit.k_begin, smem_base, full0, empty0, fills);
          if (more && unit.k_begin == 0) {  // its tile is stored through the ring: wait for that
            ptx::mbarrier_wait(staging_barrier, staging_parity);
            staging_parity ^= 1u;
          }
        }
      }
      return;
    }
    ptx::warpgroup_claim_registers<kConsumerRegisters>();

    const memory::GroupWalk<kBlockK> walk(p.group_size);
    float acc[kAccumulators];
    ConsumerRing ring;
    Units units(params);
    bool more = units.next(next);
    while (more) {
      unit = next;
      more = units.next(next);
      consume(unit.k_end - unit.k_begin, smem_base, full0, empty0, walk, ring, acc);
      // The next kernel may now be scheduled into the slots this grid leaves as it finishes.
      if (!more) schedule::release_dependent_grid();
      if (units.stream_k) {
        if (unit.k_begin > 0) {  // a later part of a tile whose head another CTA holds
          // one scale a thread over its partial: the columns past N (stale weights) must not set it.
          // (Behind a uniform branch, as only a last column tile has them: unconditional, the
          // zeroing put a spill into the K loop of the 176 x 256 uint4 float-zero-point kernel.)
          const int columns = p.n - unit.n_tile * kBlockN;
          if (columns < kBlockN) Fragments::zero_units_from(acc, columns);
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
      Writer::store_tile(p, acc, unit.m_tile * kBlockM, unit.n_tile * kBlockN, smem);
      if (more) {  // the producer waits for the staging tile's last read before it refills the ring
        // this thread's staging accesses (generic proxy) ordered before the TMA and bulk copies
        // (async proxy) that refill the same shared memory
        mma::fence_shared_for_async_proxy();
        ConsumerBarrier::sync();
        if (threadIdx.x == 0) ptx::mbarrier_arrive(staging_barrier);
      }
    }
  }
};

}  // namespace humming_aot::kernel
