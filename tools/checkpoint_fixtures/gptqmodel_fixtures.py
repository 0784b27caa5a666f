"""GPTQ fixtures written by GPTQModel 7.7.0 (venv: see make_all.sh), CPU only.

For each run: quantize the base model with 16 random calibration samples, save, reload with the
TORCH backend in float16 and store each kept layer's ``dequantize_weight()`` (transposed to
(N, K)) as the reference. Outputs go to OUT/gptq_<name>/.

    GPTQMODEL_CPU_WORKERS=2 python gptqmodel_fixtures.py BASE_DIR WORK_DIR OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from prune import prune  # noqa: E402

KEEP_LAYERS = ("model.layers.0.self_attn.k_proj",)  # N=128, K=256: small, two groups of 128
RUNS = {  # name: (bits, sym, desc_act, format)
    "4bit_sym_v1": (4, True, False, "gptq"),
    "4bit_asym_v1": (4, False, False, "gptq"),
    "4bit_asym_v2": (4, False, False, "gptq_v2"),
    "4bit_actorder_v1": (4, True, True, "gptq"),
    "3bit_sym_v1": (3, True, False, "gptq"),
    "2bit_asym_v1": (2, False, False, "gptq"),
    "8bit_sym_v1": (8, True, False, "gptq"),
}


def main() -> None:
    base, work, out = (Path(a) for a in sys.argv[1:4])
    only = sys.argv[4:] or list(RUNS)
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(1)
    calib = [{"input_ids": torch.randint(3, 1024, (1, 64), generator=gen),
              "attention_mask": torch.ones(1, 64, dtype=torch.long)} for _ in range(16)]
    for name in only:
        bits, sym, desc_act, fmt = RUNS[name]
        qc = QuantizeConfig(bits=bits, group_size=128, desc_act=desc_act, sym=sym, format=fmt)
        model = GPTQModel.load(str(base), qc, device="cpu")
        model.quantize(calib, batch_size=1)
        full = work / f"gptq_{name}"
        model.save(str(full))
        del model
        dst = out / f"gptq_{name}"
        prune(full, dst, KEEP_LAYERS)
        reloaded = GPTQModel.load(str(full), device="cpu", backend=BACKEND.TORCH, dtype=torch.float16)
        modules = dict(reloaded.model.named_modules())
        ref = {}
        for prefix in KEEP_LAYERS:
            module = modules[prefix]
            ref[prefix] = module.dequantize_weight().t().contiguous().to(torch.float16)
        save_file(ref, str(dst / "reference.safetensors"),
                  metadata={"producer": "gptqmodel==7.7.0", "reference": "TorchLinear.dequantize_weight() in float16"})
        (dst / "PRODUCER").write_text(json.dumps({"producer": "gptqmodel==7.7.0", "run": name}) + "\n")
        print("wrote", dst, flush=True)


if __name__ == "__main__":
    main()
