"""Figures ``omgs.convergence`` and ``omgs.breakdown`` of the OMGS-SGD training study, drawn from the
tables of :mod:`repro.studies.omgs_train` and returned as matplotlib Figures (the caller saves them).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from repro.figures.style import (DARK_GREY, OVERSUBSCRIBED_HATCH, PALETTE, add_gap_note, add_note,
                                 coinciding_lines, gap_lines, kind_color, legend_below, ordered,
                                 oversubscribed_handle, paper_handle, paper_marker_style, scheduler_style)

__all__ = ["STYLE_KEYS", "LABELS", "PHASE_STYLES", "omgs_style", "plot_convergence", "plot_breakdown"]

# Scheduler names of the runs -> the OMGS family's drawing styles (repro.figures.style).
STYLE_KEYS = {"wfbp": "ssgd", "ssgd": "ssgd", "topk": "topk_single"}
LABELS = {"wfbp": "S-SGD (dense, WFBP)", "topk_single": "TopK-SGD", "omgs": "OMGS-SGD",
          "topk_layerwise": "TopK-SGD, layer-wise", "omgs_optimal": "OMGS, exact optimum"}
SHORT = {"wfbp": "S-SGD", "topk_single": "TopK", "omgs": "OMGS", "topk_layerwise": "TopK-LW",
         "omgs_optimal": "OMGS-opt"}
# Bars bottom to top: (column, colour, label).
PHASE_STYLES = (("forward_s", kind_color("forward"), "forward"),
                ("backward_s", kind_color("backward"), "backward"),
                ("sparsify_s", kind_color("sparsify"), "sparsification (top-k)"),
                ("comm_exposed_s", kind_color("comm"), "communication (not overlapped)"),
                ("other_s", PALETTE[2], "other (optimizer update)"))
_ORDER = ("wfbp", "topk_layerwise", "topk_single", "omgs", "omgs_optimal")


def omgs_style(scheduler: str) -> dict:
    """``ax.plot`` keywords of a run's scheduler in this study (dense WFBP drawn as S-SGD)."""
    st = scheduler_style(STYLE_KEYS.get(scheduler, scheduler))
    st["label"] = LABELS.get(scheduler, st["label"])
    return st


# -- omgs.convergence

def _metric_columns(sub: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(column, axis label, panel title) of the three panels of one model."""
    lm = bool(sub["lm"].any()) if "lm" in sub else bool(sub["perplexity"].notna().any())
    per = "per token" if lm else "per sample"
    third = ("perplexity", "test perplexity", "test perplexity = exp(test loss)") if lm else \
        ("test_accuracy", "test accuracy", "test accuracy")
    return [("train_loss", f"cross-entropy {per}", "training loss (epoch mean)"),
            ("test_loss", f"cross-entropy {per}", "test loss"), third]


def plot_convergence(conv: pd.DataFrame, notes: dict[str, str] | None = None, title_note: str = ""):
    """One row per model: training loss, test loss and test accuracy (or perplexity) per epoch per
    scheduler. ``conv``: :func:`repro.studies.omgs_train.convergence_table`; several seeds give the median
    in a min-max band; ``notes`` adds text to a model's row heading. Coinciding curves stay visible and
    are named above their panel."""
    from repro.studies.omgs_train import seed_summary

    conv = seed_summary(conv)
    seeds = int(conv["seeds"].max()) if len(conv) else 1
    models = list(dict.fromkeys(conv["model"]))
    fig = plt.figure(figsize=(11.5, 3.3 * len(models) + 1.2), layout="constrained")
    rows = np.atleast_1d(fig.subfigures(len(models), 1, hspace=0.04))
    first = None
    for sf, m in zip(rows, models):
        sub = conv[conv["model"] == m]
        ds = ", ".join(str(d) for d in dict.fromkeys(sub["dataset"]))
        dens = sub[sub["scheduler"] != "wfbp"]["density"].dropna()
        dens_txt = f", density {dens.iloc[0]:g}" if len(dens) else ""
        sf.suptitle(f"{m} on {ds}{dens_txt}" + (f"; {notes[m]}" if notes and m in notes else ""), x=0.01,
                    ha="left", fontsize="medium")
        axes = sf.subplots(1, 3)
        first = first if first is not None else axes[0]
        for ax, (col, ylabel, title) in zip(axes, _metric_columns(sub)):
            names = ordered(sub["scheduler"], _ORDER)
            n = len(names)
            for k, s in enumerate(names):
                g = sub[sub["scheduler"] == s].sort_values("epoch")
                st = omgs_style(s)
                last = k == n - 1  # big hollow markers first, the last scheduler small and filled on top
                ax.plot(g["epoch"], g[col], color=st["color"], marker=st["marker"], ls=st["linestyle"],
                        ms=4.5 if last else 12 - 4 * k, markerfacecolor=st["color"] if last else "none",
                        markeredgewidth=1.0 if last else 1.6, lw=1.4 if last else 2.6 - 0.6 * k, zorder=2 + k,
                        label=st["label"])
                if seeds > 1 and f"{col}_min" in g:
                    ax.fill_between(g["epoch"], g[f"{col}_min"], g[f"{col}_max"], color=st["color"], alpha=0.15,
                                    lw=0, zorder=1)
            ax.set(xlabel="epoch", xticks=sorted(set(int(e) for e in sub["epoch"])))
            ax.set_ylabel(ylabel, fontsize="small")
            ax.set_title(title, fontsize="small")
            same = coinciding_lines(ax, rtol=1e-6)
            if same:
                names_same = list(dict.fromkeys(x for pair in same for x in pair))
                short = {omgs_style(s)["label"]: SHORT.get(s, s) for s in sub["scheduler"].unique()}
                add_note(ax, " = ".join(short.get(x, x) for x in names_same) + " (curves coincide)")
    spread = f"median of {seeds} seeds, band from the least to the largest" if seeds > 1 else "one seed"
    title_note = f"{title_note}; {spread}" if title_note else spread
    fig.suptitle("Convergence: dense S-SGD vs TopK-SGD vs OMGS-SGD" + f"\n({title_note})")
    legend_below(fig, axes=[first], ncol=3)
    return fig


# -- omgs.breakdown

#: points from a paper diamond's centre (size 90 pt², half-diagonal about 6.7 pt) to the bar label above it
_DIAMOND_CLEAR_PT = 7.5

_PHASE_NAMES = {"forward_s": "forward", "backward_s": "backward", "sparsify_s": "sparsification",
                "comm_exposed_s": "communication", "other_s": "optimizer update", "iteration_s": "iteration"}
#: the known reasons for a measured (tiny run) part far from the same run simulated
_TINY_REASONS = {
    "comm_exposed_s": "measured = the wait after the backward call (step - update), simulated = every all-gather "
                      "priced on the run's fitted line (cost.json) on a shared CPU whose timings move between runs",
    "sparsify_s": "measured from one recorded step (the run's last), simulated from the warm-up's timings",
    "other_s": "a part of a few ms, of the size of the shared CPU's timing noise",
}
_PAPER_REASON = ("our simulation runs on {gpu} traces that are roofline estimates, not measurements, and a fitted "
                 "1GbE all-gather preset; the paper measured its real cluster (data loading, framework overheads)")


def breakdown_gap_lines(table: pd.DataFrame) -> list[str]:
    """:func:`repro.figures.style.gap_lines` for :func:`plot_breakdown`'s table (tiny runs' parts over 1 ms
    and totals vs their simulation, paper-scale totals vs the paper's), plus a line wherever TopK-SGD and
    OMGS-SGD rank the other way measured than simulated."""
    out: list[str] = []
    if "panel" not in table:
        return out
    tiny = table[table["panel"] == "tiny"]
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for (m, s), g in tiny.groupby(["model", "scheduler"], sort=False):
        meas, sim = g[g["source"] == "measured"], g[g["source"] == "simulated"]
        if meas.empty or sim.empty:
            continue
        a, b = meas.iloc[0], sim.iloc[0]
        totals[(m, s)] = {"measured": float(a["iteration_s"]), "simulated": float(b["iteration_s"])}
        for col in ("iteration_s", *(c for c, _, _ in PHASE_STYLES)):
            if col in a and col in b:
                out += gap_lines([(f"{m} {SHORT.get(s, s)} {_PHASE_NAMES[col]} (tiny run vs its simulation)",
                                   a[col], b[col], _TINY_REASONS.get(col, ""))], min_value=1e-3)
    for m in dict.fromkeys(tiny["model"]):
        t, o = totals.get((m, "topk_single")), totals.get((m, "omgs"))
        if t and o and (o["measured"] - t["measured"]) * (o["simulated"] - t["simulated"]) < 0:
            word = "slower" if o["measured"] > t["measured"] else "faster"
            apart = abs(o["measured"] / t["measured"] - 1)
            why = (f"measured {apart:.0%} apart, within the shared CPU's run-to-run noise" if apart < 0.05 else
                   "the measured vs simulated communication above decides the order")
            out.append(f"{m}: measured OMGS {word} than TopK ({o['measured'] * 1e3:.3g} vs {t['measured'] * 1e3:.3g} ms), "
                       f"the opposite of the simulation ({o['simulated'] * 1e3:.3g} vs {t['simulated'] * 1e3:.3g} ms): "
                       + why)
    paper = table[(table["panel"] == "paper") & (table["source"] == "paper")]
    sim = table[(table["panel"] == "paper") & (table["source"] == "simulated")]
    for _, r in paper.iterrows():
        g = sim[(sim["model"] == r["model"]) & (sim["scheduler"] == r["scheduler"])]
        if g.empty:
            continue
        gpu = str(g["gpu"].iloc[0]) if "gpu" in g and g["gpu"].notna().any() else "GPU"
        out += gap_lines([(f"{r['model']} {SHORT.get(r['scheduler'], r['scheduler'])} iteration (paper vs our "
                           "simulation)", r["iteration_s"], g["iteration_s"].iloc[0], _PAPER_REASON.format(gpu=gpu))],
                         unit="s", scale=1.0)
    return out


def _estimate_note(table: pd.DataFrame) -> str:
    """"<GPU> traces are estimates (roofline), not measurements" when the paper panel simulates on them."""
    if "panel" not in table or "trace" not in table:
        return ""
    sim = table[(table["panel"] == "paper") & (table["source"] == "simulated")]
    if not sim["trace"].astype(str).str.endswith("-estimate").any():
        return ""
    gpu = str(sim["gpu"].dropna().iloc[0]) if "gpu" in sim and sim["gpu"].notna().any() else "the"
    return f"{gpu} traces are estimates (roofline), not measurements"


def _bars(ax, rows: pd.DataFrame, unit: float, unit_name: str, paper: pd.DataFrame | None = None):
    """Stacked bars of ``rows`` grouped by model; returns whether any bar is hatched (oversubscribed)."""
    models = list(dict.fromkeys(rows["model"]))
    x, ticks, labels, centres = 0.0, [], [], []
    any_over = False
    top = 0.0
    span = max([float(v) for v in rows["iteration_s"]]
               + ([float(v) for v in paper["iteration_s"]] if paper is not None and len(paper) else [])) * unit
    for m in models:
        sub = rows[rows["model"] == m]
        start = x
        for s in ordered(sub["scheduler"], _ORDER):
            for source in ("measured", "simulated"):
                for _, r in sub[(sub["scheduler"] == s) & (sub["source"] == source)].iterrows():
                    over = bool(r.get("oversubscribed", False))
                    any_over |= over
                    sim = source == "simulated"
                    bottom = 0.0
                    for col, color, _label in PHASE_STYLES:
                        v = float(r.get(col, 0.0) or 0.0)
                        if v != v or v <= 0:
                            continue
                        ax.bar(x, v * unit, 0.8, bottom=bottom, color=color, alpha=0.5 if sim else 1.0,
                               edgecolor=DARK_GREY if sim else "white", linewidth=0.8 if sim else 0.5,
                               linestyle="--" if sim else "-", hatch=OVERSUBSCRIBED_HATCH if over else None)
                        bottom += v * unit
                    total = float(r["iteration_s"]) * unit
                    top = max(top, total)
                    label_y, label_pt = total, 0.0
                    if paper is not None and len(paper):
                        p = paper[(paper["model"] == m) & (paper["scheduler"] == s)]
                        for v in p["iteration_s"]:
                            ax.scatter([x], [float(v) * unit], **paper_marker_style(STYLE_KEYS.get(s, s), size=90))
                            top = max(top, float(v) * unit)
                            d = float(v) * unit - total  # a diamond just below or above the bar's label:
                            if -0.045 * span < d < 0.06 * span:
                                label_y, label_pt = max(label_y, float(v) * unit), _DIAMOND_CLEAR_PT  # label above
                    ax.annotate(f"{total:.3g} {unit_name}", (x, label_y), xytext=(0, label_pt),
                                textcoords="offset points", ha="center", va="bottom", fontsize=6.5, color="#222222")
                    ticks.append(x)
                    labels.append(f"{SHORT.get(s, s)}\n{'sim.' if sim else 'meas.'}")
                    x += 1.0
        centres.append(((start + x - 1.0) / 2, m))
        x += 0.6
    ax.set_xticks(ticks, labels, fontsize=7.5)
    ax.grid(axis="x", visible=False)
    ax.set(ylim=(0, top * 1.16 if top > 0 else 1), ylabel=f"time per iteration ({unit_name})")
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for cx, m in centres:
        ax.text(cx, -0.2, m, transform=trans, ha="center", va="top", fontsize="small", fontweight="bold")
    ax.set_xlim(-0.7, x - 0.9)
    return any_over


def plot_breakdown(table: pd.DataFrame, tiny_note: str = "", paper_note: str = ""):
    """Stacked bars (forward, backward, sparsification, exposed communication, update; total on top):
    tiny-scale runs measured beside their simulation (ms), and the paper scale simulated (s) with the
    paper's iterations as diamonds; oversubscribed runs hatched. ``table``:
    :func:`repro.studies.omgs_train.breakdown_table` (column ``panel``: tiny / paper)."""
    tiny = table[(table["panel"] == "tiny")] if "panel" in table else table.iloc[0:0]
    paper_sim = table[(table["panel"] == "paper") & (table["source"] == "simulated")] if "panel" in table else table
    paper_vals = table[(table["panel"] == "paper") & (table["source"] == "paper")] if "panel" in table else None
    panels = [(tiny, 1e3, "ms", "measured, tiny scale\nsparsification: one recorded step (the run's last)"
                              + (f"\n{tiny_note}" if tiny_note else ""), None),
              (paper_sim, 1.0, "s", "simulated, paper scale" + (f"\n{paper_note}" if paper_note else "")
               + (f"\n{_estimate_note(table)}" if _estimate_note(table) else ""), paper_vals)]
    panels = [p for p in panels if len(p[0])]
    widths = [max(len(p[0]), 2) for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7.0, 0.62 * sum(widths) + 2.4), 5.0), squeeze=False,
                             gridspec_kw={"width_ratios": widths})
    any_over = False
    for ax, (rows, unit, unit_name, title, paper) in zip(axes.flat, panels):
        any_over |= _bars(ax, rows, unit, unit_name, paper)
        ax.set_title(title, fontsize="small")
    handles = [Patch(facecolor=color, label=label) for _col, color, label in PHASE_STYLES]
    grey = "#777777"
    handles += [Patch(facecolor=grey, edgecolor="white", label="measured (solid colours)"),
                Patch(facecolor=grey, alpha=0.5, edgecolor=DARK_GREY, linestyle="--",
                      label="simulated (light colours, dashed edge)")]
    if paper_vals is not None and len(paper_vals):
        handles.append(paper_handle("paper, measured iteration time (hollow diamond, scheduler's colour)"))
    if any_over:
        handles.append(oversubscribed_handle("bar"))
    fig.suptitle("Iteration breakdown: TopK-SGD vs OMGS-SGD (number on a bar: its total per iteration)")
    fig.tight_layout()
    legend_below(fig, handles, ncol=3, bbox_to_anchor=(0.5, -0.02))
    add_gap_note(fig, breakdown_gap_lines(table), head="More than 2x apart (measured vs simulated; paper vs simulated):")
    return fig
