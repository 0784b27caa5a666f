"""GPU tests: marked `gpu`, skipped (with the reason) on a machine without a CUDA GPU."""
import pytest
import torch

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not HAS_GPU:
                item.add_marker(pytest.mark.skip(reason="no CUDA GPU on this machine"))
