"""Figures of ``notebooks/dear_training.ipynb``: measured runs at tiny scale beside the simulation at
the paper's scale, drawn from tables of :mod:`repro.studies.dear_train` and :mod:`repro.studies.dear_sim`
and returned as matplotlib Figures. Every panel says whether it is measured or simulated (``*_note``).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from repro.figures.dear_plots import method_label, method_style
from repro.figures.mgwfbp_plots import _PLAIN, _log2_x
from repro.figures.plots import flag_column
from repro.figures.style import (EXTRA_COLORS, GAP_FACTOR, OVERSUBSCRIBED_HATCH, PALETTE, add_gap_note,
                                 fit_titles, gap_lines, legend_below, ordered, wrap_paragraphs)

__all__ = ["PRIMITIVE_STYLES", "plot_primitive_cost", "plot_throughput", "plot_breakdown", "plot_buffer_sweep",
           "plot_bo_tuning", "bo_tuning_titles"]

# Communication kinds, the same colours in every figure of this module (distinct from each other and from
# the computation grey; kind_color's all-reduce and reduce-scatter are two oranges).
_RS, _AG, _AR = PALETTE[9], PALETTE[2], PALETTE[3]
PRIMITIVE_STYLES: dict[str, dict] = {
    "allreduce": {"color": _AR, "marker": "o", "label": "all-reduce (gloo)"},
    "reduce_scatter": {"color": _RS, "marker": "v", "label": "reduce-scatter (ring)"},
    "allgather": {"color": _AG, "marker": "^", "label": "all-gather (ring)"},
    "rs_plus_ag": {"color": "#222222", "marker": "s", "label": "reduce-scatter + all-gather"},
}
_MEASURED_ORDER = ("wfbp", "bytescheduler", "horovod", "ddp", "ddp_buckets", "mgwfbp", "dear_nofusion",
                   "dear_threshold", "dear_model", "dear_optimal", "dear_bo", "fsdp")


def _label(name: str) -> str:
    if name == "ddp":
        return "PyTorch DDP"
    if name == "dear_optimal" and method_label(name) == name:
        return "DeAR (exact model optimum)"
    return method_label(name)


def _color(name: str) -> str:
    return method_style(name)["color"]


def _log_ms(ax) -> None:
    """Log y axis with plain tick labels at 1, 2, 5 x 10^k (ms)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(_PLAIN)
    ax.yaxis.set_minor_formatter(NullFormatter())


def _bytes_label(v: float) -> str:
    for unit, k in (("MiB", 2**20), ("KiB", 2**10)):
        if v >= k:
            return f"{v / k:g} {unit}"
    return f"{v:g} B"


# -- dear.primitive_cost

def plot_primitive_cost(cost: pd.DataFrame, model: pd.DataFrame, measured_note: str, model_note: str):
    """Per measured world size, each primitive's measured seconds vs message size with its fitted line and
    the ring model (RS = AG = half the measured all-reduce, dashed); last panel, the cost model's seconds of
    one message vs P per preset. ``cost``: :func:`repro.studies.dear_train.primitive_cost_table`;
    ``model``: :func:`repro.studies.dear_train.primitive_model_table`."""
    ps = sorted(set(cost["workers"])) if len(cost) else []
    n = len(ps) + 1
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 4.2), squeeze=False)
    axes = axes[0]
    k_prims = len(PRIMITIVE_STYLES)
    for ax, p in zip(axes, ps):
        sub = cost[cost["workers"] == p]
        for j, (prim, st) in enumerate(PRIMITIVE_STYLES.items()):
            g = sub[sub["primitive"] == prim].sort_values("bytes")
            if g.empty:
                continue
            m = g[g["source"] == "measured"]
            # side by side around the true size (x is log2), so equal times do not hide each other
            shift = 2.0 ** (MARKER_SPREAD * (j - (k_prims - 1) / 2))
            ax.scatter(m["bytes"] * shift, m["seconds"] * 1e3, color=st["color"], marker=st["marker"], s=34,
                       zorder=3, edgecolor="white", linewidth=0.5)
            f = g[g["source"] == "fit"]
            ax.plot(f["bytes"], f["seconds"] * 1e3, color=st["color"], lw=1.2)
        r = sub[(sub["primitive"] == "reduce_scatter") & (sub["source"] == "ring model")].sort_values("bytes")
        ax.plot(r["bytes"], r["seconds"] * 1e3, color="#777777", lw=1.4, ls="--")
        ax.set_xscale("log", base=2)
        _log_ms(ax)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: _bytes_label(v)))
        ax.tick_params(axis="x", labelsize="x-small", rotation=20)
        ax.set(xlabel="message (bytes of float32)", ylabel="time (ms)")
        over = bool(sub["oversubscribed"].any()) if "oversubscribed" in sub else False
        ax.set_title(wrap_paragraphs(f"measured, P={p}" + (" (oversubscribed)" if over else "")
                                     + f"\n{measured_note}", 55), fontsize="small")
    ax = axes[-1]
    presets = list(dict.fromkeys(model["preset"])) if len(model) else []
    dashes = ["-", ":", "-.", "--"]
    for k, pre in enumerate(presets):
        for prim in ("allreduce", "reduce_scatter", "allgather"):
            st = PRIMITIVE_STYLES[prim]
            g = model[(model["preset"] == pre) & (model["primitive"] == prim)].sort_values("workers")
            ax.plot(g["workers"], g["seconds"] * 1e3, color=st["color"], marker=st["marker"], ms=4,
                    ls=dashes[k % 4], lw=1.3 if prim == "allreduce" else 1.0)
    if len(model):
        nb = int(model["bytes"].iloc[0])
        ax.set_title(wrap_paragraphs(f"model: one {_bytes_label(nb)} message vs P\n{model_note}", 55),
                     fontsize="small")
        ax.text(0.98, 0.02, "reduce-scatter and all-gather\ncoincide (each half the ring)", transform=ax.transAxes,
                ha="right", va="bottom", fontsize="x-small", style="italic")
    _log2_x(ax)
    _log_ms(ax)
    ax.set(xlabel="workers P", ylabel="time (ms)")
    handles = [Line2D([], [], color=st["color"], marker=st["marker"], ls="", label=st["label"])
               for st in PRIMITIVE_STYLES.values()]
    handles += [Line2D([], [], color="#555555", lw=1.2,
                       label="line a + b·bytes fitted to all of each primitive's sizes (least squares in log space)"),
                Line2D([], [], color="#777777", lw=1.4, ls="--",
                       label="ring model of RS or AG: ½ of the measured all-reduce")]
    handles += [Line2D([], [], color="#555555", ls=dashes[k % 4], label=f"model, preset {pre}")
                for k, pre in enumerate(presets)]
    fig.suptitle("All-reduce vs reduce-scatter vs all-gather time", fontsize="medium")
    legend_below(fig, handles, ncol=3)
    fig.tight_layout()
    add_gap_note(fig, primitive_outlier_lines(cost),
                 head=f"Measured more than {GAP_FACTOR:g}x off its primitive's fitted line (markers drawn side by "
                      "side around their true size):")
    return fig


MARKER_SPREAD = 0.12  # log2 units between the primitives' markers at one size


def primitive_outlier_lines(cost: pd.DataFrame, factor: float = GAP_FACTOR) -> list[str]:
    """:func:`repro.figures.style.gap_lines` of each measured point of ``cost`` more than ``factor`` off its
    primitive's fitted line, saying so when it is slower than a larger message (start-up noise)."""
    if not len(cost):
        return []
    items = []
    for (p, prim), g in cost.groupby(["workers", "primitive"], sort=False):
        m = g[g["source"] == "measured"].set_index("bytes")["seconds"]
        f = g[g["source"] == "fit"].set_index("bytes")["seconds"]
        for nb, sec in m.items():
            if nb not in f.index:
                continue
            larger = m[(m.index > nb) & (m < sec)]
            why = (f"slower than its {_bytes_label(float(larger.index[0]))} message "
                   f"({1e3 * float(larger.iloc[0]):.3g} ms): start-up noise, not size" if len(larger) else "")
            label = f"P={int(p)} {PRIMITIVE_STYLES.get(prim, {}).get('label', prim)}, {_bytes_label(float(nb))}"
            items.append((label, sec, f[nb], why))
    return [ln.replace(" predicted", " fitted") for ln in gap_lines(items, factor=factor)]


# -- dear.throughput_nofusion / dear.throughput_fusion

def _prediction_reason(row, factor: float) -> str:
    """Why a measured run's iteration is far from its plan's prediction, as far as its own columns tell:
    whether the trace of its timed steps (``simulated_inrun_s``) predicts it, and how many collectives
    (``buckets``) each iteration launches."""
    parts = []
    inrun, it = row.get("simulated_inrun_s"), float(row["iteration_s"])
    if inrun is not None and inrun == inrun and float(inrun) > 0:
        close = 1 / factor <= it / float(inrun) <= factor
        parts.append(f"the timed steps' own trace predicts {1e3 * float(inrun):.3g} ms"
                     + (": the warm-up trace the plan used was faster than the timed steps" if close else
                        ", so the gap is in the fitted communication lines, not in the trace"))
    b = row.get("buckets")
    if b is not None and b == b:
        parts.append(f"{int(b)} collective(s) per iteration, each paying a start-up cost on this CPU/gloo "
                     "setting that the warm-up fit may not hold")
    src = row.get("prediction_from")
    if src and src == src and src != "own plan":
        parts.append(f"prediction from {src}")
    return "; ".join(parts)


def _measured_throughput_panel(ax, measured: pd.DataFrame, schedulers: Sequence[str], note: str) -> list:
    """Draw the measured bars and predicted diamonds; return the (label, measured, predicted, reason) items
    of :func:`repro.figures.style.gap_lines` (iteration seconds)."""
    items = []
    names = [s for s in ordered(measured["scheduler"], _MEASURED_ORDER) if s in schedulers]
    models = list(dict.fromkeys(measured["model"]))
    width = 0.8 / max(1, len(names))
    top = 0.0
    for k, s in enumerate(names):
        g = measured[measured["scheduler"] == s].set_index("model").reindex(models)
        x = np.arange(len(models)) + (k - (len(names) - 1) / 2) * width
        thr = g["throughput_samples_s"].to_numpy(dtype=float)
        over = flag_column(g)
        ax.bar(x, thr, width * 0.92, color=_color(s), edgecolor="white",
               hatch=[OVERSUBSCRIBED_HATCH if o else None for o in over])
        pred = (thr * g["iteration_s"].to_numpy(dtype=float) / g["predicted_s"].to_numpy(dtype=float))
        ax.scatter(x, pred, marker="D", s=26, facecolor="white", edgecolor="black", zorder=4, linewidth=0.9)
        run = np.full(len(models), np.nan)
        if "run_iteration_s" in g:  # the same run's own median step, beside the interleaved samples' median
            run = thr * g["iteration_s"].to_numpy(dtype=float) / g["run_iteration_s"].to_numpy(dtype=float)
            ax.scatter(x, run, marker="_", s=width * 900, color="black", linewidth=1.6, zorder=5)
        top = max(top, np.nanmax(np.r_[thr, pred, run, 0.0]))
        for m, (_, row) in zip(models, g.iterrows()):
            if row.notna().any():
                items.append((f"{_label(s)} ({m}) iteration", row["iteration_s"], row["predicted_s"],
                              _prediction_reason(row, GAP_FACTOR)))
    ax.set(ylim=(0, top * 1.12 if top > 0 else 1), xticks=range(len(models)))
    ax.set_xticklabels(models, fontsize="small")
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_title(wrap_paragraphs(_measured_title(measured, note), 40), fontsize="small")
    return items


def _measured_title(measured: pd.DataFrame, note: str) -> str:
    return f"measured: {note}; {throughput_statistic(measured)}"


def _simulated_title(simulated: pd.DataFrame, net: str, note: str) -> str:
    sub = simulated[simulated["network"] == net] if len(simulated) else simulated
    p = int(sub["workers"].iloc[0]) if len(sub) else 0
    return f"simulated, {p} GPUs, {net}: {note}"


DRIFT_FACTOR = 1.5  # the runs' own medians vs the interleaved samples' median, beyond which the figure says so


def throughput_statistic(measured: pd.DataFrame) -> str:
    """What the measured bars are, from ``measured``'s columns (one quantity for the label): the median of
    the interleaved side-by-side timing samples when ``run_iteration_s`` (the run's own median step) is kept
    beside ``iteration_s``, else each run's own median step."""
    if "run_iteration_s" in measured and measured["run_iteration_s"].notna().any():
        k = measured["samples"].dropna() if "samples" in measured else pd.Series(dtype=float)
        n = f"{int(k.max())} " if len(k) and k.min() == k.max() else ""
        return (f"bars: median of {n}interleaved side-by-side timing samples; black dash: each whole run's own "
                "median step")
    return "bars: each run's own median step"


def drift_lines(measured: pd.DataFrame, schedulers: Sequence[str] | None = None,
                factor: float = DRIFT_FACTOR) -> list[str]:
    """One line per measured run whose own median step (``run_iteration_s``) and the median of its
    interleaved timing samples (``iteration_s``) are more than ``factor`` apart."""
    if not len(measured) or "run_iteration_s" not in measured:
        return []
    sub = measured if schedulers is None else measured[measured["scheduler"].isin(list(schedulers))]
    items = [(f"{_label(r.scheduler)} ({r.model})", r.iteration_s, r.run_iteration_s, "")
             for r in sub.itertuples() if r.scheduler in set(ordered(sub["scheduler"], _MEASURED_ORDER))]
    return [ln.replace(" predicted (", " whole run (").replace(": measured ", ": samples' median ")
            for ln in gap_lines(items, factor=factor)]


def _simulated_relative_panels(axes, simulated: pd.DataFrame, schedulers: Sequence[str], note: str) -> None:
    nets = list(dict.fromkeys(simulated["network"]))
    models = list(dict.fromkeys(simulated["model"]))
    names = [s for s in ordered(simulated["scheduler"], _MEASURED_ORDER) if s in schedulers]
    sub_all = simulated[simulated["scheduler"].isin(names)].copy()
    sub_all["rel"] = sub_all["throughput"] / sub_all.groupby(["model", "network"])["throughput"].transform("max")
    width = 0.8 / max(1, len(names))
    for ax, net in zip(axes, nets):
        sub = sub_all[sub_all["network"] == net]
        for k, s in enumerate(names):
            g = sub[sub["scheduler"] == s].set_index("model").reindex(models)
            ax.bar(np.arange(len(models)) + (k - (len(names) - 1) / 2) * width, g["rel"], width * 0.92,
                   color=_color(s), edgecolor="white")
        ax.set_ylim(0.0, 1.06)  # from 0: bar heights compare as ratios
        ax.set_xticks(range(len(models)), models, fontsize="x-small", rotation=25)
        ax.set_ylabel("throughput ÷ best (ratio)")
        ax.set_title(wrap_paragraphs(_simulated_title(sub, net, note), 48), fontsize="small")


RELEASED_DEAR: tuple[str, ...] = ("dear_nofusion", "dear_threshold")  # the authors' method, as released
OURS_DEAR: tuple[str, ...] = ("dear_model", "dear_optimal")               # this package's planners


def released_note(simulated: pd.DataFrame) -> str:
    """One sentence for the subtitle: DeAR as released (:data:`RELEASED_DEAR`) against the best non-DeAR
    method of the same model and network in ``simulated`` (percent faster; negative: slower), smallest and
    largest, and that :data:`OURS_DEAR` are ours; "" when the table lacks them."""
    need = {"model", "network", "scheduler", "iteration_s"}
    if simulated is None or not len(simulated) or not need <= set(simulated.columns):
        return ""
    dear = set(RELEASED_DEAR) | set(OURS_DEAR) | {"dear", "dear_bo"}
    gains = []
    for (model, net), g in simulated.groupby(["model", "network"], sort=False):
        rel, base = g[g.scheduler.isin(RELEASED_DEAR)], g[~g.scheduler.isin(dear)]
        if rel.empty or base.empty:
            continue
        gains.append((100.0 * (float(base.iteration_s.min()) / float(rel.iteration_s.min()) - 1.0), model, net))
    if not gains:
        return ""
    lo, hi = min(gains), max(gains)
    ours = [s for s in OURS_DEAR if s in set(simulated.scheduler)]
    released = [s for s in RELEASED_DEAR if s in set(simulated.scheduler)]
    return (f"DeAR as released ({' or '.join(released)}) vs the best baseline, simulated: {lo[0]:+.1f}% "
            f"({lo[1]}, {lo[2]}) to {hi[0]:+.1f}% ({hi[1]}, {hi[2]})"
            + (f"; {' and '.join(ours)} are ours (this package's planners)." if ours else "."))


def unmodelled_note(measured: pd.DataFrame, schedulers: Sequence[str], simulated: pd.DataFrame) -> str:
    """One sentence naming the measured methods drawn without a prediction (no ``predicted_s``: no diamond)
    or without a simulated bar (absent from ``simulated``); "" when every one has both."""
    if not len(measured):
        return ""
    names = [s for s in ordered(measured["scheduler"], _MEASURED_ORDER) if s in schedulers]
    sim = set(simulated["scheduler"]) if len(simulated) and "scheduler" in simulated else set()
    parts = []
    for s in names:
        g = measured[measured["scheduler"] == s]
        missing = []
        if "predicted_s" not in g or g["predicted_s"].isna().all():
            missing.append("no plan prediction (no diamond)")
        if s not in sim:
            missing.append("no simulated bar")
        if missing:
            parts.append(f"{_label(s)}: {' and '.join(missing)}")
    if not parts:
        return ""
    return "Measured without a model beside it: " + "; ".join(parts)


def plot_throughput(measured: pd.DataFrame, simulated: pd.DataFrame, schedulers: Sequence[str],
                    sim_schedulers: Sequence[str], title: str, measured_note: str, sim_note: str,
                    summary: str = ""):
    """Measured throughput of ``schedulers`` (bars; diamonds: each plan's prediction), then per network
    the simulated throughput of ``sim_schedulers`` at the paper's scale ÷ the best per model; ``summary``
    goes under the title. ``measured``: :func:`repro.studies.dear_train.throughput_table`;
    ``simulated``: :func:`repro.studies.dear_train.paper_scale_tables` (throughput)."""
    nets = list(dict.fromkeys(simulated["network"])) if len(simulated) else []
    n = 1 + len(nets)
    fig, axes = plt.subplots(1, n, figsize=(4.3 * n + 0.6, 4.6), squeeze=False,
                             gridspec_kw={"width_ratios": [0.8] + [1.2] * len(nets)})
    axes = axes[0]
    gaps = gap_lines(_measured_throughput_panel(axes[0], measured, schedulers, measured_note))
    _simulated_relative_panels(axes[1:], simulated, sim_schedulers, sim_note)
    names = ordered([*schedulers, *sim_schedulers], _MEASURED_ORDER)
    handles = [Patch(facecolor=_color(s), label=_label(s)) for s in names]
    handles.append(Line2D([], [], marker="D", ls="", markerfacecolor="white", markeredgecolor="black",
                          label="measured runs: the plan's prediction"))
    if "run_iteration_s" in measured and measured["run_iteration_s"].notna().any():
        handles.append(Line2D([], [], marker="_", ls="", markersize=12, markeredgewidth=1.6, color="black",
                              label="measured: the whole run's own median step"))
    if "oversubscribed" in measured and measured["oversubscribed"].fillna(False).astype(bool).any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch=OVERSUBSCRIBED_HATCH,
                             label="oversubscribed: more ranks than CPU cores"))
    fig.suptitle(title, fontsize="medium", y=0.995)
    top = 0.9
    drawn = simulated[simulated["scheduler"].isin(list(sim_schedulers))] if len(simulated) else simulated
    # the caller's summary and ours, each a paragraph of its own ending in a full stop
    paras = [t.strip().rstrip(".") + "." for t in (summary, released_note(drawn), unmodelled_note(measured, schedulers,
                                                                                                 drawn))
             if t and t.strip()]
    if paras:
        text = "\n".join(wrap_paragraphs(p, int(15 * fig.get_figwidth())) for p in paras)
        fig.text(0.5, 0.94, text, ha="center", va="top", fontsize="small", style="italic", color="#333333")
        top = 0.93 - 0.042 * (text.count("\n") + 1)
    legend_below(fig, handles, ncol=4)
    # each panel's title wrapped to its own width: tight_layout leaves a title's width out, so a wider one
    # would reach over the next panel's y label
    titles = [(axes[0], _measured_title(measured, measured_note))]
    titles += [(ax, _simulated_title(simulated, net, sim_note)) for ax, net in zip(axes[1:], nets)]
    fit_titles(fig, titles, rect=(0, 0, 1, top))
    drift = drift_lines(measured, schedulers)
    head = None
    if drift:
        drift = [f"the interleaved samples' median vs each whole run's own median more than {DRIFT_FACTOR:g}x "
                 "apart (whole runs measured minutes apart on shared cores; the side-by-side samples cancel that "
                 "drift): " + "; ".join(drift)]
        head = (f"Measured vs predicted more than {GAP_FACTOR:g}x apart, and measured statistics that disagree:"
                if gaps else "Measured statistics that disagree:")
    add_gap_note(fig, gaps + drift, head=head)
    return fig


# -- dear.breakdown

_PARTS = (("computation_s", "computation", "#bdbdbd"),
          ("exposed_rs_s", "exposed reduce-scatter", _RS),
          ("exposed_ag_s", "exposed all-gather", _AG),
          ("exposed_allreduce_s", "exposed all-reduce", _AR),
          ("exposed_idle_s", "idle (e.g. cycle wait)", "#ffffff"))


# Why a measured part can differ from the same run simulated: how each is measured
# (repro.studies.dear_train.MEASURED_DERIVATION) against what the simulator counts.
_PART_REASONS = {
    "computation_s": "measured: the median computation-only time of the model's runs on shared cores; simulated: "
                     "the run's own trace",
    "exposed_rs_s": "measured: the reduce-scatters still running after backward returned (the last step's timeline); "
                    "simulated: the fitted reduce-scatter line",
    "exposed_ag_s": "measured: the rest of the exposed time, i.e. the forward's waits for the CPU ring all-gathers "
                    "(point-to-point messages on a thread that shares the cores with the computation) plus any other "
                    "overhead; simulated: only the fitted all-gather line",
    "exposed_allreduce_s": "measured: iteration - computation, all counted as all-reduce (gloo on shared CPU cores); "
                           "simulated: the fitted all-reduce line",
}


def _breakdown_gaps(measured: pd.DataFrame, names: Sequence[str], floor: float = 0.10) -> list[str]:
    """:func:`repro.figures.style.gap_lines` of each measured run's parts against the same run simulated,
    one line per part (its runs, then once why the part can differ); parts under ``floor`` of the
    measured iteration, measured and simulated, are left out (too small to matter)."""
    by_part: dict[str, list[str]] = {}
    for s in names:
        m = measured[(measured["scheduler"] == s) & (measured["source"] == "measured")]
        p = measured[(measured["scheduler"] == s) & (measured["source"] == "simulated")]
        if m.empty or p.empty:
            continue
        m, p = m.iloc[0], p.iloc[0]
        it = float(m.get("iteration_s", np.nan))
        for col, part, _ in _PARTS:
            if col in _PART_REASONS and col in m and col in p:
                by_part.setdefault(col, []).extend(
                    gap_lines([(_label(s), m[col], p[col], "")], min_value=floor * it if it == it else 0.0))
    return [f"{dict((c, lab) for c, lab, _ in _PARTS)[col]}: " + "; ".join(lines) + f". {_PART_REASONS[col]}"
            for col, lines in by_part.items() if lines]


def _stack(ax, x, row, width, edge, alpha=1.0, hatch=None) -> float:
    bottom = 0.0
    for col, _, c in _PARTS:
        v = float(row.get(col, 0.0) or 0.0) * 1e3
        if v > 0:
            ax.bar(x, v, width, bottom=bottom, color=c, edgecolor=edge, linewidth=1.0, alpha=alpha, hatch=hatch)
            bottom += v
    return bottom


BREAKDOWN_STATISTIC = "bars: each whole run's own median step"
_SHORT = {"wfbp": "WFBP", "mgwfbp": "MG-WFBP", "dear_nofusion": "DeAR nf", "dear_threshold": "DeAR 25M",
          "dear_model": "DeAR model", "dear_optimal": "DeAR opt", "bytescheduler": "BytSch", "horovod": "Horovod",
          "ddp_buckets": "DDP bkt", "ddp": "DDP", "fsdp": "FSDP2", "dear_bo": "DeAR BO"}


BAR_LABEL_GAP = 3.0  # points between the axis and a bar's label
TICK_LABEL_GAP = 6.0  # points between the longest bar label and the tick labels under it


def bar_labels_under(ax, xs: Sequence[float], texts: Sequence[str], *, fontsize: float = 6) -> float:
    """Each of ``texts`` under the bar at ``xs``, written downwards from :data:`BAR_LABEL_GAP` points below
    the axis; returns the tick-label pad (points) that puts ``ax``'s x tick labels :data:`TICK_LABEL_GAP`
    under the longest, as drawn (measured, not guessed from the number of characters)."""
    renderer = ax.figure.canvas.get_renderer()
    longest = 0.0
    for x, t in zip(xs, texts):
        a = ax.annotate(t, (x, 0), xycoords=ax.get_xaxis_transform(), xytext=(0, -BAR_LABEL_GAP),
                        textcoords="offset points", rotation=90, ha="center", va="top", fontsize=fontsize,
                        annotation_clip=False)
        longest = max(longest, a.get_window_extent(renderer).height * 72.0 / ax.figure.dpi)
    return BAR_LABEL_GAP + longest + TICK_LABEL_GAP


def short_label(name: str) -> str:
    """A few characters naming a method under its bar (:data:`_SHORT`, else the scheduler's name)."""
    return _SHORT.get(name, name)


def plot_breakdown(measured: pd.DataFrame, simulated: pd.DataFrame, measured_note: str, sim_note: str):
    """Stacked bars, ms per iteration (computation, exposed reduce-scatter, all-gather, all-reduce): each
    measured run beside its own simulation (hatched), then per network the paper's models simulated at its
    scale. ``measured``: :func:`repro.studies.dear_train.measured_breakdown_table`; ``simulated``:
    :func:`repro.studies.dear_train.paper_scale_tables` (breakdown)."""
    nets = list(dict.fromkeys(simulated["network"])) if len(simulated) else []
    n = 1 + len(nets)
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n + 0.8, 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [1.0] + [1.25] * len(nets)})
    axes = axes[0]
    ax = axes[0]
    names = ordered(measured["scheduler"], _MEASURED_ORDER) if len(measured) else []
    top = 0.0
    for k, s in enumerate(names):
        for j, src in enumerate(("measured", "simulated")):
            g = measured[(measured["scheduler"] == s) & (measured["source"] == src)]
            if g.empty:
                continue
            h = _stack(ax, k + (j - 0.5) * 0.4, g.iloc[0], 0.38, _color(s), hatch=None if src == "measured" else "///")
            top = max(top, h)
    ax.set_xticks(range(len(names)), [_label(s) for s in names], fontsize="x-small", rotation=35, ha="right")
    ax.set(ylim=(0, top * 1.08 if top else 1), ylabel="ms per iteration")
    model = ", ".join(dict.fromkeys(measured["model"])) if len(measured) else ""
    ax.set_title(wrap_paragraphs(f"measured ({model}): {measured_note}; {BREAKDOWN_STATISTIC}; left bar "
                                 "measured, right bar (hatched) the run simulated", 56), fontsize="small")
    sim_names = ordered(simulated["scheduler"], _MEASURED_ORDER) if len(simulated) else []
    models = list(dict.fromkeys(simulated["model"])) if len(simulated) else []
    width = 0.8 / max(1, len(sim_names))
    for ax, net in zip(axes[1:], nets):
        sub = simulated[simulated["network"] == net]
        ticks, tick_names = [], []
        for k, s in enumerate(sim_names):
            g = sub[sub["scheduler"] == s].set_index("model").reindex(models)
            for i, m in enumerate(models):
                if m in g.index and g.loc[m].notna().any():
                    x = i + (k - (len(sim_names) - 1) / 2) * width
                    _stack(ax, x, g.loc[m], width * 0.9, _color(s))
                    ticks.append(x)
                    tick_names.append(short_label(s))
        ax.set_ylim(0, float(sub["iteration_s"].max()) * 1e3 * 1.06)
        # each bar's scheduler as a label under it; the model names further down, below the longest one
        ax.set_xticks(range(len(models)), models, fontsize="x-small")
        ax.tick_params(axis="x", which="major", length=0, pad=bar_labels_under(ax, ticks, tick_names))
        ax.set_ylabel("ms per iteration")
        ax.set_title(wrap_paragraphs(f"simulated, {int(sub['workers'].iloc[0])} GPUs, {net}: {sim_note}", 52),
                     fontsize="small")
    seen = [(lab, c) for col, lab, c in _PARTS
            if any(col in t and t[col].fillna(0).abs().sum() > 0 for t in (measured, simulated))]
    handles = [Patch(facecolor=c, edgecolor="#666666", label=lab) for lab, c in seen]
    handles += [Patch(facecolor="white", edgecolor=_color(s), linewidth=1.5,
                      label=f"outline: {_label(s)}" + (f" ('{short_label(s)}' under its bars)" if s in sim_names else ""))
                for s in ordered([*names, *sim_names], _MEASURED_ORDER)]
    handles.append(Patch(facecolor="white", edgecolor="#666666", hatch="///", label="measured run, simulated"))
    fig.suptitle("Computation vs exposed reduce-scatter vs exposed all-gather", fontsize="medium")
    legend_below(fig, handles, ncol=4)
    fig.tight_layout()
    add_gap_note(fig, _breakdown_gaps(measured, names) if len(measured) else [])
    return fig


# -- dear.buffer_sweep

def plot_buffer_sweep(measured: pd.DataFrame, references: pd.DataFrame, simulated: pd.DataFrame,
                      measured_note: str, sim_note: str):
    """DeAR's iteration vs fusion threshold, measured and each run simulated (dashed), ``references``
    (rows of :func:`repro.studies.dear_train.throughput_table`) as horizontal lines; then per network the
    paper-scale simulation ÷ each model's best threshold, ``dear_model``'s choice starred. ``measured``:
    :func:`repro.studies.dear_train.buffer_sweep_table`; ``simulated``:
    :func:`repro.studies.dear_sim.buffer_sweep_table`."""
    nets = list(dict.fromkeys(simulated["network"])) if len(simulated) else []
    n = 1 + len(nets)
    fig, axes = plt.subplots(1, n, figsize=(4.4 * n + 0.6, 4.4), squeeze=False)
    axes = axes[0]
    ax = axes[0]
    for src, ls, mk in (("measured", "-", "o"), ("simulated", "--", "")):
        g = measured[measured["source"] == src].sort_values("threshold_bytes")
        ax.plot(g["threshold_bytes"] / 1024, g["iteration_s"] * 1e3, ls=ls, marker=mk or None, color=PALETTE[0],
                lw=1.4, ms=5)
        if src == "measured":
            for r in g.itertuples():
                ax.annotate(f"{int(r.buckets)}", (r.threshold_bytes / 1024, r.iteration_s * 1e3), fontsize="x-small",
                            xytext=(0, 5), textcoords="offset points", ha="center")
    # the sweep's points are each run's own median step: the reference runs drawn by the same statistic
    # (run_iteration_s where the table keeps it beside the interleaved samples' median)
    references = references.assign(iteration_s=references["run_iteration_s"].fillna(references["iteration_s"])) \
        if "run_iteration_s" in references and len(references) else references
    for r in references.itertuples():
        ax.axhline(r.iteration_s * 1e3, color=_color(r.scheduler), lw=1.2, ls=method_style(r.scheduler)["linestyle"])
        t = getattr(r, "plan_threshold_bytes", float("nan"))
        if t == t and t is not None:  # a planner that chose a threshold: where it lands on the x axis
            ax.scatter([t / 1024], [r.iteration_s * 1e3], marker="*", s=130, color=_color(r.scheduler),
                       edgecolor="black", linewidth=0.6, zorder=6)
    _log2_x(ax)
    ax.set(xlabel="fusion threshold (KiB)", ylabel="iteration (ms)")
    ax.set_ylim(0, max([float(measured["iteration_s"].max()) if len(measured) else 0.0]
                       + [float(v) for v in references["iteration_s"]]) * 1e3 * 1.12)
    model = ", ".join(dict.fromkeys(measured["model"])) if len(measured) else ""
    ax.set_title(wrap_paragraphs(f"measured ({model}; numbers: buckets): {measured_note}; points and lines: "
                       f"{BREAKDOWN_STATISTIC.split(': ', 1)[1]}", 52), fontsize="small")
    models = list(dict.fromkeys(simulated["model"])) if len(simulated) else []
    colors = [PALETTE[i] for i in (0, 1, 2, 3, 5)] + [PALETTE[9]]
    for ax, net in zip(axes[1:], nets):
        for k, m in enumerate(models):
            g = simulated[(simulated["model"] == m) & (simulated["network"] == net)].sort_values("threshold_bytes")
            best = float(g["iteration_s"].min())
            c = colors[k % len(colors)]
            ax.step(g["threshold_mib"], g["iteration_s"] / best, where="post", color=c, lw=1.2)
            ch = g[g["model_choice"]]
            ax.scatter(ch["threshold_mib"], ch["iteration_s"] / best, marker="*", s=90, color=c, edgecolor="black",
                       zorder=5, linewidth=0.6)
            d = g[g["point"] == "default"]
            ax.scatter(d["threshold_mib"], d["iteration_s"] / best, marker="o", s=30, facecolor="none", edgecolor=c,
                       zorder=5)
        _log2_x(ax)
        ax.set(xlabel="fusion threshold (MiB)", ylabel="iteration ÷ the model's best (ratio)")
        p = int(simulated["workers"].iloc[0])
        ax.set_title(wrap_paragraphs(f"simulated, {p} GPUs, {net}: {sim_note}", 52), fontsize="small")
    handles = [Line2D([], [], color=PALETTE[0], marker="o", lw=1.4, label="DeAR threshold runs, measured"),
               Line2D([], [], color=PALETTE[0], ls="--", lw=1.4, label="the same runs, simulated")]
    handles += [Line2D([], [], color=_color(s), ls=method_style(s)["linestyle"], label=f"{_label(s)}, measured run")
                for s in dict.fromkeys(references["scheduler"])]
    if "plan_threshold_bytes" in references and references["plan_threshold_bytes"].notna().any():
        handles.append(Line2D([], [], marker="*", ls="", markersize=11, markerfacecolor=_color("dear_model"),
                              markeredgecolor="black", label="its chosen threshold (measured run)"))
    handles += [Line2D([], [], color=colors[k % len(colors)], lw=1.2, label=f"{m} (simulated)")
                for k, m in enumerate(models)]
    if models:
        handles += [Line2D([], [], marker="*", ls="", markersize=10, markerfacecolor="white", markeredgecolor="black",
                           label="dear_model's choice"),
                    Line2D([], [], marker="o", ls="", markerfacecolor="none", markeredgecolor="black",
                           label="25 MiB default")]
    fig.suptitle("DeAR iteration time vs fusion buffer size", fontsize="medium")
    legend_below(fig, handles, ncol=4)
    fig.tight_layout()
    return fig


# -- dear.bo_tuning

_SEARCH = {"bo": ("Bayesian optimisation", EXTRA_COLORS[1], "-"), "grid": ("grid search", PALETTE[0], "--"),
           "random": ("random search", PALETTE[1], ":")}
MARK_KINDS: dict[str, object] = {"measured run": "-", "predicted": (0, (1, 1)), "its threshold on the sweep": "--"}


def bo_tuning_titles(model: str, bounds: tuple[int, int], measured_note: str, *, workers: int, network: str,
                     tuning_model: str, sim_note: str) -> dict[str, str]:
    """The ``titles`` of :func:`plot_bo_tuning`, per objective of the notebook's offline searches:
    ``measured`` (the sweep of ``model`` interpolated within ``bounds``, bytes), ``model`` (the DeAR model
    of that run, same bounds) and ``paper`` (simulated at ``workers`` GPUs on preset ``network`` for
    ``tuning_model``, 1-256 MiB)."""
    lo, hi = bounds
    return {"measured": f"measured sweep of {model}, interpolated in log2(threshold), {lo}-{hi} bytes ({measured_note})",
            "model": f"DeAR model of the {model} run (its warm-up trace and fitted cost), {lo}-{hi} bytes",
            "paper": f"simulated, {workers} GPUs, {network}, {tuning_model} ({sim_note}), 1-256 MiB"}


CHOSEN_RING_S = 160.0  # scatter size (points²) of the ring around the chosen trial
TRIAL_LABEL_GAP = 4.0   # points between a trial's marker (or its ring) and its threshold label


def trial_label_sides(live: pd.DataFrame) -> list[str]:
    """Per row of ``live`` (sorted by trial), where its threshold label goes so that the dashed best-so-far
    steps cross none: "below" the trials that lowered the best so far (the step down to them rises
    straight above them), "above" the others (the best-so-far line runs level below them)."""
    best = live["best_so_far_s"].to_numpy(dtype=float)
    it = live["iteration_s"].to_numpy(dtype=float)
    return ["below" if k > 0 and best[k] < best[k - 1] and np.isclose(it[k], best[k]) else "above"
            for k in range(len(live))]


def _trial_labels(ax, live: pd.DataFrame) -> None:
    """Each trial's threshold (MiB) written along the y axis beside its marker (:func:`trial_label_sides`),
    clear of the chosen trial's ring; a label that would run under the x axis goes above, shifted right of
    the step."""
    renderer = ax.figure.canvas.get_renderer()
    to_pts = 72.0 / ax.figure.dpi
    ring = np.sqrt(CHOSEN_RING_S) / 2  # ring radius, points
    marker = 3.5
    for r, side in zip(live.itertuples(), trial_label_sides(live)):
        t = r.threshold_bytes
        txt = f"{float(t) / 2**20:.3g}" if t == t and t is not None else "initial"
        gap = (ring if bool(r.chosen) else marker) + TRIAL_LABEL_GAP
        xy = (r.trial, r.iteration_s * 1e3)
        a = ax.annotate(txt, xy, fontsize=6.5, rotation=90, xytext=(0, -gap if side == "below" else gap),
                        textcoords="offset points", ha="center", va="top" if side == "below" else "bottom")
        if side == "below":
            room = (ax.transData.transform(xy)[1] - ax.get_window_extent(renderer).y0) * to_pts
            if room < gap + a.get_window_extent(renderer).height * to_pts:  # no room under it: above, beside the step
                a.set_position((gap * 0.6, gap))
                a.set_ha("left")
                a.set_va("bottom")


def plot_bo_tuning(live: pd.DataFrame, comparison: pd.DataFrame, marks: dict[str, pd.DataFrame],
                   live_note: str, titles: dict[str, str]):
    """The live ``dear_bo`` run's trials (the chosen one ringed), then per objective of ``comparison``
    (:func:`repro.studies.dear_train.search_comparison_table`) the best-so-far seconds vs trial of BO, grid
    and random search (thin per seed, thick median), with ``marks[objective]`` (rows scheduler, seconds,
    kind in :data:`MARK_KINDS`) as horizontal lines; ``titles``: objective -> panel title."""
    objectives = list(dict.fromkeys(comparison["objective"])) if len(comparison) else []
    n = 1 + len(objectives)
    ncol = 2 if n > 2 else n
    nrow = -(-n // ncol)
    fig, grid = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.0 * nrow + 0.6), squeeze=False)
    axes = list(grid.ravel())
    for extra in axes[n:]:
        extra.set_visible(False)
    ax = axes[0]
    if len(live):
        live = live.sort_values("trial")
        ax.plot(live["trial"], live["iteration_s"] * 1e3, color=_SEARCH["bo"][1], marker="h", lw=1.0)
        ax.plot(live["trial"], live["best_so_far_s"] * 1e3, color="black", lw=1.0, ls="--", drawstyle="steps-post")
        ch = live[live["chosen"].astype(bool)]
        ax.scatter(ch["trial"], ch["iteration_s"] * 1e3, s=CHOSEN_RING_S, facecolor="none", edgecolor="black",
                   zorder=5)
        top = float(live["iteration_s"].max()) * 1e3
        ax.set_ylim(0, top * 1.3)
        fig.canvas.draw_idle()
        _trial_labels(ax, live)
    else:
        ax.text(0.5, 0.5, "no dear_bo run", ha="center", transform=ax.transAxes)
    ax.set(xlabel="trial", ylabel="iteration (ms)")
    ax.set_title(wrap_paragraphs(f"measured, live dear_bo run: {live_note}", 60), fontsize="small")
    for ax, obj in zip(axes[1:n], objectives):
        sub = comparison[comparison["objective"] == obj]
        for m, (lab, c, ls) in _SEARCH.items():
            g = sub[sub["method"] == m]
            if g.empty:
                continue
            piv = g.pivot_table(index="trial", columns="seed", values="best_so_far_s")
            for seed in piv.columns:
                ax.plot(piv.index, piv[seed] * 1e3, color=c, lw=0.6, alpha=0.45, ls=ls, drawstyle="steps-post")
            ax.plot(piv.index, piv.median(axis=1) * 1e3, color=c, lw=1.8, ls=ls, drawstyle="steps-post")
        for r in marks.get(obj, pd.DataFrame()).itertuples():
            ax.axhline(r.seconds * 1e3, color=_color(r.scheduler), lw=1.2, ls=MARK_KINDS.get(r.kind, "-"))
        ax.set(xlabel="trial", ylabel="best iteration so far (ms)")
        ax.set_title(wrap_paragraphs(titles.get(obj, obj), 60), fontsize="small")
    handles = [Line2D([], [], color=c, ls=ls, lw=1.8, label=f"{lab} (median over seeds; thin: each seed)")
               for lab, c, ls in _SEARCH.values()]
    handles += [Line2D([], [], color=_SEARCH["bo"][1], marker="h", lw=1.0, label="live BO trial, measured"),
                Line2D([], [], color="black", ls="--", label="live BO: best so far"),
                Line2D([], [], marker="o", ls="", markersize=11, markerfacecolor="none", markeredgecolor="black",
                       label="chosen buffer size (numbers: thresholds, MiB)")]
    planners = list(dict.fromkeys(s for m in marks.values() for s in m.get("scheduler", [])))
    kinds = list(dict.fromkeys(k for m in marks.values() for k in m.get("kind", [])))
    handles += [Patch(facecolor=_color(s), label=_label(s)) for s in planners]
    handles += [Line2D([], [], color="#555555", ls=MARK_KINDS.get(k, "-"), label=f"model-based planner: {k}")
                for k in kinds]
    fig.suptitle("Buffer-size tuning: Bayesian optimisation vs grid and random search", fontsize="medium")
    legend_below(fig, handles, ncol=3)
    fig.tight_layout()
    return fig
