"""The MG-WFBP training experiments: launch real runs (:func:`run_grid`, one local world per world size,
run folders under ``<results_dir>/runs``), then read them back as tidy tables. A cluster job writes the
same folders with ``torchrun -m repro.train``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from repro.core.cost import Linear, fit_linear, relative_errors
from repro.core.plan import PlanError
from repro.grids.grid import grid_run_ids
from repro.launch.local import launch_local
from repro.launch.netns import format_bandwidth, parse_bandwidth
from repro.results.runs import EPOCHS_CSV, ITERATIONS_CSV, list_runs, load_run, prepare_run, runs_table
from repro.results.tables import write_table
from repro.core.schedulers import canonical_name
from repro.core.simulate import simulate
from repro.studies.common import available_cpus, warn_if_oversubscribed, with_oversubscription

__all__ = ["clear_runs", "run_grid", "run_configs", "time_allreduce_sizes", "measure_allreduce", "load_runs",
           "load_iterations", "load_epochs", "speedup_table", "breakdown_table", "allreduce_fit_table",
           "allreduce_fit_errors", "threshold_sweep_table", "grid_runs", "convergence_epochs", "BREAKDOWN_DERIVATION",
           "timing_specs"]


def run_configs(ctx, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: train each config in turn (a module-level target for :func:`launch_local`)."""
    from repro.train import TrainConfig, train_worker

    return [train_worker(ctx, TrainConfig(**c)) for c in configs]


def timing_specs(schedulers: Sequence[str], thresholds_bytes: Sequence[int] = ()) -> list[dict[str, Any]]:
    """The configurations the MG-WFBP timing samples compare: ``local`` first (the computation-only
    step, t1 of a speedup), each of ``schedulers``, then ``threshold`` at each of ``thresholds_bytes``;
    all with FP32 on the wire."""
    return ([{"scheduler": s, "wire_dtype": "float32"} for s in dict.fromkeys(["local", *schedulers])
             if s != "threshold"]
            + [{"scheduler": "threshold", "threshold_bytes": int(t), "wire_dtype": "float32"}
               for t in dict.fromkeys(thresholds_bytes)])


def clear_runs(results_dir: str | Path) -> None:
    """Remove ``<results_dir>/runs`` so that a study's runs never mix with an earlier execution's."""
    root = Path(results_dir) / "runs"
    if root.is_dir():
        shutil.rmtree(root)


def run_grid(configs: Sequence[dict[str, Any]], world_sizes: Sequence[int], results_dir: str | Path, *,
             emulate_bandwidth: str | None = None, timeout_s: float = 1800, quiet: bool = True,
             overwrite: bool = False) -> pd.DataFrame:
    """Run every config at every world size on this machine (CPU: gloo, one thread per rank) and return
    :func:`load_runs` of what was written.

    ``configs`` are :class:`repro.train.TrainConfig` keyword dicts. ``local`` configs run only at P = 1,
    all others only at P > 1. ``emulate_bandwidth`` (e.g. ``"100mbit"``, needs root) shapes each rank's
    links (:mod:`repro.launch.netns`); run ids then end in ``_bw<rate>``. Run ids are deterministic, so a
    rerun needs ``overwrite=True``. A world larger than the CPU cores warns and its runs are marked
    ``oversubscribed``."""
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
            warn_if_oversubscribed(p, f"training {len(todo)} configuration(s)")
            launch_local(run_configs, p, args=(todo,), timeout_s=timeout_s, quiet=quiet, emulate_bandwidth=bw)
    return load_runs(results_dir)


def _run_id(c: dict[str, Any], p: int, bandwidth: str | None = None) -> str:
    parts = [c.get("model", "model"), c.get("scheduler", "s"), f"p{p}", c.get("wire_dtype") or "float32"]
    if bandwidth and p > 1:
        parts.append("bw" + format_bandwidth(parse_bandwidth(bandwidth)))
    if c.get("scheduler") == "threshold":
        parts.append(f"t{c.get('threshold_bytes')}")
    if c.get("epochs"):
        parts.append(f"{c.get('dataset')}-e{c['epochs']}")
    return "_".join(str(x) for x in parts)


def time_allreduce_sizes(ctx, sizes_bytes: Sequence[int], repeats: int) -> list[float]:
    """Launch target: median all-reduce seconds per size on the live group."""
    from repro.runtime.calibrate import time_allreduce

    return time_allreduce(sizes_bytes, repeats=repeats, device=ctx.device)


def measure_allreduce(world_sizes: Sequence[int], sizes_bytes: Sequence[int], results_dir: str | Path, *,
                      repeats: int = 5, emulate_bandwidth: str | None = None, timeout_s: float = 600) -> pd.DataFrame:
    """Time all-reduces at each world size > 1 and write table ``allreduce_times`` (workers, bytes,
    seconds, cpu_count, threads_per_rank, oversubscribed)."""
    rows = []
    cpus = available_cpus()
    for p in world_sizes:
        if p < 2:
            continue
        warn_if_oversubscribed(p, "all-reduce timing", cpus=cpus)
        times = launch_local(time_allreduce_sizes, p, args=(list(sizes_bytes), repeats), timeout_s=timeout_s,
                             quiet=True, emulate_bandwidth=emulate_bandwidth)[0]
        rows += [{"workers": p, "bytes": int(n), "seconds": t, "cpu_count": cpus, "threads_per_rank": 1}
                 for n, t in zip(sizes_bytes, times)]
    df = pd.DataFrame(rows)
    if not df.empty:
        df = with_oversubscription(df, workers="workers")
    write_table(df, results_dir, "allreduce_times", {"world_sizes": list(world_sizes), "repeats": repeats,
                                                     "emulate_bandwidth": emulate_bandwidth})
    return df


def allreduce_fit_table(times: pd.DataFrame) -> pd.DataFrame:
    """Per world size: the line ``a + b*bytes`` fitted by :func:`repro.core.cost.fit_linear`
    (relative-error weighting), its largest relative error, and ``oversubscribed``."""
    rows = []
    for p, g in times.groupby("workers"):
        line = fit_linear(g["bytes"], g["seconds"])
        err = relative_errors(line, g["bytes"], g["seconds"])
        rows.append({"workers": int(p), "a_s": line.a_s, "b_s_per_byte": line.b_s_per_byte, "weighting": "relative",
                     "max_abs_relative_error": float(abs(err).max()),
                     "oversubscribed": bool(g["oversubscribed"].any()) if "oversubscribed" in g else False})
    return pd.DataFrame(rows)


def allreduce_fit_errors(times: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """Per world size and message size: measured and fitted seconds and ``fitted / measured - 1``."""
    frames = []
    for p, g in times.groupby("workers"):
        f = fits[fits["workers"] == p].iloc[0]
        line = Linear(float(f["a_s"]), float(f["b_s_per_byte"]))
        g = g.sort_values("bytes")
        frames.append(pd.DataFrame({
            "workers": int(p), "bytes": g["bytes"].to_numpy(), "measured_s": g["seconds"].to_numpy(),
            "fitted_s": line.a_s + line.b_s_per_byte * g["bytes"].to_numpy(dtype=float),
            "relative_error": relative_errors(line, g["bytes"], g["seconds"]),
            "oversubscribed": g["oversubscribed"].to_numpy() if "oversubscribed" in g else False}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# Reading results (a local run or a cluster job's)

def load_runs(results_dir: str | Path) -> pd.DataFrame:
    """One row per run under ``<results_dir>/runs``: its summary, a few config fields, ``path``,
    ``cpu_count``, ``threads_per_rank`` and ``oversubscribed``; old scheduler names mapped to current ones."""
    return _load_runs_in(Path(results_dir) / "runs")


def _load_runs_in(folder: Path) -> pd.DataFrame:
    """:func:`load_runs` of the run folders directly under ``folder``."""
    df = runs_table(folder)
    if "scheduler" in df:
        df["scheduler"] = df["scheduler"].map(canonical_name)
    if df.empty:
        return df
    envs = [load_run(p).environment for p in df["path"]]
    df["cpu_count"] = [e.get("cpu_count") for e in envs]
    df["threads_per_rank"] = [e.get("threads_per_rank") for e in envs]
    return with_oversubscription(df) if "world_size" in df else df


def _concat(folder: Path, name: str) -> pd.DataFrame:
    """Table ``name`` of every run folder under ``folder``, concatenated."""
    frames = [t for r in list_runs(folder) if (t := r.table(name)) is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_iterations(results_dir: str | Path) -> pd.DataFrame:
    return _concat(Path(results_dir) / "runs", ITERATIONS_CSV)


def load_epochs(results_dir: str | Path) -> pd.DataFrame:
    epochs = _concat(Path(results_dir) / "runs", EPOCHS_CSV)
    if epochs.empty:
        return epochs
    runs = load_runs(results_dir)
    runs = runs[[c for c in ("run_id", "model", "scheduler", "world_size", "dataset") if c in runs]]
    return epochs.merge(runs, on="run_id")


def grid_runs(runs: pd.DataFrame, paper: str, kind: str | None = None, experiment: str | None = None) -> pd.DataFrame:
    """The rows of ``runs`` that are runs of ``paper``'s grid of one ``kind`` (``"convergence"`` or
    ``"throughput"``) and/or ``experiment``, matched by run id (:func:`repro.grids.grid.grid_run_ids`)."""
    if runs.empty or "run_id" not in runs:
        return runs
    return runs[runs["run_id"].isin(grid_run_ids(paper, kind, experiment))]


def convergence_epochs(results_dir: str | Path, *, scale: str = "tiny", model: str | None = None,
                       world_size: int | None = None) -> pd.DataFrame:
    """The epochs of ``mgwfbp.convergence``: at ``scale="paper"`` those of the MG-WFBP grid's
    convergence runs only; at ``tiny`` those of ``model`` at ``world_size``. Empty when none has finished."""
    epochs = load_epochs(results_dir)
    if epochs.empty:
        return epochs
    if scale == "paper":
        return epochs[epochs["run_id"].isin(grid_run_ids("mgwfbp", "convergence"))].reset_index(drop=True)
    if model is not None:
        epochs = epochs[epochs["model"] == model]
    if world_size is not None:
        epochs = epochs[epochs["world_size"] == world_size]
    return epochs.reset_index(drop=True)


def _timing_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Throughput runs only (synthetic data); convergence runs time data loading and evaluation too."""
    return runs[runs["dataset"].fillna("synthetic") == "synthetic"] if "dataset" in runs else runs


def _flag(r, name: str = "oversubscribed") -> bool:
    v = r.get(name) if hasattr(r, "get") else None
    return bool(v) if v is not None and v == v else False


def speedup_table(runs: pd.DataFrame, schedulers: Sequence[str]) -> pd.DataFrame:
    """Measured speedup ``P * t_1 / t_P`` per model and scheduler (t_1: the one-worker ``local``
    run), plus ``linear`` rows holding the ideal P."""
    runs = _timing_runs(runs)
    if "oversubscribed" not in runs:
        runs = with_oversubscription(runs)
    single = runs[(runs.scheduler == "local") & (runs.world_size == 1)].set_index("model")["iteration_s"]
    rows = []
    for _, r in runs[runs.scheduler.isin(schedulers) & (runs.wire_dtype == "float32")].iterrows():
        if r.model in single.index and r.world_size > 1 and r.scheduler != "threshold":
            rows.append({"model": r.model, "scheduler": r.scheduler, "workers": r.world_size,
                         "speedup": r.world_size * single[r.model] / r.iteration_s, "oversubscribed": _flag(r)})
    rows += [{"model": model, "scheduler": "linear", "workers": p, "speedup": float(p), "oversubscribed": False}
             for model in single.index for p in sorted(set(runs.world_size))]
    return pd.DataFrame(rows)


#: how :func:`breakdown_table` measures computation (also its ``derivation`` column)
BREAKDOWN_DERIVATION = (
    "computation = the median over this model's runs at this P (every scheduler and wire dtype) of their "
    "computation-only time (compute_s: steps of a copy of the model without communication), one number per "
    "model, since each run's own is noisy on shared cores; exposed = iteration - computation (>= 0); "
    "simulated: every run's plan on one shared trace and cost model (trace_from)")


def _shared_run(group: pd.DataFrame, prefer: Sequence[str]) -> Any:
    """The first run of ``group`` that can be simulated, preferring the schedulers ``prefer`` in order
    and FP32, then by run id; None when none can."""
    order = {s: i for i, s in enumerate(prefer)}
    g = group.assign(_o=group["scheduler"].map(order).fillna(len(order)),
                     _d=(group["wire_dtype"].fillna("float32") != "float32").astype(int)).sort_values(
        ["_o", "_d", "run_id"])
    for path in g["path"]:
        run = load_run(path)
        if run.can_simulate:
            return run
    return None


def _simulate_on(shared: Any, plan: Any) -> Any:
    """``plan`` simulated on ``shared``'s trace and cost model (None when it does not fit that trace)."""
    try:
        return simulate(shared.trace, plan, shared.cost, with_ops=False)
    except PlanError:
        return None


def breakdown_table(runs: pd.DataFrame, schedulers: Sequence[str],
                    shared_trace_from: Sequence[str] = ("mgwfbp", "optimal")) -> pd.DataFrame:
    """Computation vs exposed communication per run, measured (:data:`BREAKDOWN_DERIVATION`) and
    simulated: every run's plan on one trace and cost model per model and world size, that of the first
    run of ``shared_trace_from`` that can be simulated (``trace_from``). Also ``run_compute_s`` (the run's
    own computation-only time) and ``computation_runs`` (runs in the median)."""
    rows = []
    runs = _timing_runs(runs)
    runs = runs[runs.scheduler.isin(schedulers)]
    for (model, p), group in runs.groupby(["model", "world_size"], sort=False):
        comp = float(group["compute_s"].median())
        shared = _shared_run(group, shared_trace_from)
        for _, r in group.iterrows():
            plan = load_run(r.path).plan if shared is not None else None
            sim = _simulate_on(shared, plan) if plan is not None else None
            base = {"model": model, "scheduler": r.scheduler, "workers": int(p), "wire_dtype": r.wire_dtype,
                    "oversubscribed": _flag(r), "run_compute_s": r.compute_s, "computation_runs": len(group),
                    "derivation": BREAKDOWN_DERIVATION}
            rows.append({**base, "source": "measured", "computation_s": min(comp, float(r.iteration_s)),
                         "exposed_comm_s": max(0.0, float(r.iteration_s) - comp), "iteration_s": r.iteration_s,
                         "trace_from": None})
            if sim is not None:
                rows.append({**base, "source": "simulated", "computation_s": sim.compute_s,
                             "exposed_comm_s": sim.exposed_comm_s, "iteration_s": sim.iteration_s,
                             "trace_from": shared.run_id})
    return pd.DataFrame(rows)


def threshold_sweep_table(runs: pd.DataFrame, references: Sequence[str] = ("wfbp", "syncea", "mgwfbp", "optimal"),
                          shared_trace_from: Sequence[str] = ("mgwfbp", "optimal")) -> pd.DataFrame:
    """Iteration seconds of the ``threshold`` runs per ``threshold_bytes`` and of the
    ``references`` (``threshold_bytes`` empty) at the largest world size, FP32, measured and simulated on
    one shared trace and cost model per model (``trace_from``), so the simulated curve differs only by the
    plans. Also ``run_order`` (by recorded ``time_utc``, then run id), ``buckets``, ``run_compute_s``,
    ``computation_s`` and ``same_plan_as`` (the reference whose run executed the same bucketing)."""
    runs = _timing_runs(runs)
    p = runs.world_size.max()
    base = runs[(runs.world_size == p) & (runs.wire_dtype == "float32")]
    base = base[(base.scheduler == "threshold") | base.scheduler.isin(references)]
    rows = []
    for model, group in base.groupby("model", sort=False):
        shared = _shared_run(group, shared_trace_from)
        loaded = {r.run_id: load_run(r.path) for r in group.itertuples()}
        plans = {rid: run.plan for rid, run in loaded.items()}
        layouts = {rid: _layout(pl) for rid, pl in plans.items()}
        ref_layouts = {layouts[r.run_id]: r.scheduler for r in group.itertuples()
                       if r.scheduler != "threshold" and layouts[r.run_id] is not None}
        for r in group.itertuples():
            sim = _simulate_on(shared, plans[r.run_id]) if shared is not None and plans[r.run_id] is not None \
                else None
            th = getattr(r, "threshold_bytes", None) if r.scheduler == "threshold" else None
            same = ref_layouts.get(layouts[r.run_id]) if r.scheduler == "threshold" else None
            common = {"model": model, "scheduler": r.scheduler, "workers": int(p), "threshold_bytes": th,
                      "oversubscribed": _flag(r._asdict()), "buckets": getattr(r, "buckets", None),
                      "same_plan_as": same, "run_id": r.run_id, "run_compute_s": getattr(r, "compute_s", None)}
            rows.append({**common, "source": "measured", "iteration_s": r.iteration_s, "trace_from": None,
                         "computation_s": getattr(r, "compute_s", None),
                         "time_utc": loaded[r.run_id].environment.get("time_utc")})
            if sim is not None:
                rows.append({**common, "source": "simulated", "iteration_s": sim.iteration_s,
                             "computation_s": sim.compute_s, "trace_from": shared.run_id, "time_utc": None})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    meas = df[df.source == "measured"]
    key = meas["time_utc"].fillna("").astype(str) + "|" + meas["run_id"]
    order = {rid: i for i, rid in enumerate(meas.assign(_k=key).sort_values("_k")["run_id"])}
    df["run_order"] = df["run_id"].map(order)
    return df.drop(columns=["time_utc"])


def _layout(plan: Any) -> tuple | None:
    """A plan's bucketing as sets of layers (order-free), to tell runs of the same plan apart."""
    if plan is None:
        return None
    return frozenset(frozenset(b.layers) for b in plan.buckets)
