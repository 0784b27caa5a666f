"""The kernel bodies, one module each: what a body is, asked by everything that needs to know.

A body (csrc/include/humming_aot/kernel/*.cuh) is one kernel template; its module here owns, for
the host side: which tiles it takes (``check_tile``), its thread count, its dynamic shared memory
(which the generated source static_asserts against the C++), the header, template name and
template arguments codegen emits, the Params struct it takes, the archs it compiles for and the
numerics flags of its keys. ``spec.TileConfig`` / ``spec.KernelKey`` validate through it,
``codegen`` emits through it, ``heuristics.smem_bytes`` sizes through it; adding a body is adding
a module and one line in ``BODIES`` (docs/adding-a-body.md).

Every function here is pure and depends only on the key or tile: the run time and the build use
the same answers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from humming_aot.bodies.base import Body
from humming_aot.bodies.mma_fp4 import MMA_FP4
from humming_aot.bodies.mma_ss import MMA_SS
from humming_aot.bodies.mma_swapped import MMA_SWAPPED
from humming_aot.bodies.mma_sync import MMA_SYNC
from humming_aot.bodies.mma_w4a8 import MMA_W4A8
from humming_aot.bodies.simt import SIMT
from humming_aot.bodies.wgmma import WGMMA
from humming_aot.bodies.wgmma_ss import WGMMA_SS
from humming_aot.bodies.wgmma_w4a8 import WGMMA_W4A8
from humming_aot.bodies.wgmma_ws import WGMMA_WS

if TYPE_CHECKING:
    from humming_aot.spec import MmaKind

BODIES: dict[str, Body] = {body.kind: body for body in (MMA_SYNC, MMA_SWAPPED, WGMMA, WGMMA_WS, WGMMA_SS, WGMMA_W4A8,
                                                             MMA_SS, MMA_W4A8, MMA_FP4, SIMT)}


def body_of(kind: "MmaKind | str") -> Body:
    """The body of a tile kind (an MmaKind or its value, e.g. 'wgmma-ws')."""
    value = getattr(kind, "value", kind)
    try:
        return BODIES[value]
    except KeyError:
        raise ValueError(f"no kernel body for tile kind {value!r}; bodies: {', '.join(sorted(BODIES))}") from None


__all__ = ["BODIES", "Body", "body_of"]
