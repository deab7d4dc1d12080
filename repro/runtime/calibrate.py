"""Measure collectives on the live process group and fit the cost model for this world and network.

Every rank takes part; each size is timed ``repeats`` times after a barrier and the slowest rank's
median counts (an all-reduce of the times with MAX), so all ranks get the same numbers and the same
fit. Sizes are message bytes as :mod:`repro.cost` defines them for the collective.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist

from repro.cost import CostModel, fit_linear

__all__ = ["default_sizes_bytes", "time_allreduce", "fit_allreduce"]


def default_sizes_bytes(max_bytes: int, count: int = 8, min_bytes: int = 4096) -> list[int]:
    """Geometric message sizes from ``min_bytes`` to ``max_bytes`` (multiples of 4 bytes)."""
    hi = max(int(max_bytes), min_bytes * 4)
    return sorted({int(s) // 4 * 4 for s in np.geomspace(min_bytes, hi, count)})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(sizes_bytes: Sequence[int], *, repeats: int = 5, warmup: int = 2,
                   device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                   group: dist.ProcessGroup | None = None) -> list[float]:
    """Median seconds of an all-reduce of each size (slowest rank's median, identical on all ranks)."""
    device = torch.device(device)
    elem = torch.tensor([], dtype=dtype).element_size()
    medians = []
    for nbytes in sizes_bytes:
        buf = torch.ones(max(1, int(nbytes) // elem), dtype=dtype, device=device)
        times = []
        for i in range(warmup + repeats):
            dist.barrier(group=group)
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=group)
            _sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    out = torch.tensor(medians, dtype=torch.float64, device=device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out.cpu().tolist()


def fit_allreduce(sizes_bytes: Sequence[int], *, repeats: int = 5, device: torch.device | str = "cpu",
                  group: dist.ProcessGroup | None = None) -> tuple[CostModel, list[float]]:
    """Time all-reduces of ``sizes_bytes`` and fit ``a + b*bytes``; returns the model and the times."""
    seconds = time_allreduce(sizes_bytes, repeats=repeats, device=device, group=group)
    line = fit_linear(sizes_bytes, seconds)
    world = dist.get_world_size(group)
    return CostModel(world, {"allreduce": line}, source=f"fitted on the live process group (P={world})",
                     meta={"sizes_bytes": list(map(int, sizes_bytes)), "seconds": seconds}), seconds
