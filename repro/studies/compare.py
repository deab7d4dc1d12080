"""Every scheduler of the four papers on one footing, as tidy tables with a ``best`` flag per configuration:
:func:`simulated_table` (paper scale, V100 estimate traces, as ``repro compare`` predicts) and
:func:`measured_table` (tiny scale on this machine, after :func:`run_measured`). Throughput is
P x batch / iteration. Design notes: ``docs/design/studies.md``. Never imports torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from repro.cli.compare import (
    DEFAULT_COST_MODE, DEFAULT_DENSITY, DEFAULT_OPTIONS, DEFAULT_STAGE1_SHARE, DEFAULT_STALENESS,
    TOPK_GAMMA_S, TOPK_GAMMA_SOURCE, network_cost, predict, with_topk)
from repro.costs.published_fits import DEVICES_PER_NODE, check_cost_mode
from repro.core.cost import CostModelError
from repro.core.paths import shipped_traces
from repro.core.planners import PLANNER_FAMILY
from repro.core.schedulers import get_scheduler
from repro.core.trace import Trace, load_trace
from repro.launch.netns import format_bandwidth, parse_bandwidth
from repro.studies.dear_sim import find_trace
from repro.studies.mgwfbp_train import load_iterations, load_runs, run_grid

__all__ = ["CompareError", "EXACT", "exact_choice", "GROUPS", "SCHEDULERS", "SPARSE", "PARAMETER_SERVER", "DEFAULT_MODELS",
           "DEFAULT_NETWORKS", "DEFAULT_WORKERS", "DEFAULT_DENSITY", "DEFAULT_STALENESS", "DEFAULT_STAGE1_SHARE",
           "DEFAULT_MEASURED", "TOPK_GAMMA_S", "TOPK_GAMMA_SOURCE", "NETWORK_LABELS", "TIE_RTOL", "group_of",
           "keeps_sync_sgd", "math_note", "servers_for", "resolve_trace", "check_schedulers", "check_workers",
           "plan_options", "scheduler_table", "simulated_table", "mark_best", "best_table", "measured_configs",
           "run_measured", "measured_table", "link_name"]


class CompareError(ValueError):
    """A bad input of the comparison (unknown scheduler or model, bad worker count...); one line."""


# Rows of the comparison, grouped by the paper that introduced or compared them (figure order).
GROUPS: dict[str, tuple[str, ...]] = {
    "MG-WFBP: all-reduce": ("wfbp", "syncea", "threshold", "horovod", "ddp_buckets", "mgwfbp", "optimal"),
    "OMGS-SGD: sparse top-k": ("topk_layerwise", "topk_single", "omgs", "omgs_optimal"),
    "DeAR: reduce-scatter + all-gather": ("dear_nofusion", "dear_threshold", "dear_model", "dear_optimal",
                                          "bytescheduler"),
    "OSP: parameter server": ("ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_auto"),
}
SCHEDULERS: tuple[str, ...] = tuple(s for names in GROUPS.values() for s in names)
SPARSE: tuple[str, ...] = GROUPS["OMGS-SGD: sparse top-k"]
PARAMETER_SERVER: tuple[str, ...] = GROUPS["OSP: parameter server"]
# Exact under their family's contention-free model (docs/design/studies.md).
EXACT: tuple[str, ...] = ("optimal", "omgs_optimal", "dear_optimal")

DEFAULT_MODELS: tuple[str, ...] = ("resnet50", "bert_base", "vgg16")
DEFAULT_NETWORKS: tuple[str, ...] = ("10gbe-derived", "56gbib-derived")
DEFAULT_WORKERS: tuple[int, ...] = (8, 16, 32)
# At tiny scale by default: two per group, so every family is measured within the CI budget.
DEFAULT_MEASURED: tuple[str, ...] = ("wfbp", "mgwfbp", "topk_single", "omgs", "dear_threshold", "bytescheduler",
                                     "ps_bsp", "osp")
NETWORK_LABELS = {"10gbe": "10GbE", "56gbib": "InfiniBand", "100gbib": "InfiniBand", "1gbe": "1GbE"}
TIE_RTOL = 1e-9


# What each scheduler is

def group_of(scheduler: str) -> str:
    """The row group (paper) of ``scheduler``."""
    for g, names in GROUPS.items():
        if scheduler in names:
            return g
    raise CompareError(f"unknown scheduler {scheduler!r}; the compared ones are {', '.join(SCHEDULERS)}")


def keeps_sync_sgd(scheduler: str) -> bool:
    """False for the schedulers that change the update of synchronous SGD (top-k; ASP, SSP, OSP)."""
    group_of(scheduler)
    return not get_scheduler(scheduler).changes_update


def math_note(scheduler: str, *, density: float = DEFAULT_DENSITY, staleness: int = DEFAULT_STALENESS) -> str:
    """How ``scheduler`` changes the update of synchronous SGD ("" when it does not), from the registry."""
    group_of(scheduler)
    change = get_scheduler(scheduler).update_change(density=float(density), staleness=int(staleness))
    return f"changes the update ({change})" if change else ""


def servers_for(workers: int, devices_per_node: int = DEVICES_PER_NODE) -> int:
    """Parameter servers for ``workers`` GPUs: one per node of ``devices_per_node`` GPUs."""
    return max(1, -(-int(workers) // int(devices_per_node)))


def plan_options(scheduler: str, workers: int, *, density: float = DEFAULT_DENSITY,
                 staleness: int = DEFAULT_STALENESS, stage1_share: float = DEFAULT_STAGE1_SHARE) -> dict[str, Any]:
    """The planner options of ``scheduler`` at ``workers`` GPUs in this comparison
    (:mod:`repro.cli.compare`'s defaults, one server per node), restricted to those its planner takes."""
    values = {**DEFAULT_OPTIONS, "density": float(density), "servers": servers_for(workers),
              "staleness": int(staleness), "stage1_share": float(stage1_share)}
    takes = get_scheduler(scheduler).planner_options
    return {k: v for k, v in values.items() if k in takes}


def check_schedulers(schedulers: Sequence[str], *, name: str = "schedulers") -> list[str]:
    """``schedulers`` as a list of compared names (order kept, duplicates dropped); else one line."""
    if isinstance(schedulers, str):
        schedulers = [schedulers]
    out = list(dict.fromkeys(schedulers))
    if not out:
        raise CompareError(f"{name}: give at least one scheduler ({', '.join(SCHEDULERS)})")
    bad = [s for s in out if s not in SCHEDULERS]
    if bad:
        raise CompareError(f"{name}: unknown scheduler(s) {', '.join(map(str, bad))}; "
                           f"choose from {', '.join(SCHEDULERS)}")
    return out


def check_workers(workers: Sequence[int], cost_mode: str) -> list[int]:
    """Worker counts as ints >= 2; with calibrated clusters (4 GPUs per node) P must be 2, 4 or a
    multiple of 4. Else :class:`CompareError`."""
    if isinstance(workers, (int, np.integer)):
        workers = [int(workers)]
    out = []
    for p in workers:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 2:
            raise CompareError(f"workers: {p!r} is not a worker count (an integer >= 2)")
        if cost_mode == "calibrated" and p > DEVICES_PER_NODE and p % DEVICES_PER_NODE:
            raise CompareError(f"workers: P={p} is not whole nodes of the calibrated clusters ({DEVICES_PER_NODE} GPUs "
                               f"per node): use 2, 4 or a multiple of {DEVICES_PER_NODE}")
        out.append(int(p))
    if not out:
        raise CompareError("workers: give at least one worker count")
    return list(dict.fromkeys(out))


def _check_density(density: float) -> float:
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise CompareError(f"density: must be a number in (0, 1], got {density!r}")
    return float(density)


def scheduler_table(schedulers: Sequence[str] = SCHEDULERS, *, density: float = DEFAULT_DENSITY,
                    staleness: int = DEFAULT_STALENESS) -> pd.DataFrame:
    """One row per compared scheduler: group, family (of its plans), paper, keeps_sync_sgd, math_note."""
    rows = []
    for s in check_schedulers(schedulers):
        rows.append({"scheduler": s, "group": group_of(s), "family": _family(s),
                     "paper": get_scheduler(s).paper, "keeps_sync_sgd": keeps_sync_sgd(s),
                     "math_note": math_note(s, density=density, staleness=staleness)})
    return pd.DataFrame(rows)


# Simulated at paper scale

def resolve_trace(model: str) -> str:
    """The shipped trace stem of ``model``: a stem as given, or the model's V100 estimate at the
    papers' batch size (e.g. ``vgg16`` -> ``vgg16_b32_v100-estimate``)."""
    if model in set(shipped_traces()):
        return model
    try:
        return find_trace(model)
    except ValueError as e:
        raise CompareError(f"models: {e}") from None


def network_label(network: str) -> str:
    """``10GbE`` / ``InfiniBand`` for a preset name (the name itself when unknown)."""
    return next((label for prefix, label in NETWORK_LABELS.items() if network.startswith(prefix)), network)


def _cost(network: str, workers: int, cost_mode: str, topk_gamma_s: float | None = None):
    try:
        return with_topk(network_cost(network, workers, cost_mode), topk_gamma_s)
    except (CostModelError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CompareError(f"network {network!r} at P={workers} ({cost_mode}): {msg}") from None


def _cost_name(cost, network: str) -> str:
    """The calibrated preset the cost model comes from, or ``network`` itself."""
    src = str(cost.source)
    if src.startswith("calibrated "):
        return src[len("calibrated "):].split(":", 1)[0].strip()
    return network


def simulated_table(models: Sequence[str] | Mapping[str, Trace] = DEFAULT_MODELS,
                    networks: Sequence[str] = DEFAULT_NETWORKS, workers: Sequence[int] = DEFAULT_WORKERS,
                    schedulers: Sequence[str] = SCHEDULERS, *, cost_mode: str = DEFAULT_COST_MODE,
                    density: float = DEFAULT_DENSITY, topk_gamma_s: float | None = None,
                    staleness: int = DEFAULT_STALENESS, stage1_share: float = DEFAULT_STAGE1_SHARE) -> pd.DataFrame:
    """Simulated iteration of every scheduler per model x network x P, each configuration one
    :func:`repro.cli.compare.predict` as ``repro compare`` makes it.

    ``models``: names or shipped trace stems (:func:`resolve_trace`), or a mapping name -> Trace;
    ``topk_gamma_s``: seconds of the top-k cost (None: the cost model's own). Columns: model, trace,
    device, batch_size, network, network_label, cost_mode, cost_model, cost_source, workers, servers and
    density (NaN where unused), scheduler, group, family, keeps_sync_sgd, math_note, iteration_s,
    throughput_samples_s, buckets, stage1_bytes_share, plan_wall_s, plan_from, exact_plan_iteration_s,
    exact_plan_loss_pct, relative_to_best, best, best_sync_sgd, origin."""
    cost_mode = check_cost_mode(cost_mode)
    names = check_schedulers(schedulers)
    ps = check_workers(workers, cost_mode)
    density = _check_density(density)
    if isinstance(networks, str):
        networks = [networks]
    if not list(networks):
        raise CompareError("networks: give at least one network preset")
    if topk_gamma_s is not None and (isinstance(topk_gamma_s, bool) or not isinstance(topk_gamma_s, (int, float))
                                     or not topk_gamma_s >= 0):
        raise CompareError(f"topk_gamma_s: must be a non-negative number of seconds, got {topk_gamma_s!r}")
    if isinstance(models, Mapping):
        traces = {str(m): (str(t.model), t) for m, t in models.items()}
    else:
        if isinstance(models, str):
            models = [models]
        if not list(models):
            raise CompareError("models: give at least one model")
        stems = {m: resolve_trace(m) for m in models}
        traces = {m: (stem, load_trace(stem)) for m, stem in stems.items()}
    info = scheduler_table(names, density=density, staleness=staleness).set_index("scheduler")
    rows = []
    for model, (stem, trace) in traces.items():
        for net in networks:
            for p in ps:
                cost = _cost(net, p, cost_mode, topk_gamma_s)
                first = len(rows)
                records = predict(trace, cost, options={"density": density, "staleness": staleness,
                                                        "stage1_share": stage1_share}, schedulers=names)
                for rec in records:
                    s = rec["scheduler"]
                    if rec["iteration_s"] is None:
                        raise CompareError(f"{s} on {stem}, {net}, P={p}: {rec['note']}")
                    it, opts, share = rec["iteration_s"], rec["options"], rec["stage1_bytes_share"]
                    exact_it = rec["exact_plan_iteration_s"]
                    rows.append({"model": model, "trace": stem, "device": trace.device, "batch_size": trace.batch_size,
                                 "network": net, "network_label": network_label(net), "cost_mode": cost_mode,
                                 "cost_model": _cost_name(cost, net), "cost_source": cost.source, "workers": p,
                                 "servers": opts.get("servers", np.nan),
                                 "density": opts.get("density", np.nan), "scheduler": s, **info.loc[s].to_dict(),
                                 "iteration_s": it, "throughput_samples_s": p * trace.batch_size / it,
                                 "buckets": rec["buckets"],
                                 "stage1_bytes_share": np.nan if share is None else float(share),
                                 "plan_wall_s": rec["plan_wall_s"], "plan_from": rec["plan_from"],
                                 "exact_plan_iteration_s": np.nan if exact_it is None else float(exact_it)})
                config_rows = rows[first:]
                chosen = exact_choice({r["scheduler"]: r["iteration_s"] for r in config_rows})
                for r in config_rows:
                    if r["scheduler"] in chosen:
                        src, it = chosen[r["scheduler"]]
                        if np.isnan(r["exact_plan_iteration_s"]):
                            r["exact_plan_iteration_s"] = r["iteration_s"]
                        if src != r["scheduler"]:  # the planner judges its rivals itself; this is a safety net
                            r.update(plan_from=src, iteration_s=it,
                                     throughput_samples_s=p * trace.batch_size / it,
                                     buckets=next(c["buckets"] for c in config_rows if c["scheduler"] == src))
    df = pd.DataFrame(rows).drop(columns=["paper"])
    df["exact_plan_loss_pct"] = 100.0 * (df["exact_plan_iteration_s"] / df["iteration_s"] - 1.0)
    df = mark_best(df, ["model", "network", "workers"])
    df["origin"] = f"simulated, {cost_mode}"
    return df


def _family(scheduler: str) -> str:
    return PLANNER_FAMILY[get_scheduler(scheduler).planner or scheduler]


def exact_choice(iterations: Mapping[str, float]) -> dict[str, tuple[str, float]]:
    """``{exact planner: (plan_from, iteration_s)}`` over ``iterations`` (scheduler -> seconds in one
    configuration): the fastest of its own plan and the non-exact plans of its family; ties keep the
    exact plan."""
    out: dict[str, tuple[str, float]] = {}
    for s in iterations:
        if s not in EXACT:
            continue
        fam = _family(s)
        best = (s, float(iterations[s]))
        for c, t in iterations.items():
            if c not in EXACT and _family(c) == fam and float(t) < best[1] * (1 - TIE_RTOL):
                best = (c, float(t))
        out[s] = best
    return out


def mark_best(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """``df`` with ``relative_to_best`` (iteration_s / the smallest per ``keys``), ``best`` and
    ``best_sync_sgd`` (ties within :data:`TIE_RTOL` all marked; NaN rows never best)."""
    out = df.copy()
    if out.empty:
        return out.assign(relative_to_best=pd.Series(dtype=float), best=pd.Series(dtype=bool),
                          best_sync_sgd=pd.Series(dtype=bool))
    it = out["iteration_s"].astype(float)
    low = it.groupby([out[k] for k in keys]).transform("min")
    sync = it.where(out["keeps_sync_sgd"].astype(bool))
    low_sync = sync.groupby([out[k] for k in keys]).transform("min")
    out["relative_to_best"] = it / low
    out["best"] = (it <= low * (1 + TIE_RTOL)).fillna(False).astype(bool)
    sync_best = out["keeps_sync_sgd"].astype(bool) & (it <= low_sync * (1 + TIE_RTOL))
    out["best_sync_sgd"] = sync_best.fillna(False).astype(bool)
    return out


def best_table(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per configuration: the fastest scheduler(s) overall and among those keeping synchronous SGD,
    their seconds and throughput, and ``sync_over_best`` (best_sync iteration / best iteration)."""
    rows = []
    for key, g in df.groupby(list(keys), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        b, bs = g[g["best"]], g[g["best_sync_sgd"]]
        row = dict(zip(keys, key))
        row.update({"best": ", ".join(b["scheduler"]), "best_iteration_s": float(b["iteration_s"].min()),
                    "best_throughput_samples_s": float(b["throughput_samples_s"].max()),
                    "best_changes_math": bool((~b["keeps_sync_sgd"].astype(bool)).all()),
                    "best_sync_sgd": ", ".join(bs["scheduler"]) if len(bs) else "",
                    "best_sync_iteration_s": float(bs["iteration_s"].min()) if len(bs) else np.nan,
                    "best_sync_throughput_samples_s": float(bs["throughput_samples_s"].max()) if len(bs) else np.nan})
        row["sync_over_best"] = row["best_sync_iteration_s"] / row["best_iteration_s"]
        rows.append(row)
    return pd.DataFrame(rows)


# Measured at tiny scale

def link_name(bandwidth: str | float | None) -> str:
    """``"100mbit"`` for an emulated rate (tc string or bits/s), ``"loopback"`` for none."""
    if bandwidth is None or bandwidth == "loopback" or (isinstance(bandwidth, float) and math.isnan(bandwidth)):
        return "loopback"
    bps = parse_bandwidth(bandwidth) if isinstance(bandwidth, str) else float(bandwidth)
    return format_bandwidth(bps)


def measured_configs(schedulers: Sequence[str] = DEFAULT_MEASURED, model: str = "tiny_resnet", *, workers: int = 2,
                     bandwidth: str | None = None, steps: int = 6, warmup_steps: int = 2, batch_size: int = 16,
                     density: float = DEFAULT_DENSITY, staleness: int = DEFAULT_STALENESS,
                     stage1_share: float = DEFAULT_STAGE1_SHARE, fit_repeats: int = 1, seed: int = 0
                     ) -> dict[int, list[dict[str, Any]]]:
    """:class:`repro.train.TrainConfig` dicts of one timing run per scheduler, keyed by world size:
    ``workers`` ranks, or ``1 + workers`` for a parameter-server scheduler (rank 0 serves)."""
    names = check_schedulers(schedulers)
    density = _check_density(density)
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 2:
        raise CompareError(f"workers: the measured runs need 2 or more worker ranks, got {workers!r}")
    for name, v, low in (("steps", steps, 1), ("warmup_steps", warmup_steps, 1), ("batch_size", batch_size, 1),
                         ("fit_repeats", fit_repeats, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise CompareError(f"{name}: must be an integer >= {low}, got {v!r}")
    tag = f"_bw{link_name(bandwidth)}" if bandwidth else ""
    values = {"density": density, "servers": 1, "staleness": int(staleness),
              "stage1_share": float(stage1_share)}
    out: dict[int, list[dict[str, Any]]] = {}
    for s in names:
        c: dict[str, Any] = {"model": model, "scheduler": s, "steps": int(steps), "warmup_steps": int(warmup_steps),
                             "compute_steps": 0, "batch_size": int(batch_size), "fit_repeats": int(fit_repeats),
                             "seed": int(seed)}
        takes = get_scheduler(s).planner_options
        served = "servers" in takes  # a parameter server: one serving rank on top of the workers
        c.update({k: v for k, v in values.items() if k in takes})
        c["run_id"] = f"{model}_{s}_w{int(workers)}" + ("_ps1" if served else "") + tag
        out.setdefault(int(workers) + int(served), []).append(c)
    return out


def run_measured(schedulers: Sequence[str], results_dir: str | Path, *, model: str = "tiny_resnet", workers: int = 2,
                 bandwidth: str | None = "100mbit", timeout_s: float = 900, overwrite: bool = True,
                 **config: Any) -> pd.DataFrame:
    """Run :func:`measured_configs` with :func:`repro.studies.mgwfbp_train.run_grid` into
    ``<results_dir>/runs`` (``bandwidth``: emulated links, needs root; None: loopback) and return
    :func:`measured_table`. ``config``: more :func:`measured_configs` options."""
    from repro.workload.models import MODEL_NAMES

    if model not in MODEL_NAMES:
        raise CompareError(f"model: unknown model {model!r}; choose one of {', '.join(MODEL_NAMES)}")
    by_world = measured_configs(schedulers, model, workers=workers, bandwidth=bandwidth, **config)
    for world, configs in sorted(by_world.items()):
        run_grid(configs, [world], results_dir, emulate_bandwidth=bandwidth, timeout_s=timeout_s, overwrite=overwrite)
    return measured_table(results_dir)


def measured_table(results_dir: str | Path, *, density: float = DEFAULT_DENSITY,
                   staleness: int = DEFAULT_STALENESS) -> pd.DataFrame:
    """One row per measured run of a compared scheduler under ``<results_dir>/runs``.

    Columns: model, scheduler, group, family, keeps_sync_sgd, math_note, workers, servers, ranks, link,
    cpu_count, oversubscribed, batch_size, steps, iteration_s (the slowest rank's median),
    iteration_q25_s / iteration_q75_s (one rank's quartiles: the noise), throughput_samples_s,
    predicted_iteration_s, run_id, relative_to_best, best, best_sync_sgd, origin."""
    runs = load_runs(results_dir)
    if runs.empty:
        raise CompareError(f"no measured runs under {Path(results_dir) / 'runs'} (run run_measured first)")
    runs = runs[runs["scheduler"].isin(SCHEDULERS)].copy()
    iters = load_iterations(results_dir)
    q = (iters.groupby("run_id")["iteration_s"].quantile([0.25, 0.75]).unstack() if len(iters)
         else pd.DataFrame(columns=[0.25, 0.75]))
    info = scheduler_table(list(dict.fromkeys(runs["scheduler"])), density=density,
                           staleness=staleness).set_index("scheduler")
    rows = []
    for _, r in runs.iterrows():
        servers = int(r["servers"]) if pd.notna(r.get("servers")) else 0
        ranks = int(r["ranks"]) if pd.notna(r.get("ranks")) else int(r.world_size) + servers
        rows.append({"model": r.model, "scheduler": r.scheduler, **info.loc[r.scheduler].to_dict(),
                     "workers": int(r.world_size), "servers": servers, "ranks": ranks,
                     "link": link_name(r.get("emulated_bandwidth_bps")), "cpu_count": r.get("cpu_count"),
                     "oversubscribed": bool(r.get("oversubscribed", False)), "batch_size": int(r.batch_size),
                     "steps": int(r.steps), "iteration_s": float(r.iteration_s),
                     "iteration_q25_s": float(q.loc[r.run_id, 0.25]) if r.run_id in q.index else np.nan,
                     "iteration_q75_s": float(q.loc[r.run_id, 0.75]) if r.run_id in q.index else np.nan,
                     "throughput_samples_s": float(r.throughput_samples_s),
                     "predicted_iteration_s": r.get("predicted_iteration_s"), "run_id": r.run_id})
    df = pd.DataFrame(rows).drop(columns=["paper"])
    order = {s: k for k, s in enumerate(SCHEDULERS)}
    df = df.sort_values("scheduler", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
    df = mark_best(df, ["model", "link", "workers"])
    df["origin"] = "measured, tiny scale"
    return df
