"""Figures of the OSP study, drawn from the tables of :mod:`repro.studies.osp_sim` and
:mod:`repro.studies.osp_train` and returned as matplotlib Figures (the caller saves them). Simulated
titles name their cost mode (:func:`repro.figures.mgwfbp_plots.cost_mode_label`); the paper's claim is
drawn labelled as such.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from repro.figures.mgwfbp_plots import cost_mode_label
from repro.figures.plots import gantt
from repro.figures.style import (DARK_GREY, EXTRA_COLORS, OVERSUBSCRIBED_HATCH, PALETTE, add_gap_note,
                                 gap_lines, hidden_markers, kind_color, legend_below, ms_text, ordered,
                                 scheduler_style, wrap_paragraphs)

__all__ = ["METHOD_ORDER", "STAGE_COLORS", "method_style", "method_label", "plot_timeline", "plot_throughput",
           "plot_accuracy", "plot_lgp_ablation", "plot_stage_ratio"]

METHOD_ORDER: tuple[str, ...] = ("ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_nolgp", "osp_auto")
STAGE_COLORS: dict[str, str] = {"compute": kind_color("backward"), "stage 1": PALETTE[3], "stage 2": PALETTE[2],
                                "lgp": PALETTE[4], "update": PALETTE[5]}
MODEL_COLORS: tuple[str, ...] = (PALETTE[0], PALETTE[4], PALETTE[5], EXTRA_COLORS[1], PALETTE[9], EXTRA_COLORS[2],
                                 PALETTE[6], PALETTE[7])  # models, not schedulers
MODEL_MARKERS: tuple[str, ...] = ("o", "s", "^", "D", "v", "P", "X", "<")
CLAIM_COLOR = DARK_GREY


def method_style(name: str) -> dict:
    """``ax.plot`` keyword arguments (color, marker, linestyle, label, zorder) of a method."""
    return dict(scheduler_style(name))


def method_label(name: str) -> str:
    return method_style(name)["label"]


def _head(fig, title: str, note: str, width_chars: int, panel_title_lines: int = 1, pad: float = 0.45) -> float:
    """Suptitle and an italic note under it; returns the top of the axes area (figure fraction), leaving
    room for ``panel_title_lines`` lines of axes titles."""
    h = fig.get_figheight()
    fig.suptitle(title, fontsize="medium", y=1 - 0.08 / h, va="top")
    room = pad + 0.2 * panel_title_lines
    if not note:
        return 1 - room / h
    text = wrap_paragraphs(note, width_chars)
    fig.text(0.5, 1 - 0.38 / h, text, ha="center", va="top", fontsize="small", style="italic", color="#333333")
    return 1 - (room + 0.05 + 0.19 * (text.count("\n") + 1)) / h


def _simulated_what(simulated: pd.DataFrame, cost_mode: str | None) -> str:
    """"simulated", with the cost mode in parentheses where known."""
    mode = cost_mode_label(simulated, cost_mode)
    return f"simulated ({mode})" if mode else "simulated"


# -- osp.timeline

def plot_timeline(ops: pd.DataFrame, title: str, note: str = "", cost_mode: str | None = None):
    """One Gantt chart per scheduler on a shared time axis (ms): the first and last worker's computation
    and the server's incoming (pushes) and outgoing (pulls) link, messages coloured by stage, dashed lines
    where worker 1 starts each iteration. ``ops``: :func:`repro.studies.osp_sim.timeline_table`."""
    schedulers = list(dict.fromkeys(ops["scheduler"]))
    n = len(schedulers)
    workers = int(ops["workers"].iloc[0])
    names = {"worker0": "worker 1: compute", f"worker{workers - 1}": f"worker {workers}: compute",
             "server0.in": "server in-link: push", "server0.out": "server out-link: pull",
             "server0.cpu": "server: update"}
    fig_h = 1.9 * n + 2.0
    fig = plt.figure(figsize=(12.0, fig_h))
    gs = fig.add_gridspec(n, 1, hspace=0.62)
    span = float(ops["window_s"].max())
    axes = []
    for i, s in enumerate(schedulers):
        ax = fig.add_subplot(gs[i], sharex=axes[0] if axes else None)
        axes.append(ax)
        sub = ops[(ops["scheduler"] == s) & ops["stream"].isin(list(names))].copy()
        sub["kind_drawn"] = np.where(sub["kind"].isin(["compute", "lgp", "update"]), sub["kind"], sub["stage"])
        sub["label"] = ""
        is_compute = sub["kind"] == "compute"
        sub.loc[is_compute, "label"] = "iteration " + (sub.loc[is_compute, "iteration"].astype(int) + 1).astype(str)
        msg = sub["kind"].isin(["push", "pull"])
        sub.loc[msg, "label"] = "w" + (sub.loc[msg, "worker"].astype(int) + 1).astype(str)
        streams = [k for k in names if k in set(sub["stream"])]
        draw = sub.assign(stream=sub["stream"].map(names), kind=sub["kind_drawn"])
        gantt(ax, draw, streams=[names[k] for k in streams], legend=False, label_min_width_frac=0.022,
              kind_colors=dict(STAGE_COLORS), fontsize=6)
        starts = sub[(sub["stream"] == "worker0") & is_compute]["start_s"]
        for t in sorted(set(starts.round(12))) + [float(sub["window_s"].iloc[0])]:
            ax.axvline(t * 1e3, color="black", lw=0.9, ls="--", zorder=5)
        r = sub.iloc[0]
        what = method_label(s)
        if s in ("osp", "osp_auto"):
            what += f", stage 1 = {100 * float(r['stage1_bytes_share']):.0f}% of the gradient bytes"
        ax.set_title(f"{what}: period {ms_text(float(r['iteration_s']))} per iteration", fontsize="small",
                     loc="left")
        ax.tick_params(axis="y", labelsize="x-small")
        ax.tick_params(labelbottom=i == n - 1)  # one time axis: labelled under the last panel
        ax.set_xlabel("time since worker 1 starts an iteration in steady state (ms), simulated" if i == n - 1 else "")
    axes[0].set_xlim(0, span * 1e3 * 1.005)
    kinds = [k for k in ("compute", "stage 1", "stage 2", "lgp", "update")
             if k in set(ops["stage"].replace("", np.nan).dropna()) | set(ops["kind"])]
    text = {"compute": "computation (forward + backward)", "stage 1": "stage 1 message (blocking; all of BSP's)",
            "stage 2": "stage 2 message (overlapped, one step stale)", "lgp": "LGP correction",
            "update": "server update"}
    handles = [Patch(facecolor=STAGE_COLORS[k], label=text[k]) for k in kinds]
    handles.append(Line2D([], [], color="black", ls="--", lw=0.9, label="worker 1 starts an iteration"))
    mode = cost_mode_label(ops, cost_mode)
    note = "\n".join(t for t in (note, auto_slower_note(ops)) if t)
    top = _head(fig, f"{title} ({mode})" if mode else title, note, 150)
    ncol = len(handles) if len(handles) <= 4 else -(-len(handles) // 2)  # at most two rows, never wider than the axes
    legend_below(fig, handles, ncol=ncol)
    rows = -(-len(handles) // ncol)
    fig.subplots_adjust(top=top, bottom=(0.8 + 0.25 * (rows - 1)) / fig_h, left=0.13, right=0.985)
    return fig


def auto_slower_note(ops: pd.DataFrame) -> str:
    """A note when osp_auto's simulated period is longer than the best other OSP share's in ``ops``
    (:func:`repro.studies.osp_sim.timeline_table`), with why (its rule does not search for the fastest
    share); "" otherwise."""
    per = ops.drop_duplicates("scheduler").set_index("scheduler")
    if "osp_auto" not in per.index:
        return ""
    others = per[per.index.str.startswith("osp") & (per.index != "osp_auto")]
    if others.empty:
        return ""
    best = others["iteration_s"].astype(float).idxmin()
    a, b = per.loc["osp_auto"], per.loc[best]
    if float(a["iteration_s"]) <= float(b["iteration_s"]):
        return ""
    return (f"Why osp_auto is slower: its stage 1 = {100 * float(a['stage1_bytes_share']):.0f}% of the bytes gives a "
            f"period of {ms_text(float(a['iteration_s']))}, longer than {method_label(best)} at "
            f"{100 * float(b['stage1_bytes_share']):.0f}% ({ms_text(float(b['iteration_s']))}). Its rule "
            "keeps stage 2 small enough to hide behind one computation and does not search for the fastest "
            "share; a larger stage 2 that does not fully hide still shortens the period while the server "
            "links are not saturated.")


# -- osp.throughput

def _claim_line(ax, y: float) -> None:
    ax.axhline(y, color=CLAIM_COLOR, ls=(0, (5, 2)), lw=1.2, zorder=9)


def _bar_style(method: str) -> dict:
    c = method_style(method)["color"]
    hollow = method.endswith("_nolgp")
    return {"facecolor": "white" if hollow else c, "edgecolor": c, "linewidth": 1.8}


def plot_throughput(measured: pd.DataFrame, simulated: pd.DataFrame, measured_note: str, sim_note: str,
                    summary: str = "", claim_pct: float = 50.0, cost_mode: str | None = None):
    """Measured throughput of every run (bars with their speedup over BSP; diamonds: each plan's
    prediction; the paper's claim at (1 + claim) x BSP), then per network the simulated throughput ÷ BSP's.
    ``measured``: :func:`repro.studies.osp_train.throughput_table`; ``simulated``:
    :func:`repro.studies.osp_sim.throughput_table`."""
    nets = list(dict.fromkeys(simulated["network"])) if len(simulated) else []
    sim_what = _simulated_what(simulated, cost_mode)
    ncol = max(1, len(nets))
    fig_h = 9.4
    fig = plt.figure(figsize=(max(6.0 * ncol, 9.0) + 0.6, fig_h))
    gs = fig.add_gridspec(2, ncol, hspace=0.62, wspace=0.2, height_ratios=[1.1, 1.0])
    ax = fig.add_subplot(gs[0, :])
    m = measured.copy()
    m["_o"] = m["method"].map({k: i for i, k in enumerate(METHOD_ORDER)}).fillna(99)
    m = m.sort_values(["_o", "stage1_bytes_share"], ascending=[True, False]).reset_index(drop=True)
    flags = m["oversubscribed"].fillna(False).astype(bool) if "oversubscribed" in m else pd.Series(False, index=m.index)
    over, all_over = bool(flags.any()), bool(flags.all()) and len(m) > 0
    seeds = int(m["seeds"].max()) if "seeds" in m and m["seeds"].notna().any() else 1
    for i, r in m.iterrows():
        ax.bar(i, r.throughput_samples_s, 0.62, **_bar_style(r.method))
        if over and not all_over and bool(flags[i]):  # hatched only where it tells the runs apart
            ax.bar(i, r.throughput_samples_s, 0.62, facecolor="none", edgecolor="#333333", linewidth=0,
                   hatch=OVERSUBSCRIBED_HATCH)
        ax.text(i, r.throughput_samples_s * 0.96, f"×{r.speedup_vs_bsp:.2f}", ha="center", va="top", fontsize="small",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.9}, zorder=7)
        pred = r.get("predicted_s")
        if pred is not None and pred == pred and pred > 0:
            ax.scatter(i, r.workers * r.batch_size / pred, marker="D", s=34, facecolor="white",
                       edgecolor="black", zorder=8)
    if seeds > 1 and {"throughput_samples_s_min", "throughput_samples_s_max"} <= set(m.columns):
        y = m["throughput_samples_s"].to_numpy(dtype=float)
        err = np.vstack([y - m["throughput_samples_s_min"].to_numpy(dtype=float),
                         m["throughput_samples_s_max"].to_numpy(dtype=float) - y])
        ax.errorbar(np.arange(len(m)) + 0.2, y, yerr=np.clip(err, 0, None), fmt="none", ecolor="black",
                    elinewidth=1.1, capsize=3, zorder=6)
    gaps, gap_head = _gap_note(m)
    bsp = m[m.method == "ps_bsp"]
    top = float(m.throughput_samples_s.max()) if len(m) else 1.0
    if len(bsp):
        y = float(bsp.throughput_samples_s.iloc[0]) * (1 + claim_pct / 100)
        _claim_line(ax, y)
        top = max(top, y)
    if "predicted_s" in m:
        preds = (m.workers * m.batch_size / m.predicted_s).replace([np.inf], np.nan).dropna()
        top = max([top] + [float(v) for v in preds])
    if "throughput_samples_s_max" in m:
        top = max([top] + [float(v) for v in m["throughput_samples_s_max"].dropna()])
    ax.set(ylim=(0, top * 1.12), xlim=(-0.6, len(m) - 0.3), xticks=range(len(m)))
    ax.set_xticklabels(m["label"], fontsize="small", rotation=18, ha="right")
    ax.set_ylabel("throughput\n(samples/s, all workers)")
    extra = "; all runs oversubscribed (more ranks than CPU cores)" if all_over else ""
    extra += "; error bars: the seeds' range (min-max)" if seeds > 1 else "; one seed"
    panel_title = wrap_paragraphs(f"measured: {measured_note}; ×: throughput ÷ BSP's{extra}", 125)
    ax.set_title(panel_title, fontsize="small")
    for j, net in enumerate(nets):
        a = fig.add_subplot(gs[1, j])
        sub = simulated[simulated["network"] == net]
        models = list(dict.fromkeys(sub["model"]))
        names = ordered(sub["method"], METHOD_ORDER)
        width = 0.8 / len(names)
        for k, s in enumerate(names):
            g = sub[sub["method"] == s].set_index("model").reindex(models)
            a.bar(np.arange(len(models)) + (k - (len(names) - 1) / 2) * width, g["speedup_vs_bsp"], width,
                  color=method_style(s)["color"], edgecolor="white", linewidth=0.4)
        _claim_line(a, 1 + claim_pct / 100)
        a.axhline(1.0, color="black", lw=0.8)
        a.set(ylim=(0, max(float(sub["speedup_vs_bsp"].max()), 1 + claim_pct / 100) * 1.1), xticks=range(len(models)))
        a.set_xticklabels(models, fontsize="small", rotation=15)
        if j == 0:
            a.set_ylabel("throughput ÷ BSP's\n(simulated)")
        label = sub["network_label"].iloc[0] if "network_label" in sub else net
        a.set_title(f"{sim_what}, {label} link, 1 server + {int(sub['workers'].iloc[0])} workers", fontsize="small")
    names = ordered(list(m["method"]) + (list(simulated["method"]) if len(simulated) else []), METHOD_ORDER)
    handles = [Patch(**_bar_style(s), label=method_label(s)) for s in names]
    handles.append(Line2D([], [], marker="D", ls="", markerfacecolor="white", markeredgecolor="black",
                          label="its plan's predicted throughput (on the bar)"))
    handles.append(Line2D([], [], color=CLAIM_COLOR, ls=(0, (5, 2)),
                          label=f"paper's claim (abstract): up to +{claim_pct:g}% (measured: drawn over BSP)"))
    if over and not all_over:
        handles.append(Patch(facecolor="white", edgecolor="#333333", hatch=OVERSUBSCRIBED_HATCH,
                             label="oversubscribed: more ranks than CPU cores"))
    note = "\n".join(t for t in (f"simulated: {sim_note}", summary) if t)
    top = _head(fig, "Throughput of BSP, ASP, SSP and OSP: measured at tiny scale, simulated at 9 nodes", note,
                int(14 * fig.get_figwidth()), panel_title_lines=panel_title.count("\n") + 1)
    legend_below(fig, handles, ncol=4)
    fig.subplots_adjust(top=top, bottom=1.0 / fig_h, left=0.09, right=0.985)
    add_gap_note(fig, gaps, head=gap_head)
    return fig


def _gap_reason(r) -> str:
    """Why a measured run is slower than its plan's prediction, from the run's own columns."""
    why = []
    if bool(r.get("oversubscribed", False)):
        ranks = r.get("ranks")
        why.append(f"oversubscribed ({int(ranks)} processes on fewer CPU cores)" if ranks == ranks and ranks is not None
                   else "oversubscribed (more processes than CPU cores)")
    bw = r.get("emulated_bandwidth_bps")
    if bw is not None and bw == bw and float(bw) > 0:
        why.append(f"emulated {float(bw) / 1e6:g} Mbit/s links (software shaping)")
    if not why:
        return ""
    return ("the plan's prediction does not model " + " or ".join(why)) if len(why) == 1 else (
        "the plan's prediction models neither:\n" + "; ".join(why))


def throughput_gap_lines(measured: pd.DataFrame) -> list[str]:
    """:func:`repro.figures.style.gap_lines` of each measured run's iteration time vs its plan's predicted
    period (``predicted_s``), with the reason computed from the run (oversubscribed, emulated links)."""
    if "predicted_s" not in measured or "iteration_s" not in measured:
        return []
    return gap_lines([(r["label"], r["iteration_s"], r["predicted_s"], _gap_reason(r)) for _, r in measured.iterrows()])


def _gap_note(measured: pd.DataFrame) -> tuple[list[str], str]:
    """The lines and head of the throughput panel's gap note: a reason shared by every line goes once
    into the head."""
    lines = throughput_gap_lines(measured)
    head = "Measured iteration time vs its plan's prediction, more than 2x apart"
    reasons = {_gap_reason(r) for _, r in measured.iterrows()}
    if lines and len(reasons) == 1 and "" not in reasons:
        reason = reasons.pop()
        return [ln.replace(f": {reason}", "") for ln in lines], f"{head}; every run: {reason}:"
    return lines, head + ":"


# -- osp.accuracy_epochs / osp.accuracy_time / osp.lgp_ablation

def _line_kw(method: str) -> dict:
    st = method_style(method)
    return {"color": st["color"], "marker": st["marker"], "linestyle": st["linestyle"], "zorder": st["zorder"],
            "markersize": 6, "lw": 1.6}


def _runs_in_order(acc: pd.DataFrame) -> list[str]:
    r = acc.drop_duplicates("run_id").copy()
    r["_o"] = r["method"].map({k: i for i, k in enumerate(METHOD_ORDER)}).fillna(99)
    return list(r.sort_values(["_o", "stage1_bytes_share"], ascending=[True, False])["run_id"])


def _seed_band(ax, xs, g: pd.DataFrame, column: str, kw: dict, scale: float = 1.0) -> None:
    """The seeds' range of ``column`` as a light band around the median curve (rows of
    :func:`repro.studies.osp_train.median_over_seeds` with more than one seed)."""
    if f"{column}_min" in g and "seeds" in g and int(g["seeds"].max()) > 1:
        ax.fill_between(xs, scale * g[f"{column}_min"].to_numpy(dtype=float),
                        scale * g[f"{column}_max"].to_numpy(dtype=float), color=kw.get("color"), alpha=0.15, lw=0)


def plot_accuracy(acc: pd.DataFrame, x: str, title: str, note: str = "", claim: str = ""):
    """Test accuracy (left) and mean train loss of the epoch (right) per run against ``x`` (``"epoch"``
    or ``"time_s"``, drawn in seconds). ``acc`` is :func:`repro.studies.osp_train.accuracy_table` (the
    runs to draw). ``claim``: the paper's accuracy claim, written under the title, labelled."""
    fig_h = 4.9
    fig, axes = plt.subplots(1, 2, figsize=(11.0, fig_h))
    handles = []
    for rid in _runs_in_order(acc):
        g = acc[acc.run_id == rid].sort_values("epoch")
        r = g.iloc[0]
        kw = _line_kw(r.method)
        xs = g[x].to_numpy(dtype=float)
        axes[0].plot(xs, 100 * g["test_accuracy"], **kw, label=r.label)
        axes[1].plot(xs, g["train_loss"], **kw, label=r.label)
        _seed_band(axes[0], xs, g, "test_accuracy", kw, 100)
        _seed_band(axes[1], xs, g, "train_loss", kw)
        handles.append(Line2D([], [], **kw, label=r.label))
    xlabel = "epoch" if x == "epoch" else "training time (s, sum of measured step times; evaluation excluded)"
    for a in axes:
        a.set_xlabel(xlabel, fontsize="small")
        if x == "epoch":
            a.set_xticks(sorted(set(acc["epoch"].astype(int))))
        else:
            a.set_xlim(left=0)
    axes[0].set(ylabel="test accuracy (%)", ylim=(0, 100))
    axes[1].set(ylabel="train loss (mean over the epoch)", ylim=(0, None))
    text = "\n".join(t for t in (note, claim, accuracy_vs_bsp_note(acc) if claim else "") if t)
    top = _head(fig, title, text, 150, panel_title_lines=0, pad=0.05)
    legend = legend_below(fig, handles, ncol=min(len(handles), 5))
    fig.tight_layout(rect=(0, 0, 1, top))
    hidden = _keep_hidden_curves_visible(axes, legend)
    if hidden:
        fig.tight_layout(rect=(0, 0, 1, top))
        add_gap_note(fig, hidden, head="Curves drawn on top of each other (the one underneath: larger hollow "
                                        "markers and a wider line):", color="#333333")
    return fig


_PANEL_NAMES = ("test accuracy", "train loss")


def _keep_hidden_curves_visible(axes, legend=None) -> list[str]:
    """Find the curves whose every marker a later curve covers in a panel (:func:`repro.figures.style.
    hidden_markers`, with the final limits); draw each such curve underneath with hollow markers and a wider
    line, larger the more curves lie over it (in every panel and in ``legend``), and return one line per
    pair: "ASP under SSP (s=2): every point of both panels (the curves coincide)" or of which panel."""
    npts = {ln.get_label(): len(ln.get_xdata()) for ln in axes[0].get_lines()}
    pairs: dict[tuple[str, str], list[str]] = {}
    for ax, name in zip(axes, _PANEL_NAMES):
        at: dict[tuple[str, str], set] = {}
        for h in hidden_markers(ax):
            at.setdefault((h.under, h.over), set()).add(h.x)
        for (u, o), xs in at.items():
            if len(xs) == npts.get(u, -1):  # every marker of u covered: the curve is hidden
                pairs.setdefault((u, o), []).append(name)
    if not pairs:
        return []
    depth: dict[str, int] = {}
    for u, _ in pairs:
        depth[u] = depth.get(u, 0) + 1
    artists = [ln for ax in axes for ln in ax.get_lines()]
    if legend is not None:
        artists += list(getattr(legend, "legend_handles", None) or getattr(legend, "legendHandles", []))
    for ln in artists:
        d = depth.get(ln.get_label(), 0)
        if d:
            ln.set_markersize(6 + 4 * d)
            ln.set_markerfacecolor("none")
            ln.set_markeredgewidth(1.6)
            ln.set_linewidth(1.6 + 1.2 * d)
    out = []
    for (u, o), names in pairs.items():
        where = "both panels (the curves coincide)" if len(names) == len(axes) else f"the {names[0]} panel"
        out.append(f"{u} under {o}: every point of {where}")
    return out


def accuracy_vs_bsp_note(acc: pd.DataFrame) -> str:
    """Each OSP run's final test accuracy minus BSP's (points), beside the paper's claim: whether the
    seeds' ranges of the last epoch overlap, and that osp_auto is this package's split, not the paper's
    OSP; "" without a BSP run or an OSP run."""
    last = acc[acc["epoch"] == acc["epoch"].max()]
    bsp = last[last["method"] == "ps_bsp"]
    osp = last[last["method"].isin(["osp", "osp_auto"])]
    if bsp.empty or osp.empty:
        return ""
    b = bsp.iloc[0]
    parts = []
    for rid in _runs_in_order(osp):
        r = osp[osp["run_id"] == rid].iloc[0]
        d = 100 * (float(r["test_accuracy"]) - float(b["test_accuracy"]))
        part = f"{r['label']} {d:+.1f} pts"
        if {"test_accuracy_min", "test_accuracy_max"} <= set(last.columns) and int(r.get("seeds", 1) or 1) > 1:
            overlap = (float(r["test_accuracy_max"]) >= float(b["test_accuracy_min"])
                       and float(b["test_accuracy_max"]) >= float(r["test_accuracy_min"]))
            part += " (seeds' ranges overlap)" if overlap else " (seeds' ranges apart)"
        parts.append(part)
    auto = ("; osp_auto is this package's automatic split (ours), not the paper's OSP: the claim is not about it"
            if (osp["method"] == "osp_auto").any() else "")
    return f"Final test accuracy vs BSP's (epoch {int(b['epoch'])}): " + ", ".join(parts) + auto


def plot_lgp_ablation(table: pd.DataFrame, title: str, note: str = ""):
    """One panel per stage-1 share: test accuracy per epoch of OSP with LGP, without LGP and of BSP
    (reference); the final difference LGP - no LGP in each panel's title. ``table`` is
    :func:`repro.studies.osp_train.lgp_ablation_table`."""
    shares = list(dict.fromkeys(table["panel_share"]))
    fig_h = 4.6
    fig, axes = plt.subplots(1, len(shares), figsize=(max(5.6 * len(shares), 7.0), fig_h), squeeze=False)
    seen = {}
    for a, s in zip(axes[0], shares):
        sub = table[table.panel_share == s]
        final, mean = {}, {}
        for rid in _runs_in_order(sub):
            g = sub[sub.run_id == rid].sort_values("epoch")
            r = g.iloc[0]
            kw = _line_kw(r.method)
            a.plot(g["epoch"], 100 * g["test_accuracy"], **kw)
            _seed_band(a, g["epoch"].to_numpy(dtype=float), g, "test_accuracy", kw, 100)
            final[r.method] = 100 * float(g["test_accuracy"].iloc[-1])
            mean[r.method] = 100 * float(g["test_accuracy"].mean())
            name = "BSP (reference)" if r.method == "ps_bsp" else method_label(r.method)
            seen.setdefault(name, Line2D([], [], **kw, label=name))
        a.set(ylim=(0, 100), xticks=sorted(set(sub["epoch"].astype(int))), xlabel="epoch")
        diff = final.get("osp", np.nan) - final.get("osp_nolgp", np.nan)
        dmean = mean.get("osp", np.nan) - mean.get("osp_nolgp", np.nan)
        a.set_title(f"stage 1 = {100 * s:.0f}% of the bytes ({100 - 100 * s:.0f}% one step stale)\n"
                    f"LGP − no LGP: final {diff:+.1f} pts, mean over epochs {dmean:+.1f} pts",
                    fontsize="small")
    axes[0, 0].set_ylabel("test accuracy (%)")
    top = _head(fig, title, note, 140, panel_title_lines=0, pad=0.05)
    legend_below(fig, list(seen.values()), ncol=len(seen))
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig


# -- osp.stage_ratio

def _seed_range(ax, measured: pd.DataFrame, column: str, scale: float, color: str) -> str:
    """Each point's range over its seeds (``<column>_min``/``_max`` of a table of medians over seeds) as an
    error bar, and as a band along the OSP sweep; returns what the panel shows ("median of N seeds, bars:
    their range", or "one seed: no range" when no point has more than one run)."""
    seeds = int(measured["seeds"].max()) if "seeds" in measured and measured["seeds"].notna().any() else 1
    lo, hi = f"{column}_min", f"{column}_max"
    if seeds < 2 or lo not in measured or hi not in measured:
        return "one seed: no range to show"
    m = measured.dropna(subset=[column, lo, hi])
    y = m[column].to_numpy(dtype=float) * scale
    err = np.vstack([y - m[lo].to_numpy(dtype=float) * scale, m[hi].to_numpy(dtype=float) * scale - y])
    ax.errorbar(m.stage1_bytes_share * 100, y, yerr=np.clip(err, 0, None), fmt="none", ecolor=DARK_GREY,
                elinewidth=1.2, capsize=4, zorder=6)
    sweep = m[m.point.isin(["sweep", "bsp"])].sort_values("stage1_bytes_share")
    ax.fill_between(sweep.stage1_bytes_share * 100, sweep[lo] * scale, sweep[hi] * scale, color=color, alpha=0.15,
                    lw=0, zorder=1)
    lo_n = int(m["seeds"].min()) if "seeds" in m and len(m) else seeds
    return f"median of {lo_n if lo_n == seeds else f'{lo_n}-{seeds}'} seeds; bars and band: their range"


def _band_visibility(ax, measured: pd.DataFrame, column: str, scale: float, unit: str,
                     min_frac: float = 0.03) -> str:
    """A line giving the seeds' band along the OSP sweep's width (in ``unit`` and as a share of the axis'
    height) when it is at most ``min_frac`` of the axis' height everywhere, so a thin band is not read as no
    spread (call after the y limits are set); "" else. It says how thin, not that it cannot be seen: a fill
    that thin is still drawn."""
    lo, hi = f"{column}_min", f"{column}_max"
    if lo not in measured or hi not in measured or "seeds" not in measured or int(measured["seeds"].max()) < 2:
        return ""
    sweep = measured[measured.point.isin(["sweep", "bsp"])]
    widths = ((sweep[hi] - sweep[lo]).astype(float) * scale).dropna()
    y0, y1 = ax.get_ylim()
    if widths.empty or y1 <= y0 or float(widths.max()) > min_frac * (y1 - y0):
        return ""
    share = float(widths.max()) / (y1 - y0)
    return (f"\nthe OSP line's band is thin: at most {float(widths.max()):.2g} {unit} wide "
            f"({100 * share:.0f}% of the axis)")


def plot_stage_ratio(measured: pd.DataFrame, simulated: pd.DataFrame, measured_note: str, sim_note: str,
                     note: str = "", cost_mode: str | None = None):
    """Measured throughput and final accuracy vs the stage-1 share (share 1: BSP; star: osp_auto's), each
    point's range over seeds drawn as a band; then per network the simulated throughput ÷ BSP's vs the
    share. ``measured``: :func:`repro.studies.osp_train.stage_ratio_table`; ``simulated``:
    :func:`repro.studies.osp_sim.stage_ratio_table`."""
    nets = list(dict.fromkeys(simulated["network"])) if len(simulated) else []
    sim_what = _simulated_what(simulated, cost_mode)
    ncol = max(2, len(nets))
    fig_h = 9.4
    fig = plt.figure(figsize=(5.4 * ncol + 0.6, fig_h))
    gs = fig.add_gridspec(2, ncol, hspace=0.6, wspace=0.25)
    osp_kw = _line_kw("osp")
    auto_kw = {"marker": "*", "s": 190, "color": method_style("osp_auto")["color"], "edgecolor": "black",
               "zorder": 8, "linewidths": 0.8}
    # OSP's and BSP's markers above osp_auto's larger star: where it chose one of their shares, the star
    # rings the marker instead of covering it
    bsp_kw = {"marker": method_style("ps_bsp")["marker"], "s": 60, "color": method_style("ps_bsp")["color"],
              "zorder": 9}
    over = bool(measured["oversubscribed"].fillna(False).astype(bool).any()) if len(measured) else False
    title_lines = 2
    for j, (col, ylab, scale) in enumerate((("throughput_samples_s", "throughput (samples/s, all workers)", 1.0),
                                            ("final_accuracy", "final test accuracy (%)", 100.0))):
        a = fig.add_subplot(gs[0, j])
        sweep = measured[measured.point.isin(["sweep", "bsp"])].sort_values("stage1_bytes_share")
        a.plot(sweep.stage1_bytes_share * 100, sweep[col] * scale, **{**osp_kw, "marker": ""})
        osp_pts = sweep[sweep.point == "sweep"]
        a.scatter(osp_pts.stage1_bytes_share * 100, osp_pts[col] * scale, marker=osp_kw["marker"],
                  color=osp_kw["color"], s=45, zorder=9, edgecolor="white", linewidths=0.6)
        b = measured[measured.point == "bsp"]
        a.scatter(b.stage1_bytes_share * 100, b[col] * scale, **bsp_kw)
        au = measured[measured.point == "auto"]
        a.scatter(au.stage1_bytes_share * 100, au[col] * scale, **auto_kw)
        spread = _seed_range(a, measured, col, scale, osp_kw["color"])
        for _, r in au.iterrows():
            a.annotate(f"auto: {100 * r.stage1_bytes_share:.0f}%", (100 * r.stage1_bytes_share, r[col] * scale),
                       xytext=(8, -12), textcoords="offset points", fontsize="x-small")
        a.set_xlim(-5, 105)
        a.set_xlabel("share of the gradient bytes in stage 1 (%)", fontsize="small")
        a.set_ylabel(ylab, fontsize="small")
        if col == "final_accuracy":
            a.set_ylim(0, 100)
        else:
            hi = pd.to_numeric(measured[[c for c in (col, f"{col}_max") if c in measured]].stack(), errors="coerce")
            a.set_ylim(0, float(hi.max()) * 1.12 if len(hi.dropna()) else 1)  # the seeds' range inside too
        spread += _band_visibility(a, measured, col, scale, "samples/s" if j == 0 else "pts")
        epochs = int(measured.epochs.max()) if len(measured) and measured.epochs.notna().any() else 0
        what = "throughput" if j == 0 else f"test accuracy after {epochs} epochs"
        a.set_title(f"measured {what}" + (" (oversubscribed)" if over else "") + f"\n{spread}", fontsize="small")
        title_lines = max(title_lines, 2 + spread.count("\n"))
    model_handles = {}
    for j, net in enumerate(nets):
        a = fig.add_subplot(gs[1, j])
        sub = simulated[simulated.network == net]
        for k, model in enumerate(dict.fromkeys(sub["model"])):
            g = sub[(sub.model == model) & (sub.point == "sweep")].sort_values("stage1_bytes_share")
            c, mk = MODEL_COLORS[k % len(MODEL_COLORS)], MODEL_MARKERS[k % len(MODEL_MARKERS)]
            a.plot(g.stage1_bytes_share * 100, g.speedup_vs_bsp, color=c, marker=mk, markersize=5, lw=1.4)
            au = sub[(sub.model == model) & (sub.point == "auto")]
            a.scatter(au.stage1_bytes_share * 100, au.speedup_vs_bsp, **{**auto_kw, "color": c, "s": 150})
            model_handles.setdefault(model, Line2D([], [], color=c, marker=mk, lw=1.4, label=model))
        a.axhline(1.0, color="black", lw=0.8)
        a.set(xlim=(-5, 105), ylim=(0, max(1.1, float(sub.speedup_vs_bsp.max()) * 1.12)))
        a.set_xlabel("share of the gradient bytes in stage 1 (%)", fontsize="small")
        if j == 0:
            a.set_ylabel("throughput ÷ BSP's (simulated)", fontsize="small")
        label = sub["network_label"].iloc[0] if "network_label" in sub else net
        a.set_title(f"{sim_what}, {label} link, 1 server + {int(sub['workers'].iloc[0])} workers", fontsize="small")
    handles = [Line2D([], [], **{**osp_kw, "label": "OSP (with LGP), measured"}),
               Line2D([], [], ls="", marker=bsp_kw["marker"], color=bsp_kw["color"], label="BSP (= stage 1 at 100%)"),
               Line2D([], [], ls="", marker="*", markersize=13, markerfacecolor="white", markeredgecolor="black",
                      label="osp_auto's share (line's colour; under OSP's, BSP's marker)")]
    handles += list(model_handles.values())
    text = "\n".join(t for t in (f"measured: {measured_note}", f"simulated: {sim_note}", note) if t)
    top = _head(fig, "Throughput and accuracy vs the share of the gradient synchronised in stage 1", text,
                int(14 * fig.get_figwidth()), panel_title_lines=title_lines)
    legend_below(fig, handles, ncol=min(len(handles), 5))
    fig.subplots_adjust(top=top, bottom=1.05 / fig_h, left=0.08, right=0.98)
    return fig
