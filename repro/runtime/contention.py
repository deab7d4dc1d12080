"""Measure on the live ranks how much slower computation runs while gloo communication is in flight.

The result is the simulator's ``Realism.contention`` ``c`` (:mod:`repro.core.contention`, dimensionless:
compute's wall time is ``1 + c`` times longer while a collective is in flight). Per message size, the
training model's forward + backward is timed alone and while a queue of async all-reduces keeps the
group busy, alternating so that machine drift cancels; :func:`fit_contention` reduces the per-size
slowdowns to one ``c``. Every wait has a timeout. Method: docs/design/runtime.md.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

from repro.runtime.calibrate import default_sizes_bytes, median_s

__all__ = ["CONTENTION_COLUMNS", "default_contention_sizes_bytes", "time_kernel_s", "measure_contention",
           "contention_on_ranks", "measure_contention_local", "fit_contention"]

CONTENTION_COLUMNS = ("model", "batch_size", "workers", "bytes", "kernel_alone_s", "kernel_with_comm_s",
                      "allreduce_s", "queued_allreduces", "covered", "slowdown")
"""Columns of a contention table, one row per message size: kernel seconds alone and with communication
(medians, mean over ranks), one all-reduce's seconds (slowest rank), the queue length, whether the queue
outlasted the kernel on every rank and repeat, and ``slowdown`` (median of ``with / alone - 1``; noise
can make it negative)."""


def default_contention_sizes_bytes(model_bytes: int, count: int = 3, min_bytes: int = 16384) -> list[int]:
    """``count`` geometric all-reduce sizes from ``min_bytes`` (a small layer's gradient) to
    ``model_bytes`` (the whole model), multiples of 4 bytes."""
    return default_sizes_bytes(model_bytes, count, min_bytes)


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
    """On every rank of ``group``: the kernel's slowdown under in-flight all-reduces per size
    (``sizes_bytes`` default to :func:`default_contention_sizes_bytes` of the model's gradient bytes).
    Returns rows with :data:`CONTENTION_COLUMNS`, identical on every rank."""
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
        comm_s = median_s(lambda: dist.all_reduce(buf, group=group), 5, group)  # one blocking all-reduce, this rank
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
    # sums for the means over ranks (alone, with), the slowest rank's all-reduce time, covered only if on every rank
    summed, slowest, least = (torch.tensor(local, dtype=torch.float64) for _ in range(3))
    for reduced, op in ((summed, dist.ReduceOp.SUM), (slowest, dist.ReduceOp.MAX), (least, dist.ReduceOp.MIN)):
        dist.all_reduce(reduced, op=op, group=group)
    return [{"model": model, "batch_size": batch_size, "workers": world, "bytes": nbytes,
             "kernel_alone_s": float(summed[i, 0]) / world, "kernel_with_comm_s": float(summed[i, 1]) / world,
             "allreduce_s": float(slowest[i, 2]), "queued_allreduces": int(slowest[i, 3]),
             "covered": bool(least[i, 4] > 0.5), "slowdown": float(summed[i, 5]) / world}
            for i, nbytes in enumerate(sizes)]


def contention_on_ranks(ctx, models: Sequence[str], sizes_bytes: Sequence[int] | None = None,
                        **kwargs: Any) -> list[dict[str, Any]]:
    """Launch target: :func:`measure_contention` for each of ``models`` in turn on this rank."""
    return [row for m in models for row in measure_contention(m, sizes_bytes, device=ctx.device, **kwargs)]


def measure_contention_local(models: Sequence[str] = ("tiny_resnet",), world_size: int = 2, *,
                             emulate_bandwidth: str | None = None, sizes_bytes: Sequence[int] | None = None,
                             timeout_s: float = 600.0, **kwargs: Any):
    """:func:`measure_contention` of each model on ``world_size`` local gloo ranks, on loopback or an
    emulated link (``emulate_bandwidth``, e.g. ``"100mbit"``, needs root). Returns a DataFrame with
    :data:`CONTENTION_COLUMNS` plus ``cpu_count`` and ``oversubscribed`` (more ranks than cores)."""
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
    """The single ``Realism.contention`` from per-size slowdowns, each clipped at 0 (a negative one is
    noise): their median, or with ``weights`` (the sizes' ``allreduce_s``) their weighted mean, the
    slowdown averaged over the time communication is in flight. Non-finite values are ignored; none
    left gives 0."""
    ws = weights if weights is not None else [1.0] * len(slowdowns)
    pairs = [(max(0.0, float(v)), float(w)) for v, w in zip(slowdowns, ws)
             if v is not None and math.isfinite(float(v)) and math.isfinite(float(w))]
    if not pairs:
        return 0.0
    total = sum(max(0.0, w) for _, w in pairs)
    if weights is None or total <= 0:
        return statistics.median(v for v, _ in pairs)
    return sum(v * max(0.0, w) for v, w in pairs) / total
