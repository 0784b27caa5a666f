"""The stream-K fix-up's scaled fp16 partials (epilogue/half_slot_vectors.cuh) on the GPU: tiles cut
into many parts (so that heads add several partials), a ragged last column tile (whose stale
columns must not set a thread's scale), activation rows 1e7 apart in magnitude in one tile (one
scale per thread spans them; it keeps fp16's precision within 2^28), rows of +-Inf and NaN (which
set no scale and must come out where the float64 reference has them), against the float64
reference of the exact operands into a NaN-poisoned output, the same bits twice. Reached through
the catalog where it holds the key, else the JIT."""
from __future__ import annotations

import os

import pytest
import torch
from test_swapped_tiles import _kernel_or_skip  # the catalog's key of a forced tile, else the JIT's

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.testing.numerics import assert_bitwise_equal, assert_gemm_close, reference_gemm, with_every_code


def _why_not() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if dispatch.device_info(torch.cuda.current_device()).arches[0] != "sm90a":
        return "the stream-K schedule is the wgmma-ws body's (sm90a)"
    return None


_WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

TILES = ("wgmma-ws:128x128x64_w1x4_s4", "wgmma-ws:32x128x64_w1x4_s8", "wgmma-ws:144x256x64_w1x8_s4")


@pytest.mark.parametrize("fmt", ["int4:g128", "float8e4m3:channel"])
@pytest.mark.parametrize("tile", TILES)
def test_partials_of_rows_ten_million_times_apart_and_of_inf_and_nan_rows(tile, fmt):
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    # 6 or 3 column tiles whose last is part past N (its stale columns must not set a thread's
    # scale), 64 K tiles: stream-K cuts each into many parts
    n, k = 704, 4096
    w = torch.randn(n, k, device="cuda", generator=gen) * 0.05
    packed = humming_aot.pack(with_every_code(humming_aot.quantize(w, fmt), gen), act_dtype=torch.bfloat16)
    key = _kernel_or_skip(packed, tile)
    w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
    m = key.tile.block_m - 3  # a ragged last row block
    a = torch.randn(m, k, device="cuda", generator=gen)
    # a row 1e-4 of its neighbours' size and one 1e3: 1e7 apart, inside the 2^28 a thread's
    # scale keeps at fp16's full precision, in the same threads' partials (rows 2t and 2t + 1 of
    # a tile share a thread: epilogue/column_major_writer.cuh WarpgroupFragments)
    a[0] *= 1e3
    a[1] *= 1e-4
    # non-finite values in the first K tile (the head's own sum) and in the last (a later part's,
    # through a scaled fp16 partial: every tile here is cut into three or more parts)
    a[4, 7] = float("inf")
    a[5, 9] = float("-inf")
    a[6, 11] = float("nan")
    a[9, k - 7] = float("inf")
    a[10, k - 20] = float("-inf")
    a[11, k - 40] = float("nan")
    a = a.to(torch.bfloat16)
    ref = reference_gemm(a, w_eff, None)
    tiles = -(-m // key.tile.block_m) * -(-n // key.tile.block_n)
    spec = ops.gemm_spec(packed)
    for ctas in sorted({tiles * 3, tiles * 8, 64}):
        context = f"tile={tile} fmt={fmt} m={m} n={n} k={k} stream_k={ctas} seed={seed}"
        outs = []
        for _ in range(2):
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            outs.append(dispatch.launch_gemm(a, packed, None, spec, tile=key.tile, out=out, stream_k=ctas))
        assert_gemm_close(outs[0], ref, a=a, w_eff=w_eff, context=context)
        # the small row on its own: its error against its own magnitude, not its tile's
        small = (outs[0][1].double() - ref[1]).abs().max() / ref[1].abs().max()
        assert small < 2 ** -7, f"{context}: the 1e-4 row is off by {float(small):.3g} of its largest output"
        assert_bitwise_equal(outs[0], outs[1], context)
