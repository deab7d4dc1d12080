"""The OSP experiments on this machine: real parameter-server training runs (BSP, ASP, SSP, OSP with and
without LGP, osp_auto) read back as tidy tables.

What runs is this project's interpretation of OSP (abstract only; osp.md). A world has ``servers +
workers`` ranks, ranks ``0..servers-1`` serve. Every run is a convergence run and gives both the
accuracy per epoch and the throughput (the slowest worker's median step; evaluation excluded).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from repro.results.runs import load_run
from repro.studies.common import with_oversubscription
from repro.launch.netns import format_bandwidth, parse_bandwidth
from repro.studies.mgwfbp_train import clear_runs, grid_runs, load_iterations, run_grid
from repro.studies.mgwfbp_train import load_runs as _load_runs
from repro.studies.osp_sim import PAPER_CLAIM_PCT, method_name

__all__ = ["clear_runs", "run_grid", "variant", "default_variants", "run_id", "seed_of", "with_seeds",
           "convergence_configs", "run_study",
           "load_runs", "throughput_table", "accuracy_table", "lgp_ablation_table", "stage_ratio_table",
           "summary_table", "variant_label", "convergence_runs", "TIME_DERIVATION", "THROUGHPUT_DERIVATION"]

THROUGHPUT_DERIVATION = ("throughput = workers x batch / iteration, iteration = the slowest worker's median step "
                         "time over the run's epochs (evaluation excluded)")
TIME_DERIVATION = "training time at epoch e = sum of the measured step times of epochs 1..e (evaluation excluded)"


# What to run

def variant(scheduler: str, *, stage1_share: float | None = None, lgp: bool = True, staleness: int | None = None
            ) -> dict[str, Any]:
    """One configuration of a PS scheduler as TrainConfig fields: ``osp`` takes ``stage1_share``,
    ``osp``/``osp_auto`` take ``lgp``, ``ps_ssp`` takes ``staleness`` (default 2)."""
    v: dict[str, Any] = {"scheduler": scheduler}
    if scheduler == "osp":
        if stage1_share is None:
            raise ValueError("osp needs a stage1_share")
        v["stage1_share"] = float(stage1_share)
    if scheduler in ("osp", "osp_auto"):
        v["lgp"] = bool(lgp)
    if scheduler == "ps_ssp":
        v["staleness"] = int(2 if staleness is None else staleness)
    return v


def default_variants(fixed_share: float = 0.5, ablation_shares: Sequence[float] = (0.0,),
                     ratio_shares: Sequence[float] = (0.0, 0.5), staleness: int = 2) -> list[dict[str, Any]]:
    """Every run of the OSP notebook, each once: BSP, ASP, SSP; OSP at ``fixed_share`` with and
    without LGP; osp_auto; OSP with and without LGP at each of ``ablation_shares``; OSP at each of
    ``ratio_shares`` below 1 (share 1 is BSP's layout)."""
    out = [variant("ps_bsp"), variant("ps_asp"), variant("ps_ssp", staleness=staleness),
           variant("osp", stage1_share=fixed_share), variant("osp", stage1_share=fixed_share, lgp=False),
           variant("osp_auto")]
    for s in ablation_shares:
        out += [variant("osp", stage1_share=s), variant("osp", stage1_share=s, lgp=False)]
    out += [variant("osp", stage1_share=s) for s in ratio_shares if float(s) < 1.0]
    return [v for i, v in enumerate(out) if v not in out[:i]]


def run_id(c: dict[str, Any], workers: int, servers: int, bandwidth: str | None = None) -> str:
    """``<model>_<scheduler>[_s<stage-1 %>][_nolgp][_st<staleness>]_ps<servers>w<workers>[_bw<rate>]
    _<dataset>-e<epochs>[_seed<n>]`` (deterministic: a rerun needs overwrite)."""
    parts = [c["model"], c["scheduler"]]
    if c["scheduler"] == "osp":
        share = c["stage1_share"]
        whole = abs(100 * share - round(100 * share)) < 1e-9  # a whole percentage
        parts.append(f"s{round(100 * float(share)):d}" if whole else f"s{share:g}")
    if c["scheduler"] in ("osp", "osp_auto") and not c.get("lgp", True):
        parts.append("nolgp")
    if c["scheduler"] == "ps_ssp":
        parts.append(f"st{c.get('staleness', 2)}")
    parts.append(f"ps{servers}w{workers}")
    if bandwidth:
        parts.append("bw" + format_bandwidth(parse_bandwidth(bandwidth)))
    parts.append(f"{c.get('dataset', 'digits')}-e{c.get('epochs')}")
    if c.get("seed"):
        parts.append(f"seed{int(c['seed'])}")
    return "_".join(str(p) for p in parts)


def variant_id(rid: str) -> str:
    """The run id without its ``_seed<n>``: what runs of one variant under several seeds share."""
    return re.sub(r"_seed\d+$", "", str(rid))


def seed_of(rid: str) -> int:
    """The seed in a run id (``_seed<n>``; none: 0)."""
    m = re.search(r"_seed(\d+)$", str(rid))
    return int(m.group(1)) if m else 0


def with_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its runs' ``seed`` column (from ``run_id``)."""
    return table.assign(seed=table["run_id"].map(seed_of)) if not table.empty else table


def convergence_configs(variants: Sequence[dict[str, Any]], model: str, workers: int, servers: int = 1,
                        bandwidth: str | None = None, *, dataset: str = "digits", epochs: int = 3,
                        batch_size: int = 32, warmup_steps: int = 2, importance: str = "magnitude",
                        seeds: Sequence[int] = (0,), extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """TrainConfig dicts, one per variant and seed: ``epochs`` passes over ``dataset`` with
    ``servers`` serving ranks and OSP's ``importance`` policy; ``extra``: more fields for every run."""
    out = []
    for seed in dict.fromkeys(int(x) for x in seeds):
        for v in variants:
            c = {"model": model, "dataset": dataset, "epochs": int(epochs), "batch_size": int(batch_size),
                 "warmup_steps": int(warmup_steps), "compute_steps": 3, "servers": int(servers), "seed": seed,
                 **(extra or {}), **v}
            if v["scheduler"] in ("osp", "osp_auto"):
                c["importance"] = importance
            c["run_id"] = run_id(c, workers, servers, bandwidth)
            out.append(c)
    return out


def run_study(configs: Sequence[dict[str, Any]], workers: int, servers: int, results_dir: str | Path, *,
              emulate_bandwidth: str | None = None, timeout_s: float = 1800, overwrite: bool = False) -> pd.DataFrame:
    """Run ``configs`` in one local world of ``servers + workers`` ranks (ranks ``0..servers-1``
    serve); returns :func:`load_runs`."""
    run_grid(configs, [int(servers) + int(workers)], results_dir, emulate_bandwidth=emulate_bandwidth,
             timeout_s=timeout_s, overwrite=overwrite)
    return load_runs(results_dir)


# Reading runs

def variant_label(method: str, stage1_share: float | None = None, staleness: int | None = None,
                  stage1_bytes_share: float | None = None, bytes_range: tuple[float, float] | None = None) -> str:
    """Display name of a run: ``BSP``, ``SSP (s=2)``, ``OSP 50%``, ``OSP 50% w/o LGP``,
    ``OSP auto, ours (88%)``. Percentages are of the gradient bytes in stage 1 (``stage1_bytes_share``);
    the requested share is shown, with the actual one where they differ by more than 2 points.
    ``bytes_range``: osp_auto's seeds' (min, max) bytes share, shown when they differ."""
    def pct(v):
        return f"{100 * float(v):.0f}%"

    base = method.replace("_nolgp", "")
    suffix = " w/o LGP" if method.endswith("_nolgp") else ""
    if base in ("ps_bsp", "ps_asp"):
        return base[3:].upper()
    if base == "ps_ssp":
        return f"SSP (s={int(staleness)})" if staleness is not None and staleness == staleness else "SSP"
    actual = stage1_bytes_share if stage1_bytes_share is not None and stage1_bytes_share == stage1_bytes_share else None
    if base == "osp_auto":
        if actual is None:
            return f"OSP auto, ours{suffix}"
        spread = ""
        if bytes_range is not None and all(v == v for v in bytes_range) and pct(bytes_range[0]) != pct(bytes_range[1]):
            spread = f", seeds {pct(bytes_range[0])}-{pct(bytes_range[1])}"
        return f"OSP auto, ours ({pct(actual)}{spread}){suffix}"
    if base == "osp" and stage1_share is not None and stage1_share == stage1_share:
        shown = pct(stage1_share)
        if actual is not None and abs(actual - float(stage1_share)) > 0.02:
            shown += f" (actual {pct(actual)})"
        return f"OSP {shown}{suffix}"
    return method


def load_runs(results_dir: str | Path) -> pd.DataFrame:
    """One row per run under ``<results_dir>/runs`` with the PS fields: workers, servers, ranks,
    oversubscribed (on all ranks), stage1_share (requested; osp_auto: chosen; 1 for BSP/ASP/SSP),
    stage1_bytes_share (the plan's), lgp, staleness, importance, method (scheduler, ``_nolgp`` without
    LGP), label and lr."""
    runs = _load_runs(results_dir)
    if runs.empty:
        return runs
    rows = []
    for _, r in runs.iterrows():
        run = load_run(r.path)
        cfg, meta = run.config, (run.plan.meta if run.plan is not None else {})
        sched = r.scheduler
        is_osp = sched in ("osp", "osp_auto")
        servers = int(r.get("servers") or cfg.get("servers") or 1)
        lgp = bool(cfg.get("lgp", True)) if is_osp else np.nan
        share = float(meta.get("stage1_share", cfg.get("stage1_share", 1.0))) if is_osp else 1.0
        actual = float(meta.get("stage1_bytes_share", share)) if is_osp else 1.0
        staleness = int(cfg.get("staleness", 2)) if sched == "ps_ssp" else np.nan
        method = method_name(sched, bool(lgp) if is_osp else True)
        rows.append({"workers": int(r.world_size), "servers": servers, "ranks": int(r.world_size) + servers,
                     "stage1_share": share, "stage1_bytes_share": actual, "lgp": lgp, "staleness": staleness,
                     "importance": cfg.get("importance") if is_osp else None, "method": method,
                     "label": variant_label(method, share if sched == "osp" else None, staleness, actual),
                     "lr": cfg.get("lr")})
    extra = pd.DataFrame(rows, index=runs.index)
    runs = pd.concat([runs.drop(columns=[c for c in extra.columns if c in runs.columns]), extra], axis=1)
    return with_oversubscription(runs, workers="ranks")


def convergence_runs(runs: pd.DataFrame, scale: str = "tiny") -> pd.DataFrame:
    """The runs the accuracy figures draw: all at ``tiny``; at ``scale="paper"`` only the OSP
    grid's convergence runs."""
    return grid_runs(runs, "osp", "convergence") if scale == "paper" else runs


_RUN_COLUMNS = ["run_id", "model", "scheduler", "method", "label", "workers", "servers", "ranks", "stage1_share",
                "stage1_bytes_share", "lgp", "staleness", "importance", "emulated_bandwidth_bps", "batch_size",
                "oversubscribed"]


def _keep(runs: pd.DataFrame) -> list[str]:
    return [c for c in _RUN_COLUMNS if c in runs.columns]


def throughput_table(results_dir: str | Path, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run: ``iteration_s`` (:data:`THROUGHPUT_DERIVATION`), ``compute_s``,
    ``throughput_samples_s``, ``predicted_s`` (the plan's simulated period), ``speedup_vs_bsp`` (NaN where
    the setting has no BSP run), ``comm_bound`` (iteration / computation) and ``prediction_error``."""
    runs = load_runs(results_dir) if runs is None else runs
    if runs.empty:
        return pd.DataFrame()
    df = runs[_keep(runs) + ["iteration_s", "compute_s", "throughput_samples_s", "predicted_iteration_s"]].rename(
        columns={"predicted_iteration_s": "predicted_s"}).copy()
    df["speedup_vs_bsp"] = df["throughput_samples_s"] / _bsp_reference(df, "throughput_samples_s")
    df["comm_bound"] = df["iteration_s"] / df["compute_s"]
    df["prediction_error"] = df["predicted_s"] / df["iteration_s"] - 1
    return df.reset_index(drop=True)


_SETTING = ["model", "workers", "servers", "batch_size", "emulated_bandwidth_bps"]


def _bsp_reference(df: pd.DataFrame, column: str) -> pd.Series:
    """Per row, ``column`` of the BSP run of the same setting (:data:`_SETTING`); NaN where none."""
    keys = [k for k in _SETTING if k in df.columns]
    method = "method" if "method" in df.columns else "scheduler"
    bsp = df[df[method] == "ps_bsp"]
    if bsp.empty:
        return pd.Series(np.nan, index=df.index)
    if not keys:
        return pd.Series(float(bsp[column].iloc[0]), index=df.index)
    setting = df[keys].map(str).agg("|".join, axis=1)  # as text: a missing value (loopback) matches itself
    ref = bsp[column].groupby(setting[bsp.index]).first()
    return setting.map(ref).astype(float)


def accuracy_table(results_dir: str | Path, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run and epoch: test accuracy and loss, train loss, ``time_s`` (:data:`TIME_DERIVATION`)
    and ``steps``, with the run's method, label and shares."""
    runs = load_runs(results_dir) if runs is None else runs
    if runs.empty:
        return pd.DataFrame()
    its = load_iterations(results_dir)
    frames = []
    for _, r in runs.iterrows():
        ep = load_run(r.path).table("epochs.csv")
        if ep is None or ep.empty:
            continue
        steps = its[its.run_id == r.run_id]
        ep = ep.drop(columns=["run_id"], errors="ignore")
        ep["time_s"] = [float(steps[steps.epoch < e].iteration_s.sum()) for e in ep.epoch]
        ep["steps"] = [int((steps.epoch < e).sum()) for e in ep.epoch]
        frames.append(ep.assign(**{c: r[c] for c in _keep(runs)}))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    first = _keep(runs)
    return out[first + [c for c in out.columns if c not in first]]


_THROUGHPUT_METRICS = ("iteration_s", "compute_s", "throughput_samples_s", "predicted_s", "comm_bound",
                       "prediction_error", "stage1_bytes_share")
_ACCURACY_METRICS = ("test_accuracy", "test_loss", "train_loss", "time_s", "steps")


def _median_over(table: pd.DataFrame, metrics: Sequence[str], keys: Sequence[str]) -> pd.DataFrame:
    t = table.assign(variant=table["run_id"].map(variant_id))
    g = t.groupby(["variant", *keys], sort=False)
    out = g.first()
    for m in (m for m in metrics if m in t):
        out[m], out[f"{m}_min"], out[f"{m}_max"] = g[m].median(), g[m].min(), g[m].max()
    out["seeds"] = g["run_id"].nunique()
    return out.reset_index().assign(run_id=lambda d: d["variant"]).drop(columns="variant")


def median_over_seeds(throughput: pd.DataFrame, accuracy: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs of one variant (:func:`variant_id`) as one: per variant (and epoch) each metric's
    median over seeds, ``<metric>_min`` / ``<metric>_max`` and ``seeds``; ``run_id`` is the variant's and
    the speedup over BSP is recomputed from the medians."""
    if not throughput.empty:
        throughput = _median_over(throughput, _THROUGHPUT_METRICS, ())
        throughput["speedup_vs_bsp"] = throughput["throughput_samples_s"] / _bsp_reference(throughput,
                                                                                           "throughput_samples_s")
        throughput = _relabel(throughput)
    if not accuracy.empty:
        shares = throughput.set_index("run_id") if not throughput.empty else None
        accuracy = _median_over(accuracy, _ACCURACY_METRICS, ("epoch",))
        if shares is not None:  # the accuracy rows carry the same (median) bytes share as the throughput rows
            for c in ("stage1_bytes_share", "stage1_bytes_share_min", "stage1_bytes_share_max", "label"):
                if c in shares:
                    accuracy[c] = accuracy["run_id"].map(shares[c]).fillna(accuracy[c] if c in accuracy else np.nan)
    return throughput, accuracy


def _relabel(table: pd.DataFrame) -> pd.DataFrame:
    """Labels from the medians (osp_auto's bytes share differs per seed), with the seeds' range."""
    def one(r):
        rng = ((r.get("stage1_bytes_share_min"), r.get("stage1_bytes_share_max"))
               if "stage1_bytes_share_min" in r.index else None)
        return variant_label(r["method"], r["stage1_share"] if r.get("scheduler") == "osp" else None,
                             r.get("staleness"), r["stage1_bytes_share"], rng)

    if {"method", "stage1_share", "stage1_bytes_share"} <= set(table.columns):
        table = table.assign(label=table.apply(one, axis=1))
    return table


def lgp_ablation_table(accuracy: pd.DataFrame, shares: Sequence[float]) -> pd.DataFrame:
    """The accuracy rows of OSP with and without LGP at each of ``shares``, with the BSP rows
    repeated per share (``panel_share``)."""
    if accuracy.empty:
        return accuracy
    frames = []
    for s in shares:
        osp = accuracy[(accuracy.scheduler == "osp") & np.isclose(accuracy.stage1_share.astype(float), float(s))]
        bsp = accuracy[accuracy.scheduler == "ps_bsp"]
        frames.append(pd.concat([bsp, osp]).assign(panel_share=float(s)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def stage_ratio_table(throughput: pd.DataFrame, accuracy: pd.DataFrame) -> pd.DataFrame:
    """Throughput and final accuracy vs stage-1 share: every OSP run with LGP (``point`` "sweep",
    osp_auto "auto") and BSP as share 1 ("bsp"); with :func:`median_over_seeds` tables also the seeds'
    ranges and ``seeds``."""
    if throughput.empty:
        return pd.DataFrame()
    keep = throughput[(throughput.method.isin(["osp", "osp_auto"])) | (throughput.scheduler == "ps_bsp")].copy()
    keep["point"] = keep.scheduler.map({"osp": "sweep", "osp_auto": "auto", "ps_bsp": "bsp"})
    final = accuracy.sort_values("epoch").groupby("run_id").last() if len(accuracy) else pd.DataFrame()
    keep["final_accuracy"] = keep.run_id.map(final["test_accuracy"]) if len(final) else np.nan
    for end in ("_min", "_max"):
        if f"test_accuracy{end}" in final:
            keep[f"final_accuracy{end}"] = keep.run_id.map(final[f"test_accuracy{end}"])
    keep["epochs"] = keep.run_id.map(final["epoch"]) if len(final) else np.nan
    keep["seeds"] = keep["seeds"].fillna(1).astype(int) if "seeds" in keep else 1
    cols = ["run_id", "method", "label", "point", "stage1_share", "stage1_bytes_share", "iteration_s",
            "throughput_samples_s", "speedup_vs_bsp", "final_accuracy", "epochs", "oversubscribed", "seeds"]
    cols += [c for c in ("throughput_samples_s_min", "throughput_samples_s_max", "final_accuracy_min",
                         "final_accuracy_max") if c in keep]
    return keep[cols].sort_values(["stage1_bytes_share", "point"], ignore_index=True)


def summary_table(throughput: pd.DataFrame, accuracy: pd.DataFrame) -> pd.DataFrame:
    """Per run: throughput, ``speedup_vs_bsp_pct``, final accuracy and ``accuracy_vs_bsp_pts``
    (percentage points), beside the paper's claim."""
    if throughput.empty:
        return pd.DataFrame()
    final = accuracy.sort_values("epoch").groupby("run_id").last() if len(accuracy) else pd.DataFrame()
    setting = [k for k in _SETTING if k in throughput.columns]
    df = throughput[["run_id", "method", "label", "stage1_bytes_share", "iteration_s", "throughput_samples_s",
                     "speedup_vs_bsp", "oversubscribed"] + setting].copy()
    df["speedup_vs_bsp_pct"] = 100 * (df["speedup_vs_bsp"] - 1)
    df["final_accuracy"] = df.run_id.map(final["test_accuracy"]) if len(final) else np.nan
    df["accuracy_vs_bsp_pts"] = 100 * (df["final_accuracy"] - _bsp_reference(df, "final_accuracy"))
    df["paper_claim_pct"] = PAPER_CLAIM_PCT
    return df.drop(columns=["speedup_vs_bsp"] + setting)
