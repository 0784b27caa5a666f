#pragma once
// Epilogue of the mma.sync body with swapped operands (8-row tiles, M <= 8): its accumulators
// hold the output transposed, m16n8 fragments whose 16 rows are output columns (weight
// channels) and whose 8 columns are output rows (tokens). fp32 accumulators x global scale
// (+ bias) -> activation dtype -> global memory, with the deterministic split-K reduction of
// epilogue/output_writer.cuh: each K slice stores its fp32 partials in the workspace, and the
// CTA that arrives last at the tile's counter sums them in slice order 0..k_splits-1, writes
// the output and resets the counter; or, on sm_90+ when the launch made the K slices one
// thread-block cluster, write_in_cluster sums them through distributed shared memory in the
// same order (same bits). Every lane writes its own values in place: a tile of at
// most 8 rows gains nothing from being staged for wider stores, and staging would cost a CTA
// barrier behind the slowest warp. SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/epilogue/cluster_exchange.cuh>
#include <humming_aot/epilogue/split_k_arrival.cuh>
#include <humming_aot/numerics/host_device.cuh>
#include <humming_aot/numerics/packed_half2.cuh>

namespace humming_aot::epilogue {

// kTiles m16n8 fragments of one warp; fragment j covers output columns col0 + 16 j + [0, 16)
// and rows token0 + [0, 8).
template <class Act, int kTiles>
struct SwappedOutputWriter {
  using H2 = numerics::PackedHalf2<Act>;
  using Accumulators = float[kTiles][4];

  // Visit every value this lane owns: acc[j][e] is output row token0 + 2t + (e & 1), column
  // col0 + 16 j + g + 8 (e >> 1) (g = lane / 4, t = lane % 4).
  template <class Fn>
  static __device__ __forceinline__ void for_each(int token0, int col0, Fn&& fn) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) fn(j, e, token0 + 2 * t + (e & 1), col0 + 16 * j + g + 8 * (e >> 1));
    }
  }

  static __device__ __forceinline__ void store(const kernel::GemmParams& p, int token, int col, float v) {
    v *= p.global_scale;
    if (p.bias != nullptr) {
      float bias, unused;
      H2::to_floats(static_cast<u32>(static_cast<const unsigned short*>(p.bias)[col]), bias, unused);
      v += bias;
    }
    static_cast<unsigned short*>(p.out)[static_cast<i64>(token) * p.ldo + col] =
        static_cast<unsigned short>(H2::from_floats(v, 0.f) & 0xFFFFu);
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

  // Shared-memory bytes of the exchange region write_in_cluster needs in a CTA of kWarps warps: a
  // CTA owns the shares of at most ceil(kWarps / slices) warp slots, each receiving one copy per
  // slice; (kWarps + slices - 1) bounds ceil(kWarps / slices) x slices. The region is the CTA's
  // own (not the pipeline's): a slice may write into it while the CTA still runs its K loop.
  static HUMMING_AOT_HOST_DEVICE constexpr int exchange_bytes(int warps) {
    return (warps + kMaxClusterSlices - 1) * kTiles * 32 * 16;
  }

  // Whether write_in_cluster takes this launch: sm_90+, and the K slices of each tile (2 to
  // kMaxClusterSlices of them) are the CTAs of one thread-block cluster. Uniform over the grid.
  static __device__ __forceinline__ bool reduces_in_cluster(const kernel::GemmParams& p) {
    return cluster::kAvailable && p.k_splits > 1 && p.k_splits <= kMaxClusterSlices &&
           cluster::size() == static_cast<u32>(p.k_splits);
  }

  // Every thread of a CTA that will take write_in_cluster calls this once, early (the kernel's
  // start): its arrival lets write_in_cluster's first wait prove that the whole cluster runs.
  static __device__ __forceinline__ void prepare_cluster(const kernel::GemmParams& p) {
    if (reduces_in_cluster(p)) cluster::arrive_relaxed();
  }

  // The split-K reduction inside a thread-block cluster (epilogue/cluster_exchange.cuh), taken
  // iff reduces_in_cluster (after prepare_cluster at the kernel's start); returns false, having
  // done nothing, otherwise (then call write). Every thread of the CTA calls it.
  //   exchange: shared::cta address of this CTA's exchange region (exchange_bytes(warps) bytes)
  //   slot:     this warp's index in the CTA (each warp holds one share of the tile)
  // The share of warp slot w is summed by the CTA of rank w % slices: every slice's warp w
  // writes its fragments into that CTA's region (a remote store), then one cluster barrier, then
  // the owner adds them up in slice order from zero as write() does (same bits) and writes them.
  // Nobody reads another CTA's memory after the barrier, so no CTA waits for another to finish.
  static __device__ __forceinline__ bool write_in_cluster(const kernel::GemmParams& p, const Accumulators& acc,
                                                          int token0, int col0, u32 exchange, int slot) {
    if (!reduces_in_cluster(p)) return false;
    const int slices = p.k_splits;
    int owner = slot, owned_index = 0;  // slot % slices and slot / slices, without a division
    while (owner >= slices) {
      owner -= slices;
      ++owned_index;
    }
    const u32 rank = cluster::rank(), lane = threadIdx.x & 31;
    // fragment j of slice s for the owner's owned share i: ((i * slices + s) * kTiles + j) * 32 lanes
    const auto fragment = [&](int s, int j) {
      return exchange + (((owned_index * slices + s) * kTiles + j) * 32 + lane) * 16;
    };
    cluster::wait();  // the arrival of prepare_cluster: every CTA of the cluster has started
#pragma unroll
    for (int j = 0; j < kTiles; ++j) cluster::store4_to(fragment(static_cast<int>(rank), j), static_cast<u32>(owner), acc[j]);
    cluster::arrive();
    cluster::wait();
    if (owner != static_cast<int>(rank)) return true;  // warp-uniform
    float sum[kTiles][4];
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[j][e] = 0.f;
    for (int s = 0; s < slices; ++s) {
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        float v[4];
        cluster::load4_local(fragment(s, j), v);
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[j][e] += v[e];
      }
    }
    for_each(token0, col0, [&](int j, int e, int token, int col) {
      if (token < p.m && col < p.n) store(p, token, col, sum[j][e]);
    });
    return true;
  }
};

}  // namespace humming_aot::epilogue
