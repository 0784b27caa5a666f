#pragma once
// ExpertTable: the walk over the experts' tiles of the grouped masked MoE schedule on the TMA body,
// as a table in shared memory (below). SM80+ (warp shuffles and ballots only).

#include <humming_aot/kernel/grouped_masked.cuh>

namespace humming_aot::schedule {

// Where a persistent CTA's tile lies among the experts' tiles, for the grouped masked schedule on
// the TMA body (kernel/grouped_masked_ws.cuh; the mma.sync schedule keeps kernel/grouped_masked.cuh's
// ExpertWalk, which needs no shared memory beside the body's). Once per CTA, one warp writes a
// table into shared memory (build): the first tile of each of up to 256 buckets of experts (one
// expert each for E <= 256, every model of the MoE benchmark; ceil(E / 256) consecutive experts
// each above that) and, one expert per bucket, its rows. find(tile) then reads the table's header,
// one start per lane for each of two ballots (the group of 8 buckets that holds the tile, then the
// bucket within it) and the bucket's start, end and rows; a bucket of several experts is walked
// expert by expert (one count per step). Tile counts saturate at 2^32 - 1 rather than wrap. find is
// uniform over the warp that calls it, and every warp of the CTA finds the same tile: the
// schedule keeps the next tile's three values, no other state. An expert's rows are its count
// clamped to [0, max_rows]; with offsets, from its first row (offsets[e] clamped to [0, max_rows])
// to offsets[e + 1] clamped to [that, max_rows], so that no expert's rows leave the activation and
// output, whatever the offsets hold.
template <int kBlockM,       // the tile's rows
          int kTableOffset>  // the table's byte offset in the dynamic shared memory
struct ExpertTable : kernel::ExpertWalk<kBlockM> {
  using Base = kernel::ExpertWalk<kBlockM>;
  static constexpr int kPerLane = Base::kPerLane;  // the buckets a lane builds and a group holds
  static constexpr u32 kBuckets = Base::kWindow;   // 32 x kPerLane
  // The table: the first tile of each bucket and, at index `buckets`, the tiles of all experts
  // (starts saturated at tile_limit() + 1), then at kBuckets + 1 each bucket's rows (one expert
  // per bucket only), then at kHeader the buckets, the experts per bucket and tile_limit().
  static constexpr int kHeader = 2 * kBuckets + 1;
  static constexpr int kTableBytes = (kHeader + 3) * 4;
  // K slices may meet at a tile's walk index (find's index: every index below the bound names one
  // tile)
  static constexpr bool kKSlices = true;
  static_assert(kTableBytes % 16 == 0, "the table keeps the 16-byte alignment of what follows");

  // (the counts, offsets, experts, max_rows, n_tiles, tile_limit, clamp_rows, first_row and tiles
  // of ExpertWalk, whose find this one replaces)
  using Base::clamp_rows, Base::first_row, Base::tile_limit, Base::tiles;
  using Base::experts, Base::offsets, Base::rows_of;

  // The table's words: at a fixed offset from the dynamic shared memory's base (an address the
  // compiler knows, not a pointer kept in registers across the tiles).
  static __device__ __forceinline__ u32* table() {
    extern __shared__ __align__(16) char walk_smem[];
    return reinterpret_cast<u32*>(walk_smem + kTableOffset);
  }

  // The walk over g's experts, n_tiles column tiles each (the table not yet built).
  static __device__ __forceinline__ ExpertTable over(const kernel::MaskedGemmParams& g, u32 n_tiles) {
    return ExpertTable{
        {g.expert_rows, g.row_offsets, static_cast<u32>(g.experts), static_cast<u32>(g.gemm.m), n_tiles}};
  }

  // The activation box's first row before the tile's m0, for expert `expert` whose rows start at
  // `first` (first_row): its slab's first row (the slabs end to end, gemm.m rows each), or `first`
  // with offsets.
  __device__ __forceinline__ i64 box_first(const kernel::MaskedGemmParams& g, u32 expert, i64 first) const {
    return g.row_offsets == nullptr ? expert * static_cast<u32>(g.gemm.m) : first;
  }

  // Expert e's rows (e < experts).
  __device__ __forceinline__ u32 rows(u32 e) const {
    if (offsets == nullptr) return clamp_rows(rows_of[e], 0);
    const u32 lo = first_row(e);
    return clamp_rows(offsets[e + 1], lo) - lo;
  }

  static __device__ __forceinline__ u32 saturating_add(u32 a, u32 b) { return a + b < a ? 0xffffffffu : a + b; }

  // Experts per bucket and the buckets: one expert each up to kBuckets experts.
  __device__ __forceinline__ u32 per_bucket() const {
    return experts <= kBuckets ? 1u : (experts + kBuckets - 1) / kBuckets;
  }

  // The table, by one whole warp (then a barrier before any find): each lane's 8 buckets' tiles
  // and rows, a warp scan of the tiles (saturating: offsets that do not rise may sum past 32 bits),
  // each start capped at tile_limit() + 1 (a bucket past the limit is found by no tile).
  __device__ __forceinline__ void build() const {
    const u32 lane = threadIdx.x & 31, base = lane * kPerLane, per = per_bucket();
    u32 counts[kPerLane], bucket_tiles[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) bucket_tiles[i] = 0;
    // expert j of each of the lane's buckets at a time (once with one expert per bucket): eight
    // loads in flight; the rows kept with one expert per bucket
    for (u32 j = 0; j < per; ++j) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const u32 e = (base + i) * per + j;
        counts[i] = e < experts ? rows(e) : 0u;
      }
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) bucket_tiles[i] = saturating_add(bucket_tiles[i], tiles(counts[i]));
    }
    u32 sum = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) sum = saturating_add(sum, bucket_tiles[i]);
    u32 inclusive = sum;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const u32 other = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= static_cast<u32>(offset)) inclusive = saturating_add(inclusive, other);
    }
    const u32 limit = tile_limit(), cap = limit == 0xffffffffu ? limit : limit + 1;
    const u32 buckets = (experts + per - 1) / per;
    // the lane's first tile: the previous lane's inclusive sum (not inclusive - sum, which a
    // saturated sum would understate), so that the starts rise across the lanes
    const u32 before = __shfl_up_sync(0xffffffffu, inclusive, 1);
    u32 start = lane == 0 ? 0u : before;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (base + i < buckets) {
        table()[base + i] = start < cap ? start : cap;
        table()[kBuckets + 1 + base + i] = counts[i];
      }
      start = saturating_add(start, bucket_tiles[i]);
    }
    if (lane == 31) {
      table()[buckets] = inclusive < cap ? inclusive : cap;  // the tiles of all experts
      table()[kHeader] = buckets;
      table()[kHeader + 1] = per;
      table()[kHeader + 2] = limit;
    }
  }

  // The expert, its rows and the tile's index among the expert's tiles of tile `tile`; false when
  // the experts hold fewer tiles, or the expert's tiles pass tile_limit(). Uniform over the warp.
  __device__ __forceinline__ bool find(u32 tile, u32& expert, u32& expert_rows, u32& local) const {
    // (read back from the table rather than kept in registers across the tiles)
    const u32 lane = threadIdx.x & 31, buckets = table()[kHeader], per = table()[kHeader + 1];
    const u32 limit = table()[kHeader + 2];
    if (tile >= limit || tile >= table()[buckets]) return false;
    // the group of 8 buckets that holds the tile: the last whose first bucket starts at or before
    // it (group 0 always does); then the buckets of that group that end at or before it
    const u32 group_first = lane * kPerLane;
    const u32 groups = __ballot_sync(0xffffffffu, group_first < buckets && table()[group_first] <= tile);
    const u32 first = static_cast<u32>(31 - __clz(groups)) * kPerLane, b = first + lane;
    const u32 ended = __ballot_sync(0xffffffffu, lane < kPerLane && b < buckets && table()[b + 1] <= tile);
    const u32 bucket = first + __popc(ended);
    u32 at = table()[bucket];
    if (per == 1) {
      if (table()[bucket + 1] > limit) return false;  // its tiles pass the limit
      expert = bucket;
      expert_rows = table()[kBuckets + 1 + bucket];
      local = tile - at;
      return true;
    }
    // a bucket of several experts: one after the other
    const u32 end = (bucket + 1) * per < experts ? (bucket + 1) * per : experts;
    for (u32 e = bucket * per; e < end; ++e) {
      const u32 r = rows(e), next = saturating_add(at, tiles(r));
      if (tile < next) {
        if (next > limit) return false;
        expert = e;
        expert_rows = r;
        local = tile - at;
        return true;
      }
      at = next;
    }
    return false;  // (only where the saturated tile counts overstate the bucket's tiles)
  }
};

}  // namespace humming_aot::schedule
