"""ModelOpt fixtures written by nvidia-modelopt 0.47.0 (``mtq.quantize`` + ``export_hf_checkpoint``),
CPU only, on the base Llama. ModelOpt has no standalone dequantizer for its exported files, so the
reference is the original float weight (one file shared with the auto-round fixtures, ``llama_original/original.safetensors``)
and the tests check the error band (and that an inverted scale falls outside it).

    python modelopt_fixtures.py BASE_DIR WORK_DIR OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from prune import prune  # noqa: E402

CONFIGS = ("FP8_DEFAULT_CFG", "FP8_PER_CHANNEL_PER_TOKEN_CFG", "FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG",
           "NVFP4_DEFAULT_CFG", "INT4_AWQ_CFG", "MXFP4_DEFAULT_CFG", "MXFP8_DEFAULT_CFG")
# W4A16_NVFP4 writes the NVFP4 weight layout again
# k_proj (128 x 256); INT4_AWQ also o_proj, whose pre_quant_scale cannot be folded into a norm
KEEP = {"INT4_AWQ_CFG": ("model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj")}
DEFAULT_KEEP = ("model.layers.0.self_attn.k_proj",)


def main() -> None:
    base, work, out = (Path(a) for a in sys.argv[1:4])
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    with safe_open(str(base / "model.safetensors"), framework="pt") as f:
        originals = {p: f.get_tensor(p + ".weight") for p in KEEP["INT4_AWQ_CFG"]}
    (out / "llama_original").mkdir(parents=True, exist_ok=True)
    save_file(originals, str(out / "llama_original" / "original.safetensors"),
              metadata={"what": "the bf16 weights ModelOpt quantized (no producer dequantizer exists)"})
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(3, 1024, (1, 32), generator=gen) for _ in range(4)]
    for name in sys.argv[4:] or CONFIGS:
        model = LlamaForCausalLM.from_pretrained(str(base), torch_dtype=torch.bfloat16)

        def loop(m):
            for ids in batches:
                m(ids)

        mtq.quantize(model, getattr(mtq, name), forward_loop=loop)
        full = work / f"modelopt_{name.lower()}"
        export_hf_checkpoint(model, export_dir=str(full))
        dst = out / f"modelopt_{name.lower().removesuffix('_cfg')}"
        prune(full, dst, KEEP.get(name, DEFAULT_KEEP))
        (dst / "PRODUCER").write_text(json.dumps({"producer": "nvidia-modelopt==0.47.0", "config": name}) + "\n")
        print("wrote", dst, flush=True)


if __name__ == "__main__":
    main()
