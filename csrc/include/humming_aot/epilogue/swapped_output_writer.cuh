#pragma once
// Epilogue of the mma.sync body with swapped operands (8- to 32-token tiles): its accumulators
// hold the output transposed, m16n8 fragments whose 16 rows are output columns (weight
// channels) and whose 8 columns are output rows (tokens). fp32 accumulators x global scale
// (+ bias) -> activation dtype -> global memory, with the deterministic split-K reduction of
// epilogue/output_writer.cuh: each K slice stores its fp32 partials in the workspace, and the
// CTA that arrives last at the tile's counter sums them in slice order 0..k_splits-1, writes
// the output and resets the counter; or, on sm_90+ when the launch made the K slices one
// thread-block cluster, write_in_cluster sums them through distributed shared memory (st.async
// into the owning CTA, counted on its mbarriers) in the same order (same bits). Every lane
// writes its own values in place: a tile of at most 32 rows gains nothing from being staged for
// wider stores, and staging would cost a CTA barrier behind the slowest warp. SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/epilogue/cluster_exchange.cuh>
#include <humming_aot/epilogue/split_k_arrival.cuh>
#include <humming_aot/numerics/host_device.cuh>
#include <humming_aot/numerics/packed_half2.cuh>

namespace humming_aot::epilogue {

// kTiles m16n8 fragments of one warp, kRowTiles groups of 8 tokens (1; 2 or 4 for the 16- and
// 32-token tiles) of kTiles / kRowTiles fragments each; fragment j = r * (kTiles / kRowTiles) + c covers
// output columns col0 + 16 c + [0, 16) and rows token0 + 8 r + [0, 8).
template <class Act, int kTiles, int kRowTiles = 1>
struct SwappedOutputWriter {
  using H2 = numerics::PackedHalf2<Act>;
  using Accumulators = float[kTiles][4];
  static_assert(kTiles % kRowTiles == 0, "every group of 8 tokens has the same columns");
  static constexpr int kColumnTiles = kTiles / kRowTiles;

  // Visit every value this lane owns: acc[j][e] is output row token0 + 8 r + 2t + (e & 1), column
  // col0 + 16 c + g + 8 (e >> 1) (g = lane / 4, t = lane % 4; j = r * kColumnTiles + c).
  template <class Fn>
  static __device__ __forceinline__ void for_each(int token0, int col0, Fn&& fn) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int r = j / kColumnTiles, c = j % kColumnTiles;  // j is unrolled: constants
#pragma unroll
      for (int e = 0; e < 4; ++e) fn(j, e, token0 + 8 * r + 2 * t + (e & 1), col0 + 16 * c + g + 8 * (e >> 1));
    }
  }

  // What an output store reads from the kernel parameters, in registers.
  struct Target {
    unsigned short* out;
    const unsigned short* bias;
    i64 ldo;
    float global_scale;
    int m, n;

    __device__ __forceinline__ explicit Target(const kernel::GemmParams& p)
        : out(static_cast<unsigned short*>(p.out)),
          bias(static_cast<const unsigned short*>(p.bias)),
          ldo(p.ldo),
          global_scale(p.global_scale),
          m(p.m),
          n(p.n) {}

    __device__ __forceinline__ void store(int token, int col, float v) const {
      v *= global_scale;
      if (bias != nullptr) {
        float b, unused;
        H2::to_floats(static_cast<u32>(bias[col]), b, unused);
        v += b;
      }
      out[static_cast<i64>(token) * ldo + col] = static_cast<unsigned short>(H2::from_floats(v, 0.f) & 0xFFFFu);
    }
  };

  static __device__ __forceinline__ void store(const kernel::GemmParams& p, int token, int col, float v) {
    Target(p).store(token, col, v);
  }

  // Write the warp's fragments (k_splits == 1), or take part in the split-K reduction. Every
  // thread of the CTA calls this, each with its own fragments of the tile.
  static __device__ __forceinline__ void write(const kernel::GemmParams& p, Accumulators& acc, int token0, int col0,
                                               int tile_index, int* arrival_flag) {
    if (p.k_splits == 1) {
      for_each(token0, col0, [&](int j, int e, int token, int col) {
        if (token < p.m && col < p.n) store(p, token, col, acc[j][e]);
      });
      return;
    }
    const i64 slice_stride = static_cast<i64>(p.m) * p.n;
    float* partial = p.workspace + blockIdx.y * slice_stride;
    for_each(token0, col0, [&](int j, int e, int token, int col) {
      if (token < p.m && col < p.n) __stcg(partial + static_cast<i64>(token) * p.n + col, acc[j][e]);
    });
    if (!arrive_last_at_tile(p.tile_counters + tile_index, p.k_splits, arrival_flag)) return;
    // Slices outer: each pass issues all of its independent loads before any add waits on one.
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    for (int s = 0; s < p.k_splits; ++s) {
      const float* slice = p.workspace + s * slice_stride;
      for_each(token0, col0, [&](int j, int e, int token, int col) {
        if (token < p.m && col < p.n) acc[j][e] += __ldcg(slice + static_cast<i64>(token) * p.n + col);
      });
    }
    for_each(token0, col0, [&](int j, int e, int token, int col) {
      if (token < p.m && col < p.n) store(p, token, col, acc[j][e]);
    });
    if (threadIdx.x == 0) p.tile_counters[tile_index] = 0;  // ready for the next launch
  }

  // The largest cluster (K slices) write_in_cluster serves: the portable cluster size.
  static constexpr int kMaxClusterSlices = 8;

  // The kernel parameters as the epilogue reads them: a copy per warp in shared memory, made at
  // the kernel's start (prepare). The parameters live in a constant bank whose cache has
  // forgotten them by the end of the K loop; read there, each was a miss of ~0.2 us on the
  // epilogue's critical path (docs/performance/log.md section 17). in_cluster: reduces_in_cluster,
  // whose cluster size is a constant-bank read as well.
  struct StashedParams {
    kernel::GemmParams p;
    u32 in_cluster;
    u32 unused[(128 - sizeof(kernel::GemmParams)) / 4 - 1];
  };
  static constexpr int kStashBytes = 128;
  static_assert(sizeof(StashedParams) == kStashBytes, "one 128-byte copy per warp");

  // Shared-memory bytes of the exchange region a CTA of `warps` warps needs: the warps' stashed
  // parameters, kBarrierBytes of mbarriers (one per split-K share the CTA owns), then the
  // fragments. A CTA owns the shares of at most ceil(warps / slices) warp slots, each receiving
  // one copy per slice; (warps + slices - 1) bounds ceil(warps / slices) x slices. The region is
  // the CTA's own (not the pipeline's): a slice may write into it while the CTA still runs its K
  // loop.
  static constexpr int kBarrierBytes = 64;
  static HUMMING_AOT_HOST_DEVICE constexpr int exchange_bytes(int warps) {
    return warps * kStashBytes + kBarrierBytes + (warps + kMaxClusterSlices - 1) * kTiles * 32 * 16;
  }
  static_assert(kBarrierBytes >= 8 * (kMaxClusterSlices / 2), "an mbarrier per owned share (at least 2 slices)");

  // Whether write_in_cluster takes this launch: sm_90+, and the K slices of each tile (2 to
  // kMaxClusterSlices of them) are the CTAs of one thread-block cluster. Uniform over the grid.
  static __device__ __forceinline__ bool reduces_in_cluster(const kernel::GemmParams& p) {
    return cluster::kAvailable && p.k_splits > 1 && p.k_splits <= kMaxClusterSlices &&
           cluster::size() == static_cast<u32>(p.k_splits);
  }

  // Warp slot `slot`'s share belongs to the CTA of rank slot % slices, as its share number
  // slot / slices (without a division).
  static __device__ __forceinline__ void share_owner(int slot, int slices, int& owner, int& owned_index) {
    owner = slot;
    owned_index = 0;
    while (owner >= slices) {
      owner -= slices;
      ++owned_index;
    }
  }

  // Every thread of the CTA calls this once, at the kernel's start, with the exchange region (a
  // shared::cta address), the CTA's warp count and its warp's slot; returns reduces_in_cluster.
  // Each warp stashes the parameters for its epilogue (stashed()); its lanes read each other's
  // words after share_over_k_warps' CTA barrier, or (one K warp) the __syncwarp before the
  // kernel's epilogue reads its stash. With the reduction in the cluster, thread 0 sets up the
  // mbarriers of the shares this CTA owns (each expects the share's bytes from every slice), and
  // every thread arrives at the cluster barrier that join_cluster waits for.
  static __device__ __forceinline__ bool prepare(const kernel::GemmParams& p, u32 exchange, int warps, int slot) {
    const bool in_cluster = reduces_in_cluster(p);
    const u32 lane = threadIdx.x & 31;
    constexpr u32 kParamWords = sizeof(kernel::GemmParams) / 4;
    static_assert(kParamWords < 32, "one word per lane");
    if (lane <= kParamWords) {
      const u32 word = lane < kParamWords ? reinterpret_cast<const u32*>(&p)[lane] : static_cast<u32>(in_cluster);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(exchange + slot * kStashBytes + 4 * lane), "r"(word) : "memory");
    }
    if (in_cluster) {
      // Thread 0 sets up the mbarrier of every share this CTA owns (warp slots rank, rank +
      // slices, ...: at most ceil(warps / slices)), each expecting the share's bytes from every
      // slice. One thread, not one per share: nvcc lowers a per-thread mbarrier.init under a
      // divergent branch to a warp-uniform loop (VOTEU + R2UR, one SYNCS.EXCH.64 per distinct
      // address, issued for the warp), which compute-sanitizer's racecheck attributes to another
      // lane than the one whose SYNCS.ARRIVE.TRANS64 follows: it reported every owned mbarrier
      // as a hazard (4 per CTA at 8 warps and 2 slices: 256 at N = 4096). That was no race (the
      // same thread initialized and arrived, in program order; no slot is reused; no other CTA
      // signals before the cluster barrier below), but a report the GPU suite could not tell
      // from a real one.
      if (threadIdx.x == 0) {
        const u32 bytes = static_cast<u32>(p.k_splits * kTiles * 32 * 16);
        int owned_index = 0;
        for (int slot = static_cast<int>(cluster::rank()); slot < warps; slot += p.k_splits, ++owned_index) {
          const u32 bar = barrier(exchange, warps, owned_index);
          cluster::init_byte_barrier(bar);
          cluster::expect_bytes(bar, bytes);
        }
        cluster::fence_barrier_init();
      }
      cluster::arrive_relaxed();
    }
    return in_cluster;
  }

  // ... then every thread calls this once before write_in_cluster, as early as it can (with
  // prepare's result): it returns once every CTA of the cluster runs and has set up its
  // mbarriers (they start together, so this is soon). Early, its wait hides behind the
  // prologue's loads instead of lengthening the epilogue.
  static __device__ __forceinline__ void join_cluster(bool in_cluster) {
    if (in_cluster) cluster::wait();
  }

  // The parameters warp `slot` stashed in prepare (`exchange`: the generic address of the region).
  static __device__ __forceinline__ const StashedParams& stashed(const char* exchange, int slot) {
    return *reinterpret_cast<const StashedParams*>(exchange + slot * kStashBytes);
  }

  // The mbarrier of the CTA's owned share `owned_index` in the region at `exchange`.
  static __device__ __forceinline__ u32 barrier(u32 exchange, int warps, int owned_index) {
    return exchange + warps * kStashBytes + 8 * owned_index;
  }

  // The split-K reduction inside a thread-block cluster (epilogue/cluster_exchange.cuh), taken
  // iff the stash says so (after prepare and join_cluster); returns false, having done nothing,
  // otherwise (then call write). Every thread of the CTA calls it.
  //   stash:    stashed(..., slot)
  //   exchange: shared::cta address of this CTA's exchange region (exchange_bytes(warps) bytes)
  //   slot:     this warp's index in the CTA (each warp holds one share of the tile)
  // The share of warp slot w is summed by the CTA of rank w % slices: every slice's warp w pushes
  // its fragments into that CTA's region with st.async, counted on the share's mbarrier there, and
  // is done (no fence, no barrier); the owner's warp w waits on that mbarrier for every slice's
  // bytes, then adds them up in slice order from zero as write() does (same bits) and writes them.
  // Nobody reads another CTA's memory, and a CTA leaves only after the data it owns has landed.
  static __device__ __forceinline__ bool write_in_cluster(const StashedParams& stash, const Accumulators& acc,
                                                          int token0, int col0, u32 exchange, int warps, int slot) {
    if (!stash.in_cluster) return false;
    const int slices = stash.p.k_splits;
    int owner, owned_index;
    share_owner(slot, slices, owner, owned_index);
    const u32 rank = cluster::rank(), lane = threadIdx.x & 31;
    const u32 bar = barrier(exchange, warps, owned_index);
    // fragment j of slice s for the owner's owned share i: ((i * slices + s) * kTiles + j) * 32 lanes
    const u32 fragments = exchange + warps * kStashBytes + kBarrierBytes;
    const auto fragment = [&](int s, int j) {
      return fragments + (((owned_index * slices + s) * kTiles + j) * 32 + lane) * 16;
    };
    const u32 remote_bar = cluster::map_to(bar, static_cast<u32>(owner));
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      cluster::store4_async(cluster::map_to(fragment(static_cast<int>(rank), j), static_cast<u32>(owner)), remote_bar,
                            acc[j]);
    }
    if (owner != static_cast<int>(rank)) return true;  // warp-uniform
    const Target target(stash.p);
    cluster::wait_byte_barrier(bar);
    float sum[kTiles][4];
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[j][e] = 0.f;
    // Unrolled over the largest cluster, so that every slice's loads leave before the first add
    // waits; the adds stay in slice order.
#pragma unroll
    for (int s = 0; s < kMaxClusterSlices; ++s) {
      if (s < slices) {
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          float v[4];
          cluster::load4_local(fragment(s, j), v);
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[j][e] += v[e];
        }
      }
    }
    for_each(token0, col0, [&](int j, int e, int token, int col) {
      if (token < target.m && col < target.n) target.store(token, col, sum[j][e]);
    });
    return true;
  }
};

}  // namespace humming_aot::epilogue
