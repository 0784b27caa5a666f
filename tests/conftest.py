"""Fixtures for every test: each starts from humming_aot's default switches and an empty dispatch
cache, whatever the shell or an earlier test set."""
import pytest

from humming_aot import dispatch, env, kernels, ops

# The HUMMING_AOT_* switches that change what a GEMM does or how it is launched. The variables
# that only say where things are (HUMMING_AOT_CATALOG_DIR, _CACHE_DIR, _NVCC, _NVRTC) are left
# to the machine: a GPU box may need them to find its catalog and NVRTC at all.
SWITCHES = (env.JIT, env.PDL, env.CLUSTERS, env.LOG_LEVEL)


def _clear_dispatch_caches() -> None:
    dispatch._selected.clear()
    ops._unsupported_on_device.cache_clear()


@pytest.fixture(autouse=True)
def _default_switches_and_fresh_dispatch(monkeypatch):
    for var in SWITCHES:
        monkeypatch.delenv(var.name, raising=False)
    _clear_dispatch_caches()
    yield
    if any(var.is_set() for var in SWITCHES):
        # PDL and CLUSTERS are read when a kernel is loaded: a kernel loaded under the test's
        # setting must not serve the next test
        kernels.clear_loaded_kernels()
    _clear_dispatch_caches()
