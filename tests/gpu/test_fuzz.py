"""Seeded fuzz tier: random M, N, K, group size, weight format and activation dtype through the
public path (quantize -> pack -> ops.gemm, heuristic tile and split-K), against the float64
reference of exactly the operands the kernel multiplies (fresh data, NaN-poisoned
output, the one tolerance helper).

Every run draws a new master seed and prints it; HUMMING_AOT_FUZZ_SEED=<seed> replays a run and
HUMMING_AOT_FUZZ_CASES sets how many cases it draws (default 64)."""
from __future__ import annotations

import math
import os
import random

import pytest
import torch

import humming_aot
from humming_aot import dispatch, ops
from humming_aot.testing.numerics import assert_gemm_close, reference_gemm, with_every_code

_INT = [f"int{b}" for b in range(1, 9)]
_UINT_ZP = [f"uint{b}:{{gran}}:{zp}" for b in range(1, 9) for zp in ("zp", "zpf")]
_FLOAT_ANY = ["float4e2m1", "float6e3m2", "float6e2m3", "float8e4m3", "float8e5m2", "float5e2m2", "float7e3m3",
              "float4e0m3", "float3e1m1", "float8e0m7"]
_FLOAT_BF16_ONLY = ["float7e5m1", "float8e6m1", "float6e5m0"]
_PRESETS = {"mxfp4": 32, "nvfp4": 16, "mxfp8": 32, "mxfp6e3m2": 32}


def _master_seed() -> int:
    text = os.environ.get("HUMMING_AOT_FUZZ_SEED")
    return int(text) if text else int.from_bytes(os.urandom(4), "little")


MASTER_SEED = _master_seed()
CASES = int(os.environ.get("HUMMING_AOT_FUZZ_CASES", "64"))


def _draw(rng: random.Random) -> dict:
    act = rng.choice(["bfloat16", "float16"])
    kind = rng.choice(["int", "uint_zp", "float", "preset", "tensor", "block"])
    group = rng.choice([16, 32, 64, 128, 192, 256, None])
    gran = "channel" if group is None else f"g{group}"
    if kind == "int":
        fmt = f"{rng.choice(_INT)}:{gran}"
    elif kind == "uint_zp":
        fmt = rng.choice(_UINT_ZP).format(gran=gran)
    elif kind == "float":
        pool = _FLOAT_ANY + (_FLOAT_BF16_ONLY if act == "bfloat16" else [])
        fmt = f"{rng.choice(pool)}:{gran}"
    elif kind == "preset":
        fmt = rng.choice(sorted(_PRESETS))
        group = _PRESETS[fmt]
    elif kind == "tensor":
        fmt, group = f"{rng.choice(['int8', 'int4', 'float8e4m3'])}:tensor", None
    else:  # block scales: the block's K extent is the group
        group = rng.choice([64, 128])
        fmt = f"{rng.choice(['float8e4m3', 'int8'])}:b{rng.choice([64, 128, 96])}x{group}"
    step = 64 if group is None else math.lcm(64, group)  # the kernels' alignment rule
    k = step * rng.randint(1, max(1, 2304 // step))
    n = 64 * rng.randint(1, 40)
    m = rng.choice([1, 2, 3, 5, 8, 13, 16, 17, 31, 64, 100, 129, 255, 513, 1000, 2049])
    return {"act": act, "fmt": fmt, "m": m, "n": n, "k": k, "seed": rng.getrandbits(32)}


def _cases() -> list:
    rng = random.Random(MASTER_SEED)
    return [pytest.param(_draw(rng), id=f"case{i}") for i in range(CASES)]


def test_fuzz_seed_is_reported(capsys):
    with capsys.disabled():
        print(f"\nfuzz master seed {MASTER_SEED} ({CASES} cases): replay with HUMMING_AOT_FUZZ_SEED={MASTER_SEED}")
    assert CASES > 0


@pytest.mark.parametrize("case", _cases())
def test_fuzz_public_gemm(case):
    act = getattr(torch, case["act"])
    m, n, k = case["m"], case["n"], case["k"]
    context = f"{case} master_seed={MASTER_SEED}"
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    # integer codes drawn over every value of the element (the int1 recipe quantizes to all zeros)
    qw = with_every_code(humming_aot.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05, case["fmt"]), gen)
    packed = humming_aot.pack(qw, act_dtype=act)
    a = torch.randn(m, k, device="cuda", generator=gen).to(act)
    bias = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(act) if case["seed"] % 2 else None
    out = torch.full((m, n), float("nan"), dtype=act, device="cuda")
    dispatch.launch_gemm(a, packed, bias, ops.gemm_spec(packed), out=out)
    w_eff = ops.effective_weight(packed, m)  # the dispatched kernel's operand (scales rounded or not)
    assert_gemm_close(out, reference_gemm(a, w_eff, bias), a=a, w_eff=w_eff, bias=bias, context=context)
