"""auto-round fixtures written by auto-round 0.15.1 (RTN: ``iters=0, disable_opt_rtn=True``, no
calibration data), CPU only. sym=True exports ``auto_round:auto_gptq`` (GPTQ v1 tensors without
g_idx), sym=False ``auto_round:auto_awq`` (AWQ GEMM tensors). auto-round has no standalone
dequantizer for its export, so the reference is the original bf16 weight (the shared
llama_original/original.safetensors that modelopt_fixtures.py writes) and the tests check the
int4 g128 error band.

    python autoround_fixtures.py BASE_DIR WORK_DIR OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from prune import prune  # noqa: E402

PREFIX = "model.layers.0.self_attn.k_proj"


def main() -> None:
    base, work, out = (Path(a) for a in sys.argv[1:4])
    from auto_round import AutoRound
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for sym in (True, False):
        model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(str(base))
        ar = AutoRound(model, tokenizer, bits=4, group_size=128, sym=sym, iters=0, device_map="cpu",
                       disable_opt_rtn=True)
        full = work / f"autoround_{'sym' if sym else 'asym'}"
        ar.quantize_and_save(str(full), format="auto_round")
        dst = out / f"autoround_4bit_{'sym' if sym else 'asym'}"
        sub = next(p for p in [full, *full.iterdir()] if p.is_dir() and (p / "config.json").exists())
        prune(sub, dst, (PREFIX,))
        (dst / "PRODUCER").write_text(json.dumps({"producer": "auto-round==0.15.1", "sym": sym}) + "\n")
        print("wrote", dst, flush=True)


if __name__ == "__main__":
    main()
