"""Fixtures from transformers 5.24.0 (CPU):

* fp8_block_float / fp8_block_ue8m0: DeepSeek-style fp8. transformers refuses to quantize fp8
  without a GPU in from_pretrained, but its ``Fp8Quantize`` op is pure torch; it is driven directly
  on the base model's ``model.layers.0.self_attn.k_proj.weight`` (128 x 256, bf16) with
  ``FineGrainedFP8Config(weight_block_size=[128, 128], scale_fmt=...)``. Reference: transformers'
  ``_dequantize_fp8_weight`` in bfloat16.
* gptoss_mxfp4: there is no CPU writer of gpt-oss MXFP4 (the quantizer needs GPU kernels), so the
  fixture is random bytes in the release's layout (blocks (2, 64, 8, 16), scales in [110, 140)) and
  the reference is transformers' own decoder ``convert_moe_packed_tensors`` (transposed back to
  (E, N, K)), which is what the loader must agree with.

    python transformers_fixtures.py BASE_DIR OUT_DIR
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch

PREFIX = "model.layers.0.self_attn.k_proj"


def fp8(base: Path, out: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    with safe_open(str(base / "model.safetensors"), framework="pt") as f:
        weight = f.get_tensor(PREFIX + ".weight")
    for scale_fmt in ("float", "ue8m0"):
        config = FineGrainedFP8Config(weight_block_size=[128, 128], activation_scheme="dynamic", scale_fmt=scale_fmt,
                                      modules_to_not_convert=["lm_head"])
        op = Fp8Quantize(types.SimpleNamespace(quantization_config=config))
        tensors = op.convert({PREFIX + ".weight": weight})
        dst = out / f"fp8_block_{scale_fmt}"
        dst.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
        (dst / "config.json").write_text(json.dumps({"quantization_config": config.to_dict()}, indent=2,
                                                    sort_keys=True, default=str) + "\n")
        ref = _dequantize_fp8_weight(tensors[PREFIX + ".weight"], tensors[PREFIX + ".weight_scale_inv"], [128, 128],
                                     torch.bfloat16)
        # the float weight is llama_original/original.safetensors (modelopt_fixtures.py)
        save_file({PREFIX: ref.contiguous()},
                  str(dst / "reference.safetensors"),
                  metadata={"producer": "transformers==5.24.0",
                            "reference": "integrations.finegrained_fp8._dequantize_fp8_weight in bfloat16"})
        (dst / "PRODUCER").write_text(json.dumps({"producer": "transformers==5.24.0 Fp8Quantize",
                                                  "scale_fmt": scale_fmt}) + "\n")
        print("wrote", dst, flush=True)


def gpt_oss(out: Path) -> None:
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (2, 64, 8, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(110, 140, (2, 64, 8), generator=gen, dtype=torch.uint8)
    prefix = "model.layers.0.mlp.experts.gate_up_proj"
    dst = out / "gptoss_mxfp4"
    dst.mkdir(parents=True, exist_ok=True)
    save_file({prefix + "_blocks": blocks, prefix + "_scales": scales}, str(dst / "model.safetensors"))
    config = {"model_type": "gpt_oss", "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}}
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    ref = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.bfloat16)  # (E, K, N)
    save_file({prefix: ref.transpose(-1, -2).contiguous()}, str(dst / "reference.safetensors"),
              metadata={"producer": "transformers==5.24.0 (random bytes; no CPU writer exists)",
                        "reference": "integrations.mxfp4.convert_moe_packed_tensors in bfloat16, transposed"})
    (dst / "PRODUCER").write_text(json.dumps({"producer": "random bytes in the gpt-oss layout",
                                              "reference": "transformers==5.24.0 convert_moe_packed_tensors"}) + "\n")
    print("wrote", dst, flush=True)


def main() -> None:
    base, out = Path(sys.argv[1]), Path(sys.argv[2])
    fp8(base, out)
    gpt_oss(out)


if __name__ == "__main__":
    main()
