"""The OSP simulation study as tidy tables (the notebooks only call these and plot).

What is simulated is this project's interpretation of OSP (abstract only; :mod:`repro.families.ps`): a
parameter server with N workers and S shards, BSP, ASP, SSP(s) and OSP's two-stage synchronisation.
Assumptions: the "9-node testbed" read as 1 server + 8 workers; per-layer times are V100 roofline
estimates, which carry no gradient magnitudes (so OSP's importance policy here is ``position``) and no
optimizer time (so LGP on and off simulate the same period); links are alpha-beta (:func:`network_cost`)
or, with ``cost_mode="calibrated"``, fitted clusters (:func:`cost_for_rate`). With identical simulated
workers SSP never waits and equals ASP. Throughput is ``workers * batch / period``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from repro.costs.published_fits import calibrated_preset, check_cost_mode, cost_for_mode
from repro.core.cost import CostModel
from repro.core.planners import make_plan
from repro.core.simulate import simulate
from repro.core.trace import Trace, load_trace
from repro.launch.netns import format_bandwidth, parse_bandwidth

__all__ = ["OSP_MODELS", "SIM_METHODS", "PAPER_SERVERS", "PAPER_WORKERS", "PAPER_CLAIM_PCT", "PAPER_CLAIM_SOURCE",
           "PAPER_CLAIM_SHORT", "SCALE_NOTE", "TRACE_NOTE", "INTERPRETATION_NOTE", "DEFAULT_LATENCY_S",
           "CALIBRATED_RATE_PRESETS", "cost_for_rate", "calibrated_rate_omission", "find_trace", "load_traces", "trace_table", "network_cost", "network_label", "method_name",
           "iteration", "throughput_table", "speedup_summary", "stage_ratio_table", "timeline_table"]

# Shipped V100 estimate traces (model -> per-GPU batch); the abstract names no models.
OSP_MODELS: dict[str, int] = {"resnet50": 64, "vgg16": 32, "densenet201": 32, "inception_v4": 64,
                              "googlenet": 64, "resnet152": 128, "bert_base": 64, "bert_large": 32}
SIM_METHODS: tuple[str, ...] = ("ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_auto")
PAPER_SERVERS = 1   # our reading of the "9-node testbed": 1 parameter server + 8 workers
PAPER_WORKERS = 8
DEFAULT_LATENCY_S = 50e-6
# The paper's headline (abstract only): up to 50% higher throughput, no accuracy loss.
PAPER_CLAIM_PCT = 50.0
PAPER_CLAIM_SHORT = "paper's claim (abstract): up to +50% throughput, no accuracy loss"
PAPER_CLAIM_SOURCE = ("the paper's claim (OSP abstract, arXiv 2306.16926): up to 50% higher throughput than "
                      "popular synchronization models without accuracy loss, measured on a 9-node testbed; the "
                      "abstract names neither the baselines nor the models")
SCALE_NOTE = "1 server + 8 workers (our reading of the paper's 9-node testbed)"
TRACE_NOTE = "V100 roofline-estimate traces (not measurements)"
INTERPRETATION_NOTE = ("OSP's text is not available (abstract only): this is the project's interpretation "
                       "of its abstract (repro.families.ps.simulate, repro.families.ps.executor), not the paper's algorithm")


# Traces and networks

def find_trace(model: str) -> str:
    """Stem of the shipped V100 estimate trace of ``model`` at the batch of :data:`OSP_MODELS`."""
    from repro.studies.dear_sim import find_trace as _find

    if model not in OSP_MODELS:
        raise ValueError(f"unknown model '{model}'; models with a V100 estimate trace here: {', '.join(OSP_MODELS)}")
    return _find(model, OSP_MODELS[model])


def load_traces(models: Sequence[str]) -> dict[str, Trace]:
    """Model name -> its shipped V100 estimate trace."""
    return {m: load_trace(find_trace(m)) for m in models}


def trace_table(traces: Mapping[str, Trace]) -> pd.DataFrame:
    """One row per model: batch, device, layers, gradient MiB, compute_s (what a worker computes per
    iteration) and update_s (optimizer seconds)."""
    from repro.families.ps.simulate import trace_compute_s

    return pd.DataFrame([{"model": m, "batch_size": t.batch_size, "device": t.device, "layers": t.num_layers,
                          "gradient_mib": float(np.sum(t.bytes())) / 2**20, "compute_s": trace_compute_s(t),
                          "update_s": float(t.overheads.update_s)} for m, t in traces.items()])


def network_cost(rate: str | float, workers: int = PAPER_WORKERS, latency_s: float = DEFAULT_LATENCY_S) -> CostModel:
    """The alpha-beta cost model of a link of ``rate`` (tc-style, e.g. ``"10gbit"``, or bits per second)
    for ``workers`` workers: push = pull = ``latency_s + bytes x 8 / rate`` (one message alone on a server
    link; the simulator queues messages itself)."""
    bps = float(parse_bandwidth(rate))
    if not latency_s >= 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency_s!r}")
    return CostModel.from_alpha_beta(int(workers), float(latency_s), 8.0 / bps,
                                     source=f"alpha-beta link {format_bandwidth(bps)}, {latency_s * 1e6:g} us/message")


# Link rate (bits per second) -> the calibrated preset of the measured network of that rate.
CALIBRATED_RATE_PRESETS: dict[float, str] = {10e9: "10gbe-calibrated", 100e9: "100gbib-calibrated"}
# The calibration whose realism a rate without a measured network of its own gains (TCP Ethernet).
FALLBACK_CALIBRATION = "10gbe-calibrated"


def cost_for_rate(rate: str | float, workers: int = PAPER_WORKERS, latency_s: float = DEFAULT_LATENCY_S,
                  cost_mode: str = "paper") -> CostModel:
    """The cost model of a simulated server link of ``rate`` in ``cost_mode``: ``"paper"``:
    :func:`network_cost`; ``"calibrated"``: the fitted cluster of a rate in :data:`CALIBRATED_RATE_PRESETS`
    (``latency_s`` ignored), else :func:`network_cost` with the realism of :data:`FALLBACK_CALIBRATION`.
    ``source`` says which."""
    check_cost_mode(cost_mode)
    paper = network_cost(rate, workers, latency_s)
    if cost_mode == "paper":
        return paper
    name = CALIBRATED_RATE_PRESETS.get(float(parse_bandwidth(rate)))
    if name is not None:
        return cost_for_mode(name, int(workers), cost_mode)
    realism = calibrated_preset(FALLBACK_CALIBRATION).realism
    return replace(paper.with_realism(realism),
                   source=f"{paper.source} + realism of {FALLBACK_CALIBRATION} (calibrated mode)")


def calibrated_rate_omission(rate: str | float) -> str | None:
    """None when a link of ``rate`` has a calibrated cluster of its own; otherwise why not."""
    if float(parse_bandwidth(rate)) in CALIBRATED_RATE_PRESETS:
        return None
    return (f"no measured network of {network_label(rate)} to fit (its calibrated mode would keep the alpha-beta "
            f"link and borrow the realism of {FALLBACK_CALIBRATION})")


def network_label(rate: str | float) -> str:
    """``"10gbit"`` -> ``"10 Gbit/s"``."""
    bps = float(parse_bandwidth(rate))
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def method_name(scheduler: str, lgp: bool = True) -> str:
    """The style key of a run or simulation: the scheduler, with ``_nolgp`` for OSP without LGP."""
    return f"{scheduler}_nolgp" if scheduler in ("osp", "osp_auto") and not lgp else scheduler


# Iteration time and throughput

def _options(scheduler: str, servers: int, stage1_share: float, staleness: int) -> dict:
    opts: dict = {"servers": int(servers)}
    if scheduler == "ps_ssp":
        opts["staleness"] = int(staleness)
    if scheduler == "osp":
        opts.update(stage1_share=float(stage1_share), importance="position")
    if scheduler == "osp_auto":
        opts["importance"] = "position"
    return opts


def _settings(models: Sequence[str] | Mapping[str, Trace], rates: Sequence[str], workers: int, latency_s: float,
              cost_mode: str):
    """(model, trace, rate, cost) for every model x link rate."""
    check_cost_mode(cost_mode)
    traces = dict(models) if isinstance(models, Mapping) else load_traces(list(models))
    for model, trace in traces.items():
        for rate in rates:
            yield model, trace, rate, cost_for_rate(rate, workers, latency_s, cost_mode)


def iteration(trace: Trace, scheduler: str, cost: CostModel, *, servers: int = PAPER_SERVERS,
              stage1_share: float = 0.5, staleness: int = 2) -> dict:
    """Simulated steady-state period of one PS scheduler: iteration_s, stage1_bytes_share (the plan's),
    stage1_share (requested; osp_auto: chosen; 1 for BSP/ASP/SSP), auto_stage2_share, buckets."""
    plan = make_plan(scheduler, trace, cost, **_options(scheduler, servers, stage1_share, staleness))
    res = simulate(trace, plan, cost, with_ops=False)
    meta = plan.meta
    return {"iteration_s": float(res.iteration_s), "stage1_bytes_share": float(meta.get("stage1_bytes_share", 1.0)),
            "stage1_share": float(meta.get("stage1_share", 1.0)),
            "auto_stage2_share": float(meta.get("auto_stage2_share", np.nan)), "buckets": plan.num_buckets}


def throughput_table(models: Sequence[str] | Mapping[str, Trace], rates: Sequence[str] = ("10gbit",),
                     methods: Sequence[str] = SIM_METHODS, *, workers: int = PAPER_WORKERS,
                     servers: int = PAPER_SERVERS, stage1_share: float = 0.5, staleness: int = 2,
                     latency_s: float = DEFAULT_LATENCY_S, cost_mode: str = "paper") -> pd.DataFrame:
    """Simulated throughput per model x network x method. ``osp`` runs at ``stage1_share``,
    ``osp_auto`` chooses its own. Columns: model, batch_size, network, network_label, workers, servers,
    scheduler, method, the columns of :func:`iteration`, throughput (samples/s over all workers),
    speedup_vs_bsp, relative_to_best, origin, cost_mode."""
    rows = []
    for model, trace, rate, cost in _settings(models, rates, workers, latency_s, cost_mode):
        for m in methods:
            r = iteration(trace, m, cost, servers=servers, stage1_share=stage1_share, staleness=staleness)
            rows.append({"model": model, "batch_size": trace.batch_size, "network": str(rate),
                         "network_label": network_label(rate), "workers": int(workers), "servers": int(servers),
                         "scheduler": m, "method": method_name(m), **r,
                         "throughput": workers * trace.batch_size / r["iteration_s"]})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    keys = ["model", "network"]
    bsp = df[df.scheduler == "ps_bsp"].set_index(keys)["throughput"]
    df["speedup_vs_bsp"] = [t / bsp.get((m, n), np.nan) for m, n, t in zip(df.model, df.network, df.throughput)]
    df["relative_to_best"] = df["throughput"] / df.groupby(keys)["throughput"].transform("max")
    df["origin"] = "simulated"
    df["cost_mode"] = cost_mode
    return df


def speedup_summary(table: pd.DataFrame, osp: Sequence[str] = ("osp",),
                    baselines: Sequence[str] = ("ps_bsp", "ps_asp", "ps_ssp")) -> pd.DataFrame:
    """Per model x network: the best of ``osp`` (default the paper's OSP only) against BSP and
    against the best of ``baselines`` (``speedup_pct = 100 (their period / OSP's - 1)``), then one ``all
    models`` row per network with the largest of each, beside the paper's claim. A table of several cost
    modes is summarised per mode."""
    if "cost_mode" in table and table["cost_mode"].nunique() > 1:
        return pd.concat([speedup_summary(g, osp, baselines) for _, g in table.groupby("cost_mode", sort=False)],
                         ignore_index=True)
    rows = []
    mode = str(table["cost_mode"].iloc[0]) if "cost_mode" in table and len(table) else None
    for (model, net), g in table.groupby(["model", "network"], sort=False):
        o, b = g[g.scheduler.isin(osp)], g[g.scheduler.isin(baselines)]
        bsp = g[g.scheduler == "ps_bsp"]
        if o.empty or b.empty or bsp.empty:
            continue
        bo, bb = o.loc[o.iteration_s.idxmin()], b.loc[b.iteration_s.idxmin()]
        rows.append({"model": model, "network": net, "best_osp": bo.scheduler,
                     "osp_stage1_share": float(bo.stage1_share), "osp_throughput": float(bo.throughput),
                     "bsp_throughput": float(bsp.throughput.iloc[0]),
                     "speedup_vs_bsp_pct": 100.0 * (float(bsp.iteration_s.iloc[0]) / float(bo.iteration_s) - 1.0),
                     "best_other": bb.scheduler, "best_other_throughput": float(bb.throughput),
                     "speedup_vs_best_other_pct": 100.0 * (float(bb.iteration_s) / float(bo.iteration_s) - 1.0)})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    by_network = out.groupby("network", sort=False)
    tops = out.loc[by_network.speedup_vs_bsp_pct.idxmax()]
    tops = tops.assign(model="all models (max vs BSP: " + tops["model"] + ")",
                       speedup_vs_best_other_pct=tops["network"].map(by_network.speedup_vs_best_other_pct.max()))
    out = pd.concat([out, tops], ignore_index=True)
    out["paper_claim_pct"] = PAPER_CLAIM_PCT
    out["paper_claim"] = f"up to {PAPER_CLAIM_PCT:g}% (paper's claim, abstract; measured, baselines unnamed)"
    if mode is not None:
        out["cost_mode"] = mode
    return out


def stage_ratio_table(models: Sequence[str] | Mapping[str, Trace], shares: Sequence[float],
                      rates: Sequence[str] = ("10gbit",), *, workers: int = PAPER_WORKERS, servers: int = PAPER_SERVERS,
                      latency_s: float = DEFAULT_LATENCY_S, cost_mode: str = "paper") -> pd.DataFrame:
    """OSP's simulated period vs the stage-1 share (``point`` "sweep") plus osp_auto's choice
    ("auto") per model x network. Columns: model, network, network_label, workers, servers, point,
    stage1_share, stage1_bytes_share, iteration_s, throughput, speedup_vs_bsp, origin, cost_mode."""
    rows = []
    points = [("sweep", "osp", float(s)) for s in shares] + [("auto", "osp_auto", np.nan)]
    for model, trace, rate, cost in _settings(models, rates, workers, latency_s, cost_mode):
        bsp = iteration(trace, "ps_bsp", cost, servers=servers)["iteration_s"]
        for point, sched, share in points:
            r = iteration(trace, sched, cost, servers=servers, stage1_share=0.5 if share != share else share)
            rows.append({"model": model, "network": str(rate), "network_label": network_label(rate),
                         "workers": int(workers), "servers": int(servers), "point": point,
                         "stage1_share": r["stage1_share"], "stage1_bytes_share": r["stage1_bytes_share"],
                         "iteration_s": r["iteration_s"], "throughput": workers * trace.batch_size / r["iteration_s"],
                         "speedup_vs_bsp": bsp / r["iteration_s"]})
    df = pd.DataFrame(rows)
    if len(df):
        df["origin"] = "simulated"
        df["cost_mode"] = cost_mode
    return df


# Timelines

def _stage(kind: str) -> str:
    return "stage 2" if kind.endswith("stage2") else "" if kind in ("compute", "lgp") else "stage 1"


def timeline_table(trace: Trace, cost: CostModel, schedulers: Sequence[str] = ("ps_bsp", "osp_auto"), *,
                   servers: int = PAPER_SERVERS, stage1_share: float = 0.5, iterations: int = 3,
                   first_iteration: int = 2, network: str = "", cost_mode: str = "paper") -> pd.DataFrame:
    """The simulated ops of ``iterations`` steady-state iterations per scheduler, from ``worker0``'s
    compute of iteration ``first_iteration`` (t = 0) to that of ``first_iteration + iterations`` (ops
    clipped to the window; zero-length ops left out).

    Columns: scheduler, stream (``worker<w>``, ``server<s>.in``/``.out``/``.cpu``), kind (compute, lgp,
    push, pull, update), stage ("stage 1", "stage 2", "" for computation), worker, iteration, start_s,
    end_s, iteration_s, window_s, stage1_share, stage1_bytes_share, workers, servers, network, cost_mode
    (recorded, not applied)."""
    check_cost_mode(cost_mode)
    frames = []
    for name in schedulers:
        plan = make_plan(name, trace, cost, **_options(name, servers, stage1_share, 2))
        res = simulate(trace, plan, cost)
        df = pd.DataFrame([op.to_dict() for op in res.ops])
        lab = df["label"].str.extract(r"(?:w(?P<worker>\d+) )?i(?P<iteration>\d+)")
        df["worker"] = pd.to_numeric(lab["worker"]).astype("Int64")
        df["iteration"] = pd.to_numeric(lab["iteration"]).astype(int)
        starts = df[(df.kind == "compute") & (df.worker == 0)].set_index("iteration")["start_s"]
        last = first_iteration + iterations
        if last not in starts.index:
            raise ValueError(f"the simulation has {len(starts)} iterations; the window needs {last + 1}")
        t0, t1 = float(starts[first_iteration]), float(starts[last])
        df = df[(df.end_s > t0) & (df.start_s < t1) & (df.end_s > df.start_s)].copy()
        df["start_s"] = df["start_s"].clip(lower=t0) - t0
        df["end_s"] = df["end_s"].clip(upper=t1) - t0
        df["stage"] = df["kind"].map(_stage)
        df["kind"] = df["kind"].str.replace(r"_stage\d$", "", regex=True)
        df.insert(0, "scheduler", name)
        df = df.assign(iteration_s=float(res.iteration_s), window_s=t1 - t0,
                       stage1_share=float(plan.meta.get("stage1_share", 1.0)),
                       stage1_bytes_share=float(plan.meta.get("stage1_bytes_share", 1.0)),
                       workers=int(cost.workers), servers=int(servers), network=network, cost_mode=cost_mode)
        frames.append(df.drop(columns="label").sort_values(["stream", "start_s"], kind="stable"))
    return pd.concat(frames, ignore_index=True)
