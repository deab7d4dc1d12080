"""What a ``repro train`` run keeps: its evaluation per epoch, its summary, and its run folder.

The loop (:mod:`repro.train`) calls these; the run folder's format is :mod:`repro.results.runs`' business.
Times in seconds, throughput in samples per second (all training ranks together).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from repro.results.runs import BUCKETS_CSV, EPOCHS_CSV, ITERATIONS_CSV, TRACE_INRUN_JSON, RunWriter

if TYPE_CHECKING:
    from repro.training.config import TrainConfig

__all__ = ["timing_row", "evaluate", "summarise", "run_environment", "write_run"]


def timing_row(timing: Any, origin_s: float) -> dict[str, Any]:
    """One ``buckets.csv`` row from an executor's timing record (times after ``origin_s``): its own
    ``row``, else :func:`repro.runtime.executor.timing_row`."""
    if hasattr(timing, "row"):
        return timing.row(origin_s)
    from repro.runtime.executor import timing_row as record_row

    return record_row(timing, origin_s)


#: training batches per rank that re-estimate BatchNorm's statistics before an evaluation
BATCHNORM_BATCHES = 8


@torch.no_grad()
def batchnorm_statistics(cfg: Any, model: nn.Module, device, group=None, batches: int = BATCHNORM_BATCHES):
    """Re-estimate every BatchNorm's running statistics for the weights about to be evaluated ("precise
    BN"): ``batches`` training batches of this rank's shard (a loader of its own, seed + 1) forward with
    only BatchNorm in train mode (cumulative average), then averaged over the trainers. Returns what
    :func:`restore_batchnorm` puts back (None: no BatchNorm, or synthetic data), so training is unchanged.
    The running averages lag the weights when they move in bursts (top-k with error feedback)."""
    from repro.workload.datasets import get_dataset, make_loader

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms or cfg.dataset == "synthetic":
        return None
    saved = [(m, m.momentum, m.training, [b.clone() for b in (m.running_mean, m.running_var, m.num_batches_tracked)])
             for m in norms]
    was_training = model.training
    model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    loader = make_loader(get_dataset(cfg.dataset, split="train"), cfg.batch_size, rank=dist.get_rank(group),
                         world_size=dist.get_world_size(group), seed=cfg.seed + 1)
    for i, (x, _) in enumerate(loader):
        if i == batches:
            break
        model(x.to(device))
    model.train(was_training)
    world = dist.get_world_size(group)
    for m in norms:
        for b in (m.running_mean, m.running_var):
            dist.all_reduce(b, group=group)
            b.div_(world)
    return saved


@torch.no_grad()
def restore_batchnorm(saved) -> None:
    """Put back what :func:`batchnorm_statistics` replaced (statistics, momentum, mode)."""
    for m, momentum, training, buffers in saved or ():
        m.momentum = momentum
        m.train(training)
        for b, old in zip((m.running_mean, m.running_var, m.num_batches_tracked), buffers):
            b.copy_(old)


@torch.no_grad()
def evaluate(cfg: TrainConfig, model: nn.Module, epoch: int, rows: list[dict], device, group=None) -> dict[str, Any]:
    """Loss and accuracy on the test split (sums over the ranks' shards), after
    :func:`batchnorm_statistics`, and the epoch's mean train loss. Language models: per-token
    cross-entropy (nats), next-token accuracy and ``test_perplexity = exp(test_loss)``."""
    from repro.workload.datasets import get_dataset, make_loader
    from repro.workload.models import get_spec

    saved = batchnorm_statistics(cfg, model, device, group)
    was_training = model.training
    model.eval()
    test = get_dataset(cfg.dataset, split="test")
    loader = make_loader(test, min(cfg.batch_size, 64), rank=dist.get_rank(group), world_size=dist.get_world_size(group),
                         shuffle=False, drop_last=False)
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)  # LM: every position a prediction
        counts[0] += (logits.argmax(dim=-1) == y).sum()
        counts[1] += y.numel()
        counts[2] += nn.functional.cross_entropy(logits, y, reduction="sum")
    dist.all_reduce(counts, group=group)
    model.train(was_training)
    restore_batchnorm(saved)
    losses = [r["loss"] for r in rows if r["epoch"] == epoch - 1] or [float("nan")]
    test_loss = float(counts[2] / counts[1])
    out = {"epoch": epoch, "train_loss": statistics.fmean(losses), "test_loss": test_loss,
           "test_accuracy": float(counts[0] / counts[1])}
    if get_spec(cfg.model).family == "lm":
        out["test_perplexity"] = math.exp(test_loss) if test_loss < 700 else float("inf")
    return out


def summarise(cfg, run_id, rows, compute_times, plan, trace, device, ranks: Any = None) -> dict[str, Any]:
    """The run's summary: the slowest training rank's median iteration and compute times (seconds), exposed
    communication and throughput. ``ranks``: the trainers (group, size, servers); None: every rank."""
    group, world, servers = (ranks.group, ranks.size, ranks.servers) if ranks is not None else \
        (None, dist.get_world_size(), 0)
    iters = [r["iteration_s"] for r in rows]
    med = torch.tensor([statistics.median(iters) if iters else float("nan"),
                        statistics.median(compute_times) if compute_times else float("nan")], dtype=torch.float64,
                       device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)  # the slowest rank decides
    iteration_s, compute_s = med.cpu().tolist()
    bwd = statistics.median(r["backward_call_s"] for r in rows) if rows else float("nan")
    return {"run_id": run_id, "model": cfg.model, "scheduler": cfg.scheduler, "world_size": world,
            "servers": servers, "ranks": world + servers,
            "backend": dist.get_backend(),
            "emulated_bandwidth_bps": cfg.emulated_bandwidth_bps,
            "backward_call_s": bwd,
            "trace_backward_s": trace.total_backward_s if trace is not None else None,
            "batch_size": cfg.batch_size,
            "wire_dtype": (getattr(plan, "wire_dtype", None) or cfg.wire_dtype) or "float32",
            "iteration_s": iteration_s, "compute_s": compute_s,
            "exposed_comm_s": max(0.0, iteration_s - compute_s),
            "throughput_samples_s": world * cfg.batch_size / iteration_s,
            "buckets": plan.num_buckets if plan else None, "steps": len(rows),
            "predicted_iteration_s": plan.meta.get("iteration_s") if plan else None}


def run_environment() -> dict[str, Any]:
    """This rank's versions, devices, CPUs and threads."""
    from repro.results.tables import environment
    from repro.launch.cpus import available_cpus

    env = environment()
    env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or ["cpu"]
    env["cpu_count"] = available_cpus()
    env["threads_per_rank"] = torch.get_num_threads()
    return env


def write_run(cfg, summary, rows, epoch_rows, bucket_rows, trace, inrun_trace, plan, cost,
               extra_tables=None) -> None:
    import pandas as pd

    run_id = summary["run_id"]
    with RunWriter(cfg.results_dir, run_id, overwrite=cfg.overwrite) as w:
        w.table(ITERATIONS_CSV, pd.DataFrame(rows).assign(run_id=run_id))
        extra = [(f"{name}.csv", table_rows) for name, table_rows in (extra_tables or {}).items()]
        for name, table_rows in [(EPOCHS_CSV, epoch_rows), (BUCKETS_CSV, bucket_rows), *extra]:
            if table_rows:
                w.table(name, pd.DataFrame(table_rows).assign(run_id=run_id))
        if trace is not None:
            w.trace(trace)
        if inrun_trace is not None:
            w.trace(inrun_trace, TRACE_INRUN_JSON)
        if plan is not None:
            w.plan(plan)
        if cost is not None:
            w.cost(cost)
        w.record({"run_id": run_id, "config": asdict(cfg), "summary": summary, "environment": run_environment()})
