"""The fast exact top-k selection: the same set as ``torch.topk`` whatever the data looks like."""

from __future__ import annotations

import pytest
import torch

from repro.families.sparse.topk import topk_indices


def _check(a: torch.Tensor, k: int) -> None:
    got = topk_indices(a, k)
    assert got.numel() == k and got.unique().numel() == k
    kth = torch.topk(a, k).values.min()
    # exact: every chosen entry is >= the k-th largest, every entry left out is <= it
    assert bool((a[got] >= kth).all())
    mask = torch.ones_like(a, dtype=torch.bool)
    mask[got] = False
    assert bool((a[mask] <= kth).all())


@pytest.mark.parametrize("n", [10, 1000, (1 << 18) + 7, 3_000_000])
@pytest.mark.parametrize("density", [0.001, 0.01, 0.05, 1.0])
def test_same_set_as_torch_topk_on_random_data(n, density):
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=gen).abs()
    k = max(1, int(n * density))
    _check(a, k)
    if k < n:
        assert set(topk_indices(a, k).tolist()) == set(torch.topk(a, k).indices.tolist())


def test_adversarial_layouts_fall_back_and_stay_exact():
    n = 1 << 20
    stride = n // 65536
    a = torch.zeros(n)
    off_sample = torch.arange(1, n, stride)          # the largest entries all sit between samples
    a[off_sample[:5000]] = torch.arange(5000, 0, -1, dtype=torch.float32)
    _check(a, 1000)
    _check(torch.arange(n, dtype=torch.float32), 1000)         # sorted ascending
    _check(torch.arange(n, 0, -1, dtype=torch.float32), 1000)  # sorted descending
    _check(torch.ones(n), 1000)                                # all tied
    ties = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(1)).float()
    _check(ties, 20_000)                                       # many ties at the k-th value


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="1-D"):
        topk_indices(torch.ones(2, 2), 1)
    with pytest.raises(ValueError, match="k must be in 1..3"):
        topk_indices(torch.ones(3), 0)
