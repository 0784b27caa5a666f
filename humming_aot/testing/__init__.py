"""Helpers shared by the tests and the benchmarks, shipped in the wheel so integrations can use
the same tolerance rule.

- ``numerics``: ``reference_gemm`` (float64 reference on the kernel's exact operands),
  ``assert_gemm_close`` (the one tolerance rule), ``assert_bitwise_equal``, ``poison_like``,
  ``random_activation``, ``with_every_code``.
- ``bench``: ``time_cuda_graph`` (CUDA-graph replays over inputs rotated past L2), throughput
  helpers. Imported on use: ``humming_aot.testing.bench``.
"""
from humming_aot.testing.numerics import (
    ACCUMULATION_ERROR_MULTIPLIER,
    RMS_ULP_FLOOR,
    assert_bitwise_equal,
    assert_gemm_close,
    poison_like,
    random_activation,
    reference_gemm,
    tile_max,
    ulp,
    with_every_code,
)

__all__ = [
    "ACCUMULATION_ERROR_MULTIPLIER",
    "RMS_ULP_FLOOR",
    "assert_bitwise_equal",
    "assert_gemm_close",
    "poison_like",
    "random_activation",
    "reference_gemm",
    "tile_max",
    "ulp",
    "with_every_code",
]
