"""Per-rank training: one model, one scheduler, measured. Entry point of ``repro train`` and torchrun.

    torchrun --nproc-per-node 4 -m repro.train --model resnet50 --scheduler mgwfbp --steps 100 \
        --batch-size 32 --results-dir results/data/runs

This loop (:func:`run_training`) is a client of the public door, :func:`repro.distribute`, like a
user's own script: the warm-up, online planning (on a cost model the plan's family fits on the live
group unless ``network`` names a preset) and execution are the door's. What it adds is the measuring
(phase stamps, in-run trace, computation-only steps), the parameter server's serving ranks and the
run folder (:mod:`repro.results.runs`), written by rank 0 atomically; an existing run id is refused
unless ``overwrite``. The options (:class:`TrainConfig`) and the command line live in the torch-free
:mod:`repro.training.config`, so ``--help`` and the checks before any rank starts do not import torch.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m repro.train --help`: the options, without importing torch
    import os as _os
    import sys as _sys

    # c10's warnings about a closed store or socket carry a page of C++ frames each; a rank's failure is one
    # line (main). Read when torch is imported, so set here; TORCH_CPP_LOG_LEVEL=WARNING brings them back.
    _os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

    if {"-h", "--help"} & set(_sys.argv[1:]):
        from repro.training.config import build_parser as _help_parser

        _help_parser().parse_args(_sys.argv[1:])

import copy
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from repro.launch.faults import maybe_fail
from repro.core.cost import CostModel
from repro.core.families import get_family
from repro.log import get_logger
from repro.core.plan import Plan, check_plan_workers
from repro.results.runs import ProgressWriter, prepare_run
from repro.runtime.online import StepTimes, measured_trace, sync_device
from repro.core.schedulers import get_scheduler
from repro.core.trace import Trace
from repro.training.config import TrainConfig, build_parser, config_from_argv
from repro.training.data import Batches
from repro.training.checkpoint import RESUME_EXIT, Checkpointer, Preempted, checkpoint_path, set_rng_state
from repro.training.record import evaluate as _evaluate
from repro.training.record import summarise as _summarise
from repro.training.record import timing_row as _timing_row
from repro.training.record import write_run as _write_run

log = get_logger(__name__)

__all__ = ["TrainConfig", "train_worker", "run_training", "config_from_argv", "worker_from_argv", "main",
           "build_parser"]


# ---------------------------------------------------------------------------------------------
# One step, for every executor
# ---------------------------------------------------------------------------------------------

class _Precision:
    """``--amp`` on ``device``: the autocast context of the forward and the loss, and for ``fp16`` the
    ``torch.amp.GradScaler`` that scales the loss before backward and steps the optimizer (it skips a
    step whose gradients have an inf/nan and backs the scale off). ``off``: float32, no scaler.

    A step under it costs what the loop does: the autocast casts are in the forward's time, the scaler's
    ``scale``/``step``/``update`` in the step's (phase stamps are taken around them, never instead)."""

    def __init__(self, amp: str, device: torch.device) -> None:
        from repro.training.config import AMP_DTYPES

        name = AMP_DTYPES[amp]
        self.amp = amp
        self.dtype = getattr(torch, name) if name else None
        self.device_type = device.type

    def autocast(self):
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def scaler(self):
        """A fresh GradScaler for ``fp16`` (one per optimizer), else None."""
        return torch.amp.GradScaler(self.device_type) if self.amp == "fp16" else None


def _timed_step(module: nn.Module, opt: Any, batch, loss_of, device: torch.device, precision: _Precision,
                scaler: Any = None) -> tuple[float, float, torch.Tensor]:
    """One training step as a user's loop makes it (zero_grad, forward, backward, step) between two
    device synchronisations: ``(start, end, loss)``, host ``perf_counter`` seconds. The forward and
    loss run under ``precision``'s autocast; ``scaler`` (fp16): the GradScaler loop,
    ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``, its work inside the step."""
    x, y = batch
    opt.zero_grad(set_to_none=True)
    sync_device(device)
    t0 = time.perf_counter()
    with precision.autocast():
        loss = loss_of(module, x, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    sync_device(device)
    return t0, time.perf_counter(), loss


# ---------------------------------------------------------------------------------------------
# Trace from the live run, plan
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Ranks:
    """Who trains. ``group``: the process group of the training ranks (None: every rank); ``rank`` and
    ``size``: this rank's index among them and their number; ``first``: the global rank of the first
    trainer (it plans and writes the run); ``servers``: ranks before it that serve instead (a family
    with serving ranks, :mod:`repro.core.families`)."""

    group: Any
    rank: int
    size: int
    first: int = 0
    servers: int = 0

    @property
    def serving(self) -> bool:
        return dist.get_rank() < self.servers

    @property
    def is_first(self) -> bool:
        return dist.get_rank() == self.first


def _ranks(cfg: TrainConfig) -> _Ranks:
    """The trainers of this job (every rank calls it: a new group is made collectively)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    servers = cfg.serving_ranks()
    if not servers:
        return _Ranks(None, rank, world)
    group = dist.new_group(list(range(servers, world)))
    return _Ranks(group, rank - servers, world - servers, servers, servers)


def _distribute(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, ranks: "_Ranks",
                grad_scaler: Any = None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``cfg``'s scheduler on ``model`` through :func:`repro.distribute` (the public door: one
    implementation of warm-up, online planning and execution); returns the door's (model, optimizer).
    Dedicated server ranks are the door's ``dedicated_servers`` (every rank calls this; on a serving
    rank it serves the run and returns an optimizer with ``serving`` True and the servers' ``tables``).
    ``grad_scaler``: the loop's GradScaler (``--amp fp16``), given to the door so that every rank skips
    a step with an inf/nan gradient, and backs the scale off, together."""
    from repro.api import distribute

    kw: dict[str, Any] = {"warmup_steps": max(1, cfg.warmup_steps), "view": cfg.view, "fit_repeats": cfg.fit_repeats,
                          "record_timeline": cfg.record_timeline, "model_name": cfg.model,
                          "dedicated_servers": ranks.servers, "wrap_after_warmup": True}
    if grad_scaler is not None:
        kw["grad_scaler"] = grad_scaler
    if cfg.network is not None:  # a preset name, or a cost file (its name wins, as everywhere)
        kw["cost" if Path(cfg.network).is_file() else "network"] = cfg.network
    if cfg.plan is not None:  # a given plan, executed as it is (the door checks it fits the model)
        scheduler = Plan.load(cfg.plan)
        check_plan_workers(scheduler, ranks.size, cfg.plan)  # a plan for P=3 never runs silently on 2 ranks
        takes = get_family(scheduler.family).executor_options  # what its family's executor takes (e.g. engine)
    else:
        sched, scheduler = get_scheduler(cfg.scheduler), cfg.scheduler
        takes = sched.planner_options + sched.executor_options
        if cfg.wire_dtype:
            kw["wire_dtype"] = cfg.wire_dtype
    options = {name: getattr(cfg, name) for name in takes if getattr(cfg, name) is not None}
    return distribute(model, opt, scheduler, **kw, **options)


def _door_step(dopt: Any, batch, loss_of, device: torch.device, precision: _Precision,
               scaler: Any = None) -> StepTimes:
    """One training step as a user's loop makes it (zero_grad, forward, backward, step) with the door's
    optimizer and the module it says to call (``dopt.module``: a wrapping executor's after the warm-up,
    ``wrap_after_warmup``); its phase stamps are the door's (``dopt.last_stamps``): when the device reached
    each phase (synchronised stamps in the warm-up, where they make the trace; CUDA events after it on
    a GPU), so the phase columns of ``iterations.csv`` and the in-run trace are device times.
    ``precision``/``scaler`` (``--amp``): as :func:`_timed_step`; the step's end stamp is after
    ``update()``, so the iteration time holds the scaler's work. The recorded loss is unscaled."""
    t0, end, loss = _timed_step(dopt.module, dopt, batch, loss_of, device, precision, scaler)
    s = dopt.last_stamps
    return StepTimes(s.get("start", t0), s.get("forward_start", t0), s.get("backward_start", t0),
                     s.get("backward_end", end), s.get("exchange_end", end), end, float(loss.detach()))


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def train_worker(ctx, cfg: TrainConfig) -> dict[str, Any]:
    """Run ``cfg`` on this rank (process group already initialised); returns the run summary."""
    return run_training(ctx, cfg)[1]


def _make_optimizer(cfg: TrainConfig, params) -> torch.optim.Optimizer:
    """``cfg.optimizer`` (a name of :data:`repro.training.config.OPTIMIZERS`): sgd with ``lr``, ``momentum`` and
    ``weight_decay``, adamw with ``lr`` and (decoupled) ``weight_decay``, any other with ``lr`` and
    ``weight_decay`` where its constructor takes them (its own defaults for the rest)."""
    import inspect

    from repro.training.config import OPTIMIZERS

    name = cfg.optimizer.lower()
    if name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    cls_name = OPTIMIZERS.get(name, cfg.optimizer)
    cls = getattr(torch.optim, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ValueError(f"optimizer '{cfg.optimizer}': torch {torch.__version__} has no torch.optim.{cls_name}")
    takes = inspect.signature(cls).parameters
    return cls(params, **{k: getattr(cfg, k) for k in ("lr", "weight_decay") if k in takes})


def _train_device(ctx, cfg: TrainConfig) -> torch.device:
    """Where this rank trains: ``cfg.device`` if given (``cuda``: this rank's GPU, ``cuda:LOCAL_RANK``),
    else the process group's device (``ctx.device``: cuda with nccl, cpu with gloo)."""
    device = torch.device(ctx.device) if not isinstance(ctx.device, torch.device) else ctx.device
    if cfg.device is None or cfg.device == device.type:
        return device
    if cfg.device == "cpu":
        if dist.get_backend() == "nccl":
            raise ValueError("--device cpu does not go with the nccl backend, which communicates CUDA tensors only; "
                             "use --backend gloo")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("--device cuda, but CUDA is not available here (torch.cuda.is_available() is False); use "
                         "--device cpu")
    index, count = getattr(ctx, "local_rank", 0), torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"--device cuda trains each rank on its own GPU, cuda:LOCAL_RANK, but LOCAL_RANK is {index} "
                         f"and {count} GPU(s) are visible; start at most {count} rank(s) per node")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def _default_run_id(cfg: TrainConfig, world: int, device: torch.device, servers: int = 0) -> str:
    stamp = torch.tensor([int(time.time() * 1e3)], dtype=torch.int64, device=device)  # NCCL: on the GPU
    dist.broadcast(stamp, src=0)  # one id for every rank
    serving = f"_s{servers}" if servers else ""
    return f"{cfg.model}_{cfg.scheduler}_p{world}{serving}_{int(stamp.item())}"


def run_training(ctx, cfg: TrainConfig) -> tuple[nn.Module, dict[str, Any]]:
    """Train per ``cfg``; returns the trained (unwrapped) model and the run summary (every rank of the
    job returns the same summary; serving ranks return their model copy)."""
    from repro.workload.models import build_model, compute_loss

    device = _train_device(ctx, cfg)
    sched = get_scheduler(cfg.scheduler)
    cfg.check_world(dist.get_world_size(), backend=dist.get_backend(), device=device.type)
    cfg.amp_device_check(device.type)
    precision = _Precision(cfg.amp, device)
    ranks = _ranks(cfg)
    run_id = cfg.run_id or _default_run_id(cfg, ranks.size, device, ranks.servers)
    ckpt_file = checkpoint_path(cfg.results_dir, run_id) if cfg.checkpointing else None
    if cfg.results_dir and ranks.is_first:  # refuse a taken id before any work (a checkpoint's folder is ours)
        prepare_run(cfg.results_dir, run_id, cfg.overwrite, own_progress=bool(ckpt_file and ckpt_file.is_file()))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, device=device, **cfg.model_kwargs)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _make_optimizer(cfg, params)
    if ranks.serving:
        return model, _serve(cfg, model, opt, ranks)
    data = Batches(cfg, ranks.rank, ranks.size, device, cfg.num_workers)

    def loss_of(m, x, y):
        return compute_loss(cfg.model, m, x, y, **cfg.model_kwargs)

    # ---- the scheduler, through the public door (repro.distribute): a plan scheduler's first
    # warmup_steps steps measure the trace under exact SyncEASGD steps, then it plans online ----
    scaler = precision.scaler()  # --amp fp16: the loop's GradScaler (None otherwise)
    _, dopt = _distribute(cfg, model, opt, ranks, scaler)
    ckpt = None
    if cfg.checkpointing:  # every training rank (a collective when it makes a gloo group)
        ckpt = Checkpointer(cfg.results_dir, run_id, every_min=cfg.checkpoint_every_min,
                            stop_at_step=cfg.checkpoint_stop_at_step, group=ranks.group, first=ranks.first,
                            rank=ranks.rank, size=ranks.size)
    resumed = ckpt.load(asdict(cfg), (Path(cfg.results_dir) / run_id / "run.json").is_file(), device) \
        if ckpt is not None else None
    if resumed is None:
        for _ in range(cfg.warmup_steps if dopt.plan is not None or not sched.has_plan else 0):
            _door_step(dopt, data.next(), loss_of, device, precision, scaler)
        while dopt.warming_up:  # a plan scheduler: exactly warmup_steps steps, then the plan's executor runs
            _door_step(dopt, data.next(), loss_of, device, precision, scaler)
        trace, plan, cost = dopt.trace, dopt.plan, dopt.cost
    else:  # the checkpoint's model, optimizer, plan and executor state; then the data and the generators
        model.load_state_dict(resumed["model"])
        dopt.load_state_dict(resumed["optimizer"])
        data.load_state(resumed["mine"]["data"])  # before the generators: a loader draws a seed at its start
        set_rng_state(resumed["mine"]["rng"], device)
        trace = Trace.from_dict(resumed["trace"]) if resumed["trace"] is not None else None
        cost = CostModel.from_dict(resumed["cost"]) if resumed["cost"] is not None else None
        plan = dopt.plan
    if ckpt is not None:
        dopt.check_checkpointable()  # e.g. FSDP's executor: one line now, not at the first checkpoint
    if trace is not None and ranks.is_first:
        log.info("%s: measured %d layers (backward %.4f s) in %d warm-up steps; %s plan has %d buckets, "
                 "predicted %.4f s per iteration", run_id, trace.num_layers, trace.total_backward_s,
                 cfg.warmup_steps, cfg.scheduler, plan.num_buckets, plan.meta.get("iteration_s", float("nan")))

    # ---- timed steps ----
    rows, bucket_rows, epoch_rows, inrun = [], [], [], []
    bucket_steps = []  # every timed step's bucket timeline (buckets.csv keeps the last): buckets_steps.csv
    steps = cfg.steps if cfg.epochs is None else None
    progress = _progress(ranks.is_first and not cfg.quiet, steps, cfg)
    progress_file = ProgressWriter(cfg.results_dir, run_id) if cfg.results_dir and ranks.is_first and \
        steps is None else None
    step = 0
    start_epoch = data.epoch
    resumes: list[int] = []  # the steps after which this run was resumed from a checkpoint
    if resumed is not None:
        step, start_epoch = resumed["step"], resumed["start_epoch"]
        resumes = [*resumed.get("resumes", []), step]
        if scaler is not None and resumed.get("scaler") is not None:  # --amp fp16: the scale and its counters
            scaler.load_state_dict(resumed["scaler"])
        rows, bucket_rows, epoch_rows, inrun = (resumed["tables"][k] for k in ("rows", "buckets", "epochs", "inrun"))
        progress.update(step)
        if ranks.is_first:
            log.info("%s: resumed after step %d from %s", run_id, step, ckpt.path)
    while True:
        if steps is not None and step >= steps:
            break
        if steps is None and data.epoch - start_epoch >= cfg.epochs:
            break
        cur_epoch = data.epoch
        batch = data.next()
        if steps is None and data.epoch != cur_epoch:
            dopt.flush()
            epoch_rows.append(_evaluate(cfg, dopt.module, data.epoch - start_epoch, rows, device, ranks.group))
            if progress_file is not None:  # a run stopped later keeps this epoch readable
                progress_file.update(epoch_rows, asdict(cfg))
            if data.epoch - start_epoch >= cfg.epochs:
                break
        maybe_fail(f"step{step}", dist.get_rank())  # a test-only hook (repro.launch.faults); a no-op otherwise
        st = _door_step(dopt, batch, loss_of, device, precision, scaler)
        rows.append(st.row(step, data.epoch - start_epoch))
        executor = dopt.executor
        if executor.grad_ready_s:
            inrun.append((st, dict(executor.grad_ready_s)))
        if cfg.record_timeline and executor.timings:
            executor.settle_timings()  # device stamps (NCCL) arrive from a thread once the device got there
            bucket_rows = [_timing_row(t, st.start) for t in executor.timings]
            bucket_steps += [{**r, "step": step} for r in bucket_rows]
        step += 1
        progress.update(1)
        if ckpt is not None and (steps is None or step < steps):
            save, stop = ckpt.due(step)
            if save:
                ckpt.save(model=model, dopt=dopt, device=device, data=data, run={
                    "config": asdict(cfg), "size": ranks.size, "step": step, "start_epoch": start_epoch,
                    "resumes": resumes, "scaler": scaler.state_dict() if scaler is not None else None,
                    "trace": trace.to_dict() if trace is not None else None,
                    "cost": cost.to_dict() if cost is not None else None,
                    "tables": {"rows": rows, "buckets": bucket_rows, "epochs": epoch_rows, "inrun": inrun}})
            if stop:
                progress.close()
                dopt.remove()
                raise Preempted(step, ckpt.path)
    progress.close()
    dopt.flush()
    if steps is None and (not epoch_rows or epoch_rows[-1]["epoch"] < cfg.epochs):
        epoch_rows.append(_evaluate(cfg, dopt.module, cfg.epochs, rows, device, ranks.group))
    extra_tables = dopt.executor.tables()
    if bucket_steps:  # a figure can then draw a run's typical step, not only its last
        extra_tables["buckets_steps"] = bucket_steps
    engine = getattr(dopt.executor, "engine", None)  # the all-reduce executor's: "reducer" (C++) or "hooks" (Python)
    dopt.remove()

    # ---- computation only: a copy of the model, no communication ----
    compute_times = []
    if cfg.compute_steps:
        solo = copy.deepcopy(model)
        solo_opt = _make_optimizer(cfg, solo.parameters())
        solo_scaler = precision.scaler()  # the same precision as the timed steps (fp16: a scaler of its own)
        if solo_scaler is not None and scaler is not None:
            solo_scaler.load_state_dict(scaler.state_dict())  # from the run's scale, not from 2**16 again
        for i in range(cfg.compute_steps + 1):  # the first one warms the momentum buffers up
            start, end, _ = _timed_step(solo, solo_opt, data.next(), loss_of, device, precision, solo_scaler)
            if i:
                compute_times.append(end - start)
        del solo, solo_opt

    inrun_trace = None
    if trace is not None and inrun and cfg.epochs is None:
        inrun_trace = measured_trace(model, inrun, device, model_name=cfg.model, batch_size=cfg.batch_size,
                                     view=cfg.view, update_s=trace.overheads.update_s, group=ranks.group)
        inrun_trace.extra["method"] += f"; measured during the timed steps under '{cfg.scheduler}'"
    summary = _summarise(cfg, run_id, rows, compute_times, plan, trace, device, ranks)
    summary["engine"] = engine
    if cfg.checkpointing:
        summary["resumed_after_steps"] = resumes
    summary["amp"] = cfg.amp  # the compute precision (wire_dtype: what the exchange sends)
    if ranks.servers:  # the servers' tables (e.g. SSP clocks) join the run's
        for table, table_rows in _collect_server_tables({}, ranks).items():
            extra_tables[table] = extra_tables.get(table, []) + table_rows
    if ranks.is_first and cfg.results_dir:
        _write_run(cfg, summary, rows, epoch_rows, bucket_rows, trace, inrun_trace, plan, cost, extra_tables)
        log.info("%s: %.4f s per iteration; written to %s", run_id, summary["iteration_s"], cfg.results_dir)
    summary["epochs"] = epoch_rows
    if ranks.servers:
        summary = _share_summary(summary, ranks)
    return model, summary


def _collect_server_tables(tables: dict[str, list], ranks: _Ranks) -> dict[str, list]:
    """Every rank's ``tables`` (serving ranks' records) merged on the first trainer (every rank calls)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, tables)
    merged: dict[str, list] = {}
    for part in everyone:
        for name, rows in (part or {}).items():
            merged.setdefault(name, []).extend(rows)
    return merged


def _share_summary(summary: dict[str, Any] | None, ranks: _Ranks) -> dict[str, Any]:
    box = [summary if ranks.is_first else None]
    dist.broadcast_object_list(box, src=ranks.first)
    return box[0]


def _serve(cfg: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, ranks: _Ranks) -> dict[str, Any]:
    """A serving rank's run: the door's ``dedicated_servers`` (take part in planning, take the trainers'
    state, serve until they stop), then hand the records to the first trainer; returns the run summary
    (the first trainer's)."""
    _, served = _distribute(cfg, model, opt, ranks)
    _collect_server_tables(getattr(served, "tables", None) or {}, ranks)
    return _share_summary(None, ranks)


#: a file that exists while this rank's progress bar is open (``repro launch`` sets it: when a rank is
#: killed mid-line, the launcher ends the bar's line before its own error line)
_PROGRESS_MARK: str | None = None


class _Progress:
    """A tqdm bar that :func:`_end_progress_lines` can close, so that an error line starts its own line."""

    live: list["_Progress"] = []

    def __init__(self, total: int | None, desc: str) -> None:
        from tqdm.auto import tqdm

        self.mark = _PROGRESS_MARK
        if self.mark:
            open(self.mark, "w").close()
        self.bar = tqdm(total=total, desc=desc, unit="step")
        _Progress.live.append(self)

    def update(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()  # ends the bar's line
        if self in _Progress.live:
            _Progress.live.remove(self)
        if self.mark:
            try:
                os.unlink(self.mark)
            except OSError:
                pass


def _end_progress_lines() -> None:
    """Close every progress bar still open (an error interrupted the run) before an error line is printed."""
    for bar in list(_Progress.live):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - the error line matters more than the bar
            _Progress.live.remove(bar)


def _progress(enabled: bool, total: int | None, cfg: TrainConfig):
    if enabled:
        return _Progress(total, f"{cfg.model}/{cfg.scheduler}")
    return SimpleNamespace(update=lambda n: None, close=lambda: None)


# ---------------------------------------------------------------------------------------------
# Command line (per rank, under torchrun)
# ---------------------------------------------------------------------------------------------

def worker_from_argv(ctx, argv: Sequence[str], overrides: dict[str, Any] | None = None,
                     progress_mark: str | None = None) -> dict[str, Any]:
    """Launch target (``repro launch``): train the config given as ``repro train`` arguments.
    ``progress_mark``: a file that exists while the progress bar is open (see :data:`_PROGRESS_MARK`)."""
    global _PROGRESS_MARK
    _PROGRESS_MARK = progress_mark
    cfg, _ = config_from_argv(argv, **(overrides or {}))
    try:
        return train_worker(ctx, cfg)
    except BaseException:
        _end_progress_lines()
        raise


def main(argv: Sequence[str] | None = None, *, hard_exit: bool = False) -> int:
    """Per-rank entry point: ``torchrun ... -m repro.train`` or ``repro train`` (one line on bad input).

    Exit status 0 (finished), 2 (bad input, one line), 1 (a rank failed), 130 (interrupted) or
    :data:`repro.training.checkpoint.RESUME_EXIT` (75: checkpointed on SLURM's signal; rerun to go on).
    ``hard_exit``: after a successful run, leave with ``os._exit(0)`` once output is flushed, skipping
    interpreter teardown (gloo's threads can abort a finished process there, failing the torchrun job).
    """
    import sys

    from repro.launch.torchrun import PeerFailedError, await_peers, distributed, is_config_error, report_failure

    def leave(code: int) -> int:
        """After a run or a broken group: skip interpreter teardown with ``hard_exit`` (gloo's threads can
        abort or hang it, failing a finished job); a refusal returns as any command's does."""
        if hard_exit:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code

    try:
        cfg, args = config_from_argv(sys.argv[1:] if argv is None else argv)
        if cfg.device == "cuda" and not torch.cuda.is_available():  # before joining the process group
            raise ValueError("--device cuda, but CUDA is not available here (torch.cuda.is_available() is False); "
                             "use --device cpu")
        maybe_fail("join")  # a test-only hook (repro.launch.faults); a no-op otherwise
        # --device without --backend chooses it (cuda: nccl, cpu: gloo); neither: nccl with CUDA, else gloo.
        # A failure inside ends fast: posted for the peers, the group aborted (repro.launch.torchrun.distributed)
        with distributed(backend=args.backend, device=cfg.device, timeout_s=args.pg_timeout_s,
                         join_timeout_s=args.join_timeout_s) as ctx:
            summary = train_worker(ctx, cfg)
            if ctx.is_main:
                print(json.dumps({k: v for k, v in summary.items() if k != "epochs"}))
    except Preempted as e:  # SLURM's pre-timeout signal: checkpointed on every rank; the launcher requeues
        _end_progress_lines()
        print(f"repro: stopped: rank {os.environ.get('RANK', '?')}: {e}", file=sys.stderr)
        return leave(RESUME_EXIT)
    except KeyboardInterrupt:
        _end_progress_lines()
        print("repro: interrupted", file=sys.stderr)
        return 130
    except PeerFailedError as e:  # a peer failed: one line naming it; 2 when it refused the configuration
        _end_progress_lines()
        print(f"repro: error: {_first_line(e)}", file=sys.stderr)
        return leave(2 if e.config else 1)
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as e:  # DistributedSetupError is a RuntimeError
        _end_progress_lines()
        if report_failure(e):  # failed before joining: the peers, in the roll call, stop at once
            await_peers()
        if is_config_error(e):
            print(f"repro: error: {_first_line(e)}", file=sys.stderr)
            return 2
        # e.g. a peer that died or stopped: one line per rank, no traceback
        print(f"repro: error: rank {os.environ.get('RANK', '?')}: {type(e).__name__}: {_first_line(e)}",
              file=sys.stderr)
        return leave(1)
    return leave(0)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


if __name__ == "__main__":
    raise SystemExit(main(hard_exit=True))
