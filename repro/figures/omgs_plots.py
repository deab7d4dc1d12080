"""Figures of the OMGS-SGD simulation study, drawn from tables of :mod:`repro.studies.omgs_sim` and
returned as matplotlib Figures (the caller saves them); simulated titles name their cost mode
(:func:`repro.figures.mgwfbp_plots.cost_mode_label`).
"""

from __future__ import annotations

import textwrap
from functools import partial
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from repro.figures.mgwfbp_plots import _PLAIN, _log2_x, cost_mode_label
from repro.figures.plots import _gantt_ops, gantt
from repro.figures.style import (PALETTE, flat_brackets, kind_color, legend_below, ms_text, ordered,
                                 scheduler_style)

__all__ = ["PLANNER_ORDER", "planner_style", "planner_label", "plot_optimal_gap", "plot_timeline"]

PLANNER_ORDER: tuple[str, ...] = ("topk_layerwise", "topk_single", "omgs", "omgs_optimal")

# The sparse planners in the project's fixed styles (repro.figures.style), with labels saying which
# rule each is.
_LABELS = {"topk_layerwise": "Layer-wise top-k", "topk_single": "TopK-SGD (single top-k)",
           "omgs": "OMGS-SGD (published rule)", "omgs_optimal": "Optimum (ours: exact, contiguous merges)"}
_STYLES = {name: {**scheduler_style(name), "label": label} for name, label in _LABELS.items()}
_KIND_COLORS = {"sparse_allgather": PALETTE[2], "sparsify": PALETTE[4], "compress": PALETTE[4]}


def planner_style(name: str) -> dict:
    """``ax.plot`` keyword arguments of a sparse planner (colour, marker, linestyle, label, zorder)."""
    return dict(_STYLES.get(name) or scheduler_style(name))


def planner_label(name: str) -> str:
    return planner_style(name)["label"]


def _text_color(rgba) -> str:
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def plot_optimal_gap(sweep: pd.DataFrame, rule: str = "omgs", paper_density: dict | None = None,
                     cost_mode: str | None = None):
    """Per model, a heat map over workers x density of the published rule's gap to the exact optimum (%,
    with both bucket counts), and below it every planner's iteration ÷ the optimum's vs workers at
    ``paper_density[model]`` (default: the smallest density). ``sweep``:
    :func:`repro.studies.omgs_sim.sparse_sweep` with ``omgs_optimal``."""
    models = list(dict.fromkeys(sweep["model"]))
    n = len(models)
    fig, axes = plt.subplots(2, n, figsize=(max(3.3 * n, 6.6), 7.4), squeeze=False,
                             gridspec_kw={"height_ratios": [1.05, 1]})
    r = sweep[sweep["planner"] == rule]
    vmax = max(float(r["gap_pct"].max()), 1.0)
    norm = Normalize(0, vmax)
    cmap = plt.get_cmap("cividis_r")
    opt = sweep[sweep["planner"] == "omgs_optimal"].set_index(["model", "workers", "density"])["buckets"]
    image = None
    notes: list[str] = []
    for j, m in enumerate(models):
        ax = axes[0, j]
        g = r[r["model"] == m]
        ps, ds = sorted(set(g["workers"])), sorted(set(g["density"]))
        grid = g.pivot_table(index="workers", columns="density", values="gap_pct").reindex(index=ps, columns=ds)
        nb = g.pivot_table(index="workers", columns="density", values="buckets").reindex(index=ps, columns=ds)
        image = ax.imshow(grid.to_numpy(), cmap=cmap, norm=norm, aspect="auto", origin="lower")
        for a, p in enumerate(ps):
            for b, d in enumerate(ds):
                v = grid.iloc[a, b]
                if np.isnan(v):
                    continue
                ob = int(opt.get((m, p, d), -1))
                ax.text(b, a, f"{v:.1f}%\n{int(nb.iloc[a, b])} vs {ob}", ha="center", va="center", fontsize=7.5,
                        color=_text_color(cmap(norm(v))))
        ax.set_xticks(range(len(ds)), [f"{d:g}" for d in ds], fontsize="x-small")
        ax.set_yticks(range(len(ps)), [str(p) for p in ps], fontsize="small")
        ax.grid(False)
        ax.set_xlabel("density (k / elements)", fontsize="small")
        if j == 0:
            ax.set_ylabel("workers P")
        dev = str(g["device"].iloc[0]) if "device" in g and len(g) else ""
        ax.set_title(flat_brackets(f"{m} ({dev})") if dev else m, fontsize="small")

        ax = axes[1, j]
        d0 = (paper_density or {}).get(m, min(ds))
        sub = sweep[(sweep["model"] == m) & (np.isclose(sweep["density"], d0))]
        names = [p for p in PLANNER_ORDER if p in set(sub["planner"])]
        for name in names:
            s = sub[sub["planner"] == name].sort_values("workers")
            ax.plot(s["workers"], s["iteration_s"] / s["optimal_s"], **_line_kw(name))
        _log2_x(ax)
        ax.set(xticks=ps, yscale="log")
        ratio = sub["iteration_s"] / sub["optimal_s"]
        hi = max(float(ratio.max()) * 1.15, 1.3)
        # Below 1 only where a planner beats the planning model's optimum in the simulation (calibrated mode).
        lo = min(0.95, float(ratio.min()) * 0.97)
        ax.set_ylim(lo, hi)
        ticks = [t for t in ((1, 1.5, 2, 3, 5, 10, 20, 50) if hi > 3 else (1, 1.1, 1.25, 1.5, 2, 3)) if t <= hi]
        ticks = [t for t in (0.5, 0.7, 0.8, 0.9) if lo <= t < 0.95] + ticks
        ax.set_yticks(ticks)
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("workers P", fontsize="small")
        if j == 0:
            ax.set_ylabel("iteration ÷ optimum (log)")
        equal = _equal_points(sub, names)
        if equal:
            notes.append(f"{m}: {equal}")
        ax.set_title(f"density {d0:g}", fontsize="small")
    fig.subplots_adjust(top=0.86, bottom=0.13, left=0.07, right=0.9, hspace=0.45, wspace=0.28)
    top = axes[0, -1].get_position()
    cax = fig.add_axes([0.915, top.y0, 0.012, top.height])
    cb = fig.colorbar(image, cax=cax)
    cb.set_label("rule slower than optimum (%)", fontsize="small")
    handles = [Line2D([], [], **{k: v for k, v in planner_style(p).items() if k != "zorder"})
               for p in PLANNER_ORDER if p in set(sweep["planner"])]
    mode = cost_mode_label(sweep, cost_mode)
    fig.suptitle("The published OMGS rule vs the optimal sparse merge" + (f" (simulated, {mode})" if mode else ""),
                 fontsize="medium")
    fig.text(0.5, 0.935, "top: rule ÷ optimum − 1 per workers and density (cell: gap; buckets of the rule vs the "
             "optimum); bottom: each planner ÷ optimum at the paper's density", ha="center", va="top",
             fontsize="small", style="italic", color="#333333")
    legend_below(fig, handles, ncol=len(handles))
    if notes:
        fig.text(0.5, 0.045, "Drawn on top of each other (equal times): " + "; ".join(notes), ha="center", va="top",
                 fontsize="x-small", style="italic", color="#333333", wrap=True)
    return fig


def _line_kw(name: str) -> dict:
    st = planner_style(name)
    if name == "topk_single":  # hollow and larger: visible around the rule's markers where they coincide
        st.update(markerfacecolor="none", markersize=10, markeredgewidth=1.5, zorder=2.4)
    elif name == "omgs_optimal":
        st.update(markersize=8)
    else:
        st.update(markersize=6)
    return st


def _equal_points(sub: pd.DataFrame, names: Sequence[str]) -> str:
    """"a = b at P=..." for the pairs of planners whose iteration times coincide at some P (drawn on top
    of each other)."""
    t = sub.pivot_table(index="workers", columns="planner", values="iteration_s")
    short = {"topk_layerwise": "layer-wise", "topk_single": "TopK-SGD", "omgs": "rule", "omgs_optimal": "optimum"}
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            same = [int(p) for p in t.index if np.isclose(t.loc[p, a], t.loc[p, b], rtol=1e-9, atol=0)]
            if same:
                where = "every P" if len(same) == len(t.index) else "P=" + ",".join(map(str, same))
                out.append(f"{short.get(a, a)} = {short.get(b, b)} at {where}")
    return "; ".join(out)


def paper_timeline_text(ops: pd.DataFrame, paper: pd.DataFrame | None, claim_id: str = "") -> str:
    """TopK-SGD ÷ OMGS-SGD, published (``paper``: :func:`repro.studies.omgs_sim.paper_iterations` rows of the
    timeline's model) beside simulated (``ops``), with the verdict of ``claim_id``; "" without both."""
    if paper is None or not len(paper) or not {"topk_single", "omgs"} <= set(paper["planner"]):
        return ""
    sim = ops.groupby("planner")["iteration_s"].first()
    if not {"topk_single", "omgs"} <= set(sim.index):
        return ""
    pub = paper.groupby("planner")["paper_s"].first()
    pr, sr = float(pub["topk_single"] / pub["omgs"]), float(sim["topk_single"] / sim["omgs"])
    v = ""
    if claim_id:
        from repro.figures.claims import claim_verdict

        try:
            v = ", " + claim_verdict(claim_id, sr)
        except Exception:
            v = ""
    src = str(paper["citation"].iloc[0]).split(" (")[0] if "citation" in paper else "paper"
    return (f"TopK-SGD ÷ OMGS-SGD, paper ({src}, measured, {int(paper['workers'].iloc[0])} workers): "
            f"{pub['topk_single']:.3f} s ÷ {pub['omgs']:.3f} s = {pr:.2f}x; simulated: "
            f"{ms_text(sim['topk_single'])} ÷ {ms_text(sim['omgs'])} = {sr:.2f}x{v}. Dotted grey lines: the "
            "paper's iteration times.")


def plot_timeline(ops: pd.DataFrame, title: str, measured: pd.DataFrame | None = None, measured_title: str = "",
                  cost_mode: str | None = None, paper: pd.DataFrame | None = None, claim_id: str = ""):
    """One Gantt chart per planner (computation, sparsification, communication) on a shared time axis, its
    iteration marked. ``ops``: :func:`repro.studies.omgs_sim.timeline_table`; ``measured`` (same columns,
    :func:`repro.studies.omgs_sim.measured_timeline`) adds a panel per planner titled ``measured_title``;
    ``paper`` (:func:`repro.studies.omgs_sim.paper_iterations`) draws the published iterations and, under
    the title, both ratios with the verdict of ``claim_id``."""
    planners = ordered(ops["planner"], PLANNER_ORDER)
    mplanners = ordered(measured["planner"], PLANNER_ORDER) if measured is not None and len(measured) else []
    rows = ["compute", "sparsify", "comm"]
    n_sim, n_meas = len(planners), len(mplanners)
    head_text = textwrap.fill((measured_title or "measured") + ". " + SINGLE_STEP_NOTE, 105, break_on_hyphens=False)
    head_h = 0.55 + 0.3 * (head_text.count("\n") + 1)  # the measured header, in units of a panel's height
    heights = [1.0] * n_sim + ([head_h] if n_meas else []) + [0.85] * n_meas
    fig = plt.figure(figsize=(11.5, 1.45 * n_sim + (1.25 * n_meas + 1.45 * (head_h + 1) / 1.8 if n_meas else 0)
                              + 1.3))
    gs = fig.add_gridspec(len(heights), 1, height_ratios=heights, hspace=0.3)
    t_end = float(ops["iteration_s"].max())
    sim_axes = []
    for i, p in enumerate(planners):
        ax = fig.add_subplot(gs[i], sharex=sim_axes[0] if sim_axes else None)
        sim_axes.append(ax)
        sub = ops[ops["planner"] == p]
        gantt(ax, _drawable(sub, t_end), streams=rows, legend=False, kind_colors=_KIND_COLORS,
              label_min_width_frac=0.0)
        it = float(sub["iteration_s"].iloc[0])
        ax.axvline(it * 1e3, color="black", lw=1.0, ls="--")
        ax.text(it * 1e3, 0, f" {ms_text(it)}", ha="left", va="center", fontsize="small", fontweight="bold")
        nb = int(sub["buckets"].iloc[0]) if "buckets" in sub else 0
        pub = paper[paper["planner"] == p] if paper is not None and len(paper) else None
        extra = ""
        if pub is not None and len(pub):
            ps = float(pub["paper_s"].iloc[0])
            ax.axvline(ps * 1e3, color="0.45", lw=1.6, ls=":", zorder=5)
            extra = f"; paper (OMGS-SGD INFOCOM'20, measured): {ms_text(ps)}"
        ax.set_title(f"{planner_label(p)}: {nb} bucket{'s' if nb != 1 else ''}, iteration {ms_text(it)} "
                     f"(simulated){extra}", fontsize="small", loc="left")
        ax.set_yticklabels(["computation", "top-k", "all-gather"], fontsize="small")
        ax.tick_params(labelbottom=i == n_sim - 1)  # one time axis: labelled under the last panel
        ax.set_xlabel("time since the iteration start (ms), simulated" if i == n_sim - 1 else "")
    p_end = float(paper["paper_s"].max()) if paper is not None and len(paper) else 0.0
    sim_axes[0].set_xlim(0, max(t_end, p_end) * 1e3 * 1.08)
    if n_meas:
        head = fig.add_subplot(gs[n_sim])
        head.axis("off")
        head.set_title(head_text, loc="left", fontsize="medium", fontweight="bold", y=0.0, va="bottom")
        m_axes = []
        m_end = float(np.nanmax(measured["end_s"]))
        for i, p in enumerate(mplanners):
            ax = fig.add_subplot(gs[n_sim + 1 + i], sharex=m_axes[0] if m_axes else None)
            m_axes.append(ax)
            sub = measured[measured["planner"] == p]
            mrows = [r for r in rows if r in set(sub["row"])]
            gantt(ax, _drawable(sub, m_end), streams=mrows, legend=False, kind_colors=_KIND_COLORS,
                  label_min_width_frac=0.0)
            ax.set_yticklabels([{"compute": "step", "sparsify": "top-k", "comm": "all-gather"}[r] for r in mrows],
                               fontsize="small")
            it = float(sub["iteration_s"].iloc[0]) if "iteration_s" in sub else float("nan")
            if np.isfinite(it):
                ax.axvline(it * 1e3, color="black", lw=1.0, ls="--")
            ax.set_title(f"{planner_label(p)}, measured: {_one_step_text(sub)}", fontsize="small", loc="left")
            ax.tick_params(labelbottom=i == n_meas - 1)  # one time axis: labelled under the last panel
            ax.set_xlabel("time since the step start (ms), measured" if i == n_meas - 1 else "")
        m_axes[0].set_xlim(0, max(m_end, float(measured["iteration_s"].max())) * 1e3 * 1.08)
    seen = set(ops["kind"]) | (set(measured["kind"]) if n_meas else set())
    kinds = [k for k in ("forward", "backward", "sparsify", "sparse_allgather", "update") if k in seen]
    names = {"forward": "forward", "backward": "backward", "sparsify": "top-k selection (compute stream)",
             "sparse_allgather": "all-gather of values / indices", "update": "update (measured)"}
    handles = [Patch(facecolor=_KIND_COLORS.get(k) or kind_color(k), label=names[k]) for k in kinds]
    handles.append(Line2D([], [], color="black", ls="--", lw=1.0, label="iteration end"))
    line = paper_timeline_text(ops, paper, claim_id)
    if line:
        handles.append(Line2D([], [], color="0.45", ls=":", lw=1.6, label="paper (OMGS-SGD INFOCOM'20, measured)"))
    mode = cost_mode_label(ops, cost_mode)
    head = f"{title} ({mode})" if mode else title
    tie = tie_text(ops)
    line = " ".join(t for t in (tie, line) if t)
    fig.suptitle(flat_brackets(head) + ("\n" + textwrap.fill(line, 150) if line else ""), fontsize="medium")
    legend_below(fig, handles, ncol=min(len(handles), 4) if line else len(handles))
    top = 0.75 + (0.2 * (textwrap.fill(line, 150).count("\n") + 1) if line else 0)
    fig.subplots_adjust(top=1 - top / fig.get_figheight(), bottom=(1.1 if line else 0.9) / fig.get_figheight(),
                        left=0.09, right=0.98)
    return fig


def tie_text(ops: pd.DataFrame, rtol: float = 0.01) -> str:
    """"Layer-wise top-k and OMGS-SGD tie (769 vs 768 ms, within 1%)." for the simulated planners whose
    iterations are within ``rtol`` of each other (the exact optimum left out: it is drawn as the optimum);
    "" when none tie."""
    its = ops.groupby("planner", sort=False)["iteration_s"].first()
    names = [p for p in PLANNER_ORDER if p in its.index and p != "omgs_optimal"]
    parts = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x, y = float(its[a]), float(its[b])
            if abs(x - y) <= rtol * max(x, y):
                parts.append(f"{planner_label(a)} and {planner_label(b)} tie in the simulation "
                             f"({ms_text(x)} vs {ms_text(y)}, within {rtol:.0%}).")
    return " ".join(parts)


SINGLE_STEP_NOTE = ("Each panel is one recorded step of one run, not a speedup: single steps on shared CPU "
                    "cores vary, and the claims compare median steps over runs")


def _one_step_text(sub: pd.DataFrame) -> str:
    """A measured panel's title tail: the one step drawn, and the run's median step beside it when the
    table has it (:func:`repro.studies.omgs_sim.measured_timeline`)."""
    it = float(sub["iteration_s"].iloc[0]) if "iteration_s" in sub else float("nan")
    text = f"one step, {ms_text(it)}"
    med = float(sub["median_iteration_s"].iloc[0]) if "median_iteration_s" in sub else float("nan")
    if "median_step" in sub and bool(sub["median_step"].iloc[0]) and np.isfinite(med):
        n = int(sub["timed_steps"].iloc[0]) if "timed_steps" in sub else 0
        return (f"step {int(sub['drawn_step'].iloc[0]) + 1}{f' of {n}' if n else ''}, {ms_text(it)}: the one "
                f"closest to the run's median step ({ms_text(med)})")
    if np.isfinite(med):
        n = int(sub["timed_steps"].iloc[0]) if "timed_steps" in sub else 0
        text += f" (the run's median step{f' of {n}' if n else ''}: {ms_text(med)})"
    return text


# ops ready for gantt: only top-k bars at least 4.5% of the span wide keep their label
_drawable = partial(_gantt_ops, label_row="sparsify", min_label_frac=0.045)
