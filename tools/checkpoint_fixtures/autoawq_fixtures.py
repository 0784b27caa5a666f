"""AWQ GEMM fixture written by AutoAWQ 0.2.9 (its own venv, transformers 4.51.3), CPU only.

The base model is re-saved by this venv's transformers in float16 (same seed, same weights),
quantized with ``{"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}`` on 32
random lists of 60 token ids, and saved. The reference is
``awq.utils.packing_utils.dequantize_gemm(qweight, qzeros, scales, 4, 128)`` (float16, (K, N),
stored transposed to (N, K)).

    python autoawq_fixtures.py WORK_DIR OUT_DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from prune import prune  # noqa: E402

KEEP_LAYERS = ("model.layers.0.self_attn.k_proj",)


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    base = work / "base_fp16"
    subprocess.run([sys.executable, str(Path(__file__).parent / "base_model.py"), str(base), "--dtype", "float16"],
                   check=True)
    from awq import AutoAWQForCausalLM
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(str(base), torch_dtype=torch.float16, device_map="cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    gen = torch.Generator().manual_seed(2)
    calib = [torch.randint(3, 1024, (60,), generator=gen).tolist() for _ in range(32)]
    model.quantize(tokenizer, quant_config={"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"},
                   calib_data=calib, n_parallel_calib_samples=None, max_calib_samples=16, max_calib_seq_len=64)
    full = work / "awq_gemm"
    model.save_quantized(str(full))
    dst = out / "awq_gemm_4bit"
    prune(full, dst, KEEP_LAYERS)
    ref = {}
    with safe_open(str(dst / "model.safetensors"), framework="pt") as f:
        for prefix in KEEP_LAYERS:
            w = dequantize_gemm(f.get_tensor(prefix + ".qweight"), f.get_tensor(prefix + ".qzeros"),
                                f.get_tensor(prefix + ".scales"), 4, 128)
            ref[prefix] = w.t().contiguous().to(torch.float16)
    save_file(ref, str(dst / "reference.safetensors"),
              metadata={"producer": "autoawq==0.2.9", "reference": "awq.utils.packing_utils.dequantize_gemm, float16"})
    (dst / "PRODUCER").write_text(json.dumps({"producer": "autoawq==0.2.9", "transformers": "4.51.3"}) + "\n")
    print("wrote", dst, flush=True)


if __name__ == "__main__":
    main()
