#pragma once
// L2 prefetches of a tile's weights ahead of its loads: the packed codes, scales and zero points
// of an output tile's columns over the first K of the problem, one prefetch per 128-byte line,
// spread over a CTA's threads. For a persistent schedule (kernel/grouped_masked.cuh,
// grouped_contiguous.cuh) that knows a CTA's next tile while it runs the current one: the next
// tile's first stages then come from L2 rather than DRAM, so the DRAM latency leaves the chain of
// tiles that one CTA runs one after another. Prefetches are hints: no ordering, no effect on
// results, nothing read past the arrays (lines of columns >= N and of scale rows past K are not
// touched). SM80+ (prefetch.global.L2 exists earlier; the schedules that use it are SM80+).
//
// Layouts (humming_aot/packed_layout.py): the packed weight is (K / 16 rows, N / 64 units, 32
// lanes, bits words), a row of n * bits * 2 bytes; scales and zero points (K / group rows, N) of
// 2-byte values, permuted within each 64-column unit. A unit's part of a row is 128 * bits bytes
// of the packed weight and 128 bytes of a scale row: whole, aligned lines.

#include <humming_aot/kernel/params.cuh>

namespace humming_aot::memory {

__device__ __forceinline__ void prefetch_l2(const void* ptr) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr)); }

template <int kBlockN,   // the tile's columns: kBlockN / 64 packed units
          int kBits,     // weight code bits
          int kThreads>  // the CTA's threads, which share the prefetches
struct TileL2Prefetch {
  static constexpr int kUnits = kBlockN / 64;
  static constexpr int kWLinesPerRow = kUnits * kBits;  // lines of one 16-K row of the tile's codes
  static_assert(kBlockN % 64 == 0, "weights are packed in 64-column units");

  // Prefetches the tile of columns [n0, + kBlockN) over K [k_begin, + k_span) (both multiples
  // of 16, within p.k): its packed codes, its scale rows and (when present) zero-point rows.
  static __device__ __forceinline__ void issue(const kernel::GemmParams& p, int n0, int k_begin, int k_span) {
    const int units = p.n >> 6, unit0 = n0 >> 6;
    const int valid_units = units - unit0 < kUnits ? units - unit0 : kUnits;
    const u32 w_rows = static_cast<u32>(k_span) / 16;
    const u32 w_lines = w_rows * kWLinesPerRow;
    const i64 w_row_bytes = static_cast<i64>(p.n) * kBits * 2;
    const char* w =
        static_cast<const char*>(p.w) + (k_begin / 16) * w_row_bytes + static_cast<i64>(unit0) * 128 * kBits;
    // the scale rows the K range spans: from the group of k_begin to that of its last element
    const int first_row = k_begin / p.group_size, last_row = (k_begin + k_span - 1) / p.group_size;
    const u32 s_rows = k_span > 0 ? static_cast<u32>(last_row - first_row + 1) : 0u;
    const u32 s_lines = s_rows * kUnits;
    const i64 s_row_bytes = 2 * static_cast<i64>(p.n);
    const i64 s_offset = first_row * s_row_bytes + 2 * static_cast<i64>(n0);
    const u32 total = w_lines + (p.w_zero_point != nullptr ? 2 : 1) * s_lines;
    for (u32 i = threadIdx.x; i < total; i += kThreads) {
      if (i < w_lines) {
        const u32 row = i / kWLinesPerRow, line = i % kWLinesPerRow;
        if (static_cast<int>(line / kBits) < valid_units) prefetch_l2(w + row * w_row_bytes + 128 * line);
      } else {
        const u32 j = i - w_lines, table = j / s_lines, rest = j % s_lines;
        const u32 row = rest / kUnits, unit = rest % kUnits;
        const char* base = static_cast<const char*>(table == 0 ? p.w_scale : p.w_zero_point);
        if (static_cast<int>(unit) < valid_units) prefetch_l2(base + row * s_row_bytes + s_offset + 128 * unit);
      }
    }
  }
};

}  // namespace humming_aot::memory
