#pragma once
// The K loop of the mma.sync body's swapped tiles (8 tokens, M <= 8; or 16 or 32), and its epilogue
// wiring: one cp.async pipeline per warp over the warp's own region of each stage, with no CTA
// barrier per stage, and swapped mma operands. Any mma.sync arch (catalog/tiles.toml picks it on
// sm90a). Invariants: kBlockM 8, 16 or 32, one warp along M; kernel/dense_mma_sync.cuh composes it
// with the tile scheduler (the 16- and 32-token tiles are the body "mma-sw",
// humming_aot/bodies/mma_swapped.py).

#include <humming_aot/epilogue/k_warp_reduction.cuh>
#include <humming_aot/epilogue/output_writer.cuh>
#include <humming_aot/epilogue/swapped_output_writer.cuh>
#include <humming_aot/kernel/params.cuh>
#include <humming_aot/memory/cp_async.cuh>
#include <humming_aot/memory/shared_fragments.cuh>
#include <humming_aot/memory/stage_loader.cuh>
#include <humming_aot/mma/mma_sync.cuh>
#include <humming_aot/numerics/weight_codes.cuh>

namespace humming_aot::mainloop {

// The swapped operands: the dequantized 16 x 16 weight tiles are the mma A operand (the packed
// tile is exactly an A fragment) and each 8 tokens an n8 B operand, so a weight tile costs one mma
// instead of two when M <= 8; a 16-token tile multiplies each dequantized tile twice (a 32-token
// tile four times: twice the accumulators, up to 241 registers of a 128-thread CTA), with the
// dequantization, the weight copies and the per-warp pipeline of the 8-token one.
// The per-warp pipeline: each warp copies what it multiplies (its run of the stage's K steps: the
// activations, its unit's packed weights and scale rows) into a region of the stage that only it
// reads, then waits for its own copies and syncs its own lanes: no CTA barrier per stage behind
// the slowest warp. The activations of a run are copied once per warp along N. The K loop is
// instantiated once per compute path (warp_pipeline_loop), which run() picks once per CTA.
template <class Act,      // Float16 or BFloat16: activation, scale and output dtype
          class Weights,  // numerics::IntWeights<bits> or FloatWeights<exp, man>
          numerics::ZeroPointKind kZeroPoint,
          int kBlockM,               // output rows per CTA: 8, 16 or 32
          int kBlockN,               // output columns per CTA (64 per warp along N)
          int kBlockK,               // K per pipeline stage: 64, 128, 256 or 512
          int kWarpsM, int kWarpsN,  // warp grid of the CTA over the output tile: 1 x kWarpsN
          int kWarpsK,               // warps sharing each stage's K steps (1, 2 or 4)
          int kStages>               // cp.async pipeline depth
struct SwappedWarpPipeline {
  static constexpr int kBits = Weights::kBits;  // weight code bits: 1 to 8
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN * kWarpsK;
  static constexpr int kMTiles = kBlockM / 8;  // n8 B fragments (8 tokens each) per K step
  static constexpr int kNTiles = 4;            // accumulator fragments: one per 16-channel weight tile
  static constexpr int kK16Steps = kBlockK / 16;
  static constexpr bool kHasZeroPoint = kZeroPoint != numerics::ZeroPointKind::kImplicit;
  static constexpr int kWordsPerLane = kBits;  // stored words per (16-row K step, unit, lane)

  static_assert(kBlockM == 8 || kBlockM == 16 || kBlockM == 32,
                "the swapped operands hold 8 tokens per mma n8: 8, 16 or 32");
  static_assert(kWarpsM == 1, "the tile's rows are one warp's");
  static_assert(kBlockN == 64 * kWarpsN, "one packed 64-column unit per warp along N");
  static_assert(kStages >= 2, "a pipeline needs two stages");
  static_assert(kK16Steps % kWarpsK == 0, "the K steps of a stage split evenly over the K warps");
  static_assert(kThreads <= 1024, "too many warps");

  static constexpr int kSteps = kK16Steps / kWarpsK;  // K steps per warp per stage
  static constexpr int kWarps = kThreads / 32;
  using Walk = memory::GroupWalk<kBlockK>;
  // one warp's region of a stage (memory/stage_loader.cuh has the layout)
  using Layout = memory::StageLayout<kBlockM, 64, kSteps * 16, kBits, kHasZeroPoint>;
  using StageLoader = memory::StageLoader<kBlockM, 64, kSteps * 16, kBits, kHasZeroPoint, 32, kBlockK>;
  static constexpr int kABytes = Layout::kABytes;
  static constexpr int kWBytes = Layout::kWBytes;
  static constexpr int kSBytes = Layout::kSBytes;
  static constexpr int kStageBytes = kWarps * Layout::kBytes;
  // Activation rows 8 tokens apart lie 8 x 128 bytes apart in every 64-wide sub-tile, with the
  // same swizzle (Layout::a_chunk_offset: row & 7 repeats): the second token group's fragment is
  // the first's address plus a constant, folded into the ldmatrix.
  static constexpr u32 kTokenGroupBytes = 8 * 128;
  // warps_k > 1: every K warp parks its accumulators after the K loop, then sums and writes its
  // share of the fragments (a 16-channel weight tile each)
  using Reduction = epilogue::KWarpReduction<kWarpsM, kWarpsN, kWarpsK, kMTiles, kNTiles>;
  static constexpr int kShareTiles = Reduction::kShareTiles;
  static constexpr int kTileColumns = 16;
  static constexpr int kPipelineBytes =
      kStages * kStageBytes > Reduction::kBytes ? kStages * kStageBytes : Reduction::kBytes;

  using H2 = numerics::PackedHalf2<Act>;
  using Dequantizer = typename Weights::template Dequantizer<Act, kZeroPoint>;
  using Codes = numerics::PackedCodes<kBits>;
  using Writer = epilogue::SwappedOutputWriter<Act, kMTiles * kNTiles, kMTiles>;
  using ShareWriter = epilogue::SwappedOutputWriter<Act, kMTiles * kShareTiles, kMTiles>;
  // What each warp writes in the epilogue: its share of the K warps' sum, or (one K warp) all of
  // its fragments; with the split-K reduction inside a cluster, through an exchange region after
  // the pipeline's shared memory.
  using PartWriter = typename Select<(kWarpsK > 1), ShareWriter, Writer>::Type;
  static constexpr int kExchangeBytes = PartWriter::exchange_bytes(kWarps);
  static constexpr int kSmemBytes = kPipelineBytes + kExchangeBytes;

  // Everything a warp reads from shared memory for one 16-row K step.
  struct StepFragments {
    u32 a[kMTiles][2];     // the k16n8 B fragment of each 8 tokens
    u32 w[kWordsPerLane];  // the lane's stored weight words of the warp's unit
  };

  using Pairs = typename Dequantizer::Pairs;
  using Accumulators = float[kMTiles][kNTiles][4];

  // With integer codes (no float zero point) the group scales apply to fp32 sums: the mma
  // multiplies q - z (exact in the activation dtype) into per-run partial sums, and each run of a
  // warp's K steps inside one scale group adds partial x s to the accumulators once (16 fp32 fma
  // per run instead of 64 packed multiplies on 256-wide stages). The weight the kernel multiplies
  // with is then (q - z) * s unrounded; humming_aot.spec.KernelKey.scales_in_fp32 says so to the
  // host (the generated source static_asserts that they agree).
  static constexpr bool kScalesInFp32 = Dequantizer::kUnscaledExact;
  // With bf16 and the implicit zero point the codes are read with the biased decode
  // (numerics/int_dequantizer.cuh: one lop3 gives bias + q, whatever the code's bit position).
  // The bias then leaves in one of two ways (docs/performance/log.md sections 17 and 18):
  // - codes of 3 to 7 bits: one packed fma per register pair subtracts bias + z, exactly;
  // - codes of 1 and 2 bits (kFoldsOffset): each step adds one mma of the constant (bias + z)
  //   fragment into one of two chains (even and odd steps: half the dependent mma latency),
  //   whose sum the run subtracts from its partial sums before the scale. The partial sums are
  //   ~2^7 larger than without the bias, which costs a bf16 result nothing; exact-grid inputs
  //   stay exact, and zero weights cancel to fp32 rounding of those sums, not bit for bit. The
  //   16- and 32-token tiles take the fma instead (the offset would be one mma per 8 tokens).
  //   Their decode is a lop3 per register pair and little else (on the half-rate ALU pipe,
  //   which bounds these tiles), so an fma each would cost them more than the mma saves.
  static constexpr bool kBiasedDecode = kScalesInFp32 && Dequantizer::kFoldsOffset;
  static constexpr bool kFoldsOffset = kBiasedDecode && kBits <= 2 && kMTiles == 1;
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
  static constexpr bool kPairOffset = kFoldsOffset && kSteps == 8;
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
  // only adds its base: step i of the warp's own region.
  struct StepOffsets {
    u32 a[kSteps];  // ldmatrix row address of the first 8 tokens' fragment (+ kTokenGroupBytes: the next 8)
    u32 w[kSteps];  // the lane's packed words of the warp's unit
    u32 s[kSteps];  // the lane's scale pairs (scale row of the step); zero points at + kSBytes
    u32 pair_a;     // kPairOffset: ldmatrix x4 row address of the two tokens' steps
    u32 pair_b[2];  // kPairOffset: the lane's (bias + z) B fragment

    StepOffsets() = default;
    __device__ __forceinline__ StepOffsets(int warp_m, int warp_n, int warp_k, const Walk& walk) {
      const int lane = threadIdx.x & 31, step_shift = walk.step_shift;
      // the warp's region of a stage (as in run())
      const int region = ((warp_k * kWarpsM + warp_m) * kWarpsN + warp_n) * Layout::kBytes;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        // ldmatrix x2: lanes 0-7 rows of k 0-7, lanes 8-15 rows of k 8-15
        a[i] = region + Layout::a_chunk_offset(lane & 7, 2 * i + ((lane >> 3) & 1));
        w[i] = region + kABytes + 4 * ((i * 32 + lane) * kWordsPerLane);
        s[i] = region + kABytes + kWBytes + 2 * ((i >> step_shift) * 64 + (lane >> 2) * 8);
        // opaque to the compiler, which would otherwise recompute them from threadIdx every stage
        asm volatile("" : "+r"(a[i]));
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
    for (int mi = 0; mi < kMTiles; ++mi)  // (kFoldsOffset: one group of 8 tokens)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (kOneToken && (e & 1)) continue;  // e is unrolled
          const float off = kUpperOffset && (j & 1) ? upper_offset[e] : offset[e];
          const float unscaled = kFoldsOffset ? partial[mi][j][e] - off : partial[mi][j][e];
          acc[mi][j][e] = fmaf(scale_f[j][e >> 1], unscaled, acc[mi][j][e]);
        }
  }

  // The activation fragments and packed weight words of the warp's step i.
  static __device__ __forceinline__ void load_step(u32 stage_smem, const StepOffsets& off, int i, StepFragments& f) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
      memory::ldmatrix_x2(f.a[mi], stage_smem + off.a[i] + mi * kTokenGroupBytes);
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
      const u32 offset_frag[4] = {Dequantizer::offset_pair(0), Dequantizer::offset_pair(2), Dequantizer::offset_pair(1),
                                  Dequantizer::offset_pair(3)};
      mma::mma_m16n8k16<Act>(offset, offset_frag, f.a[0]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      u32 tile_words[Dequantizer::kWordsPerTile];
      numerics::copy_tile_words(padded, j, tile_words);
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
      // B fragment (k 2t.., n g), (k 2t+8.., n g) of n8 halves h = the A fragment's row halves
      const u32 a_frag[4] = {b_frag[0][0], b_frag[1][0], b_frag[0][1], b_frag[1][1]};
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) mma::mma_m16n8k16<Act>(acc[mi][j], a_frag, f.a[mi]);
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
    float d[4] = {0.f, 0.f, 0.f,
                  0.f};  // (step g, token 0 | 1, h = 0 | 1): d[0] t0 h0, d[1] t0 h1, d[2] t1 h0, d[3] t1 h1
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
          zero(partial);
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

  // The compute paths of the per-warp pipelines' K loop (compute_stage's template arguments).
  enum WarpPath : int {
    kOneTokenPath,     // the run offset of one token (kPairOffset, M - m0 == 1)
    kTwoTokenPath,     // the run offset of two tokens (kPairOffset, M - m0 == 2)
    kOneScaleRowPath,  // every warp run in one scale row
    kGroupWalkPath,    // scale rows change inside a warp run
  };

  // The K loop of the per-warp pipelines, one instance per compute path, which run() picks once
  // per CTA. The loop is unrolled by kStages, so each stage's slot and the
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
        __syncwarp();                    // stage `it` landed for every lane of the warp, which alone reads its region
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

  static __device__ __forceinline__ void zero(Accumulators& acc) { mma::zero_accumulators(acc); }

  // Fragments (kMTiles, kTiles) as the output writers take them: one group of 8 tokens after the
  // other, (kMTiles * kTiles) fragments (the 8-token tile: its one group, as it always was).
  template <int kTiles>
  static __device__ __forceinline__ auto& fragments_of(float (&frags)[kMTiles][kTiles][4]) {
    if constexpr (kMTiles == 1) {
      return frags[0];
    } else {
      return *reinterpret_cast<float (*)[kMTiles * kTiles][4]>(&frags);
    }
  }

  bool in_cluster_;  // the split-K reduction of this CTA runs inside its cluster

  // The epilogue reads the parameters from its warp's copy in shared memory, stashed here.
  __device__ __forceinline__ SwappedWarpPipeline(const kernel::GemmParams& p, u32 smem_base, int warp)
      : in_cluster_(PartWriter::prepare(p, smem_base + kPipelineBytes, kWarps, warp)) {}

  // Multiplies the CTA's K tiles [k_tile_begin, + count) of its output tile (m0, n0) and writes
  // this warp's part of it: its share of the K warps' sum or all of its fragments, in the cluster
  // when the split-K reduction runs there. loop_done() runs once the K loop has issued its last
  // mma. The loop and the writes stay in one function: split, ptxas allocates other registers.
  template <class LoopDone>
  __device__ __forceinline__ void run(const kernel::GemmParams& p, char* smem, u32 smem_base, int m0, int n0,
                                      int k_tile_begin, int count, int tile_index, int* arrival_flag, int warp,
                                      int warp_mn, int warp_m, int warp_n, int warp_k, LoopDone&& loop_done) {
    const Walk walk(p.group_size);
    // Every warp's run of K steps [warp_k * kSteps, + kSteps) lies in one scale row: runs and
    // groups are powers of two steps long, so a run no longer than a group never straddles one
    // (a CTA-uniform test, which keeps the branch below uniform).
    static_assert((kSteps & (kSteps - 1)) == 0, "K steps per warp: a power of two");
    const bool one_scale_row = kSteps <= (1 << walk.step_shift);
    const bool pair_tokens = p.m - m0 <= 2;  // kPairOffset: this tile has at most two tokens
    const bool one_token = p.m - m0 == 1;

    // The first stages' weights leave before this thread's shared-memory offsets are worked out
    // (the prologue's setup step), which only the first stage's compute needs: the warp's run of
    // each stage, its 64 columns, its lanes as issuers, its region.
    const u32 region = warp * Layout::kBytes;
    StageLoader loader(p, m0, n0 + warp_n * 64, k_tile_begin, warp_k * kSteps * 16, threadIdx.x & 31);
    StepOffsets offsets;
    const bool in_cluster = in_cluster_;
    loader.template load_prologue<kStages - 1, kStageBytes>(p, smem_base + region, count, [&] {
      offsets = StepOffsets(warp_m, warp_n, warp_k, walk);
      PartWriter::join_cluster(in_cluster);  // waited for while the first copies fly
    });
    float acc[kMTiles][kNTiles][4];
    zero(acc);

    // the compute path is chosen once per CTA (uniform), so no stage tests for it
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
    loop_done();
    memory::cp_async_wait<0>();
    if constexpr (kWarpsK > 1) {
      float share[kMTiles][kShareTiles][4];
      Reduction::share_over_k_warps(smem, warp_mn, warp_k, acc, share);
      const int col0 = n0 + warp_n * 64 + kTileColumns * kShareTiles * warp_k;
      const auto& stash = ShareWriter::stashed(smem + kPipelineBytes, warp);
      auto& part = fragments_of(share);
      if (!ShareWriter::write_in_cluster(stash, part, m0, col0, smem_base + kPipelineBytes, kWarps, warp)) {
        ShareWriter::write(stash.p, part, m0, col0, tile_index, arrival_flag);
      }
    } else {
      __syncwarp();  // the lanes' stashed words are visible to the warp (a CTA with no K tile ran no loop)
      const auto& stash = Writer::stashed(smem + kPipelineBytes, warp);
      auto& part = fragments_of(acc);
      if (!Writer::write_in_cluster(stash, part, m0, n0 + warp_n * 64, smem_base + kPipelineBytes, kWarps, warp)) {
        Writer::write(stash.p, part, m0, n0 + warp_n * 64, tile_index, arrival_flag);
      }
    }
  }
};

}  // namespace humming_aot::mainloop
