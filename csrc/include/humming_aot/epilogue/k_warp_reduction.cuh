#pragma once
// The sum over the K warps of a CTA (kWarpsK > 1) of the mma.sync bodies, between the K loop and
// the output writers: every K warp parks its accumulators in the pipeline's shared memory, then
// each sums one share of the fragments over all K warps. SM75+. The caller has waited for every
// cp.async (the parking slots reuse the stages); the sum runs in K-warp order, deterministically.

#include <humming_aot/numerics/types.cuh>

namespace humming_aot::epilogue {

template <int kWarpsM, int kWarpsN,  // warp grid over the output tile (warp_mn = warp_m * kWarpsN + warp_n)
          int kWarpsK,               // warps sharing the K steps of a stage: 1 (nothing to sum), 2 or 4
          int kMTiles, int kNTiles>  // accumulator fragments per warp: m16 tiles x n tiles, 4 floats a lane
struct KWarpReduction {
  static_assert(kNTiles % kWarpsK == 0, "the K warps share the fragments evenly");

  static constexpr int kShareTiles = kNTiles / kWarpsK;  // fragments each K warp sums and writes
  // Parked accumulators: slot-major (slot, kWarpsM * kWarpsN, kParkedValues, 32 lanes) floats.
  static constexpr int kParkedValues = kMTiles * kNTiles * 4;  // floats per lane of one warp
  // shared memory the parking takes (none with one K warp)
  static constexpr int kBytes = (kWarpsK == 1 ? 0 : kWarpsK) * kWarpsM * kWarpsN * kMTiles * kNTiles * 4 * 32 * 4;

  // This lane's first float in `slot` of the warps (warp_m, warp_n) = warp_mn.
  static __device__ __forceinline__ float* parked_lane(char* smem, int slot, int warp_mn) {
    return reinterpret_cast<float*>(smem) + (slot * kWarpsM * kWarpsN + warp_mn) * kParkedValues * 32 +
           (threadIdx.x & 31);
  }
  // Offset of value (mi, ni, e) from a lane's first float.
  static __device__ __forceinline__ int parked_offset(int mi, int ni, int e) {
    return ((mi * kNTiles + ni) * 4 + e) * 32;
  }

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
  // order (the order one warp accumulating them would use), fragments [w * kShareTiles,
  // + kShareTiles) over all K warps of its (warp_m, warp_n), into `share`. The split-K stores and
  // the last CTA's reduction then run on every warp of the CTA instead of one warp per K group.
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
};

}  // namespace humming_aot::epilogue
