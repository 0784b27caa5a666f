"""The host side of the kernels' argument ABI (csrc/include/humming_aot/kernel/params.cuh), in one
place: the version every kernel's metadata must carry, and the byte layouts the launcher passes.

- ``GemmParams``: 8 pointers, lda, ldo, 5 ints and the fp32 global scale (104 bytes).
- ``TmaGemmParams`` (the warp-specialized TMA body): GemmParams, the schedule (three ints:
  dp_ctas, tail_splits, stream_k), zero padding to byte 128, then the activations' 128-byte
  CUtensorMap (256 bytes).
- ``MaskedGemmParams`` (the grouped masked MoE GEMM around the mma.sync bodies): GemmParams of
  expert 0's slab, a pointer to the experts' row counts (int32), ``ExpertWeights`` (a pointer to
  the experts' fp32 global scales and the byte strides between experts' codes, scales, zero points
  and biases), then the byte strides between experts' activation and output slabs, the number
  of experts and a pointer to the rows' prefix offsets (int32, E + 1; 0 for slabs) (184 bytes).
- ``GroupedGemmParams`` (the grouped contiguous MoE GEMM around the mma.sync bodies): GemmParams
  of all the grouped rows with expert 0's weights, a pointer to the rows' experts (int32),
  ``ExpertWeights`` and the number of experts (160 bytes).

Contract changes bump PARAMS_VERSION together with the header's kParamsVersion: 1 GemmParams; 2
kernels wait on griddepcontrol before reading upstream data, so the launcher may launch them with
programmatic dependent launch; 3 the last GemmParams field is the fp32 global weight scale; 4 the
8-row tiles of sm_90+ launched with cluster dims (1, k_splits, 1) sum their K slices inside the
cluster; 5 TmaGemmParams' third schedule int switches the TMA body to stream-K; 6 the W4A8 body's
weight codes are in packed layout version 2 (humming_aot.w4a8: a kernel built before reads them
as version 1's table indices, which would be wrong values, so catalogs built before are refused). (A body with a
Params struct of its own, as TmaGemmParams, adds a layout, not a version: the kernel's metadata
records its size, which every launch checks. The grouped contiguous schedule's grid became
persistent, its Params unchanged, without a version: no catalog holds the MoE kernels, and the JIT
cache keys each build on the headers' text. MaskedGemmParams grew from 176 to 184 bytes for the
offsets form: a masked kernel built before it is refused by the size check; GroupedGemmParams grew
from 152 to 160 bytes for the number of experts, below which a block's id must lie, the same way.)
"""
from __future__ import annotations

import struct

PARAMS_VERSION = 6

GEMM_PARAMS = struct.Struct("<8Q2q5if")
TMA_SCHEDULE = struct.Struct("<3i")  # dp_ctas, tail_splits, stream_k
TMA_MAP_OFFSET = 128
TMA_MAP_BYTES = 128
TMA_PADDING = bytes(TMA_MAP_OFFSET - GEMM_PARAMS.size - TMA_SCHEDULE.size)
TMA_PARAMS_BYTES = TMA_MAP_OFFSET + TMA_MAP_BYTES
# ExpertWeights (kernel/params.cuh): global_scales, then the w, scale, zero point and bias strides
EXPERT_WEIGHTS = struct.Struct("<Q4q")
# expert_rows, ExpertWeights, a and out strides, experts, row_offsets
MASKED_TAIL = struct.Struct("<Q" + EXPERT_WEIGHTS.format[1:] + "3qQ")
MASKED_PARAMS_BYTES = GEMM_PARAMS.size + MASKED_TAIL.size
GROUPED_TAIL = struct.Struct("<Q" + EXPERT_WEIGHTS.format[1:] + "q")  # row_expert, ExpertWeights, experts
GROUPED_PARAMS_BYTES = GEMM_PARAMS.size + GROUPED_TAIL.size

# Byte offsets of the fields a launch fills in per call (the rest of the Params bytes are fixed
# per launch plan): the launcher's PlannedLaunch writes them into a copy of the plan's template.
POINTER_OFFSETS = tuple(8 * i for i in range(7))  # a, w, w_scale, w_zero_point, bias, out, workspace
LDA_OFFSET = struct.calcsize("<8Q")
LDO_OFFSET = struct.calcsize("<8Qq")
GLOBAL_SCALE_OFFSET = struct.calcsize("<8Q2q5i")
