"""Lazy access to a model directory's safetensors files (one file or a sharded index).

Only the JSON headers are read when a directory is opened; a tensor is read (memory-mapped by
safetensors) when a loader asks for it, so a model is never in memory all at once. Every error
names the file and the tensor, and says what to do.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

__all__ = ["CheckpointError", "CheckpointReader", "INDEX_FILE", "SINGLE_FILE"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own bound on the JSON header


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: the message names the file, the tensor or config
    key, and what to do."""


class CheckpointReader:
    """The tensors of ``model_dir`` (``model.safetensors``, ``model.safetensors.index.json`` with its
    shards, or else every ``*.safetensors`` file in it), by name, read on demand."""

    def __init__(self, model_dir: str | os.PathLike):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise CheckpointError(f"{self.model_dir}: not a directory; pass the model directory (with config.json)")
        self._files = self._tensor_files()
        self._headers: dict[Path, dict] = {}
        self._where: dict[str, Path] = {}
        for path in sorted(set(self._files.values()) if self._files else self._all_shards()):
            for name in self._header(path):
                if name != "__metadata__":
                    self._where.setdefault(name, path)
        self._handles: dict[Path, object] = {}

    # ------------------------------------------------------------------------------------ files
    def _tensor_files(self) -> dict[str, Path]:
        index = self.model_dir / INDEX_FILE
        if not index.exists():
            return {}
        data = self.read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object; rewrite the index or remove it")
        files = {}
        for name, shard in weight_map.items():
            path = self.model_dir / str(shard)
            if not path.exists():
                raise CheckpointError(f"{index}: tensor {name!r} is in shard {shard!r}, which does not exist; "
                                      "download the missing shard")
            files[name] = path
        return files

    def _all_shards(self) -> list[Path]:
        single = self.model_dir / SINGLE_FILE
        paths = [single] if single.exists() else sorted(self.model_dir.glob("*.safetensors"))
        if not paths:
            raise CheckpointError(f"{self.model_dir}: no {SINGLE_FILE}, {INDEX_FILE} or *.safetensors file")
        return paths

    def read_json(self, path: Path) -> object:
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{path}: not valid JSON ({err}); fix or re-download the file") from None

    def _header(self, path: Path) -> dict:
        """The JSON header of a safetensors file, checked against the file's size (a truncated file
        is caught here, before any tensor is read)."""
        if path in self._headers:
            return self._headers[path]
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file; re-download it")
            (length,) = struct.unpack("<Q", head)
            if length > min(_HEADER_LIMIT, size - 8):
                raise CheckpointError(f"{path}: its header claims {length} bytes but the file has {size}: the file is "
                                      "truncated or not safetensors; re-download it")
            try:
                header = json.loads(f.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise CheckpointError(f"{path}: unreadable safetensors header ({err}); re-download it") from None
        end = 8 + length + max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                               default=0)
        if end > size:
            worst = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
            raise CheckpointError(f"{path}: truncated ({size} bytes, its tensors need {end}; tensor {worst!r} is cut "
                                  "off); re-download the file")
        self._headers[path] = header
        return header

    # ---------------------------------------------------------------------------------- tensors
    def names(self) -> list[str]:
        return sorted(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def file_of(self, name: str) -> Path:
        if name not in self._where:
            raise CheckpointError(f"{self.model_dir}: no tensor {name!r} in any safetensors file; the checkpoint "
                                  "is incomplete or the layer prefix is wrong (see `humming-aot inspect`)")
        return self._where[name]

    def dtype_name(self, name: str) -> str:
        """The safetensors dtype string of a tensor (``I32``, ``U8``, ``F8_E4M3``, ``BF16`` ...)."""
        return self._header(self.file_of(name))[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._header(self.file_of(name))[name]["shape"])

    def get(self, name: str) -> torch.Tensor:
        path = self.file_of(name)
        handle = self._handles.get(path)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(f"{path}: safetensors cannot open it ({err}); re-download the file") from None
            self._handles[path] = handle
        try:
            return handle.get_tensor(name)
        except Exception as err:
            raise CheckpointError(f"{path}: tensor {name!r} cannot be read ({err})") from None

    def tensor(self, name: str, dtypes: tuple[str, ...], shape: tuple[int | None, ...] | None = None,
               what: str = "") -> torch.Tensor:
        """Tensor ``name``, checked: its safetensors dtype among ``dtypes`` and (if given) its shape,
        where None matches any extent."""
        path = self.file_of(name)
        dtype = self.dtype_name(name)
        if dtype not in dtypes:
            raise CheckpointError(f"{path}: tensor {name!r} is {dtype}, but {what or 'this layout'} stores it as "
                                  f"{' or '.join(dtypes)}; the file does not follow the schema its config names")
        got = self.shape(name)
        if shape is not None and (len(got) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got))):
            want = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ")"
            raise CheckpointError(f"{path}: tensor {name!r} has shape {got}, expected {want} for "
                                  f"{what or 'this layout'}; the file does not match its config")
        return self.get(name)
