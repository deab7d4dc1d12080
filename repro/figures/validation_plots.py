"""Figures of the validation study (:mod:`repro.studies.validation`): simulated vs measured iteration,
both predictions of every run (``simulated_s``, ``simulated_prerun_s``; ``simulated_inrun_s`` where
present) against its measurement.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from repro.figures.plots import flag_column
from repro.figures.style import (DARK_GREY, OVERSUBSCRIBED_HATCH, legend_below, mark_oversubscribed,
                                 ordered, oversubscribed_handle, scheduler_label, scheduler_style)

__all__ = ["plot_sim_vs_real", "SCHEDULER_ORDER"]

SCHEDULER_ORDER = ["wfbp", "syncea", "threshold", "ddp_buckets", "mgwfbp", "optimal", "ddp", "ddp_threshold"]
_NET_MARKERS = ["o", "s", "^", "v", "D", "P"]
PAPER_ALPHA = 0.35  # the warm-up paper model's bars: the scheduler's colour, light


def _num(df: pd.DataFrame, column: str) -> pd.Series:
    return pd.to_numeric(df[column], errors="coerce") if column in df else pd.Series(np.nan, index=df.index)


def plot_sim_vs_real(table: pd.DataFrame, note: str, band_pct: float = 10.0):
    """Predicted vs measured iteration (ms; y = x with a ±``band_pct``% band; hollow: the warm-up paper
    model, filled: the pre-run prediction with measured contention), and each run's error per model and
    network (light bar: paper model, solid: pre-run, diamonds: in-run-trace check). ``table``:
    :func:`repro.studies.validation.validation_table`."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.4), gridspec_kw={"width_ratios": [1, 1.6]})
    nets = list(dict.fromkeys(table.network))
    net_marker = {n: _NET_MARKERS[i % len(_NET_MARKERS)] for i, n in enumerate(nets)}
    schedulers = ordered(table.scheduler, SCHEDULER_ORDER)
    prerun = _num(table, "simulated_prerun_s")
    has_prerun = bool(prerun.notna().any())

    ax = axes[0]
    for (s, net), g in table.groupby(["scheduler", "network"], sort=False):
        color = scheduler_style(s)["color"]
        m_ms, p_ms = g.measured_s * 1e3, g.simulated_s * 1e3
        # hollow and larger, drawn on top: where both predictions coincide it rings the filled marker
        ax.scatter(m_ms, p_ms, facecolors="none", edgecolors=color, marker=net_marker[net], s=80,
                   linewidths=1.3, zorder=5)
        pr = _num(g, "simulated_prerun_s") * 1e3
        ok = pr.notna()
        if ok.any():
            ax.scatter(m_ms[ok], pr[ok], color=color, marker=net_marker[net], s=40, edgecolors="white",
                       linewidths=0.4, zorder=4)
            for x, y0, y1 in zip(m_ms[ok], p_ms[ok], pr[ok]):
                ax.plot([x, x], [y0, y1], color=color, lw=0.8, alpha=0.6, zorder=2)
        over = flag_column(g)
        if over.any():
            mark_oversubscribed(ax, m_ms[over], (pr.where(ok, p_ms))[over])
    values = pd.concat([table.measured_s, table.simulated_s, prerun.dropna()])
    lo, hi = 0.8 * values.min() * 1e3, 1.2 * values.max() * 1e3
    x = np.array([lo, hi])
    ax.plot(x, x, color="black", lw=1)
    ax.fill_between(x, x * (1 - band_pct / 100), x * (1 + band_pct / 100), color="grey", alpha=0.15, lw=0)
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="measured iteration (ms)", ylabel="predicted iteration (ms)")
    ax.set_title("each point: one run", fontsize="small")

    ax = axes[1]
    keys = ["model", "network"] + (["workers"] if table["workers"].nunique() > 1 else [])
    t = table.assign(case=table[keys[:2]].astype(str).agg("\n".join, axis=1)
                     + ("\nP=" + table.workers.astype(str) if len(keys) == 3 else ""))
    cases = list(dict.fromkeys(t.case))
    labels = []
    for case in cases:
        c = _num(t[t.case == case], "prerun_contention").dropna()
        labels.append(case + (f"\nc={c.iloc[0]:.2f}" if len(c) else ""))
    w = 0.86 / max(len(schedulers), 1)
    half = w / 2 if has_prerun else w
    has_inrun = False
    for k, s in enumerate(schedulers):
        g = t[t.scheduler == s].set_index("case").reindex(cases)
        xs = np.arange(len(cases)) + (k - (len(schedulers) - 1) / 2) * w
        color = scheduler_style(s)["color"]
        over = flag_column(g)
        paper_x = xs - half / 2 if has_prerun else xs
        bars = [ax.bar(paper_x, g.error_pct, half, color=color, alpha=PAPER_ALPHA, edgecolor=color, linewidth=0.6)]
        if has_prerun:
            bars.append(ax.bar(xs + half / 2, _num(g, "error_prerun_pct"), half, color=color, edgecolor="white",
                               linewidth=0.4))
        for group in bars:
            for bar, flag in zip(group, over):
                if flag:
                    bar.set_hatch(OVERSUBSCRIBED_HATCH)
        inrun = _num(g, "error_inrun_pct")
        if inrun.notna().any():
            has_inrun = True
            ax.scatter(xs, inrun, marker="D", s=22, facecolors="white", edgecolors="black", linewidths=1.0, zorder=5)
    ax.axhspan(-band_pct, band_pct, color="grey", alpha=0.15, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(cases)), labels, fontsize="small")
    ax.set_ylabel("(predicted - measured) / measured (%)")
    ax.set_title("prediction error per run", fontsize="small")
    ax.grid(axis="x", visible=False)

    handles = [Patch(facecolor=scheduler_style(s)["color"], label=scheduler_label(s)) for s in schedulers]
    handles += [Line2D([], [], ls="", marker=net_marker[n], color=DARK_GREY, label=f"network: {n}") for n in nets]
    handles.append(Line2D([], [], ls="", marker="o", markerfacecolor="white", markeredgecolor=DARK_GREY,
                          label="warm-up trace, paper model (hollow ring; light bars)", markersize=9))
    if has_prerun:
        handles.append(Line2D([], [], ls="", marker="o", color=DARK_GREY,
                              label="pre-run: + measured contention c (filled; solid bars)"))
    if has_inrun:
        handles.append(Line2D([], [], ls="", marker="D", markerfacecolor="white", markeredgecolor="black",
                              label="from the in-run trace (check)"))
    handles.append(Patch(facecolor="grey", alpha=0.15, label=f"±{band_pct:g}%"))
    if flag_column(table).any():
        handles.append(oversubscribed_handle("bar"))
    fig.suptitle(f"Predicted vs measured iteration time ({note})")
    legend_below(fig, handles, ncol=4)
    fig.tight_layout()
    return fig
