#pragma once
// Host <-> device contract of every GEMM kernel: the one Params struct passed by value, and the
// metadata each compiled kernel exports so the launcher can check it against the manifest.
// Contract changes bump kParamsVersion (and humming_aot.aot.codegen.PARAMS_VERSION); version 2:
// every kernel calls schedule::wait_for_upstream_grid() before touching upstream data, which makes
// it safe to launch with programmatic dependent launch; version 3: the last field is the fp32
// global weight scale (it was a reserved 0); version 4: the 8-row tiles of sm_90+ launched with
// cluster dims (1, k_splits, 1) sum their K slices inside the cluster and get no workspace or
// counters (epilogue/cluster_exchange.cuh); version 5: TmaGemmParams carries the stream-K switch
// (its third schedule int, which version 4 left zero as padding); version 6: the W4A8 body reads
// its weight codes in packed layout version 2 (numerics/int4_e4m3.cuh, humming_aot.w4a8).

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::kernel {

inline constexpr u32 kParamsVersion = 6;
inline constexpr u32 kMetadataMagic = 0x544F4148u;  // "HAOT" little-endian

// Packed by humming_aot.dispatch with struct format "<8Q2q5if" (104 bytes).
struct GemmParams {
  const void* a;             // (m, k) activation, row stride lda elements, 16-byte aligned rows
  const void* w;             // (k / 16, n * bits / 2) int32, the packed weight (humming_aot/packed_layout.py)
  const void* w_scale;       // (k / group, n) activation dtype, permuted per 64-column unit
  const void* w_zero_point;  // same layout as w_scale (zero point as a value), or nullptr
  const void* bias;          // (n) activation dtype, or nullptr
  void* out;                 // (m, n) activation dtype, row stride ldo elements
  float* workspace;          // (k_splits, m, n) fp32 split-K partial sums; unused (may be nullptr) when
                             // k_splits == 1 or the K slices are one cluster (version 4)
  int* tile_counters;        // split-K arrival counters, one per output tile, zero between launches
                             // (nullptr where the workspace is)
  i64 lda;                   // elements between activation rows
  i64 ldo;                   // elements between output rows
  int m, n, k;               // problem size; n % 64 == 0, k % 64 == 0
  int group_size;            // K elements per scale group (k for per-channel scales)
  int k_splits;              // slices of K per output tile (gridDim.y)
  float global_scale;        // multiplies every output before the bias (1 when the weight has none)
};
static_assert(sizeof(GemmParams) == 104, "GemmParams must match the Python struct format <8Q2q5if");

// An opaque CUtensorMap (128 bytes, 64-byte aligned) encoded on the host by the launcher
// (humming_aot._C.encode_tensor_map_2d); the kernel only passes its address to TMA copies.
struct alignas(64) TensorMap {
  u64 opaque[16];
};

// The Params of the warp-specialized wgmma body (kernel/dense_wgmma_ws.cuh): GemmParams (its
// k_splits unused), the schedule (the tail split of schedule/tail_split_scheduler.cuh, or stream-K
// over gridDim.x persistent CTAs, schedule/stream_k_scheduler.cuh), then at byte 128 the tensor
// map of the activations, (m rows, k columns) of 16-bit elements with row stride lda, boxes of
// (block_m rows, 64 columns) with the 128-byte swizzle. Packed by humming_aot.dispatch as
// GemmParams' bytes, "<3i", 12 zero bytes and the map's 128 bytes.
struct TmaGemmParams {
  GemmParams gemm;
  int dp_ctas;      // tail split: CTAs that take one whole tile each (the first tiles in raster order)
  int tail_splits;  // tail split: K slices of every later tile, one CTA each
  int stream_k;     // 1: stream-K (workspace: one fp32 tile per CTA; dp_ctas, tail_splits unused)
  TensorMap a_map;
};
// (No offsetof: NVRTC has none. GemmParams is 104 bytes and the map 64-byte aligned, so the three
// ints sit at byte 104 and the map at byte 128.)
static_assert(sizeof(TmaGemmParams) == 256 && alignof(TensorMap) == 64 && sizeof(TensorMap) == 128,
              "TmaGemmParams is GemmParams, three ints, padding to byte 128, then the 128-byte tensor map");

// The Params of the warp-specialized 8-bit body (kernel/dense_wgmma_ss.cuh, W8A8): TmaGemmParams
// whose GemmParams name the e4m3 weight codes (w: (n, k) bytes, row-major), their fp32 channel
// scales (w_scale: (n,)) and the e4m3 activation codes (a: (m, k) bytes, row stride lda bytes),
// with k rounded up to a multiple of 128 (the K tile; the maps read zeros past the codes' own K);
// a_map over the activation codes and, at byte 256, w_map over the weight codes, both as rows of
// 16-bit pairs in boxes of (rows, 64 pairs = 128 codes) with the 128-byte swizzle; at byte 384 the
// fp32 activation scales: per token (m,), or with block scales per token per K block of 128,
// either (m, k / 128) rows or, for tiles of more than 16 tokens, transposed: (k / 128) rows of
// a_scale_stride (m rounded up to 4) at byte 392. Packed by humming_aot.w8a8 (448 bytes).
struct ScaledTmaGemmParams {
  TmaGemmParams tma;
  TensorMap w_map;
  const float* a_scale;
  int a_scale_stride;
};
static_assert(sizeof(ScaledTmaGemmParams) == 448,
              "ScaledTmaGemmParams is TmaGemmParams, the weights' tensor map, a pointer and padding to 64 bytes");

// What moves GemmParams from expert 0's weights to expert e's in the MoE schedules
// (kernel/grouped_masked.cuh, kernel/grouped_contiguous.cuh): the experts' global scales and the
// bytes between consecutive experts' packed codes, scales, zero points and biases (40 bytes).
struct ExpertWeights {
  const float* global_scales;  // (E,) each expert's fp32 global weight scale (GemmParams' is unused)
  i64 w_stride;                // bytes between experts' packed weights
  i64 scale_stride;            // bytes between experts' scales
  i64 zero_point_stride;       // bytes between experts' zero points (0 without them)
  i64 bias_stride;             // bytes between experts' biases (0 without them)

  __device__ __forceinline__ void move_to(GemmParams& p, int expert) const {
    p.global_scale = global_scales[expert];
    p.w = static_cast<const char*>(p.w) + expert * w_stride;
    p.w_scale = static_cast<const char*>(p.w_scale) + expert * scale_stride;
    if (p.w_zero_point != nullptr)
      p.w_zero_point = static_cast<const char*>(p.w_zero_point) + expert * zero_point_stride;
    if (p.bias != nullptr) p.bias = static_cast<const char*>(p.bias) + expert * bias_stride;
  }
};

// The Params of the grouped masked MoE GEMM (kernel/grouped_masked.cuh): the GemmParams of expert
// 0's slab (m: the slab's rows, max_m; k_splits 1), each expert's valid rows on the device, the
// experts' weights (ExpertWeights), the bytes between experts' activation and output slabs, the
// number of experts, and the rows' prefix offsets or nullptr. With offsets (the grouped contiguous
// layout with no alignment: expert e owns rows [row_offsets[e], row_offsets[e + 1]) of one (m, K)
// activation and one (m, N) output), expert_rows is unused and both strides are 0. Packed as
// GemmParams' bytes, then "<2Q7qQ" (184 bytes).
struct MaskedGemmParams {
  GemmParams gemm;
  const int* expert_rows;  // (E,) valid rows of each expert's slab, 0 <= rows <= gemm.m
  ExpertWeights weights;
  i64 a_stride;            // bytes between experts' activation slabs (max_m * lda * 2; 0 with offsets)
  i64 out_stride;          // bytes between experts' output slabs (max_m * ldo * 2; 0 with offsets)
  i64 experts;             // E
  const int* row_offsets;  // (E + 1,) prefix offsets of the experts' rows, or nullptr (slabs)
};
static_assert(sizeof(MaskedGemmParams) == 184,
              "MaskedGemmParams is GemmParams, a pointer, ExpertWeights, three i64 and a pointer");

// The Params of the grouped masked MoE GEMM (and its offsets form) on the warp-specialized TMA body
// (kernel/grouped_masked_ws.cuh): MaskedGemmParams, padding to byte 192, then the tensor map of
// every activation row: the (E x max_m, K) slabs end to end, or the offsets form's (R, K) rows,
// in boxes of the tile's rows x 64 (320 bytes).
struct MaskedTmaGemmParams {
  MaskedGemmParams masked;
  TensorMap a_map;
};
static_assert(sizeof(MaskedTmaGemmParams) == 320 && alignof(MaskedTmaGemmParams) == 64,
              "MaskedTmaGemmParams is MaskedGemmParams, padding to byte 192, then the 128-byte tensor map");

// The Params of the grouped masked MoE GEMM (and its offsets form) on the 8-bit-activation
// mma.sync bodies (kernel/dense_mma_w4a8.cuh, W4A8; kernel/dense_mma_ss.cuh, W8A8):
// MaskedGemmParams whose activation is 8-bit codes (gemm.a: rows of gemm.lda bytes; a_stride:
// bytes between experts' slabs of codes), then the rows' fp32 scales, the floats between experts'
// slabs of them (max_m rows' worth; 0 with offsets, whose rows index them directly), the codes'
// own K (W4A8: their row length, a multiple of 16; the body zero-fills codes past it) and the
// floats between one row's scales and the next's (1 per token; W8A8 block scales: K / 128).
// Packed as MaskedGemmParams' bytes, then "<Qq2i" (208 bytes).
struct MaskedScaledGemmParams {
  MaskedGemmParams masked;
  const float* a_scale;    // per activation row (block scales: a row of them): E x max_m rows for slabs, R with offsets
  i64 a_scale_stride;      // floats between experts' slabs of scales (0 with offsets)
  int a_k;                 // W4A8: the activation codes' own K
  int a_scale_row_stride;  // floats between consecutive rows' scales
};
static_assert(sizeof(MaskedScaledGemmParams) == 208,
              "MaskedScaledGemmParams is MaskedGemmParams, a pointer, an i64 and two ints");

// The Params of the grouped masked MoE GEMM (and its offsets form) on the warp-specialized Hopper
// 8-bit-activation bodies (kernel/grouped_masked_scaled_ws.cuh): MaskedScaledGemmParams (its a_k
// unused there: the map reads zeros past the codes' K), padding to byte 256, the tensor map of
// every activation row's codes (the (E x max_m, K) slabs end to end, or the offsets form's (R, K)
// rows) and, at byte 384, the weight codes' map over every expert's rows ((E x N, K): the W8A8
// body's; zeros for W4A8, whose codes come by bulk copy), both as 16-bit pairs in boxes of the
// tile's rows (channels) x 64 pairs with the 128-byte swizzle (512 bytes).
struct MaskedScaledTmaGemmParams {
  MaskedScaledGemmParams scaled;
  TensorMap a_map;
  TensorMap w_map;
};
static_assert(sizeof(MaskedScaledTmaGemmParams) == 512 && alignof(MaskedScaledTmaGemmParams) == 64,
              "MaskedScaledTmaGemmParams is MaskedScaledGemmParams, padding to byte 256, then two tensor maps");

// What a MoE schedule hands an 8-bit-activation mma.sync body for one tile's rows (device-side
// only, never packed): the rows' GemmParams (a: their codes, lda in bytes), their fp32 scales
// from the expert's first row on, the codes' own K (W4A8) and the floats between rows' scales.
struct ScaledRows {
  GemmParams gemm;
  const float* a_scale;
  int a_k;
  int a_scale_stride;
};

// The GemmParams part of what the MoE schedules hand a body (kernel/grouped_masked.cuh,
// grouped_contiguous.cuh): the 16-bit bodies' GemmParams itself, the 8-bit ones' ScaledRows' own.
__device__ __forceinline__ GemmParams& gemm_part(GemmParams& p) { return p; }
__device__ __forceinline__ GemmParams& gemm_part(ScaledRows& p) { return p.gemm; }

// What the block-scaled wgmma-ss K loops read of their Params (mainloop/fp8_promotion.cuh,
// fp8_token_major_blocks.cuh): the GemmParams whose w_scale, N and K locate the weight blocks'
// scales, and the token scales as rows (M of them, token_scale_row_stride floats apart, given the
// K blocks): the dense body's ScaledTmaGemmParams ((m, k_blocks) rows), or a MoE tile's
// ScaledRows (its expert's rows, a_scale_stride apart). (The W4A8 K loop reads its fold's span,
// group_size, through scale_gemm too: mainloop/int4_e4m3_groups.cuh, which the MoE schedule also
// hands its MaskedScaledGemmParams.)
__device__ __forceinline__ const GemmParams& scale_gemm(const ScaledTmaGemmParams& p) { return p.tma.gemm; }
__device__ __forceinline__ const GemmParams& scale_gemm(const ScaledRows& r) { return r.gemm; }
__device__ __forceinline__ const GemmParams& scale_gemm(const MaskedScaledGemmParams& s) { return s.masked.gemm; }
__device__ __forceinline__ const float* token_scale_rows(const ScaledTmaGemmParams& p) { return p.a_scale; }
__device__ __forceinline__ const float* token_scale_rows(const ScaledRows& r) { return r.a_scale; }
__device__ __forceinline__ int token_scale_row_stride(const ScaledTmaGemmParams&, int k_blocks) { return k_blocks; }
__device__ __forceinline__ int token_scale_row_stride(const ScaledRows& r, int) { return r.a_scale_stride; }
// Whether a K loop whose slots stage the K block's token scales (block scales above 16 tokens) finds
// its weight-block scales staged after them too: the MoE schedule's gathering warp stages both
// (kernel/grouped_masked_scaled_ws.cuh, ScaledRows), the dense body's producer the token scales only.
template <class Params>
struct StagedWeightScales {
  static constexpr bool kValue = false;
};
template <>
struct StagedWeightScales<ScaledRows> {
  static constexpr bool kValue = true;
};

// The Params of the grouped contiguous MoE GEMM (kernel/grouped_contiguous.cuh): the GemmParams of
// all the grouped rows with expert 0's weights (k_splits 1), each row's expert on the device, the
// experts' weights (ExpertWeights) and their number. Packed as GemmParams' bytes, then "<2Q5q"
// (160 bytes).
struct GroupedGemmParams {
  GemmParams gemm;        // m: every grouped row
  const int* row_expert;  // (m,) each row's expert, -1 for a padding row; every block of the tile's
                          // rows holds one expert's rows then padding, or padding only
  ExpertWeights weights;
  i64 experts;  // E: a block whose first row's id lies outside [0, E) is padding
};
static_assert(sizeof(GroupedGemmParams) == 160, "GroupedGemmParams is GemmParams, a pointer, ExpertWeights and an i64");

// The Params of the grouped contiguous MoE GEMM on the 8-bit-activation mma.sync bodies:
// GroupedGemmParams whose activation is 8-bit codes (gemm.a: every grouped row's, lda in bytes),
// then every row's fp32 scales, the codes' own K (W4A8) and the floats between rows' scales (1 per
// token; W8A8 block scales: K / 128). Packed as GroupedGemmParams' bytes, then "<Q2i" (176 bytes).
struct GroupedScaledGemmParams {
  GroupedGemmParams grouped;
  const float* a_scale;    // (m rows of a_scale_row_stride floats)
  int a_k;                 // W4A8: the activation codes' own K
  int a_scale_row_stride;  // floats between consecutive rows' scales
};
static_assert(sizeof(GroupedScaledGemmParams) == 176,
              "GroupedScaledGemmParams is GroupedGemmParams, a pointer and two ints");

// Exported beside each kernel as `extern "C" __constant__ KernelMetadata <kernel symbol>_metadata`
// (256 bytes; humming_aot.spec.metadata_symbol).
struct KernelMetadata {
  u32 magic;           // kMetadataMagic
  u32 params_version;  // kParamsVersion the kernel was compiled against
  u32 params_bytes;    // sizeof(GemmParams)
  u32 threads;         // threads per CTA
  u32 smem_bytes;      // dynamic shared memory per CTA
  u32 block_m, block_n, block_k;
  char name[224];  // the KernelKey name (also the kernel's symbol)
};
static_assert(sizeof(KernelMetadata) == 256, "KernelMetadata is read back as 256 bytes");

}  // namespace humming_aot::kernel
