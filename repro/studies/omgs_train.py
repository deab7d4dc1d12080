"""The OMGS-SGD training experiments: real sparse training runs (convergence and timing) read back as
tidy tables, and the paper-scale breakdown simulated beside the paper's numbers. Runs are launched with
:func:`repro.studies.mgwfbp_train.run_grid`; a cluster job writes the same run folders. How each
measured bar is derived is written into the tables (column ``derivation``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from repro.core.paths import data_dir, paper_numbers_path, shipped_trace_path, shipped_traces
from repro.core.planners import make_plan
from repro.core.schedulers import get_scheduler
from repro.core.simulate import simulate
from repro.core.trace import Trace
from repro.costs.published_fits import cost_for_mode
from repro.families.sparse.simulate import bucket_numels, topk_count
from repro.results.runs import BUCKETS_CSV, EPOCHS_CSV, ITERATIONS_CSV, load_run
from repro.studies import mgwfbp_train
from repro.studies.common import with_oversubscription
from repro.studies.mgwfbp_train import clear_runs, run_grid

__all__ = ["SPARSE_SCHEDULERS", "CONVERGENCE_SCHEDULERS", "PHASES", "PAPER_MODELS", "MEASURED_DERIVATION",
           "clear_runs", "run_grid", "runs_folder", "load_runs", "load_epochs", "language_dataset", "run_id",
           "convergence_configs", "breakdown_configs", "convergence_table", "final_epoch_table", "measured_breakdown_table", "paper_trace_stem",
           "paper_breakdown_table", "paper_iteration_table", "breakdown_table", "timing_specs"]

SPARSE_SCHEDULERS: tuple[str, ...] = ("topk_single", "omgs")
CONVERGENCE_SCHEDULERS: tuple[str, ...] = ("wfbp", "topk_single", "omgs")
# Bars of the breakdown, bottom to top (seconds per iteration).
PHASES: tuple[str, ...] = ("forward_s", "backward_s", "sparsify_s", "comm_exposed_s", "other_s")
# The paper's models (omgs.md, "Experimental setup"): (model, batch per worker, density).
PAPER_MODELS: tuple[tuple[str, int, float], ...] = (("vgg16_cifar", 32, 0.001), ("resnet50", 32, 0.001),
                                                    ("inception_v4", 64, 0.001), ("lstm_ptb", 20, 0.004))
_PAPER_CSV = "omgs_iteration_times"


# Reading run folders (this study's own, or a cluster job's)

def runs_folder(path: str | Path) -> Path:
    """``<path>/runs`` if it exists (a study folder), else ``path`` itself (e.g. a cluster job's)."""
    p = Path(path)
    return p / "runs" if (p / "runs").is_dir() else p


def load_runs(path: str | Path) -> pd.DataFrame:
    """:func:`repro.studies.mgwfbp_train.load_runs` of the runs under :func:`runs_folder` of ``path``."""
    return mgwfbp_train._load_runs_in(runs_folder(path))


def load_epochs(path: str | Path) -> pd.DataFrame:
    """Every run's ``epochs.csv`` with its model, scheduler and world size."""
    epochs = mgwfbp_train._concat(runs_folder(path), EPOCHS_CSV)
    if epochs.columns.empty:  # no run has an epochs.csv
        return epochs
    return epochs.merge(load_runs(path)[["run_id", "model", "scheduler", "world_size"]], on="run_id")


# Configurations

def language_dataset(ptb_dir: str | Path | None = None) -> tuple[str, str]:
    """``(dataset, description)`` for the language-model runs: ``"ptb"`` when Penn Treebank is in
    ``ptb_dir`` or ``<data>/ptb``, else ``"pydoc"`` (English text shipped with Python).

    A ``ptb_dir`` not named ``ptb`` is linked as ``<tmp>/ptb`` and ``REPRO_DATA_DIR`` set to its parent
    (inherited by the training ranks), since :func:`repro.workload.datasets.ptb` reads
    ``<REPRO_DATA_DIR>/ptb``."""
    if ptb_dir:
        d = Path(ptb_dir).expanduser().resolve()
        if not (d / "ptb.train.txt").is_file():
            raise FileNotFoundError(f"ptb_dir {d} has no ptb.train.txt (Penn Treebank, word level: ptb.train.txt, "
                                    "ptb.valid.txt, ptb.test.txt)")
        if d.name != "ptb":
            import tempfile

            root = Path(tempfile.mkdtemp(prefix="repro-ptb-"))
            (root / "ptb").symlink_to(d, target_is_directory=True)
            d = root / "ptb"
        os.environ["REPRO_DATA_DIR"] = str(d.parent)
        return "ptb", f"Penn Treebank ({d})"
    if (data_dir() / "ptb" / "ptb.train.txt").is_file():
        return "ptb", f"Penn Treebank ({data_dir() / 'ptb'})"
    return "pydoc", "pydoc text (CPython's pydoc_data.topics; Penn Treebank not found)"


def run_id(c: dict[str, Any], world_size: int, bandwidth: str | None = None) -> str:
    """Deterministic run id of a config: model, scheduler, P, density (sparse), link, dataset and epochs,
    and the seed when it is not 0."""
    parts = [c["model"], c["scheduler"], f"p{world_size}"]
    if "density" in get_scheduler(c["scheduler"]).planner_options and c.get("density") is not None:
        parts.append(f"d{float(c['density']):g}".replace("-", "m"))
    if bandwidth and world_size > 1:
        from repro.launch.netns import format_bandwidth, parse_bandwidth

        parts.append("bw" + format_bandwidth(parse_bandwidth(bandwidth)))
    if c.get("epochs"):
        parts.append(f"{c.get('dataset')}-e{c['epochs']}")
    if c.get("seed"):
        parts.append(f"s{int(c['seed'])}")
    return "_".join(str(x) for x in parts)


def _with_density(c: dict[str, Any], density: float) -> dict[str, Any]:
    if get_scheduler(c["scheduler"]).family == "sparse":
        return {**c, "density": float(density)}
    return c


def convergence_configs(models: dict[str, tuple[str, float]], world_size: int, *, epochs: int, batch_size: int,
                        seeds: Sequence[int] | int = (0,), warmup_steps: int = 2, lr: float | None = None,
                        lm_lr: float | None = None, schedulers: Sequence[str] = CONVERGENCE_SCHEDULERS,
                        extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """TrainConfig dicts of the convergence runs: every model (``{model: (dataset, density)}``) x
    scheduler x seed, no computation-only steps. ``lr`` / ``lm_lr``: learning rate of classifiers /
    language models (TrainConfig's default if None)."""
    from repro.workload.models import get_spec

    out = []
    for seed in ([seeds] if isinstance(seeds, int) else list(dict.fromkeys(int(x) for x in seeds))):
        for model, (dataset, density) in models.items():
            lm = get_spec(model).family == "lm"
            rate = lm_lr if lm else lr
            for s in schedulers:
                c = {"model": model, "scheduler": s, "dataset": dataset, "epochs": int(epochs),
                     "batch_size": batch_size, "seed": int(seed), "warmup_steps": warmup_steps, "compute_steps": 0,
                     **(extra or {})}
                if rate is not None:
                    c["lr"] = float(rate)
                c = _with_density(c, density)
                c["run_id"] = run_id(c, world_size)
                out.append(c)
    return out


def breakdown_configs(models: dict[str, float], world_size: int, *, batch_size: int, steps: int,
                      warmup_steps: int = 2, compute_steps: int = 0, bandwidth: str | None = None,
                      schedulers: Sequence[str] = SPARSE_SCHEDULERS, seed: int = 0) -> list[dict[str, Any]]:
    """TrainConfig dicts of the timing runs (synthetic data, timeline recorded): every model
    (``{model: density}``) x scheduler."""
    out = []
    for model, density in models.items():
        for s in schedulers:
            c = _with_density({"model": model, "scheduler": s, "batch_size": batch_size, "steps": steps,
                               "warmup_steps": warmup_steps, "compute_steps": compute_steps, "seed": seed,
                               "record_timeline": True}, density)
            c["run_id"] = run_id(c, world_size, bandwidth)
            out.append(c)
    return out


def timing_specs(densities: Sequence[float], schedulers: Sequence[str] = SPARSE_SCHEDULERS) -> list[dict[str, Any]]:
    """The configurations the OMGS timing samples compare: every scheduler at each density (a dense
    one once)."""
    out: list[dict[str, Any]] = []
    for d in dict.fromkeys(float(x) for x in densities):
        for s in schedulers:
            c = _with_density({"scheduler": s}, d)
            if c not in out:
                out.append(c)
    return out


# Convergence

def convergence_table(results_dir: str | Path, *, scale: str = "tiny") -> pd.DataFrame:
    """One row per (convergence run, epoch); at ``scale="paper"`` only the OMGS grid's runs.

    Columns: model, dataset, scheduler, density, world_size, epoch, train_loss, test_loss (per sample,
    per token for language models), test_accuracy, perplexity (language models: exp(test_loss) unless
    recorded), lm, buckets, min_elements_sent_per_bucket (sparse runs), seed, lr, batch_size,
    oversubscribed, run_id."""
    epochs = load_epochs(results_dir)
    if epochs.empty:
        return epochs
    runs = load_runs(results_dir)
    runs = runs[runs["epochs"].notna()] if "epochs" in runs else runs
    if scale == "paper":
        runs = mgwfbp_train.grid_runs(runs, "omgs", "convergence")
        epochs = epochs[epochs["run_id"].isin(runs["run_id"])]
        if epochs.empty:
            return epochs.iloc[0:0]
    from repro.workload.models import get_spec

    meta = []
    for _, r in runs.iterrows():
        run = load_run(r.path)
        cfg = run.config
        sparse = cfg.get("scheduler") in SPARSE_SCHEDULERS or str(cfg.get("scheduler", "")).startswith(("topk", "omgs"))
        numels = _bucket_numels(run) if sparse else None
        sent = None
        if numels and cfg.get("density"):
            sent = int(min(topk_count(n, float(cfg["density"])) for n in numels))
        meta.append({"run_id": r.run_id, "dataset": cfg.get("dataset"),
                     "density": cfg.get("density") if sparse else None,
                     "buckets": len(numels) if numels else r.get("buckets"), "min_elements_sent_per_bucket": sent,
                     "seed": cfg.get("seed"), "lr": cfg.get("lr"), "batch_size": cfg.get("batch_size"),
                     "lm": get_spec(r.model).family == "lm",
                     "oversubscribed": bool(r.get("oversubscribed", False))})
    df = epochs.merge(pd.DataFrame(meta), on="run_id")
    if "perplexity" not in df:
        df["perplexity"] = np.nan
    if "test_perplexity" in df:  # the runtime's own name, if it records one
        df["perplexity"] = df["perplexity"].fillna(df["test_perplexity"])
    fill = df["lm"] & df["perplexity"].isna() & df["test_loss"].notna()
    df.loc[fill, "perplexity"] = np.exp(df.loc[fill, "test_loss"].astype(float))
    df.loc[~df["lm"], "perplexity"] = np.nan
    if "test_accuracy" not in df:
        df["test_accuracy"] = np.nan
    cols = ["model", "dataset", "scheduler", "density", "world_size", "epoch", "train_loss", "test_loss",
            "test_accuracy", "perplexity", "lm", "buckets", "min_elements_sent_per_bucket", "seed", "lr", "batch_size",
            "oversubscribed", "run_id"]
    order = {s: i for i, s in enumerate(CONVERGENCE_SCHEDULERS)}
    df = df.assign(_o=df["scheduler"].map(order).fillna(len(order)))
    return df.sort_values(["model", "_o", "epoch"])[cols].reset_index(drop=True)


METRICS = ("train_loss", "test_loss", "test_accuracy", "perplexity")


def seed_summary(conv: pd.DataFrame) -> pd.DataFrame:
    """:func:`convergence_table` over seeds: per (model, scheduler, epoch) each metric's median and
    ``<metric>_min`` / ``<metric>_max``, ``seeds`` and ``seed_list``; other columns are the first seed's."""
    if conv.empty:
        return conv
    if "seed" in conv:  # a run whose config leaves the seed out ran with the default, 0
        conv = conv.assign(seed=pd.to_numeric(conv["seed"], errors="coerce").fillna(0).astype(int))
    keys = ["model", "scheduler", "epoch"]
    metrics = [m for m in METRICS if m in conv]
    grouped = conv.groupby(keys, sort=False)
    out = grouped.first().drop(columns=[*metrics, "seed", "run_id"], errors="ignore")
    out = out.join(grouped[metrics].median())
    for m in metrics:
        out[f"{m}_min"], out[f"{m}_max"] = grouped[m].min(), grouped[m].max()
    if "min_elements_sent_per_bucket" in conv:  # the plans differ per seed (online planning): the extremes
        out["min_elements_sent_per_bucket"] = grouped["min_elements_sent_per_bucket"].min()
    if "buckets" in conv:
        out["buckets_min"], out["buckets_max"] = grouped["buckets"].min(), grouped["buckets"].max()
    out["seeds"] = grouped["seed"].nunique() if "seed" in conv else 1
    out["seed_list"] = grouped["seed"].agg(lambda v: ",".join(str(int(x)) for x in sorted(set(v)))) \
        if "seed" in conv else ""
    return out.reset_index()


def final_epoch_table(conv: pd.DataFrame) -> pd.DataFrame:
    """The last epoch of each (model, scheduler) from :func:`seed_summary`, with
    ``test_loss_vs_dense`` and ``test_accuracy_vs_dense`` (differences to ``wfbp``)."""
    if conv.empty:
        return conv
    conv = seed_summary(conv)
    last = conv.sort_values("epoch").groupby(["model", "scheduler"], sort=False).tail(1).copy()
    dense = last[last["scheduler"] == "wfbp"].set_index("model")
    last["test_loss_vs_dense"] = last["test_loss"] - last["model"].map(dense["test_loss"])
    last["test_accuracy_vs_dense"] = last["test_accuracy"] - last["model"].map(dense["test_accuracy"])
    order = {s: i for i, s in enumerate(CONVERGENCE_SCHEDULERS)}
    last = last.assign(_o=last["scheduler"].map(order).fillna(len(order)))
    return last.sort_values(["model", "_o"]).drop(columns="_o").reset_index(drop=True)


# Breakdown: measured (tiny, real runs)

def _median(df: pd.DataFrame | None, col: str) -> float:
    if df is None or col not in df or df[col].dropna().empty:
        return float("nan")
    return float(df[col].median())


def _timeline_sparsify_s(buckets: pd.DataFrame | None) -> float | None:
    """Seconds of top-k selection in the last step's timeline (sum of the buckets' compression
    times), or None when not recorded."""
    if buckets is None or buckets.empty:
        return None
    for start, end in (("compress_start_s", "compress_end_s"), ("sparsify_start_s", "sparsify_end_s")):
        if {start, end} <= set(buckets.columns):
            d = (pd.to_numeric(buckets[end], errors="coerce") - pd.to_numeric(buckets[start], errors="coerce")).dropna()
            if len(d):
                return float(d.clip(lower=0).sum())
    return None


def _bucket_numels(run) -> list[int] | None:
    trace, plan = run.trace, run.plan
    return None if trace is None or plan is None else bucket_numels(trace, plan)


MEASURED_DERIVATION = (
    "rank 0's medians over the timed steps (iterations.csv) unless said otherwise. forward: forward_s "
    "(buffer broadcast + forward); sparsification: {spar}; backward: backward_call_s - sparsification (top-k "
    "runs in the gradient hooks, inside the backward call); communication: step_s - update_s (waiting after "
    "backward for the all-gathers, and averaging the sparse contributions: communication not overlapped); "
    "other: update_s (optimizer step)")


def _measured_row(r: pd.Series) -> dict[str, Any] | None:
    """Phase seconds of one timing run (see :func:`measured_breakdown_table`)."""
    run = load_run(r.path)
    it = run.table(ITERATIONS_CSV)
    if it is None or it.empty:
        return None
    forward = _median(it, "forward_s")
    backward_call = _median(it, "backward_call_s")
    update = _median(it, "update_s")
    update = 0.0 if math.isnan(update) else update
    comm = float((it["step_s"] - it["update_s"].fillna(0.0)).median()) if "step_s" in it else float("nan")
    spar = _timeline_sparsify_s(run.table(BUCKETS_CSV))
    how = "the recorded timeline of the last step (record_timeline: sum of each bucket's compression time)"
    if spar is None:
        cost, numels = run.cost, _bucket_numels(run)
        if cost is not None and cost.topk_gamma_s is not None and numels:
            spar = float(np.sum(np.atleast_1d(cost.topk_s(np.asarray(numels, dtype=float)))))
            how = "the top-k cost fitted on this machine during the run (gamma d log2 d) at the plan's bucket sizes"
        else:
            spar, how = 0.0, "not recorded (counted in backward)"
    spar = min(spar, backward_call) if not math.isnan(backward_call) else spar
    backward = backward_call - spar
    compute = r.get("compute_s")
    compute = float(compute) if compute is not None and compute == compute else float("nan")
    return {"forward_s": forward, "backward_s": backward, "sparsify_s": spar, "comm_exposed_s": max(0.0, comm),
            "other_s": update, "iteration_s": forward + backward_call + max(0.0, comm) + update,
            "summary_iteration_s": float(r.iteration_s), "backward_call_s": backward_call,
            "compute_only_s": compute, "buckets": r.get("buckets"), "derivation": MEASURED_DERIVATION.format(spar=how)}


def _simulated_row(run) -> dict[str, Any] | None:
    if not run.can_simulate:
        return None
    trace, plan, cost = run.trace, run.plan, run.cost
    try:
        sim = simulate(trace, plan, cost, with_ops=False)
    except Exception:  # noqa: BLE001 - a cost model without the sparse line or top-k fit: no simulated bar
        return None
    return _sim_phases(trace, sim)


def _sim_phases(trace, sim) -> dict[str, Any]:
    o = trace.overheads
    forward = float(trace.total_forward_s) + o.pre_forward_s
    backward = float(trace.total_backward_s)
    other = o.after_backward_s
    return {"forward_s": forward, "backward_s": backward, "sparsify_s": float(sim.sparsify_s),
            "comm_exposed_s": max(0.0, float(sim.iteration_s) - forward - backward - float(sim.sparsify_s) - other),
            "other_s": other, "iteration_s": float(sim.iteration_s), "comm_total_s": float(sim.comm_s)}


def measured_breakdown_table(runs: pd.DataFrame, schedulers: Sequence[str] = SPARSE_SCHEDULERS) -> pd.DataFrame:
    """Per timing run of ``schedulers``: seconds per iteration split into :data:`PHASES`
    (they add up to ``iteration_s``), ``source`` ``measured`` (:data:`MEASURED_DERIVATION`, rank 0's
    medians; ``summary_iteration_s`` is the run's slowest-rank median) and ``simulated`` (the run's own
    trace, plan and cost model). ``derivation`` says which sources applied."""
    if runs.empty:
        return pd.DataFrame()
    if "oversubscribed" not in runs:
        runs = with_oversubscription(runs)
    timing = mgwfbp_train._timing_runs(runs)
    rows = []
    for _, r in timing[timing["scheduler"].isin(schedulers)].iterrows():
        run = load_run(r.path)
        base = {"model": r.model, "scheduler": r.scheduler, "workers": int(r.world_size),
                "density": run.config.get("density"),
                "network": _network_label(r.get("emulated_bandwidth_bps")), "scale": "tiny",
                "oversubscribed": bool(r.get("oversubscribed", False)), "run_id": r.run_id,
                "trace": "measured in the run's warm-up"}
        m = _measured_row(r)
        if m is not None:
            rows.append({**base, "source": "measured", **m})
        s = _simulated_row(run)
        if s is not None:
            rows.append({**base, "source": "simulated", **s,
                         "derivation": "repro.core.simulate.simulate of the run's own trace.json, plan.json and cost.json"})
    return pd.DataFrame(rows)


def _network_label(bps: Any) -> str:
    try:
        v = float(bps)
    except (TypeError, ValueError):
        return "loopback"
    if v != v or v <= 0:
        return "loopback"
    return f"emulated {v / 1e6:g} Mbit/s links"


# Breakdown: simulated at paper scale, and the paper's numbers

def paper_trace_stem(model: str, batch_size: int) -> tuple[str, str]:
    """``(trace stem, GPU)`` for a paper model: the P102-100 estimate when shipped, else the V100
    estimate of the same batch, else any of the model's."""
    have = shipped_traces()
    for stem, gpu in ((f"{model}_b{batch_size}_p102-estimate", "P102-100"),
                      (f"{model}_b{batch_size}_v100-estimate", "V100")):
        if stem in have:
            return stem, gpu
    for suffix, gpu in (("_p102-estimate", "P102-100"), ("_v100-estimate", "V100")):
        hits = sorted(s for s in have if s.startswith(f"{model}_b") and s.endswith(suffix))
        if hits:
            return hits[0], gpu
    raise FileNotFoundError(f"no shipped trace of {model}")


def paper_breakdown_table(models: Sequence[tuple[str, int, float]] = PAPER_MODELS, *, workers: int = 16,
                          network: str = "1gbe-allgather",
                          schedulers: Sequence[str] = SPARSE_SCHEDULERS, cost_mode: str = "paper") -> pd.DataFrame:
    """Simulated phase seconds (as :func:`measured_breakdown_table`) per paper model
    ``(model, batch, density)`` and scheduler at ``workers`` on preset ``network``, on the trace
    :func:`paper_trace_stem` picks. ``cost_mode``: ``"paper"`` or ``"calibrated"``."""
    cost = cost_for_mode(network, workers, cost_mode)
    rows = []
    for model, batch, density in models:
        stem, gpu = paper_trace_stem(model, batch)
        trace = Trace.load(shipped_trace_path(stem))
        for s in schedulers:
            plan = make_plan(s, trace, cost, density=density)
            sim = simulate(trace, plan, cost, with_ops=False)
            rows.append({"model": model, "scheduler": s, "workers": workers, "density": density,
                         "network": f"preset {network}", "scale": "paper", "source": "simulated",
                         **_sim_phases(trace, sim), "buckets": plan.num_buckets, "trace": stem, "gpu": gpu,
                         "oversubscribed": False, "cost_mode": cost_mode,
                         "derivation": f"repro.core.simulate.simulate: shipped trace {stem} ({gpu}), preset {network} "
                                       f"(P={workers}, {cost_mode} mode), plan of repro.core.planners.{s}"})
    return pd.DataFrame(rows)


_PAPER_SCHEDULERS = {"topk_sgd_s": "topk_single", "omgs_sgd_s": "omgs", "topk-sgd": "topk_single",
                     "topk_sgd": "topk_single", "topk_single": "topk_single", "omgs-sgd": "omgs", "omgs_sgd": "omgs",
                     "omgs": "omgs"}
_PAPER_CITATION = "OMGS-SGD (Shi et al., INFOCOM 2020): measured s/iteration, 16 P102-100 nodes, 1GbE"


def paper_iteration_table(path: str | Path | None = None) -> pd.DataFrame:
    """The paper's seconds per iteration: model, scheduler (``topk_single``/``omgs``), workers,
    iteration_s, source ``"paper"``, citation. Reads ``omgs_iteration_times.csv`` (wide: ``topk_sgd_s``,
    ``omgs_sgd_s``; or long: ``scheduler``, ``iteration_s``); empty (same columns) if not shipped."""
    cols = ["model", "scheduler", "workers", "iteration_s", "source", "citation"]
    try:
        p = Path(path) if path else paper_numbers_path(_PAPER_CSV)
    except FileNotFoundError:
        return pd.DataFrame(columns=cols)
    raw = pd.read_csv(p, comment="#")
    rows = []
    for _, r in raw.iterrows():
        workers = int(r["workers"]) if "workers" in raw and r["workers"] == r["workers"] else 16
        cite = str(r["source"]) if "source" in raw and isinstance(r["source"], str) else _PAPER_CITATION
        if "scheduler" in raw and "iteration_s" in raw:
            pairs = [(_PAPER_SCHEDULERS.get(str(r["scheduler"]).strip().lower()), r["iteration_s"])]
        else:
            pairs = [(_PAPER_SCHEDULERS[c], r[c]) for c in raw.columns if c in ("topk_sgd_s", "omgs_sgd_s")]
        for s, v in pairs:
            if s is not None and v == v:
                rows.append({"model": str(r["model"]), "scheduler": s, "workers": workers, "iteration_s": float(v),
                             "source": "paper", "citation": cite})
    return pd.DataFrame(rows, columns=cols)


def breakdown_table(measured: pd.DataFrame, simulated: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The figure's table: measured and run-simulated rows (tiny), paper-scale simulated rows and the
    paper's seconds (phases empty), with ``panel`` naming where each row is drawn."""
    frames = []
    if len(measured):
        frames.append(measured.assign(panel="tiny"))
    if len(simulated):
        frames.append(simulated.assign(panel="paper"))
    if len(paper):
        frames.append(paper.assign(panel="paper", scale="paper", network="1GbE (paper's cluster)",
                                   derivation=paper["citation"]).drop(columns="citation"))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    first = ["panel", "scale", "model", "scheduler", "source", "workers", "density", "network", *PHASES,
             "iteration_s"]
    return df[[c for c in first if c in df] + [c for c in df.columns if c not in first]]
