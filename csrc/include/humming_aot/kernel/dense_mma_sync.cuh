#pragma once
// The portable dense mixed-input GEMM body: out[m, n] = a[m, k] @ dequant(w)[n, k]^T (+ bias),
// 16-bit activations, integer or small-float weight codes with per-group scales (and integer
// zero points), a global fp32 scale, fp32 accumulation on mma.sync m16n8k16. SM80+. M, N, K
// and the group size are run-time values: N % 64 == 0, K % kBlockK == 0, group a multiple of 16
// that divides kBlockK or is a multiple of it (humming_aot.heuristics.tile_fits; a tile wider
// than 64 in K has a 64-wide twin for the rest).
//
// One CTA computes a kBlockM x kBlockN output tile over a slice of K. kWarpsM x kWarpsN x kWarpsK
// warps; each warp owns kBlockM / kWarpsM rows, one packed 64-column unit and a contiguous run of
// kBlockK / 16 / kWarpsK of a stage's 16-wide K steps (its scales are read once per group it
// meets, so once per stage when the group spans the run). A kStages-deep cp.async pipeline
// stages kBlockK-wide K tiles of activations (swizzled rows), packed weights, scales and zero
// points; each warp dequantizes its weights in registers right before the mma. Wider stages
// (128 to 512) cut the per-stage cost (barrier, copies, address updates) per weight, which is
// what small M, with 4 K warps, is bound by. The 8-row tile (M <= 8) runs one such pipeline per
// warp instead, over the warp's own part of each stage, with no CTA barrier (kWarpPipelines),
// in a K loop per compute path (warp_pipeline_loop).

#include <humming_aot/epilogue/output_writer.cuh>
#include <humming_aot/epilogue/swapped_output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/memory/stage_loader.cuh>
#include <humming_aot/mma/mma_sync.cuh>
#include <humming_aot/numerics/weight_codes.cuh>
#include <humming_aot/schedule/grid_dependency.cuh>
#include <humming_aot/schedule/tile_scheduler.cuh>

namespace humming_aot::kernel {

namespace detail {
template <bool kFirst, class First, class Second>
struct Select {
  using Type = First;
};
template <class First, class Second>
struct Select<false, First, Second> {
  using Type = Second;
};
}  // namespace detail

template <class Act,                       // Float16 or BFloat16: activation, scale and output dtype
          class Weights,                   // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,                     // output rows per CTA; 8: swapped operands (see below)
          int kBlockN,                     // output columns per CTA (64 per warp along N)
          int kBlockK,                     // K per pipeline stage: 64, 128, 256 or 512
          int kWarpsM, int kWarpsN,        // warp grid of the CTA over the output tile
          int kWarpsK,                     // warps sharing each stage's K steps (1, 2 or 4)
          int kStages>                     // cp.async pipeline depth
struct DenseMmaSync {
  static constexpr int kBits = Weights::kBits;  // weight code bits: 1 to 8
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN * kWarpsK;
  // Small-M tiles of 8 warps run two CTAs per SM (split-K sizes its slices for that): hold
  // ptxas to the 128 registers that allows (8-bit codes with 256-wide stages would take ~135).
  static constexpr int kMinBlocksPerSm = kThreads == 256 && kBlockM <= 16 ? 2 : 1;
  // kBlockM == 8 swaps the operands: the dequantized 16 x 16 weight tiles are the mma A operand
  // (the packed tile is exactly an A fragment) and the 8 tokens the n8 B operand, so a weight
  // tile costs one mma instead of two when M <= 8.
  static constexpr bool kSwapped = kBlockM == 8;
  static constexpr int kWarpRows = kBlockM / kWarpsM;
  static constexpr int kMTiles = kSwapped ? 1 : kWarpRows / 16;  // m16 fragments per warp
  static constexpr int kNTiles = kSwapped ? 4 : 8;  // accumulator fragments per m16 (swapped: per weight tile)
  static constexpr int kUnits = kBlockN / 64;         // packed 64-column units per CTA
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;
  static constexpr int kWordsPerLane = kBits;         // stored words per (16-row K step, unit, lane)

  static_assert(kBlockM % (16 * kWarpsM) == 0 || (kSwapped && kWarpsM == 1), "each warp needs whole m16 fragments");
  static_assert(kBlockN == 64 * kWarpsN, "one packed 64-column unit per warp along N");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(kK16Steps % kWarpsK == 0, "the K steps of a stage split evenly over the K warps");
  static_assert(kThreads <= 1024, "too many warps");

  static constexpr int kSteps = kK16Steps / kWarpsK;  // K steps per warp per stage

  // Pipeline stages (memory/stage_loader.cuh has the layout). The swapped tile (M <= 8) runs one
  // pipeline per warp: each warp copies what it multiplies (its run of the stage's K steps: the
  // activations, its unit's packed weights and scale rows) into a region of the stage that only
  // it reads, then waits for its own copies and syncs its own lanes: no CTA barrier per stage
  // behind the slowest warp. The activations of a run are copied once per warp along N. Larger
  // tiles share their stages: their warps' operands overlap much more.
  static constexpr bool kWarpPipelines = kSwapped;
  static constexpr int kWarps = kThreads / 32;
  using Walk = memory::GroupWalk<kBlockK>;
  // a stage, or with warp pipelines one warp's region of it
  using Layout = typename detail::Select<kWarpPipelines,
                                         memory::StageLayout<kBlockM, 64, kSteps * 16, kBits, kHasZeroPoint>,
                                         memory::StageLayout<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint>>::Type;
  using StageLoader =
      typename detail::Select<kWarpPipelines,
                              memory::StageLoader<kBlockM, 64, kSteps * 16, kBits, kHasZeroPoint, 32, kBlockK>,
                              memory::StageLoader<kBlockM, kBlockN, kBlockK, kBits, kHasZeroPoint, kThreads>>::Type;
  static constexpr int kABytes = Layout::kABytes;
  static constexpr int kWBytes = Layout::kWBytes;
  static constexpr int kSBytes = Layout::kSBytes;
  static constexpr int kStageBytes = kWarpPipelines ? kWarps * Layout::kBytes : Layout::kBytes;
  // warps_k > 1: every K warp parks its accumulators here after the K loop, then sums and
  // writes its share of the fragments
  static constexpr int kParkedWarps = kWarpsK == 1 ? 0 : kWarpsK;
  static constexpr int kReductionBytes = kParkedWarps * kWarpsM * kWarpsN * kMTiles * kNTiles * 4 * 32 * 4;
  // accumulator fragments of the warp tile each K warp sums and writes (kWarpsK > 1), and the
  // output columns one of them spans (an n8 fragment; swapped: a 16-channel weight tile)
  static constexpr int kShareTiles = kNTiles / kWarpsK;
  static constexpr int kTileColumns = kSwapped ? 16 : 8;
  static_assert(kNTiles % kWarpsK == 0, "the K warps share the fragments evenly");
  static constexpr int kPipelineBytes = kStages * kStageBytes > kReductionBytes ? kStages * kStageBytes : kReductionBytes;

  using H2 = numerics::PackedHalf2<Act>;
  using Dequantizer = typename Weights::template Dequantizer<Act, kZeroPoint>;
  using Codes = numerics::PackedCodes<kBits>;
  using Scheduler = schedule::TileScheduler<kBlockM, kBlockN, kBlockK>;
  using Writer = epilogue::OutputWriter<Act, kMTiles, kNTiles>;
  using ShareWriter = epilogue::OutputWriter<Act, kMTiles, kShareTiles>;
  using SwappedWriter = epilogue::SwappedOutputWriter<Act, kNTiles>;
  using SwappedShareWriter = epilogue::SwappedOutputWriter<Act, kShareTiles>;
  // What each warp writes in the swapped tile's epilogue: its share of the K warps' sum, or
  // (one K warp) all of its fragments; with the split-K reduction inside a cluster, through an
  // exchange region after the pipeline's shared memory.
  using SwappedPartWriter = typename detail::Select<(kWarpsK > 1), SwappedShareWriter, SwappedWriter>::Type;
  static constexpr int kExchangeBytes = kSwapped ? SwappedPartWriter::exchange_bytes(kWarps) : 0;
  static constexpr int kSmemBytes = kPipelineBytes + kExchangeBytes;

  // Everything a warp reads from shared memory for one 16-row K step.
  struct StepFragments {
    u32 a[kMTiles][kSwapped ? 2 : 4];  // m16k16 activation fragments (swapped: the k16n8 B fragment)
    u32 w[kWordsPerLane];              // the lane's stored weight words of the warp's unit
  };

  using Pairs = typename Dequantizer::Pairs;
  using Accumulators = float[kMTiles][kNTiles][4];
  // Small-M tiles are bound by the dequant and get the once-per-stage scale path; large warp
  // tiles amortize the dequant over many mma and would only pay for it in registers.
  static constexpr bool kHoistScales = kMTiles <= 2;
  // The swapped tile with integer codes (no float zero point) applies the group scales to fp32
  // sums: the mma multiplies q - z (exact in the activation dtype) into per-run partial sums,
  // and each run of a warp's K steps inside one scale group adds partial x s to the accumulators
  // once (16 fp32 fma per run instead of 64 packed multiplies on 256-wide stages). The weight
  // the kernel multiplies with is then (q - z) * s unrounded; humming_aot.spec.KernelKey
  // .scales_in_fp32 says so to the host (the generated source static_asserts that they agree).
  // The 16-row tile has no registers for the partial sums (two CTAs per SM need <= 128).
  static constexpr bool kScalesInFp32 = kSwapped && Dequantizer::kUnscaledExact;
  // With bf16 and the implicit zero point the codes are read with the biased decode
  // (numerics/int_dequantizer.cuh: one lop3 gives bias + q, whatever the code's bit position).
  // The bias then leaves in one of two ways (docs/PERFORMANCE.md sections 17 and 18):
  // - codes of 3 to 7 bits: one packed fma per register pair subtracts bias + z, exactly;
  // - codes of 1 and 2 bits (kFoldsOffset): each step adds one mma of the constant (bias + z)
  //   fragment into one of two chains (even and odd steps: half the dependent mma latency),
  //   whose sum the run subtracts from its partial sums before the scale. The partial sums are
  //   ~2^7 larger than without the bias, which costs a bf16 result nothing; exact-grid inputs
  //   stay exact, and zero weights cancel to fp32 rounding of those sums, not bit for bit.
  //   Their decode is a lop3 per register pair and little else (on the half-rate ALU pipe,
  //   which bounds these tiles), so an fma each would cost them more than the mma saves.
  static constexpr bool kBiasedDecode = kScalesInFp32 && Dequantizer::kFoldsOffset;
  static constexpr bool kFoldsOffset = kBiasedDecode && kBits <= 2;
  // Tiles of at most two tokens (M <= 2, and the last 8-row tile of any M that leaves 1 or 2)
  // with kFoldsOffset and one scale row per warp run: the run's offset is one mma instead of one
  // per K step. Its A operand is the two tokens' activations with the steps as rows (token 0 in
  // rows 0-7, token 1 in rows 8-15, one ldmatrix x4), its B operand the constant (bias + z)
  // pairs, column 2c for the rows g (h = 0) of a weight tile and 2c + 1 for the rows g + 8;
  // the sum over the 8 step rows is three butterfly shuffles. The offset is then not summed in
  // the order of the partial sums it is subtracted from: the two differ by fp32 rounding of
  // sums ~2^7 larger than the result (exact-grid inputs stay exact), not bit for bit. A tile
  // with one token (M = 1) reduces, subtracts and accumulates token 0's values only (kOneToken
  // of compute_stage: the same bits for token 0, a tenth fewer instructions per warp-stage).
  static constexpr bool kPairOffset = kFoldsOffset && kWarpPipelines && kSteps == 8;
  // With the run offset, 1-bit codes take two bias patterns (numerics/int_dequantizer.cuh,
  // apply_biased_nibble): one shift per K step instead of three. Tiles 1 and 3 then sum
  // kUpperUnit x (q - z) x a: their scales are divided by it (exact) and their offset is the
  // run mma's columns 2 and 3.
  static constexpr bool kNibbleDecode = kPairOffset && kBits == 1;
  // the high nibble's (bias + kUpperUnit z) pair of register s (a placeholder without the nibble decode)
  static HUMMING_AOT_HOST_DEVICE constexpr u32 nibble_pair(int s) {
    if constexpr (kNibbleDecode) {
      return Dequantizer::nibble_offset_pair(s, true);
    } else {
      return 0u;
    }
  }

  // This thread's shared-memory offsets inside a stage, computed once per CTA so that a stage
  // only adds its base: the K steps kk = warp_k * kSteps + i it multiplies (i < kSteps); with
  // warp pipelines, step i of the warp's own region.
  struct StepOffsets {
    u32 a[kSteps][kMTiles];  // ldmatrix row address of each m16 fragment
    u32 w[kSteps];           // the lane's packed words of the warp's unit
    u32 s[kSteps];           // the lane's scale pairs (scale row of the step); zero points at + kSBytes
    u32 pair_a;              // kPairOffset: ldmatrix x4 row address of the two tokens' steps
    u32 pair_b[2];           // kPairOffset: the lane's (bias + z) B fragment

    StepOffsets() = default;
    __device__ __forceinline__ StepOffsets(int warp_m, int warp_n, int warp_k, const Walk& walk) {
      const int lane = threadIdx.x & 31, step_shift = walk.step_shift;
      // warp pipelines: the warp's region of a stage (as in run())
      const int region = ((warp_k * kWarpsM + warp_m) * kWarpsN + warp_n) * Layout::kBytes;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        if constexpr (kWarpPipelines) {  // ldmatrix x2: lanes 0-7 rows of k 0-7, lanes 8-15 rows of k 8-15
          a[i][0] = region + Layout::a_chunk_offset(lane & 7, 2 * i + ((lane >> 3) & 1));
          w[i] = region + kABytes + 4 * ((i * 32 + lane) * kWordsPerLane);
          s[i] = region + kABytes + kWBytes + 2 * ((i >> step_shift) * 64 + (lane >> 2) * 8);
        } else {
          const int kk = warp_k * kSteps + i;
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) {
            const int row = warp_m * kWarpRows + mi * 16 + (lane & 15);
            a[i][mi] = Layout::a_chunk_offset(row, 2 * kk + (lane >> 4));
          }
          w[i] = kABytes + 4 * (((kk * kUnits + warp_n) * 32 + lane) * kWordsPerLane);
          s[i] = kABytes + kWBytes + 2 * ((kk >> step_shift) * kBlockN + warp_n * 64 + (lane >> 2) * 8);
        }
        // opaque to the compiler, which would otherwise recompute them from threadIdx every stage
#pragma unroll
        for (int mi = 0; mi < kMTiles; ++mi) asm volatile("" : "+r"(a[i][mi]));
        asm volatile("" : "+r"(w[i]), "+r"(s[i]));
      }
      if constexpr (kPairOffset) {
        // matrix l / 8 of the x4: token (l / 8) & 1, k half l / 16; its row l % 8 is step l % 8
        const int mtx = lane >> 3;
        pair_a = region + Layout::a_chunk_offset(mtx & 1, 2 * (lane & 7) + (mtx >> 1));
        // B column g = lane / 4: h = g & 1; with the nibble decode, columns 2 and 3 (mod 4) are
        // the high nibble's pattern
        const bool h = (lane >> 2) & 1, upper = kNibbleDecode && ((lane >> 3) & 1);
        // compile-time pairs (register s = 2h + r of the pattern), selected per lane
        constexpr u32 kLow[4] = {Dequantizer::offset_pair(0), Dequantizer::offset_pair(1), Dequantizer::offset_pair(2),
                                 Dequantizer::offset_pair(3)};
        constexpr u32 kHigh[4] = {nibble_pair(0), nibble_pair(1), nibble_pair(2), nibble_pair(3)};
        pair_b[0] = upper ? (h ? kHigh[2] : kHigh[0]) : (h ? kLow[2] : kLow[0]);
        pair_b[1] = upper ? (h ? kHigh[3] : kHigh[1]) : (h ? kLow[3] : kLow[1]);
        asm volatile("" : "+r"(pair_a), "+r"(pair_b[0]), "+r"(pair_b[1]));
      }
    }
  };

  // The scale (and zero-point) pairs of the warp's 4 tiles at `addr` (a staged scale row), and
  // (kScalesInFp32) the scales as floats: scale_f[j][h] for the rows g + 8 h of weight tile j.
  static __device__ __forceinline__ void load_pairs(u32 addr, Pairs (&pairs)[4], float (&scale_f)[4][2]) {
    u32 scale[4], zero[4] = {0u, 0u, 0u, 0u};
    memory::lds_128(scale, addr);
    if constexpr (kHasZeroPoint) memory::lds_128(zero, addr + kSBytes);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pairs[j] = Dequantizer::prepare(scale[j], zero[j]);
      if constexpr (kScalesInFp32) H2::to_floats(scale[j], scale_f[j][0], scale_f[j][1]);
    }
  }

  // kScalesInFp32: acc += (partial - offset) x the scale of its row (c[0..1] row g, c[2..3] row
  // g + 8); offset is zero unless kFoldsOffset.
  // kUpperOffset (the nibble decode): tiles 1 and 3 subtract upper_offset (their scales carry
  // 1 / kUpperUnit). kOneToken: only the values of token 2t (e = 0, 2; token 0 in lanes t = 0,
  // the only one a one-token tile stores) are kept up to date.
  template <bool kUpperOffset, bool kOneToken = false>
  static __device__ __forceinline__ void add_scaled(const Accumulators& partial, const float (&offset)[4],
                                                    const float (&upper_offset)[4], const float (&scale_f)[4][2],
                                                    Accumulators& acc) {
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (kOneToken && (e & 1)) continue;  // e is unrolled
        const float off = kUpperOffset && (j & 1) ? upper_offset[e] : offset[e];
        const float unscaled = kFoldsOffset ? partial[0][j][e] - off : partial[0][j][e];
        acc[0][j][e] = fmaf(scale_f[j][e >> 1], unscaled, acc[0][j][e]);
      }
  }

  // The activation fragments and packed weight words of the warp's step i.
  static __device__ __forceinline__ void load_step(u32 stage_smem, const StepOffsets& off, int i, StepFragments& f) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      if constexpr (kSwapped) {
        memory::ldmatrix_x2(f.a[mi], stage_smem + off.a[i][mi]);
      } else {
        memory::ldmatrix_x4(f.a[mi], stage_smem + off.a[i][mi]);
      }
    }
    memory::lds_words(f.w, stage_smem + off.w[i]);
  }

  // offset: kFoldsOffset's sum of (bias + z) x a over the run (untouched otherwise), one mma per
  // step unless the run's offset is one mma of its own (kRunOffset).
  template <bool kRunOffset = false>
  static __device__ __forceinline__ void multiply_step(const StepFragments& f, const Pairs (&pairs)[4],
                                                       Accumulators& acc, float (&offset)[4]) {
    u32 padded[Codes::kPaddedWords];
    if constexpr (kNibbleDecode && kRunOffset) {
      padded[0] = padded[1] = f.w[0];  // tiles 0 and 1 in place, 2 and 3 one byte down
      padded[2] = padded[3] = f.w[0] >> 8;
    } else {
      Codes::unfold(f.w, padded);
    }
    if constexpr (kFoldsOffset && !kRunOffset) {
      // the A fragment order of the swapped mma below: (h, r) = (0, 0), (1, 0), (0, 1), (1, 1)
      const u32 offset_frag[4] = {Dequantizer::offset_pair(0), Dequantizer::offset_pair(2),
                                  Dequantizer::offset_pair(1), Dequantizer::offset_pair(3)};
      mma::mma_m16n8k16<Act>(offset, offset_frag, f.a[0]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u32 tile_words[Dequantizer::kWordsPerTile];
#pragma unroll
      for (int e = 0; e < Dequantizer::kWordsPerTile; ++e) tile_words[e] = padded[j * Dequantizer::kWordsPerTile + e];
      u32 b_frag[2][2];
      if constexpr (kNibbleDecode && kRunOffset) {
        if (j & 1) {  // j is unrolled: one of the two
          Dequantizer::template apply_biased_nibble<true>(tile_words[0], b_frag);
        } else {
          Dequantizer::template apply_biased_nibble<false>(tile_words[0], b_frag);
        }
      } else if constexpr (kFoldsOffset) {
        Dequantizer::apply_biased(tile_words, b_frag);
      } else if constexpr (kBiasedDecode) {
        Dequantizer::apply_biased_exact(tile_words, b_frag);
      } else if constexpr (kScalesInFp32) {
        Dequantizer::apply_unscaled(tile_words, pairs[j], b_frag);
      } else {
        Dequantizer::apply(tile_words, pairs[j], b_frag);
      }
      if constexpr (kSwapped) {
        // B fragment (k 2t.., n g), (k 2t+8.., n g) of n8 halves h = the A fragment's row halves
        const u32 a_frag[4] = {b_frag[0][0], b_frag[1][0], b_frag[0][1], b_frag[1][1]};
        mma::mma_m16n8k16<Act>(acc[0][j], a_frag, f.a[0]);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi) mma::mma_m16n8k16<Act>(acc[mi][2 * j + h], f.a[mi], b_frag[h]);
        }
      }
    }
  }

  // Multiply this warp's K steps of one staged K tile into its accumulators; the shared-memory
  // reads of the next step are issued before the dequant and mma of the current one (register
  // double buffering). kOneScaleRow: every step of this warp uses the same scale row (its run of
  // steps lies inside one group), so its pairs are loaded and broadcast once per stage. Otherwise
  // a new row starts every row_steps_mask + 1 steps of the warp's run (a power of two that divides
  // the run, whose start is a multiple of its length), and the pairs are reloaded only then.
  // kScalesInFp32: the steps of one scale row multiply into `partial` (zeroed when the row
  // starts: ptxas turns the first step's mma into one without an accumulator input), which joins
  // the accumulators, scaled, when the row ends.
  // kPairOffset: the offset of the warp's whole run of steps for tokens 0 and 1 of the tile (the
  // layout of `offset` in multiply_step: e = 0, 1 rows g, tokens 2t, 2t + 1; e = 2, 3 rows g + 8).
  // Lanes with t > 0 get tokens 0 and 1 too: theirs (2t, 2t + 1 >= 2) are never stored.
  // kNibbleDecode: lanes with t even reduce the low nibble's columns, t odd the high nibble's;
  // each takes the other's from its neighbour t ^ 1 into upper_offset.
  // kOneToken (a tile with one token): token 0's offsets only (offset[0], offset[2]; the others
  // are left alone): half the shuffles and adds, the same bits for token 0.
  template <bool kOneToken = false>
  static __device__ __forceinline__ void run_offset(u32 stage_smem, const StepOffsets& off, float (&offset)[4],
                                                    float (&upper_offset)[4]) {
    u32 a[4];
    memory::ldmatrix_x4(a, stage_smem + off.pair_a);
    float d[4] = {0.f, 0.f, 0.f, 0.f};  // (step g, token 0 | 1, h = 0 | 1): d[0] t0 h0, d[1] t0 h1, d[2] t1 h0, d[3] t1 h1
    mma::mma_m16n8k16<Act>(d, a, off.pair_b);
    constexpr int kValues = kOneToken ? 2 : 4;  // d[0], d[1]: token 0
#pragma unroll
    for (int mask = 4; mask < 32; mask <<= 1)
#pragma unroll
      for (int e = 0; e < kValues; ++e) d[e] += __shfl_xor_sync(0xffffffffu, d[e], mask);
    offset[0] = d[0];
    offset[2] = d[1];
    if constexpr (!kOneToken) {
      offset[1] = d[2];
      offset[3] = d[3];
    }
    if constexpr (kNibbleDecode) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (!kOneToken || !(e & 1)) upper_offset[e] = __shfl_xor_sync(0xffffffffu, offset[e], 1);
      }
    }
  }

  template <bool kOneScaleRow, bool kRunOffset = false, bool kOneToken = false>
  static __device__ __forceinline__ void compute_stage(u32 stage_smem, const StepOffsets& off, int row_steps_mask,
                                                       Accumulators& acc) {
    static_assert(!kRunOffset || (kOneScaleRow && kPairOffset), "a run offset needs the run in one scale row");
    static_assert(!kOneToken || kRunOffset, "the one-token path is the run offset's");
    constexpr bool kUpperOffset = kNibbleDecode && kRunOffset;
    Pairs pairs[4];
    float scale_f[4][2];
    Accumulators partial;
    float offset[4] = {0.f, 0.f, 0.f, 0.f}, upper_offset[4] = {0.f, 0.f, 0.f, 0.f};
    // the per-step offsets: even and odd steps in two chains (half the dependent mma latency)
    float step_offset[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (kOneScaleRow) load_pairs(stage_smem + off.s[0], pairs, scale_f);
    if constexpr (kRunOffset) {
      run_offset<kOneToken>(stage_smem, off, offset, upper_offset);
      if constexpr (kUpperOffset) {
#pragma unroll
        for (int j = 1; j < 4; j += 2) {
          scale_f[j][0] *= 1.0f / Dequantizer::kUpperUnit;
          scale_f[j][1] *= 1.0f / Dequantizer::kUpperUnit;
        }
      }
    }
    StepFragments frags[2];
    load_step(stage_smem, off, 0, frags[0]);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (i + 1 < kSteps) load_step(stage_smem, off, i + 1, frags[(i + 1) & 1]);
      const bool row_starts = kOneScaleRow ? i == 0 : (i & row_steps_mask) == 0;
      if (row_starts) {
        if constexpr (kScalesInFp32) {
          if (i > 0) {
            if constexpr (!kRunOffset) join_step_offsets(step_offset, offset);
            add_scaled<kUpperOffset, kOneToken>(partial, offset, upper_offset, scale_f, acc);
          }
          Writer::zero(partial);
          if constexpr (!kRunOffset) {
#pragma unroll
            for (int e = 0; e < 4; ++e) step_offset[0][e] = step_offset[1][e] = 0.f;
          }
        }
        if constexpr (!kOneScaleRow) load_pairs(stage_smem + off.s[i], pairs, scale_f);
      }
      if constexpr (kScalesInFp32) {
        multiply_step<kRunOffset>(frags[i & 1], pairs, partial, kRunOffset ? offset : step_offset[i & 1]);
      } else {
        multiply_step(frags[i & 1], pairs, acc, offset);
      }
    }
    if constexpr (kScalesInFp32) {
      if constexpr (!kRunOffset) join_step_offsets(step_offset, offset);
      add_scaled<kUpperOffset, kOneToken>(partial, offset, upper_offset, scale_f, acc);
    }
  }

  static __device__ __forceinline__ void join_step_offsets(const float (&step_offset)[2][4], float (&offset)[4]) {
    if constexpr (kFoldsOffset) {
#pragma unroll
      for (int e = 0; e < 4; ++e) offset[e] = step_offset[0][e] + step_offset[1][e];
    }
  }

  // Parked accumulators (K warps > 1; reuses the pipeline's shared memory once every cp.async
  // has landed and been read): slot-major (slot, kWarpsM * kWarpsN, kParkedValues, 32 lanes) floats.
  static constexpr int kParkedValues = kMTiles * kNTiles * 4;  // floats per lane of one warp

  // This lane's first float in `slot` of the warps (warp_m, warp_n) = warp_mn.
  static __device__ __forceinline__ float* parked_lane(char* smem, int slot, int warp_mn) {
    return reinterpret_cast<float*>(smem) + (slot * kWarpsM * kWarpsN + warp_mn) * kParkedValues * 32 +
           (threadIdx.x & 31);
  }
  // Offset of value (mi, ni, e) from a lane's first float.
  static __device__ __forceinline__ int parked_offset(int mi, int ni, int e) { return ((mi * kNTiles + ni) * 4 + e) * 32; }

  static __device__ __forceinline__ void park(float* lane_slot, const float (&acc)[kMTiles][kNTiles][4]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) lane_slot[parked_offset(mi, ni, e)] = acc[mi][ni][e];
  }

  // sum[mi][nj][e] += (kAssign: =) the value (mi, ni0 + nj, e) parked at lane_slot.
  template <bool kAssign, int kTiles>
  static __device__ __forceinline__ void gather_parked(const float* lane_slot, int ni0,
                                                       float (&sum)[kMTiles][kTiles][4]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int nj = 0; nj < kTiles; ++nj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float v = lane_slot[parked_offset(mi, ni0 + nj, e)];
          sum[mi][nj][e] = kAssign ? v : sum[mi][nj][e] + v;
        }
  }

  // Every K warp parks its accumulators (slot = its K index); then K warp w adds up, in K-warp
  // order (deterministic: the order one warp accumulating them would use), fragments
  // [w * kShareTiles, + kShareTiles) over all K warps of its (warp_m, warp_n), into `share`. The
  // split-K stores and the last CTA's reduction then run on every warp of the CTA instead of one
  // warp per K group.
  static __device__ __forceinline__ void share_over_k_warps(char* smem, int warp_mn, int warp_k,
                                                            const float (&acc)[kMTiles][kNTiles][4],
                                                            float (&share)[kMTiles][kShareTiles][4]) {
    __syncthreads();
    park(parked_lane(smem, warp_k, warp_mn), acc);
    __syncthreads();
    gather_parked<true>(parked_lane(smem, 0, warp_mn), warp_k * kShareTiles, share);
#pragma unroll
    for (int other = 1; other < kWarpsK; ++other) {
      gather_parked<false>(parked_lane(smem, other, warp_mn), warp_k * kShareTiles, share);
    }
  }

  // The compute paths of the per-warp pipelines' K loop (compute_stage's template arguments).
  enum WarpPath : int {
    kOneTokenPath,      // the run offset of one token (kPairOffset, M - m0 == 1)
    kTwoTokenPath,      // the run offset of two tokens (kPairOffset, M - m0 == 2)
    kOneScaleRowPath,   // every warp run in one scale row
    kGroupWalkPath,     // scale rows change inside a warp run
  };

  // The K loop of the per-warp pipelines (the swapped 8-row tile), one instance per compute path,
  // which run() picks once per CTA. The loop is unrolled by kStages, so each stage's slot and the
  // one it refills are constants folded into the shared-memory addresses; the tile's runs of
  // one or two tokens lie in the first activation pass and every run path stages one scale row,
  // so their loads test for no other pass; kScalesEveryTile: scales_every_tile() (no count of
  // K tiles per scale row).
  template <int kPath, bool kScalesEveryTile>
  static __device__ __forceinline__ void warp_pipeline_loop(StageLoader& loader, u32 smem_base, int count,
                                                            const StepOffsets& offsets, int row_steps_mask,
                                                            Accumulators& acc) {
    // (run() takes the run paths only with kPairOffset; without it they are never called)
    constexpr bool kRunPath = kPairOffset && (kPath == kOneTokenPath || kPath == kTwoTokenPath);
    static_assert(!kRunPath || StageLoader::kAPassRows >= 2, "a run path's tokens lie in pass 0");
    for (int it0 = 0; it0 < count; it0 += kStages) {
#pragma unroll
      for (int slot = 0; slot < kStages; ++slot) {
        const int it = it0 + slot;
        if (slot > 0 && it >= count) break;
        memory::cp_async_wait<kStages - 2>();
        __syncwarp();  // stage `it` landed for every lane of the warp, which alone reads its region
        if (it + kStages - 1 < count) {  // refill the slot that stage `it - 1` used
          const u32 load_offset = ((slot + kStages - 1) % kStages) * kStageBytes;
          loader.template load_known<kRunPath, kPath != kGroupWalkPath>(load_offset);
          loader.template advance<kScalesEveryTile>();
        }
        memory::cp_async_commit();
        const u32 stage_smem = smem_base + slot * kStageBytes;
        if constexpr (kPath == kOneTokenPath) {
          compute_stage<true, kRunPath, kRunPath>(stage_smem, offsets, 0, acc);
        } else if constexpr (kPath == kTwoTokenPath) {
          compute_stage<true, kRunPath>(stage_smem, offsets, 0, acc);
        } else if constexpr (kPath == kOneScaleRowPath) {
          compute_stage<true>(stage_smem, offsets, 0, acc);
        } else {
          compute_stage<false>(stage_smem, offsets, row_steps_mask, acc);
        }
      }
    }
  }

  // warp_pipeline_loop of a run path, for the CTA's (uniform) scales_every_tile().
  template <int kPath>
  static __device__ __forceinline__ void run_pipeline_path(bool every_tile, StageLoader& loader, u32 smem_base,
                                                           int count, const StepOffsets& offsets, Accumulators& acc) {
    if (every_tile) {
      warp_pipeline_loop<kPath, true>(loader, smem_base, count, offsets, 0, acc);
    } else {
      warp_pipeline_loop<kPath, false>(loader, smem_base, count, offsets, 0, acc);
    }
  }

  static __device__ __forceinline__ void run(const GemmParams& p) {
    extern __shared__ __align__(128) char smem[];
    __shared__ int arrival_flag;
    const Scheduler tile(p.m, p.n, p.k, p.k_splits);
    const int m0 = tile.m_tile * kBlockM, n0 = tile.n_tile * kBlockN;
    const int count = tile.k_tile_end - tile.k_tile_begin;
    const u32 smem_base = memory::shared_address(smem);
    const int warp = threadIdx.x >> 5;
    const int warp_k = warp / (kWarpsM * kWarpsN), warp_mn = warp % (kWarpsM * kWarpsN);
    const int warp_m = warp_mn / kWarpsN, warp_n = warp_mn % kWarpsN;
    // the swapped tile's epilogue reads the parameters from its warp's copy in shared memory
    const bool in_cluster = kSwapped && SwappedPartWriter::prepare(p, smem_base + kPipelineBytes, kWarps, warp);
    const Walk walk(p.group_size);
    // Every warp's run of K steps [warp_k * kSteps, + kSteps) lies in one scale row: runs and
    // groups are powers of two steps long, so a run no longer than a group never straddles one
    // (a CTA-uniform test, which keeps the branch below uniform).
    static_assert((kSteps & (kSteps - 1)) == 0, "K steps per warp: a power of two");
    const bool one_scale_row = kSteps <= (1 << walk.step_shift);
    const bool pair_tokens = p.m - m0 <= 2;  // kPairOffset: this tile has at most two tokens
    const bool one_token = p.m - m0 == 1;

    // The first stages' weights leave before this thread's shared-memory offsets are worked out
    // (the prologue's setup step), which only the first stage's compute needs. Warp pipelines:
    // the warp's run of each stage, its 64 columns, its lanes as issuers, its region.
    const u32 region = kWarpPipelines ? warp * Layout::kBytes : 0;
    StageLoader loader = kWarpPipelines
        ? StageLoader(p, m0, n0 + warp_n * 64, tile.k_tile_begin, warp_k * kSteps * 16, threadIdx.x & 31)
        : StageLoader(p, m0, n0, tile.k_tile_begin);
    StepOffsets offsets;
    loader.template load_prologue<kStages - 1, kStageBytes>(p, smem_base + region, count, [&] {
      offsets = StepOffsets(warp_m, warp_n, warp_k, walk);
      if constexpr (kSwapped) SwappedPartWriter::join_cluster(in_cluster);  // waited for while the first copies fly
    });
    float acc[kMTiles][kNTiles][4];
    Writer::zero(acc);

    if constexpr (kWarpPipelines) {
      // the compute path is chosen once per CTA (uniform), so no stage tests for it
      static_assert(kHoistScales, "the one-scale-row path hoists the scales (one m16 tile per warp)");
      const bool every_tile = loader.scales_every_tile();
      if (kPairOffset && one_scale_row && pair_tokens) {
        if (one_token) {
          run_pipeline_path<kOneTokenPath>(every_tile, loader, smem_base, count, offsets, acc);
        } else {
          run_pipeline_path<kTwoTokenPath>(every_tile, loader, smem_base, count, offsets, acc);
        }
      } else if (one_scale_row) {
        warp_pipeline_loop<kOneScaleRowPath, false>(loader, smem_base, count, offsets, 0, acc);
      } else {
        warp_pipeline_loop<kGroupWalkPath, false>(loader, smem_base, count, offsets, (1 << walk.step_shift) - 1, acc);
      }
    } else {
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
    }
    // The next kernel may now be scheduled into the slots this grid leaves as it finishes, and
    // prefetch its weights during this epilogue. Not earlier: its CTAs would then be placed while
    // this grid still runs, wherever slots happen to be free, and pile up on some SMs.
    schedule::release_dependent_grid();
    memory::cp_async_wait<0>();
    if constexpr (kWarpsK > 1) {
      float share[kMTiles][kShareTiles][4];
      share_over_k_warps(smem, warp_mn, warp_k, acc, share);
      const int col0 = n0 + warp_n * 64 + kTileColumns * kShareTiles * warp_k;
      if constexpr (kSwapped) {
        const auto& stash = SwappedShareWriter::stashed(smem + kPipelineBytes, warp);
        if (!SwappedShareWriter::write_in_cluster(stash, share[0], m0, col0, smem_base + kPipelineBytes, kWarps, warp)) {
          SwappedShareWriter::write(stash.p, share[0], m0, col0, tile.tile_index, &arrival_flag);
        }
      } else {
        ShareWriter::write(p, share, m0 + warp_m * kWarpRows, col0, tile.tile_index, &arrival_flag);
      }
    } else if constexpr (kSwapped) {
      __syncwarp();  // the lanes' stashed words are visible to the warp (a CTA with no K tile ran no loop)
      const auto& stash = SwappedWriter::stashed(smem + kPipelineBytes, warp);
      if (!SwappedWriter::write_in_cluster(stash, acc[0], m0, n0 + warp_n * 64, smem_base + kPipelineBytes, kWarps, warp)) {
        SwappedWriter::write(stash.p, acc[0], m0, n0 + warp_n * 64, tile.tile_index, &arrival_flag);
      }
    } else {
      Writer::write(p, acc, m0 + warp_m * kWarpRows, n0 + warp_n * 64, tile.tile_index, &arrival_flag);
    }
  }
};

}  // namespace humming_aot::kernel
