"""compressed-tensors fixtures written by compressed-tensors 0.20.0 alone (no llmcompressor), CPU.

For each preset: one nn.Linear(256, 64) in bf16 registered as ``proj``, the preset's scheme
applied, the observer replaced by plain min / max of the weight per the scheme's strategy (the
global scale first for NVFP4), ``calculate_qparams`` for the scales / zero points, then
``ModelCompressor.compress_model`` and ``update_config``. The reference is the compressor's own
``decompress`` of the saved tensors, plus, for a few presets, the original bf16 weight (``proj.original``).

    python ct_fixtures.py OUT_DIR [PRESET ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

# FP8 (tensor scale) and NVFP4 (activations too) write weight layouts already covered by FP8_DYNAMIC
# + ModelOpt FP8 and NVFP4A16; they are left out to keep the committed fixtures small
PRESETS = ("W4A16", "W4A16_ASYM", "W8A16", "W3A16", "W2A16", "W8A8", "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16",
           "MXFP4A16", "MXFP8A16")
KEEP_ORIGINAL = ("W4A16", "NVFP4A16", "MXFP4A16")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(256, 64, bias=False)


def _minmax(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    strategy = str(args.strategy.value if hasattr(args.strategy, "value") else args.strategy)
    n, k = w.shape
    if strategy == "tensor":
        return w.amin().reshape(1), w.amax().reshape(1)
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if strategy in ("group", "tensor_group"):
        g = args.group_size
        v = w.reshape(n, k // g, g)
        return v.amin(dim=-1), v.amax(dim=-1)
    if strategy == "block":
        bn, bk = args.block_structure  # a partial last block (N = 64 < 128) takes the rows it has
        pad_n, pad_k = -n % bn, -k % bk
        lo = torch.nn.functional.pad(w, (0, pad_k, 0, pad_n), value=float("inf"))
        hi = torch.nn.functional.pad(w, (0, pad_k, 0, pad_n), value=float("-inf"))
        shape = ((n + pad_n) // bn, bn, (k + pad_k) // bk, bk)
        return lo.reshape(shape).amin(dim=(1, 3)), hi.reshape(shape).amax(dim=(1, 3))
    raise ValueError(strategy)


def make(preset: str, out: Path) -> None:
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = Model().to(torch.bfloat16)
    original = model.proj.weight.detach().clone()
    scheme = preset_name_to_scheme(preset, ["Linear"])
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}))
    args = model.proj.quantization_scheme.weights
    w = original.to(torch.float32)
    lo, hi = _minmax(w, args)
    global_scale = None
    if str(getattr(args.strategy, "value", args.strategy)) == "tensor_group":
        global_scale = generate_gparam(w.amin().reshape(1), w.amax().reshape(1))
        model.proj.weight_global_scale.data.copy_(global_scale)
    scale, zero = calculate_qparams(lo, hi, args, global_scale=global_scale)
    model.proj.weight_scale.data.copy_(scale.reshape(model.proj.weight_scale.shape))
    if hasattr(model.proj, "weight_zero_point"):
        model.proj.weight_zero_point.data.copy_(zero.reshape(model.proj.weight_zero_point.shape))
    model.proj.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    dst = out / f"ct_{preset.lower()}"
    dst.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(dst / "model.safetensors"))
    (dst / "config.json").write_text("{}\n")
    compressor.update_config(str(dst))
    config = json.loads((dst / "config.json").read_text())
    qcfg = config["quantization_config"]
    group = qcfg["config_groups"]["group_0"]
    fmt = group.get("format") or qcfg["format"]
    local = {k[len("proj."):]: v for k, v in state.items() if k.startswith("proj.")}
    ref = BaseCompressor.get_value_from_registry(fmt).decompress(local, QuantizationScheme.model_validate(group))
    refs = {"proj": ref["weight"].to(torch.bfloat16).contiguous()}
    if preset in KEEP_ORIGINAL:  # for the scale-direction checks against the float weight
        refs["proj.original"] = original.contiguous()
    save_file(refs,
              str(dst / "reference.safetensors"),
              metadata={"producer": "compressed-tensors==0.20.0",
                        "reference": "BaseCompressor.get_value_from_registry(format).decompress() in bfloat16"})
    (dst / "PRODUCER").write_text(json.dumps({"producer": "compressed-tensors==0.20.0", "preset": preset}) + "\n")
    print("wrote", dst, fmt, flush=True)


def main() -> None:
    out = Path(sys.argv[1])
    for preset in sys.argv[2:] or PRESETS:
        make(preset, out)


if __name__ == "__main__":
    main()
