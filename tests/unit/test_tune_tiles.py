"""tools/bench/tune_tiles.py's choice of tiles to time: from the installed catalog by label
fragment, plus whole tile labels for the JIT, also where no catalog is installed."""
from __future__ import annotations

from pathlib import Path

from humming_aot.spec import KernelKey
from humming_aot.testing.bench import sibling_tool

ROOT = Path(__file__).resolve().parents[2]
INT4_128 = "gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_128x128x64_w1x4_s4"
INT4_64 = "gemm_dense_sm90a_wgmma-ws_a-bf16_w-s4-g-bf16_o-bf16_64x128x64_w1x4_s6"
UINT4_48 = "gemm_dense_sm90a_wgmma-ws_a-bf16_w-u4-g-bf16-zpi_o-bf16_48x128x64_w1x4_s8"


def _tool():
    return sibling_tool("tune_tiles", str(ROOT / "tools/bench/tune_tiles.py"))


class _Catalog:
    def __init__(self, names):
        self.names = names

    def keys_for(self, arch):
        return self.names if arch == "sm90a" else []


def _labels(tiles):
    return [tile.label for tile in tiles]


def test_without_a_catalog_whole_labels_are_still_timed():
    tool = _tool()
    spec = KernelKey.from_name(INT4_128).spec
    tiles = tool.candidate_tiles(None, "sm90a", spec, ["wgmma-ws:176x256x64_w1x8_s4", "wgmma-ws"])
    assert _labels(tiles) == ["wgmma-ws:176x256x64_w1x8_s4"]  # the fragment matches nothing without a catalog


def test_catalog_tiles_by_fragment_and_spec_then_whole_labels_smallest_first():
    tool = _tool()
    spec = KernelKey.from_name(INT4_128).spec
    catalog = _Catalog([INT4_128, INT4_64, UINT4_48])
    tiles = tool.candidate_tiles(catalog, "sm90a", spec, ["wgmma-ws", "wgmma-ws:32x128x64_w1x4_s8"])
    # the uint4 key is another spec; the whole label joins the catalog's two int4 tiles
    assert _labels(tiles) == ["wgmma-ws:32x128x64_w1x4_s8", "wgmma-ws:64x128x64_w1x4_s6",
                              "wgmma-ws:128x128x64_w1x4_s4"]
    assert _labels(tool.candidate_tiles(catalog, "sm89", spec, ["wgmma-ws"])) == []
