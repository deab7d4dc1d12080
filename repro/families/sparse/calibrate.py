"""Top-k selection timed on this device and fitted to OMGS-SGD's ``t_spar = gamma * d * log2(d)``.

A local computation (no process group): what the sparse family's calibration hook and the OMGS
micro-benchmarks measure.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from repro.core.cost import fit_topk_gamma
from repro.families.sparse.simulate import topk_count
from repro.families.sparse.topk import topk_indices
from repro.runtime.calibrate import sync_device

__all__ = ["time_topk", "fit_topk"]


def time_topk(numels: Sequence[int], density: float, *, repeats: int = 5, warmup: int = 2,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[float]:
    """Median seconds of one :func:`~repro.families.sparse.topk.topk_indices` selection by magnitude per
    tensor size (``k = topk_count(n, density)``, a seeded random tensor); small tensors are timed as the
    mean of up to 16 back-to-back runs. No process group needed."""
    if not 0.0 < float(density) <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    medians = []
    for n in numels:
        n = int(n)
        if n < 1:
            raise ValueError(f"tensor sizes must be >= 1 element, got {n}")
        x = torch.randn(n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
        k = int(topk_count(n, density))
        inner = int(min(16, max(1, 2**18 // n)))
        times = []
        for i in range(warmup + repeats):
            sync_device(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                topk_indices(x.abs(), k)
            sync_device(device)
            if i >= warmup:
                times.append((time.perf_counter() - t0) / inner)
        medians.append(statistics.median(times))
    return medians


def fit_topk(numels: Sequence[int], density: float, *, repeats: int = 5,
             device: torch.device | str = "cpu") -> tuple[float, list[float]]:
    """Time top-k selection over ``numels`` (:func:`time_topk`) and fit ``t = gamma * d * log2(d)``
    (:func:`repro.core.cost.fit_topk_gamma`); returns ``(gamma_s, measured seconds per size)``.

    Use the gamma with :meth:`repro.core.cost.CostModel.with_topk`. Sizes must be >= 2 elements."""
    seconds = time_topk(numels, density, repeats=repeats, device=device)
    return fit_topk_gamma(numels, seconds), seconds
