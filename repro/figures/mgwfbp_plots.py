"""Figures of the MG-WFBP study, each drawn from the tidy tables of :mod:`repro.studies.mgwfbp_sim`.

Every function takes DataFrames and returns a matplotlib Figure; saving is the caller's job
(:func:`repro.figures.save_figure`).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from repro.figures.plots import gantt, scheduler_lines, stacked_bars
from repro.figures.style import PALETTE, scheduler_label, scheduler_style

__all__ = ["plot_layer_sizes", "plot_cost_models", "plot_timeline", "plot_sim_speedup", "plot_optimal_gap",
           "plot_allreduce_fit", "plot_real_speedup", "plot_breakdown", "plot_threshold_sweep", "plot_convergence",
           "plot_sim_vs_real"]


def plot_layer_sizes(layers: pd.DataFrame, curve: pd.DataFrame, hist_models: Sequence[str]):
    """Top: parameters per learnable layer (log) for every model. Bottom: size histogram of two
    models' layers with the all-reduce time of each network on a second axis."""
    models = list(dict.fromkeys(layers["model"]))
    fig = plt.figure(figsize=(12, 7.5))
    grid = fig.add_gridspec(2, max(2, len(hist_models)), height_ratios=[1.2, 1])
    ax = fig.add_subplot(grid[0, :])
    for i, m in enumerate(models):
        sub = layers[layers["model"] == m]
        ax.plot(sub["layer"], sub["params"], lw=1, color=PALETTE[i % len(PALETTE)], label=m)
    ax.set_yscale("log")
    ax.set_xlabel("learnable layer (forward order)")
    ax.set_ylabel("parameters")
    ax.legend(ncol=min(len(models), 5), fontsize="small")
    ax.set_title("Gradient size per layer")
    bins = np.logspace(1, 9, 33)
    for j, m in enumerate(hist_models):
        axh = fig.add_subplot(grid[1, j])
        sub = layers[layers["model"] == m]
        axh.hist(sub["bytes"], bins=bins, color=PALETTE[0], alpha=0.7)
        axh.set_xscale("log")
        axh.set_xlabel("gradient bytes per layer")
        axh.set_ylabel("layers")
        axh.set_title(f"{m}: {len(sub)} layers")
        axt = axh.twinx()
        for k, (net, c) in enumerate(curve.groupby("network", sort=False)):
            axt.plot(c["bytes"], c["allreduce_s"] * 1e3, color=PALETTE[3 + k], lw=1.5,
                     label=f"all-reduce, {net} (P={int(c['workers'].iloc[0])})")
        axt.set_yscale("log")
        axt.set_ylabel("all-reduce time (ms)")
        axt.grid(False)
        if j == 0:
            axt.legend(fontsize="x-small", loc="upper left")
    fig.tight_layout()
    return fig


def plot_cost_models(table: pd.DataFrame, hop_note: str):
    """Start-up a and per-byte b of each all-reduce algorithm as P grows."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, (algo, g) in enumerate(table.groupby("algorithm", sort=False)):
        for ax, col, scale in ((axes[0], "a_s", 1e3), (axes[1], "b_s_per_byte", 1e9)):
            ax.plot(g["workers"], g[col] * scale, marker="o", ms=3, color=PALETTE[k], label=algo.replace("_", " "))
    for ax, ylabel in ((axes[0], "start-up a (ms)"), (axes[1], "per-byte b (ns/byte)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("workers P")
        ax.set_ylabel(ylabel)
    axes[0].legend()
    fig.suptitle(f"All-reduce cost model T(M) = a + b*M by algorithm ({hop_note})")
    fig.tight_layout()
    return fig


def plot_timeline(ops: pd.DataFrame, title: str):
    """One Gantt chart per solver (rows: compute, comm), on one time axis; buckets labelled, layers not."""
    solvers = list(dict.fromkeys(ops["solver"]))
    fig, axes = plt.subplots(len(solvers), 1, figsize=(12, 1.7 * len(solvers) + 0.8), sharex=True)
    axes = np.atleast_1d(axes)
    ops = ops.assign(label=ops["label"].where(ops["stream"] != "compute", ""))
    for i, (ax, s) in enumerate(zip(axes, solvers)):
        sub = ops[ops["solver"] == s]
        gantt(ax, sub, streams=["compute", "comm"], legend=(i == 0), label_min_width_frac=0.04)
        ax.set_ylabel(f"{scheduler_label(s)}\n{sub['iteration_s'].iloc[0] * 1e3:.1f} ms", rotation=0,
                      ha="right", va="center")
        if i < len(solvers) - 1:
            ax.set_xlabel("")
    axes[0].set_xlim(0, ops["end_s"].max() * 1e3 * 1.01)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_sim_speedup(sweep: pd.DataFrame, paper: pd.DataFrame | None = None,
                     paper_models: Sequence[str] = ()):
    """Speedup vs workers, one panel per model x network; paper numbers as markers where they apply."""
    combos = sweep[["model", "network"]].drop_duplicates().values.tolist()
    ncol = min(4, len(combos))
    nrow = int(np.ceil(len(combos) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.1 * nrow), squeeze=False)
    order = ["linear", "wfbp", "syncea", "threshold", "mgwfbp", "optimal"]
    for ax, (model, net) in zip(axes.flat, combos):
        sub = sweep[(sweep["model"] == model) & (sweep["network"] == net)]
        scheduler_lines(ax, sub, x="workers", y="speedup", hue="solver",
                        order=[s for s in order if s in set(sub["solver"])], logx=True, legend=False)
        if paper is not None and model in paper_models:
            pm = paper[paper["model"] == model.split("@")[0]]
            for solver, g in pm.groupby("solver"):
                st = scheduler_style(solver)
                ax.scatter(g["workers"], g["speedup"], marker="x", s=40, color=st["color"], zorder=5)
        ax.set_yscale("log", base=2)
        ax.set_title(f"{model}\n{net}", fontsize="small")
        ax.set_xlabel("workers")
        ax.set_ylabel("speedup")
    for ax in list(axes.flat)[len(combos):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if paper is not None and len(paper_models):
        handles.append(plt.Line2D([], [], ls="", marker="x", color="#4d4d4d"))
        labels.append("paper, measured (INFOCOM'19, K80 10GbE)")
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), bbox_to_anchor=(0.5, -0.02))
    fig.suptitle("Speedup vs number of GPUs (simulated)")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def plot_optimal_gap(gap: pd.DataFrame):
    """Distribution of MG-WFBP's extra iteration time over the exact optimum, per model and network."""
    import seaborn as sns

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    sns.stripplot(data=gap, x="model", y="gap_pct", hue="network", dodge=True, size=3, ax=axes[0], jitter=0.25)
    axes[0].set_ylabel("MG-WFBP slower than optimum (%)")
    axes[0].set_xlabel("")
    axes[0].tick_params(axis="x", rotation=30)
    axes[0].legend(fontsize="x-small", title="network")
    for k, (net, g) in enumerate(gap.groupby("network", sort=False)):
        axes[1].plot(g.groupby("workers")["gap_pct"].max(), marker="o", ms=3, color=PALETTE[k], label=net)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("workers")
    axes[1].set_ylabel("max gap over models (%)")
    axes[1].legend(fontsize="x-small")
    fig.suptitle("Gap of the MG-WFBP rule to the exact optimal merge (simulated)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Measured (training) figures
# ---------------------------------------------------------------------------------------------

def plot_allreduce_fit(times: pd.DataFrame, fits: pd.DataFrame, note: str):
    """Measured all-reduce seconds vs bytes per world size, with the fitted a + b*M lines."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for k, (p, g) in enumerate(times.groupby("workers")):
        c = PALETTE[k % len(PALETTE)]
        f = fits[fits.workers == p].iloc[0]
        ax.scatter(g["bytes"], g["seconds"] * 1e3, color=c, s=18, label=f"P={p} measured")
        x = np.geomspace(g["bytes"].min(), g["bytes"].max(), 50)
        ax.plot(x, (f.a_s + f.b_s_per_byte * x) * 1e3, color=c, lw=1.2,
                label=f"P={p} fit: a={f.a_s * 1e6:.0f} us, b={f.b_s_per_byte * 1e9:.3f} ns/B")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message bytes")
    ax.set_ylabel("all-reduce time (ms)")
    ax.legend(fontsize="x-small")
    ax.set_title(f"All-reduce on the live process group ({note})")
    fig.tight_layout()
    return fig


def plot_real_speedup(speedup: pd.DataFrame, note: str):
    """Measured speedup vs workers per model (one panel each)."""
    models = list(dict.fromkeys(speedup["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    order = ["linear", "wfbp", "syncea", "ddp", "mgwfbp", "optimal"]
    for ax, m in zip(axes.flat, models):
        sub = speedup[speedup.model == m]
        scheduler_lines(ax, sub, x="workers", y="speedup", hue="scheduler",
                        order=[s for s in order if s in set(sub.scheduler)], legend=False)
        ax.set_xticks(sorted(set(sub.workers)))
        ax.set_title(m)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.04))
    fig.suptitle(f"Measured speedup over one worker ({note})")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot_breakdown(breakdown: pd.DataFrame, note: str):
    """Stacked bars: computation and non-overlapped communication per scheduler, precision and source."""
    models = list(dict.fromkeys(breakdown["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, m in zip(axes.flat, models):
        sub = breakdown[breakdown.model == m].copy()
        sub["bar"] = (sub.scheduler.map(scheduler_label) + "\n" + sub.wire_dtype.str.replace("float", "fp")
                      + " " + sub.source.str[:4])
        sub = sub.sort_values(["wire_dtype", "scheduler", "source"])
        sub = sub.assign(computation_ms=sub.computation_s * 1e3, exposed_comm_ms=sub.exposed_comm_s * 1e3)
        stacked_bars(ax, sub, x="bar", parts=["computation_ms", "exposed_comm_ms"],
                     colors={"computation_ms": PALETTE[0], "exposed_comm_ms": PALETTE[3]},
                     labels={"computation_ms": "computation", "exposed_comm_ms": "non-overlapped communication"},
                     legend=(ax is axes.flat[0]))
        ax.tick_params(axis="x", labelsize=7, rotation=90)
        ax.set_ylabel("ms per iteration")
        ax.set_title(f"{m}, P={int(sub.workers.max())}")
    fig.suptitle(f"Iteration breakdown, measured vs simulated ({note})")
    fig.tight_layout()
    return fig


def plot_threshold_sweep(sweep: pd.DataFrame, refs: pd.DataFrame, note: str):
    """Iteration time vs fusion threshold (measured and simulated), MG-WFBP / optimal as reference lines."""
    models = list(dict.fromkeys(sweep["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.8), squeeze=False)
    for ax, m in zip(axes.flat, models):
        sub = sweep[sweep.model == m].sort_values("threshold_bytes")
        for source, ls in (("measured", "-"), ("simulated", "--")):
            s = sub[sub.source == source]
            ax.plot(s.threshold_bytes, s.iteration_s * 1e3, ls, marker="o", ms=4,
                    color=scheduler_style("threshold")["color"], label=f"fixed threshold ({source})")
        for _, r in refs[refs.model == m].iterrows():
            st = scheduler_style(r.scheduler)
            ax.axhline(r.iteration_s * 1e3, color=st["color"], ls="-" if r.source == "measured" else "--", lw=1,
                       label=f"{st['label']} ({r.source})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("fusion threshold (bytes)")
        ax.set_ylabel("iteration (ms)")
        ax.set_title(m)
        ax.legend(fontsize="x-small")
    fig.suptitle(f"Iteration time vs fixed fusion threshold, measured and simulated ({note})")
    fig.tight_layout()
    return fig


def plot_convergence(epochs: pd.DataFrame, note: str):
    """Test accuracy vs epoch per scheduler (S-SGD and MG-WFBP make identical updates)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, (s, g) in enumerate(epochs.groupby("scheduler", sort=False)):
        st = scheduler_style(s)
        g = g.sort_values("epoch")
        ax.plot(g.epoch, g.test_accuracy, color=st["color"], marker="os^"[k % 3], ms=5,
                ls="-" if k == 0 else "--", label=st["label"] if s != "ddp" else "S-SGD (PyTorch DDP)")
    ax.set_xlabel("epoch")
    ax.set_xticks(sorted(set(epochs.epoch)))
    ax.set_ylabel("test accuracy")
    ax.legend()
    ax.set_title(f"Convergence ({note})")
    fig.tight_layout()
    return fig


def plot_sim_vs_real(table: pd.DataFrame, note: str, band_pct: float = 10.0):
    """Left: simulated vs measured iteration time (y = x, +-band). Right: error per scheduler (bars:
    predicted from the warm-up trace; black ticks: from the trace measured during the run itself)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.4]})
    ax = axes[0]
    markers = dict(zip(sorted(set(table.network)), "os^Dv"))
    for (s, net), g in table.groupby(["scheduler", "network"]):
        ax.scatter(g.measured_s * 1e3, g.simulated_s * 1e3, color=scheduler_style(s)["color"], marker=markers[net],
                   s=36, label=f"{scheduler_label(s)}, {net}")
    lo, hi = 0.8 * min(table.measured_s.min(), table.simulated_s.min()) * 1e3, \
        1.2 * max(table.measured_s.max(), table.simulated_s.max()) * 1e3
    x = np.array([lo, hi])
    ax.plot(x, x, color="black", lw=1)
    ax.fill_between(x, x * (1 - band_pct / 100), x * (1 + band_pct / 100), color="grey", alpha=0.15,
                    label=f"+-{band_pct:.0f}%")
    ax.set_xlabel("measured iteration (ms)")
    ax.set_ylabel("simulated iteration (ms)")
    ax.legend(fontsize="xx-small", ncol=2)
    ax = axes[1]
    t = table.assign(case=table.model + "\n" + table.network)
    cases = list(dict.fromkeys(t.case))
    schedulers = list(dict.fromkeys(t.scheduler))
    w = 0.8 / len(schedulers)
    for k, s in enumerate(schedulers):
        g = t[t.scheduler == s].set_index("case").reindex(cases)
        xs = np.arange(len(cases)) + (k - (len(schedulers) - 1) / 2) * w
        ax.bar(xs, g.error_pct, w, color=scheduler_style(s)["color"], label=scheduler_label(s))
        if "error_inrun_pct" in g:
            inrun = pd.to_numeric(g.error_inrun_pct, errors="coerce")
            ax.scatter(xs, inrun, marker="_", s=60, color="black", zorder=5,
                       label="from the in-run trace" if k == 0 else None)
    ax.axhspan(-band_pct, band_pct, color="grey", alpha=0.15)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, fontsize="small")
    ax.set_ylabel("(simulated - measured) / measured (%)")
    ax.legend(fontsize="x-small", ncol=3)
    fig.suptitle(f"Simulated vs measured iteration time ({note})")
    fig.tight_layout()
    return fig
