"""How much slower computation runs while gloo communication is in flight, measured on the live ranks.

The simulator's ``Realism.contention`` (:mod:`repro.core.contention`) is a dimensionless slowdown
``c``: while any collective is in flight, a compute task progresses at ``1/(1+c)`` of its speed
(its wall time grows by ``1+c``). On a small CPU host the cause is mostly gloo's threads (copies,
the reduction, socket system calls) competing with the training thread for the cores and the memory
bandwidth; on a GPU cluster it would be PCIe and memory bandwidth. This module measures ``c`` on the
live process group (every rank takes part, as in :mod:`repro.runtime.calibrate`):

- **kernel**: ``steps`` forward + backward passes of the training model itself (``model``, a fixed
  synthetic batch of ``batch_size`` samples per rank; no optimizer step, no gradient exchange), so the
  computation that is slowed is the one the trace times;
- **alone**: the kernel's wall seconds on every rank at once after a barrier (all ranks compute,
  as in a training step; nothing else of ours runs);
- **with communication**: the same, while a queue of asynchronous ``all_reduce`` calls of
  ``nbytes`` each keeps the process group busy for the kernel's whole duration (the queue is sized
  from one all-reduce's measured time to last ~1.5x the kernel; if it drains before the kernel
  ends, the measurement is retried with a queue twice as long, and the row says whether the
  communication covered the kernel: ``covered``);
- the two alternate (alone, with, alone, with, ..., alone: ``repeats`` pairs), so that drift of the
  machine (other tenants' load) cancels: each ``with`` is divided by the mean of the ``alone`` runs just
  before and after it, and the slowdown of a size is the median of these ratios minus 1, per rank,
  then the mean over ranks (identical on every rank).

:func:`fit_contention` reduces the per-size slowdowns to the single ``Realism.contention``: each
clipped at 0 (a negative value is noise: communication cannot speed compute up), then their mean
weighted by each size's all-reduce seconds (the slowdown averaged over the time communication is in
flight; the validation study uses this) or, without weights, their median. The measured slowdown
can depend on the size (on a small host, large, long transfers slow computation more), so the
weighting puts it where a plan's communication time goes. The sizes should span the plan's messages
(a layer's gradient to the whole model's,
:func:`default_contention_sizes_bytes`); the per-size rows are kept so a size-dependent effect can be
seen. Run it on the network it is for (loopback and an emulated link differ: on loopback gloo copies
at memory speed and is CPU-bound; on a slow link it mostly waits).

:func:`measure_contention_local` starts the ranks with :func:`repro.launch.local.launch_local`
(optionally on an emulated link); :func:`contention_on_ranks` is its launch target. Every wait has a
timeout (the process group's, and ``wait_timeout_s`` on the queued work), so nothing hangs.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import timedelta
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["CONTENTION_COLUMNS", "default_contention_sizes_bytes", "time_kernel_s", "measure_contention",
           "contention_on_ranks", "measure_contention_local", "fit_contention"]

CONTENTION_COLUMNS = ("model", "batch_size", "workers", "bytes", "kernel_alone_s", "kernel_with_comm_s",
                      "allreduce_s", "queued_allreduces", "covered", "slowdown")
"""Columns of a contention table: one row per message size. ``kernel_alone_s`` / ``kernel_with_comm_s``:
median wall seconds of the kernel (``steps`` forward + backward passes; mean over ranks); ``allreduce_s``: one blocking all-reduce of
``bytes`` alone (slowest rank's median); ``queued_allreduces``: how many were queued per kernel;
``covered``: the queue was still busy when the kernel ended on every rank and repeat; ``slowdown``:
``c`` for that size (dimensionless: the median over pairs of ``with / alone - 1``; it can come out
negative from noise, which :func:`fit_contention` clips)."""


def default_contention_sizes_bytes(model_bytes: int, count: int = 3, min_bytes: int = 16384) -> list[int]:
    """``count`` geometric all-reduce sizes from ``min_bytes`` (a small layer's gradient) to
    ``model_bytes`` (one bucket holding the whole model), multiples of 4 bytes."""
    hi = max(int(model_bytes), 4 * int(min_bytes))
    return sorted({int(s) // 4 * 4 for s in np.geomspace(min_bytes, hi, count)})


def _kernel(model_name: str, batch_size: int, device: torch.device, **model_kwargs: Any):
    """A closure running one forward + backward of ``model_name`` on a fixed synthetic batch."""
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.manual_seed(0)
    model = build_model(model_name, device=device, **model_kwargs)
    x, y = make_batch(model_name, batch_size, device=device, generator=torch.Generator().manual_seed(1),
                      **model_kwargs)

    def run() -> None:
        for p in model.parameters():
            p.grad = None
        compute_loss(model_name, model, x, y, **model_kwargs).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return run, sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def time_kernel_s(run, steps: int) -> float:
    """Wall seconds of ``steps`` calls of ``run``."""
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    return time.perf_counter() - t0


def _allreduce_s(buf: torch.Tensor, group, repeats: int = 5) -> float:
    """Median seconds of one blocking all-reduce of ``buf`` on this rank (after one warm-up)."""
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=group)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _with_comm_s(run, steps: int, buf: torch.Tensor, queued: int, group, wait_timeout_s: float) -> tuple[float, bool]:
    """Kernel seconds while ``queued`` async all-reduces of ``buf`` are in flight; and whether the
    last one was still running when the kernel ended (the queue covered the whole kernel)."""
    dist.barrier(group=group)
    works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(queued)]
    t = time_kernel_s(run, steps)
    covered = not works[-1].is_completed()
    for w in works:
        w.wait(timeout=timedelta(seconds=wait_timeout_s))
    return t, covered


def measure_contention(model: str = "tiny_resnet", sizes_bytes: Sequence[int] | None = None, *,
                       batch_size: int = 32, steps: int = 1, repeats: int = 7, max_queued: int = 4096,
                       wait_timeout_s: float = 60.0, device: torch.device | str = "cpu", group=None,
                       **model_kwargs: Any) -> list[dict[str, Any]]:
    """On every rank of ``group`` (all take part): the kernel's slowdown under in-flight all-reduces per
    size (module docstring); ``sizes_bytes`` default to :func:`default_contention_sizes_bytes` of the
    model's gradient bytes. Returns rows with :data:`CONTENTION_COLUMNS`, identical on every rank."""
    if steps < 1 or repeats < 1:
        raise ValueError(f"need steps >= 1 and repeats >= 1, got {steps} and {repeats}")
    device = torch.device(device)
    world = dist.get_world_size(group)
    run, model_bytes = _kernel(model, batch_size, device, **model_kwargs)
    sizes = [int(s) for s in (sizes_bytes if sizes_bytes is not None else default_contention_sizes_bytes(model_bytes))]
    if not sizes or any(s < 4 for s in sizes):
        raise ValueError(f"message sizes must be >= 4 bytes, got {sizes}")
    run()  # warm-up: allocator, first-call costs
    alone_first = statistics.median(time_kernel_s(run, steps) for _ in range(2))
    local = []  # per size: [alone median, with median, allreduce seconds, queued, covered, slowdown]
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        comm_s = _allreduce_s(buf, group)
        # The same queue length on every rank (the slowest rank's estimate), or the ranks would stop
        # issuing at different counts and the collectives would not match.
        est = torch.tensor([math.ceil(1.5 * alone_first / max(comm_s, 1e-6)) + 2], dtype=torch.float64)
        dist.all_reduce(est, op=dist.ReduceOp.MAX, group=group)
        queued = int(min(max_queued, est.item()))
        ratios, alone, with_comm, covered = [], [], [], True
        before = time_kernel_s(run, steps)
        for _ in range(repeats):
            t, ok = _with_comm_s(run, steps, buf, queued, group, wait_timeout_s)
            flag = torch.tensor([0.0 if ok else 1.0], dtype=torch.float64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
            if flag.item() and queued < max_queued:  # drained early on some rank: once more, twice as long
                queued = min(max_queued, 2 * queued)
                t, ok = _with_comm_s(run, steps, buf, queued, group, wait_timeout_s)
            dist.barrier(group=group)
            after = time_kernel_s(run, steps)
            ratios.append(t / (0.5 * (before + after)))  # against the alone runs just before and after
            alone.append(before)
            with_comm.append(t)
            covered = covered and ok
            before = after
        alone.append(before)
        local.append([statistics.median(alone), statistics.median(with_comm), comm_s, float(queued),
                      1.0 if covered else 0.0, statistics.median(ratios) - 1.0])
    mine = torch.tensor(local, dtype=torch.float64)
    summed = mine.clone()
    dist.all_reduce(summed, group=group)  # means over ranks (alone, with)
    slowest = mine.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)  # all-reduce time: the slowest rank's
    least = mine.clone()
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=group)  # covered: only if on every rank
    rows = []
    for i, nbytes in enumerate(sizes):
        rows.append({"model": model, "batch_size": batch_size, "workers": world, "bytes": nbytes,
                     "kernel_alone_s": float(summed[i, 0]) / world, "kernel_with_comm_s": float(summed[i, 1]) / world,
                     "allreduce_s": float(slowest[i, 2]), "queued_allreduces": int(slowest[i, 3]),
                     "covered": bool(least[i, 4] > 0.5), "slowdown": float(summed[i, 5]) / world})
    return rows


def contention_on_ranks(ctx, models: Sequence[str], sizes_bytes: Sequence[int] | None = None,
                        **kwargs: Any) -> list[dict[str, Any]]:
    """Launch target: :func:`measure_contention` for each of ``models`` in turn on this rank."""
    rows = []
    for m in models:
        rows += measure_contention(m, sizes_bytes, device=ctx.device, **kwargs)
    return rows


def measure_contention_local(models: Sequence[str] = ("tiny_resnet",), world_size: int = 2, *,
                             emulate_bandwidth: str | None = None, sizes_bytes: Sequence[int] | None = None,
                             timeout_s: float = 600.0, **kwargs: Any):
    """:func:`measure_contention` of each model on ``world_size`` local gloo ranks (one compute thread
    each), on loopback or, with ``emulate_bandwidth`` (e.g. ``"100mbit"``, needs root), on an emulated
    link (:func:`repro.launch.local.launch_local`). Returns a DataFrame with :data:`CONTENTION_COLUMNS`
    plus ``cpu_count`` and ``oversubscribed`` (more ranks than cores: the slowdown then includes the
    ranks sharing cores with each other, not only with communication)."""
    import pandas as pd

    from repro.launch.local import launch_local
    from repro.launch.cpus import available_cpus, is_oversubscribed, warn_if_oversubscribed

    warn_if_oversubscribed(world_size, "contention microbenchmark")
    rows = launch_local(contention_on_ranks, world_size, args=(list(models), sizes_bytes), kwargs=kwargs,
                        timeout_s=timeout_s, quiet=True, emulate_bandwidth=emulate_bandwidth)[0]
    cpus = available_cpus()
    return pd.DataFrame(rows, columns=list(CONTENTION_COLUMNS)).assign(
        cpu_count=cpus, oversubscribed=is_oversubscribed(world_size, cpus))


def fit_contention(slowdowns: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """The single ``Realism.contention`` (dimensionless; compute's wall time is ``1 + c`` times longer
    while communication is in flight) from per-size slowdowns, each clipped at 0 first (communication
    cannot speed computation up; a negative value is noise).

    Without ``weights``: their median. With ``weights`` (the sizes' all-reduce seconds,
    ``allreduce_s``): the weighted mean, i.e. the slowdown averaged over the time communication is in
    flight when each size is sent equally often; on a slow link that is mostly the large messages,
    which is where a plan's communication time goes. Non-finite values are ignored; none left gives 0
    (the paper model)."""
    pairs = [(float(v), 1.0 if weights is None else float(w))
             for v, w in zip(slowdowns, weights if weights is not None else [1.0] * len(slowdowns))
             if v is not None and math.isfinite(float(v)) and math.isfinite(1.0 if weights is None else float(w))]
    if not pairs:
        return 0.0
    if weights is None:
        return max(0.0, statistics.median(max(0.0, v) for v, _ in pairs))
    total = sum(max(0.0, w) for _, w in pairs)
    if total <= 0:
        return max(0.0, statistics.median(max(0.0, v) for v, _ in pairs))
    return sum(max(0.0, v) * max(0.0, w) for v, w in pairs) / total
