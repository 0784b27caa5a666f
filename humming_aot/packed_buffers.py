"""A torch module whose packed weights keep their dtype when the module is cast.

A whole model's ``model.to(torch.bfloat16)`` (or ``.half()``) casts every floating buffer. The
quantized-activation layers hold float32 scales (and global and static scales) that the kernels
read as float32 from their addresses: a cast would make the kernels read the wrong bits, and the
CPU reference would round the scales. ``PackedBuffersModule`` moves the buffers it names in
``_PACKED`` to the cast's device without changing their dtype; every other tensor (biases)
follows the cast as usual.
"""
from __future__ import annotations

import torch


class PackedBuffersModule(torch.nn.Module):
    """torch.nn.Module whose buffers named in ``_PACKED`` keep their dtype under ``_apply`` (``.to``,
    ``.half()``, ``.cuda()``, ...): moved, never cast."""

    _PACKED: tuple[str, ...] = ()

    def _apply(self, fn, recurse=True):
        packed = {id(self._buffers[name]) for name in self._PACKED if self._buffers.get(name) is not None}

        def keep_packed_dtypes(t: torch.Tensor) -> torch.Tensor:
            out = fn(t)
            return t.to(out.device) if id(t) in packed and out.dtype != t.dtype else out

        return super()._apply(keep_packed_dtypes, recurse)
