"""Per-rank training: one model, one scheduler, measured. Entry point of ``repro train`` and torchrun.

    torchrun --nproc-per-node 4 -m repro.train --model resnet50 --scheduler mgwfbp --steps 100 \
        --batch-size 32 --results-dir results/data/runs

Schedulers: ``wfbp``, ``syncea``, ``threshold``, ``mgwfbp``, ``optimal`` execute a Plan with
:class:`~repro.runtime.allreduce.BucketedAllReduce`; ``ddp`` is PyTorch DDP with its defaults;
``ddp_plan`` is DDP with the per-bucket sizes of the ``threshold`` plan (``bucket_cap_mb_list``);
``local`` does no communication (computation only).

Every scheduler first runs ``warmup_steps`` real training steps with one bucket after backward
(SyncEASGD, exact and clean for timing) while per-layer gradient-ready times are recorded; the
ranks average them into a Trace (layer order = reverse of the ready order). Planners that need a
cost model (``mgwfbp``, ``optimal``) get one fitted by timing all-reduces on the live process group
(any world size) unless ``network`` names a preset. Rank 0 solves and broadcasts the Plan.

Rank 0 writes, under ``<results_dir>/<run_id>/``: ``iterations.csv`` (per-step wall seconds, loss),
``epochs.csv`` (convergence runs), ``buckets.csv`` (measured bucket timeline of the last step, when
recorded), ``trace.json``, ``plan.json``, ``cost.json`` and ``run.json`` (config, environment,
summary). :func:`repro.results.combine_runs` joins many runs into one table.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from repro.cost import CostModel, preset
from repro.plan import WIRE_DTYPE_BYTES, Plan
from repro.planners import make_plan
from repro.runtime.buffers import broadcast_buffers
from repro.runtime.allreduce import BucketedAllReduce, ScheduledOptimizer
from repro.runtime.calibrate import default_sizes_bytes, fit_allreduce
from repro.workload.layers import layer_parameters
from repro.trace import Layer, Trace

__all__ = ["SCHEDULERS", "PLAN_SCHEDULERS", "TrainConfig", "train_worker", "run_training", "config_from_argv",
           "worker_from_argv", "main"]

PLAN_SCHEDULERS = ("wfbp", "syncea", "threshold", "mgwfbp", "optimal")
SCHEDULERS = PLAN_SCHEDULERS + ("ddp", "ddp_plan", "local")


@dataclass
class TrainConfig:
    """One run. Sizes in bytes, times in seconds; ``batch_size`` is per rank."""

    model: str = "tiny_resnet"
    scheduler: str = "mgwfbp"
    dataset: str = "synthetic"
    batch_size: int = 32
    steps: int = 20                 # timed steps (synthetic) ; ignored when epochs is set
    epochs: int | None = None       # convergence runs: full passes over the dataset
    warmup_steps: int = 3           # untimed steps that also measure the trace
    compute_steps: int = 5          # extra steps without communication: computation-only time
    view: str = "tensor"
    threshold_bytes: int = 25 * 2**20
    wire_dtype: str | None = None   # "float16" to communicate half-precision gradients
    network: str | None = None      # cost preset for planning instead of a live fit
    fit_repeats: int = 5
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    record_timeline: bool = False
    results_dir: str | None = None
    run_id: str | None = None
    quiet: bool = False
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler '{self.scheduler}'; choose one of {', '.join(SCHEDULERS)}")
        from repro.workload.datasets import DATASET_NAMES
        from repro.workload.models import get_spec

        get_spec(self.model)
        if self.dataset not in DATASET_NAMES:
            raise ValueError(f"unknown dataset '{self.dataset}'; choose one of {', '.join(DATASET_NAMES)}")
        if self.dataset == "synthetic" and self.epochs is not None:
            raise ValueError("epochs need a real dataset (e.g. --dataset digits); synthetic runs use --steps")
        if self.wire_dtype is not None and self.wire_dtype not in WIRE_DTYPE_BYTES:
            raise ValueError(f"unknown wire dtype '{self.wire_dtype}'; choose one of {', '.join(WIRE_DTYPE_BYTES)}")
        if self.wire_dtype not in (None, "float32") and self.scheduler in ("ddp", "ddp_plan", "local"):
            raise ValueError(f"wire_dtype={self.wire_dtype} is supported by the plan schedulers "
                             f"({', '.join(PLAN_SCHEDULERS)}), not by '{self.scheduler}'")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.warmup_steps < 0 or self.compute_steps < 0:
            raise ValueError("warmup_steps and compute_steps must be >= 0")
        if self.epochs is None and self.steps < 1:
            raise ValueError(f"steps must be positive, got {self.steps}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be positive, got {self.epochs}")
        if self.warmup_steps < 1 and self.scheduler in PLAN_SCHEDULERS + ("ddp_plan",):
            raise ValueError("plan schedulers need warmup_steps >= 1 to measure the trace")


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def _batches(cfg: TrainConfig, rank: int, world: int, device: torch.device, epoch: int):
    """(inputs, targets) for one epoch (real dataset) or an endless synthetic stream."""
    if cfg.dataset == "synthetic":
        from repro.workload.models import make_batch

        gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
        while True:
            yield make_batch(cfg.model, cfg.batch_size, device=device, generator=gen, **cfg.model_kwargs)
    from repro.workload.datasets import get_dataset, make_loader

    loader = make_loader(get_dataset(cfg.dataset, split="train"), cfg.batch_size, rank=rank,
                         world_size=world, seed=cfg.seed)
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        yield x.to(device), y.to(device)


# ---------------------------------------------------------------------------------------------
# Trace from the live run, plan, sync
# ---------------------------------------------------------------------------------------------

def _runtime_trace(cfg: TrainConfig, model: nn.Module, ready: list[dict[str, float]],
                   backward_start: list[float], fixed: list[tuple[float, float, float]],
                   device: torch.device) -> Trace:
    """Per-layer backward gaps (median over warm-up steps, mean over ranks) as a Trace, with the
    forward total and the measured pre-forward (buffer broadcast) and update (optimizer) seconds."""
    layers = layer_parameters(model, cfg.view)
    names = list(layers)
    rel = torch.tensor([[r.get(n, b0) - b0 for n in names] for r, b0 in zip(ready, backward_start)], dtype=torch.float64)
    vec = torch.cat([rel.median(dim=0).values, torch.tensor(fixed, dtype=torch.float64).median(dim=0).values])
    vec = vec.to(device)
    dist.all_reduce(vec)
    vec = (vec / dist.get_world_size()).cpu()
    ready_s = vec[:-3].tolist()
    fwd_total, pre_s, update_s = (float(v) for v in vec[-3:])
    # straggler wait: per step, the slowest rank's computation minus the ranks' mean (median over steps)
    per_step = torch.tensor([f[0] + max(r.values(), default=b0) - b0 for f, r, b0 in zip(fixed, ready, backward_start)],
                            dtype=torch.float64, device=device)
    everyone = torch.empty(dist.get_world_size() * per_step.numel(), dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(everyone, per_step)
    everyone = everyone.view(dist.get_world_size(), -1).cpu()
    straggler_s = float((everyone.max(dim=0).values - everyone.mean(dim=0)).median())
    order = sorted(range(len(names)), key=lambda i: ready_s[i], reverse=True)  # forward order
    out, prev = [], 0.0
    gaps = {}
    for i in reversed(order):  # backward order
        gaps[i] = max(0.0, ready_s[i] - prev)
        prev = max(prev, ready_s[i])
    for i in order:
        params = layers[names[i]]
        numel = sum(p.numel() for _, p in params)
        out.append(Layer(names[i], numel, numel * params[0][1].element_size(), fwd_total / len(names), gaps[i]))
    return Trace(cfg.model, cfg.batch_size, str(device), "float32", out,
                 extra={"source": "measured", "method": "runtime gradient-ready hooks, mean over ranks of "
                        "per-step medians; forward total spread evenly over layers", "view": cfg.view,
                        "pre_forward_s": pre_s, "straggler_s": straggler_s, "update_s": update_s})


def _plan_for(cfg: TrainConfig, trace: Trace, device: torch.device) -> tuple[Plan, CostModel]:
    """Rank 0 solves; the plan is broadcast so every rank executes the same buckets."""
    if cfg.network:
        cost = preset(cfg.network, dist.get_world_size())
    else:  # every plan scheduler gets a fit: mgwfbp/optimal plan with it, all record a prediction
        cost, _ = fit_allreduce(default_sizes_bytes(min(trace.total_bytes, 64 * 2**20)),
                                repeats=cfg.fit_repeats, device=device)
    solver = "threshold" if cfg.scheduler == "ddp_plan" else cfg.scheduler
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        opts = {"threshold_bytes": cfg.threshold_bytes} if solver == "threshold" else {}
        plan = make_plan(solver, trace, cost, **opts)
        if cfg.wire_dtype:
            plan = Plan(plan.buckets, plan.solver, cfg.wire_dtype, dict(plan.meta))
        payload[0] = plan.to_dict()
    dist.broadcast_object_list(payload, src=0)
    return Plan.from_dict(payload[0]), cost


def _wrap(cfg: TrainConfig, model: nn.Module, plan: Plan | None, device: torch.device):
    """(model to call, BucketedAllReduce or None)."""
    if cfg.scheduler == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=_ids(device)), None
    if cfg.scheduler == "ddp_plan":
        caps_mb = [b / 2**20 for b in plan.bucket_bytes(_sizes_trace(model, cfg))]
        return nn.parallel.DistributedDataParallel(model, device_ids=_ids(device), bucket_cap_mb_list=caps_mb), None
    if cfg.scheduler == "local":
        return model, None
    return model, BucketedAllReduce(model, plan, view=cfg.view, record_timeline=cfg.record_timeline)


def _ids(device: torch.device):
    return [device.index] if device.type == "cuda" else None


def _sizes_trace(model: nn.Module, cfg: TrainConfig) -> Trace:
    """The model's layers with their gradient sizes and no timings (enough for Plan.bucket_bytes)."""
    layers = layer_parameters(model, cfg.view)
    return Trace(cfg.model, cfg.batch_size, "-", "float32",
                 [Layer(n, sum(p.numel() for _, p in ps), sum(p.numel() * p.element_size() for _, p in ps), 0.0, 0.0)
                  for n, ps in layers.items()])


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_worker(ctx, cfg: TrainConfig) -> dict[str, Any]:
    """Run ``cfg`` on this rank (process group already initialised); returns the run summary."""
    return run_training(ctx, cfg)[1]


def run_training(ctx, cfg: TrainConfig) -> tuple[nn.Module, dict[str, Any]]:
    """Train per ``cfg``; returns the trained (unwrapped) model and the run summary."""
    from repro.workload.models import build_model, compute_loss

    device = torch.device(ctx.device) if not isinstance(ctx.device, torch.device) else ctx.device
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, device=device, **cfg.model_kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def loss_of(m, x, y):
        return compute_loss(cfg.model, m, x, y, **cfg.model_kwargs)

    epoch = 0
    data = _batches(cfg, rank, world, device, epoch)

    def next_batch():
        nonlocal data, epoch
        try:
            return next(data)
        except StopIteration:
            epoch += 1
            data = _batches(cfg, rank, world, device, epoch)
            return next(data)

    # ---- warm-up: exact SyncEASGD steps that measure the trace ----
    trace = plan = cost = None
    if cfg.scheduler in PLAN_SCHEDULERS + ("ddp_plan",):
        names = list(layer_parameters(model, cfg.view))
        warm_plan = Plan.from_dict({"solver": "syncea", "buckets": [names]})
        sync = BucketedAllReduce(model, warm_plan, view=cfg.view)
        wopt = ScheduledOptimizer(opt, sync)
        ready, b0s, fixed = [], [], []
        for _ in range(cfg.warmup_steps):
            x, y = next_batch()
            wopt.zero_grad()
            _sync_device(device)
            tp = time.perf_counter()
            broadcast_buffers(model)
            t0 = time.perf_counter()
            loss = loss_of(model, x, y)
            _sync_device(device)
            b0 = time.perf_counter()
            loss.backward()
            sync.finish()
            _sync_device(device)
            u0 = time.perf_counter()
            opt.step()
            _sync_device(device)
            ready.append(dict(sync.grad_ready_s))
            b0s.append(b0)
            fixed.append((b0 - t0, t0 - tp, time.perf_counter() - u0))  # forward, pre-forward, update
        sync.remove()
        trace = _runtime_trace(cfg, model, ready, b0s, fixed, device)
        plan, cost = _plan_for(cfg, trace, device)
    net, sync = _wrap(cfg, model, plan, device)
    sopt = ScheduledOptimizer(opt, sync)
    if cfg.scheduler in ("ddp", "local"):
        for _ in range(cfg.warmup_steps):
            x, y = next_batch()
            sopt.zero_grad()
            loss_of(net, x, y).backward()
            sopt.step()

    # ---- timed steps ----
    rows, bucket_rows = [], []
    inrun_ready, inrun_b0, inrun_fixed = [], [], []  # the trace as measured under this schedule
    steps = cfg.steps if cfg.epochs is None else None
    progress = _progress(rank == 0 and not cfg.quiet, steps, cfg)
    step = 0
    start_epoch = epoch
    epoch_rows = []
    while True:
        if steps is not None and step >= steps:
            break
        if steps is None and epoch - start_epoch >= cfg.epochs:
            break
        cur_epoch = epoch
        x, y = next_batch()
        if steps is None and epoch != cur_epoch:
            epoch_rows.append(_evaluate(cfg, model, epoch - start_epoch, rows, device))
            if epoch - start_epoch >= cfg.epochs:
                break
        sopt.zero_grad()
        _sync_device(device)
        t0 = time.perf_counter()
        if sync is not None:  # DDP does this itself (broadcast_buffers=True)
            broadcast_buffers(model)
        tf = time.perf_counter()
        loss = loss_of(net, x, y)
        tb = time.perf_counter()
        loss.backward()
        tw = time.perf_counter()  # backward returned (CPU: compute done; communication may go on)
        sopt.step()
        _sync_device(device)
        t1 = time.perf_counter()
        rows.append({"step": step, "epoch": epoch - start_epoch, "iteration_s": t1 - t0,
                     "forward_s": tb - t0, "backward_call_s": tw - tb, "step_s": t1 - tw, "loss": loss.item()})
        if sync is not None:
            inrun_ready.append(dict(sync.grad_ready_s))
            inrun_b0.append(tb)
            inrun_fixed.append((tb - tf, tf - t0, trace.extra["update_s"]))
        if sync is not None and cfg.record_timeline:
            bucket_rows = [{"bucket": t.bucket, "layers": len(t.layers), "bytes": t.bytes,
                            "start_s": t.launch_s - t0, "end_s": t.end_s - t0} for t in sync.timings]
        step += 1
        progress.update(1)
    progress.close()
    if steps is None and (not epoch_rows or epoch_rows[-1]["epoch"] < cfg.epochs):
        epoch_rows.append(_evaluate(cfg, model, cfg.epochs, rows, device))

    # ---- computation only: a copy of the model, no communication ----
    if sync is not None:
        sync.remove()
    compute_times = []
    if cfg.compute_steps:
        solo = copy.deepcopy(model)
        solo_opt = torch.optim.SGD(solo.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        for i in range(cfg.compute_steps + 1):  # the first one warms the momentum buffers up
            x, y = next_batch()
            solo_opt.zero_grad(set_to_none=True)
            _sync_device(device)
            t0 = time.perf_counter()
            loss_of(solo, x, y).backward()
            solo_opt.step()
            _sync_device(device)
            if i:
                compute_times.append(time.perf_counter() - t0)
        del solo, solo_opt

    inrun = None
    if sync is not None and inrun_ready and cfg.epochs is None:
        inrun = _runtime_trace(cfg, model, inrun_ready, inrun_b0, inrun_fixed, device)
        inrun.extra["method"] += f"; measured during the timed steps under '{cfg.scheduler}'"
    summary = _summarise(cfg, ctx, rows, compute_times, plan, trace, cost)
    if rank == 0 and cfg.results_dir:
        _write_run(cfg, summary, rows, epoch_rows, bucket_rows, trace, plan, cost)
        if inrun is not None:
            inrun.save(Path(cfg.results_dir) / summary["run_id"] / "trace_inrun.json")
    summary["epochs"] = epoch_rows
    return model, summary


def _progress(enabled: bool, total: int | None, cfg: TrainConfig):
    if enabled:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"{cfg.model}/{cfg.scheduler}", unit="step")

    class _Null:
        def update(self, n):
            pass

        def close(self):
            pass

    return _Null()


@torch.no_grad()
def _evaluate(cfg: TrainConfig, model: nn.Module, epoch: int, rows: list[dict], device) -> dict[str, Any]:
    """Accuracy on the dataset's test split (each rank a shard, counts summed) and mean train loss."""
    from repro.workload.datasets import get_dataset, make_loader

    was_training = model.training
    model.eval()
    test = get_dataset(cfg.dataset, split="test")
    loader = make_loader(test, min(cfg.batch_size, 64), rank=dist.get_rank(), world_size=dist.get_world_size(),
                         shuffle=False, drop_last=False)
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        counts[0] += (logits.argmax(dim=1) == y).sum()
        counts[1] += y.numel()
        counts[2] += nn.functional.cross_entropy(logits, y, reduction="sum")
    dist.all_reduce(counts)
    model.train(was_training)
    losses = [r["loss"] for r in rows if r["epoch"] == epoch - 1] or [float("nan")]
    return {"epoch": epoch, "train_loss": statistics.fmean(losses), "test_loss": float(counts[2] / counts[1]),
            "test_accuracy": float(counts[0] / counts[1])}


def _summarise(cfg, ctx, rows, compute_times, plan, trace, cost) -> dict[str, Any]:
    iters = [r["iteration_s"] for r in rows]
    world = dist.get_world_size()
    med = torch.tensor([statistics.median(iters) if iters else float("nan"),
                        statistics.median(compute_times) if compute_times else float("nan")], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank decides
    iteration_s, compute_s = med.tolist()
    import os

    bandwidth = os.environ.get("REPRO_EMULATED_BANDWIDTH_BPS")
    bwd = statistics.median(r["backward_call_s"] for r in rows) if rows else float("nan")
    run_id = cfg.run_id or f"{cfg.model}_{cfg.scheduler}_p{world}_{int(time.time() * 1e3)}"
    return {"run_id": run_id, "model": cfg.model, "scheduler": cfg.scheduler, "world_size": world,
            "backend": dist.get_backend(),
            "emulated_bandwidth_bps": float(bandwidth) if bandwidth else None,
            "backward_call_s": bwd,
            "trace_backward_s": trace.total_backward_s if trace is not None else None,
            "batch_size": cfg.batch_size, "wire_dtype": cfg.wire_dtype or "float32",
            "iteration_s": iteration_s, "compute_s": compute_s,
            "exposed_comm_s": max(0.0, iteration_s - compute_s),
            "throughput_samples_s": world * cfg.batch_size / iteration_s,
            "buckets": plan.num_buckets if plan else None, "steps": len(rows),
            "predicted_iteration_s": plan.meta.get("iteration_s") if plan else None}


def _write_run(cfg, summary, rows, epoch_rows, bucket_rows, trace, plan, cost) -> None:
    import pandas as pd

    from repro.results import environment

    run_id = summary["run_id"]
    out = Path(cfg.results_dir) / run_id
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).assign(run_id=run_id).to_csv(out / "iterations.csv", index=False)
    if epoch_rows:
        pd.DataFrame(epoch_rows).assign(run_id=run_id).to_csv(out / "epochs.csv", index=False)
    if bucket_rows:
        pd.DataFrame(bucket_rows).assign(run_id=run_id).to_csv(out / "buckets.csv", index=False)
    if trace is not None:
        trace.save(out / "trace.json")
    if plan is not None:
        plan.save(out / "plan.json")
    if cost is not None:
        (out / "cost.json").write_text(json.dumps(cost.to_dict(), indent=1) + "\n")
    env = environment()
    env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or ["cpu"]
    (out / "run.json").write_text(json.dumps({"run_id": run_id, "config": asdict(cfg), "summary": summary,
                                              "environment": env}, indent=1, default=str) + "\n")


# ---------------------------------------------------------------------------------------------
# Command line (per rank, under torchrun)
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="repro train", description="Train one model with one scheduler (per rank).")
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        if f.name in ("model_kwargs",):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", default=default)
        elif f.name in ("epochs",):
            p.add_argument(flag, type=int, default=default)
        elif f.name in ("wire_dtype", "network", "results_dir", "run_id"):
            p.add_argument(flag, type=str, default=default)
        else:
            p.add_argument(flag, type=type(default), default=default)
    p.add_argument("--seq-len", type=int, help="sequence length for BERT/LSTM models")
    p.add_argument("--backend", choices=["gloo", "nccl"], help="force a backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--pg-timeout-s", type=float, default=300.0, help="process-group timeout, seconds")
    return p


def config_from_argv(argv: Sequence[str]) -> tuple[TrainConfig, argparse.Namespace]:
    """Parse ``repro train`` arguments into a config (ValueError on bad input)."""
    args = build_parser().parse_args(list(argv))
    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name != "model_kwargs"}
    if args.seq_len:
        kw["model_kwargs"] = {"seq_len": args.seq_len}
    return TrainConfig(**kw), args


def worker_from_argv(ctx, argv: Sequence[str]) -> dict[str, Any]:
    """Launch target (``repro launch``): train the config given as ``repro train`` arguments."""
    cfg, _ = config_from_argv(argv)
    return train_worker(ctx, cfg)


def main(argv: Sequence[str] | None = None, *, hard_exit: bool = False) -> int:
    """Per-rank entry point: ``torchrun ... -m repro.train`` or ``repro train`` (one line on bad input).

    ``hard_exit``: after a successful run, leave with ``os._exit(0)`` once output is flushed, skipping
    interpreter teardown (gloo's threads can abort a finished process there, failing the torchrun job).
    """
    import sys

    from repro.cluster.local import DistributedSetupError, distributed

    try:
        cfg, args = config_from_argv(sys.argv[1:] if argv is None else argv)
        with distributed(backend=args.backend, timeout_s=args.pg_timeout_s) as ctx:
            summary = train_worker(ctx, cfg)
            if ctx.is_main:
                print(json.dumps({k: v for k, v in summary.items() if k != "epochs"}))
    except (ValueError, FileNotFoundError, DistributedSetupError) as e:
        print(f"repro train: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if hard_exit:
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(hard_exit=True))
