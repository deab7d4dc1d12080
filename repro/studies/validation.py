"""Simulator vs reality: the same plan measured on this machine and simulated from the run's own
measured trace and the cost model fitted on the same network.

Each plan run (see :mod:`repro.train`) saves its trace (warm-up measurement), plan and fitted cost
model; the simulated iteration is :func:`repro.sim.simulate` of exactly those. PyTorch DDP keeps no
trace, so its prediction uses the MG-WFBP run of the same model and network with DDP's default
bucketing (the ``ddp`` planner: 1 MiB first bucket, then 25 MiB).

Two predictions per run: ``simulated_s`` from the warm-up trace (computation measured without
overlapping communication: a true prediction) and ``simulated_inrun_s`` from the per-layer times
measured during the run itself under its own schedule. Their difference isolates how much slower
computation runs while communication overlaps it (CPU contention on a small host); the second
checks the communication and overlap model alone.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Sequence

import pandas as pd

from repro.planners import make_plan
from repro.runs import load_run
from repro.sim import simulate
from repro.studies.mgwfbp_train import load_runs, run_grid

__all__ = ["usable_bandwidths", "run_validation", "validation_table", "speedup_comparison"]

LOOPBACK = "loopback"


def usable_bandwidths(link_rates: Sequence[str], required: bool = False) -> list[str]:
    """``link_rates`` (``"loopback"`` or tc rates like ``"100mbit"``) minus emulated ones this machine
    cannot emulate (a warning says why), unless ``required``, in which case the error is raised."""
    from repro.cluster.netns import EmulationUnavailableError, check_emulation_available

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


def run_validation(configs: Sequence[dict], link_rates: Sequence[str], world_sizes: Sequence[int] | int,
                   results_dir: str | Path, **kwargs) -> pd.DataFrame:
    """Run ``configs`` at each of ``world_sizes`` once per link rate (``"loopback"`` or a rate like
    ``"100mbit"``); ``kwargs`` go to :func:`~repro.studies.mgwfbp_train.run_grid` (e.g. ``overwrite=True``),
    which warns when a world size exceeds this machine's CPU cores."""
    sizes = [world_sizes] if isinstance(world_sizes, int) else list(world_sizes)
    for net in link_rates:
        run_grid(configs, sizes, results_dir, emulate_bandwidth=None if net == LOOPBACK else net, **kwargs)
    return load_runs(results_dir)


def _network(row) -> str:
    from repro.cluster.netns import format_bandwidth

    bw = row.get("emulated_bandwidth_bps")
    return format_bandwidth(bw) if isinstance(bw, (int, float)) and bw == bw and bw else LOOPBACK


def validation_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Measured vs simulated iteration seconds per model, network and scheduler, with the error."""
    runs = runs.assign(network=[_network(r) for _, r in runs.iterrows()])
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
        over = r.get("oversubscribed")
        row = {"model": r.model, "network": r.network, "workers": r.world_size, "scheduler": r.scheduler,
               "oversubscribed": bool(over) if over is not None and over == over else False,
               "buckets": plan.num_buckets, "measured_s": r.iteration_s, "simulated_s": sim.iteration_s,
               "error_pct": 100.0 * (sim.iteration_s / r.iteration_s - 1.0),
               "trace_backward_s": trace.total_backward_s, "inrun_backward_s": None,
               "simulated_inrun_s": None, "error_inrun_pct": None}
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
