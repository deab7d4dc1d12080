"""The DeAR experiments on this machine: real runs of every scheduler the DeAR paper compares, read back
as tidy tables with the simulator's prediction beside each measurement.

Runs are launched with :func:`repro.studies.mgwfbp_train.run_grid` and written as run folders under
``<results_dir>/runs`` (a cluster job writes the same folders with ``torchrun -m repro.train``); the
tables below only read them. Baselines without a plan of ours have no prediction of their own: ``ddp``
is predicted by simulating DDP's default buckets (planner ``ddp_buckets``) on the trace and cost of
another run of the same model and world (named in ``prediction_from``); ``fsdp`` stays unpredicted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import math
import time
from itertools import zip_longest

import numpy as np
import pandas as pd

from repro.core.cost import fit_linear
from repro.core.planners import make_plan
from repro.core.simulate import simulate
from repro.costs.presets import preset
from repro.costs.published_fits import mode_label
from repro.launch.local import launch_local
from repro.launch.netns import format_bandwidth, parse_bandwidth
from repro.results.runs import load_run
from repro.results.tables import write_table
from repro.studies.common import available_cpus, warn_if_oversubscribed, with_oversubscription
from repro.studies.dear_sim import (
    PAPER_CLAIM_PCT, _merge, _settings, exposed_breakdown, load_traces, network_kind, speedup_summary)
from repro.studies.mgwfbp_train import clear_runs, load_runs, run_grid
from repro.studies.timing import with_sample_medians

__all__ = ["NOFUSION_SCHEDULERS", "FUSION_SCHEDULERS", "ALL_SCHEDULERS", "PRIMITIVES", "MEASURED_DERIVATION",
           "clear_runs", "run_grid", "load_runs", "run_id", "throughput_configs", "buffer_sweep_configs",
           "tuning_configs", "throughput_table", "buffer_sweep_table", "tuning_table", "trials_to_within",
           "time_primitives", "measure_primitives", "primitive_cost_table", "primitive_model_table",
           "measured_breakdown_table", "speedup_vs_best_baseline", "interpolated_objective", "model_objective",
           "search_comparison_table", "planner_marks_table", "paper_scale_tables", "gradient_bytes",
           "run_trace_cost", "planner_periods", "TUNER_FIELDS", "tuner_options_supported",
           # the notebook's tables (notebooks/dear_training.ipynb)
           "PLANNERS", "BREAKDOWN_SCHEDULERS", "PAPER_TUNING_BOUNDS", "interleaved_configs", "at_workers",
           "breakdown_schedulers", "split_dear", "measured_throughput", "paper_claim_text", "speedup_text",
           "throughput_group", "planner_references", "measured_sweep", "sweep_bounds", "tuning_objectives",
           "paper_trace_cost", "offline_search_table", "measured_planner_marks", "planner_marks",
           "marks_long_table", "best_found", "chosen_trial_text", "live_tuner_range", "starting_trial_text"]

# The DeAR paper's two comparisons (dear.md "Baselines").
NOFUSION_SCHEDULERS: tuple[str, ...] = ("wfbp", "bytescheduler", "dear_nofusion")
FUSION_SCHEDULERS: tuple[str, ...] = ("horovod", "ddp", "mgwfbp", "dear_threshold", "dear_model", "dear_optimal")
ALL_SCHEDULERS: tuple[str, ...] = NOFUSION_SCHEDULERS + FUSION_SCHEDULERS + ("fsdp",)


def run_id(c: dict[str, Any], world_size: int, bandwidth: str | None = None) -> str:
    """``<model>_<scheduler>_p<P>[_<run_tag>][_bw<rate>]``; deterministic, so a rerun needs overwrite."""
    parts = [c["model"], c["scheduler"], f"p{world_size}"]
    if c.get("run_tag"):
        parts.append(str(c["run_tag"]))
    if bandwidth:
        parts.append("bw" + format_bandwidth(parse_bandwidth(bandwidth)))
    return "_".join(parts)


def _config(model: str, scheduler: str, world_size: int, bandwidth: str | None, *, steps: int, batch_size: int,
            warmup_steps: int, tag: str | None = None, **extra: Any) -> dict[str, Any]:
    c = {"model": model, "scheduler": scheduler, "steps": steps, "batch_size": batch_size,
         "warmup_steps": warmup_steps, "compute_steps": 3, "record_timeline": True, **extra}
    c["run_id"] = run_id({**c, "run_tag": tag}, world_size, bandwidth)
    return c


def throughput_configs(models: Sequence[str], schedulers: Sequence[str], world_size: int,
                       bandwidth: str | None = None, *, steps: int = 10, batch_size: int = 16,
                       warmup_steps: int = 3, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One timing run (synthetic data, timeline recorded) per model and scheduler; ``extra``: more
    :class:`repro.train.TrainConfig` fields for every run."""
    return [_config(m, s, world_size, bandwidth, steps=steps, batch_size=batch_size, warmup_steps=warmup_steps,
                    **(extra or {})) for m in models for s in schedulers]


def buffer_sweep_configs(model: str, thresholds_bytes: Sequence[int], world_size: int,
                         bandwidth: str | None = None, *, steps: int = 10, batch_size: int = 16,
                         warmup_steps: int = 3, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``dear_threshold`` at each fusion threshold (bytes)."""
    return [_config(model, "dear_threshold", world_size, bandwidth, steps=steps, batch_size=batch_size,
                    warmup_steps=warmup_steps, tag=f"t{int(t)}", threshold_bytes=int(t), **(extra or {}))
            for t in thresholds_bytes]


TUNER_FIELDS: tuple[str, ...] = ("tuner_trials", "tuner_min_bytes", "tuner_max_bytes")


def tuner_options_supported() -> bool:
    """True when :class:`repro.train.TrainConfig` has the live tuner's fields :data:`TUNER_FIELDS`;
    otherwise a ``dear_bo`` run uses the tuner's defaults (10 trials, 1-256 MiB)."""
    from dataclasses import fields

    from repro.train import TrainConfig

    return set(TUNER_FIELDS) <= {f.name for f in fields(TrainConfig)}


def tuning_configs(model: str, world_size: int, bandwidth: str | None = None, *, steps: int = 80,
                   batch_size: int = 16, warmup_steps: int = 3, trials: int | None = None,
                   bounds_bytes: tuple[int, int] | None = None, extra: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """One ``dear_bo`` run long enough for its trials (with the tuner's defaults about 77 steps).
    ``trials`` / ``bounds_bytes`` are passed only where :func:`tuner_options_supported`."""
    tuner: dict[str, Any] = {}
    if (trials is not None or bounds_bytes is not None) and tuner_options_supported():
        if trials is not None:
            tuner["tuner_trials"] = int(trials)
        if bounds_bytes is not None:
            tuner["tuner_min_bytes"], tuner["tuner_max_bytes"] = (int(b) for b in bounds_bytes)
    return [_config(model, "dear_bo", world_size, bandwidth, steps=steps, batch_size=batch_size,
                    warmup_steps=warmup_steps, **tuner, **(extra or {}))]


def _simulate_run(path: str | Path, trace_kind: str = "inrun") -> float | None:
    run = load_run(path)
    trace = run.inrun_trace if trace_kind == "inrun" else run.trace
    if trace is None or run.plan is None or run.cost is None:
        return None
    return simulate(trace, run.plan, run.cost, with_ops=False).iteration_s


def _ddp_prediction(runs: pd.DataFrame, r: pd.Series) -> tuple[float | None, str | None]:
    """(seconds, scheduler) of DDP's buckets simulated on a same-model, same-world all-reduce run."""
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


def _timing_runs(results_dir: str | Path, schedulers: Sequence[str] | None) -> pd.DataFrame:
    """The runs under ``results_dir`` but the tuning (``dear_bo``) and buffer-sweep (``_t<bytes>``) ones."""
    runs = load_runs(results_dir)
    if runs.empty:
        return runs
    runs = runs[(runs.scheduler != "dear_bo") & ~runs.run_id.str.contains(r"_t\d+_|_t\d+$", regex=True)]
    return runs if schedulers is None else runs[runs.scheduler.isin(list(schedulers))]


def throughput_table(results_dir: str | Path, schedulers: Sequence[str] | None = None) -> pd.DataFrame:
    """Per timing run: measured ``iteration_s`` and ``throughput_samples_s``, ``predicted_s`` (the plan's
    prediction from the warm-up trace), ``simulated_inrun_s`` (on the trace measured during the timed steps)
    and ``prediction_from`` (whose trace and cost a prediction used)."""
    runs = _timing_runs(results_dir, schedulers)
    if runs.empty:
        return runs
    rows = []
    for _, r in runs.iterrows():
        pred, src = r.get("predicted_iteration_s"), "own plan"
        plan = load_run(r.path).plan
        threshold = plan.meta.get("threshold_bytes") if plan is not None else None
        if pred is None or pred != pred:
            pred, src = _ddp_prediction(runs, r) if r.scheduler == "ddp" else (None, None)
            src = f"ddp_buckets on the {src} run's trace" if src else None
        rows.append({"model": r.model, "scheduler": r.scheduler, "workers": int(r.world_size),
                     "emulated_bandwidth_bps": r.get("emulated_bandwidth_bps"),
                     "iteration_s": r.iteration_s, "compute_s": r.compute_s,
                     "throughput_samples_s": r.throughput_samples_s, "predicted_s": pred,
                     "simulated_inrun_s": _simulate_run(r.path), "prediction_from": src,
                     "buckets": r.get("buckets"),
                     "plan_threshold_bytes": np.nan if threshold is None else float(threshold),
                     "oversubscribed": bool(r.get("oversubscribed", False))})
    df = pd.DataFrame(rows)
    df["prediction_error"] = df["predicted_s"] / df["iteration_s"] - 1
    return df


def buffer_sweep_table(results_dir: str | Path) -> pd.DataFrame:
    """DeAR seconds per iteration per threshold, ``source`` ``measured`` and ``simulated`` (the run's
    own plan and cost on its in-run trace, else its warm-up trace)."""
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
    """The first trial number (1-based) whose ``value`` is within ``tolerance`` of ``best_s``; NaN if
    none is."""
    ok = np.flatnonzero(trials[value].to_numpy(dtype=float) <= best_s * (1 + tolerance))
    return float(ok[0] + 1) if ok.size else float("nan")


# Primitives: all-reduce vs ring reduce-scatter vs ring all-gather (dear.primitive_cost)

PRIMITIVES: tuple[str, ...] = ("allreduce", "reduce_scatter", "allgather", "rs_plus_ag")


def time_primitives(ctx, sizes_bytes: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Launch target: per size, the slowest rank's median seconds of gloo's ``all_reduce`` and of
    :class:`repro.runtime.collectives.CommStream`'s ring reduce-scatter, all-gather and the two back to back.
    """
    import torch
    import torch.distributed as dist

    from repro.runtime.calibrate import slowest_median_s
    from repro.runtime.collectives import CommStream

    P, rank = dist.get_world_size(), dist.get_rank()
    stream = CommStream()

    def rs_ag(buf):
        stream.reduce_scatter(buf)
        stream.all_gather(buf).wait()

    rows = []
    try:
        for nbytes in sizes_bytes:
            n = max(P, int(nbytes) // 4 // P * P)
            buf = torch.randn(n, generator=torch.Generator().manual_seed(rank))
            for name, fn in (("allreduce", lambda: dist.all_reduce(buf)),
                             ("reduce_scatter", lambda: stream.reduce_scatter(buf).wait()),
                             ("allgather", lambda: stream.all_gather(buf).wait()),
                             ("rs_plus_ag", lambda: rs_ag(buf))):
                rows.append({"workers": P, "bytes": n * 4, "primitive": name,
                             "seconds": slowest_median_s(fn, repeats)})
    finally:
        stream.close()
    return rows


def measure_primitives(world_sizes: Sequence[int], sizes_bytes: Sequence[int], results_dir: str | Path, *,
                       repeats: int = 3, emulate_bandwidth: str | None = None,
                       timeout_s: float = 600) -> pd.DataFrame:
    """Time the primitives (:func:`time_primitives`) at each world size > 1 and write table
    ``primitive_times`` (workers, bytes, primitive, seconds, cpu_count, threads_per_rank, oversubscribed,
    emulated_bandwidth). ``bytes`` is the whole float32 buffer, rounded down to a multiple of 4 P."""
    rows: list[dict[str, Any]] = []
    cpus = available_cpus()
    for p in world_sizes:
        if p < 2:
            continue
        warn_if_oversubscribed(p, "primitive timing", cpus=cpus)
        rows += launch_local(time_primitives, p, args=(list(sizes_bytes), repeats), timeout_s=timeout_s,
                             quiet=True, emulate_bandwidth=emulate_bandwidth)[0]
    df = pd.DataFrame(rows)
    if not df.empty:
        df = df.assign(cpu_count=cpus, threads_per_rank=1, emulated_bandwidth=emulate_bandwidth or "loopback")
        df = with_oversubscription(df, workers="workers")
    write_table(df, results_dir, "primitive_times", {"world_sizes": list(world_sizes), "repeats": repeats,
                                                     "sizes_bytes": [int(n) for n in sizes_bytes],
                                                     "emulate_bandwidth": emulate_bandwidth})
    return df


def fit_linear_log(nbytes, seconds) -> tuple[float, float]:
    """``(a_s, b_s_per_byte)`` of the line ``a + b*bytes`` (``a, b >= 0``) fitted by least squares in
    log space, started from :func:`repro.core.cost.fit_linear`."""
    from scipy.optimize import least_squares

    x = np.asarray(nbytes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    start = fit_linear(x, y)
    tiny = 1e-30
    x0 = np.log([max(start.a_s, float(y.min()) * 1e-3, tiny), max(start.b_s_per_byte, tiny)])
    res = least_squares(lambda q: np.log(np.exp(q[0]) + np.exp(q[1]) * x) - np.log(y), x0=x0)
    a, b = np.exp(res.x)
    return float(a), float(b)


def primitive_cost_table(times: pd.DataFrame) -> pd.DataFrame:
    """Measured seconds per primitive, size and world size beside two models: ``fit``
    (:func:`fit_linear_log` of the primitive's own points; in log space a factor too high costs as much as
    one too low) and ``ring model`` (reduce-scatter = all-gather = half the all-reduce measured at that
    size, RS+AG = all of it).

    Columns: workers, primitive, bytes, source, seconds, a_s, b_s_per_byte, relative_error (model /
    measured - 1), oversubscribed."""
    rows: list[dict[str, Any]] = []
    for p, g in times.groupby("workers"):
        over = bool(g["oversubscribed"].any()) if "oversubscribed" in g else False
        ar = g[g.primitive == "allreduce"].groupby("bytes")["seconds"].median()
        for prim, h in g.groupby("primitive", sort=False):
            h = h.sort_values("bytes")
            n, t = h["bytes"].to_numpy(dtype=float), h["seconds"].to_numpy(dtype=float)
            base = {"workers": int(p), "primitive": prim, "oversubscribed": over}
            rows += [{**base, "bytes": int(nb), "source": "measured", "seconds": float(sec), "a_s": np.nan,
                      "b_s_per_byte": np.nan, "relative_error": np.nan} for nb, sec in zip(n, t)]
            if len(h) >= 2:
                a, b = fit_linear_log(n, t)
                rows += [{**base, "bytes": int(nb), "source": "fit", "seconds": float(a + b * nb), "a_s": a,
                          "b_s_per_byte": b, "relative_error": float(a + b * nb) / sec - 1}
                         for nb, sec in zip(n, t)]
            k = 0.5 if prim in ("reduce_scatter", "allgather") else 1.0
            rows += [{**base, "bytes": int(nb), "source": "ring model", "seconds": k * float(ar[int(nb)]),
                      "a_s": np.nan, "b_s_per_byte": np.nan,
                      "relative_error": k * float(ar[int(nb)]) / sec - 1}
                     for nb, sec in zip(n, t) if int(nb) in ar.index]
    return pd.DataFrame(rows)


def primitive_model_table(presets: Sequence[str] = ("10gbe-dear-derived", "56gbib-dear-derived"),
                          workers: Sequence[int] = (2, 4, 8, 16, 32, 64), nbytes: int = 25 * 2**20) -> pd.DataFrame:
    """The cost model's all-reduce, reduce-scatter and all-gather seconds of one ``nbytes`` message
    per preset and worker count. Columns: preset, workers, bytes, primitive, seconds, source ("model")."""
    rows = []
    for name in presets:
        for p in workers:
            c = preset(name, int(p))
            for prim, t in (("allreduce", c.allreduce_s(nbytes)), ("reduce_scatter", c.reduce_scatter_s(nbytes)),
                            ("allgather", c.allgather_s(nbytes))):
                rows.append({"preset": name, "workers": int(p), "bytes": int(nbytes), "primitive": prim,
                             "seconds": float(t), "source": "model"})
    return pd.DataFrame(rows)


# Breakdown: computation vs exposed reduce-scatter / all-gather (measured)

MEASURED_DERIVATION = (
    "computation = median over this model's timing runs of their computation-only time (compute_s: steps of "
    "a copy of the model without communication; one estimate per model, since each run's own is noisy on "
    "shared cores); exposed = iteration - computation (>= 0); DeAR runs: exposed reduce-scatter = the "
    "reduce-scatter time on the communication stream after the backward call returned (union of the "
    "intervals of the last step's timeline, buckets.csv), at most the exposed time; exposed all-gather = the "
    "rest of the exposed time (the forward's waits for all-gathers, plus any other overhead); all-reduce runs: "
    "all of it is exposed all-reduce")


_BREAKDOWN_COLUMNS = ("iteration_s", "computation_s", "exposed_rs_s", "exposed_ag_s", "exposed_allreduce_s",
                      "exposed_idle_s")


def measured_breakdown_table(results_dir: str | Path, schedulers: Sequence[str] | None = None) -> pd.DataFrame:
    """Per timing run: computation vs exposed reduce-scatter, all-gather and all-reduce seconds
    per iteration, ``source`` ``measured`` (:data:`MEASURED_DERIVATION`) and ``simulated`` (the run's in-run
    trace, plan and cost through :func:`repro.studies.dear_sim.exposed_breakdown`; DeAR and all-reduce
    plans only)."""
    runs = _timing_runs(results_dir, schedulers)
    if runs.empty:
        return pd.DataFrame()
    comp = runs.groupby("model")["compute_s"].median()
    rows = []
    for _, r in runs.iterrows():
        run = load_run(r.path)
        family = run.plan.family if run.plan is not None else None
        it, c = float(r.iteration_s), float(comp[r.model])
        exposed = max(0.0, it - c)
        rs_after = np.nan
        rs = ag = ar = 0.0
        if family == "dear":
            tl, its = run.table("buckets.csv"), run.table("iterations.csv")
            rs_after = 0.0
            if tl is not None and its is not None and len(its):
                last = its.iloc[-1]
                bwd_end = float(last.forward_s + last.backward_call_s)
                sub = tl[tl["kind"] == "reduce_scatter"]
                spans = zip(sub.start_s.astype(float), sub.end_s.astype(float))
                after = _merge((max(a, bwd_end), b) for a, b in spans if a == a and b == b)
                rs_after = float(sum(b - a for a, b in after))
            rs = min(exposed, rs_after)
            ag = exposed - rs
        else:
            ar = exposed
        over = bool(r.get("oversubscribed", False))
        rows.append({"model": r.model, "scheduler": r.scheduler, "workers": int(r.world_size), "source": "measured",
                     "iteration_s": it, "computation_s": min(c, it), "exposed_rs_s": rs, "exposed_ag_s": ag,
                     "exposed_allreduce_s": ar, "exposed_idle_s": 0.0, "rs_after_backward_s": rs_after,
                     "derivation": MEASURED_DERIVATION, "oversubscribed": over})
        trace = run.inrun_trace or run.trace
        if family in ("dear", "allreduce") and trace is not None and run.cost is not None:
            try:
                b = exposed_breakdown(trace, run.plan, run.cost)
            except Exception:  # noqa: BLE001 - a plan the simulator cannot draw (e.g. Horovod's cycle)
                continue
            rows.append({"model": r.model, "scheduler": r.scheduler, "workers": int(r.world_size),
                         "source": "simulated", **{k: b[k] for k in _BREAKDOWN_COLUMNS},
                         "rs_after_backward_s": np.nan,
                         "derivation": "the run's in-run trace, plan and fitted cost model, simulated "
                                       "(repro.studies.dear_sim.exposed_breakdown)", "oversubscribed": over})
    return pd.DataFrame(rows)


def speedup_vs_best_baseline(table: pd.DataFrame, dear: Sequence[str], value: str = "iteration_s",
                             by: Sequence[str] = ("model",)) -> pd.DataFrame:
    """Per group: the fastest of ``dear`` against the fastest other scheduler,
    ``speedup_pct = 100 (baseline / DeAR - 1)`` of ``value``."""
    rows = []
    for key, g in table.groupby(list(by), sort=False):
        g = g[g[value].notna()]
        d, b = g[g.scheduler.isin(dear)], g[~g.scheduler.isin(dear)]
        if d.empty or b.empty:
            continue
        bd, bb = d.loc[d[value].idxmin()], b.loc[b[value].idxmin()]
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "best_dear": bd.scheduler, "dear_s": float(bd[value]),
                     "best_baseline": bb.scheduler, "baseline_s": float(bb[value]),
                     "speedup_pct": 100.0 * (float(bb[value]) / float(bd[value]) - 1.0)})
    return pd.DataFrame(rows)


# Buffer-size tuning: BO vs grid vs random (dear.bo_tuning)

def gradient_bytes(results_dir: str | Path, model: str) -> int:
    """Total gradient bytes of ``model`` from the trace of a run of it."""
    runs = load_runs(results_dir)
    for p in runs[runs.model == model].path if not runs.empty else []:
        t = load_run(p).trace
        if t is not None:
            return int(np.sum(t.bytes()))
    raise ValueError(f"no run of {model} with a trace under {results_dir}")


def run_trace_cost(results_dir: str | Path, model: str, scheduler: str = "dear_threshold"):
    """(warm-up trace, fitted cost) of the first timing run of ``model`` under ``scheduler`` that
    recorded both; ValueError if none did."""
    runs = load_runs(results_dir)
    if not runs.empty:
        runs = runs[(runs.model == model) & (runs.scheduler == scheduler)]
        for p in sorted(runs.path, key=lambda q: ("_t" in Path(q).name, str(q))):
            run = load_run(p)
            if run.trace is not None and run.cost is not None:
                return run.trace, run.cost
    raise ValueError(f"no {scheduler} run of {model} with a trace and a cost model under {results_dir}")


def planner_periods(trace, cost, planners: Sequence[str] = ("dear_model", "dear_optimal")) -> pd.DataFrame:
    """Each planner's simulated period (``seconds``), buckets and threshold (NaN for
    ``dear_optimal``) on ``trace`` and ``cost``."""
    rows = []
    for name in planners:
        plan = make_plan(name, trace, cost)
        rows.append({"scheduler": name, "seconds": float(simulate(trace, plan, cost, with_ops=False).iteration_s),
                     "buckets": plan.num_buckets, "threshold_bytes": float(plan.meta.get("threshold_bytes", np.nan))})
    return pd.DataFrame(rows)


def interpolated_objective(thresholds_bytes: Sequence[float], seconds: Sequence[float]):
    """``f(threshold_bytes) -> seconds``: the measured points joined linearly in log2(threshold),
    constant beyond the end points."""
    x = np.log2(np.maximum(np.asarray(thresholds_bytes, dtype=float), 1.0))
    y = np.asarray(seconds, dtype=float)
    order = np.argsort(x)
    x, y = x[order], y[order]

    def f(t: int) -> float:
        return float(np.interp(math.log2(max(float(t), 1.0)), x, y))

    return f


def model_objective(trace, cost):
    """``f(threshold_bytes) -> seconds``: the DeAR model's period of the threshold rule's buckets on
    ``trace`` and ``cost``."""
    from repro.families.dear.planners import groups_period_s, threshold_groups

    nbytes = np.rint(trace.bytes()).astype(np.int64)

    def f(t: int) -> float:
        return float(groups_period_s(trace, threshold_groups(nbytes, int(t)), cost))

    return f


def search_comparison_table(objectives: dict[str, Any], bounds: tuple[int, int], trials: int = 8,
                            seeds: Sequence[int] = (0, 1, 2), methods: Sequence[str] = ("bo", "grid", "random"),
                            ) -> pd.DataFrame:
    """BO, grid and random search (:func:`repro.families.dear.tuner.tune_offline`, ``trials``
    each, within ``bounds`` bytes) on each objective; grid runs once, the others once per seed.
    Columns: objective, method, seed, trial (1-based), threshold_bytes, iteration_s, best_so_far_s,
    best_threshold_bytes, bounds_low_bytes, bounds_high_bytes."""
    from repro.families.dear.tuner import tune_offline

    frames = []
    for name, f in objectives.items():
        for m in methods:
            for seed in (seeds if m != "grid" else seeds[:1]):
                rows = tune_offline(f, method=m, trials=trials, bounds=bounds, seed=int(seed))
                df = pd.DataFrame(rows)
                df["trial"] = df["trial"] + 1
                frames.append(df.assign(objective=name, method=m, seed=int(seed), bounds_low_bytes=int(bounds[0]),
                                        bounds_high_bytes=int(bounds[1])))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    cols = ["objective", "method", "seed", "trial", "threshold_bytes", "iteration_s", "best_so_far_s",
            "best_threshold_bytes", "bounds_low_bytes", "bounds_high_bytes"]
    return out[cols] if len(out) else out


def planner_marks_table(throughput: pd.DataFrame, model: str,
                        schedulers: Sequence[str] = ("dear_model", "dear_optimal")) -> pd.DataFrame:
    """Measured and predicted seconds per iteration, buckets and plan threshold of the planners'
    timing runs in ``throughput``."""
    rows = []
    for _, r in throughput[(throughput.model == model) & throughput.scheduler.isin(list(schedulers))].iterrows():
        rows.append({"model": model, "scheduler": r.scheduler, "buckets": r.buckets,
                     "measured_s": float(r.iteration_s), "predicted_s": r.predicted_s,
                     "simulated_inrun_s": r.get("simulated_inrun_s"),
                     "threshold_bytes": r.get("plan_threshold_bytes", np.nan)})
    return pd.DataFrame(rows)


# Paper scale (simulated): throughput and breakdown from one set of plans

def paper_scale_tables(models: Sequence[str], networks: Sequence[str], methods: Sequence[str],
                       breakdown_methods: Sequence[str], workers: int = 64,
                       cost_mode: str = "paper") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(throughput, breakdown) simulated at ``workers`` GPUs per cost preset from the shipped V100
    traces, with the columns of :func:`repro.studies.dear_sim.throughput_table` and
    :func:`repro.studies.dear_sim.breakdown_table`; each plan is made once for both. ``cost_mode``:
    ``"paper"`` or ``"calibrated"`` (:func:`repro.costs.published_fits.cost_for_mode`)."""
    thr_rows, bd_rows = [], []
    for model, trace, net, p, cost in _settings(list(models), networks, workers, cost_mode):
        for m in dict.fromkeys([*methods, *breakdown_methods]):
            t0 = time.perf_counter()
            plan = make_plan(m, trace, cost)
            wall = time.perf_counter() - t0
            if m in methods:
                it = float(simulate(trace, plan, cost, with_ops=False).iteration_s)
                thr_rows.append({"model": model, "device": trace.device, "batch_size": trace.batch_size,
                                 "network": net, "workers": p, "scheduler": m, "iteration_s": it,
                                 "throughput": workers * trace.batch_size / it, "buckets": plan.num_buckets,
                                 "threshold_bytes": float(plan.meta.get("threshold_bytes", np.nan)),
                                 "plan_wall_s": wall, "cost_mode": cost_mode})
            if m in breakdown_methods:
                b = exposed_breakdown(trace, plan, cost)
                b.pop("window_s", None)
                bd_rows.append({"model": model, "network": net, "workers": p, "scheduler": m, **b,
                                "buckets": plan.num_buckets, "cost_mode": cost_mode})
    thr = pd.DataFrame(thr_rows)
    if len(thr):
        best = thr.groupby(["model", "network", "workers"])["throughput"].transform("max")
        thr["relative_to_best"] = thr["throughput"] / best
        thr["origin"] = "simulated"
    return thr, pd.DataFrame(bd_rows)


# The notebook's tables (notebooks/dear_training.ipynb): selections, joins and summary lines

PLANNERS: tuple[str, ...] = ("dear_model", "dear_optimal")
BREAKDOWN_SCHEDULERS: tuple[str, ...] = ("wfbp", "mgwfbp", "dear_nofusion", "dear_threshold", "dear_model",
                                         "dear_optimal")
PAPER_TUNING_BOUNDS: tuple[int, int] = (2**20, 2**28)  # 1-256 MiB, the released tuner's range


def interleaved_configs(timing: Sequence[dict], sweep: Sequence[dict]) -> list[dict]:
    """Timing and sweep configurations alternating (a timing run first), then the rest of the
    longer list, so a slow spell of a shared machine falls on both groups."""
    return [c for pair in zip_longest(timing, sweep) for c in pair if c is not None]


def at_workers(table: pd.DataFrame, workers: int) -> pd.DataFrame:
    """The rows at ``workers`` ranks; an empty table (maybe without columns) as it is."""
    return table[table.workers == workers] if len(table) else table


def breakdown_schedulers(schedulers: Sequence[str]) -> list[str]:
    """The :data:`BREAKDOWN_SCHEDULERS` among ``schedulers``, in that order."""
    return [s for s in BREAKDOWN_SCHEDULERS if s in schedulers]


def split_dear(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(DeAR variants: names starting with ``dear``, the others), order kept."""
    dear = [s for s in names if s.startswith("dear")]
    return dear, [s for s in names if s not in dear]


def measured_throughput(throughput: pd.DataFrame, samples: pd.DataFrame | None, workers: int) -> pd.DataFrame:
    """:func:`throughput_table` rows at ``workers`` with ``iteration_s`` the median of the
    interleaved timing ``samples`` (:func:`repro.studies.timing.with_sample_medians`), throughput and
    ``prediction_error`` rescaled to it. No samples: each run's own values."""
    thr = with_sample_medians(throughput[throughput.workers == workers], samples)
    thr["throughput_samples_s"] = thr["throughput_samples_s"] * thr["run_iteration_s"] / thr["iteration_s"]
    thr["prediction_error"] = thr["predicted_s"] / thr["iteration_s"] - 1
    return thr


def paper_claim_text(network: str) -> str:
    """The paper's headline speedup on ``network``'s kind (10GbE or IB), e.g. ``"83%"``, or
    ``"n/a"``."""
    pct = PAPER_CLAIM_PCT.get(network_kind(network))
    return f"{pct:g}%" if pct is not None else "n/a"


def speedup_text(simulated: pd.DataFrame, measured: pd.DataFrame, *, model: str, workers: int, cost_mode: str,
                 networks: Sequence[str]) -> str:
    """The line under a throughput figure's title: the largest simulated speedup of DeAR over the best
    baseline per network (``all models`` rows of ``simulated``), the measured one of ``model`` (first row
    of ``measured``, if any) and the paper's claim on ``networks``."""
    top = simulated[simulated.model.str.startswith("all models")]
    parts = [f"simulated ({workers} GPUs, {mode_label(cost_mode)}), largest over the models: "
             + "; ".join(f"{r.network} {r.speedup_pct:+.0f}% ({r.model.split(': ')[-1].rstrip(')')})"
                         for r in top.itertuples())]
    if len(measured):
        r = measured.iloc[0]
        parts.append(f"measured ({model}): {r.best_dear} vs {r.best_baseline} {r.speedup_pct:+.0f}%")
    parts.append("paper's claim (Zhang et al., ICDCS 2023), best DeAR vs best of all baselines, 64 GPUs: up to "
                 + ", ".join(f"{paper_claim_text(n)} on {n}" for n in networks))
    return "DeAR vs best baseline here - " + "; ".join(parts)


def throughput_group(measured: pd.DataFrame, simulated: pd.DataFrame, measured_names: Sequence[str],
                     sim_names: Sequence[str], *, model: str, workers: int, cost_mode: str,
                     networks: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """One throughput figure's group of schedulers: (the group's ``simulated`` rows, the speedup
    table with simulated then measured rows in ``origin``, the :func:`speedup_text` line). The line's
    measured speedup takes the simulated group's DeAR names as DeAR."""
    sim_dear, sim_base = split_dear(sim_names)
    in_group = measured[measured.scheduler.isin(list(measured_names))]
    summary = speedup_summary(simulated[simulated.scheduler.isin(sim_dear + sim_base)], dear=sim_dear)
    text = speedup_text(summary, speedup_vs_best_baseline(in_group, sim_dear), model=model, workers=workers,
                        cost_mode=cost_mode, networks=networks)
    measured_summary = speedup_vs_best_baseline(in_group, split_dear(measured_names)[0])
    speedups = pd.concat([summary.assign(origin="simulated"), measured_summary.assign(origin="measured")],
                         ignore_index=True)
    return simulated[simulated.scheduler.isin(list(sim_names))], speedups, text


def planner_references(measured: pd.DataFrame) -> pd.DataFrame:
    """The :data:`PLANNERS` rows of a throughput table: the sweep figure's horizontal lines."""
    return measured[measured.scheduler.isin(list(PLANNERS))]


def measured_sweep(sweep: pd.DataFrame) -> pd.DataFrame:
    """The ``measured`` points of :func:`buffer_sweep_table`."""
    return sweep[sweep.source == "measured"]


def sweep_bounds(points: pd.DataFrame) -> tuple[int, int]:
    """(smallest, largest) ``threshold_bytes`` of the sweep's points."""
    return int(points.threshold_bytes.min()), int(points.threshold_bytes.max())


def tuning_objectives(points: pd.DataFrame, trace, cost) -> dict[str, Any]:
    """The tiny-scale objectives ``f(threshold_bytes) -> seconds``: ``measured``
    (:func:`interpolated_objective`) and ``model`` (:func:`model_objective`)."""
    return {"measured": interpolated_objective(points.threshold_bytes, points.iteration_s),
            "model": model_objective(trace, cost)}


def paper_trace_cost(model: str, network: str, workers: int):
    """(shipped V100 trace of ``model``, cost preset ``network`` at ``workers`` GPUs)."""
    return load_traces([model])[model], preset(network, workers)


def offline_search_table(objectives: dict[str, Any], bounds: tuple[int, int], paper_objective, *, trials: int,
                         seeds: Sequence[int], paper_bounds: tuple[int, int] = PAPER_TUNING_BOUNDS) -> pd.DataFrame:
    """:func:`search_comparison_table` on ``objectives`` within ``bounds``, then on
    ``paper_objective`` (objective ``paper``) within ``paper_bounds``, in one table."""
    tiny = search_comparison_table(objectives, bounds, trials=trials, seeds=seeds)
    paper = search_comparison_table({"paper": paper_objective}, paper_bounds, trials=trials, seeds=seeds)
    return pd.concat([tiny, paper], ignore_index=True)


def measured_planner_marks(marks: pd.DataFrame, objective) -> pd.DataFrame:
    """Each planner run's measured seconds (kind ``measured run``) and, for a plan with a
    threshold, ``objective`` at it (kind ``its threshold on the sweep``). Columns: scheduler, seconds, kind.
    """
    on_sweep = marks[marks.threshold_bytes.notna()]
    runs = pd.DataFrame({"scheduler": marks.scheduler, "seconds": marks.measured_s, "kind": "measured run"})
    read_off = pd.DataFrame({"scheduler": on_sweep.scheduler, "kind": "its threshold on the sweep",
                             "seconds": [objective(t) for t in on_sweep.threshold_bytes]})
    return pd.concat([runs, read_off], ignore_index=True)


def planner_marks(measured_marks: pd.DataFrame, measured_objective, on_model: pd.DataFrame,
                  on_paper: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per objective (``measured``, ``model``, ``paper``), where ``dear_model`` and ``dear_optimal``
    land, in ``seconds``."""
    return {"measured": measured_planner_marks(measured_marks, measured_objective),
            "model": on_model.assign(kind="predicted"),
            "paper": on_paper.assign(kind="predicted")}


def marks_long_table(marks: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """:func:`planner_marks` as one table with an ``objective`` column."""
    return pd.concat([m.assign(objective=k) for k, m in marks.items()], ignore_index=True)


def best_found(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per objective, method and seed (the index): the best seconds after the last trial (``best_s``) and
    its ``threshold_bytes``."""
    return comparison.groupby(["objective", "method", "seed"]).agg(best_s=("best_so_far_s", "last"),
                                                                   threshold_bytes=("best_threshold_bytes", "last"))


def chosen_trial_text(live: pd.DataFrame) -> str:
    """The live tuner's choice, e.g. ``chosen 0.125 MiB (1 bucket(s))``, or ``no trial chosen``."""
    chosen = live[live.chosen.astype(bool)] if len(live) else live
    if not len(chosen):
        return "no trial chosen"
    return f"chosen {chosen.threshold_bytes.iloc[0] / 2**20:.3g} MiB ({int(chosen.buckets.iloc[0])} bucket(s))"


def starting_trial_text(live: pd.DataFrame, low_bytes: int, high_bytes: int) -> str:
    """``trial 0: the starting threshold, 25 MiB, outside the range`` when trial 0 lies outside
    ``low_bytes``-``high_bytes``, else ""."""
    first = live[live.trial == 0] if len(live) else live
    if not len(first):
        return ""
    t = int(first.threshold_bytes.iloc[0])
    if low_bytes <= t <= high_bytes:
        return ""
    return f"trial 0: the starting threshold, {t / 2**20:.3g} MiB, outside the range"


def live_tuner_range(low_bytes: int, high_bytes: int) -> str:
    """The live tuner's search range as the figure names it."""
    if tuner_options_supported():
        return f"{low_bytes}-{high_bytes} bytes"
    return "1-256 MiB, the tuner's default (a run cannot set its range yet)"
