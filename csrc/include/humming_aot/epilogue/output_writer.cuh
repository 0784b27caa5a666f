#pragma once
// Epilogue of the mma.sync body: fp32 accumulators x global scale (+ bias) -> activation dtype ->
// global memory, with a deterministic split-K reduction. Each K slice stores its fp32 partial
// tile in the workspace; the CTA that arrives last at the tile's counter sums the partials in
// slice order 0..k_splits-1 (so the result does not depend on arrival order), writes the output
// and resets the counter. SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/epilogue/split_k_arrival.cuh>
#include <humming_aot/mma/mma_sync.cuh>
#include <humming_aot/numerics/packed_half2.cuh>

namespace humming_aot::epilogue {

// kMTiles x kNTiles m16n8 accumulator fragments per warp; the warp's tile starts at
// (row0, col0) of the output; fragment (mi, ni) covers rows row0 + 16 mi + [0, 16) and columns
// col0 + 8 ni + [0, 8).
template <class Act, int kMTiles, int kNTiles>
struct OutputWriter {
  using H2 = numerics::PackedHalf2<Act>;
  using Accumulators = float[kMTiles][kNTiles][4];

  // Visit every (row, col, value pair) this lane owns: c[0..1] at row g, c[2..3] at row g + 8.
  template <class Fn>
  static __device__ __forceinline__ void for_each_pair(int row0, int col0, Fn&& fn) {
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          fn(mi, ni, half, row0 + 16 * mi + g + 8 * half, col0 + 8 * ni + 2 * t);
        }
      }
    }
  }

  static __device__ __forceinline__ void zero(Accumulators& acc) { mma::zero_accumulators(acc); }

  static __device__ __forceinline__ void store(const kernel::GemmParams& p, int row, int col, float v0, float v1) {
    v0 *= p.global_scale;
    v1 *= p.global_scale;
    if (p.bias != nullptr) {
      float b0, b1;
      H2::to_floats(*reinterpret_cast<const u32*>(static_cast<const char*>(p.bias) + 2 * col), b0, b1);
      v0 += b0;
      v1 += b1;
    }
    u32* dst = reinterpret_cast<u32*>(static_cast<char*>(p.out) + 2 * (row * p.ldo + col));
    *dst = H2::from_floats(v0, v1);
  }

  // Write the tile (k_splits == 1), or take part in the split-K reduction. Every thread of the CTA
  // calls this, each with its own fragments of the tile.
  static __device__ __forceinline__ void write(const kernel::GemmParams& p, Accumulators& acc, int row0, int col0,
                                               int tile_index, int* arrival_flag) {
    if (p.k_splits == 1) {
      for_each_pair(row0, col0, [&](int mi, int ni, int half, int row, int col) {
        if (row < p.m && col < p.n) store(p, row, col, acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      });
      return;
    }
    const i64 slice_stride = static_cast<i64>(p.m) * p.n;
    float* partial = p.workspace + blockIdx.y * slice_stride;
    for_each_pair(row0, col0, [&](int mi, int ni, int half, int row, int col) {
      if (row < p.m && col < p.n) {
        float2 v = make_float2(acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
        __stcg(reinterpret_cast<float2*>(partial + static_cast<i64>(row) * p.n + col), v);
      }
    });
    const bool last = arrive_last_at_tile(p.tile_counters + tile_index, p.k_splits, arrival_flag);
    if (!last) return;
    // Sum the slices in order 0..k_splits-1 into the (reused) accumulators. Slices are the outer
    // loop so that each pass issues all of its independent loads before any add waits on one.
    zero(acc);
    for (int s = 0; s < p.k_splits; ++s) {
      const float* slice = p.workspace + s * slice_stride;
      for_each_pair(row0, col0, [&](int mi, int ni, int half, int row, int col) {
        if (row < p.m && col < p.n) {
          const float2 v = __ldcg(reinterpret_cast<const float2*>(slice + static_cast<i64>(row) * p.n + col));
          acc[mi][ni][2 * half] += v.x;
          acc[mi][ni][2 * half + 1] += v.y;
        }
      });
    }
    for_each_pair(row0, col0, [&](int mi, int ni, int half, int row, int col) {
      if (row < p.m && col < p.n) store(p, row, col, acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
    });
    if (threadIdx.x == 0) p.tile_counters[tile_index] = 0;  // ready for the next launch
  }
};

}  // namespace humming_aot::epilogue
