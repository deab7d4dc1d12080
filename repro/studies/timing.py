"""Measured timing comparisons with an interval: interleaved samples of several schedulers' iteration time
(modes ``steps`` and ``runs``; design in ``docs/design/studies.md``).

The table (:func:`interleaved_samples`) has one row per sample: ``model``, ``workers``, ``scheduler``,
``pair``, ``iteration_s`` (seconds), ``mode``, ``steps`` (steps behind the sample), ``position`` (place
in the pair's order), ``ranks`` (servers included), ``cpu_count``, ``oversubscribed``, ``buckets`` (of
the plan the copy ran; None in ``runs`` mode) and the schedulers' options as columns.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from repro.core.cost import CostModel
from repro.core.outputs import write_output
from repro.core.paths import shipped_path
from repro.core.schedulers import get_scheduler
from repro.core.trace import Trace
from repro.launch.local import launch_local
from repro.studies.common import available_cpus, is_oversubscribed, warn_if_oversubscribed
from repro.studies.mgwfbp_train import run_configs

__all__ = ["MODES", "MIN_PAIRS", "BASE_COLUMNS", "interleaved_samples", "record_plan_inputs", "save_plan_inputs", "load_plan_inputs",
           "PLAN_INPUT_SETTINGS", "timing_params", "pair_ratios",
           "ratio_summary", "ratio_table", "config_columns", "interleaved_order", "with_sample_medians"]

MODES = ("steps", "runs")
#: fewest pairs a comparison is measured with by default: a median of fewer says little about its spread
MIN_PAIRS = 5
_SPEC_KEYS = ("scheduler",)


def interleaved_order(n: int, rounds: int) -> list[list[int]]:
    """Indices ``0..n-1`` in turn, reversed every other round: ``[[0, 1], [1, 0], [0, 1], ...]``."""
    return [list(range(n)) if r % 2 == 0 else list(range(n))[::-1] for r in range(rounds)]


def _specs(schedulers: Sequence[str | dict[str, Any]]) -> list[dict[str, Any]]:
    specs = []
    for s in schedulers:
        spec = {"scheduler": s} if isinstance(s, str) else dict(s)
        if not isinstance(spec.get("scheduler"), str):
            raise ValueError(f"a scheduler is a name or a dict with a 'scheduler' name, got {s!r}")
        specs.append(spec)
    if len(specs) < 2:
        raise ValueError(f"a timing comparison needs at least 2 schedulers, got {len(specs)}")
    keys = [tuple(sorted(sp.items(), key=lambda kv: kv[0])) for sp in specs]
    if len(set(map(repr, keys))) != len(keys):
        raise ValueError(f"the same scheduler configuration is listed twice: {schedulers!r}")
    return specs


def _check(mode: str, pairs: int, block_steps: int, warmup_steps: int, workers: int, servers: int) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    for name, v, low in (("pairs", pairs, 1), ("block_steps", block_steps, 1), ("warmup_steps", warmup_steps, 1),
                         ("workers", workers, 2), ("servers", servers, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
    if servers and mode == "steps":
        raise ValueError("servers > 0 (dedicated parameter servers) needs mode='runs': server ranks cannot train "
                         "copies side by side")


def timing_params(*, mode: str = "steps", pairs: int = MIN_PAIRS, block_steps: int = 10, warmup_steps: int = 3,
                  batch_size: int = 32, workers: int = 2, servers: int = 0, emulate_bandwidth: str | None = None,
                  cpus: int | None = None) -> dict[str, Any]:
    """How :func:`interleaved_samples` with these arguments takes its samples (a table's params JSON),
    with this machine's 1-minute load average now (call it right after sampling)."""
    cpus = available_cpus() if cpus is None else cpus
    ranks = int(workers) + int(servers)
    over = is_oversubscribed(ranks, cpus, 1)
    design = ("steps: one copy of the model per scheduler in each rank's process (repro.distribute), trained step "
              "by step in turn on the same batches, order reversed every other step; a sample = the median step "
              f"of a block of {block_steps} steps of one scheduler, its pair = the block"
              if mode == "steps" else
              f"runs: whole runs in turn in one launched world, order reversed every other round (A B, B A, ...); "
              f"a sample = a run's median of {block_steps} timed steps (slowest worker), its pair = the round")
    return {"timing_mode": mode, "timing_design": design, "timing_pairs": int(pairs),
            "timing_steps_per_block": int(block_steps), "timing_warmup_steps": int(warmup_steps),
            "timing_batch_size": int(batch_size), "timing_threads_per_rank": 1, "timing_workers": int(workers),
            "timing_servers": int(servers), "timing_ranks": ranks, "timing_cpu_count": int(cpus),
            "timing_oversubscribed": bool(over),
            "timing_ranks_vs_cores": (f"{ranks} ranks x 1 thread on {cpus} core(s)"
                                      + (": oversubscribed, the samples include CPU sharing" if over else "")),
            "timing_emulated_bandwidth": emulate_bandwidth or "loopback",
            "timing_load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def interleaved_samples(models: str | Sequence[str], schedulers: Sequence[str | dict[str, Any]], workers: int, *,
                        mode: str = "steps", pairs: int = MIN_PAIRS, block_steps: int = 10, warmup_steps: int = 3,
                        batch_size: int = 32, servers: int = 0, emulate_bandwidth: str | None = None,
                        extra: dict[str, Any] | None = None, seed: int = 0, fit_repeats: int = 2,
                        plan_inputs: Mapping[str, tuple[Any, Any]] | None = None,
                        timeout_s: float = 1800) -> pd.DataFrame:
    """Interleaved iteration-time samples of ``schedulers`` (names, or dicts of a ``scheduler``
    name and its options) on each of ``models``, in one local world of ``workers`` training ranks (plus
    ``servers`` serving ranks, ``runs`` mode only), gloo on CPU, one thread per rank.

    ``extra``: more :class:`repro.train.TrainConfig` fields (``runs`` mode). ``fit_repeats``: repeats per
    message size of a live cost fit. ``plan_inputs``: model -> ``(Trace, CostModel)`` the online planners
    plan from instead of their warm-up (``steps`` mode). Bad arguments raise a one-line ValueError before
    any rank starts; an oversubscribed world warns."""
    models = [models] if isinstance(models, str) else list(models)
    if not models:
        raise ValueError("no model to time")
    specs = _specs(schedulers)
    _check(mode, pairs, block_steps, warmup_steps, workers, servers)
    plan_inputs = dict(plan_inputs or {})
    if plan_inputs and mode != "steps":
        raise ValueError("plan_inputs needs mode='steps'")
    ranks = int(workers) + int(servers)
    cpus = available_cpus()
    warn_if_oversubscribed(ranks, f"timing {len(specs)} schedulers", cpus=cpus)
    rows: list[dict[str, Any]] = []
    for model in models:
        if mode == "steps":
            out = launch_local(_steps_target, ranks, args=(model, specs, int(pairs), int(block_steps),
                                                           int(warmup_steps), int(batch_size), int(seed),
                                                           int(fit_repeats), plan_inputs.get(model)),
                               timeout_s=timeout_s, quiet=True, emulate_bandwidth=emulate_bandwidth)
            per_rank = [o["times_s"] for o in out]
            buckets = out[0]["buckets"]
            first = interleaved_order(len(specs), pairs * block_steps)
            for k, spec in enumerate(specs):
                step_s = [max(r[k][i] for r in per_rank) for i in range(len(per_rank[0][k]))]
                for b in range(pairs):
                    block = step_s[b * block_steps:(b + 1) * block_steps]
                    rows.append(_row(model, workers, spec, b, statistics.median(block), mode, len(block), ranks,
                                     cpus, first[b * block_steps].index(k), buckets[k]))
        else:
            order = interleaved_order(len(specs), pairs)
            configs = [{"model": model, "batch_size": int(batch_size), "steps": int(block_steps),
                        "warmup_steps": int(warmup_steps), "compute_steps": 0, "seed": int(seed), "quiet": True,
                        "fit_repeats": int(fit_repeats),
                        **({"servers": int(servers)} if servers else {}), **(extra or {}), **specs[k]}
                       for r in order for k in r]
            summaries = launch_local(run_configs, ranks, args=(configs,), timeout_s=timeout_s, quiet=True,
                                     emulate_bandwidth=emulate_bandwidth)[0]
            it = iter(summaries)
            for r, idx in enumerate(order):
                for k in idx:
                    s = next(it)
                    rows.append(_row(model, workers, specs[k], r, float(s["iteration_s"]), mode, int(block_steps),
                                     ranks, cpus, idx.index(k)))
    df = pd.DataFrame(rows)
    return df.sort_values(["model", "pair", "scheduler"], kind="stable").reset_index(drop=True)


def _row(model: str, workers: int, spec: dict[str, Any], pair: int, iteration_s: float, mode: str, steps: int,
         ranks: int, cpus: int, position: int, buckets: int | None = None) -> dict[str, Any]:
    return {"model": model, "workers": int(workers), "scheduler": spec["scheduler"], "pair": int(pair),
            "iteration_s": float(iteration_s), "mode": mode, "steps": int(steps), "position": int(position),
            "ranks": int(ranks), "cpu_count": int(cpus), "oversubscribed": is_oversubscribed(ranks, cpus, 1),
            "buckets": buckets,
            **{k: v for k, v in spec.items() if k not in _SPEC_KEYS}}


def _scheduler_options(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``spec``'s scheduler entry and the (set) options of ``spec`` its planner or executor takes."""
    sched = get_scheduler(spec["scheduler"])
    allowed = set(sched.planner_options) | set(sched.executor_options)
    return sched, {k: v for k, v in spec.items() if k in allowed and v is not None}


def _steps_target(ctx, model_name: str, specs: list[dict[str, Any]], pairs: int, block_steps: int,
                  warmup_steps: int, batch_size: int, seed: int, fit_repeats: int,
                  plan_input: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Launch target of the ``steps`` design: each scheduler's timed step seconds in order
    (``times_s[k][i]``) and the buckets of the plan each copy ran."""
    import copy
    import time

    import torch
    import torch.distributed as dist

    import repro
    from repro.core.planners import make_plan
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.manual_seed(seed)
    base = build_model(model_name)
    g = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
    batches = [make_batch(model_name, batch_size, generator=g) for _ in range(4)]
    copies = []
    for spec in specs:
        sched, options = _scheduler_options(spec)
        kw = {"wire_dtype": spec["wire_dtype"]} if spec.get("wire_dtype") else {}
        m = copy.deepcopy(base)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        if plan_input is not None and sched.online and sched.has_plan:
            planner_kw = {k: v for k, v in options.items() if k in sched.planner_options}
            plan = make_plan(sched.planner, plan_input[0], plan_input[1], **kw, **planner_kw)
            options = {k: v for k, v in options.items() if k not in sched.planner_options}
            copies.append(repro.distribute(m, opt, plan, **options))
            continue
        copies.append(repro.distribute(m, opt, spec["scheduler"], warmup_steps=warmup_steps,
                                      fit_repeats=fit_repeats, **kw, **options))

    def step(k: int, batch) -> float:
        model, opt = copies[k]
        x, y = batch
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        compute_loss(model_name, model, x, y).backward()
        opt.step()
        return time.perf_counter() - t0

    # warm-up (untimed): every copy's own warm-up and online planning, then one more step of each
    i = 0
    while i < warmup_steps or any(opt.warming_up for _, opt in copies):
        for k in interleaved_order(len(copies), i + 1)[i]:
            if i < warmup_steps or copies[k][1].warming_up:
                step(k, batches[i % len(batches)])
        i += 1
    for k in range(len(copies)):
        step(k, batches[i % len(batches)])
    times: list[list[float]] = [[] for _ in copies]
    for j, idx in enumerate(interleaved_order(len(copies), pairs * block_steps)):
        batch = batches[j % len(batches)]
        for k in idx:
            times[k].append(step(k, batch))
    for _, opt in copies:
        opt.flush()
    for _, opt in copies:
        opt.remove()
    return {"times_s": times,
            "buckets": [len(opt.plan.buckets) if getattr(opt, "plan", None) is not None else 0 for _, opt in copies]}


def record_plan_inputs(model: str, scheduler: str | dict[str, Any], workers: int, *, warmup_steps: int = 3,
                       batch_size: int = 32, fit_repeats: int = 2, emulate_bandwidth: str | None = None,
                       seed: int = 0, timeout_s: float = 600) -> tuple[Any, Any]:
    """The ``(Trace, CostModel)`` one online-planning ``scheduler`` measures in its warm-up on
    ``model`` in a local world of ``workers`` ranks, to pass as ``plan_inputs``."""
    spec = _specs([scheduler, "wfbp"])[0]
    out = launch_local(_record_target, int(workers), args=(model, spec, int(warmup_steps), int(batch_size),
                                                          int(seed), int(fit_repeats)),
                       timeout_s=timeout_s, quiet=True, emulate_bandwidth=emulate_bandwidth)[0]
    return Trace.from_dict(out["trace"]), CostModel.from_dict(out["cost"])


def _record_target(ctx, model_name: str, spec: dict[str, Any], warmup_steps: int, batch_size: int, seed: int,
                   fit_repeats: int) -> dict[str, Any]:
    """Launch target: warm ``spec``'s scheduler up and return the trace and cost it planned from."""
    import torch

    import repro
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.manual_seed(seed)
    model = build_model(model_name)
    sched, options = _scheduler_options(spec)
    if not (sched.online and sched.has_plan):
        raise ValueError(f"scheduler '{spec['scheduler']}' does not plan online from a warm-up")
    model, opt = repro.distribute(model, torch.optim.SGD(model.parameters(), lr=0.01), spec["scheduler"],
                                  warmup_steps=warmup_steps, fit_repeats=fit_repeats, **options)
    g = torch.Generator().manual_seed(seed + 1 + ctx.rank)
    while opt.warming_up:
        x, y = make_batch(model_name, batch_size, generator=g)
        opt.zero_grad()
        compute_loss(model_name, model, x, y).backward()
        opt.step()
    opt.flush()
    out = {"trace": opt.trace.to_dict(), "cost": opt.cost.to_dict()}
    opt.remove()
    return out


#: what recorded plan inputs must have been measured under to stand for a run's own warm-up
PLAN_INPUT_SETTINGS = ("workers", "batch_size", "emulate_bandwidth")


def save_plan_inputs(path: str | os.PathLike, inputs: Mapping[str, tuple[Any, Any]], settings: Mapping[str, Any],
                     source: str) -> None:
    """Write ``inputs`` (model -> ``(Trace, CostModel)``) as one JSON with the ``settings`` they were
    measured under (:data:`PLAN_INPUT_SETTINGS`) and their ``source``."""
    missing = [k for k in PLAN_INPUT_SETTINGS if k not in settings]
    if missing:
        raise ValueError(f"plan-input settings miss {', '.join(missing)}")
    doc = {"source": source, "settings": {k: settings[k] for k in PLAN_INPUT_SETTINGS},
           "models": {m: {"trace": t.to_dict(), "cost": c.to_dict()} for m, (t, c) in inputs.items()}}
    write_output(path, json.dumps(doc, indent=1) + "\n")


def load_plan_inputs(path: str | os.PathLike, models: Sequence[str],
                     settings: Mapping[str, Any]) -> tuple[dict[str, tuple[Any, Any]], str]:
    """The recorded inputs of ``models`` in ``path`` (a file, or a name in the shipped
    ``data/calibration/``) and a line saying what the planners plan from; an empty dict when the recorded
    settings differ or a model is missing (each run then plans from its own warm-up)."""
    path = Path(path) if Path(path).is_file() else shipped_path("calibration", str(path))
    if not path.is_file():
        raise FileNotFoundError(f"no recorded plan inputs at {path}")
    doc = json.loads(path.read_text())
    have = doc.get("settings", {})
    differ = [f"{k} {settings.get(k)!r} (recorded: {have.get(k)!r})" for k in PLAN_INPUT_SETTINGS
              if settings.get(k) != have.get(k)]
    absent = [m for m in models if m not in doc.get("models", {})]
    if differ or absent:
        why = "; ".join([*differ, *(f"no recorded {m}" for m in absent)])
        return {}, f"each run's own warm-up (the recorded inputs in {Path(path).name} do not apply: {why})"
    inputs = {m: (Trace.from_dict(doc["models"][m]["trace"]), CostModel.from_dict(doc["models"][m]["cost"]))
              for m in models}
    return inputs, f"the warm-ups recorded in {Path(path).name} ({doc.get('source', 'no source given')})"


# reading samples

def _matches(df: pd.DataFrame, sel: Mapping[str, Any]) -> pd.Series:
    """The rows of ``df`` equal to ``sel`` on each of its columns."""
    return df[list(sel)].eq(pd.Series(sel, dtype=object)).all(axis=1)


def pair_ratios(samples: pd.DataFrame, num: dict[str, Any], den: dict[str, Any],
                by: Sequence[str] = ("model",)) -> pd.DataFrame:
    """Per pair (and ``by`` group): ``iteration_s`` of the ``num`` sample over the ``den`` sample (each
    a dict of column values selecting one sample per pair)."""
    cols = [*by, "pair", "iteration_s"]
    merged = samples[_matches(samples, num)][cols].merge(samples[_matches(samples, den)][cols],
                                                         on=[*by, "pair"], suffixes=("_num", "_den"))
    return merged.assign(ratio=merged["iteration_s_num"] / merged["iteration_s_den"])


def ratio_summary(ratios: Sequence[float], resamples: int = 4000, seed: int = 0) -> dict[str, float]:
    """Median of paired ``ratios``, their range and a seeded 95% percentile-bootstrap interval of the
    median (NaN below 2 pairs)."""
    r = np.asarray(list(ratios), dtype=float)
    if r.size == 0:
        return {"pairs": 0, **dict.fromkeys(("median", "min", "max", "ci_low", "ci_high"), float("nan"))}
    lo = hi = float("nan")
    if r.size >= 2:
        meds = np.median(r[np.random.default_rng(seed).integers(0, r.size, size=(resamples, r.size))], axis=1)
        lo, hi = float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))
    return {"pairs": int(r.size), "median": float(np.median(r)), "min": float(r.min()), "max": float(r.max()),
            "ci_low": lo, "ci_high": hi}


#: the columns of every samples table that are not a scheduler's own option
BASE_COLUMNS = ("model", "workers", "scheduler", "pair", "iteration_s", "mode", "steps", "position", "ranks",
                "cpu_count", "oversubscribed", "buckets")


def config_columns(samples: pd.DataFrame) -> list[str]:
    """The scheduler-option columns of a samples table (e.g. ``threshold_bytes``, ``density``)."""
    return [c for c in samples.columns if c not in BASE_COLUMNS]


def ratio_table(samples: pd.DataFrame, reference: dict[str, Any]) -> pd.DataFrame:
    """Per model and configuration: :func:`ratio_summary` of its ``iteration_s`` over the
    ``reference``'s, pair by pair (``median`` > 1: slower), with its median ``iteration_s``."""
    if samples.empty:
        return pd.DataFrame()
    keys = ["scheduler", *config_columns(samples)]
    rows = []
    for model, g in samples.groupby("model", sort=False):
        for conf, h in g.groupby(keys, dropna=False, sort=False):
            sel = {k: v for k, v in zip(keys, conf) if not (isinstance(v, float) and v != v)}
            if all(k in sel and sel[k] == v for k, v in reference.items()):  # the reference itself
                continue
            ref = g[_matches(g, reference)]
            merged = h[["pair", "iteration_s"]].merge(ref[["pair", "iteration_s"]], on="pair", suffixes=("", "_ref"))
            summ = ratio_summary(merged["iteration_s"] / merged["iteration_s_ref"])
            rows.append({"model": model, **dict(zip(keys, conf)), "iteration_s": float(h["iteration_s"].median()),
                         "reference": ", ".join(f"{v}" for v in reference.values()), **summ})
    return pd.DataFrame(rows)


def with_sample_medians(table: pd.DataFrame, samples: pd.DataFrame | None,
                        keys: Sequence[str] = ("model", "workers", "scheduler"), value: str = "iteration_s"
                        ) -> pd.DataFrame:
    """``table`` with ``value`` replaced by the median of the matching ``samples``, the row's own
    kept as ``run_<value>`` and the sample count as ``samples`` (0: none matched). A row matches a
    configuration when equal on every column of ``keys`` it sets (an empty option matches any value); the
    most specific configuration wins."""
    out = table.copy()
    out[f"run_{value}"] = out[value] if value in out else np.nan
    out["samples"] = 0
    if samples is None or samples.empty or table.empty:
        return out
    keys = [k for k in keys if k in samples and k in table]
    confs = []
    for conf, g in samples.groupby(keys, dropna=False, sort=False):
        conf = conf if isinstance(conf, tuple) else (conf,)
        sel = {k: v for k, v in zip(keys, conf) if not pd.isna(v)}
        confs.append((len(sel), sel, float(g[value].median()), int(len(g))))
    for _, sel, med, n in sorted(confs, key=lambda c: c[0]):  # the most specific configuration last, so it wins
        hit = _matches(out, sel)
        out.loc[hit, value] = med
        out.loc[hit, "samples"] = n
    return out
