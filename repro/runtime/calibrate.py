"""Measure collectives on the live process group and fit the cost model for this world and network.

Every rank takes part; each size is timed ``repeats`` times after a barrier (small messages as the mean
of up to 16 back-to-back calls, to amortise the ranks' skew leaving the barrier) and the slowest rank's
median counts, so all ranks get the same fit. Sizes are message bytes as :mod:`repro.core.cost` defines
them: the tensor's (all-reduce); the full tensor's, a multiple of P elements (reduce-scatter and
all-gather, run as the executors run them: :func:`rsag_impl`); each worker's contribution
(``sparse_allgather``, whose line is stored against the gathered bytes P * n).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from repro.core.cost import CostModel, fit_linear

__all__ = ["MEASURABLE", "default_sizes_bytes", "rsag_impl", "time_collective", "time_allreduce", "fit_allreduce",
           "fit_cost_model", "fit_on_ranks", "median_s", "slowest_median_s", "sync_device"]

MEASURABLE = ("allreduce", "reduce_scatter", "allgather", "sparse_allgather")


def median_s(fn: Callable[[], object], repeats: int, group=None) -> float:
    """This rank's median seconds of ``fn()``: ``repeats`` runs after one warm-up, each starting at a barrier
    of ``group``."""
    samples = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        if i:
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def slowest_median_s(fn: Callable[[], object], repeats: int, group=None) -> float:
    """Seconds of ``fn()`` on this group: :func:`median_s` per rank, then the slowest rank's (identical on
    every rank)."""
    med = torch.tensor([median_s(fn, repeats, group)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)
    return float(med.item())


def default_sizes_bytes(max_bytes: int, count: int = 8, min_bytes: int = 4096) -> list[int]:
    """Geometric message sizes from ``min_bytes`` to ``max_bytes`` (multiples of 4 bytes)."""
    hi = max(int(max_bytes), min_bytes * 4)
    return sorted({int(s) // 4 * 4 for s in np.geomspace(min_bytes, hi, count)})


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rsag_impl(group=None) -> str:
    """How the executors run reduce-scatter and all-gather on ``group``'s backend: ``ring`` (the
    CommStream's, on gloo) or ``native``; what :func:`time_collective` times."""
    return "ring" if dist.get_backend(group) == "gloo" else "native"


def _op(kind: str, numel: int, world: int, dtype, device, group, stream=None) -> Callable[[], None]:
    """A closure running one ``kind`` collective on preallocated tensors (``stream``: a CommStream that
    runs reduce-scatter and all-gather)."""
    if kind == "allreduce":
        buf = torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    from repro.runtime.collectives import _all_gather_into_tensor, _reduce_scatter_tensor

    if kind in ("reduce_scatter", "allgather"):
        full = torch.ones(max(world, numel // world * world), dtype=dtype, device=device)
        if stream is not None:
            run = stream.reduce_scatter if kind == "reduce_scatter" else stream.all_gather
            return lambda: run(full).wait()
        shard = torch.empty(full.numel() // world, dtype=dtype, device=device)
        if kind == "reduce_scatter":
            return lambda: _reduce_scatter_tensor(shard, full, group=group)
        return lambda: _all_gather_into_tensor(full, shard, group=group)
    if kind == "sparse_allgather":
        mine = torch.ones(numel, dtype=dtype, device=device)
        gathered = torch.empty(numel * world, dtype=dtype, device=device)
        return lambda: _all_gather_into_tensor(gathered, mine, group=group)
    raise ValueError(f"cannot measure collective '{kind}'; measurable: {', '.join(MEASURABLE)}")


def time_collective(kind: str, sizes_bytes: Sequence[int], *, repeats: int = 5, warmup: int = 2,
                    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    group: dist.ProcessGroup | None = None) -> list[float]:
    """Median seconds of ``kind`` per size (slowest rank's median, identical on all ranks)."""
    device = torch.device(device)
    world = dist.get_world_size(group)
    elem = torch.tensor([], dtype=dtype).element_size()
    stream = None
    if kind in ("reduce_scatter", "allgather") and rsag_impl(group) == "ring":
        from repro.runtime.collectives import CommStream

        stream = CommStream(group=group, backend_impl="ring")
    try:
        medians = _medians(kind, sizes_bytes, repeats, warmup, device, dtype, group, world, elem, stream)
    finally:
        if stream is not None:
            stream.close()
    out = torch.tensor(medians, dtype=torch.float64, device=device)
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out.cpu().tolist()


def _medians(kind, sizes_bytes, repeats, warmup, device, dtype, group, world, elem, stream) -> list[float]:
    medians = []
    for nbytes in sizes_bytes:
        run = _op(kind, max(1, int(nbytes) // elem), world, dtype, device, group, stream)
        inner = int(min(16, max(1, 2**20 // max(1, int(nbytes)))))
        times = []
        for i in range(warmup + repeats):
            dist.barrier(group=group)
            sync_device(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                run()
            sync_device(device)
            if i >= warmup:
                times.append((time.perf_counter() - t0) / inner)
        medians.append(statistics.median(times))
    return medians


def time_allreduce(sizes_bytes: Sequence[int], **kwargs) -> list[float]:
    """:func:`time_collective` for all-reduce."""
    return time_collective("allreduce", sizes_bytes, **kwargs)


def fit_cost_model(sizes_bytes: Sequence[int], kinds: Sequence[str] = ("allreduce",), *, repeats: int = 5,
                   device: torch.device | str = "cpu", group: dist.ProcessGroup | None = None,
                   source: str | None = None) -> CostModel:
    """Time each collective of ``kinds`` over ``sizes_bytes`` and fit one line per collective; the
    measurements are kept in ``meta["measurements"]`` ({kind: {"bytes": [...], "seconds": [...]}})."""
    world = dist.get_world_size(group)
    lines, measurements = {}, {}
    for kind in kinds:
        seconds = time_collective(kind, sizes_bytes, repeats=repeats, device=device, group=group)
        x = [n * world for n in sizes_bytes] if kind == "sparse_allgather" else list(sizes_bytes)
        lines[kind] = fit_linear(x, seconds)
        measurements[kind] = {"bytes": list(map(int, sizes_bytes)), "seconds": seconds}
    meta: dict = {"measurements": measurements}
    if {"reduce_scatter", "allgather"} & set(kinds):
        meta["rsag_impl"] = rsag_impl(group)
    return CostModel(world, lines, source=source or f"fitted on the live process group (P={world})", meta=meta)


def fit_allreduce(sizes_bytes: Sequence[int], *, repeats: int = 5, device: torch.device | str = "cpu",
                  group: dist.ProcessGroup | None = None) -> tuple[CostModel, list[float]]:
    """Time all-reduces of ``sizes_bytes`` and fit ``a + b*bytes``; returns the model and the times."""
    cost = fit_cost_model(sizes_bytes, ("allreduce",), repeats=repeats, device=device, group=group)
    return cost, cost.meta["measurements"]["allreduce"]["seconds"]


def fit_on_ranks(ctx, sizes_bytes: Sequence[int], kinds: Sequence[str], repeats: int = 5) -> dict:
    """Launch target: :func:`fit_cost_model` on every rank; returns the CostModel as a dict."""
    return fit_cost_model(sizes_bytes, kinds, repeats=repeats, device=ctx.device).to_dict()
