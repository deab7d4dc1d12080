"""The figure ``compare.schedulers``: every scheduler of the four papers on one footing, a heat map of
iteration time ÷ the fastest of each column, drawn from the tables of :mod:`repro.studies.compare`
(what the marks mean: ``docs/design/figures.md``). Saving is the caller's job.
"""

from __future__ import annotations

import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from repro.figures.style import OVERSUBSCRIBED_HATCH, OVERSUBSCRIBED_LABEL, ms_text, scheduler_label
from repro.studies.compare import EXACT, GROUPS, SCHEDULERS

__all__ = ["BEST_MARK", "BEST_SYNC_MARK", "CHANGES_MATH_MARK", "HEURISTIC_PLAN_MARK", "EXACT_NOTE", "row_label",
           "exact_note", "plot_compare"]

BEST_MARK = "\u2605"          # black star: fastest of the column
BEST_SYNC_MARK = "\u25c6"     # diamond: fastest keeping synchronous SGD's update (when the star changes it)
CHANGES_MATH_MARK = "\u2020"  # dagger: changes the update of synchronous SGD
HEURISTIC_PLAN_MARK = "\u2021"  # double dagger: an exact planner's row used a heuristic's plan (contention)
EXACT_NOTE = ("Exact planners (ours): optimal under their paper's contention-free model; the calibrated cost model "
              "adds contention they do not see, so each such row is the best of the exact plan and its family's "
              "heuristic plans, simulated under the cost model that judges them.")
_MISSING = "#e6e6e6"
_CMAP = "viridis_r"


def exact_note(simulated: pd.DataFrame) -> str:
    """:data:`EXACT_NOTE` plus, where an exact plan lost under the judging model, by how much (largest
    ``exact_plan_loss_pct`` per exact planner of ``simulated``); "" when no exact planner is in it."""
    if "scheduler" not in simulated or not simulated["scheduler"].isin(EXACT).any():
        return ""
    if "exact_plan_loss_pct" not in simulated:
        return EXACT_NOTE
    ex = simulated[simulated["scheduler"].isin(EXACT)]
    lost = ex[ex["exact_plan_loss_pct"] > 0]
    if lost.empty:
        return EXACT_NOTE + " Here the exact plan was the fastest in every configuration."
    parts = []
    for s, g in lost.groupby("scheduler", sort=False):
        r = g.loc[g["exact_plan_loss_pct"].idxmax()]
        parts.append(f"{s}'s own plan loses in {len(g)} of {int((ex['scheduler'] == s).sum())} configurations, "
                     f"by up to {r['exact_plan_loss_pct']:.1f}% ({r['model']}, P={int(r['workers'])}, "
                     f"{r['network']}: {r['plan_from']}'s plan used)")
    return f"{EXACT_NOTE} {HEURISTIC_PLAN_MARK}: " + "; ".join(parts) + "."


def row_label(scheduler: str, changes_math: bool) -> str:
    """``"name: Display name"`` with a dagger when the scheduler changes the update; exact planners say
    "(ours, exact)"."""
    label = scheduler_label(scheduler)
    text = scheduler if label == scheduler else f"{scheduler}: {label}"
    if scheduler in EXACT and "ours" not in text:
        text += " (ours, exact)"
    return f"{text} {CHANGES_MATH_MARK}" if changes_math else text


def _rows(names: Sequence[str]) -> list[tuple[str, str | None]]:
    """(text, scheduler) rows: a header row per group (scheduler None), then its schedulers."""
    out: list[tuple[str, str | None]] = []
    for group, members in GROUPS.items():
        present = [s for s in members if s in names]
        if present:
            out.append((group, None))
            out += [(s, s) for s in present]
    return out


NEAR_TIE = 5e-4  # a cell within this relative distance of the fastest but not it is written "≈1"


def _ratio_text(r: float, best: bool) -> str:
    if not best and r < 1 + NEAR_TIE:
        return "\u22481"
    return f"{r:.2f}" if r < 10 else f"{r:.0f}"


def _panel(ax, table: pd.DataFrame, rows, columns: list[tuple], column_keys: list[str], column_label, title: str,
           norm, cmap, *, hatch_oversubscribed: bool = False):
    """One heat map: ``columns`` are tuples of ``column_keys`` values."""
    n_r, n_c = len(rows), len(columns)
    ratio = np.full((n_r, n_c), np.nan)
    for j, key in enumerate(columns):
        sel = np.logical_and.reduce([(table[k] == v).to_numpy() for k, v in zip(column_keys, key)])
        col = table[sel].set_index("scheduler")
        for i, (_, s) in enumerate(rows):
            if s is None or s not in col.index:
                continue
            r = col.loc[s]
            ratio[i, j] = float(r["relative_to_best"])
            colour = cmap(norm(ratio[i, j]))
            lum = 0.2126 * colour[0] + 0.7152 * colour[1] + 0.0722 * colour[2]
            mark = BEST_MARK if bool(r["best"]) else (BEST_SYNC_MARK if bool(r["best_sync_sgd"]) else "")
            if str(r.get("plan_from", s)) not in ("", "nan", s):
                mark = HEURISTIC_PLAN_MARK + mark
            ax.text(j, i, _ratio_text(ratio[i, j], bool(r["best"])) + mark, ha="center", va="center", fontsize=8,
                    color="white" if lum < 0.45 else "black", fontweight="bold" if mark else "normal")
            if hatch_oversubscribed and bool(r.get("oversubscribed", False)):
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch=OVERSUBSCRIBED_HATCH,
                                       edgecolor="#555555", linewidth=0))
    header = np.array([s is None for _, s in rows])
    background = np.where(header[:, None], np.nan, np.where(np.isnan(ratio), 1.0, np.nan))
    ax.imshow(background, cmap=plt.matplotlib.colors.ListedColormap([_MISSING]), aspect="auto",
              interpolation="nearest", vmin=0, vmax=2)
    im = ax.imshow(np.ma.masked_invalid(ratio), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(n_c), [column_label(key) for key in columns], fontsize=7.5)
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", length=0, pad=2)
    ax.set_yticks(range(n_r))
    ax.tick_params(axis="y", length=0)
    ax.set_title(title, fontsize=9.5, pad=4)
    for i, (_, s) in enumerate(rows):
        if s is None:
            ax.axhline(i - 0.5, color="white", lw=2.5)
    ax.set(xlim=(-0.5, n_c - 0.5), ylim=(n_r - 0.5, -0.5))
    ax.grid(False)
    ax.spines[:].set_visible(False)
    return im


def plot_compare(simulated: pd.DataFrame, measured: pd.DataFrame | None = None, *, sim_note: str = "",
                 measured_note: str = "", vmax: float = 4.0, title: str | None = None):
    """The ``compare.schedulers`` figure from :func:`repro.studies.compare.simulated_table`
    and :func:`repro.studies.compare.measured_table` (None or empty: no measured panel). ``vmax``: the ratio
    at which the colour scale saturates (the number in the cell stays exact)."""
    if simulated is None or simulated.empty:
        raise ValueError("plot_compare needs a non-empty simulated table")
    measured = measured if measured is not None and not measured.empty else None
    tables = [simulated] + ([measured] if measured is not None else [])
    names = set().union(*(set(t["scheduler"]) for t in tables))
    rows = _rows([s for s in SCHEDULERS if s in names])
    changes = {s: not bool(k) for t in tables for s, k in zip(t["scheduler"], t["keeps_sync_sgd"])}

    networks = list(dict.fromkeys(simulated["network"]))
    models = list(dict.fromkeys(simulated["model"]))
    workers = sorted(set(int(p) for p in simulated["workers"]))
    sim_cols = [(m, p) for m in models for p in workers]
    panels = [("sim", net) for net in networks]
    m_cols: list[tuple] = []
    if measured is not None:
        m_cols = list(dict.fromkeys(zip(measured["model"], measured["link"], measured["workers"])))
        panels.append(("measured", None))
    widths = [len(sim_cols)] * len(networks) + ([max(1.6, 1.1 * len(m_cols))] if m_cols else [])
    cell_w, cell_h = 0.8, 0.31
    fig_w = 3.4 + cell_w * sum(widths) + 0.9
    fig_h = 1.8 + cell_h * len(rows)
    fig = plt.figure(figsize=(fig_w, fig_h))
    # Room in inches: row labels left, panel titles and column labels on top, the x labels below.
    gs = fig.add_gridspec(1, len(panels) + 1, width_ratios=widths + [0.18], wspace=0.06, left=3.3 / fig_w,
                          right=1 - 0.75 / fig_w, top=1 - 1.05 / fig_h, bottom=0.5 / fig_h)
    norm = LogNorm(vmin=1.0, vmax=max(vmax, 1.01), clip=True)
    cmap = plt.get_cmap(_CMAP)
    mode = str(simulated["cost_mode"].iloc[0]) if "cost_mode" in simulated else "calibrated"
    mode_text = {"calibrated": "calibrated", "paper": "paper model"}.get(mode, mode)
    im = None
    axes = []
    for k, (kind, net) in enumerate(panels):
        ax = fig.add_subplot(gs[0, k])
        axes.append(ax)
        if kind == "sim":
            t = simulated[simulated["network"] == net]
            best = t.groupby(["model", "workers"])["iteration_s"].min()

            def label(key, best=best):
                m, p = key
                b = best.get((m, p))
                return f"{m}\nP={p}\n{ms_text(b)}" if b is not None else f"{m}\nP={p}"

            label_net = str(t["network_label"].iloc[0]) if "network_label" in t else net
            used = str(t["cost_model"].iloc[0]) if "cost_model" in t else net
            via = f" \u2192 {used}" if used != net else ""
            title_k = f"simulated, {mode_text}: {label_net}\n(preset {net}{via})"
            im = _panel(ax, t, rows, sim_cols, ["model", "workers"], label, title_k, norm, cmap)
        else:
            mbest = measured.groupby(["model", "link", "workers"])["iteration_s"].min()

            def mlabel(key, best=mbest):
                m, link, w = key
                return f"{m}\n{w} workers\n{link}\n{ms_text(best.get((m, link, w)))}"

            _panel(ax, measured, rows, m_cols, ["model", "link", "workers"], mlabel,
                   "measured,\ntiny scale", norm, cmap, hatch_oversubscribed=True)
        if k == 0:
            ax.set_yticklabels([(text if s is None else row_label(s, changes.get(s, False))) for text, s in rows],
                               fontsize=8)
            for tick, (_, s) in zip(ax.get_yticklabels(), rows):
                if s is None:
                    tick.set_fontweight("bold")
                    tick.set_fontsize(8.5)
            ax.set_ylabel("scheduler (grouped by paper)", fontsize=9)
        else:
            ax.set_yticklabels([])
        ax.set_xlabel("model, workers P; fastest iteration of the column (ms)" if kind == "sim"
                      else "model, workers, link;\nfastest (ms)", fontsize=8)
    cax = fig.add_subplot(gs[0, -1])
    cb = fig.colorbar(im, cax=cax)
    ticks = [t for t in (1, 1.25, 1.5, 2, 3, 4, 6, 8) if t <= vmax]
    cb.set_ticks(ticks)
    cb.set_ticklabels([f"{t:g}" for t in ticks[:-1]] + [f"\u2265{ticks[-1]:g}"])
    cb.ax.tick_params(labelsize=8)
    cb.set_label("iteration time \u00f7 fastest of the column (log scale; 1 = fastest)", fontsize=8)
    cb.ax.minorticks_off()
    fig.suptitle(title or "Every scheduler of the four papers on one footing: iteration time relative to the fastest",
                 fontsize=10.5, y=1.0, va="bottom")

    handles = [Line2D([], [], ls="", marker="*", color="black", markersize=9, label="fastest of the column"),
               Line2D([], [], ls="", marker="D", color="black", markersize=5.5,
                      label="fastest keeping synchronous SGD's update (where the fastest changes it)"),
               Patch(facecolor="white", edgecolor="white",
                     label=f"{CHANGES_MATH_MARK} changes the update of synchronous SGD "
                           "(top-k; ASP, SSP, OSP staleness)"),
               Patch(facecolor="white", edgecolor="white",
                     label=f"\u22481: within {100 * NEAR_TIE:g}% of the fastest, not it")]
    if measured is not None:
        handles.append(Patch(facecolor=_MISSING, edgecolor="#bbbbbb", label="not run"))
        if bool(measured.get("oversubscribed", pd.Series(dtype=bool)).any()):
            handles.append(Patch(facecolor="white", edgecolor="#555555", hatch=OVERSUBSCRIBED_HATCH,
                                 label=OVERSUBSCRIBED_LABEL))
    if (simulated["plan_from"].astype(str) != simulated["scheduler"]).any() if "plan_from" in simulated else False:
        handles.append(Patch(facecolor="white", edgecolor="white",
                             label=f"{HEURISTIC_PLAN_MARK} exact planner's row: a heuristic's plan simulated faster "
                                   "under contention"))
    legend = fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False,
                        fontsize=8.5, handlelength=1.2)
    notes = [n for n in (sim_note, exact_note(simulated), measured_note) if n]
    if notes:
        # Under the legend: its bottom edge, known once drawn, in figure coordinates.
        fig.canvas.draw()
        bottom = fig.transFigure.inverted().transform(legend.get_window_extent().p0)[1]
        wrap = max(80, int(fig_w * 12))
        text = "\n".join(textwrap.fill(n, wrap) for n in notes)
        fig.text(0.5, bottom - 0.01, text, ha="center", va="top", fontsize=8, style="italic", color="#333333")
    return fig
