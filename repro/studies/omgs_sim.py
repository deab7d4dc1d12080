"""The OMGS-SGD simulation study as tidy tables (the notebook only calls these and plots).

Sparse iterations are simulated under the ``1gbe-allgather`` preset: the paper's fitted all-gather
lines for P in {2, 4, 8, 16} and its top-k cost ``gamma d log2 d``. ``cost_mode="calibrated"`` adds
the realism fitted on 10GbE (no measured 1GbE cluster exists); tables record it in ``cost_mode``.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from repro.costs.published_fits import check_cost_mode, cost_for_mode
from repro.core.cost import CostModel
from repro.core.paths import paper_numbers_path, shipped_traces
from repro.core.planners import make_plan
from repro.core.simulate import simulate
from repro.families.allreduce.simulate import bucket_label
from repro.families.sparse.simulate import bucket_numels, sparse_times_s
from repro.results.runs import BUCKETS_CSV, ITERATIONS_CSV, list_runs
from repro.studies.common import is_oversubscribed
from repro.studies.mgwfbp_sim import simulated_iteration_s, workers_for
from repro.core.trace import Trace, load_trace

__all__ = ["SPARSE_PLANNERS", "OMGS_MODELS", "PAPER_CSV", "paper_iterations", "paper_density",
           "find_trace", "load_traces", "trace_table", "sparse_sweep", "gap_summary", "worst_case",
           "bucket_table", "explain_case", "timeline_table", "paper_setting_table"]

SPARSE_PLANNERS: tuple[str, ...] = ("topk_layerwise", "topk_single", "omgs", "omgs_optimal")
# The paper's models (OMGS-SGD, INFOCOM 2020) -> batch size per worker of the shipped traces.
OMGS_MODELS: dict[str, int] = {"vgg16_cifar": 32, "resnet50": 32, "inception_v4": 64, "lstm_ptb": 20}
PAPER_CSV = "omgs_iteration_times"  # shipped published seconds per iteration (data/paper_numbers)


def paper_iterations() -> pd.DataFrame:
    """The paper's measured seconds per iteration (16 workers, 1GbE): model, planner
    (``topk_single``, ``omgs``), workers, paper_s, citation."""
    raw = pd.read_csv(paper_numbers_path(PAPER_CSV))
    rows = []
    for r in raw.itertuples():
        cite = f"{r.source}: measured, {r.workers} nodes, {r.network}, {r.paper_model} batch {r.batch_size}"
        rows += [{"model": r.model, "planner": planner, "workers": int(r.workers), "paper_s": float(t),
                  "citation": cite}
                 for planner, t in (("topk_single", r.topk_sgd_s), ("omgs", r.omgs_sgd_s))]
    return pd.DataFrame(rows)


def paper_density(model: str) -> float:
    """The paper's density: 0.004 for the LSTM, 0.001 for the CNNs."""
    return 0.004 if model.startswith("lstm") else 0.001


def find_trace(model: str, gpus: Sequence[str] = ("p102", "v100")) -> str:
    """Stem of the shipped estimate trace of ``model`` on the first of ``gpus`` that has one (at the
    paper's batch size when several are shipped); falling back to a later GPU warns."""
    have = shipped_traces()
    for k, gpu in enumerate(gpus):
        hits = sorted(s for s in have if re.match(rf"^{re.escape(model)}_b\d+_{re.escape(gpu)}-estimate$", s))
        if len(hits) > 1 and model in OMGS_MODELS:
            hits = [s for s in hits if s == f"{model}_b{OMGS_MODELS[model]}_{gpu}-estimate"] or hits[:1]
        if hits:
            if k:
                warnings.warn(f"no {gpus[0]} estimate trace of {model}: using {hits[0]}", stacklevel=2)
            return hits[0]
    known = sorted({s.split("_b")[0] for s in have if s.endswith("-estimate")})
    raise ValueError(f"no shipped estimate trace for model '{model}' on {', '.join(gpus)}; models with estimate "
                     f"traces: {', '.join(known) or 'none'}")


def load_traces(models: Sequence[str], gpu: str = "p102") -> dict[str, Trace]:
    """Model name -> shipped estimate trace on ``gpu`` (falling back to the V100 estimate, with a warning)."""
    gpus = [gpu] + [g for g in ("p102", "v100") if g != gpu]
    return {m: load_trace(find_trace(m, gpus)) for m in models}


def trace_table(traces: Mapping[str, Trace]) -> pd.DataFrame:
    """One row per model: batch, device, layers, parameters, forward and backward seconds."""
    return pd.DataFrame([{"model": m, "batch_size": t.batch_size, "device": t.device, "layers": t.num_layers,
                          "params": int(t.total_params), "forward_s": t.total_forward_s,
                          "backward_s": t.total_backward_s} for m, t in traces.items()])


def sparse_sweep(traces: Mapping[str, Trace], workers: Sequence[int], densities: Sequence[float],
                 planners: Sequence[str] = SPARSE_PLANNERS, network: str = "1gbe-allgather",
                 pack: bool = False, cost_mode: str = "paper") -> pd.DataFrame:
    """Simulated iteration per model x P x density x planner (worker counts the preset lacks are
    skipped).

    Columns: model, device, batch_size, network, workers, density, planner, iteration_s, buckets,
    sparsify_s (top-k seconds), plan_wall_s, cost_mode, optimal_s and gap_pct = 100 (iteration_s /
    optimal_s - 1) (NaN without ``omgs_optimal``). In calibrated mode ``omgs_optimal`` is the optimum of
    the planner's model, which the simulation need not keep (``gap_pct`` can be negative)."""
    check_cost_mode(cost_mode)
    rows = []
    for model, trace in traces.items():
        for p in workers_for(network, workers):
            cost = cost_for_mode(network, p, cost_mode)
            for d in densities:
                for name in planners:
                    t0 = time.perf_counter()
                    plan = make_plan(name, trace, cost, density=float(d), pack=pack)
                    wall = time.perf_counter() - t0
                    spar = float(np.sum(cost.topk_s(np.asarray(bucket_numels(trace, plan), dtype=float))))
                    rows.append({"model": model, "device": trace.device, "batch_size": trace.batch_size,
                                 "network": network, "workers": int(p), "density": float(d), "planner": name,
                                 "iteration_s": simulated_iteration_s(trace, plan, cost), "buckets": plan.num_buckets,
                                 "sparsify_s": spar, "plan_wall_s": wall, "cost_mode": cost_mode})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    keys = ["model", "workers", "density"]
    opt = df[df["planner"] == "omgs_optimal"].set_index(keys)["iteration_s"].rename("optimal_s")
    df = df.join(opt, on=keys)  # NaN without omgs_optimal
    df["gap_pct"] = 100.0 * (df["iteration_s"] / df["optimal_s"] - 1.0)
    return df


def gap_summary(sweep: pd.DataFrame, planner: str = "omgs", tol_pct: float = 1e-6) -> pd.DataFrame:
    """Per model (and ``all``): how often and by how much ``planner`` is slower than the optimum, and
    its worst case; per cost mode where ``sweep`` has a ``cost_mode`` column."""
    if "cost_mode" in sweep:
        return pd.concat([gap_summary(s.drop(columns="cost_mode"), planner, tol_pct).assign(cost_mode=m)
                          for m, s in sweep.groupby("cost_mode", sort=False)], ignore_index=True)
    g = sweep[sweep["planner"] == planner]
    opt = sweep[sweep["planner"] == "omgs_optimal"].set_index(["model", "workers", "density"])["buckets"]

    def summarise(x: pd.DataFrame) -> pd.Series:
        worst = x.loc[x["gap_pct"].idxmax()]
        return pd.Series({
            "planner": planner, "cases": len(x), "cases_optimal_better": int((x["gap_pct"] > tol_pct).sum()),
            "median_gap_pct": float(x["gap_pct"].median()), "max_gap_pct": float(x["gap_pct"].max()),
            "worst_model": worst["model"], "worst_workers": int(worst["workers"]),
            "worst_density": float(worst["density"]), "worst_buckets": int(worst["buckets"]),
            "worst_optimal_buckets": int(opt.loc[(worst["model"], worst["workers"], worst["density"])]),
            "worst_iteration_s": float(worst["iteration_s"]), "worst_optimal_s": float(worst["optimal_s"])})

    rows = [summarise(x).to_dict() | {"model": m} for m, x in g.groupby("model", sort=False)]
    rows.append(summarise(g).to_dict() | {"model": "all"})
    out = pd.DataFrame(rows)
    return out[["model"] + [c for c in out.columns if c != "model"]]


def worst_case(sweep: pd.DataFrame, planner: str = "omgs", model: str | None = None) -> dict:
    """``{model, workers, density}`` where ``planner`` is furthest from the optimum (of ``model``)."""
    g = sweep[sweep["planner"] == planner]
    if model is not None:
        g = g[g["model"] == model]
    r = g.loc[g["gap_pct"].idxmax()]
    return {"model": r["model"], "workers": int(r["workers"]), "density": float(r["density"])}


def bucket_table(trace: Trace, cost: CostModel, planners: Sequence[str], density: float,
                 pack: bool = False, cost_mode: str = "paper") -> pd.DataFrame:
    """Per planner and bucket (communication order): layers (1-based), elements, k, the layers'
    backward seconds, its simulated top-k and all-gather (start, end), the planner's iteration_s, and
    ``cost_mode`` (recorded, not applied)."""
    check_cost_mode(cost_mode)
    rows = []
    bwd = trace.backward_s()
    for name in planners:
        plan = make_plan(name, trace, cost, density=density, pack=pack)
        res = simulate(trace, plan, cost)
        groups = plan.groups(trace)
        spar, msgs = sparse_times_s(trace, plan, cost)
        numel = bucket_numels(trace, plan)
        for k, g in enumerate(groups):
            lab = bucket_label(g)
            sp = [o for o in res.ops if o.kind == "sparsify" and o.label == lab]
            cm = [o for o in res.ops if o.stream == "comm" and (o.label == lab or o.label.startswith(lab + " "))]
            rows.append({"planner": name, "bucket": k + 1, "layers": lab, "num_layers": len(g),
                         "elements": int(numel[k]), "k": int(np.ceil(density * numel[k] - 1e-9)) if numel[k] else 0,
                         "backward_s": float(bwd[list(g)].sum()), "sparsify_s": float(spar[k]),
                         "comm_s": float(sum(msgs[k])),
                         "sparsify_start_s": sp[0].start_s if sp else np.nan,
                         "sparsify_end_s": sp[0].end_s if sp else np.nan,
                         "comm_start_s": min(o.start_s for o in cm) if cm else np.nan,
                         "comm_end_s": max(o.end_s for o in cm) if cm else np.nan,
                         "iteration_s": res.iteration_s, "density": density, "workers": cost.workers,
                         "cost_mode": cost_mode})
    return pd.DataFrame(rows)


def explain_case(buckets: pd.DataFrame, trace: Trace, cost: CostModel, rule: str = "omgs",
                 optimum: str = "omgs_optimal") -> str:
    """A few sentences, from the numbers of :func:`bucket_table`, on why the rule loses to the optimum."""
    r, o = buckets[buckets["planner"] == rule], buckets[buckets["planner"] == optimum]
    t_r, t_o = float(r["iteration_s"].iloc[0]), float(o["iteration_s"].iloc[0])
    save_s = 2 * float(cost.line("sparse_allgather").a_s)  # one merge saves one start-up per all-gather
    bwd = trace.backward_s()
    bwd_end = trace.total_forward_s + trace.overheads.pre_forward_s + float(bwd.sum())

    def what(b: pd.DataFrame, name: str) -> str:
        first = b["comm_start_s"].min()
        return (f"{name} sends {len(b)} bucket(s) ({', '.join(b['layers'].head(6))}{', ...' if len(b) > 6 else ''}): "
                f"top-k {b['sparsify_s'].sum() * 1e3:.1f} ms and all-gathers {b['comm_s'].sum() * 1e3:.1f} ms in "
                f"total; its first all-gather starts {first * 1e3:.1f} ms into the iteration "
                f"(forward and backward alone end at {bwd_end * 1e3:.1f} ms), "
                f"iteration {b['iteration_s'].iloc[0] * 1e3:.1f} ms")

    text = (f"P={cost.workers}, density {float(r['density'].iloc[0]):g}: the rule is {100 * (t_r / t_o - 1):.1f}% "
             f"slower than the optimum. " + what(r, "The rule") + ". " + what(o, "The optimum") + ". ")
    merges = int(r["num_layers"].sum() - len(r))
    text += (f"Each merge test of the rule weighs one layer's backward plus the extra top-k (the largest layer "
             f"backward is {bwd.max() * 1e3:.2f} ms) against the start-ups one merge saves (2a = {save_s * 1e3:.1f} ms "
             f"for values and indices); {merges} of {trace.num_layers - 1} merges passed. ")
    if len(r) < len(o):
        text += ("Merged that far, the rule's all-gathers wait for the whole backward and one large top-k, so none of "
                 "the communication overlaps computation, while the optimum pays "
                 f"{len(o) - len(r)} more start-up pair(s) to start communicating under the backward and top-k.")
    else:
        text += ("The optimum merges differently at equal or larger bucket counts: the rule's local test does not see "
                 "how a merge shifts the later buckets on the shared communication stream.")
    return text


def timeline_table(trace: Trace, cost: CostModel, planners: Sequence[str], density: float,
                   pack: bool = False, cost_mode: str = "paper") -> pd.DataFrame:
    """Simulated ops of one iteration per planner: planner, stream, row (``compute``, ``sparsify`` or
    ``comm``, for drawing), kind, label, start_s, end_s, iteration_s, buckets, density, workers, cost_mode."""
    check_cost_mode(cost_mode)
    frames = []
    for name in planners:
        plan = make_plan(name, trace, cost, density=density, pack=pack)
        res = simulate(trace, plan, cost)
        df = pd.DataFrame([op.to_dict() for op in res.ops])
        df.insert(0, "planner", name)
        df.insert(2, "row", np.where(df["kind"] == "sparsify", "sparsify", df["stream"]))
        frames.append(df.assign(iteration_s=res.iteration_s, buckets=plan.num_buckets, density=density,
                                workers=cost.workers, cost_mode=cost_mode))
    return pd.concat(frames, ignore_index=True)


def paper_setting_table(traces: Mapping[str, Trace], planners: Iterable[str] = ("topk_single", "omgs",
                                                                                "omgs_optimal"),
                        workers: int = 16, network: str = "1gbe-allgather", cost_mode: str = "paper"
                        ) -> pd.DataFrame:
    """The paper's setting (16 workers, 1GbE, its density per model): simulated seconds per
    planner beside the published ``paper_s`` (NaN where none), with ``simulated_over_paper``."""
    check_cost_mode(cost_mode)
    rows = []
    cost = cost_for_mode(network, workers, cost_mode)
    for model, trace in traces.items():
        d = paper_density(model)
        for name in planners:
            plan = make_plan(name, trace, cost, density=d)
            rows.append({"model": model, "device": trace.device, "batch_size": trace.batch_size, "workers": workers,
                         "density": d, "planner": name, "iteration_s": simulated_iteration_s(trace, plan, cost),
                         "buckets": plan.num_buckets, "cost_mode": cost_mode})
    df = pd.DataFrame(rows)
    paper = paper_iterations()
    df = df.merge(paper[paper["workers"] == workers].drop(columns="workers"), on=["model", "planner"], how="left")
    df["citation"] = df["citation"].fillna("")
    df["simulated_over_paper"] = df["iteration_s"] / df["paper_s"]
    return df


# The measured panel: run folders whose buckets.csv holds a recorded sparse timeline

MEASURED_PLANNERS: tuple[str, ...] = ("topk_layerwise", "topk_single", "omgs")


def sparse_runtime_available() -> bool:
    """Whether this checkout has ``repro.families.sparse.executor``."""
    import importlib.util

    return importlib.util.find_spec("repro.families.sparse.executor") is not None


def measure_timelines(results_dir, *, model: str = "tiny_resnet", world_size: int = 2,
                      planners: Sequence[str] = MEASURED_PLANNERS, density: float = 0.001, batch_size: int = 32,
                      steps: int = 3, warmup_steps: int = 2, network: str | None = None,
                      timeout_s: float = 600) -> pd.DataFrame:
    """Train ``model`` a few steps under each sparse planner in one local world, recording the last
    step's bucket timeline, into ``<results_dir>/runs`` (replaced). The planners use preset ``network``
    when given, else the lines fitted on the live group. Returns the runs' table."""
    from repro.studies.mgwfbp_train import run_grid

    configs = [{"model": model, "scheduler": p, "batch_size": batch_size, "steps": steps,
                "warmup_steps": warmup_steps, "compute_steps": 0, "density": float(density),
                "record_timeline": True, "network": network} for p in planners]
    return run_grid(configs, [world_size], results_dir, timeout_s=timeout_s, overwrite=True)


#: every timed step's bucket timeline of a run (repro.train with record_timeline; buckets.csv keeps the last)
BUCKETS_STEPS_CSV = "buckets_steps.csv"


def median_step(iterations: pd.DataFrame, median_s: float | None = None) -> pd.Series:
    """The row of ``iterations`` whose ``iteration_s`` is closest to ``median_s`` (default: the median);
    on a tie, the later step."""
    it = iterations.sort_values("step")
    target = float(median_s) if median_s is not None and np.isfinite(float(median_s)) else float(it["iteration_s"].median())
    dist = (it["iteration_s"] - target).abs().to_numpy()
    return it.iloc[int(np.flatnonzero(dist == dist.min())[-1])]


def measured_timeline(runs_root) -> pd.DataFrame:
    """Ops of one recorded step of every sparse run under ``runs_root`` with a ``buckets.csv``: the
    step closest to the run's median when every step was recorded (``buckets_steps.csv``), else the last
    (``drawn_step``, ``median_step``). Columns as :func:`timeline_table` plus median_iteration_s,
    timed_steps, drawn_step, median_step, model, world_size, cpu_count, threads_per_rank, oversubscribed
    and run_id; seconds from the step start."""
    frames = []
    for run in list_runs(Path(runs_root)):
        b, it = run.table(BUCKETS_CSV), run.table(ITERATIONS_CSV)
        cfg, env = run.config, run.environment
        if b is None or it is None or b.empty or "compress_start_s" not in b:
            continue
        last = it.sort_values("step").iloc[-1]
        med = run.summary.get("iteration_s")
        steps_b = run.table(BUCKETS_STEPS_CSV)
        if steps_b is not None and "step" in steps_b and len(steps_b):  # every step recorded: the median one
            last = median_step(it[it["step"].isin(set(steps_b["step"]))], med)
            b = steps_b[steps_b["step"] == last["step"]].drop(columns="step")
        world = int(run.summary.get("world_size") or cfg.get("world_size") or 0)
        t_fwd = float(last["forward_s"])  # from the step start to the backward call (pre-forward included)
        t_bwd_end = t_fwd + float(last["backward_call_s"])
        iteration = float(last["iteration_s"])
        ops = [("compute", "compute", "forward", "", 0.0, t_fwd),
               ("compute", "compute", "backward", "", t_fwd, t_bwd_end),
               ("compute", "compute", "update", "", iteration - float(last.get("update_s", 0.0)), iteration)]
        for r in b.sort_values("bucket").itertuples():
            lab = f"b{int(r.bucket) + 1}"
            ops.append(("compute", "sparsify", "sparsify", lab, float(r.compress_start_s), float(r.compress_end_s)))
            ops.append(("comm", "comm", "sparse_allgather", lab, float(r.start_s), float(r.end_s)))
        df = pd.DataFrame(ops, columns=["stream", "row", "kind", "label", "start_s", "end_s"])
        df.insert(0, "planner", cfg.get("scheduler"))
        df = df.assign(iteration_s=iteration, median_iteration_s=float(med) if med is not None else np.nan,
                       timed_steps=int(run.summary.get("steps") or len(it)), buckets=len(b),
                       drawn_step=int(last["step"]), median_step=steps_b is not None and "step" in steps_b,
                       density=cfg.get("density"), workers=world,
                       model=cfg.get("model"), world_size=world, cpu_count=env.get("cpu_count"),
                       threads_per_rank=env.get("threads_per_rank"),
                       oversubscribed=is_oversubscribed(world, env.get("cpu_count"), env.get("threads_per_rank") or 1),
                       run_id=run.run_id)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
