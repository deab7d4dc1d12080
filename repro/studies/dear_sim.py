"""The DeAR simulation study as tidy tables (the notebooks only call these and plot).

Per-layer times are roofline estimates of a V100 (``<model>_b<batch>_v100-estimate``), not
measurements. Costs: ``10gbe-dear64`` / ``56gbib-dear64`` are the DeAR authors' all-reduce fits at
P=64; ``*-dear-derived`` are per-hop ring constants derived from them, valid for any P. Throughput is
samples per second over all GPUs. ``cost_mode`` ``"paper"`` simulates the presets, ``"calibrated"``
the calibrated cluster of the same network (:func:`repro.costs.published_fits.cost_for_mode`).
"""

from __future__ import annotations

import time
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from repro.costs.published_fits import check_cost_mode, cost_for_mode
from repro.core.cost import CostModel
from repro.core.paths import shipped_traces
from repro.core.planners import PLANNER_FAMILY, make_plan
from repro.families.dear.planners import (
    DEFAULT_THRESHOLD_BYTES, dear_model, dear_plan, groups_period_s, threshold_groups, threshold_sweep)
from repro.core.simulate import simulate
from repro.core.trace import Trace, load_trace

__all__ = ["DEAR_MODELS", "DEAR_METHODS", "BASELINES", "ALL_METHODS", "NOFUSION_METHODS", "FUSION_METHODS",
           "PAPER_NETWORKS", "SCALING_NETWORKS", "SCALING_WORKERS", "PAPER_CLAIM_PCT", "PAPER_CLAIM_SOURCE",
           "TRACE_NOTE", "MIB", "find_trace", "load_traces", "trace_table", "network_kind", "network_label",
           "iteration", "throughput_table", "scaling_table", "timeline_table", "exposed_breakdown",
           "breakdown_table", "buffer_sweep", "buffer_sweep_table", "speedup_summary"]

MIB = 2**20
# The paper's models -> per-GPU batch size (DeAR, ICDCS 2023); shipped V100 estimate traces.
DEAR_MODELS: dict[str, int] = {"resnet50": 64, "densenet201": 32, "inception_v4": 64, "bert_base": 64,
                               "bert_large": 32}
DEAR_METHODS: tuple[str, ...] = ("dear_nofusion", "dear_threshold", "dear_model", "dear_optimal")
BASELINES: tuple[str, ...] = ("wfbp", "bytescheduler", "horovod", "ddp_buckets", "mgwfbp")
ALL_METHODS: tuple[str, ...] = BASELINES + DEAR_METHODS
NOFUSION_METHODS: tuple[str, ...] = ("wfbp", "bytescheduler", "dear_nofusion")  # dear.throughput_nofusion
FUSION_METHODS: tuple[str, ...] = ("horovod", "ddp_buckets", "mgwfbp", "dear_threshold", "dear_model", "dear_optimal")
PAPER_NETWORKS: tuple[str, ...] = ("10gbe-dear64", "56gbib-dear64")  # the authors' fits, P=64 only
SCALING_NETWORKS: tuple[str, ...] = ("10gbe-dear-derived", "56gbib-dear-derived")  # any P
SCALING_WORKERS: tuple[int, ...] = (8, 16, 32, 64)
# The paper's headline (DeAR, ICDCS 2023, abstract): up to this speedup over the best baseline.
PAPER_CLAIM_PCT: dict[str, float] = {"10gbe": 83.0, "ib": 15.0}
PAPER_CLAIM_SOURCE = ("the paper's claim (measured): up to 83% (10GbE) and 15% (100Gb IB) over the best "
                      "baseline, 64 GPUs, five models")
TRACE_NOTE = "V100 roofline-estimate traces (not measurements)"


def figure_scale(table: pd.DataFrame) -> str:
    """``"paper"`` when every model of ``table`` is one of :data:`DEAR_MODELS` (simulated at the
    paper's batch), else ``"tiny"``: the ``save_figure`` scale of a figure drawn from it."""
    models = set(table["model"]) if len(table) and "model" in table else set()
    return "paper" if models and models <= set(DEAR_MODELS) else "tiny"


# Traces and networks

def find_trace(model: str, batch_size: int | None = None) -> str:
    """Stem of the shipped V100 estimate trace of ``model`` at the paper's batch size (or ``batch_size``)."""
    have = set(shipped_traces())
    b = batch_size if batch_size is not None else DEAR_MODELS.get(model)
    if b is not None and f"{model}_b{b}_v100-estimate" in have:
        return f"{model}_b{b}_v100-estimate"
    hits = sorted(s for s in have if s.startswith(f"{model}_b") and s.endswith("_v100-estimate"))
    if batch_size is None and hits:
        return hits[0]
    known = sorted({s.rsplit("_b", 1)[0] for s in have if s.endswith("_v100-estimate")})
    raise ValueError(f"no shipped V100 estimate trace for model '{model}'"
                     + (f" at batch {batch_size}" if batch_size is not None else "")
                     + f"; models with one: {', '.join(known) or 'none'}")


def load_traces(models: Sequence[str]) -> dict[str, Trace]:
    """Model name -> its shipped V100 estimate trace (the paper's batch size)."""
    return {m: load_trace(find_trace(m)) for m in models}


def _settings(models: Sequence[str] | Mapping[str, Trace], networks: Sequence[str], workers: int | Sequence[int],
              cost_mode: str):
    """(model, trace, network, P, cost) for every model x network x worker count."""
    check_cost_mode(cost_mode)
    traces = dict(models) if isinstance(models, Mapping) else load_traces(list(models))
    ps = [int(workers)] if np.isscalar(workers) else [int(p) for p in workers]
    for model, trace in traces.items():
        for net in networks:
            for p in ps:
                yield model, trace, net, p, cost_for_mode(net, p, cost_mode)


def trace_table(traces: Mapping[str, Trace]) -> pd.DataFrame:
    """One row per model: batch, device, layers, parameters, gradient MiB, forward and backward seconds."""
    return pd.DataFrame([{"model": m, "batch_size": t.batch_size, "device": t.device, "layers": t.num_layers,
                          "params": int(t.total_params), "gradient_mib": float(np.sum(t.bytes())) / MIB,
                          "forward_s": t.total_forward_s, "backward_s": t.total_backward_s}
                         for m, t in traces.items()])


def network_kind(network: str) -> str:
    """``"10gbe"`` or ``"ib"`` (the key of :data:`PAPER_CLAIM_PCT`) of a cost preset name."""
    n = network.lower()
    return next((kind for kind in ("10gbe", "ib") if kind in n), n)


def network_label(network: str) -> str:
    """Short display name: ``10GbE`` or ``InfiniBand``, with the preset in parentheses."""
    names = {"10gbe": "10GbE", "ib": "InfiniBand"}
    k = network_kind(network)
    return f"{names.get(k, k)} ({network})"


# Iteration time and throughput

def iteration(trace: Trace, method: str, cost: CostModel, **options) -> dict:
    """Simulated steady-state iteration of planner ``method``: iteration_s, buckets, threshold_bytes
    (DeAR's, else NaN) and plan_wall_s (seconds planning took)."""
    t0 = time.perf_counter()
    plan = make_plan(method, trace, cost, **options)
    wall = time.perf_counter() - t0
    res = simulate(trace, plan, cost, with_ops=False)
    return {"iteration_s": float(res.iteration_s), "buckets": plan.num_buckets,
            "threshold_bytes": float(plan.meta.get("threshold_bytes", np.nan)), "plan_wall_s": wall}


def throughput_table(models: Sequence[str] | Mapping[str, Trace], networks: Sequence[str] = PAPER_NETWORKS,
                     methods: Sequence[str] = ALL_METHODS, workers: int | Sequence[int] = 64,
                     cost_mode: str = "paper") -> pd.DataFrame:
    """Simulated throughput per model x network x workers x method (tidy).

    ``models``: names (shipped traces at the paper's batch sizes) or a mapping name -> trace. Columns:
    model, device, batch_size, network, workers, scheduler, iteration_s, throughput (samples/s over all
    GPUs), buckets, threshold_bytes, relative_to_best (throughput / the best method's), plan_wall_s,
    origin, cost_mode (``"paper"``: the presets; ``"calibrated"``:
    :func:`repro.costs.published_fits.cost_for_mode`)."""
    rows = []
    for model, trace, net, p, cost in _settings(models, networks, workers, cost_mode):
        for m in methods:
            r = iteration(trace, m, cost)
            rows.append({"model": model, "device": trace.device, "batch_size": trace.batch_size, "network": net,
                         "workers": p, "scheduler": m, **r, "throughput": p * trace.batch_size / r["iteration_s"]})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    best = df.groupby(["model", "network", "workers"])["throughput"].transform("max")
    df["relative_to_best"] = df["throughput"] / best
    df["origin"] = "simulated"
    df["cost_mode"] = cost_mode
    cols = ["model", "device", "batch_size", "network", "workers", "scheduler", "iteration_s", "throughput",
            "buckets", "threshold_bytes", "relative_to_best", "plan_wall_s", "origin", "cost_mode"]
    return df[cols]


def scaling_table(models: Sequence[str] | Mapping[str, Trace], workers: Sequence[int] = SCALING_WORKERS,
                  networks: Sequence[str] = SCALING_NETWORKS, methods: Sequence[str] = ALL_METHODS,
                  cost_mode: str = "paper") -> pd.DataFrame:
    """:func:`throughput_table` over ``workers`` on the per-hop presets (valid for any P)."""
    return throughput_table(models, networks, methods, workers, cost_mode)


def speedup_summary(table: pd.DataFrame, dear: Sequence[str] = DEAR_METHODS) -> pd.DataFrame:
    """Per model x network x workers: the best DeAR variant against the best other method,
    ``speedup_pct = 100 (baseline iteration / DeAR iteration - 1)``; then one ``all models`` row per
    network and workers with the largest speedup, beside the paper's claim (``paper_claim_pct``). A table
    of several cost modes is summarised per mode."""
    if "cost_mode" in table and table["cost_mode"].nunique() > 1:
        return pd.concat([speedup_summary(g, dear) for _, g in table.groupby("cost_mode", sort=False)],
                         ignore_index=True)
    rows = []
    mode = str(table["cost_mode"].iloc[0]) if "cost_mode" in table and len(table) else None
    for (model, net, p), g in table.groupby(["model", "network", "workers"], sort=False):
        d, b = g[g["scheduler"].isin(dear)], g[~g["scheduler"].isin(dear)]
        if d.empty or b.empty:
            continue
        bd, bb = d.loc[d["iteration_s"].idxmin()], b.loc[b["iteration_s"].idxmin()]
        rows.append({"model": model, "network": net, "workers": int(p), "best_dear": bd["scheduler"],
                     "dear_iteration_s": float(bd["iteration_s"]), "dear_throughput": float(bd["throughput"]),
                     "best_baseline": bb["scheduler"], "baseline_iteration_s": float(bb["iteration_s"]),
                     "baseline_throughput": float(bb["throughput"]),
                     "speedup_pct": 100.0 * (float(bb["iteration_s"]) / float(bd["iteration_s"]) - 1.0)})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    tops = out.loc[out.groupby(["network", "workers"], sort=False)["speedup_pct"].idxmax()]
    out = pd.concat([out, tops.assign(model="all models (max: " + tops["model"] + ")")], ignore_index=True)
    out["paper_claim_pct"] = [PAPER_CLAIM_PCT.get(network_kind(n), np.nan) for n in out["network"]]
    out["paper_claim"] = [f"up to {c:g}% (paper's claim, measured)" if np.isfinite(c) else ""
                          for c in out["paper_claim_pct"]]
    if mode is not None:
        out["cost_mode"] = mode
    return out


# Timelines

def _ops_frame(res) -> pd.DataFrame:
    df = pd.DataFrame([op.to_dict() for op in res.ops])
    df["task"] = np.arange(len(df))
    return df


def _dear_iterations(df: pd.DataFrame) -> pd.Series:
    """Iteration (1-based) of each op of a DeAR graph: ops after the k-th step barrier belong to
    iteration k; the barriers get the iteration they open (0 for the last)."""
    step = (df["kind"] == "step").cumsum()
    return step.where(step <= step.max() - 1, 0) if len(df) else step


def timeline_table(trace: Trace, cost: CostModel, schedulers: Sequence[str] = ("wfbp", "dear_threshold"),
                   network: str = "", cost_mode: str = "paper") -> pd.DataFrame:
    """Simulated ops of one iteration and the next forward, per scheduler.

    DeAR family: the graph from the first step barrier (t = 0) to the end of the second iteration's
    forward. All-reduce family: the iteration plus its forward copied to start at ``iteration_s`` (the
    next forward waits for every all-reduce). Columns: scheduler, stream, row (``compute``/``comm``),
    kind, label, start_s, end_s, iteration (1 or 2), iteration_s, boundary_s (where iteration 2 starts),
    buckets, workers, network, cost_mode (recorded, not applied). Zero-length ops are left out."""
    check_cost_mode(cost_mode)
    frames = []
    for name in schedulers:
        plan = make_plan(name, trace, cost)
        res = simulate(trace, plan, cost)
        df = _ops_frame(res)
        family = PLANNER_FAMILY[name]
        if family == "dear":
            df["iteration"] = _dear_iterations(df)
            steps = df[df["kind"] == "step"]
            boundary = float(steps["end_s"].iloc[1])
            first_bwd = df[(df["iteration"] == 2) & (df["kind"] == "backward")]["task"].min()
            keep = (df["iteration"] == 1) | ((df["iteration"] == 2) & (df["task"] < first_bwd))
            df = df[keep & (df["kind"] != "step")]
        elif family == "allreduce":
            boundary = float(res.iteration_s)
            df["iteration"] = 1
            nxt = df[df["kind"].isin(["pre_forward", "forward"])].copy()
            nxt["start_s"] += boundary
            nxt["end_s"] += boundary
            nxt["iteration"] = 2
            df = pd.concat([df, nxt], ignore_index=True)
        else:
            raise ValueError(f"timeline_table draws the dear and allreduce families, not {name} ({family})")
        df = df[df["end_s"] > df["start_s"]].drop(columns="task")
        df.insert(0, "scheduler", name)
        df.insert(2, "row", np.where(df["stream"] == "comm", "comm", "compute"))
        df = df.assign(iteration_s=float(res.iteration_s), boundary_s=boundary, buckets=plan.num_buckets,
                       workers=cost.workers, network=network, cost_mode=cost_mode)
        frames.append(df.sort_values(["row", "start_s"], kind="stable"))
    return pd.concat(frames, ignore_index=True)


# Breakdown: computation vs exposed communication

def _merge(intervals) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted disjoint intervals (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


_EXPOSED_COLUMN = {"reduce_scatter": "exposed_rs_s", "allgather": "exposed_ag_s", "allreduce": "exposed_allreduce_s"}


def exposed_breakdown(trace: Trace, plan, cost: CostModel) -> dict:
    """Computation vs exposed communication in one steady-state period of ``plan`` (seconds).

    The window is the last barrier-to-barrier interval (DeAR) or ``[0, iteration_s]`` (all-reduce
    family). ``computation_s`` is the time the compute stream is busy in it; every other instant is
    exposed communication, attributed to the kind of the (single, FIFO) communication op running then
    (``exposed_rs_s``, ``exposed_ag_s``, ``exposed_allreduce_s``), or ``exposed_idle_s`` when none is,
    so computation_s + the exposed columns = iteration_s. Also the total seconds of each kind in the
    window (``rs_s``, ``ag_s``, ``allreduce_s``) and ``window_s``."""
    family = plan.family
    res = simulate(trace, plan, cost)
    df = _ops_frame(res)
    if family == "dear":
        steps = df[df["kind"] == "step"]
        t0, t1 = float(steps["end_s"].iloc[-2]), float(steps["end_s"].iloc[-1])
    elif family == "allreduce":
        t0, t1 = 0.0, float(res.iteration_s)
    else:
        raise ValueError(f"exposed_breakdown is defined for the dear and allreduce families, not {family}")
    comp = df[(df["stream"] != "comm")]
    busy = _merge((max(a, t0), min(b, t1)) for a, b in zip(comp["start_s"], comp["end_s"]))
    out = {"iteration_s": float(res.iteration_s), "window_s": t1 - t0,
           "computation_s": float(sum(b - a for a, b in busy)),
           "exposed_rs_s": 0.0, "exposed_ag_s": 0.0, "exposed_allreduce_s": 0.0,
           "rs_s": 0.0, "ag_s": 0.0, "allreduce_s": 0.0}
    total = {"reduce_scatter": "rs_s", "allgather": "ag_s", "allreduce": "allreduce_s"}
    for r in df[df["stream"] == "comm"].itertuples():
        a, b = max(float(r.start_s), t0), min(float(r.end_s), t1)
        if b <= a or r.kind not in _EXPOSED_COLUMN:
            continue
        out[total[r.kind]] += b - a
        out[_EXPOSED_COLUMN[r.kind]] += (b - a) - sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy)
    out["exposed_idle_s"] = max(0.0, out["window_s"] - out["computation_s"] - out["exposed_rs_s"]
                                - out["exposed_ag_s"] - out["exposed_allreduce_s"])
    return out


def breakdown_table(models: Sequence[str] | Mapping[str, Trace], networks: Sequence[str] = PAPER_NETWORKS,
                    schedulers: Sequence[str] = ("wfbp", "dear_threshold", "dear_model"),
                    workers: int = 64, cost_mode: str = "paper") -> pd.DataFrame:
    """:func:`exposed_breakdown` per model x network x scheduler, with model, network, workers,
    scheduler, buckets and cost_mode columns (``window_s`` dropped)."""
    rows = []
    for model, trace, net, p, cost in _settings(models, networks, workers, cost_mode):
        for s in schedulers:
            plan = make_plan(s, trace, cost)
            rows.append({"model": model, "network": net, "workers": p, "scheduler": s,
                         **exposed_breakdown(trace, plan, cost), "buckets": plan.num_buckets, "cost_mode": cost_mode})
    df = pd.DataFrame(rows)
    return df.drop(columns="window_s") if len(df) else df


# Buffer (threshold) sweep

def buffer_sweep(trace: Trace, cost: CostModel, min_bytes: int = MIB, max_bytes: int = 256 * MIB,
                 points: int = 33) -> pd.DataFrame:
    """Simulated DeAR period vs fusion threshold: ``points`` log-spaced thresholds in ``[min_bytes,
    max_bytes]``, the 25 MiB default and every breakpoint of
    :func:`repro.families.dear.planners.threshold_sweep` in range, so the table holds the whole step
    function. Columns: threshold_bytes, threshold_mib, iteration_s, buckets, point ("grid",
    "breakpoint", "default"), model_choice (the breakpoint ``dear_model`` picks). Under a cost model with
    realism each period is simulated, and the model's choice need not minimise it."""
    nbytes = np.rint(trace.bytes()).astype(np.int64)
    grid = {int(t): "grid" for t in np.rint(np.geomspace(min_bytes, max_bytes, points))}
    for t, _ in threshold_sweep(trace, min_bytes, max_bytes):
        grid[int(t)] = "breakpoint"
    if min_bytes <= DEFAULT_THRESHOLD_BYTES <= max_bytes:
        grid[DEFAULT_THRESHOLD_BYTES] = "default"
    choice = int(dear_model(trace, cost, min_bytes, max_bytes).meta["threshold_bytes"])
    rows = []
    for t in sorted(grid):
        groups = threshold_groups(nbytes, t)
        period = (groups_period_s(trace, groups, cost) if cost.is_paper_model
                  else float(simulate(trace, dear_plan(trace, groups, cost, "threshold"), cost, with_ops=False).iteration_s))
        rows.append({"threshold_bytes": t, "threshold_mib": t / MIB,
                     "iteration_s": period,
                     "buckets": len(groups), "point": grid[t], "model_choice": t == choice})
    return pd.DataFrame(rows)


def buffer_sweep_table(models: Sequence[str] | Mapping[str, Trace], networks: Sequence[str] = PAPER_NETWORKS,
                       workers: int = 64, min_bytes: int = MIB, max_bytes: int = 256 * MIB,
                       points: int = 33, cost_mode: str = "paper") -> pd.DataFrame:
    """:func:`buffer_sweep` per model x network, with model, network, workers, throughput and
    cost_mode columns."""
    frames = []
    for model, trace, net, p, cost in _settings(models, networks, workers, cost_mode):
        df = buffer_sweep(trace, cost, min_bytes, max_bytes, points)
        df.insert(0, "model", model)
        df.insert(1, "network", net)
        df.insert(2, "workers", p)
        frames.append(df.assign(throughput=p * trace.batch_size / df["iteration_s"], cost_mode=cost_mode))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
