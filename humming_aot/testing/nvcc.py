"""The nvcc the build tests compile with, and their skip marker when there is none."""
from __future__ import annotations

import pytest

from humming_aot.aot import ninja as driver


def nvcc_or_none():
    """The nvcc the build driver would use (HUMMING_AOT_NVCC, PATH, CUDA_HOME), or None."""
    try:
        return driver.find_nvcc()
    except driver.NvccNotFoundError:
        return None


needs_nvcc = pytest.mark.skipif(nvcc_or_none() is None, reason="nvcc not found (set HUMMING_AOT_NVCC)")
