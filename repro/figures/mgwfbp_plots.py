"""Figures of the MG-WFBP study, drawn from tidy tables of :mod:`repro.studies.mgwfbp_sim`,
:mod:`repro.studies.mgwfbp_train` or :mod:`repro.studies.validation` and returned as matplotlib Figures
(the caller saves them). Simulated figures name their cost mode in the title (:func:`cost_mode_label`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from repro.costs.published_fits import mode_label
from repro.figures.plots import flag_column, gantt, scheduler_lines
from repro.figures.style import (DARK_GREY, GAP_FACTOR, OVERSUBSCRIBED_HATCH, PALETTE, add_gap_note, add_note,
                                 coinciding_lines, flat_brackets, gap_lines, hidden_markers, hidden_markers_text,
                                 legend_below, mark_oversubscribed, ordered, oversubscribed_handle, panel_figsize,
                                 paper_handle, paper_marker_style, scheduler_label, scheduler_style, sparse_log_ticks,
                                 wrap_paragraphs)

__all__ = ["plot_layer_sizes", "plot_cost_models", "plot_timeline", "plot_sim_speedup", "plot_optimal_gap",
           "plot_allreduce_fit", "plot_real_speedup", "plot_breakdown", "plot_threshold_sweep", "plot_convergence",
           "ALGORITHM_STYLES", "series_style", "cost_mode_label"]

_PLAIN = FuncFormatter(lambda v, _pos: f"{v:g}")  # 16, not 2^4

# All-reduce algorithms (not schedulers): colour, marker, line style, hollow marker.
ALGORITHM_STYLES: dict[str, dict] = {
    "ring": {"color": PALETTE[0], "marker": "o", "linestyle": "-", "mfc": None, "label": "ring"},
    "tree": {"color": PALETTE[1], "marker": "s", "linestyle": "--", "mfc": "none", "label": "binary tree"},
    "recursive_doubling": {"color": PALETTE[2], "marker": "^", "linestyle": "-.", "mfc": None,
                           "label": "recursive doubling"},
    "halving_doubling": {"color": PALETTE[3], "marker": "D", "linestyle": ":", "mfc": "none",
                         "label": "recursive halving-doubling"},
}

# Series that are not schedulers (networks, world sizes): colour-blind-safe colours, markers, dashes.
_SERIES_COLORS = (PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[4], PALETTE[9], PALETTE[5], PALETTE[3])
_SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_SERIES_DASHES = ("-", "--", "-.", ":", (0, (6, 2)), (0, (2, 1.5)), (0, (4, 1.5, 1, 1.5, 1, 1.5)))


def cost_mode_label(table: pd.DataFrame | None = None, cost_mode: str | None = None) -> str:
    """How a simulated figure names its cost mode (:func:`repro.costs.published_fits.mode_label`): ``cost_mode`` if
    given, else the modes in ``table``'s ``cost_mode`` column (rows without one, e.g. published values,
    ignored); ``""`` when neither says."""
    if cost_mode is not None:
        return mode_label(cost_mode)
    if table is None or "cost_mode" not in table:
        return ""
    return " + ".join(mode_label(m) for m in dict.fromkeys(table["cost_mode"].dropna()))


def series_style(i: int) -> dict:
    """The i-th style for series that are not schedulers (networks, world sizes, models)."""
    return {"color": _SERIES_COLORS[i % len(_SERIES_COLORS)], "marker": _SERIES_MARKERS[i % len(_SERIES_MARKERS)],
            "linestyle": _SERIES_DASHES[i % len(_SERIES_DASHES)]}


def _log2_x(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(_PLAIN)


def _net_label(net: str) -> str:
    """``10gbe-v100`` -> ``10GbE``, ``56gbib-v100`` -> ``56Gb IB``; other presets as they are."""
    return {"10gbe-v100": "10GbE", "56gbib-v100": "56Gb IB", "10gbe-k80": "10GbE (K80 constants)"}.get(net, net)


def k80_verdict_text(table: pd.DataFrame) -> str:
    """MG-WFBP ÷ WFBP at the largest published P per published model, as published and simulated, with
    claim ``mgwfbp.k80_<model>``'s verdict (a ratio within 1% of 1 is a tie); "" without published rows."""
    from repro.figures.claims import claim_verdict
    from repro.studies.mgwfbp_sim import k80_verdict_numbers

    nums = k80_verdict_numbers(table)
    parts = []
    for _, r in nums.iterrows():
        if np.isnan(r.simulated_ratio) or np.isnan(r.paper_ratio):
            continue
        name = str(r.model).split("@")[0]
        try:
            v = claim_verdict(f"mgwfbp.k80_{name}", float(r.simulated_ratio))
        except Exception:  # a model without a claim: numbers only
            v = ""
        tie = " (a tie)" if abs(r.simulated_ratio - 1.0) < 0.01 else ""
        parts.append(f"{name}: paper {r.paper_ratio:.2f}x, simulated {r.simulated_ratio:.2f}x{tie}"
                     + (f", {v}" if v else ""))
    if not parts:
        return ""
    p = int(nums["workers"].max())
    return f"MG-WFBP ÷ WFBP at {p} K80 nodes, paper (INFOCOM'19, measured) vs simulated: " + "; ".join(parts) + "."


#: area (points²) of the published values' hollow diamonds in the speedup panels: larger than the
#: simulated markers they sit on, which stay visible inside
PAPER_DIAMOND_SIZE = 150


def _pack_parts(text: str, width: int) -> list[str]:
    """``text`` split into lines of at most ``width`` characters (when possible) at its "; " separators
    only, so no clause (e.g. a verdict such as "direction only") is broken over two lines."""
    if not text:
        return []
    parts = text.split("; ")
    lines, cur = [], parts[0]
    for part in parts[1:]:
        if len(cur) + 2 + len(part) <= width:
            cur += "; " + part
        else:
            lines.append(cur + ";")
            cur = part
    return lines + [cur]


def plot_layer_sizes(layers: pd.DataFrame, curve: pd.DataFrame, hist_models: Sequence[str]):
    """Small multiples of parameters per learnable layer (log y, shared), one panel per model; below,
    the size histogram of ``hist_models``' layers with each network's all-reduce time on a second axis."""
    models = list(dict.fromkeys(layers["model"]))
    hist_models = list(hist_models)
    ncols = 3 if len(models) > 4 else max(1, len(models))
    nrows = -(-len(models) // ncols)
    hcols = max(1, len(hist_models))
    fig = plt.figure(figsize=(3.6 * max(ncols, hcols, 2), 1.75 * nrows + 3.4))
    outer = fig.add_gridspec(2, 1, height_ratios=[1.75 * nrows, 2.6], hspace=0.35)
    top = outer[0].subgridspec(nrows, ncols, hspace=0.75, wspace=0.12)
    first = None
    vmax = float(layers["params"].max()) if len(layers) else 1.0
    for i, m in enumerate(models):
        ax = fig.add_subplot(top[i // ncols, i % ncols], sharey=first)
        first = first or ax
        sub = layers[layers["model"] == m]
        ax.vlines(sub["layer"], 1, sub["params"], color=PALETTE[0], lw=max(0.4, min(2.0, 160 / max(len(sub), 1))))
        ax.set(yscale="log", ylim=(1, vmax * 3), xlim=(0, len(sub) + 1))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))
        ax.set_title(f"{m}: {len(sub)} layers, {sub['params'].sum() / 1e6:.1f}M", fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.grid(axis="x", visible=False)
        if i % ncols:
            ax.tick_params(labelleft=False)
        else:
            ax.set_ylabel("parameters", fontsize="small")
        if i // ncols == nrows - 1 or i + ncols >= len(models):
            ax.set_xlabel("layer (forward order)", fontsize="small")
    bottom = outer[1].subgridspec(1, hcols, wspace=0.45)
    bins = np.logspace(1, 9, 33)
    handles = []
    for j, m in enumerate(hist_models):
        axh = fig.add_subplot(bottom[0, j])
        sub = layers[layers["model"] == m]
        axh.hist(sub["bytes"], bins=bins, color=PALETTE[7], alpha=0.8)
        axh.set(xscale="log", xlabel="gradient bytes per layer", ylabel="layers")
        axh.set_title(f"{m}: layer sizes and all-reduce time", fontsize="small")
        axt = axh.twinx()
        for k, (net, c) in enumerate(curve.groupby("network", sort=False)):
            st = series_style(k + 3)
            line, = axt.plot(c["bytes"], c["allreduce_s"] * 1e3, color=st["color"], ls=st["linestyle"], lw=1.8,
                             label=f"all-reduce time, {net} (P={int(c['workers'].iloc[0])})")
            if j == 0:
                handles.append(line)
        axt.set(yscale="log", ylabel="all-reduce time (ms)")
        axt.grid(False)
    handles.insert(0, Patch(facecolor=PALETTE[7], alpha=0.8, label="layers per size bin (left axis)"))
    fig.suptitle("Gradient size per learnable layer", y=0.995)
    legend_below(fig, handles, ncol=len(handles))
    fig.subplots_adjust(top=0.93, bottom=0.1, left=0.07, right=0.93)
    return fig


def plot_cost_models(table: pd.DataFrame, hop_note: str = "", paper_fits: pd.DataFrame | None = None):
    """Start-up a and per-byte b of each all-reduce algorithm vs P (two panels; coinciding algorithms named
    in a note), with ``paper_fits`` (:func:`repro.studies.mgwfbp_sim.paper_allreduce_fits`) as diamonds."""
    with_paper = paper_fits is not None and len(paper_fits) > 0
    columns = ((0, "a_s", 1e3), (1, "b_s_per_byte", 1e9))  # panel, column, scale to ms and ns/byte
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.3 if with_paper else 4.0))
    for algo, g in table.groupby("algorithm", sort=False):
        st = ALGORITHM_STYLES.get(algo, {"color": DARK_GREY, "marker": "x", "linestyle": "-", "mfc": None,
                                         "label": algo.replace("_", " ")})
        g = g.sort_values("workers")
        for i, col, scale in columns:
            kw = {"markerfacecolor": st["mfc"]} if st["mfc"] else {}
            axes[i].plot(g["workers"], g[col] * scale, marker=st["marker"], ms=6 if st["mfc"] else 4,
                    color=st["color"], ls=st["linestyle"], lw=1.6, label=st["label"], **kw)
    for ax, ylabel, title in ((axes[0], "start-up a (ms)", "start-up a"),
                              (axes[1], "per-byte b (ns/byte)", "per-byte b")):
        _log2_x(ax)
        ax.set(yscale="log", xlabel="workers P", ylabel=ylabel, title=title)
        same = coinciding_lines(ax)
        if same:
            add_note(ax, "; ".join(f"{a} = {b}: drawn on top of each other" for a, b in same))
    if with_paper:
        for k, (net, g) in enumerate(paper_fits.groupby("paper_network", sort=False)):
            g = g.sort_values("workers")
            color = series_style(k + 4)["color"]
            for i, col, scale in columns:
                axes[i].scatter(g["workers"], g[col] * scale, **{**paper_marker_style(None, size=60 if k else 90),
                                                                 "edgecolors": color},
                                label=f"paper fit, {net} (MG-WFBP TPDS'21, V100, NCCL)")
    for ax in axes:  # ticks thinned to what the decades drawn leave room for (1, 2, 5 x 10^k on a short range)
        sparse_log_ticks(ax.yaxis)
    fig.suptitle("All-reduce cost T(M) = a + b·M by algorithm" + (f"\n{hop_note}" if hop_note else ""))
    legend_below(fig, axes=[axes[0]], ncol=3 if with_paper else 4)
    fig.tight_layout()
    if with_paper:
        add_gap_note(fig, cost_model_gap_lines(table, paper_fits),
                     head=f"Paper fits vs the ring line more than {GAP_FACTOR:g}x apart (the lines are the conference "
                          "paper's per-hop constants, the diamonds the journal's fits of NCCL on V100 clusters: other "
                          "hardware, and NCCL pipelines its ring):")
    return fig


def cost_model_gap_lines(table: pd.DataFrame, paper_fits: pd.DataFrame, algorithm: str = "ring") -> list[str]:
    """:func:`repro.figures.style.gap_lines` of each paper fit's per-byte b against ``algorithm``'s line at
    the same P (ns/byte)."""
    line = table[table["algorithm"] == algorithm].set_index("workers")["b_s_per_byte"]
    items = [(f"b at P={int(r.workers)}, {r.paper_network}", r.b_s_per_byte, line[r.workers], "")
             for r in paper_fits.itertuples() if r.workers in line.index]
    return [ln.replace("measured", "paper fit").replace("predicted", f"{algorithm} line")
            for ln in gap_lines(items, unit="ns/B", scale=1e9)]


def plot_timeline(ops: pd.DataFrame, title: str, cost_mode: str | None = None):
    """One Gantt chart per scheduler (rows: compute, comm), on one time axis; buckets labelled, layers not.
    The title ends with the cost mode (``cost_mode``, else the table's column; :func:`cost_mode_label`)."""
    col = "scheduler" if "scheduler" in ops else "solver"
    schedulers = list(dict.fromkeys(ops[col]))
    fig, axes = plt.subplots(len(schedulers), 1, figsize=(11, 1.6 * len(schedulers) + 1.0), sharex=True)
    axes = np.atleast_1d(axes)
    ops = ops.assign(label=ops["label"].where(ops["stream"] != "compute", ""))
    for i, (ax, s) in enumerate(zip(axes, schedulers)):
        sub = ops[ops[col] == s]
        gantt(ax, sub, streams=["compute", "comm"], legend=(i == 0), label_min_width_frac=0.04)
        ax.set_ylabel(f"{scheduler_label(s)}\n{sub['iteration_s'].iloc[0] * 1e3:.1f} ms", rotation=0,
                      ha="right", va="center")
        if i < len(schedulers) - 1:
            ax.set_xlabel("")
    axes[0].set_xlim(0, ops["end_s"].max() * 1e3 * 1.01)
    mode = cost_mode_label(ops, cost_mode)
    fig.suptitle(flat_brackets(f"{title} ({mode})" if mode else title))
    fig.tight_layout()
    return fig


def plot_sim_speedup(table: pd.DataFrame, paper: pd.DataFrame | None = None,
                     paper_models: Mapping[str, str] | Sequence[str] = (), cost_mode: str | None = None):
    """Speedup vs workers, one cell per model x network: the speedup (log-log) with published values as
    hollow diamonds, and below it each scheduler's speedup ÷ the best at that P. ``table``:
    :func:`repro.studies.mgwfbp_sim.sim_speedup_table` (``origin`` "paper" rows are published values), or
    a bare sweep plus ``paper`` and ``paper_models``. The title names the cost mode."""
    from repro.studies.mgwfbp_sim import sim_speedup_table

    if paper is not None:
        table = sim_speedup_table(table[table.get("origin", "simulated") != "paper"] if "origin" in table else table,
                                  paper, paper_models)
    if "origin" not in table:
        table = table.assign(origin=np.where(table["scheduler"] == "linear", "ideal", "simulated"))
    if "relative_to_best" not in table:
        sim = table["origin"] == "simulated"
        best = table[sim].groupby(["model", "network", "workers"])["speedup"].transform("max")
        table = table.assign(relative_to_best=np.nan)
        table.loc[sim, "relative_to_best"] = table.loc[sim, "speedup"] / best
    drawn = table[table["origin"] != "paper"]
    published = table[table["origin"] == "paper"]
    combos = drawn[["model", "network"]].drop_duplicates().values.tolist()
    nrow, ncol, (w, h) = panel_figsize(len(combos), panel=(3.5, 3.6), max_cols=4, extra_height=1.2)
    fig = plt.figure(figsize=(w, h))
    outer = fig.add_gridspec(nrow, ncol, hspace=0.38, wspace=0.3)
    order = ["linear", "wfbp", "syncea", "threshold", "ddp_buckets", "mgwfbp", "optimal"]
    for i, (model, net) in enumerate(combos):
        cell = outer[i // ncol, i % ncol].subgridspec(2, 1, height_ratios=[2.1, 1], hspace=0.08)
        ax = fig.add_subplot(cell[0])
        axr = fig.add_subplot(cell[1], sharex=ax)
        sub = drawn[(drawn["model"] == model) & (drawn["network"] == net)]
        names = ordered(sub["scheduler"], order)
        scheduler_lines(ax, sub, x="workers", y="speedup", hue="scheduler", order=names, logx=True, legend=False)
        rel = sub[sub["origin"] == "simulated"]
        scheduler_lines(axr, rel, x="workers", y="relative_to_best", hue="scheduler",
                        order=[s for s in names if s != "linear"], logx=True, legend=False)
        pub = published[(published["model"] == model) & (published["network"] == net)]
        for s, g in pub.groupby("scheduler"):
            # big enough that the simulated marker of the same scheduler stays visible inside it
            ax.scatter(g["workers"], g["speedup"], **paper_marker_style(s, size=PAPER_DIAMOND_SIZE))
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.set_title(f"{model} · {net}", fontsize="small")
        ax.tick_params(labelbottom=False, labelsize="x-small")
        ax.set_xlabel("")
        ax.set_ylabel("speedup" if i % ncol == 0 else "", fontsize="small")
        axr.set(ylim=(0, 1.08), yticks=[0, 0.5, 1.0])
        axr.tick_params(labelsize="x-small")
        axr.set_ylabel("÷ best" if i % ncol == 0 else "", fontsize="small")
        axr.set_xlabel("workers", fontsize="small")
    handles = [Line2D([], [], **{k: v for k, v in scheduler_style(s).items() if k != "zorder"})
               for s in order if s in set(drawn["scheduler"])]
    if len(published):
        handles.append(paper_handle("paper (MG-WFBP INFOCOM'19, measured; hollow diamonds)"))
    mode = cost_mode_label(drawn, cost_mode)
    fig.suptitle(f"Speedup vs number of GPUs (simulated{', ' + mode if mode else ''}); lower panels: each "
                 "scheduler's speedup ÷ the best one's at that P", y=0.995)
    sub_text = ("Coinciding curves (e.g. Optimal on MG-WFBP, Fixed threshold on SyncEASGD when the model is below "
                "the threshold) are drawn in order: dotted Optimal on top; every value is in the table.")
    if any(str(n).endswith("-derived") for n in drawn["network"].unique()):
        sub_text += ("\nNetworks: 10gbe-/56gbib-derived = per-hop ring α, β derived from the MG-WFBP journal's "
                     "P=16 all-reduce fits on 10GbE / 56 Gb IB (our interpretation).")
    n_sub = sub_text.count("\n") + 1
    fig.text(0.5, 1 - 0.36 / h, sub_text, ha="center", va="top", fontsize="small", style="italic", color="#333333")
    verdict_lines = _pack_parts(k80_verdict_text(table), int(w * 14))
    if verdict_lines:
        fig.text(0.5, 1 - (0.40 + 0.2 * n_sub) / h, "\n".join(verdict_lines), ha="center", va="top",
                 fontsize="small", color="#333333")
    legend_below(fig, handles, ncol=min(len(handles), 4))
    top_in = 0.85 + 0.2 * n_sub + 0.2 * len(verdict_lines)
    fig.subplots_adjust(top=1 - top_in / h, bottom=0.7 / h, left=0.06, right=0.98)
    return fig


def plot_optimal_gap(gap: pd.DataFrame, cost_mode: str | None = None):
    """Left: every configuration's gap of the MG-WFBP rule to the exact optimum, one row per model
    (points jittered, one colour and marker per network). Right: the largest gap over models vs P.
    The title names the cost mode (``cost_mode``, else the table's column; :func:`cost_mode_label`)."""
    nets = list(dict.fromkeys(gap["network"]))
    models = sorted(dict.fromkeys(gap["model"]))
    fig, axes = plt.subplots(1, 2, figsize=(10.5, max(4.2, 0.42 * len(models) + 2.4)),
                             gridspec_kw={"width_ratios": [1.7, 1]})
    ax = axes[0]
    rng = np.random.default_rng(0)
    step = 0.8 / max(len(nets), 1)
    for k, net in enumerate(nets):
        g = gap[gap["network"] == net]
        y = g["model"].map({m: i for i, m in enumerate(models)}).to_numpy(dtype=float)
        y = y - 0.4 + step * (k + 0.5) + rng.uniform(-step / 3, step / 3, size=len(y))
        st = series_style(k)
        ax.scatter(g["gap_pct"], y, s=14, color=st["color"], marker=st["marker"], alpha=0.85, label=net, lw=0)
    ax.set_yticks(range(len(models)), models, fontsize="small")
    ax.set(ylim=(len(models) - 0.5, -0.5), xlabel="MG-WFBP slower than the optimum (%)", ylabel="")
    ax.set_title("every model x network x P", fontsize="small")
    for k, (net, g) in enumerate(gap.groupby("network", sort=False)):
        st = series_style(nets.index(net))
        m = g.groupby("workers")["gap_pct"].max()
        axes[1].plot(m.index, m.to_numpy(), color=st["color"], marker=st["marker"], ls=st["linestyle"], ms=4,
                     label=net)
    _log2_x(axes[1])
    axes[1].set(xlabel="workers P", ylabel="largest gap over models (%)")
    axes[1].set_title("worst case per P", fontsize="small")
    mode = cost_mode_label(gap, cost_mode)
    fig.suptitle(f"Gap of the MG-WFBP rule to the exact optimal merge (simulated{', ' + mode if mode else ''})")
    legend_below(fig, axes=[ax], ncol=len(nets), title="network preset", markerscale=1.6)
    fig.tight_layout()
    return fig


# -- Measured (training) figures

def _paper_fit_panel(ax, paper_fits: pd.DataFrame) -> list:
    """The published a + b*M lines (one colour per P; 10GbE solid, 56Gb IB dashed; identical intra-node
    lines drawn once) over 1 KB to 1 GB; returns the legend handles."""
    x = np.geomspace(1e3, 1e9, 80)
    handles = []
    ps = sorted(set(paper_fits["workers"]))
    dashes = {}
    for _, r in paper_fits.sort_values(["workers", "network"]).iterrows():
        same = paper_fits[(paper_fits.workers == r.workers) & (paper_fits.a_s == r.a_s)
                          & (paper_fits.b_s_per_byte == r.b_s_per_byte)]
        if len(same) > 1 and r.network != same.network.iloc[0]:
            continue  # drawn once for both networks
        nets = " = ".join(str(n) for n in dict.fromkeys(same.paper_network)) if len(same) > 1 else r.paper_network
        ls = dashes.setdefault(r.paper_network, "-" if not dashes else "--") if len(same) == 1 else ":"
        st = series_style(ps.index(r.workers))
        line, = ax.plot(x, (r.a_s + r.b_s_per_byte * x) * 1e3, color=st["color"], ls=ls, lw=1.6,
                        label=f"paper P={int(r.workers)}, {nets}: a={r.a_s * 1e6:.3g} µs, "
                              f"b={r.b_s_per_byte * 1e9:.3g} ns/B")
        handles.append(line)
    ax.set(xscale="log", yscale="log", xlabel="message bytes", ylabel="all-reduce time (ms)")
    src = str(paper_fits["source"].iloc[0]).split(" (")[0] if len(paper_fits) else ""
    ax.set_title(f"paper ({src}): published fits,\n4 nodes x 4 V100, NCCL", fontsize="small")
    return handles


def plot_allreduce_fit(errors: pd.DataFrame, fits: pd.DataFrame, note: str, paper_fits: pd.DataFrame | None = None):
    """Measured all-reduce seconds vs bytes per world size with the fitted a + b*M line (log-log), the
    fit's relative error per size, and with ``paper_fits``
    (:func:`repro.studies.mgwfbp_sim.paper_allreduce_fits`) the journal's published fits. ``errors``:
    :func:`repro.studies.mgwfbp_train.allreduce_fit_errors`; ``fits``: ``allreduce_fit_table``.
    """
    if "measured_s" not in errors and "seconds" in errors:  # raw times
        from repro.studies.mgwfbp_train import allreduce_fit_errors

        errors = allreduce_fit_errors(errors, fits)
    with_paper = paper_fits is not None and len(paper_fits) > 0
    if with_paper:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.3, 1, 1.3]})
    else:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
    any_over = False
    for k, (p, g) in enumerate(errors.groupby("workers")):
        st = series_style(k)
        f = fits[fits["workers"] == p].iloc[0]
        over = bool(flag_column(g).any())
        any_over |= over
        tag = " (oversubscribed)" if over else ""
        axes[0].scatter(g["bytes"], g["measured_s"] * 1e3, color=st["color"], marker=st["marker"], s=26, zorder=3,
                        label=f"P={p} measured{tag}")
        x = np.geomspace(g["bytes"].min(), g["bytes"].max(), 60)
        axes[0].plot(x, (f.a_s + f.b_s_per_byte * x) * 1e3, color=st["color"], ls=st["linestyle"], lw=1.4,
                     label=f"P={p} fit: a={f.a_s * 1e6:.0f} µs, b={f.b_s_per_byte * 1e9:.2f} ns/B")
        axes[1].plot(g["bytes"], g["relative_error"] * 100, color=st["color"], marker=st["marker"],
                     ls=st["linestyle"], ms=5, label=f"P={p}")
        if over:
            mark_oversubscribed(axes[0], g["bytes"], g["measured_s"] * 1e3)
            mark_oversubscribed(axes[1], g["bytes"], g["relative_error"] * 100)
    axes[0].set(xscale="log", yscale="log", xlabel="message bytes", ylabel="all-reduce time (ms)")
    axes[0].set_title("ours: measured and fitted (relative-error fit)", fontsize="small")
    axes[1].set_xscale("log")
    axes[1].axhline(0, color="black", lw=0.8)
    lim = max(5.0, float(np.nanmax(np.abs(errors["relative_error"]))) * 100 * 1.25) if len(errors) else 5.0
    axes[1].set(ylim=(-lim, lim), xlabel="message bytes", ylabel="fit error: fitted / measured - 1 (%)")
    axes[1].set_title("relative error of the fit per size", fontsize="small")
    handles = axes[0].get_legend_handles_labels()[0] + ([oversubscribed_handle()] if any_over else [])
    if with_paper:
        handles += _paper_fit_panel(axes[2], paper_fits)
    fig.suptitle(f"All-reduce on the live process group ({note})"
                 + ("; right: the paper's fitted lines" if with_paper else ""))
    legend_below(fig, handles, ncol=3 if with_paper else 2)
    fig.tight_layout()
    return fig


def plot_real_speedup(speedup: pd.DataFrame, note: str, paper: pd.DataFrame | None = None):
    """Measured speedup vs workers, one panel per model. With ``paper``
    (:func:`repro.studies.mgwfbp_sim.k80_speedup_table`): a panel per published model with the conference
    paper's speedups beside our simulation of that setting, and the claim's verdict under the title."""
    models = list(dict.fromkeys(speedup["model"]))
    pub_models = [] if paper is None or not len(paper) else \
        list(dict.fromkeys(paper[paper["origin"] == "paper"]["model"]))
    n = max(len(models), len(pub_models))  # columns; the published panels get a row of their own
    fig, axes = plt.subplots(2 if pub_models else 1, n, figsize=(4.0 * n + 0.6, 7.6 if pub_models else 3.8),
                             squeeze=False)
    for ax in list(axes[0][len(models):]) + (list(axes[1][len(pub_models):]) if pub_models else []):
        ax.set_visible(False)
    axes = np.array(list(axes[0][:len(models)]) + (list(axes[1][:len(pub_models)]) if pub_models else []))
    order = ["linear", "wfbp", "syncea", "threshold", "ddp_buckets", "ddp", "ddp_threshold", "mgwfbp", "optimal"]
    tiny = "tiny" in note
    panels = [(m, speedup[speedup.model == m], None) for m in models] + \
        [(m, g[g.origin != "paper"], g[g.origin == "paper"]) for m in pub_models for g in [paper[paper.model == m]]]
    for ax, (m, sub, pub) in zip(axes.flat, panels):
        names = ordered(sub.scheduler, order) if pub is None else [s for s in order if s in set(sub.scheduler)]
        scheduler_lines(ax, sub, x="workers", y="speedup", hue="scheduler", order=names, logx=True, legend=False)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.set(xticks=sorted(set(sub.workers if pub is None else pub.workers)), ylabel="speedup (log scale)")
        if pub is None:
            ax.set_xlabel("workers (ranks)")
            ax.set_title(f"{m} (ours, measured{', tiny' if tiny else ''})", fontsize="small")
            continue
        for s_, g in pub.groupby("scheduler"):
            ax.scatter(g["workers"], g["speedup"], **paper_marker_style(s_, size=80))
        ax.set_xlabel("K80 nodes")
        b = pub["batch_size"].dropna()
        ax.set_title(f"{m}{f' (batch {int(b.iloc[0])})' if len(b) else ''}, K80, 10GbE:\n"
                     "paper (INFOCOM'19, measured) vs simulated", fontsize="small")
    handles = {}  # label -> handle: the first panel's, then the published panels' new ones
    for ax in [axes.flat[0], *list(axes.flat)[len(models):]]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    handles = list(handles.values())
    if pub_models:
        handles.append(paper_handle("paper (MG-WFBP INFOCOM'19, measured; hollow diamonds); lines in the K80 panels: "
                                    "simulated"))
    if flag_column(speedup).any():
        handles.append(oversubscribed_handle())
    title = f"Speedup over one worker, measured ({note})"
    if pub_models:  # the bottom panels are our simulation of the paper's K80 setting, not measurements
        top = f"{_panels(len(models), 'top')} measured ({note})" if models else "no panel measured"
        title = (f"Speedup over one worker: {top}; {_panels(len(pub_models), 'bottom')} simulated (K80 setting) "
                 "vs the paper's measured diamonds")
    verdicts = k80_verdict_text(paper) if pub_models else ""
    width = max(60, int((4.0 * n + 0.6) * 11))
    fig.suptitle("\n".join(_pack_parts(title, width) + _pack_parts(verdicts, width)),
                 fontsize="medium" if verdicts else None)
    legend_below(fig, handles, ncol=min(len(handles), 4))
    fig.tight_layout()
    for k, ax in enumerate(axes.flat):  # with the final limits and sizes: markers on top of others named
        simulated = k >= len(models)
        same = coinciding_lines(ax)
        notes = [f"{'simulated ' if simulated else ''}{a} = {b}: drawn on top of each other" for a, b in same]
        unit = "K80 nodes" if simulated else "workers"
        hidden = hidden_markers_text(hidden_markers(ax), skip=same, x_text=lambda v, u=unit: f"{v:g} {u}",
                                     y_text=lambda v: f"{v:.3g}x")
        if hidden:
            notes.append(f"{'simulated ' if simulated else ''}markers drawn on top of each other: {hidden}")
        if notes:
            add_note(ax, wrap_paragraphs("; ".join(notes), 56))
    fig.tight_layout()
    return fig


def _panels(n: int, where: str) -> str:
    """``"top panel"`` or ``"top panels"``: as many as there are."""
    return f"{where} panel{'s' if n != 1 else ''}"


def _breakdown_bars(ax, sub: pd.DataFrame, names: Sequence[str], dtypes: Sequence[str]) -> None:
    """Per scheduler of ``names`` one stacked bar (computation, non-overlapped communication) per wire dtype
    of ``dtypes``, side by side in that order (FP32 left, FP16 right and lighter): the same bar meaning in
    every panel of :func:`plot_breakdown`."""
    n = max(1, len(dtypes))
    width = 0.76 / n
    for i, sched in enumerate(names):
        for k, dt in enumerate(dtypes):
            for _, row in sub[(sub.scheduler == sched) & (sub.wire_dtype == dt)].iterrows():
                x = i + (k - (n - 1) / 2) * width
                comp, comm = row.computation_s * 1e3, row.exposed_comm_s * 1e3
                hatch = OVERSUBSCRIBED_HATCH if flag_column(pd.DataFrame([row])).any() else None
                kw = {"width": width * 0.95, "alpha": 1.0 if k == 0 else 0.5, "edgecolor": "white", "linewidth": 0.5,
                      "hatch": hatch}
                ax.bar(x, comp, color=PALETTE[0], **kw)
                ax.bar(x, comm, bottom=comp, color=PALETTE[3], **kw)
    ax.set_xticks(range(len(names)), [scheduler_label(n) for n in names], fontsize="small")
    ax.grid(axis="x", visible=False)


_BREAKDOWN_ORDER = ("wfbp", "syncea", "threshold", "ddp_buckets", "ddp", "mgwfbp", "optimal")


def _dtypes(table: pd.DataFrame) -> list[str]:
    return ordered(table["wire_dtype"].fillna("float32"), ("float32", "float16"))


def _fp(dt: str) -> str:
    return str(dt).replace("float", "FP")


def computation_text(breakdown: pd.DataFrame, model: str) -> str:
    """How a model's measured computation was obtained, from ``breakdown``'s columns
    (:func:`repro.studies.mgwfbp_train.breakdown_table`): the median over its runs, and their range."""
    m = breakdown[(breakdown.model == model) & (breakdown.source == "measured")]
    if "run_compute_s" not in m or m["run_compute_s"].isna().all():
        return "computation: each run's own computation-only time"
    own = m["run_compute_s"].astype(float)
    n = int(m["computation_runs"].max()) if "computation_runs" in m else len(own)
    return (f"computation: one number for every scheduler, the median of {n} runs' computation-only steps "
            f"(theirs ranged {own.min() * 1e3:.3g}-{own.max() * 1e3:.3g} ms)")


def _breakdown_gap_lines(breakdown: pd.DataFrame) -> list[str]:
    """:func:`repro.figures.style.gap_lines` of each measured iteration against the same run simulated, with
    where the gap lies (computation or non-overlapped communication), from the table's own columns."""
    items = []
    keys = ["model", "scheduler", "wire_dtype"]
    meas = breakdown[breakdown.source == "measured"].set_index(keys)
    sim = breakdown[breakdown.source == "simulated"].set_index(keys)
    for key in meas.index.intersection(sim.index):
        m, p = meas.loc[key], sim.loc[key]
        if isinstance(m, pd.DataFrame):
            m, p = m.iloc[0], p.iloc[0] if isinstance(p, pd.DataFrame) else p
        why = (f"computation {m.computation_s * 1e3:.3g} ms measured vs {p.computation_s * 1e3:.3g} ms in the "
               f"shared trace, non-overlapped communication {m.exposed_comm_s * 1e3:.3g} ms vs "
               f"{p.exposed_comm_s * 1e3:.3g} ms simulated with the live fit")
        items.append((f"{key[0]}, {scheduler_label(key[1])}, {_fp(key[2])}",
                       m.computation_s + m.exposed_comm_s, p.computation_s + p.exposed_comm_s, why))
    return gap_lines(items)


def headline_claim_text(headline: pd.DataFrame | None) -> str:
    """The journal's headline as published (:func:`repro.studies.mgwfbp_sim.journal_headline`), with where
    the claims page judges it: no number of ours, so nothing that can disagree with that page."""
    if headline is None or not len(headline):
        return ""
    parts = [f"up to {float(r.speedup):g}x over {scheduler_label(r.baseline)}" for r in headline.itertuples()]
    return ("The journal's headline (TPDS'21, 16 V100): " + ", ".join(parts) + "; judged on the claims page "
            "from mgwfbp.sim_speedup's table (claims mgwfbp.journal_vs_*), not from these bars.")


def plot_breakdown(breakdown: pd.DataFrame, note: str, paper_scale: pd.DataFrame | None = None,
                   headline: pd.DataFrame | None = None):
    """Stacked bars of computation and non-overlapped communication, ms per iteration; per scheduler one
    bar per wire dtype (FP32 left, FP16 right and lighter) in every panel.

    One row per model of ``breakdown`` (:func:`repro.studies.mgwfbp_train.breakdown_table`): measured runs
    left, their plans simulated on one shared trace right; oversubscribed runs hatched, gaps beyond 2x noted.
    With ``paper_scale`` (:func:`repro.studies.mgwfbp_sim.paper_breakdown_table`): the journal's setting
    simulated below; with ``headline`` (:func:`repro.studies.mgwfbp_sim.journal_headline`) the paper's
    claims under the title, as published."""
    models = list(dict.fromkeys(breakdown["model"]))
    dtypes = _dtypes(breakdown)
    with_paper = paper_scale is not None and len(paper_scale) > 0
    pmodels = list(dict.fromkeys(paper_scale["model"])) if with_paper else []
    pnets = list(dict.fromkeys(paper_scale["network"])) if with_paper else []
    pdtypes = _dtypes(paper_scale) if with_paper else []
    tiny_h, paper_h = 3.3 * len(models), 3.0 * len(pnets)
    width = max(9.0, 3.3 * len(pmodels) + 0.4)
    fig = plt.figure(figsize=(width, tiny_h + paper_h + 1.6))
    outer = fig.add_gridspec(2 if with_paper else 1, 1, height_ratios=[tiny_h, paper_h] if with_paper else [1],
                             hspace=0.3)
    top = outer[0].subgridspec(len(models), 2, hspace=0.75, wspace=0.12)
    tiny = "tiny" in note
    for r, m in enumerate(models):
        sub_m = breakdown[breakdown.model == m]
        names = ordered(sub_m.scheduler, _BREAKDOWN_ORDER)
        p = int(sub_m.workers.max()) if len(sub_m) else 0
        first = None
        for c, source in enumerate(("measured", "simulated")):
            ax = fig.add_subplot(top[r, c], sharey=first)
            first = first or ax
            sub = sub_m[sub_m.source == source]
            _breakdown_bars(ax, sub, names, dtypes)
            ax.set_ylabel("ms per iteration" if c == 0 else "")
            if c:
                ax.tick_params(labelleft=False)
            if source == "measured":
                what = f"measured{' (tiny)' if tiny else ''}\n{computation_text(breakdown, m)}"
            else:
                src = ", ".join(dict.fromkeys(sub["trace_from"].dropna().astype(str))) if "trace_from" in sub else ""
                what = "simulated: each run's plan on one shared trace and cost model" + \
                       (f"\n(those of run {src})" if src else "")
            ax.set_title(_wrap_line(f"{m}, P={p}: {what}", 4.3), fontsize="x-small")
    if with_paper:
        bottom = outer[1].subgridspec(len(pnets), len(pmodels), hspace=0.6, wspace=0.3)
        for r, net in enumerate(pnets):
            for c, m in enumerate(pmodels):
                ax = fig.add_subplot(bottom[r, c])
                sub = paper_scale[(paper_scale.model == m) & (paper_scale.network == net)]
                names = [s for s in _BREAKDOWN_ORDER if s in set(sub.scheduler)]
                _breakdown_bars(ax, sub, names, pdtypes)
                ax.set_ylabel("ms per iteration" if c == 0 else "")
                ax.tick_params(axis="x", labelsize="x-small")
                p = int(sub.workers.max()) if len(sub) else 0
                ax.set_title(f"{m}, {_net_label(net)}, {p} V100 (simulated)", fontsize="x-small")
    all_dtypes = list(dict.fromkeys(dtypes + pdtypes))
    handles = [Patch(facecolor=PALETTE[0], label="computation"),
               Patch(facecolor=PALETTE[3], label="non-overlapped communication")]
    handles += [Patch(facecolor=DARK_GREY, alpha=1.0 if k == 0 else 0.5,
                      label=f"every panel: {['left', 'right', 'third'][min(k, 2)]} bar{' (lighter)' if k else ''} "
                            f"{_fp(dt)}") for k, dt in enumerate(all_dtypes)]
    if flag_column(breakdown).any():
        handles.append(oversubscribed_handle("bar"))
    line = headline_claim_text(headline) if with_paper else ""
    fig.suptitle(f"Iteration breakdown, measured and simulated ({note})"
                 + (f"\n{_wrap_line(line, width)}" if line else ""), fontsize="medium" if line else None, y=0.998)
    legend_below(fig, handles, ncol=2 if with_paper else 3)
    h = tiny_h + paper_h + 1.6
    fig.subplots_adjust(top=1 - (1.5 if line else 0.9) / h, bottom=0.35 / h, left=0.8 / width, right=0.98)
    if with_paper:
        y1 = outer[1].get_position(fig).y1
        fig.text(0.5, y1 + 0.5 / h, "Paper scale, simulated (the journal's setting: estimate traces, published "
                 "fits)", ha="center", va="bottom", fontsize="medium", weight="bold")
    add_gap_note(fig, _breakdown_gap_lines(breakdown))
    return fig


def _wrap_line(text: str, width_in: float) -> str:
    """``text`` wrapped to about the figure's width (``width_in`` inches at the medium font size)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, max(40, int(width_in * 13))))


def _threshold_panel(ax, sub: pd.DataFrame, sources: Sequence[tuple[str, str, str | None]]) -> bool:
    """One model's sweep on ``ax``: the threshold curve per source and the references as horizontal
    lines; returns whether a point was oversubscribed."""
    any_over = False
    th = sub[sub.scheduler == "threshold"].sort_values("threshold_bytes")
    st = scheduler_style("threshold")
    for source, ls, mfc in sources:
        s = th[th.source == source]
        if s.empty:
            continue
        ax.plot(s.threshold_bytes, s.iteration_s * 1e3, ls=ls, marker=st["marker"], ms=5, color=st["color"],
                markerfacecolor=mfc or st["color"], label=f"{st['label']} ({source})")
        if flag_column(s).any():
            any_over = True
            mark_oversubscribed(ax, s.threshold_bytes[flag_column(s)], s.iteration_s[flag_column(s)] * 1e3)
    for _, r in sub[sub.scheduler != "threshold"].iterrows():
        rs = scheduler_style(r.scheduler)
        ax.axhline(r.iteration_s * 1e3, color=rs["color"], ls="-" if r.source == "measured" else "--",
                   lw=1.2 if r.scheduler != "optimal" else 1.6, zorder=rs["zorder"],
                   label=f"{rs['label']} ({r.source})")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="fusion threshold (bytes)", ylabel="iteration (ms)")
    return any_over


def threshold_verdict_text(paper_scale: pd.DataFrame) -> str:
    """The best fixed threshold ÷ MG-WFBP, worst case over the paper-scale panels, with the verdict of
    ``mgwfbp.vs_fixed_threshold``; "" when the table lacks either."""
    from repro.figures.claims import claim_verdict

    ratios = []
    for (m, net), g in paper_scale.groupby(["model", "network"], sort=False):
        th, mg = g[g.scheduler == "threshold"].iteration_s, g[g.scheduler == "mgwfbp"].iteration_s
        if len(th) and len(mg):
            ratios.append((float(th.min() / mg.iloc[0]), m, net))
    if not ratios:
        return ""
    r, m, net = min(ratios)
    v = claim_verdict("mgwfbp.vs_fixed_threshold", r)
    return (f"Paper scale, simulated: the best fixed threshold ÷ MG-WFBP is {r:.2f}x at worst ({m}, "
            f"{_net_label(net)}): MG-WFBP matches the best threshold without tuning one, {v}.")


def plot_threshold_sweep(sweep: pd.DataFrame, refs: pd.DataFrame | None = None, note: str = "",
                         paper_scale: pd.DataFrame | None = None):
    """Iteration time vs fusion threshold (measured solid, simulated dashed), the reference schedulers as
    horizontal lines. ``sweep``: :func:`repro.studies.mgwfbp_train.threshold_sweep_table` (reference rows
    without ``threshold_bytes``, or given apart as ``refs``). With ``paper_scale``
    (:func:`repro.studies.mgwfbp_sim.paper_threshold_sweep_table`): a row per network below, and the verdict
    under the title."""
    if refs is not None and len(refs):
        sweep = pd.concat([sweep, refs.assign(threshold_bytes=np.nan)], ignore_index=True)
    sweep = sweep.assign(threshold_bytes=pd.to_numeric(sweep["threshold_bytes"], errors="coerce"))
    models = list(dict.fromkeys(sweep["model"]))
    with_paper = paper_scale is not None and len(paper_scale) > 0
    pmodels = list(dict.fromkeys(paper_scale["model"])) if with_paper else []
    pnets = list(dict.fromkeys(paper_scale["network"])) if with_paper else []
    ncols = max(len(models), len(pmodels))
    nrows = 1 + len(pnets)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols + 0.4, 3.6 * nrows + 0.9), squeeze=False)
    any_over = False
    tiny = "tiny" in note
    gaps: list[str] = []
    for ax, m in zip(axes[0], models):
        sub = sweep[sweep.model == m]
        any_over |= _threshold_panel(ax, sub, (("measured", "-", None), ("simulated", "--", "white")))
        p = int(sub.workers.max()) if "workers" in sub and len(sub) else 0
        src = ", ".join(dict.fromkeys(sub["trace_from"].dropna().astype(str))) if "trace_from" in sub else ""
        ax.set_title(f"{m}{f', P={p}' if p else ''}: measured and simulated{' (tiny)' if tiny else ''}"
                     + (f"\nsimulated: every point on one trace and cost model,\nthose of run {src}" if src else "")
                     + ("\n(every run oversubscribed)" if len(sub) and flag_column(sub).all() else ""),
                     fontsize="x-small")
        gaps += same_plan_lines(sub) + _sweep_gap_lines(sub)
    for ax in axes[0][len(models):]:
        ax.set_visible(False)
    for r, net in enumerate(pnets, start=1):
        for ax, m in zip(axes[r], pmodels):
            sub = paper_scale[(paper_scale.model == m) & (paper_scale.network == net)]
            _threshold_panel(ax, sub, (("simulated", "--", "white"),))
            p = int(sub.workers.max()) if len(sub) else 0
            ax.set_title(f"{m}, {_net_label(net)}, {p} V100\n(simulated, paper scale)", fontsize="small")
            refs = sub[sub.scheduler != "threshold"].set_index("scheduler")["iteration_s"]
            if {"mgwfbp", "optimal"} <= set(refs.index) and np.isclose(refs["mgwfbp"], refs["optimal"], rtol=1e-3):
                add_note(ax, "MG-WFBP and Optimal coincide")
        for ax in axes[r][len(pmodels):]:
            ax.set_visible(False)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    handles = list(handles.values()) + ([oversubscribed_handle()] if any_over else [])
    line = threshold_verdict_text(paper_scale) if with_paper else ""
    fig.suptitle(f"Iteration time vs fixed fusion threshold, measured and simulated ({note})"
                 + (f"\n{_wrap_line(line, 4.2 * ncols)}" if line else ""))
    legend_below(fig, handles, ncol=3)
    fig.tight_layout()
    add_gap_note(fig, gaps, head="More than 2x apart (measured vs measured of one plan, or vs simulated):")
    return fig


def same_plan_lines(sub: pd.DataFrame, factor: float = 2.0) -> list[str]:
    """One line per threshold run that executed a reference run's bucketing (``same_plan_as``) but measured
    more than ``factor`` apart from it (the gap is the machine's), with both times and the runs' order."""
    if "same_plan_as" not in sub:
        return []
    meas = sub[sub.source == "measured"]
    refs = meas[meas.scheduler != "threshold"].drop_duplicates("scheduler").set_index("scheduler")
    out = []
    for r in meas[(meas.scheduler == "threshold") & meas.same_plan_as.notna()].itertuples():
        if r.same_plan_as not in refs.index:
            continue
        ref = refs.loc[r.same_plan_as]
        ratio = float(r.iteration_s) / float(ref.iteration_s)
        if 1 / factor <= ratio <= factor:
            continue
        order = (f" (run {int(r.run_order) + 1} vs run {int(ref.run_order) + 1} of {int(meas.run_order.max()) + 1} "
                 "in the order they ran)" if "run_order" in meas and pd.notna(r.run_order) else "")
        out.append(f"{r.model}: threshold {int(r.threshold_bytes):,} B ran {scheduler_label(r.same_plan_as)}'s "
                   f"bucketing but measured {float(r.iteration_s) * 1e3:.3g} ms vs "
                   f"{float(ref.iteration_s) * 1e3:.3g} ms "
                   f"({ratio:.1f}x){order}{_compute_clause(r, ref)}: one plan, two timings, so the difference is "
                   "when and how the runs were timed (load on the shared cores), not the threshold")
    return out


def _compute_clause(run, ref) -> str:
    """", its computation-only steps X ms vs Y ms" when the table has both runs' (the machine's speed in each)."""
    a, b = getattr(run, "run_compute_s", None), ref.get("run_compute_s") if hasattr(ref, "get") else None
    if a is None or b is None or not (np.isfinite(float(a)) and np.isfinite(float(b))):
        return ""
    return f", its computation-only steps {float(a) * 1e3:.3g} ms vs {float(b) * 1e3:.3g} ms"


def _sweep_gap_lines(sub: pd.DataFrame) -> list[str]:
    """:func:`repro.figures.style.gap_lines` of each measured point against its simulation on the shared
    trace, with both computation times where recorded; more than two such lines are summed up in one."""
    key = ["scheduler", "threshold_bytes"]
    s = sub.assign(threshold_bytes=sub["threshold_bytes"].fillna(-1))
    meas = s[s.source == "measured"].drop_duplicates(key).set_index(key)
    sim = s[s.source == "simulated"].drop_duplicates(key).set_index(key)
    items = []
    for k in meas.index.intersection(sim.index):
        name = scheduler_label(k[0]) + (f" {int(k[1]):,} B" if k[1] >= 0 else "")
        why = "simulated: the run's plan on the shared trace with its live a + b*M fit"
        if "computation_s" in s and pd.notna(meas.loc[k, "computation_s"]) and pd.notna(sim.loc[k, "computation_s"]):
            why = (f"this run's computation-only steps took {float(meas.loc[k, 'computation_s']) * 1e3:.3g} ms, the "
                   f"shared trace computes in {float(sim.loc[k, 'computation_s']) * 1e3:.3g} ms")
        items.append((f"{sub.model.iloc[0]}, {name}", meas.loc[k, "iteration_s"], sim.loc[k, "iteration_s"], why))
    lines = gap_lines(items)
    if len(lines) <= 2:
        return lines
    apart = [float(m) / float(p) for _, m, p, _ in items if gap_lines([("", m, p, "")])]
    return [f"{sub.model.iloc[0]}: {len(lines)} of {len(items)} points measured {min(apart):.1f}x to "
            f"{max(apart):.1f}x their simulation on the shared trace (each run's computation-only time: "
            f"{_range_ms(meas.get('computation_s'))}; the shared trace's: {_range_ms(sim.get('computation_s'))})"]


def _range_ms(values: pd.Series | None) -> str:
    v = pd.to_numeric(values, errors="coerce").dropna() * 1e3 if values is not None else pd.Series(dtype=float)
    if v.empty:
        return "not recorded"
    return f"{v.min():.3g} ms" if np.isclose(v.min(), v.max()) else f"{v.min():.3g}-{v.max():.3g} ms"


def convergence_extent_text(epochs: pd.DataFrame) -> str:
    """How much the convergence figure rests on, from its table: "1 seed, 2 epochs" (seeds from a
    ``seed`` column, else one run per scheduler = 1 seed; epochs: the most any run has)."""
    seeds = int(epochs["seed"].nunique()) if "seed" in epochs else 1
    n_ep = int(epochs.groupby("scheduler")["epoch"].nunique().max()) if len(epochs) else 0
    return f"{seeds} seed{'s' if seeds != 1 else ''}, {n_ep} epoch{'s' if n_ep != 1 else ''}"


def plot_convergence(epochs: pd.DataFrame, note: str):
    """Test accuracy vs epoch per scheduler; coinciding curves (S-SGD and MG-WFBP make identical updates)
    stay visible (large hollow markers under small filled ones) and a note says they coincide."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, (s, g) in enumerate(epochs.groupby("scheduler", sort=False)):
        st = scheduler_style(s)
        g = g.sort_values("epoch")
        label = st["label"] if s != "ddp" else "S-SGD (PyTorch DDP)"
        big = k == 0
        ax.plot(g.epoch, g.test_accuracy, color=st["color"], marker=st["marker"], ms=11 if big else 5,
                markerfacecolor="none" if big else st["color"], markeredgewidth=1.6 if big else 1.0,
                ls=st["linestyle"], lw=2.6 if big else 1.4, zorder=2 + k, label=label)
    ax.set(xlabel="epoch", xticks=sorted(set(epochs.epoch)), ylabel="test accuracy")
    ax.set_title(f"Convergence ({note}; {convergence_extent_text(epochs)})", fontsize="small")
    same = coinciding_lines(ax, rtol=1e-9)
    if same:
        add_note(ax, "; ".join(f"{a} and {b} coincide: identical updates" for a, b in same), fontsize="small")
    legend_below(fig, axes=[ax], ncol=2)
    fig.tight_layout()
    return fig
