"""Fixtures for every test: each starts from humming_aot's default switches and an empty dispatch
cache, whatever the shell or an earlier test set."""
import pytest
import torch

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
    monkeypatch.setattr(dispatch, "_split_k_counters", _counters_of(dispatch._split_k_counters))
    yield
    if any(var.is_set() for var in SWITCHES):
        # PDL and CLUSTERS are read when a kernel is loaded: a kernel loaded under the test's
        # setting must not serve the next test
        kernels.clear_loaded_kernels()
    _clear_dispatch_caches()


def _counters_of(real):
    """dispatch._split_k_counters, with a zeroed CPU tensor per stream for the unit tests' CPU
    tensors made to look like CUDA ones (the real counters are device memory from the launcher)."""
    made = {}

    def counters(device, stream):
        if device.type == "cpu":
            return made.setdefault(stream, torch.zeros(dispatch.SPLIT_K_COUNTERS, dtype=torch.int32))
        return real(device, stream)

    return counters


def pytest_addoption(parser):
    parser.addoption(
        "--part", default=None, metavar="I/N",
        help="run only the I-th of N contiguous, equally long slices of the selected tests (1 <= I <= N), "
             "so that a suite longer than one call of the GPU box runs in N calls "
             "(tools/device_check.sh: DEVICE_TEST_PART)")


def _parse_part(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise pytest.UsageError(f"--part {text!r}: expected I/N with 1 <= I <= N, e.g. --part 2/3")
    return i, n


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """--part I/N: after every other selection (-m, -k, deselection), keep the I-th of N
    contiguous slices; the N parts together are exactly the selected tests, in order."""
    text = config.getoption("--part")
    if text is None:
        return
    i, n = _parse_part(text)
    start, stop = len(items) * (i - 1) // n, len(items) * i // n
    if start or stop < len(items):
        config.hook.pytest_deselected(items=items[:start] + items[stop:])
        items[:] = items[start:stop]
