#pragma once
// MoE routing on the device: a stable counting sort of the M * top_k routed slots by expert, into
// the grouped layouts of humming_aot/moe/routing.py (grouped rows, block-aligned groups, vLLM's
// indexed layout), with no host round trip. Two kernels over the same grid of chunks: `count`
// takes each chunk's per-expert histogram (and fills every output with its padding value),
// `place` turns the histograms into run starts and writes each slot at its row; `single` does
// both in one CTA when the slots fit one chunk (up to 256 tokens of top-8), and MoeRouteSegments
// (below) does that with 1024 threads from 513 slots. Any arch from sm_75.
// Each expert's slots keep their flat order (stable), so the layout is a function of the routing
// alone; ids outside [0, E) are dropped (no row; row_of_slot -1).
// From sm_90 each kernel lets the next one launch as it starts and waits for the upstream grid
// before it touches memory (humming_aot.moe.cuda_steps launches them with PDL).

#include <humming_aot/numerics/types.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>

namespace humming_aot::helpers {

// Packed by humming_aot.moe.cuda_steps as "<19q" (152 bytes): every field 8 bytes, no padding.
struct RouteParams {
  const void* topk_ids;   // (slots,) int32 or int64 (the kernel's Id), the flat top-k ids
  i64 slots;              // M * top_k
  i64 experts;            // E, at most MoeRoute::kMaxExperts
  i64 block;              // every expert's run padded to a multiple of `block` rows (1: none)
  i64 chunks;             // gridDim.x of both kernels: ceil(slots / kChunk), at least 1
  int* counts;            // (chunks, E) int32 workspace: written by count, read by place
  i64 rows;               // length of the row arrays: slots + E * (block - 1)
  i64 pad_slot;           // slot value of a padding row (-1, or M * top_k for vLLM's layout)
  i64* slot_of_row64;     // (rows,) or nullptr: the flat slot of each row
  int* slot_of_row32;     // (rows,) or nullptr: the same, int32
  int* row_expert;        // (rows,) or nullptr: the expert of each row, -1 for padding
  int* row_of_slot;       // (slots,) or nullptr: the row of each slot, -1 for a dropped slot
  i64* offsets64;         // (E + 1,) or nullptr: each expert's first row, then the padded total
  int* offsets32;         // (E + 1,) or nullptr: the same, int32
  int* block_expert;      // (block_expert_len,) or nullptr: the expert of each block of `block`
                          // rows (through expert_map), -1 for blocks past the padded total
  i64 block_expert_len;   //
  const int* expert_map;  // (E,) or nullptr: global expert -> the id block_expert holds
  int* total;             // (1,) or nullptr: the padded total of rows
  i64 reserved;           // 0
};
static_assert(sizeof(RouteParams) == 152, "RouteParams must match the Python struct format <19q");

template <class Id>  // int or i64: the dtype of topk_ids
struct MoeRoute {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kChunk = 2048;                // slots per CTA, placed kThreads at a time
  static constexpr int kRounds = kChunk / kThreads;  // slots per thread
  static constexpr int kMaxExperts = 1024;
  static_assert(kChunk % kThreads == 0, "a chunk is whole rounds of one slot per thread");

  // Dynamic shared memory (bytes), computed by humming_aot.moe.cuda_steps: `count` takes E ints
  // (the histogram); `place` and `single` (kWarps + 1) * E + kWarps ints (see place_slots).

  // This thread's expert of each round of CTA `chunk`'s slots (-1: past the end, or dropped),
  // loaded before any is used so that the loads overlap.
  static __device__ __forceinline__ void load_chunk(const RouteParams& p, i64 chunk, int (&experts)[kRounds]) {
    const Id* ids = static_cast<const Id*>(p.topk_ids);
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const i64 slot = chunk * kChunk + r * kThreads + threadIdx.x;
      const i64 id = slot < p.slots ? static_cast<i64>(ids[slot]) : -1;
      experts[r] = (id >= 0 && id < p.experts) ? static_cast<int>(id) : -1;
    }
  }

  // Every row of the row arrays (unless rows_too is false) and every block expert set to its
  // padding value, by `threads` threads starting at `first` (the place step overwrites the real
  // rows after a barrier).
  static __device__ void fill_padding(const RouteParams& p, i64 first, i64 threads, bool rows_too = true) {
    if (rows_too) {
      for (i64 i = first; i < p.rows; i += threads) {
        if (p.slot_of_row64 != nullptr) p.slot_of_row64[i] = p.pad_slot;
        if (p.slot_of_row32 != nullptr) p.slot_of_row32[i] = static_cast<int>(p.pad_slot);
        if (p.row_expert != nullptr) p.row_expert[i] = -1;
      }
    }
    if (p.block_expert != nullptr) {
      for (i64 i = first; i < p.block_expert_len; i += threads) p.block_expert[i] = -1;
    }
  }

  // Grid (chunks), before place: chunk c's histogram into counts[c]; the padding fill, spread
  // over the grid.
  static __device__ void count(const RouteParams& p) {
    schedule::release_then_wait_for_upstream();
    extern __shared__ int histogram[];  // (E,)
    int experts[kRounds];
    load_chunk(p, blockIdx.x, experts);
    for (i64 e = threadIdx.x; e < p.experts; e += kThreads) histogram[e] = 0;
    fill_padding(p, blockIdx.x * static_cast<i64>(kThreads) + threadIdx.x, static_cast<i64>(gridDim.x) * kThreads);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      if (experts[r] >= 0) atomicAdd(&histogram[experts[r]], 1);
    }
    __syncthreads();
    for (i64 e = threadIdx.x; e < p.experts; e += kThreads) p.counts[blockIdx.x * p.experts + e] = histogram[e];
  }

  // The lanes of this warp whose expert equals e (e = -1 included): one ballot per bit of e + 1.
  // With ~30 distinct experts in a warp __match_any_sync costs more (measured: 9.9 -> 8.7 us for
  // 2048 slots of 256 experts; docs/performance/log.md section 28).
  static __device__ __forceinline__ u32 same_expert_lanes(int e, i64 experts) {
    const u32 key = static_cast<u32>(e + 1);  // 0 .. E
    u32 peers = 0xffffffffu;
    for (u32 bit = 1; bit <= static_cast<u32>(experts); bit <<= 1) {  // every bit a key may have
      const u32 ones = __ballot_sync(0xffffffffu, (key & bit) != 0);
      peers &= (key & bit) ? ones : ~ones;
    }
    return peers;
  }

  // Exclusive prefix sum of one int per thread over the CTA; `sums` holds kWarps ints.
  static __device__ __forceinline__ int exclusive_scan(int value, int* sums) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int inclusive = value;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    if (lane == 31) sums[warp] = inclusive;
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; ++w) before += sums[w];
    __syncthreads();  // sums may be reused once every thread has read it
    return before + inclusive - value;
  }

  // Grid (chunks), after count: this chunk's slots placed, with each expert's totals and its
  // slots in earlier chunks from every chunk's histogram.
  static __device__ void place(const RouteParams& p) {
    schedule::release_then_wait_for_upstream();
    int experts[kRounds];
    load_chunk(p, blockIdx.x, experts);
    place_slots<false>(p, experts);
  }

  // Grid (1), when every slot fits one chunk: count and place in one CTA, no workspace.
  static __device__ void single(const RouteParams& p) {
    schedule::release_then_wait_for_upstream();
    extern __shared__ int shared[];
    int* histogram = shared + kWarps * p.experts;  // place_slots's next_row, where it expects the totals
    int experts[kRounds];
    load_chunk(p, 0, experts);
    for (i64 e = threadIdx.x; e < p.experts; e += kThreads) histogram[e] = 0;
    fill_padding(p, threadIdx.x, kThreads);
    __syncthreads();  // the padding is written before any real row, the histogram zeroed
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      if (experts[r] >= 0) atomicAdd(&histogram[experts[r]], 1);
    }
    __syncthreads();
    place_slots<true>(p, experts);
  }

  // Every expert's padded run start (CTA 0 writes the offsets, the block experts and the
  // total), then this chunk's slots at start + (the expert's slots in earlier chunks) + (its
  // earlier slots in this chunk: in earlier rounds, then earlier warps and lanes of its round).
  // kTotalsInShared: the totals are already in next_row (single), else they come from p.counts.
  template <bool kTotalsInShared>
  static __device__ void place_slots(const RouteParams& p, const int (&slot_expert)[kRounds]) {
    extern __shared__ int shared[];
    const int experts = static_cast<int>(p.experts);
    int* table = shared;                        // (kWarps, E): slots of expert e in warp w, this round
    int* next_row = shared + kWarps * experts;  // (E,): the row of expert e's next slot in this chunk
    int* sums = next_row + experts;             // (kWarps,)
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int block = static_cast<int>(p.block);

    // 1. Each thread owns `per` consecutive experts: their totals, padded, scanned over the CTA.
    const int per = (experts + kThreads - 1) / kThreads;
    const int first = threadIdx.x * per;
    int padded_sum = 0;
    for (int i = 0; i < per; ++i) {
      const int e = first + i;
      if (e >= experts) break;
      int total = 0, earlier = 0;
      if constexpr (kTotalsInShared) {
        total = next_row[e];
      } else {
        for (i64 c = 0; c < p.chunks; ++c) {
          const int n = p.counts[c * experts + e];
          total += n;
          earlier += c < blockIdx.x ? n : 0;
        }
      }
      table[e] = earlier;  // parked in row 0 of the table until the rounds below
      next_row[e] = (total + block - 1) / block * block;
      padded_sum += next_row[e];
    }
    int start = exclusive_scan(padded_sum, sums);
    for (int i = 0; i < per; ++i) {
      const int e = first + i;
      if (e >= experts) break;
      const int padded = next_row[e];
      if (blockIdx.x == 0) {
        if (p.offsets64 != nullptr) p.offsets64[e] = start;
        if (p.offsets32 != nullptr) p.offsets32[e] = start;
        if (p.block_expert != nullptr) {
          const int id = p.expert_map != nullptr ? p.expert_map[e] : e;
          for (int b = start / block; b < (start + padded) / block; ++b) p.block_expert[b] = id;
        }
      }
      next_row[e] = start + table[e];
      start += padded;
    }
    if (blockIdx.x == 0 && threadIdx.x == kThreads - 1) {  // the last thread's `start` is the total
      if (p.offsets64 != nullptr) p.offsets64[experts] = start;
      if (p.offsets32 != nullptr) p.offsets32[experts] = start;
      if (p.total != nullptr) p.total[0] = start;
    }
    __syncthreads();

    // 2. Rounds of one slot per thread. Within a round, a slot's rank among its expert's is the
    // count in earlier warps (the table) plus the earlier lanes of its warp (same_expert_lanes).
#pragma unroll 1
    for (int round = 0; round < kRounds; ++round) {
      const i64 round_begin = blockIdx.x * static_cast<i64>(kChunk) + round * kThreads;
      if (round_begin >= p.slots) break;  // the same for every thread of the CTA
      const i64 slot = round_begin + threadIdx.x;
      int e = -1;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) e = r == round ? slot_expert[r] : e;  // registers, no local memory
      if (slot < p.slots && e < 0 && p.row_of_slot != nullptr) p.row_of_slot[slot] = -1;
      const u32 peers = same_expert_lanes(e, p.experts);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      if (e >= 0) {
        for (int w = 0; w < kWarps; ++w) table[w * experts + e] = 0;  // only e's column is read
      }
      __syncthreads();
      if (e >= 0 && rank == 0) table[warp * experts + e] = __popc(peers);
      __syncthreads();
      int before = 0, all = 0;
      if (e >= 0) {
        for (int w = 0; w < kWarps; ++w) {
          const int n = table[w * experts + e];
          before += w < warp ? n : 0;
          all += n;
        }
        const int row = next_row[e] + before + rank;
        if (p.slot_of_row64 != nullptr) p.slot_of_row64[row] = slot;
        if (p.slot_of_row32 != nullptr) p.slot_of_row32[row] = static_cast<int>(slot);
        if (p.row_expert != nullptr) p.row_expert[row] = e;
        if (p.row_of_slot != nullptr) p.row_of_slot[slot] = row;
      }
      __syncthreads();                                             // every thread has read next_row and the table
      if (e >= 0 && rank == 0 && before == 0) next_row[e] += all;  // e's first slot of the round
      __syncthreads();
    }
  }
};

// The routing of up to kMaxSlots slots of at most kMaxExperts experts in one CTA of 1024 threads
// and one launch (the `segments` kernel; humming_aot.moe.cuda_steps takes it from 513 slots up to
// kMaxSlots, where MoeRoute::single runs eight rounds of CTA barriers). Each warp ranks a
// contiguous segment of kPerLane x 32 slots by itself (warp-synchronous steps of 32 slots: a
// slot's rank is its expert's count so far in the warp's segment plus its earlier lanes), then
// the warps' counts become each expert's prefix over the warps, the experts' padded totals their
// run starts, and every slot is written at start + prefix + rank: the same layout as MoeRoute
// (stable: segments in warp order, steps and lanes in slot order). When the rows fit
// kMaxStagedRows, the rows are laid out in shared memory (over the table, once read) and the row
// arrays written from there in row order: one SM's scattered 4-byte global stores, a 32-sector
// request each, were what grew with the slots (log section 75).
template <class Id>  // int or i64: the dtype of topk_ids
struct MoeRouteSegments {
  static constexpr int kThreads = 1024;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kPerLane = 2;  // slots per lane (segments of 64 slots)
  static constexpr int kMaxSlots = kThreads * kPerLane;
  static constexpr int kMaxExperts = 256;  // the table fits 48 KB of shared memory
  using Route = MoeRoute<Id>;

  // Rows up to this many are staged in shared memory (48 KB: no opt-in on any arch).
  static constexpr int kMaxStagedRows = 12288;

  // Dynamic shared memory (ints), computed by humming_aot.moe.cuda_steps (segments_shared_ints):
  // (kWarps + 1) * E + kWarps + 1 ints: the (kWarps, E) table of counts, then prefixes; the E run
  // starts; the scan's kWarps sums; the padded total. Where p.rows <= kMaxStagedRows, at least
  // p.rows ints: the staged rows, laid over the others once they are read.

  // The inclusive prefix sum of one int per lane over the warp.
  static __device__ __forceinline__ int warp_scan(int value, int lane) {
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(0xffffffffu, value, offset);
      if (lane >= offset) value += other;
    }
    return value;
  }

  // Exclusive prefix sum of one int per thread over the CTA; `sums` holds kWarps (= 32) ints.
  // Warp 0 scans the warps' sums, so that no thread reads all 32 of them (the whole CTA runs on
  // one SM, whose issue slots bound this kernel).
  static __device__ __forceinline__ int exclusive_scan(int value, int* sums) {
    static_assert(kWarps == 32, "warp 0 scans one sum per lane");
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int inclusive = warp_scan(value, lane);
    if (lane == 31) sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      const int total = sums[lane];
      sums[lane] = warp_scan(total, lane) - total;  // the warps before warp `lane`
    }
    __syncthreads();
    return sums[warp] + inclusive - value;
  }

  // Grid (1), slots <= kMaxSlots, experts <= kMaxExperts.
  static __device__ void segments(const RouteParams& p) {
    schedule::release_then_wait_for_upstream();
    extern __shared__ int shared[];
    const int experts = static_cast<int>(p.experts);
    int* table = shared;                     // (kWarps, E): warp w's slots of expert e, then the prefix
    int* start = shared + kWarps * experts;  // (E,): expert e's total, then its run start
    int* sums = start + experts;             // (kWarps,)
    int* total_rows = sums + kWarps;         // (1,): the padded total
    const bool staged = p.rows <= kMaxStagedRows;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const Id* ids = static_cast<const Id*>(p.topk_ids);

    int e[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {  // slot warp * 64 + 32 j + lane: loads before any use
      const i64 slot = (warp * kPerLane + j) * 32 + lane;
      const i64 id = slot < p.slots ? static_cast<i64>(ids[slot]) : -1;
      e[j] = (id >= 0 && id < p.experts) ? static_cast<int>(id) : -1;
    }
    for (int i = threadIdx.x; i < kWarps * experts; i += kThreads) table[i] = 0;
    Route::fill_padding(p, threadIdx.x, kThreads, !staged);
    __syncthreads();  // the table zeroed; the padding written before any real row

    // 1. Each warp's segment, 32 slots a step, on the warp's own row of the table.
    int rank[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const u32 peers = Route::same_expert_lanes(e[j], p.experts);
      const int below = __popc(peers & ((1u << lane) - 1u));
      const int base = e[j] >= 0 ? table[warp * experts + e[j]] : 0;
      __syncwarp();  // every lane has read its count before the first lane of each expert moves it
      if (e[j] >= 0 && below == 0) table[warp * experts + e[j]] = base + __popc(peers);
      __syncwarp();
      rank[j] = base + below;
    }
    __syncthreads();

    // 2. Per expert: its warps' counts -> their exclusive prefix, and its total.
    for (int x = threadIdx.x; x < experts; x += kThreads) {
      int run = 0;
#pragma unroll
      for (int w0 = 0; w0 < kWarps; w0 += 8) {  // 8 loads in flight at a time
        int n[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) n[i] = table[(w0 + i) * experts + x];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          table[(w0 + i) * experts + x] = run;
          run += n[i];
        }
      }
      start[x] = run;
    }

    // 3. The padded totals scanned over the experts (one per thread: experts <= kThreads); CTA 0
    // (the only one) writes the offsets, the block experts and the total.
    const int block = static_cast<int>(p.block);
    const int x = threadIdx.x;
    const int count = x < experts ? start[x] : 0;
    const int padded = (count + block - 1) / block * block;  // 0 past E
    const int first = exclusive_scan(padded, sums);
    if (x < experts) {
      start[x] = first;
      if (p.offsets64 != nullptr) p.offsets64[x] = first;
      if (p.offsets32 != nullptr) p.offsets32[x] = first;
      if (p.block_expert != nullptr) {
        const int id = p.expert_map != nullptr ? p.expert_map[x] : x;
        for (int b = first / block; b < (first + padded) / block; ++b) p.block_expert[b] = id;
      }
    }
    if (x == kThreads - 1) {  // the last thread's `first` is the total (threads past E add nothing)
      total_rows[0] = first;
      if (p.offsets64 != nullptr) p.offsets64[experts] = first;
      if (p.offsets32 != nullptr) p.offsets32[experts] = first;
      if (p.total != nullptr) p.total[0] = first;
    }
    __syncthreads();

    // 4. Every slot's row: its expert's start + its warp's prefix + its rank in the segment.
    int row[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int slot = (warp * kPerLane + j) * 32 + lane;
      row[j] = e[j] >= 0 ? start[e[j]] + table[warp * experts + e[j]] + rank[j] : -1;
      if (p.row_of_slot != nullptr && slot < p.slots) p.row_of_slot[slot] = row[j];
    }
    if (!staged) {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const i64 slot = (warp * kPerLane + j) * 32 + lane;
        if (e[j] < 0) continue;
        if (p.slot_of_row64 != nullptr) p.slot_of_row64[row[j]] = slot;
        if (p.slot_of_row32 != nullptr) p.slot_of_row32[row[j]] = static_cast<int>(slot);
        if (p.row_expert != nullptr) p.row_expert[row[j]] = e[j];
      }
      return;
    }

    // 5. Staged: each row as (expert << 16 | slot), -1 for padding, over the table (every thread
    // has read its rows' starts and prefixes), then the row arrays in row order.
    const int total = total_rows[0];
    __syncthreads();
    int* rows_of = shared;
    for (int r = first + count; r < first + padded; ++r) rows_of[r] = -1;  // x's padding rows (none past E)
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (e[j] >= 0) rows_of[row[j]] = e[j] << 16 | ((warp * kPerLane + j) * 32 + lane);
    }
    __syncthreads();
    const int rows = static_cast<int>(p.rows);
    for (int r = threadIdx.x; r < rows; r += kThreads) {
      const int packed = r < total ? rows_of[r] : -1;
      if (p.slot_of_row64 != nullptr) p.slot_of_row64[r] = packed < 0 ? p.pad_slot : packed & 0xffff;
      if (p.slot_of_row32 != nullptr) p.slot_of_row32[r] = packed < 0 ? static_cast<int>(p.pad_slot) : packed & 0xffff;
      if (p.row_expert != nullptr) p.row_expert[r] = packed < 0 ? -1 : packed >> 16;
    }
  }
};

}  // namespace humming_aot::helpers
