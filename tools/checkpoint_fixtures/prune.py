"""Shared by the fixture scripts: keep a few layers of a producer's output directory, so that the
committed fixtures stay small (no embeddings, no lm_head)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

KEEP = ("model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj")


def prune(src: str | Path, dst: str | Path, keep=KEEP, extra_json=("hf_quant_config.json",)) -> list[str]:
    """Copy config.json (and extra_json files) and the tensors of the ``keep`` layers from src's
    safetensors file(s) into dst/model.safetensors; returns the tensor names kept."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    keep_config = {k: config[k] for k in ("architectures", "model_type", "torch_dtype", "dtype",
                                           "quantization_config") if k in config}
    (dst / "config.json").write_text(json.dumps(keep_config, indent=2, sort_keys=True) + "\n")
    for name in extra_json:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    tensors = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if any(name.startswith(p + ".") or name.startswith(p + "_") for p in keep):
                    tensors[name] = f.get_tensor(name)
    save_file(tensors, str(dst / "model.safetensors"))
    return sorted(tensors)
