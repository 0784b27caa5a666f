#pragma once
// Epilogue of the wgmma bodies, whose accumulators hold the output transposed (WarpgroupFragments:
// rows are output columns, weight channels; columns are output rows, tokens) or, where the tokens
// are wgmma's M (epilogue/token_major_fragments.cuh), as the output lies. fp32 accumulators x
// global scale (+ bias) -> activation dtype, two tokens (or two columns) a register -> a tile of
// token rows in shared memory, by stmatrix (four 8 x 8 blocks an instruction; transposed from
// WarpgroupFragments) -> 16-byte row stores to global memory,
// with the same deterministic split-K reduction as epilogue/output_writer.cuh: each K slice
// stores its fp32 partial tile in the workspace, and the CTA that arrives last at the tile's
// counter sums the partials in slice order 0..k_splits-1, writes the output and resets the
// counter. SM90.

#include <humming_aot/epilogue/split_k_arrival.cuh>
#include <humming_aot/epilogue/token_major_fragments.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/numerics/packed_half2.cuh>
#include <humming_aot/ptx/warpgroup.cuh>

namespace humming_aot::epilogue {

// Where a thread's accumulators sit in the tile, for the wgmma bodies: threads in warpgroups of
// 128, warpgroup wg holding the kUnits 64-column units kUnits wg + [0, kUnits), one wgmma m64nN
// accumulator set of kTokens / 2 floats per unit: acc[index(u, j, e)] = acc[u * kTokens / 2 + 4 j + e]
// is column first_column() + 64 u + 8 (e >> 1), token first_token() + 8 j + (e & 1), where
// first_column() = 64 kUnits wg + 16 w + g and first_token() = 2 t (w: warp in the warpgroup,
// g = lane / 4, t = lane % 4): per unit and 8-token chunk j, the m16n8 accumulator layout of an
// 8 x 8 block of columns g and one of columns 8 + g (which stmatrix stores).
template <int kTokens, int kUnits = 1>
struct WarpgroupFragments {
  static_assert(kTokens % 8 == 0, "whole 8-token chunks");
  static constexpr bool kTokenMajor = false;
  static constexpr int kUnitAccumulators = kTokens / 2;
  static constexpr int kAccumulators = kUnits * kUnitAccumulators;
  static constexpr int kChunks = kTokens / 8;
  static constexpr int kUnitsPerWarpGroup = kUnits;

  static __device__ __forceinline__ int first_column() {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    return 64 * kUnits * (warp >> 2) + 16 * (warp & 3) + (lane >> 2);
  }
  static __device__ __forceinline__ int first_token() { return 2 * (threadIdx.x & 3); }
  static constexpr __host__ __device__ int index(int u, int j, int e) { return u * kUnitAccumulators + 4 * j + e; }

  template <class Fn>
  static __device__ __forceinline__ void for_each(Fn&& fn) {
    const int col0 = first_column(), token0 = first_token();
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
#pragma unroll
      for (int i = 0; i < kUnitAccumulators; ++i) {
        fn(u * kUnitAccumulators + i, token0 + 8 * (i >> 2) + (i & 1), col0 + 64 * u + 8 * ((i >> 1) & 1));
      }
    }
  }

  // The accumulators of the units at or past tile column `columns` (a multiple of 64) set to zero:
  // the body copies no weights past N, so theirs come from stale shared memory, which a consumer of
  // all of a thread's values at once (a scaled stream-K partial) must not see.
  static __device__ __forceinline__ void zero_units_from(float (&acc)[kAccumulators], int columns) {
    const int unit0 = kUnits * static_cast<int>(threadIdx.x >> 7);
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (64 * (unit0 + u) >= columns) {
#pragma unroll
        for (int i = 0; i < kUnitAccumulators; ++i) acc[u * kUnitAccumulators + i] = 0.0f;
      }
    }
  }

  // The thread's accumulators times per-token factors: fn(token) is the factor of a tile token
  // (called once per token the thread holds; tokens 0 .. kTokens - 1).
  template <class Fn>
  static __device__ __forceinline__ void scale_tokens(float (&acc)[kAccumulators], Fn&& factor_of) {
    const int token0 = first_token();
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const float f0 = factor_of(token0 + 8 * j), f1 = factor_of(token0 + 8 * j + 1);
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[index(u, j, e)] *= (e & 1) ? f1 : f0;
      }
    }
  }
};

// stmatrix (sm_90): 8 x 8 b16 blocks from the m16n8 accumulator layout (register i: block i, the
// lane's row g = lane / 4, columns 2 t and 2 t + 1 in its low and high halves), stored transposed:
// column c of block i goes to the 16 bytes at the address lane 8 i + c supplies.
__device__ __forceinline__ void stmatrix_trans_x4(u32 address, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void stmatrix_x4(u32 address, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void stmatrix_trans_x2(u32 address, u32 r0, u32 r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(address), "r"(r0), "r"(r1)
               : "memory");
}

// The columns and tokens that kThreads threads' fragments cover (transposed: any kTokens).
template <class Fragments, int kThreads, int kTokens, bool kTokenMajor = Fragments::kTokenMajor>
struct StagedShape {
  static constexpr int kColumns = 64 * Fragments::kUnitsPerWarpGroup * (kThreads / 128);
  static constexpr int kRows = kTokens;
};
template <class Fragments, int kThreads, int kTokens>
struct StagedShape<Fragments, kThreads, kTokens, true> {
  static constexpr int kColumns = Fragments::kColumns;
  static constexpr int kRows = Fragments::kTokensPerWarpGroup * (kThreads / 128);
};

// kTokens x kColumns output tile written by kThreads threads (the first kThreads of the CTA)
// whose accumulators are in WarpgroupFragments' layout or TokenMajorFragments' (the stmatrix
// store needs their m16n8 blocks: first_column, index, kChunks; the split-K path their for_each);
// Barrier synchronizes exactly those threads.
template <class Act, int kTokens, int kColumns, int kThreads, class Fragments, class Barrier = ptx::CtaBarrier>
struct ColumnMajorWriter {
  static constexpr int kAccumulators = Fragments::kAccumulators;
  static constexpr int kRowElems = kColumns + 8;  // staged row stride: +16 bytes against bank conflicts
  static constexpr int kStagingBytes = kTokens * kRowElems * 2;
  using H2 = numerics::PackedHalf2<Act>;
  static constexpr bool kFragmentsTokenMajor = Fragments::kTokenMajor;
  using Shape = StagedShape<Fragments, kThreads, kTokens>;
  static_assert(kColumns == Shape::kColumns && kTokens == Shape::kRows,
                "the threads' warpgroups hold every staged row and column (the stmatrix store writes whole rows)");

  // acc x global scale (+ bias) rounded into the staging tile, then copied row by row to the output.
  static __device__ __forceinline__ void store_tile(const kernel::GemmParams& p, const float (&acc)[kAccumulators],
                                                    int m0, int n0, char* staging) {
    static_assert(kRowElems % 8 == 0, "16-byte staged rows (stmatrix)");
    if constexpr (kFragmentsTokenMajor) {
      stage_token_major(p, acc, n0, staging);
    } else {
      stage_transposed(p, acc, n0, staging);
    }
    Barrier::sync();
    copy_out(p, m0, n0, memory::shared_address(staging));
  }

  // WarpgroupFragments' accumulators into the staging tile, transposed. Per unit, the thread's two
  // columns' biases are read once; per pair of 8-token chunks one stmatrix stores the blocks (chunk
  // j, columns g), (j, 8 + g), (j + 1, g), (j + 1, 8 + g): lane 8 i + c supplies the staged row of
  // token c of block i (an odd last chunk: two blocks).
  static __device__ __forceinline__ void stage_transposed(const kernel::GemmParams& p,
                                                          const float (&acc)[kAccumulators], int n0, char* staging) {
    const unsigned short* bias = static_cast<const unsigned short*>(p.bias);
    const int lane = threadIdx.x & 31, col0 = Fragments::first_column();
    const int block = lane >> 3;  // the block whose row this lane addresses
    const u32 tile_address = memory::shared_address(staging);
    const auto pack = [&](int i, float b) {
      return H2::from_floats(acc[i] * p.global_scale + b, acc[i + 1] * p.global_scale + b);
    };
#pragma unroll
    for (int u = 0; u < Fragments::kUnitsPerWarpGroup; ++u) {
      float b[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = n0 + col0 + 64 * u + 8 * h;
        if (bias != nullptr && col < p.n) {
          float unused;
          H2::to_floats(static_cast<u32>(bias[col]), b[h], unused);
        }
      }
      // this lane's staged row: token 8 (j + block / 2) + lane % 8, columns from the warp's 8 (block % 2)
      const int lane_col = col0 - (lane >> 2) + 64 * u + 8 * (block & 1);
      const u32 row = tile_address + 2u * static_cast<u32>(((block >> 1) * 8 + (lane & 7)) * kRowElems + lane_col);
#pragma unroll
      for (int j = 0; j + 1 < Fragments::kChunks; j += 2) {
        stmatrix_trans_x4(row + 2u * static_cast<u32>(8 * j * kRowElems), pack(Fragments::index(u, j, 0), b[0]),
                          pack(Fragments::index(u, j, 2), b[1]), pack(Fragments::index(u, j + 1, 0), b[0]),
                          pack(Fragments::index(u, j + 1, 2), b[1]));
      }
      if constexpr (Fragments::kChunks % 2 == 1) {
        constexpr int j = Fragments::kChunks - 1;  // lanes 0-15 address its two blocks
        stmatrix_trans_x2(row + 2u * static_cast<u32>(8 * j * kRowElems), pack(Fragments::index(u, j, 0), b[0]),
                          pack(Fragments::index(u, j, 2), b[1]));
      }
    }
  }

  // Token-major accumulators (epilogue/token_major_fragments.cuh) into the staging tile: per pair
  // of 8-column chunks one stmatrix stores the blocks (tokens g, chunk j), (8 + g, j), (g, j + 1),
  // (8 + g, j + 1); lane 8 i + r supplies the staged row of token r of block i. A column pair's
  // biases are read once.
  static __device__ __forceinline__ void stage_token_major(const kernel::GemmParams& p,
                                                           const float (&acc)[kAccumulators], int n0, char* staging) {
    const unsigned short* bias = static_cast<const unsigned short*>(p.bias);
    const int lane = threadIdx.x & 31, col0 = Fragments::first_column();
    const int block = lane >> 3;
    // this lane's staged row: token 16 warp + 8 (block % 2) + lane % 8, columns from 8 (j + block / 2)
    const int token = 16 * static_cast<int>(threadIdx.x >> 5) + 8 * (block & 1) + (lane & 7);
    const u32 row = memory::shared_address(staging) + 2u * static_cast<u32>(token * kRowElems + 8 * (block >> 1));
    const auto column_bias = [&](int j, float (&b)[2]) {
      b[0] = b[1] = 0.f;
      if (bias == nullptr) return;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = n0 + col0 + 8 * j + e;
        if (col < p.n) {
          float unused;
          H2::to_floats(static_cast<u32>(bias[col]), b[e], unused);
        }
      }
    };
    const auto pack = [&](int i, const float (&b)[2]) {
      return H2::from_floats(acc[i] * p.global_scale + b[0], acc[i + 1] * p.global_scale + b[1]);
    };
#pragma unroll
    for (int j = 0; j < Fragments::kChunks; j += 2) {
      float b0[2], b1[2];
      column_bias(j, b0);
      column_bias(j + 1, b1);
      stmatrix_x4(row + 2u * static_cast<u32>(8 * j), pack(Fragments::index(j, 0), b0),
                  pack(Fragments::index(j, 2), b0), pack(Fragments::index(j + 1, 0), b1),
                  pack(Fragments::index(j + 1, 2), b1));
    }
  }

  // The staged tile to the output, 16-byte chunks: thread t copies column chunk t % kChunksPerRow
  // of rows t / kChunksPerRow + kRowsPerPass i. Its shared-memory loads go out kBatch at a time
  // before their stores (one load latency per batch rather than per chunk), with the row and
  // column addresses stepped by constants.
  static constexpr int kChunksPerRow = kColumns / 8;
  static_assert(kThreads % kChunksPerRow == 0, "every thread keeps one column chunk");
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kPasses = (kTokens + kRowsPerPass - 1) / kRowsPerPass;
  static constexpr int kBatch = kPasses < 4 ? kPasses : 4;

  // The tiles whose threads hold 128 accumulators (two consumer warpgroups of a 168-register
  // split): there the batched copy-out below makes ptxas spill a register set up before the K loop
  // (int5 256 x 128), so one chunk at a time, its index recomputed per chunk (one 16-byte load each).
  static constexpr bool kRegisterBound = kAccumulators >= 128;
  // One 16-byte chunk to the output: one store where the output's rows are 16-byte aligned, else four.
  static __device__ __forceinline__ void store_chunk(char* dst, const u32 (&v)[4], bool vector) {
    if (vector) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) reinterpret_cast<u32*>(dst)[e] = v[e];
    }
  }
  static __device__ __forceinline__ void copy_out_by_chunks(const kernel::GemmParams& p, int m0, int n0,
                                                            u32 tile_address) {
    const bool vector = ((reinterpret_cast<u64>(p.out) | static_cast<u64>(p.ldo) * 2) & 15) == 0;
    for (int c = threadIdx.x; c < kTokens * kChunksPerRow; c += kThreads) {
      const int token = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      if (m0 + token >= p.m || n0 + col >= p.n) continue;
      u32 v[4];
      memory::lds_128(v, tile_address + 2u * static_cast<u32>(token * kRowElems + col));
      store_chunk(static_cast<char*>(p.out) + 2 * ((m0 + token) * p.ldo + n0 + col), v, vector);
    }
  }

  static __device__ __forceinline__ void copy_out(const kernel::GemmParams& p, int m0, int n0, u32 tile_address) {
    if constexpr (kRegisterBound) {
      copy_out_by_chunks(p, m0, n0, tile_address);
      return;
    }
    // The thread's index and the output's address and stride pass through empty volatile asm, so
    // that what is derived from them is worked out here, per tile, rather than hoisted above the
    // K loop of a persistent CTA, where it would hold registers the accumulators need (a 256 x 128
    // wgmma-ws tile spilled).
    int thread = threadIdx.x;
    u64 out = reinterpret_cast<u64>(p.out);
    i64 ldo = p.ldo;
    asm volatile("" : "+r"(thread), "+l"(out), "+l"(ldo));
    const int col = (thread % kChunksPerRow) * 8, row0 = thread / kChunksPerRow;
    const bool col_in = n0 + col < p.n;
    const int rows_in = p.m - m0;  // tile rows inside M
    const bool vector = ((out | static_cast<u64>(ldo) * 2) & 15) == 0;
    const u32 src0 = tile_address + 2u * static_cast<u32>(row0 * kRowElems + col);
    char* const dst0 = reinterpret_cast<char*>(out) + 2 * (static_cast<i64>(m0 + row0) * ldo + n0 + col);
    const i64 dst_pass = 2 * static_cast<i64>(kRowsPerPass) * ldo;
#pragma unroll
    for (int pass0 = 0; pass0 < kPasses; pass0 += kBatch) {
      u32 v[kBatch][4];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row = row0 + (pass0 + b) * kRowsPerPass;
        if (pass0 + b < kPasses && (kTokens % kRowsPerPass == 0 || row < kTokens)) {
          memory::lds_128(v[b], src0 + 2u * static_cast<u32>((pass0 + b) * kRowsPerPass * kRowElems));
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int row = row0 + (pass0 + b) * kRowsPerPass;
        if (pass0 + b < kPasses && row < kTokens && row < rows_in && col_in) {
          store_chunk(dst0 + (pass0 + b) * dst_pass, v[b], vector);
        }
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
