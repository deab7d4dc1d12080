import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cuda_available() -> bool:
    """torch.cuda.is_available(), importing torch only when asked (i.e. when a gpu test was collected)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: `-m "not gpu"` never imports torch here
def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` where CUDA is not available (torch is imported only if there are some)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
