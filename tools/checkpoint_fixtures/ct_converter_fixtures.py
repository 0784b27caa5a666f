"""A cross-producer fixture: the AutoAWQ fixture converted to compressed-tensors by
compressed-tensors 0.20.0's own ``AutoAWQConverter`` (run after autoawq_fixtures.py, in the main
venv). The loader must read the converted file as the same weight as the AWQ original.

    python ct_converter_fixtures.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
    from safetensors.torch import load_file, save_file

    out = Path(sys.argv[1])
    src, dst = out / "awq_gemm_4bit", out / "ct_from_awq_gemm_4bit"
    config = json.loads((src / "config.json").read_text())
    converter = AutoAWQConverter.from_autoawq_config(config["quantization_config"])
    tensors = converter.process(dict(load_file(str(src / "model.safetensors"))))
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    qcfg = converter.update_config(None).model_dump(exclude_none=True)
    config["quantization_config"] = json.loads(json.dumps(qcfg, default=str))
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (dst / "PRODUCER").write_text(json.dumps({"producer": "compressed-tensors==0.20.0 AutoAWQConverter",
                                              "source": "awq_gemm_4bit (autoawq==0.2.9)"}) + "\n")
    print("wrote", dst, sorted(tensors), flush=True)


if __name__ == "__main__":
    main()
