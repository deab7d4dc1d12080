"""OMGS-SGD micro-benchmarks: top-k timing and its gamma fit (repro.runtime.calibrate)."""

import math

import pytest

from repro.cost import CostModel, topk_time_s
from repro.runtime.calibrate import fit_topk, time_topk


def test_time_topk_gives_one_positive_median_per_size_without_a_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    sizes = [64, 4096, 65536]
    seconds = time_topk(sizes, 0.01, repeats=3, warmup=1)
    assert len(seconds) == len(sizes)
    assert all(math.isfinite(s) and s > 0 for s in seconds)
    # selecting from 1000x more elements is not faster (loose: timings on a shared CPU are noisy)
    assert seconds[-1] > seconds[0]


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_time_topk_rejects_densities_outside_0_1(bad):
    with pytest.raises(ValueError, match="density"):
        time_topk([100], bad)


def test_time_topk_rejects_empty_tensors():
    with pytest.raises(ValueError, match="element"):
        time_topk([0], 0.1, repeats=1, warmup=0)


def test_fit_topk_returns_the_least_squares_gamma_of_its_own_measurements():
    sizes = [1024, 16384, 131072]
    gamma_s, seconds = fit_topk(sizes, 0.001, repeats=3)
    assert len(seconds) == len(sizes) and gamma_s > 0
    # the fit minimises relative errors, so it lies between the smallest and largest per-point gamma
    per_point = [t / (d * math.log2(d)) for d, t in zip(sizes, seconds)]
    assert min(per_point) * (1 - 1e-9) <= gamma_s <= max(per_point) * (1 + 1e-9)
    # and it plugs into the cost model
    cost = CostModel.from_alpha_beta(2, 1e-4, 1e-9).with_topk(gamma_s)
    assert cost.topk_s(sizes[-1]) == pytest.approx(topk_time_s(gamma_s, sizes[-1]))
