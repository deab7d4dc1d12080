"""The DeAR experiments on this machine: real runs of every scheduler the DeAR paper compares, read back
as tidy tables with the simulator's prediction beside each measurement.

Runs are launched with :func:`repro.studies.mgwfbp_train.run_grid` (one local world per world size,
optionally on an emulated bandwidth-limited network, :mod:`repro.cluster.netns`) and written as run
folders under ``<results_dir>/runs``; a cluster job writes the same folders with
``torchrun -m repro.train --scheduler dear_threshold ... --results-dir ...`` and everything below only
reads them.

- :func:`throughput_configs` / :func:`throughput_table`: iteration seconds and samples per second of each
  scheduler, measured, with two predictions: ``predicted_s`` (the plan's prediction before the timed
  steps: warm-up trace + cost model fitted on the live group) and ``simulated_inrun_s`` (the same plan
  and cost on the trace measured during the timed steps);
- :func:`buffer_sweep_configs` / :func:`buffer_sweep_table`: DeAR's iteration time per fusion
  threshold, measured and simulated;
- :func:`tuning_table` / :func:`trials_to_within`: the buffer-size tuner's trials (``tuning.csv`` of
  ``dear_bo`` runs) and how many it needed to come within a tolerance of the best measured threshold.

Baselines without a plan of ours (``ddp``, ``fsdp``) have no prediction of their own: for ``ddp`` the
table simulates DDP's default buckets (planner ``ddp_buckets``) on the trace and cost of another run of
the same model and world (labelled in ``prediction_from``); ``fsdp`` stays unpredicted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from repro.planners import make_plan
from repro.runs import load_run
from repro.sim import simulate
from repro.studies.mgwfbp_train import clear_runs, load_runs, run_grid

__all__ = ["NOFUSION_SCHEDULERS", "FUSION_SCHEDULERS", "ALL_SCHEDULERS", "clear_runs", "run_grid", "load_runs",
           "run_id", "throughput_configs", "buffer_sweep_configs", "tuning_configs", "throughput_table",
           "buffer_sweep_table", "tuning_table", "trials_to_within"]

# The DeAR paper's two comparisons (dear.md "Baselines").
NOFUSION_SCHEDULERS: tuple[str, ...] = ("wfbp", "bytescheduler", "dear_nofusion")
FUSION_SCHEDULERS: tuple[str, ...] = ("horovod", "ddp", "mgwfbp", "dear_threshold", "dear_model")
ALL_SCHEDULERS: tuple[str, ...] = NOFUSION_SCHEDULERS + FUSION_SCHEDULERS + ("fsdp",)


def run_id(c: dict[str, Any], world_size: int, bandwidth: str | None = None) -> str:
    """``<model>_<scheduler>_p<P>[_t<threshold>]_bw<rate>`` (deterministic: a rerun needs overwrite)."""
    parts = [c["model"], c["scheduler"], f"p{world_size}"]
    if c.get("run_tag"):
        parts.append(str(c["run_tag"]))
    if bandwidth:
        from repro.cluster.netns import format_bandwidth, parse_bandwidth

        parts.append("bw" + format_bandwidth(parse_bandwidth(bandwidth)))
    return "_".join(parts)


def _config(model: str, scheduler: str, world_size: int, bandwidth: str | None, *, steps: int, batch_size: int,
            warmup_steps: int, tag: str | None = None, **extra: Any) -> dict[str, Any]:
    c = {"model": model, "scheduler": scheduler, "steps": steps, "batch_size": batch_size,
         "warmup_steps": warmup_steps, "compute_steps": 2, "record_timeline": True, **extra}
    c["run_id"] = run_id({**c, "run_tag": tag}, world_size, bandwidth)
    return c


def throughput_configs(models: Sequence[str], schedulers: Sequence[str], world_size: int,
                       bandwidth: str | None = None, *, steps: int = 10, batch_size: int = 16,
                       warmup_steps: int = 3) -> list[dict[str, Any]]:
    """One timing run (synthetic data, timeline recorded) per model and scheduler."""
    return [_config(m, s, world_size, bandwidth, steps=steps, batch_size=batch_size, warmup_steps=warmup_steps)
            for m in models for s in schedulers]


def buffer_sweep_configs(model: str, thresholds_bytes: Sequence[int], world_size: int,
                         bandwidth: str | None = None, *, steps: int = 10, batch_size: int = 16,
                         warmup_steps: int = 3) -> list[dict[str, Any]]:
    """``dear_threshold`` at each fusion threshold (bytes)."""
    return [_config(model, "dear_threshold", world_size, bandwidth, steps=steps, batch_size=batch_size,
                    warmup_steps=warmup_steps, tag=f"t{int(t)}", threshold_bytes=int(t)) for t in thresholds_bytes]


def tuning_configs(model: str, world_size: int, bandwidth: str | None = None, *, steps: int = 80,
                   batch_size: int = 16, warmup_steps: int = 3) -> list[dict[str, Any]]:
    """One ``dear_bo`` run long enough for its trials (see :mod:`repro.runtime.dear_tuner`)."""
    return [_config(model, "dear_bo", world_size, bandwidth, steps=steps, batch_size=batch_size,
                    warmup_steps=warmup_steps)]


def _simulate_run(path: str | Path, trace_kind: str = "inrun") -> float | None:
    run = load_run(path)
    trace = run.inrun_trace if trace_kind == "inrun" else run.trace
    if trace is None or run.plan is None or run.cost is None:
        return None
    return simulate(trace, run.plan, run.cost, with_ops=False).iteration_s


def _ddp_prediction(runs: pd.DataFrame, r: pd.Series) -> tuple[float | None, str | None]:
    """DDP's default buckets simulated on a same-model, same-world all-reduce run's trace and cost."""
    peers = runs[(runs.model == r.model) & (runs.world_size == r.world_size) & runs.scheduler.isin(["wfbp", "mgwfbp"])]
    for _, p in peers.iterrows():
        run = load_run(p.path)
        if run.trace is not None and run.cost is not None:
            try:
                plan = make_plan("ddp_buckets", run.trace, run.cost)
            except Exception:  # noqa: BLE001 - a peer whose cost lacks the all-reduce line
                continue
            return simulate(run.trace, plan, run.cost, with_ops=False).iteration_s, p.scheduler
    return None, None


def throughput_table(results_dir: str | Path, schedulers: Sequence[str] | None = None) -> pd.DataFrame:
    """Per timing run: measured ``iteration_s`` and ``throughput_samples_s``, ``predicted_s`` (the plan's
    prediction from the warm-up trace) and ``simulated_inrun_s`` (from the trace measured during the
    timed steps), with ``prediction_from`` saying whose trace and cost a baseline's prediction used."""
    runs = load_runs(results_dir)
    if runs.empty:
        return runs
    runs = runs[runs.scheduler != "dear_bo"]
    runs = runs[~runs.run_id.str.contains(r"_t\d+_|_t\d+$", regex=True)]  # buffer-sweep runs are separate
    if schedulers is not None:
        runs = runs[runs.scheduler.isin(list(schedulers))]
    rows = []
    for _, r in runs.iterrows():
        pred, src = r.get("predicted_iteration_s"), "own plan"
        if pred is None or pred != pred:
            pred, src = _ddp_prediction(runs, r) if r.scheduler == "ddp" else (None, None)
            src = f"ddp_buckets on the {src} run's trace" if src else None
        rows.append({"model": r.model, "scheduler": r.scheduler, "workers": int(r.world_size),
                     "emulated_bandwidth_bps": r.get("emulated_bandwidth_bps"),
                     "iteration_s": r.iteration_s, "compute_s": r.compute_s,
                     "throughput_samples_s": r.throughput_samples_s, "predicted_s": pred,
                     "simulated_inrun_s": _simulate_run(r.path), "prediction_from": src,
                     "buckets": r.get("buckets"), "oversubscribed": bool(r.get("oversubscribed", False))})
    df = pd.DataFrame(rows)
    df["prediction_error"] = df["predicted_s"] / df["iteration_s"] - 1
    return df


def buffer_sweep_table(results_dir: str | Path) -> pd.DataFrame:
    """DeAR iteration seconds per threshold: ``measured`` and ``simulated`` (each run's own plan and cost
    on its in-run trace, else its warm-up trace)."""
    runs = load_runs(results_dir)
    if runs.empty:
        return runs
    runs = runs[(runs.scheduler == "dear_threshold") & runs.run_id.str.contains(r"_t\d+", regex=True)]
    rows = []
    for _, r in runs.iterrows():
        sim = _simulate_run(r.path) or _simulate_run(r.path, "warmup")
        for source, t in (("measured", r.iteration_s), ("simulated", sim)):
            if t is not None:
                rows.append({"model": r.model, "workers": int(r.world_size), "threshold_bytes": int(r.threshold_bytes),
                             "buckets": r.get("buckets"), "source": source, "iteration_s": float(t)})
    return pd.DataFrame(rows).sort_values(["model", "source", "threshold_bytes"], ignore_index=True) if rows \
        else pd.DataFrame(rows)


def tuning_table(results_dir: str | Path) -> pd.DataFrame:
    """Every ``dear_bo`` run's trials (``tuning.csv``) with its model and world size."""
    runs = load_runs(results_dir)
    frames = []
    for _, r in runs[runs.scheduler == "dear_bo"].iterrows() if not runs.empty else []:
        t = load_run(r.path).table("tuning.csv")
        if t is not None:
            frames.append(t.assign(model=r.model, workers=int(r.world_size)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def trials_to_within(trials: pd.DataFrame, best_s: float, tolerance: float = 0.05,
                     value: str = "iteration_s") -> float:
    """The first trial number (1-based, in trial order) whose ``value`` is within ``tolerance`` of
    ``best_s`` (e.g. the best of a full measured sweep); NaN if none is."""
    ok = np.flatnonzero(trials[value].to_numpy(dtype=float) <= best_s * (1 + tolerance))
    return float(ok[0] + 1) if ok.size else float("nan")
