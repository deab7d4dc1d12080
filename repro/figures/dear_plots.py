"""Figures of the DeAR simulation study, each drawn from one tidy table of :mod:`repro.studies.dear_sim`
and returned as a matplotlib Figure (the caller saves it). Every figure says it is simulated, with which
preset and traces (``note``), and names its cost mode in the title
(:func:`repro.figures.mgwfbp_plots.cost_mode_label`).
"""

from __future__ import annotations

import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from repro.figures.mgwfbp_plots import _log2_x, cost_mode_label
from repro.figures.plots import _gantt_ops, gantt
from repro.figures.style import PALETTE, kind_color, legend_below, ms_text, ordered, scheduler_style

__all__ = ["METHOD_ORDER", "method_style", "method_label", "plot_timeline", "plot_scaling",
           "plot_throughput", "plot_breakdown", "plot_buffer_sweep"]

METHOD_ORDER: tuple[str, ...] = ("wfbp", "bytescheduler", "horovod", "ddp_buckets", "mgwfbp", "dear_nofusion",
                                 "dear_threshold", "dear_model", "dear_optimal", "dear_bo", "fsdp")

_THOUSANDS = FuncFormatter(lambda v, _pos: f"{v / 1e3:g}")

_LABELS = {"ddp_buckets": "DDP buckets (25 MiB)", "horovod": "Horovod (64 MiB fusion, 5 ms cycle)",
           "bytescheduler": "ByteScheduler (4M-param chunks)"}
_ROW_NAMES = {"compute": "computation", "comm": "communication"}
_KIND_NAMES = {"forward": "forward", "backward": "backward", "allreduce": "all-reduce",
               "reduce_scatter": "reduce-scatter", "allgather": "all-gather", "update": "update",
               "pre_forward": "pre-forward"}


# Colours changed in the DeAR figures only: the shared style's green DDP buckets was hard to tell from DeAR's
# teal 25 MiB threshold beside it (and is the breakdown's all-gather green); olive, from the same Tol palette.
_COLORS = {"ddp_buckets": "#999933"}


def method_style(name: str) -> dict:
    """``ax.plot`` keyword arguments (color, marker, linestyle, label, zorder) of a method."""
    st = dict(scheduler_style(name))
    if name in _COLORS:
        st["color"] = _COLORS[name]
    if name in _LABELS:
        st["label"] = _LABELS[name]
    return st


def method_label(name: str) -> str:
    return method_style(name)["label"]


# -- dear.timeline

def _titled(title: str, table: pd.DataFrame, cost_mode: str | None) -> str:
    """``title`` with the cost mode (``cost_mode``, else the table's column): a closing "(simulated)"
    becomes "(simulated, <mode>)", any other title gains "(<mode>)"."""
    mode = cost_mode_label(table, cost_mode)
    if not mode:
        return title
    if title.endswith("(simulated)"):
        return f"{title[:-1]}, {mode})"
    return f"{title} ({mode})"


def plot_timeline(ops: pd.DataFrame, title: str, note: str = "", cost_mode: str | None = None):
    """One Gantt chart per scheduler on a shared time axis (ms): one iteration and the next forward, a
    dashed line where the next iteration starts, the steady-state period in each title. ``ops``:
    :func:`repro.studies.dear_sim.timeline_table`; ``note`` goes under the title."""
    schedulers = ordered(ops["scheduler"], METHOD_ORDER)
    n = len(schedulers)
    fig = plt.figure(figsize=(11.5, 1.55 * n + 1.9))
    gs = fig.add_gridspec(n, 1, hspace=0.55)
    t_end = float(ops["end_s"].max())
    axes = []
    for i, s in enumerate(schedulers):
        ax = fig.add_subplot(gs[i], sharex=axes[0] if axes else None)
        axes.append(ax)
        sub = ops[ops["scheduler"] == s]
        # communication bars keep their bucket label when wide enough
        gantt(ax, _gantt_ops(sub, t_end, "comm", 0.035, "stable"), streams=["compute", "comm"], legend=False,
              label_min_width_frac=0.0, fontsize=6.5)
        it, bnd = float(sub["iteration_s"].iloc[0]), float(sub["boundary_s"].iloc[0])
        ax.axvline(bnd * 1e3, color="black", lw=1.1, ls="--", zorder=5)
        ax.text(bnd * 1e3, -0.62, " next iteration →", ha="left", va="bottom", fontsize="x-small",
                color="black", clip_on=False)
        nb = int(sub["buckets"].iloc[0])
        ax.set_title(f"{method_label(s)}: {nb} bucket{'s' if nb != 1 else ''}, iteration (period) "
                     f"{ms_text(it)}", fontsize="small", loc="left")
        ax.set_yticklabels([_ROW_NAMES[r] for r in ("compute", "comm")], fontsize="small")
        ax.tick_params(labelbottom=i == n - 1)  # one time axis: labelled under the last panel
        ax.set_xlabel("time since the iteration start (ms), simulated" if i == n - 1 else "")
    axes[0].set_xlim(0, t_end * 1e3 * 1.02)
    kinds = [k for k in ("forward", "backward", "allreduce", "reduce_scatter", "allgather", "update", "pre_forward")
             if k in set(ops["kind"])]
    handles = [Patch(facecolor=kind_color(k), label=_KIND_NAMES[k]) for k in kinds]
    handles.append(Line2D([], [], color="black", ls="--", lw=1.1, label="next iteration starts"))
    fig.suptitle(_titled(title, ops, cost_mode), fontsize="medium")
    top = 0.95 / fig.get_figheight()
    if note:
        fig.text(0.5, 1 - 0.5 / fig.get_figheight(), textwrap.fill(note, 140), ha="center", va="top",
                 fontsize="small", style="italic", color="#333333")
        top = 1.25 / fig.get_figheight()
    legend_below(fig, handles, ncol=len(handles))
    fig.subplots_adjust(top=1 - top, bottom=0.85 / fig.get_figheight(), left=0.1, right=0.98)
    return fig


# -- dear.scaling and the throughput bars

def _coinciding(sub: pd.DataFrame, names: Sequence[str], x: str = "workers", rtol: float = 1e-3) -> list[str]:
    t = sub.pivot_table(index=x, columns="scheduler", values="throughput")
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a in t and b in t and np.allclose(t[a], t[b], rtol=rtol, atol=0):
                out.append(f"{method_label(a)} = {method_label(b)}")
    return out


def ib_network_note(networks) -> str:
    """For the InfiniBand presets among ``networks`` (``56gbib-*``): both networks, the fit's and the paper's
    (the DeAR authors' constants say 56Gb IB; the paper's testbed is 100Gb IB); "" when there is none."""
    ib = [n for n in dict.fromkeys(networks) if str(n).startswith("56gbib")]
    if not ib:
        return ""
    return (f"{', '.join(ib)}: the DeAR authors' 56Gb InfiniBand fit; the paper's testbed was 100Gb InfiniBand "
            "(its claims below are on 100Gb IB)")


def plot_scaling(table: pd.DataFrame, note: str = "", cost_mode: str | None = None):
    """``dear.scaling``: throughput (samples/s over all GPUs) vs number of GPUs, one column per model and
    one row per network; under each panel, each method's throughput divided by the best method's at that
    P (where gaps of a few percent stay visible). ``table`` is :func:`repro.studies.dear_sim.scaling_table`."""
    models = list(dict.fromkeys(table["model"]))
    nets = list(dict.fromkeys(table["network"]))
    names = ordered(table["scheduler"], METHOD_ORDER)
    ncol, nrow = len(models), len(nets)
    w, h = max(3.1 * ncol, 7.0), 3.9 * nrow + 1.9
    fig = plt.figure(figsize=(w, h))
    outer = fig.add_gridspec(nrow, ncol, hspace=0.42, wspace=0.32)
    same_notes = []
    ps = sorted(set(table["workers"]))
    for i, net in enumerate(nets):
        for j, m in enumerate(models):
            cell = outer[i, j].subgridspec(2, 1, height_ratios=[2.0, 1], hspace=0.08)
            ax = fig.add_subplot(cell[0])
            axr = fig.add_subplot(cell[1], sharex=ax)
            sub = table[(table["model"] == m) & (table["network"] == net)]
            for s in names:
                g = sub[sub["scheduler"] == s].sort_values("workers")
                if g.empty:
                    continue
                st = method_style(s)
                kw = {"color": st["color"], "marker": st["marker"], "linestyle": st["linestyle"],
                      "zorder": st.get("zorder", 2), "markersize": 4.5, "lw": 1.3}
                ax.plot(g["workers"], g["throughput"], **kw)
                axr.plot(g["workers"], g["relative_to_best"], **kw)
            for a in (ax, axr):
                _log2_x(a)
                a.set_xticks(ps)
                a.tick_params(labelsize="x-small")
            ax.set_ylim(0, float(sub["throughput"].max()) * 1.08)
            ax.yaxis.set_major_formatter(_THOUSANDS)
            ax.tick_params(labelbottom=False)
            lo = float(sub["relative_to_best"].min())
            axr.set_ylim(max(0.0, min(0.9, lo - 0.05)), 1.03)
            ax.set_title(f"{m} · {net}", fontsize="small")
            if j == 0:
                ax.set_ylabel("throughput\n(1000 samples/s)", fontsize="small")
                axr.set_ylabel("÷ best", fontsize="small")
            axr.set_xlabel("GPUs P", fontsize="small")
            same = _coinciding(sub, names)
            if same:
                same_notes.append(f"{m} · {net}: " + ", ".join(same))
    handles = [Line2D([], [], color=method_style(s)["color"], marker=method_style(s)["marker"],
                      linestyle=method_style(s)["linestyle"], label=method_label(s)) for s in names]
    fig.suptitle(_titled("Throughput vs number of GPUs per method (simulated)", table, cost_mode), fontsize="medium")
    sub_title = "throughput = P × batch ÷ simulated iteration; lower panels: ÷ the best method's at each P"
    if note:
        sub_title += "\n" + note
    ib = ib_network_note(nets)
    if ib:
        sub_title += "\n" + ib
        note = note + "\n" + ib if note else ib  # the headline below moves down by one more line
    fig.text(0.5, 1 - 0.42 / h, sub_title, ha="center", va="top", fontsize="small", style="italic",
             color="#333333")
    headline = scaling_headline_text(table)
    if headline:
        headline = "\n".join(textwrap.wrap(headline, int(15 * w)))
        fig.text(0.5, 1 - (0.62 + 0.17 * note.count("\n") + (0.17 if note else 0)) / h, headline, ha="center",
                 va="top", fontsize="small", color="#333333")
    legend_below(fig, handles, ncol=min(len(handles), 4))
    bottom = 1.05
    if same_notes:
        fig.text(0.5, 0.32 / h, textwrap.fill("Drawn on top of each other (equal at every P): " + "; ".join(same_notes),
                                              int(16 * w)), ha="center", va="top", fontsize="x-small", style="italic",
                 color="#333333")
        bottom = 1.15
    fig.subplots_adjust(top=1 - (1.05 + (0.2 if ib else 0) + (0.2 * (headline.count("\n") + 1) if headline else 0)) / h,
                        bottom=bottom / h, left=0.07, right=0.985)
    return fig


RELEASED = ("dear_nofusion", "dear_threshold")  # DeAR as the authors released it (the claims' denominator)


def scaling_headline_text(table: pd.DataFrame) -> str:
    """The DeAR paper's headline (:data:`repro.studies.dear_sim.PAPER_CLAIM_PCT`) beside DeAR as released
    vs the best baseline at the table's largest P, per network, with the verdicts of ``dear.headline_10gbe``
    / ``dear.headline_ib``; "" when the table lacks either side."""
    from repro.figures.claims import claim_verdict
    from repro.studies.dear_sim import PAPER_CLAIM_PCT, network_kind

    need = {"model", "network", "workers", "scheduler", "iteration_s"}
    if not len(table) or not need <= set(table.columns):
        return ""
    p = int(table["workers"].max())
    parts = []
    for net, g in table[table["workers"] == p].groupby("network", sort=False):
        kind = network_kind(net)
        if kind not in PAPER_CLAIM_PCT:
            continue
        best = None
        for m, gm in g.groupby("model", sort=False):
            rel, base = gm[gm.scheduler.isin(RELEASED)], gm[~gm.scheduler.astype(str).str.startswith("dear")]
            if rel.empty or base.empty:
                continue
            pct = 100.0 * (float(base.iteration_s.min()) / float(rel.iteration_s.min()) - 1.0)
            best = max(best or (pct, m), (pct, m))
        if best is None:
            continue
        claim = {"10gbe": "dear.headline_10gbe", "ib": "dear.headline_ib"}[kind]
        try:
            v = ", " + claim_verdict(claim, best[0])
        except Exception:
            v = ""
        parts.append(f"{net}: paper up to +{PAPER_CLAIM_PCT[kind]:g}%, simulated {best[0]:+.0f}% ({best[1]}){v}")
    if not parts:
        return ""
    return (f"DeAR as released vs the best baseline at {p} GPUs, paper (DeAR ICDCS'23 headline, measured, 64 GPUs; "
            "10GbE and 100Gb IB) vs simulated: " + "; ".join(parts) + ".")


def plot_throughput(table: pd.DataFrame, note: str = "", title: str = "Throughput (simulated)",
                    cost_mode: str | None = None):
    """Grouped bars (simulated only): throughput per model, one bar per method, one panel per network
    (``dear.throughput_nofusion`` / ``dear.throughput_fusion`` without their measured halves).
    ``table`` is :func:`repro.studies.dear_sim.throughput_table` at one worker count."""
    names = ordered(table["scheduler"], METHOD_ORDER)

    def bars(ax, sub, x, width, g, s):
        ax.bar(x, g["throughput"], width, color=method_style(s)["color"], label=method_label(s), edgecolor="white",
               linewidth=0.5)

    fig = _network_bars(table, names, 4.4, "throughput (1000 samples/s)", bars)
    for ax in fig.axes:
        ax.yaxis.set_major_formatter(_THOUSANDS)
    fig.suptitle(_titled(title, table, cost_mode) + (f"\n{note}" if note else ""), fontsize="medium")
    legend_below(fig, [Patch(facecolor=method_style(s)["color"], label=method_label(s)) for s in names],
                 ncol=min(len(names), 4))
    fig.tight_layout()
    return fig


def _network_bars(table: pd.DataFrame, names: Sequence[str], height: float, ylabel: str, bars):
    """One panel per network of ``table``: per model a group of bars, ``bars(ax, sub, x, width, g, s)``
    drawing method ``s``'s (``g``: its rows of the network's ``sub`` indexed by model, ``x``: their
    positions). Returns the figure."""
    models = list(dict.fromkeys(table["model"]))
    nets = list(dict.fromkeys(table["network"]))
    fig, axes = plt.subplots(1, len(nets), figsize=(max(5.5 * len(nets), 7), height), squeeze=False)
    width = 0.8 / len(names)
    for ax, net in zip(axes[0], nets):
        sub = table[table["network"] == net]
        for k, s in enumerate(names):
            bars(ax, sub, np.arange(len(models)) + (k - (len(names) - 1) / 2) * width, width,
                 sub[sub["scheduler"] == s].set_index("model").reindex(models), s)
        ax.set_xticks(range(len(models)), models, fontsize="small", rotation=20)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{net}, P={int(sub['workers'].iloc[0])}", fontsize="small")
    return fig


# -- dear.breakdown and dear.buffer_sweep (simulated halves)

_BREAKDOWN = (("computation_s", "computation", "#bdbdbd"),
              ("exposed_rs_s", "exposed reduce-scatter", kind_color("reduce_scatter")),
              ("exposed_ag_s", "exposed all-gather", kind_color("allgather")),
              ("exposed_allreduce_s", "exposed all-reduce", kind_color("allreduce")),
              ("exposed_idle_s", "idle (e.g. cycle wait)", "#ffffff"))


def plot_breakdown(table: pd.DataFrame, note: str = "", cost_mode: str | None = None):
    """Stacked bars per model and scheduler: computation vs exposed communication (ms per iteration),
    one panel per network. ``table`` is :func:`repro.studies.dear_sim.breakdown_table`."""
    names = ordered(table["scheduler"], METHOD_ORDER)

    def bars(ax, sub, x, width, g, s):
        bottom = np.zeros(len(x))
        for col, _, c in _BREAKDOWN:
            v = g[col].fillna(0).to_numpy() * 1e3
            ax.bar(x, v, width * 0.92, bottom=bottom, color=c, edgecolor=method_style(s)["color"], linewidth=1.0)
            bottom += v
        ax.set_ylim(0, float(sub["iteration_s"].max()) * 1e3 * 1.06)  # stacked bars: autoscale may clip the top

    fig = _network_bars(table, names, 4.6, "ms per iteration", bars)
    seen = [(col, lab, c) for col, lab, c in _BREAKDOWN if col in table and table[col].abs().sum() > 0]
    handles = [Patch(facecolor=c, edgecolor="#666666", label=lab) for _, lab, c in seen]
    handles += [Patch(facecolor="white", edgecolor=method_style(s)["color"], linewidth=1.5,
                      label=f"outline: {method_label(s)}") for s in names]
    fig.suptitle(_titled("Computation vs exposed communication (simulated)", table, cost_mode)
                 + (f"\n{note}" if note else ""),
                 fontsize="medium")
    legend_below(fig, handles, ncol=min(len(handles), 4))
    fig.tight_layout()
    return fig


def plot_buffer_sweep(table: pd.DataFrame, note: str = "", cost_mode: str | None = None):
    """Simulated DeAR iteration vs fusion threshold (log x, MiB), the step function through every
    breakpoint; dear_model's choice and the 25 MiB default marked. One panel per model, one line per
    network. ``table`` is :func:`repro.studies.dear_sim.buffer_sweep_table`."""
    models = list(dict.fromkeys(table["model"]))
    nets = list(dict.fromkeys(table["network"]))
    fig, axes = plt.subplots(1, len(models), figsize=(max(3.3 * len(models), 6.5), 3.9), squeeze=False)
    colors = [PALETTE[0], PALETTE[3], PALETTE[2], PALETTE[4]]
    for ax, m in zip(axes[0], models):
        for k, net in enumerate(nets):
            g = table[(table["model"] == m) & (table["network"] == net)].sort_values("threshold_bytes")
            ax.step(g["threshold_mib"], g["iteration_s"] * 1e3, where="post", color=colors[k % 4], lw=1.3)
            c = g[g["model_choice"]]
            ax.scatter(c["threshold_mib"], c["iteration_s"] * 1e3, marker="*", s=110, color=colors[k % 4],
                       edgecolor="black", zorder=5)
            d = g[g["point"] == "default"]
            ax.scatter(d["threshold_mib"], d["iteration_s"] * 1e3, marker="o", s=40, facecolor="none",
                       edgecolor="black", zorder=5)
        _log2_x(ax)
        ax.set_xlabel("fusion threshold (MiB)", fontsize="small")
        ax.set_title(m, fontsize="small")
    axes[0, 0].set_ylabel("iteration (ms)")
    handles = [Line2D([], [], color=colors[k % 4], lw=1.3, label=net) for k, net in enumerate(nets)]
    handles += [Line2D([], [], marker="*", ls="", markersize=11, markerfacecolor="white", markeredgecolor="black",
                       label="dear_model's choice"),
                Line2D([], [], marker="o", ls="", markerfacecolor="none", markeredgecolor="black",
                       label="25 MiB default")]
    fig.suptitle(_titled("DeAR iteration vs fusion threshold (simulated)", table, cost_mode)
                 + (f"\n{note}" if note else ""), fontsize="medium")
    legend_below(fig, handles, ncol=len(handles))
    fig.tight_layout()
    return fig
