"""tools/bench/fatbin_load.py without a GPU: the sampled keys and the sizes of both modes (nvcc)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from humming_aot.testing.nvcc import needs_nvcc

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench" / "fatbin_load.py"
_spec = importlib.util.spec_from_file_location("fatbin_load", _TOOL)
fatbin_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fatbin_load)


def test_the_sample_takes_count_keys_of_each_gemm_type_reproducibly():
    keys = fatbin_load.sample_keys("default", "sm90a", 3, seed=1)
    assert sorted(k.spec.gemm_type.value for k in keys) == ["dense"] * 3 + ["grouped"] * 3 + ["masked"] * 3
    assert [k.name for k in keys] == [k.name for k in fatbin_load.sample_keys("default", "sm90a", 3, seed=1)]
    assert {k.arch for k in keys} == {"sm90a"}


@pytest.mark.slow
@needs_nvcc
def test_without_a_gpu_it_reports_both_modes_sizes(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "load.json"
    assert fatbin_load.main(["--catalog", "smoke", "--count", "1", "--jobs", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["size_bytes"] < r["none_bytes"] and "none_us" not in r for r in rows)
    assert "no CUDA GPU: sizes only" in capsys.readouterr().out
