"""Shared by the checkpoint tests: where the committed fixtures live, copying one into a
temporary directory, and rewriting its tensors or config."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"


def fixture(name: str) -> Path:
    path = FIXTURES / name
    assert path.is_dir(), f"missing committed fixture {path}"
    return path


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.safetensors").exists())


def copy_fixture(name: str, dst: Path) -> Path:
    out = dst / name
    shutil.copytree(fixture(name), out)
    (out / "reference.safetensors").unlink(missing_ok=True)
    return out


def tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def write_tensors(model_dir: Path, data: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in data.items()}, str(model_dir / "model.safetensors"))


def edit_tensors(model_dir: Path, **changes) -> None:
    """changes: name=tensor to replace or add, name=None to delete (dots written as '__')."""
    data = tensors(model_dir)
    for key, value in changes.items():
        name = key.replace("__", ".")
        if value is None:
            data.pop(name)
        else:
            data[name] = value
    write_tensors(model_dir, data)


def quant_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())["quantization_config"]


def edit_config(model_dir: Path, **changes) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config["quantization_config"].pop(key, None)
        else:
            config["quantization_config"][key] = value
    (model_dir / "config.json").write_text(json.dumps(config))


def reference(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(fixture(name) / "reference.safetensors"))


def original_weight(name: str, prefix: str) -> torch.Tensor:
    """The float weight a fixture's producer quantized: ``<prefix>.original`` in its reference file,
    or, for the fixtures made from the tiny Llama, llama_original/original.safetensors."""
    from safetensors.torch import load_file

    ref_path = fixture(name) / "reference.safetensors"
    if ref_path.exists():
        ref = load_file(str(ref_path))
        if prefix + ".original" in ref:
            return ref[prefix + ".original"]
    return load_file(str(fixture("llama_original") / "original.safetensors"))[prefix]
