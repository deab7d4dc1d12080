"""The MG-WFBP simulation study as tidy tables (the notebook only calls these and plots).

Speedup of P workers is ``P * t_1 / t_P``: ``t_1`` the single-worker iteration (forward + backward),
``t_P`` the simulated iteration. ``cost_mode`` ``"paper"`` simulates the presets, ``"calibrated"`` the
calibrated cluster of the same network; tables record it in ``cost_mode``.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from repro.costs.published_fits import check_cost_mode, cost_for_mode
from repro.core.cost import ALGORITHMS, CostModel, alpha_beta_lines
from repro.costs.presets import preset, preset_workers
from repro.core.paths import paper_numbers_path, shipped_traces
from repro.core.planners import make_plan
from repro.core.simulate import simulate
from repro.core.trace import Trace, load_trace

__all__ = ["MGWFBP_BATCH_SIZES", "find_trace", "load_traces", "layer_table", "allreduce_curve", "cost_model_table",
           "timeline_table", "speedup_sweep", "sim_speedup_table", "paper_comparison", "optimal_gap_table",
           "gap_summary", "paper_speedups", "workers_for", "simulated_iteration_s", "paper_allreduce_fits",
           "journal_headline", "JOURNAL_MODELS", "JOURNAL_NETWORKS", "k80_speedup_table", "k80_verdict_numbers",
           "paper_breakdown_table", "headline_comparison", "paper_threshold_sweep_table", "compute_trace",
           "COMPUTE_TRACE_SUFFIX"]


# Per-GPU batch sizes of the MG-WFBP papers; vgg16 and the BERTs (DeAR's) are our choice.
MGWFBP_BATCH_SIZES = {"resnet50": 32, "resnet152": 128, "densenet161": 64, "densenet201": 64,
                      "inception_v4": 128, "googlenet": 64, "vgg16": 32, "bert_base": 64, "bert_large": 32}
#: the notebook's sweep at ``scale="paper"``: every model above, the journal's 4 to 2048 simulated GPUs
PAPER_MODELS: tuple[str, ...] = tuple(MGWFBP_BATCH_SIZES)
PAPER_WORKERS: tuple[int, ...] = tuple(2**k for k in range(2, 12))


def find_trace(model: str, device: str = "v100-estimate", batch_size: int | None = None) -> str:
    """Stem of the shipped trace of ``model`` on ``device`` (e.g. "v100-estimate", "cpu"); with several
    batch sizes shipped, ``batch_size`` (default: the MG-WFBP papers') picks one."""
    batch = rf"{batch_size}" if batch_size else r"\d+"
    pattern = re.compile(rf"^{re.escape(model)}_b{batch}_{re.escape(device)}$")
    hits = [s for s in shipped_traces() if pattern.match(s)]
    if len(hits) > 1 and batch_size is None and model in MGWFBP_BATCH_SIZES:
        return find_trace(model, device, MGWFBP_BATCH_SIZES[model])
    if len(hits) > 1:
        raise ValueError(f"several traces for '{model}' on '{device}' ({', '.join(hits)}): give batch_size")
    if not hits:
        known = sorted({s.split("_b")[0] for s in shipped_traces() if s.endswith(device)})
        raise ValueError(f"no shipped trace for model '{model}' on '{device}' (batch {batch_size or 'any'}); "
                         f"models with such traces: "
                         f"{', '.join(known) or 'none'} (make one with `repro profile`)")
    return hits[0]


def load_traces(models: Sequence[str], device: str = "v100-estimate") -> dict[str, Trace]:
    """Model name -> shipped trace (at the MG-WFBP papers' batch size where several are shipped)."""
    return {m: load_trace(find_trace(m, device)) for m in models}


def workers_for(network: str, workers: Iterable[int]) -> list[int]:
    """The worker counts of ``workers`` that preset ``network`` can model."""
    have = preset_workers(network)
    return [p for p in workers if have is None or p in have]


def layer_table(traces: Mapping[str, Trace]) -> pd.DataFrame:
    """One row per layer: model, layer (1-based), name, params, bytes, forward_s, backward_s, device."""
    return pd.DataFrame([{"model": model, "layer": i + 1, "name": layer.name, "params": layer.params,
                          "bytes": layer.bytes, "forward_s": layer.forward_s, "backward_s": layer.backward_s,
                          "device": t.device}
                         for model, t in traces.items() for i, layer in enumerate(t.layers)])


def allreduce_curve(networks: Sequence[str], workers: int, sizes_bytes: Sequence[float]) -> pd.DataFrame:
    """All-reduce seconds of each preset at ``workers`` over message sizes."""
    sizes = np.asarray(sizes_bytes, dtype=float)
    return pd.DataFrame([{"network": net, "workers": workers, "bytes": float(n), "allreduce_s": float(t)}
                         for net in networks for n, t in zip(sizes_bytes, preset(net, workers).allreduce_s(sizes))])


def cost_model_table(alpha_s: float, beta_s_per_byte: float, gamma_s_per_byte: float,
                     workers: Sequence[int]) -> pd.DataFrame:
    """Start-up ``a_s`` and per-byte ``b_s_per_byte`` of every all-reduce algorithm as P grows, with
    the per-hop constants in every row."""
    rows = []
    for algo in ALGORITHMS:
        for p in workers:
            line = alpha_beta_lines(p, alpha_s, beta_s_per_byte, gamma_s_per_byte, algo)["allreduce"]
            rows.append({"algorithm": algo, "workers": p, "a_s": line.a_s, "b_s_per_byte": line.b_s_per_byte,
                         "alpha_s": alpha_s, "beta_s_per_byte": beta_s_per_byte,
                         "gamma_s_per_byte": gamma_s_per_byte})
    return pd.DataFrame(rows)


def simulated_iteration_s(trace: Trace, plan, cost: CostModel) -> float:
    """Seconds per iteration of ``plan`` as the simulator runs it under ``cost``: under the paper
    model the planner's own prediction (``plan.meta["iteration_s"]``, identical), with realism a full
    simulation, which can differ."""
    if cost.is_paper_model:
        return float(plan.meta["iteration_s"])
    return float(simulate(trace, plan, cost, with_ops=False).iteration_s)


def timeline_table(trace: Trace, cost: CostModel, schedulers: Sequence[str], cost_mode: str = "paper"
                   ) -> pd.DataFrame:
    """Simulated ops of one iteration per scheduler: scheduler, stream, kind, label, start_s, end_s,
    iteration_s, cost_mode (recorded, not applied)."""
    check_cost_mode(cost_mode)
    frames = []
    for s in schedulers:
        res = simulate(trace, make_plan(s, trace, cost), cost)
        df = pd.DataFrame([op.to_dict() for op in res.ops])
        df.insert(0, "scheduler", s)
        frames.append(df.assign(iteration_s=res.iteration_s, cost_mode=cost_mode))
    return pd.concat(frames, ignore_index=True)


def speedup_sweep(traces: Mapping[str, Trace], networks: Sequence[str], workers: Sequence[int],
                  schedulers: Sequence[str], threshold_bytes: int | None = None, cost_mode: str = "paper"
                  ) -> pd.DataFrame:
    """Simulated iteration time and speedup ``P * t_1 / t_P`` for every model x preset x P x
    scheduler (t_1: forward + backward), plus ``linear`` rows (``origin`` "ideal") holding P.

    ``relative_to_best``: speedup over the best scheduler's at the same model, network and P. Worker
    counts a preset lacks are skipped. ``threshold_bytes`` goes to the ``threshold`` scheduler. In
    calibrated mode ``optimal`` is the optimum of the planner's model, which the simulation need not
    keep."""
    check_cost_mode(cost_mode)
    rows = []
    for model, trace in traces.items():
        t1 = trace.total_forward_s + trace.total_backward_s
        base = {"model": model, "batch_size": trace.batch_size, "device": trace.device, "compute_s": t1,
                "cost_mode": cost_mode}
        for net in networks:
            for p in workers_for(net, workers):
                cost = cost_for_mode(net, p, cost_mode)
                rows.append({**base, "network": net, "workers": p, "scheduler": "linear", "origin": "ideal",
                             "iteration_s": t1, "speedup": float(p), "buckets": 0})
                for s in schedulers:
                    opts = {"threshold_bytes": threshold_bytes} if s == "threshold" and threshold_bytes else {}
                    plan = make_plan(s, trace, cost, **opts)
                    t = simulated_iteration_s(trace, plan, cost)
                    rows.append({**base, "network": net, "workers": p, "scheduler": s, "origin": "simulated",
                                 "iteration_s": t, "speedup": p * t1 / t, "buckets": plan.num_buckets})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    sim = df["origin"] == "simulated"
    best = df[sim].groupby(["model", "network", "workers"])["speedup"].transform("max")
    df["relative_to_best"] = df.loc[sim, "speedup"] / best  # NaN on the ideal rows
    return df


def sim_speedup_table(sweep: pd.DataFrame, paper: pd.DataFrame | None = None,
                      paper_models: Mapping[str, str] | Sequence[str] = (), network: str = "10gbe-k80"
                      ) -> pd.DataFrame:
    """The sweep plus the published speedups (``origin`` "paper", with ``citation``) placed in the
    panels of ``paper_models`` (panel -> published model; a list of ``"<model>@<device>"`` maps each to
    ``<model>``) on ``network``."""
    out = sweep.copy()
    if paper is None or not len(paper_models):
        return out
    if not isinstance(paper_models, Mapping):
        paper_models = {m: m.split("@")[0] for m in paper_models}
    frames = [out]
    for panel, published in paper_models.items():
        pm = paper[paper["model"] == published]
        if pm.empty:
            continue
        frames.append(pd.DataFrame({"model": panel, "batch_size": pm["batch_size"].to_numpy(), "network": network,
                                    "workers": pm["workers"].to_numpy(), "scheduler": pm["scheduler"].to_numpy(),
                                    "origin": "paper", "speedup": pm["speedup"].to_numpy(),
                                    "citation": pm["source"].to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def paper_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Simulated next to published speedup wherever both exist (model, network, scheduler, P)."""
    keys = ["model", "network", "scheduler", "workers"]
    if "citation" not in table or not (table["origin"] == "paper").any():
        return pd.DataFrame(columns=keys + ["speedup_simulated", "speedup_paper", "citation", "simulated_over_paper"])
    sim = table[table["origin"] == "simulated"][keys + ["speedup"]]
    pub = table[table["origin"] == "paper"][keys + ["speedup", "citation"]]
    both = sim.merge(pub, on=keys, suffixes=("_simulated", "_paper"))
    both["simulated_over_paper"] = both["speedup_simulated"] / both["speedup_paper"]
    return both


def optimal_gap_table(sweep: pd.DataFrame, scheduler: str = "mgwfbp") -> pd.DataFrame:
    """Per model x network x P: how much slower ``scheduler`` is than ``optimal`` (``gap_pct``),
    with ``cost_mode`` where the sweep has one."""
    sim = sweep[sweep["origin"] == "simulated"] if "origin" in sweep else sweep
    keys = ["model", "network", "workers"] + (["cost_mode"] if "cost_mode" in sim else [])
    wide = sim.pivot_table(index=keys, columns="scheduler", values="iteration_s").reset_index()
    wide.columns.name = None
    wide["gap_pct"] = 100.0 * (wide[scheduler] / wide["optimal"] - 1.0)
    return wide[keys[:3] + [scheduler, "optimal", "gap_pct"] + keys[3:]].rename(
        columns={scheduler: f"{scheduler}_s", "optimal": "optimal_s"})


def gap_summary(gap: pd.DataFrame, tol_pct: float = 1e-6) -> pd.DataFrame:
    """How often and by how much the optimum beats MG-WFBP, per model and overall; per cost mode where
    ``gap`` has a ``cost_mode`` column."""
    if "cost_mode" in gap:
        return pd.concat([gap_summary(g.drop(columns="cost_mode"), tol_pct).assign(cost_mode=m)
                          for m, g in gap.groupby("cost_mode", sort=False)], ignore_index=True)

    def summarise(g: pd.DataFrame) -> pd.Series:
        worse = g["gap_pct"] > tol_pct
        return pd.Series({"cases": len(g), "cases_optimal_better": int(worse.sum()),
                          "share_optimal_better": float(worse.mean()),
                          "median_gap_pct": float(g["gap_pct"].median()),
                          "max_gap_pct": float(g["gap_pct"].max())})

    per_model = gap.groupby("model").apply(summarise, include_groups=False).reset_index()
    overall = summarise(gap).to_frame().T.assign(model="all")
    return pd.concat([per_model, overall], ignore_index=True)


def paper_speedups() -> pd.DataFrame:
    """Published measured speedups of the MG-WFBP conference paper (K80, 10GbE): model, batch_size,
    scheduler, workers, speedup, source."""
    return pd.read_csv(paper_numbers_path("mgwfbp_conference_speedup")).rename(columns={"solver": "scheduler"})


# Paper-scale simulated panels of the measured figures (cheap: they run with every tiny run)

#: the MG-WFBP journal's 16-V100 models and its two networks (presets of its published fits)
JOURNAL_MODELS: tuple[str, ...] = ("resnet152", "densenet161", "densenet201", "inception_v4")
JOURNAL_NETWORKS: tuple[str, ...] = ("10gbe-v100", "56gbib-v100")
JOURNAL_WORKERS = 16


def paper_allreduce_fits() -> pd.DataFrame:
    """The MG-WFBP journal's published all-reduce fits ``a + b*M`` (4 x 4 V100, NCCL): network,
    paper_network, workers, a_s, b_s_per_byte, setting, source, where, page."""
    return pd.read_csv(paper_numbers_path("mgwfbp_allreduce_fits"))


def journal_headline() -> pd.DataFrame:
    """The MG-WFBP journal's headline speedups over each baseline on 16 V100: baseline, speedup,
    workers, gpu, setting, source, where, page."""
    return pd.read_csv(paper_numbers_path("mgwfbp_journal_headline"))


def k80_speedup_table(schedulers: Sequence[str] = ("wfbp", "syncea", "mgwfbp"), workers: Sequence[int] = (2, 4, 8),
                      cost_mode: str = "paper") -> pd.DataFrame:
    """The conference paper's setting: K80-estimate GoogLeNet and ResNet-50 simulated on
    ``10gbe-k80`` (plus ideal rows) beside the paper's measured speedups (``origin`` "paper")."""
    traces = load_traces(["googlenet", "resnet50"], "k80-estimate")
    sweep = speedup_sweep(traces, ["10gbe-k80"], list(workers), list(schedulers), cost_mode=cost_mode)
    paper = paper_speedups()
    return sim_speedup_table(sweep, paper[paper["scheduler"].isin(schedulers)], {m: m for m in traces})


def k80_verdict_numbers(table: pd.DataFrame, scheduler: str = "mgwfbp", baseline: str = "wfbp") -> pd.DataFrame:
    """Per model: ``scheduler``'s speedup over ``baseline`` at the largest published P, published
    and simulated (model, network, workers, paper_ratio, simulated_ratio)."""
    if "origin" not in table or not (table["origin"] == "paper").any():
        return pd.DataFrame(columns=["model", "network", "workers", "paper_ratio", "simulated_ratio"])
    rows = []
    pub = table[table["origin"] == "paper"]
    for (model, net), g in pub.groupby(["model", "network"], sort=False):
        p = int(g["workers"].max())
        sim = table[(table["origin"] == "simulated") & (table["model"] == model) & (table["network"] == net)
                    & (table["workers"] == p)]

        def ratio(df):
            a, b = df[df["scheduler"] == scheduler]["speedup"], df[df["scheduler"] == baseline]["speedup"]
            return float(a.iloc[0] / b.iloc[0]) if len(a) and len(b) else float("nan")

        rows.append({"model": model, "network": net, "workers": p, "paper_ratio": ratio(g[g["workers"] == p]),
                     "simulated_ratio": ratio(sim)})
    return pd.DataFrame(rows)


def paper_breakdown_table(models: Sequence[str] = JOURNAL_MODELS, networks: Sequence[str] = JOURNAL_NETWORKS,
                          workers: int = JOURNAL_WORKERS, wire_dtypes: Sequence[str] = ("float32", "float16"),
                          schedulers: Sequence[str] = ("wfbp", "syncea", "mgwfbp"), gpu: str = "v100",
                          cost_mode: str = "paper") -> pd.DataFrame:
    """Computation vs exposed communication at the journal's scale, simulated, per model x
    network x wire dtype x scheduler at ``workers`` GPUs. A float16 row runs the FP16 estimate trace
    where shipped (:func:`compute_trace`; ``compute_dtype`` and ``trace`` say which). Columns as
    :func:`repro.studies.mgwfbp_train.breakdown_table` plus network, iteration_s, cost_mode, compute_dtype,
    trace."""
    rows = []
    for model, trace32, net, cost in _journal_settings(models, networks, workers, gpu, cost_mode):
        for dt in wire_dtypes:
            trace, compute_dtype, stem = compute_trace(model, trace32, dt, gpu)
            for s in schedulers:
                plan = make_plan(s, trace, cost, wire_dtype=dt)
                res = simulate(trace, plan, cost, with_ops=False)
                rows.append({"model": model, "batch_size": trace.batch_size, "device": trace.device,
                             "network": net, "scheduler": s, "workers": workers, "wire_dtype": dt,
                             "source": "simulated", "scale": "paper", "computation_s": res.compute_s,
                             "exposed_comm_s": res.exposed_comm_s, "iteration_s": res.iteration_s,
                             "buckets": plan.num_buckets, "cost_mode": cost_mode,
                             "compute_dtype": compute_dtype, "trace": stem})
    return pd.DataFrame(rows)


#: trace-name suffix of the estimate computed in each dtype (``scripts/make_traces.py``)
COMPUTE_TRACE_SUFFIX = {"float32": "", "float16": "-fp16"}


def compute_trace(model: str, trace32: Trace, wire_dtype: str, gpu: str = "v100") -> tuple[Trace, str, str]:
    """(trace, compute dtype, stem) to simulate ``model`` with ``wire_dtype`` gradients: float16 takes
    the shipped ``<gpu>-estimate-fp16`` trace at ``trace32``'s batch where there is one, else
    ``trace32``."""
    stem32 = f"{model}_b{trace32.batch_size}_{gpu}-estimate"
    suffix = COMPUTE_TRACE_SUFFIX.get(wire_dtype, "")
    if suffix and f"{stem32}{suffix}" in shipped_traces():
        return load_trace(f"{stem32}{suffix}"), wire_dtype, f"{stem32}{suffix}"
    return trace32, "float32", stem32


def _journal_settings(models: Sequence[str], networks: Sequence[str], workers: int, gpu: str, cost_mode: str):
    """(model, trace, network, cost at ``workers``) for every model x network of a paper-scale panel."""
    check_cost_mode(cost_mode)
    for model, trace in load_traces(models, f"{gpu}-estimate").items():
        for net in networks:
            yield model, trace, net, cost_for_mode(net, workers, cost_mode)


def headline_comparison(breakdown: pd.DataFrame, headline: pd.DataFrame | None = None,
                        scheduler: str = "mgwfbp") -> pd.DataFrame:
    """The journal's headline beside the largest simulated speedup of ``scheduler`` over each
    baseline in ``breakdown`` and where it occurs (baseline, paper_speedup, simulated_speedup, at,
    source)."""
    headline = journal_headline() if headline is None else headline
    rows = []
    wide = (breakdown.pivot_table(index=["model", "network", "wire_dtype"], columns="scheduler", values="iteration_s")
            if len(breakdown) else pd.DataFrame())
    for _, h in headline.iterrows():
        best, at = float("nan"), ""
        if {h.baseline, scheduler} <= set(wide.columns):
            r = (wide[h.baseline] / wide[scheduler]).dropna()
            if len(r):
                best = float(r.max())
                m, n, d = r.idxmax()
                at = f"{m}, {n}, {str(d).replace('float', 'FP')}"
        rows.append({"baseline": h.baseline, "paper_speedup": float(h.speedup), "simulated_speedup": best,
                     "at": at, "source": f"{h.source}, {h['where']}"})
    return pd.DataFrame(rows)


def paper_threshold_sweep_table(models: Sequence[str] = JOURNAL_MODELS, networks: Sequence[str] = JOURNAL_NETWORKS,
                                workers: int = JOURNAL_WORKERS,
                                thresholds_bytes: Sequence[int] = tuple(2**k for k in range(12, 30, 2)),
                                references: Sequence[str] = ("mgwfbp", "optimal"), gpu: str = "v100",
                                cost_mode: str = "paper") -> pd.DataFrame:
    """Fixed-threshold fusion per threshold and the ``references`` (``threshold_bytes``
    empty) at the journal's scale, simulated, FP32. Columns as
    :func:`repro.studies.mgwfbp_train.threshold_sweep_table` plus network and cost_mode."""
    rows = []
    for model, trace, net, cost in _journal_settings(models, networks, workers, gpu, cost_mode):
        base = {"model": model, "network": net, "workers": workers, "source": "simulated", "scale": "paper",
                "cost_mode": cost_mode, "oversubscribed": False}
        for t in thresholds_bytes:
            plan = make_plan("threshold", trace, cost, threshold_bytes=int(t))
            rows.append({**base, "scheduler": "threshold", "threshold_bytes": float(t),
                         "iteration_s": simulated_iteration_s(trace, plan, cost)})
        for s in references:
            plan = make_plan(s, trace, cost)
            rows.append({**base, "scheduler": s, "threshold_bytes": float("nan"),
                         "iteration_s": simulated_iteration_s(trace, plan, cost)})
    return pd.DataFrame(rows)
