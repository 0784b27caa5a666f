#pragma once
// The grouped masked MoE GEMM (DeepGEMM's masked layout, DeepEP low-latency decode):
// out[e, m, n] = a[e, m, k] @ dequant(w[e])[n, k]^T (+ bias) for every expert e and its first
// expert_rows[e] rows of a slab of max_m; the rows past the count are neither read for any stored
// output nor written. A persistent schedule around a dense body, not a body of its own: the grid
// is at most the resident CTAs, and CTA c runs the tiles c, c + gridDim.x, ... of the real work,
// the dense tiles of expert 0's rows, then expert 1's, and so on (an expert of r rows has
// ceil(r / kBlockM) x n_tiles tiles: the dense raster of r rows is a bijection onto them). An
// empty expert costs no CTA: with 256 experts of which 8 hold a token, one CTA per tile of every
// slab would launch 32 times the CTAs that have work.
//
// The same schedule runs the grouped contiguous layout with no alignment (DeepGEMM's offsets
// form): rows grouped expert after expert in one (m, K) activation, expert e owning rows
// [row_offsets[e], row_offsets[e + 1]) (each offset clamped to [0, m], so that no expert's rows
// leave the tensors), its "slab" then starting at its first row. Its tiles are the dense tiles of
// those rows, so an expert's last tile ends at its last row and no row needs padding; rows of no
// expert are neither read nor written. The offsets must rise (the caller's contract, not checked):
// offsets that do not rise make experts overlap, whose rows are then computed twice or not at all
// (the walk finds no tile past the bound of tile_limit, nor one that wrapped the 32-bit tile
// counts); no row outside the tensors and no split-K counter past the bound is touched.
//
// Each CTA waits on the upstream grid (the counts may be its output), writes the experts' first
// tiles and rows into a table in shared memory after the body's (ExpertWalk::build, up to 256
// experts; above that every find walks the counts), then finds each tile's expert in it (every
// warp the same), one tile ahead: while it runs a tile, the
// next one's weights are on their way into L2 (Dense::prefetch_tile), so that the tiles of one CTA
// (a few dozen of short K at decode sizes) do not each wait on DRAM for their first stages. Each
// tile runs the dense body on a copy of GemmParams whose pointers are moved to the expert's slab,
// whose M is the count and whose global scale is the expert's. A count outside [0, max_m] is read
// as the nearest bound. K slices (gridDim.y = gemm.k_splits, the offsets form only): every CTA
// (x, y) walks the tiles of column x with slice y, and the dense body reduces a tile's slices
// through the workspace; an expert's partials lie at workspace + k_splits x first row x N floats
// (the experts' row ranges are disjoint, so are their (k_splits, rows, N) blocks: k_splits x R x
// N floats in all) and its tiles' counters at tile_counters + the walk's index of its first tile
// (as many counters as tiles, zero between launches: the last slice of a tile resets its own).
// Preconditions (the host checks them): gemm.k_splits == 1 for slabs; a body with
// run_tile(GemmParams, tile, at_epilogue) and prefetch_tile(GemmParams, tile) (the mma.sync
// bodies). SM80+.

#include <humming_aot/kernel/params.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::kernel {

// Where a persistent CTA's tile lies among the experts' tiles. Once per CTA, one warp writes a
// table into shared memory (build): the first tile of each of up to 256 buckets of experts (one
// expert each for E <= 256, every model of the MoE benchmark; ceil(E / 256) consecutive experts
// each above that) and, one expert per bucket, its rows. find(tile) is then two shared loads and
// two ballots over the table (the group of 8 buckets that holds the tile, then the bucket within
// it); a bucket of several experts is then walked expert by expert (one count per step). find is
// uniform over the warp that calls it, and every warp of the CTA finds the same tile: the
// schedule keeps the next tile's three values, no other state. An expert's rows are its count
// clamped to [0, max_rows]; with offsets, from its first row (offsets[e] clamped to [0, max_rows])
// to offsets[e + 1] clamped to [that, max_rows], so that no expert's rows leave the activation and
// output, whatever the offsets hold.
template <int kBlockM,       // the tile's rows
          int kTableOffset>  // the table's byte offset in the dynamic shared memory
struct ExpertWalk {
  static constexpr int kPerLane = 8;
  static constexpr u32 kBuckets = 32 * kPerLane;
  // The table: the first tile of each bucket and, at index `buckets`, the tiles of all experts
  // (starts saturated at tile_limit() + 1), then at kBuckets + 1 each bucket's rows (one expert
  // per bucket only), then at kHeader the buckets, the experts per bucket and tile_limit().
  static constexpr int kHeader = 2 * kBuckets + 1;
  static constexpr int kTableBytes = (kHeader + 3) * 4;
  static_assert(kTableBytes % 16 == 0, "the table keeps the 16-byte alignment of what follows");

  const int* rows_of;  // the counts (slabs)
  const int* offsets;  // the prefix offsets of the rows (one activation), or nullptr (slabs)
  u32 experts, max_rows, n_tiles;

  // The table's words: at a fixed offset from the dynamic shared memory's base (an address the
  // compiler knows, not a pointer kept in registers across the tiles).
  static __device__ __forceinline__ u32* table() {
    extern __shared__ __align__(16) char walk_smem[];
    return reinterpret_cast<u32*>(walk_smem + kTableOffset);
  }

  // The tiles a walk may find: every tile with slabs; with offsets, the most that R rows make,
  // (R / kBlockM + min(E, R)) x n_tiles (rows summing to at most R, in at most min(E, R) experts
  // with rows, each with one partial tile at most), which the host sizes the split-K counters by:
  // offsets that do not rise (more rows in all) find no tile past it.
  __device__ __forceinline__ u32 tile_limit() const {
    if (offsets == nullptr) return 0xffffffffu;
    return (max_rows / kBlockM + (experts < max_rows ? experts : max_rows)) * n_tiles;
  }

  // v clamped to [lo, max_rows].
  __device__ __forceinline__ u32 clamp_rows(int v, u32 lo) const {
    return v <= static_cast<int>(lo) ? lo : (static_cast<u32>(v) < max_rows ? static_cast<u32>(v) : max_rows);
  }

  // Expert e's first row: 0 in its slab; with offsets, offsets[e] clamped to [0, max_rows].
  __device__ __forceinline__ u32 first_row(u32 e) const { return offsets == nullptr ? 0u : clamp_rows(offsets[e], 0); }

  // Expert e's rows (e < experts).
  __device__ __forceinline__ u32 rows(u32 e) const {
    if (offsets == nullptr) return clamp_rows(rows_of[e], 0);
    const u32 lo = first_row(e);
    return clamp_rows(offsets[e + 1], lo) - lo;
  }

  __device__ __forceinline__ u32 tiles(u32 r) const { return (r + kBlockM - 1) / kBlockM * n_tiles; }

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
        counts[i] = e < experts && j < per ? rows(e) : 0u;
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
    u32 start = inclusive - sum;  // (a saturated scan only overstates starts past the cap)
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

template <class Dense,  // the dense body: run_tile(const GemmParams&, tile, at_epilogue), prefetch_tile
          int kBlockM,  // its tile's rows (tokens)
          int kBlockN>  // its tile's columns (weight channels)
struct GroupedMasked {
  static constexpr int kThreads = Dense::kThreads;
  using Walk = ExpertWalk<kBlockM, Dense::kSmemBytes>;
  // the body's, then the walk's table (bodies/base.py MOE_WALK_TABLE_BYTES)
  static constexpr int kSmemBytes = Dense::kSmemBytes + Walk::kTableBytes;
  static constexpr int kMinBlocksPerSm = Dense::kMinBlocksPerSm;
  static constexpr bool kScalesInFp32 = Dense::kScalesInFp32;
  static_assert(Dense::kSmemBytes % 16 == 0, "the table starts on a 16-byte boundary after the body's");

  static __device__ __forceinline__ void run(const MaskedGemmParams& g) {
    schedule::wait_for_upstream_grid();  // the counts (and the activations) may come from the previous kernel
    const Walk walk{g.expert_rows, g.row_offsets, static_cast<u32>(g.experts), static_cast<u32>(g.gemm.m),
                    (static_cast<u32>(g.gemm.n) + kBlockN - 1) / kBlockN};
    if (threadIdx.x < 32) walk.build();
    __syncthreads();  // the table written before any warp's find
    u32 expert, rows, local;
    if (!walk.find(blockIdx.x, expert, rows, local)) {
      schedule::release_dependent_grid();  // no tile for this CTA
      return;
    }
    for (u32 tile = blockIdx.x;; tile += gridDim.x) {
      // the CTA's next tile, found before this one runs: its weights are prefetched into L2 now,
      // and this tile's epilogue lets the next kernel in when there is none
      u32 next_expert, next_rows, next_local;
      const bool more = walk.find(tile + gridDim.x, next_expert, next_rows, next_local);
      if (more) {
        GemmParams next = g.gemm;
        next.m = static_cast<int>(next_rows);
        g.weights.move_to(next, static_cast<int>(next_expert));
        Dense::prefetch_tile(next, next_local);
      }
      GemmParams p = g.gemm;
      p.m = static_cast<int>(rows);
      const i64 first = walk.first_row(expert);  // the expert's rows in its slab, or among all rows
      p.a = static_cast<const char*>(p.a) + expert * g.a_stride + first * p.lda * 2;
      p.out = static_cast<char*>(p.out) + expert * g.out_stride + first * p.ldo * 2;
      g.weights.move_to(p, static_cast<int>(expert));
      if (p.k_splits > 1) {  // (the offsets form) the expert's own partials and counters
        p.workspace += first * p.k_splits * p.n;
        p.tile_counters += tile - local;
      }
      Dense::run_tile(p, local, [more] {
        if (!more) schedule::release_dependent_grid();
      });
      if (!more) return;
      expert = next_expert;
      rows = next_rows;
      local = next_local;
      __syncthreads();  // the last tile's warps are done with the shared memory the next one refills
    }
  }
};

}  // namespace humming_aot::kernel
