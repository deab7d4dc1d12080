"""Simulator vs reality: the same plan measured on this machine and simulated from the run's own trace,
plan and fitted cost model (PyTorch DDP keeps no trace: its prediction uses the MG-WFBP run of the same
model and network with DDP's default buckets).

Three predictions per run: ``simulated_s`` (warm-up trace, perfect overlap: a true prediction),
``simulated_prerun_s`` (plus the slowdown of computation under communication, ``Realism(contention=c)``,
with ``c`` measured before the runs by :func:`measure_contention`: also a prediction) and
``simulated_inrun_s`` (the per-layer times measured during the run: checks the overlap model alone).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from repro.core.planners import make_plan
from repro.core.realism import Realism
from repro.results.runs import load_run
from repro.core.simulate import simulate
from repro.launch.netns import EmulationUnavailableError, check_emulation_available, format_bandwidth
from repro.studies.mgwfbp_train import load_runs, run_grid

__all__ = ["usable_bandwidths", "run_validation", "validation_table", "speedup_comparison", "measure_contention",
           "contention_fits", "load_contention", "prerun_cost", "CONTENTION_CSV"]

LOOPBACK = "loopback"
CONTENTION_CSV = "contention.csv"
"""Where :func:`run_validation` keeps the contention it measured before the runs (under its results_dir)."""


def usable_bandwidths(link_rates: Sequence[str], required: bool = False) -> list[str]:
    """``link_rates`` minus the emulated ones this machine cannot emulate (a warning says why), or
    the error raised when ``required``."""
    out = []
    for net in link_rates:
        if net == LOOPBACK:
            out.append(net)
            continue
        try:
            check_emulation_available()
            out.append(net)
        except EmulationUnavailableError as e:
            if required:
                raise
            warnings.warn(f"skipping emulated network {net}: {e}", stacklevel=2)
    return out


def measure_contention(models: Sequence[str], link_rates: Sequence[str], world_sizes: Sequence[int] | int, *,
                       batch_size: int = 32, timeout_s: float = 600.0, **kwargs) -> pd.DataFrame:
    """The slowdown of each model's forward + backward while all-reduces are in flight, per
    network and world size > 1: one row per message size with ``network`` and ``contention`` (fitted
    over the sizes, weighted by their all-reduce seconds: compute runs ``1 + c`` times slower).
    ``kwargs`` go to the microbenchmark."""
    from repro.runtime.contention import fit_contention, measure_contention_local

    sizes = [world_sizes] if isinstance(world_sizes, int) else list(world_sizes)
    frames = []
    for net in link_rates:
        for p in sizes:
            if p < 2:
                continue
            df = measure_contention_local(list(models), p, emulate_bandwidth=None if net == LOOPBACK else net,
                                          batch_size=batch_size, timeout_s=timeout_s, **kwargs)
            df.insert(0, "network", net)
            fits = {m: fit_contention(g.slowdown, g.allreduce_s) for m, g in df.groupby("model")}
            df["contention"] = df.model.map(fits)
            frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def contention_fits(contention: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, network, workers): the fitted ``contention``, the slowdowns' range, the
    number of sizes and whether communication covered every kernel."""
    if contention is None or contention.empty:
        return pd.DataFrame(columns=["model", "network", "workers", "contention", "min_slowdown", "max_slowdown",
                                     "sizes", "covered"])
    g = contention.groupby(["model", "network", "workers"], sort=False)
    return g.agg(contention=("contention", "first"), min_slowdown=("slowdown", "min"),
                 max_slowdown=("slowdown", "max"), sizes=("bytes", "size"), covered=("covered", "all")).reset_index()


def load_contention(results_dir: str | Path) -> pd.DataFrame | None:
    """The contention table :func:`run_validation` measured into ``results_dir`` (None if there is none)."""
    p = Path(results_dir) / CONTENTION_CSV
    return pd.read_csv(p) if p.is_file() else None


def run_validation(configs: Sequence[dict], link_rates: Sequence[str], world_sizes: Sequence[int] | int,
                   results_dir: str | Path, *, contention: bool | Mapping = True, **kwargs) -> pd.DataFrame:
    """Run ``configs`` at each of ``world_sizes`` once per link rate (``kwargs`` go to
    :func:`~repro.studies.mgwfbp_train.run_grid`). With ``contention`` (True, or keyword arguments for
    :func:`measure_contention`) each network's contention is measured before its runs and written to
    ``<results_dir>/contention.csv``; without, a stale file there is removed."""
    sizes = [world_sizes] if isinstance(world_sizes, int) else list(world_sizes)
    ckw = dict(contention) if isinstance(contention, Mapping) else {}
    models = list(dict.fromkeys(c["model"] for c in configs))
    batch = {c.get("batch_size", 32) for c in configs}
    if contention and len(batch) > 1:
        raise ValueError(f"the contention microbenchmark needs one batch size across configs, got {sorted(batch)}")
    measured = []
    for net in link_rates:
        if contention and models:
            measured.append(measure_contention(models, [net], sizes, batch_size=next(iter(batch)), **ckw))
        run_grid(configs, sizes, results_dir, emulate_bandwidth=None if net == LOOPBACK else net, **kwargs)
    path = Path(results_dir) / CONTENTION_CSV
    if contention:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pd.concat(measured, ignore_index=True) if measured else pd.DataFrame()
        table.to_csv(path, index=False)
    elif path.is_file():  # never pair these runs with an earlier execution's contention
        path.unlink()
    return load_runs(results_dir)


def prerun_cost(cost, contention: float):
    """``cost`` with ``contention`` (dimensionless slowdown) joined to its realism."""
    return cost.with_realism(replace(cost.realism or Realism(), contention=float(contention)))


def _contention_lookup(contention) -> dict[tuple[str, str, int], float]:
    """{(model, network, workers): c} from a contention table, or a mapping as given."""
    if isinstance(contention, Mapping):
        return dict(contention)
    if contention is None or contention.empty:
        return {}
    return {(str(r.model), str(r.network), int(r.workers)): float(r.contention)
            for r in contention.drop_duplicates(["model", "network", "workers"]).itertuples()}


def validation_table(runs: pd.DataFrame, contention: pd.DataFrame | Mapping | None = None) -> pd.DataFrame:
    """Measured vs simulated iteration seconds per model, network and scheduler, with errors
    ``100 * (simulated / measured - 1)``: ``simulated_s`` (warm-up trace, paper model),
    ``simulated_prerun_s`` (plus the pre-run ``contention``, a table or ``{(model, network, workers): c}``;
    NaN where none) and ``simulated_inrun_s`` (in-run trace)."""
    lookup = _contention_lookup(contention)
    bws = [r.get("emulated_bandwidth_bps") for _, r in runs.iterrows()]
    runs = runs.assign(network=[format_bandwidth(bw) if isinstance(bw, (int, float)) and bw == bw and bw else LOOPBACK
                                for bw in bws])
    rows = []
    for _, r in runs.iterrows():
        run = load_run(r.path)
        if run.can_simulate:
            trace, plan, cost = run.trace, run.plan, run.cost
        elif r.scheduler == "ddp":
            ref = runs[(runs.model == r.model) & (runs.network == r.network) & (runs.world_size == r.world_size)
                       & (runs.scheduler == "mgwfbp") & (runs.wire_dtype == r.wire_dtype)]
            if ref.empty:
                continue
            other = load_run(ref.iloc[0].path)
            trace, cost = other.trace, other.cost
            plan = make_plan("ddp_buckets", trace, cost)
        else:
            continue
        sim = simulate(trace, plan, cost, with_ops=False)
        row = {"model": r.model, "network": r.network, "workers": r.world_size, "scheduler": r.scheduler,
               "oversubscribed": bool(r.get("oversubscribed")) if pd.notna(r.get("oversubscribed")) else False,
               "buckets": plan.num_buckets, "measured_s": r.iteration_s, "simulated_s": sim.iteration_s,
               "error_pct": 100.0 * (sim.iteration_s / r.iteration_s - 1.0),
               "prerun_contention": math.nan, "simulated_prerun_s": math.nan, "error_prerun_pct": math.nan,
               "trace_backward_s": trace.total_backward_s, "inrun_backward_s": None,
               "simulated_inrun_s": None, "error_inrun_pct": None}
        c = lookup.get((r.model, r.network, int(r.world_size)))
        if c is not None and math.isfinite(c):  # the same warm-up trace, compute slowed under communication
            t = simulate(trace, plan, prerun_cost(cost, c), with_ops=False).iteration_s
            row.update(prerun_contention=c, simulated_prerun_s=t, error_prerun_pct=100.0 * (t / r.iteration_s - 1.0))
        inrun = run.inrun_trace
        if inrun is not None:  # the same plan, compute as measured under it
            t = simulate(inrun, plan, cost, with_ops=False).iteration_s
            row.update(inrun_backward_s=inrun.total_backward_s, simulated_inrun_s=t,
                       error_inrun_pct=100.0 * (t / r.iteration_s - 1.0))
        rows.append(row)
    return pd.DataFrame(rows)


def speedup_comparison(table: pd.DataFrame, ours: Sequence[str] = ("mgwfbp", "optimal"),
                       baselines: Sequence[str] = ("wfbp", "syncea", "ddp")) -> pd.DataFrame:
    """Speedup of each of ``ours`` over each baseline, measured and simulated, side by side."""
    rows = []
    for (model, net, p), g in table.groupby(["model", "network", "workers"]):
        t = g.set_index("scheduler")
        for a in ours:
            for b in baselines:
                if a in t.index and b in t.index:
                    rows.append({"model": model, "network": net, "workers": p, "scheduler": a, "over": b,
                                 "measured_speedup": t.loc[b, "measured_s"] / t.loc[a, "measured_s"],
                                 "simulated_speedup": t.loc[b, "simulated_s"] / t.loc[a, "simulated_s"]})
    return pd.DataFrame(rows)
