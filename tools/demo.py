"""A first GEMM from the installed catalog, checked against a float64 reference (or, without a
GPU, the CPU reference path)."""
import time

import torch

import humming_aot
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n, k, m = 4096, 4096, 16
    w = torch.randn(n, k) * 0.02
    packed = humming_aot.pack(humming_aot.quantize(w, "int4:g128"), act_dtype=torch.bfloat16, device=device)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    out = humming_aot.ops.gemm(a, packed)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    w_eff = packed.dequantized()
    assert_gemm_close(out, reference_gemm(a, w_eff), a=a, w_eff=w_eff, context="demo")
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU reference path (no GPU)"
    print(f"W4A16 int4 g128 GEMM {m}x{n}x{k} on {where}: first call {elapsed * 1e3:.1f} ms, matches float64 reference")


if __name__ == "__main__":
    main()
