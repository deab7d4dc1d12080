"""Figure ``validation.published``: published measured throughput against the simulator's paper-model
and calibrated predictions (:mod:`repro.studies.published`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from repro.figures.style import legend_below, scheduler_color, scheduler_label, scheduler_marker

__all__ = ["plot_published"]

_NETWORK_TITLES = {"10gbe": "10GbE (TCP)", "100gbib": "100Gb InfiniBand (RDMA)"}
_MODEL_TITLES = {"resnet50": "ResNet-50, batch 64/GPU", "bert_base": "BERT-Base, batch 64/GPU",
                 "bert_large": "BERT-Large, batch 8/GPU"}
_LINES = {"measured": "-", "calibrated (all rows fitted)": "--", "paper model": ":"}
_STRIP_ORDER = ["paper model", "calibrated (all rows fitted)", "calibrated, model held out",
                "calibrated, GPU count held out"]
_STRIP_SHORT = {"paper model": "paper\nmodel", "calibrated (all rows fitted)": "calibrated\n(fit)",
                "calibrated, model held out": "CV: model\nheld out", "calibrated, GPU count held out": "CV: GPUs\nheld out"}


def _label(method: str, scheduler: str) -> str:
    return f"{method} ({scheduler_label(scheduler)})" if isinstance(scheduler, str) and scheduler else method


def plot_published(long: pd.DataFrame, title: str = "", y_limit_pct: float = 60.0):
    """Rows: one per model (throughput vs GPUs: measured, calibrated, paper model; the fitted all-reduce
    methods), and a last row of relative errors of every row per prediction kind, one dot per row
    (validation-only methods hollow; rows beyond ``y_limit_pct`` drawn as triangles at the edge and
    counted). Columns: networks."""
    models = [m for m in _MODEL_TITLES if m in set(long.model)] + sorted(set(long.model) - set(_MODEL_TITLES))
    networks = [n for n in _NETWORK_TITLES if n in set(long.network)] + sorted(set(long.network) - set(_NETWORK_TITLES))
    fig, axes = plt.subplots(len(models) + 1, len(networks), figsize=(5.2 * len(networks), 3.0 * (len(models) + 1) + 1.2),
                             squeeze=False)
    fitted = long[long.fitted.astype(bool)]
    methods = list(dict.fromkeys(zip(fitted.method, fitted.scheduler)))
    for r, model in enumerate(models):
        for c, net in enumerate(networks):
            ax = axes[r][c]
            d = fitted[(fitted.model == model) & (fitted.network == net)]
            for method, sched in methods:
                m = d[d.method == method]
                if m.empty:
                    continue
                color = scheduler_color(sched)
                meas = m[m.prediction == "paper model"].sort_values("gpus")
                ax.plot(meas.gpus, meas.measured_samples_per_s, _LINES["measured"], color=color,
                        marker=scheduler_marker(sched), ms=5, lw=1.4)
                for kind in ("calibrated (all rows fitted)", "paper model"):
                    p = m[m.prediction == kind].sort_values("gpus")
                    ax.plot(p.gpus, p.predicted_samples_per_s, _LINES[kind], color=color, lw=1.3, alpha=0.9)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(set(d.gpus)) or [4, 8, 16, 32])
            ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
            ax.set_ylim(bottom=0)
            ax.set_title(f"{_MODEL_TITLES.get(model, model)} — {_NETWORK_TITLES.get(net, net)}", fontsize="small")
            ax.set(xlabel="GPUs (4 per node)", ylabel="samples/s (all GPUs)")
            ax.grid(alpha=0.3)
    rng = np.random.default_rng(0)
    for c, net in enumerate(networks):
        ax = axes[-1][c]
        d = long[long.network == net]
        kinds = [k for k in _STRIP_ORDER if k in set(d.prediction)]
        n_off: list[int] = []  # rows beyond the axis per kind, said under its tick (not over the triangles)
        ax.axhspan(-10, 10, color="0.85", zorder=0, lw=0)
        ax.axhline(0, color="0.4", lw=0.8)
        for i, kind in enumerate(kinds):
            k = d[d.prediction == kind]
            for (method, sched), g in k.groupby(["method", "scheduler"], sort=False):
                x = i + rng.uniform(-0.18, 0.18, len(g))
                color = scheduler_color(sched)
                y = 100 * g.error.to_numpy()
                off = np.abs(y) > y_limit_pct
                yy = np.clip(y, -y_limit_pct * 0.97, y_limit_pct * 0.97)
                if g.fitted.iloc[0]:
                    ax.scatter(x[~off], yy[~off], s=14, color=color, marker=scheduler_marker(sched), zorder=3, lw=0)
                else:
                    ax.scatter(x[~off], yy[~off], s=16, facecolors="none", edgecolors=color,
                               marker=scheduler_marker(sched), zorder=3, lw=0.9)
                # Rows beyond the axis: an arrow at the edge, in the method's colour.
                ax.scatter(x[off], yy[off], s=22, color=color, marker="^", zorder=3, lw=0,
                           alpha=1.0 if g.fitted.iloc[0] else 0.45)
            n_off.append(int((100 * k.error.abs() > y_limit_pct).sum()))
            inside = int((k[k.fitted.astype(bool)].error.abs() <= 0.10).sum())
            total = int(k.fitted.astype(bool).sum())
            ax.annotate(f"{inside}/{total}\nin ±10%", (i, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize="x-small")
        ax.set_xticks(range(len(kinds)))
        ax.set_xticklabels([_STRIP_SHORT[k] + (f"\n({n} off scale)" if n else "") for k, n in zip(kinds, n_off)],
                           fontsize="x-small")
        ax.set(xlim=(-0.5, len(kinds) - 0.5), ylim=(-y_limit_pct, y_limit_pct),
               ylabel="iteration time error (%)\npredicted / measured − 1\n(▲ at the edge: off scale)")
        ax.set_title(f"Every row, {_NETWORK_TITLES.get(net, net)}: error (grey band ±10%)", fontsize="small", pad=24)
        ax.grid(axis="y", alpha=0.3)
    handles = [Line2D([], [], color=scheduler_color(s), marker=scheduler_marker(s), lw=1.4, label=_label(m, s))
               for m, s in methods]
    others = list(dict.fromkeys(zip(long[~long.fitted.astype(bool)].method, long[~long.fitted.astype(bool)].scheduler)))
    handles += [Line2D([], [], color=scheduler_color(s), marker=scheduler_marker(s), lw=0, markerfacecolor="none",
                       label=f"{_label(m, s)}: validation only") for m, s in others]
    handles += [Line2D([], [], color="0.2", ls="-", label="published measurement"),
                Line2D([], [], color="0.2", ls="--", label="calibrated prediction"),
                Line2D([], [], color="0.2", ls=":", label="paper-model prediction")]
    fig.suptitle(title or "Published measurements vs the simulator (simulated; published numbers: ddl-benchmarks)")
    fig.tight_layout(rect=(0, 0.0, 1, 0.98))
    legend_below(fig, handles, ncol=3)
    return fig
