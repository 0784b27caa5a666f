"""The driver's count of resident thread-block clusters (humming_aot._C.max_active_clusters) on the
GPU, and the split-K count the dispatcher takes from it for the swapped 8-row tile, which sums its K
slices in a cluster of that many CTAs (docs/performance/log.md section 25)."""
from __future__ import annotations

import pytest
import torch

import humming_aot
from humming_aot import _launcher, dispatch, ops
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm


def _loaded_decode_kernel(n: int, k: int):
    packed = humming_aot.pack(humming_aot.quantize(torch.randn(n, k) * 0.02, "int4:g128"), act_dtype=torch.bfloat16,
                              device="cuda")
    spec = ops.gemm_spec(packed)
    key, loaded = dispatch.obtain(spec, torch.cuda.current_device(), 1, None, k, packed.group_size, n=n)
    return packed, spec, key, loaded


def _needs_clusters():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90+")


def test_cluster_counts_shrink_with_the_cluster_and_start_at_the_resident_ctas():
    _needs_clusters()
    _, _, key, loaded = _loaded_decode_kernel(4096, 4096)
    assert key.reduces_splits_in_cluster, key.name
    device = loaded.device
    counts = {size: _launcher.max_active_clusters(loaded.kernel, (loaded.threads, 1, 1), loaded.smem_bytes,
                                                  (1, size, 1), device) for size in range(1, 9)}
    if counts[1] == 0:
        pytest.skip("this driver cannot count clusters (no cuOccupancyMaxActiveClusters)")
    info = dispatch.device_info(device)
    assert counts[1] == info.num_sms * dispatch._resident_ctas(loaded, key.tile, info), counts
    for size in range(2, 9):
        assert 0 < counts[size] <= counts[size - 1] and size * counts[size] <= counts[1], counts


def test_the_automatic_split_keeps_every_tiles_cluster_resident():
    _needs_clusters()
    packed, spec, key, loaded = _loaded_decode_kernel(4096, 4096)  # 32 tiles of 8 x 128
    stream = torch.cuda.current_stream().cuda_stream
    plan = dispatch.launch_plan(spec, loaded.device, stream, 1, packed.n, packed.k, packed.group_size)
    assert plan.clustered and plan.cluster == (1, plan.splits, 1)
    tiles = packed.n // key.tile.block_n

    def fits(size: int) -> int:
        return _launcher.max_active_clusters(loaded.kernel, (loaded.threads, 1, 1), loaded.smem_bytes, (1, size, 1),
                                             loaded.device)

    if fits(2) == 0:
        pytest.skip("this driver cannot count clusters (no cuOccupancyMaxActiveClusters)")
    assert 2 <= plan.splits <= dispatch.MAX_CLUSTER_SPLITS and tiles <= fits(plan.splits)
    # the largest such split: one more slice would not fit, or the table's count (8 here) was reached
    assert plan.splits == dispatch.MAX_CLUSTER_SPLITS or tiles > fits(plan.splits + 1)
    a = torch.randn(1, packed.k, device="cuda").bfloat16()
    out = torch.full((1, packed.n), float("nan"), device="cuda", dtype=torch.bfloat16)
    dispatch.launch_gemm(a, packed, None, spec, out=out)
    w_eff = packed.effective_weight(scales_in_fp32=key.scales_in_fp32)
    assert_gemm_close(out, reference_gemm(a, w_eff), a=a, w_eff=w_eff, context=f"{key.name} splits={plan.splits}")
