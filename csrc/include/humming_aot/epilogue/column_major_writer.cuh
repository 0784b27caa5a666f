#pragma once
// Epilogue of the wgmma body, whose accumulators hold the output transposed: rows are output
// columns (weight channels), columns are output rows (tokens). fp32 accumulators x global scale
// (+ bias) -> activation dtype -> a tile in shared memory -> 16-byte row stores to global memory,
// with the same deterministic split-K reduction as epilogue/output_writer.cuh: each K slice
// stores its fp32 partial tile in the workspace, and the CTA that arrives last at the tile's
// counter sums the partials in slice order 0..k_splits-1, writes the output and resets the
// counter. SM90.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/epilogue/split_k_arrival.cuh>
#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/ptx/warpgroup.cuh>

namespace humming_aot::epilogue {

// Where a thread's accumulators sit in the tile, for the wgmma bodies: threads in warpgroups of
// 128, warpgroup wg holding the kUnits 64-column units kUnits wg + [0, kUnits), one wgmma m64nN
// accumulator set of kTokens / 2 floats per unit: acc[u * kTokens / 2 + 4 j + e] is column
// 64 (kUnits wg + u) + 16 w + g + 8 (e >> 1), token 8 j + 2 t + (e & 1) (w: warp in the
// warpgroup, g = lane / 4, t = lane % 4).
template <int kTokens, int kUnits = 1>
struct WarpgroupFragments {
  static constexpr int kUnitAccumulators = kTokens / 2;
  static constexpr int kAccumulators = kUnits * kUnitAccumulators;
  template <class Fn>
  static __device__ __forceinline__ void for_each(Fn&& fn) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col0 = 64 * kUnits * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);
    const int token0 = 2 * (lane & 3);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
#pragma unroll
      for (int i = 0; i < kUnitAccumulators; ++i) {
        fn(u * kUnitAccumulators + i, token0 + 8 * (i >> 2) + (i & 1), col0 + 64 * u + 8 * ((i >> 1) & 1));
      }
    }
  }
};

// kTokens x kColumns output tile written by kThreads threads (the first kThreads of the CTA)
// whose accumulators Fragments places (Fragments::for_each(fn(index, token, column))); Barrier
// synchronizes exactly those threads.
template <class Act, int kTokens, int kColumns, int kThreads, class Fragments, class Barrier = ptx::CtaBarrier>
struct ColumnMajorWriter {
  static constexpr int kAccumulators = Fragments::kAccumulators;
  static constexpr int kRowElems = kColumns + 8;  // staged row stride: +16 bytes against bank conflicts
  static constexpr int kStagingBytes = kTokens * kRowElems * 2;
  using H2 = numerics::PackedHalf2<Act>;

  static __device__ __forceinline__ u32 round_to_bits(float v) { return H2::from_floats(v, 0.f) & 0xFFFFu; }

  // acc x global scale (+ bias) rounded into the staging tile, then copied row by row to the output.
  static __device__ __forceinline__ void store_tile(const kernel::GemmParams& p, const float (&acc)[kAccumulators],
                                                    int m0, int n0, char* staging) {
    unsigned short* tile = reinterpret_cast<unsigned short*>(staging);
    Fragments::for_each([&](int i, int token, int col) {
      float bias = 0.f;
      if (p.bias != nullptr && n0 + col < p.n) {
        float hi;
        H2::to_floats(static_cast<u32>(static_cast<const unsigned short*>(p.bias)[n0 + col]), bias, hi);
      }
      tile[token * kRowElems + col] = static_cast<unsigned short>(round_to_bits(acc[i] * p.global_scale + bias));
    });
    Barrier::sync();
    constexpr int kChunksPerRow = kColumns / 8;
    const bool vector = ((reinterpret_cast<u64>(p.out) | static_cast<u64>(p.ldo) * 2) & 15) == 0;
    for (int c = threadIdx.x; c < kTokens * kChunksPerRow; c += kThreads) {
      const int token = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      if (m0 + token >= p.m || n0 + col >= p.n) continue;
      const u32* src = reinterpret_cast<const u32*>(tile + token * kRowElems + col);
      char* dst = static_cast<char*>(p.out) + 2 * ((m0 + token) * p.ldo + n0 + col);
      if (vector) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(src[0], src[1], src[2], src[3]);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) reinterpret_cast<u32*>(dst)[e] = src[e];
      }
    }
  }

  // Write the tile (k_splits == 1), or take part in the split-K reduction. Every thread of the CTA
  // calls this after the main loop; `staging` is shared memory no load or wgmma still uses.
  static __device__ __forceinline__ void write(const kernel::GemmParams& p, float (&acc)[kAccumulators], int m0, int n0,
                                               int tile_index, int* arrival_flag, char* staging) {
    if (p.k_splits == 1) {
      store_tile(p, acc, m0, n0, staging);
      return;
    }
    const i64 slice_stride = static_cast<i64>(p.m) * p.n;
    float* partial = p.workspace + blockIdx.y * slice_stride;
    Fragments::for_each([&](int i, int token, int col) {
      if (m0 + token < p.m && n0 + col < p.n) __stcg(partial + static_cast<i64>(m0 + token) * p.n + n0 + col, acc[i]);
    });
    if (!arrive_last_at_tile<Barrier>(p.tile_counters + tile_index, p.k_splits, arrival_flag)) return;
    // Slices outer, accumulators inner: each pass issues all of its independent loads first.
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    for (int s = 0; s < p.k_splits; ++s) {
      const float* slice = p.workspace + s * slice_stride;
      Fragments::for_each([&](int i, int token, int col) {
        if (m0 + token < p.m && n0 + col < p.n) acc[i] += __ldcg(slice + static_cast<i64>(m0 + token) * p.n + n0 + col);
      });
    }
    store_tile(p, acc, m0, n0, staging);
    if (threadIdx.x == 0) p.tile_counters[tile_index] = 0;  // ready for the next launch
  }
};

}  // namespace humming_aot::epilogue
