"""HQQ fixtures written by hqq 0.2.8.post1 (HQQLinear on CPU): one nn.Linear(256, 64) in bf16,
4 bits, group 64, axis 1 (served) and axis 0 (refused by the loader). The tensor entries of
``state_dict()`` are saved under the prefix ``proj``; the reference is ``HQQLinear.dequantize()``.

    python hqq_fixtures.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main() -> None:
    from hqq.core.quantize import BaseQuantizeConfig, HQQLinear
    from safetensors.torch import save_file

    out = Path(sys.argv[1])
    for axis in (1, 0):
        torch.manual_seed(0)
        linear = torch.nn.Linear(256, 64, bias=False).to(torch.bfloat16)
        original = linear.weight.detach().clone()
        layer = HQQLinear(linear, quant_config=BaseQuantizeConfig(nbits=4, group_size=64, axis=axis),
                          compute_dtype=torch.bfloat16, device="cpu", initialize=True)
        state = {f"proj.{k}": v.contiguous() for k, v in layer.state_dict().items() if isinstance(v, torch.Tensor)}
        dst = out / f"hqq_4bit_g64_axis{axis}"
        dst.mkdir(parents=True, exist_ok=True)
        save_file(state, str(dst / "model.safetensors"))
        config = {"quantization_config": {"quant_method": "hqq", "nbits": 4, "group_size": 64, "axis": axis}}
        (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if axis == 0:  # refused by the loader: no reference needed
            (dst / "PRODUCER").write_text(json.dumps({"producer": "hqq==0.2.8.post1", "axis": axis}) + "\n")
            continue
        save_file({"proj": layer.dequantize().to(torch.bfloat16).contiguous(), "proj.original": original},
                  str(dst / "reference.safetensors"),
                  metadata={"producer": "hqq==0.2.8.post1", "reference": "HQQLinear.dequantize() in bfloat16"})
        (dst / "PRODUCER").write_text(json.dumps({"producer": "hqq==0.2.8.post1", "axis": axis}) + "\n")
        print("wrote", dst, sorted(state), flush=True)


if __name__ == "__main__":
    main()
