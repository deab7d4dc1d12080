"""The MG-WFBP training experiments: launch real runs, then read them back as tidy tables.

Launching (this machine): :func:`run_grid` starts one local world per world size and runs every
(model, scheduler, precision, threshold) configuration in it, one after the other, each writing a
run folder under ``<results_dir>/runs``. A cluster job writes the same folders with
``torchrun -m repro.train --results-dir ...``; everything below then only reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from repro.cluster.local import launch_local
from repro.cost import CostModel
from repro.runs import EPOCHS_CSV, ITERATIONS_CSV, list_runs, load_run, runs_table
from repro.schedulers import canonical_name
from repro.sim import simulate

__all__ = ["clear_runs", "run_grid", "run_configs", "time_allreduce_sizes", "measure_allreduce", "load_runs",
           "load_iterations", "load_epochs", "speedup_table", "breakdown_table", "allreduce_fit_table",
           "threshold_sweep_table"]


def run_configs(ctx, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: train each config in turn (a module-level target for :func:`launch_local`)."""
    from repro.train import TrainConfig, train_worker

    return [train_worker(ctx, TrainConfig(**c)) for c in configs]


def clear_runs(results_dir: str | Path) -> None:
    """Remove ``<results_dir>/runs`` (a study's own run folders) so that a fresh execution of a study
    never mixes its runs with those of an earlier execution with other parameters."""
    import shutil

    root = Path(results_dir) / "runs"
    if root.is_dir():
        shutil.rmtree(root)


def run_grid(configs: Sequence[dict[str, Any]], world_sizes: Sequence[int], results_dir: str | Path, *,
             emulate_bandwidth: str | None = None, timeout_s: float = 1800, quiet: bool = True,
             overwrite: bool = False) -> pd.DataFrame:
    """Run every config at every world size on this machine (CPU: gloo, one thread per rank).

    ``configs`` are :class:`repro.train.TrainConfig` keyword dicts; ``results_dir``/``quiet`` are
    filled in. ``local`` configs run only at P = 1 (the baseline of speedups), all others only at
    P > 1. ``emulate_bandwidth`` (e.g. ``"100mbit"``) runs each rank in its own network namespace
    with links shaped to that rate (:mod:`repro.cluster.netns`; needs root); run ids then end in
    ``_bw<rate>`` and the rate is recorded in each run. Run ids are deterministic, so running the
    same grid twice needs ``overwrite=True`` (each run folder is then replaced whole).
    Returns :func:`load_runs` of what was written.
    """
    from repro.cluster.netns import parse_bandwidth
    from repro.runs import prepare_run

    runs = Path(results_dir) / "runs"
    for p in world_sizes:
        bw = emulate_bandwidth if p > 1 else None
        todo = [{**c, "results_dir": str(runs), "quiet": quiet, "overwrite": overwrite,
                 "emulated_bandwidth_bps": float(parse_bandwidth(bw)) if bw else None,
                 "run_id": c.get("run_id") or _run_id(c, p, emulate_bandwidth)} for c in configs
                if (p == 1) == (c.get("scheduler") == "local")]  # "local" is the one-worker baseline
        for c in todo:  # a taken id or an unwritable folder fails here, before any rank starts
            prepare_run(runs, c["run_id"], overwrite)
        if todo:
            launch_local(run_configs, p, args=(todo,), timeout_s=timeout_s, quiet=quiet, emulate_bandwidth=bw)
    return load_runs(results_dir)


def _run_id(c: dict[str, Any], p: int, bandwidth: str | None = None) -> str:
    parts = [c.get("model", "model"), c.get("scheduler", "s"), f"p{p}", c.get("wire_dtype") or "float32"]
    if bandwidth and p > 1:
        from repro.cluster.netns import format_bandwidth, parse_bandwidth

        parts.append("bw" + format_bandwidth(parse_bandwidth(bandwidth)))
    if c.get("scheduler") == "threshold":
        parts.append(f"t{c.get('threshold_bytes')}")
    if c.get("epochs"):
        parts.append(f"{c.get('dataset')}-e{c['epochs']}")
    return "_".join(str(x) for x in parts)


def time_allreduce_sizes(ctx, sizes_bytes: Sequence[int], repeats: int) -> list[float]:
    """Per rank: median all-reduce seconds per size on the live group (launch target)."""
    from repro.runtime.calibrate import time_allreduce

    return time_allreduce(sizes_bytes, repeats=repeats, device=ctx.device)


def measure_allreduce(world_sizes: Sequence[int], sizes_bytes: Sequence[int], results_dir: str | Path, *,
                      repeats: int = 5, emulate_bandwidth: str | None = None, timeout_s: float = 600) -> pd.DataFrame:
    """Time all-reduces at each world size here and write ``allreduce_times.csv``."""
    rows = []
    for p in world_sizes:
        if p < 2:
            continue
        times = launch_local(time_allreduce_sizes, p, args=(list(sizes_bytes), repeats), timeout_s=timeout_s,
                             quiet=True, emulate_bandwidth=emulate_bandwidth)[0]
        rows += [{"workers": p, "bytes": int(n), "seconds": t} for n, t in zip(sizes_bytes, times)]
    df = pd.DataFrame(rows)
    from repro.results import write_table

    write_table(df, results_dir, "allreduce_times", {"world_sizes": list(world_sizes), "repeats": repeats,
                                                     "emulate_bandwidth": emulate_bandwidth})
    return df


def allreduce_fit_table(times: pd.DataFrame) -> pd.DataFrame:
    """Least-squares a + b*bytes per world size from measured times."""
    rows = []
    for p, g in times.groupby("workers"):
        cm = CostModel.fit(int(p), {"allreduce": (g["bytes"], g["seconds"])})
        line = cm.line("allreduce")
        rows.append({"workers": int(p), "a_s": line.a_s, "b_s_per_byte": line.b_s_per_byte})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# Reading results (a local run or a cluster job's)
# ---------------------------------------------------------------------------------------------

def load_runs(results_dir: str | Path) -> pd.DataFrame:
    """One row per run under ``<results_dir>/runs``: its summary (iteration, computation-only and exposed
    seconds, ...), a few config fields and its ``path``; old scheduler names are mapped to current ones."""
    df = runs_table(Path(results_dir) / "runs")
    if "scheduler" in df:
        df["scheduler"] = df["scheduler"].map(canonical_name)
    return df


def _concat(results_dir: str | Path, name: str) -> pd.DataFrame:
    frames = [t for r in list_runs(Path(results_dir) / "runs") if (t := r.table(name)) is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_iterations(results_dir: str | Path) -> pd.DataFrame:
    return _concat(results_dir, ITERATIONS_CSV)


def load_epochs(results_dir: str | Path) -> pd.DataFrame:
    epochs = _concat(results_dir, EPOCHS_CSV)
    if epochs.empty:
        return epochs
    runs = load_runs(results_dir)[["run_id", "model", "scheduler", "world_size"]]
    return epochs.merge(runs, on="run_id")


def _timing_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Throughput runs only (synthetic data); convergence runs time data loading and evaluation too."""
    return runs[runs["dataset"].fillna("synthetic") == "synthetic"] if "dataset" in runs else runs


def speedup_table(runs: pd.DataFrame, schedulers: Sequence[str]) -> pd.DataFrame:
    """Measured speedup ``P * t_1 / t_P`` per model and scheduler; t_1: the one-worker ``local`` run."""
    runs = _timing_runs(runs)
    single = runs[(runs.scheduler == "local") & (runs.world_size == 1)].set_index("model")["iteration_s"]
    rows = []
    for _, r in runs[runs.scheduler.isin(schedulers) & (runs.wire_dtype == "float32")].iterrows():
        if r.model in single.index and r.world_size > 1 and r.scheduler != "threshold":
            rows.append({"model": r.model, "scheduler": r.scheduler, "workers": r.world_size,
                         "speedup": r.world_size * single[r.model] / r.iteration_s})
    for model, t1 in single.items():
        for p in sorted(set(runs.world_size)):
            rows.append({"model": model, "scheduler": "linear", "workers": p, "speedup": float(p)})
    return pd.DataFrame(rows)


def breakdown_table(runs: pd.DataFrame, schedulers: Sequence[str]) -> pd.DataFrame:
    """Computation vs non-overlapped communication, measured and simulated from the run's own trace,
    plan and fitted cost model."""
    rows = []
    runs = _timing_runs(runs)
    for _, r in runs[runs.scheduler.isin(schedulers)].iterrows():
        run = load_run(r.path)
        sim = simulate(run.trace, run.plan, run.cost, with_ops=False) if run.can_simulate else None
        for source, comp, exposed in (("measured", r.compute_s, r.exposed_comm_s),
                                      ("simulated", sim.compute_s if sim else None,
                                       sim.exposed_comm_s if sim else None)):
            if comp is None:
                continue
            rows.append({"model": r.model, "scheduler": r.scheduler, "workers": r.world_size,
                         "wire_dtype": r.wire_dtype, "source": source, "computation_s": comp,
                         "exposed_comm_s": exposed})
    return pd.DataFrame(rows)


def _simulated_iteration_s(path: str | Path) -> float | None:
    run = load_run(path)
    if not run.can_simulate:
        return None
    return simulate(run.trace, run.plan, run.cost, with_ops=False).iteration_s


def threshold_sweep_table(runs: pd.DataFrame, references: Sequence[str] = ("mgwfbp", "optimal")
                          ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sweep, references): iteration seconds of the ``threshold`` runs per threshold and of the
    reference schedulers, each measured and simulated, at the largest world size, FP32."""
    runs = _timing_runs(runs)
    p = runs.world_size.max()
    base = runs[(runs.world_size == p) & (runs.wire_dtype == "float32")]
    sweep, refs = [], []
    for _, r in base.iterrows():
        for source, t in (("measured", r.iteration_s), ("simulated", _simulated_iteration_s(r.path))):
            if t is None:
                continue
            row = {"model": r.model, "scheduler": r.scheduler, "workers": p, "source": source, "iteration_s": t}
            if r.scheduler == "threshold":
                sweep.append({**row, "threshold_bytes": r.threshold_bytes})
            elif r.scheduler in references:
                refs.append(row)
    return pd.DataFrame(sweep), pd.DataFrame(refs)
