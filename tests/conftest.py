import os

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
