#pragma once
// The K loop of the mma.sync body's tiles of 16 rows and more, and its epilogue wiring: one
// cp.async pipeline shared by the CTA (a barrier per stage), each warp dequantizing its unit's
// weights in registers right before the mma. SM80+ (SM75: synchronous copies, m16n8k8 pairs).
// Invariants: whole m16 fragments per warp, one 64-column unit per warp along N.

#include <humming_aot/epilogue/k_warp_reduction.cuh>
#include <humming_aot/epilogue/output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/memory/stage_loader.cuh>
#include <humming_aot/mma/mma_sync.cuh>
#include <humming_aot/numerics/weight_codes.cuh>

namespace humming_aot::mainloop {

// kWarpsM x kWarpsN x kWarpsK warps; each warp owns kBlockM / kWarpsM rows, one packed 64-column
// unit and a contiguous run of kBlockK / 16 / kWarpsK of a stage's 16-wide K steps (its scales are
// read once per group it meets, so once per stage when the group spans the run). The warps share
// the stages: their operands overlap too much for a pipeline per warp to pay.
template <class Act,      // Float16 or BFloat16: activation, scale and output dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,               // output rows per CTA: 16 * kWarpsM * m16 tiles per warp
          int kBlockN,               // output columns per CTA (64 per warp along N)
          int kBlockK,               // K per pipeline stage: 64, 128, 256 or 512
          int kWarpsM, int kWarpsN,  // warp grid of the CTA over the output tile
          int kWarpsK,               // warps sharing each stage's K steps (1, 2 or 4)
          int kStages>               // cp.async pipeline depth
struct CtaPipeline {
  static constexpr int kBits = Weights::kBits;  // weight code bits: 1 to 8
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN * kWarpsK;
  static constexpr int kWarpRows = kBlockM / kWarpsM;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 fragments per warp
  static constexpr int kNTiles = 8;               // accumulator fragments per m16
  static constexpr int kUnits = kBlockN / 64;     // packed 64-column units per CTA
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;
  static constexpr int kWordsPerLane = kBits;  // stored words per (16-row K step, unit, lane)

  static_assert(kBlockM % (16 * kWarpsM) == 0, "each warp needs whole m16 fragments");
  static_assert(kBlockN == 64 * kWarpsN, "one packed 64-column unit per warp along N");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(kK16Steps % kWarpsK == 0, "the K steps of a stage split evenly over the K warps");
  static_assert(kThreads <= 1024, "too many warps");

  static constexpr int kSteps = kK16Steps / kWarpsK;  // K steps per warp per stage
  using Walk = memory::GroupWalk<kBlockK>;
  // a stage (memory/stage_loader.cuh has the layout)
  using Layout = memory::StageLayout<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint>;
  using StageLoader = memory::StageLoader<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint, kThreads>;
  static constexpr int kABytes = Layout::kABytes;
  static constexpr int kWBytes = Layout::kWBytes;
  static constexpr int kSBytes = Layout::kSBytes;
  static constexpr int kStageBytes = Layout::kBytes;
  // warps_k > 1: every K warp parks its accumulators after the K loop, then sums and writes its
  // share of the fragments (n8 fragments of 8 columns each)
  using Reduction = epilogue::KWarpReduction<kWarpsM, kWarpsN, kWarpsK, kMTiles, kNTiles>;
  static constexpr int kShareTiles = Reduction::kShareTiles;
  static constexpr int kTileColumns = 8;
  static constexpr int kPipelineBytes =
      kStages * kStageBytes > Reduction::kBytes ? kStages * kStageBytes : Reduction::kBytes;
  static constexpr int kSmemBytes = kPipelineBytes;
  // the weights are scaled in the activation dtype before the mma: the 16-row tile has no
  // registers for fp32 partial sums per scale group (two CTAs per SM need <= 128)
  static constexpr bool kScalesInFp32 = false;

  using Dequantizer = typename Weights::template Dequantizer<Act, kZeroPoint>;
  using Codes = numerics::PackedCodes<kBits>;
  using Writer = epilogue::OutputWriter<Act, kMTiles, kNTiles>;
  using ShareWriter = epilogue::OutputWriter<Act, kMTiles, kShareTiles>;

  // Everything a warp reads from shared memory for one 16-row K step.
  struct StepFragments {
    u32 a[kMTiles][4];     // m16k16 activation fragments
    u32 w[kWordsPerLane];  // the lane's stored weight words of the warp's unit
  };

  using Pairs = typename Dequantizer::Pairs;
  using Accumulators = float[kMTiles][kNTiles][4];
  // Small-M tiles are bound by the dequant and get the once-per-stage scale path; large warp
  // tiles amortize the dequant over many mma and would only pay for it in registers.
  static constexpr bool kHoistScales = kMTiles <= 2;

  // This thread's shared-memory offsets inside a stage, computed once per CTA so that a stage
  // only adds its base: the K steps kk = warp_k * kSteps + i it multiplies (i < kSteps).
  struct StepOffsets {
    u32 a[kSteps][kMTiles];  // ldmatrix row address of each m16 fragment
    u32 w[kSteps];           // the lane's packed words of the warp's unit
    u32 s[kSteps];           // the lane's scale pairs (scale row of the step); zero points at + kSBytes

    StepOffsets() = default;
    __device__ __forceinline__ StepOffsets(int warp_m, int warp_n, int warp_k, const Walk& walk) {
      const int lane = threadIdx.x & 31, step_shift = walk.step_shift;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        const int kk = warp_k * kSteps + i;
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) {
          const int row = warp_m * kWarpRows + mi * 16 + (lane & 15);
          a[i][mi] = Layout::a_chunk_offset(row, 2 * kk + (lane >> 4));
        }
        w[i] = kABytes + 4 * (((kk * kUnits + warp_n) * 32 + lane) * kWordsPerLane);
        s[i] = kABytes + kWBytes + 2 * ((kk >> step_shift) * kBlockN + warp_n * 64 + (lane >> 2) * 8);
        // opaque to the compiler, which would otherwise recompute them from threadIdx every stage
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) asm volatile("" : "+r"(a[i][mi]));
        asm volatile("" : "+r"(w[i]), "+r"(s[i]));
      }
    }
  };

  // The scale (and zero-point) pairs of the warp's 4 tiles at `addr` (a staged scale row).
  static __device__ __forceinline__ void load_pairs(u32 addr, Pairs (&pairs)[4]) {
    u32 scale[4], zero[4] = {0u, 0u, 0u, 0u};
    memory::lds_128(scale, addr);
    if constexpr (kHasZeroPoint) memory::lds_128(zero, addr + kSBytes);
#pragma unroll
    for (int j = 0; j < 4; ++j) pairs[j] = Dequantizer::prepare(scale[j], zero[j]);
  }

  // The activation fragments and packed weight words of the warp's step i.
  static __device__ __forceinline__ void load_step(u32 stage_smem, const StepOffsets& off, int i, StepFragments& f) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) memory::ldmatrix_x4(f.a[mi], stage_smem + off.a[i][mi]);
    memory::lds_words(f.w, stage_smem + off.w[i]);
  }

  static __device__ __forceinline__ void multiply_step(const StepFragments& f, const Pairs (&pairs)[4],
                                                       Accumulators& acc) {
    u32 padded[Codes::kPaddedWords];
    Codes::unfold(f.w, padded);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u32 tile_words[Dequantizer::kWordsPerTile];
      numerics::copy_tile_words(padded, j, tile_words);
      u32 b_frag[2][2];
      Dequantizer::apply(tile_words, pairs[j], b_frag);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) mma::mma_m16n8k16<Act>(acc[mi][2 * j + h], f.a[mi], b_frag[h]);
      }
    }
  }

  // Multiply this warp's K steps of one staged K tile into its accumulators; the shared-memory
  // reads of the next step are issued before the dequant and mma of the current one (register
  // double buffering). kOneScaleRow: every step of this warp uses the same scale row (its run of
  // steps lies inside one group), so its pairs are loaded and broadcast once per stage. Otherwise
  // a new row starts every row_steps_mask + 1 steps of the warp's run (a power of two that divides
  // the run, whose start is a multiple of its length), and the pairs are reloaded only then.
  template <bool kOneScaleRow>
  static __device__ __forceinline__ void compute_stage(u32 stage_smem, const StepOffsets& off, int row_steps_mask,
                                                       Accumulators& acc) {
    Pairs pairs[4];
    if constexpr (kOneScaleRow) load_pairs(stage_smem + off.s[0], pairs);
    StepFragments frags[2];
    load_step(stage_smem, off, 0, frags[0]);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (i + 1 < kSteps) load_step(stage_smem, off, i + 1, frags[(i + 1) & 1]);
      if constexpr (!kOneScaleRow) {
        if ((i & row_steps_mask) == 0) load_pairs(stage_smem + off.s[i], pairs);
      }
      multiply_step(frags[i & 1], pairs, acc);
    }
  }

  // nothing to set up before the loader: the writers read the parameters
  __device__ __forceinline__ CtaPipeline(const kernel::GemmParams&, u32, int) {}

  // Multiplies the CTA's K tiles [k_tile_begin, + count) of its output tile (m0, n0) and writes
  // this warp's part of it: its share of the K warps' sum, or all of its fragments. loop_done()
  // runs once the K loop has issued its last mma. The loop and the writes stay in one function:
  // split, ptxas allocates other registers.
  template <class LoopDone>
  __device__ __forceinline__ void run(const kernel::GemmParams& p, char* smem, u32 smem_base, int m0, int n0,
                                      int k_tile_begin, int count, int tile_index, int* arrival_flag, int, int warp_mn,
                                      int warp_m, int warp_n, int warp_k, LoopDone&& loop_done) {
    const Walk walk(p.group_size);
    // Every warp's run of K steps [warp_k * kSteps, + kSteps) lies in one scale row: runs and
    // groups are powers of two steps long, so a run no longer than a group never straddles one
    // (a CTA-uniform test, which keeps the branch below uniform).
    static_assert((kSteps & (kSteps - 1)) == 0, "K steps per warp: a power of two");
    const bool one_scale_row = kSteps <= (1 << walk.step_shift);

    // The first stages' weights leave before this thread's shared-memory offsets are worked out
    // (the prologue's setup step), which only the first stage's compute needs.
    StageLoader loader(p, m0, n0, k_tile_begin);
    StepOffsets offsets;
    loader.template load_prologue<kStages - 1, kStageBytes>(
        p, smem_base, count, [&] { offsets = StepOffsets(warp_m, warp_n, warp_k, walk); });
    float acc[kMTiles][kNTiles][4];
    Writer::zero(acc);

    int compute_slot = 0, load_slot = kStages - 1;
    for (int it = 0; it < count; ++it) {
      memory::cp_async_wait<kStages - 2>();
      __syncthreads();  // stage `it` landed for every thread; stage `it - 1` is free to refill
      if (it + kStages - 1 < count) {
        loader.load(load_slot * kStageBytes);  // the loader's addresses hold smem_base
        loader.advance();
      }
      memory::cp_async_commit();
      const u32 stage_smem = smem_base + compute_slot * kStageBytes;
      if (kHoistScales && one_scale_row) {
        compute_stage<true>(stage_smem, offsets, 0, acc);
      } else {
        compute_stage<false>(stage_smem, offsets, (1 << walk.step_shift) - 1, acc);
      }
      compute_slot = compute_slot + 1 == kStages ? 0 : compute_slot + 1;
      load_slot = load_slot + 1 == kStages ? 0 : load_slot + 1;
    }
    loop_done();
    memory::cp_async_wait<0>();
    if constexpr (kWarpsK > 1) {
      float share[kMTiles][kShareTiles][4];
      Reduction::share_over_k_warps(smem, warp_mn, warp_k, acc, share);
      const int col0 = n0 + warp_n * 64 + kTileColumns * kShareTiles * warp_k;
      ShareWriter::write(p, share, m0 + warp_m * kWarpRows, col0, tile_index, arrival_flag);
    } else {
      Writer::write(p, acc, m0 + warp_m * kWarpRows, n0 + warp_n * 64, tile_index, arrival_flag);
    }
  }
};

}  // namespace humming_aot::mainloop
