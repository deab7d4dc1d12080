"""Figures of the OMGS-SGD micro-benchmarks, drawn from the tables of :mod:`repro.studies.omgs_micro`
and returned as matplotlib Figures (the caller saves them).
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from repro.core.cost import topk_time_s
from repro.figures.style import (DARK_GREY, KIND_COLORS, PALETTE, add_gap_note, add_note, hidden_markers,
                                 hidden_markers_text, legend_below, mark_oversubscribed, oversubscribed_handle)

__all__ = ["plot_topk_time", "plot_allgather_fit", "plot_cost_compare", "crossover_numel", "workers_color"]

_TOPK = KIND_COLORS["sparsify"]
# the all-gather line's formula, with no-break spaces: a wrapped note never splits it
AG_FORMULA = "a\u00a0+\u00a0b·P·m"
_AG = KIND_COLORS["allgather"]
_WORKER_COLORS = {2: PALETTE[0], 3: PALETTE[1], 4: PALETTE[2], 8: PALETTE[3], 16: PALETTE[4]}
_MARKERS = ("o", "s", "^", "D", "v")


def workers_color(p: int) -> str:
    """One colour per worker count, shared by measured and published lines of the same P."""
    return _WORKER_COLORS.get(int(p), PALETTE[(int(p) % 5) + 5])


def _gamma_text(g: float) -> str:
    mant, exp = f"{g:.2e}".split("e")
    return f"{mant}e{int(exp)} s"


def _error_axis(ax, err_pct) -> None:
    """Format a panel of relative errors (%), symmetric about 0 and at least +-10 %."""
    err_pct = np.asarray(err_pct, dtype=float)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    lim = max(10.0, float(np.nanmax(np.abs(err_pct))) * 1.25) if len(err_pct) else 10.0
    ax.set(ylim=(-lim, lim), ylabel="fit error: fitted / measured - 1 (%)")
    ax.set_title("relative error of the fit per size", fontsize="small")


#: a fit error beyond this (fraction) is explained on the error panel
LARGE_FIT_ERROR = 0.5


def fit_error_note(sizes, errors, unit: str, why: str) -> str:
    """A note for an error panel whose largest absolute relative error exceeds :data:`LARGE_FIT_ERROR`:
    the sizes beyond it with their errors, then ``why``; "" when every error is within it."""
    far = [(int(n), float(e)) for n, e in zip(sizes, errors) if abs(e) > LARGE_FIT_ERROR]
    if not far:
        return ""
    listed = ", ".join(f"{e * 100:+.0f}% at {n:,} {unit}" for n, e in far)
    return f"beyond ±{LARGE_FIT_ERROR * 100:.0f}%: {listed}. {why}"


def plot_topk_time(per_size: pd.DataFrame, fits: pd.DataFrame, note: str):
    """Left (log-log): measured top-k seconds vs elements d with the fitted ``gamma d log2 d`` and the
    paper's published P102-100 line. Right: the fit's relative error per size."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
    d = per_size["numel"].to_numpy(dtype=float)
    mine = fits[fits["source"] == "measured"].iloc[0]
    pub = fits[fits["source"] == "published"].iloc[0]
    x = np.geomspace(d.min(), d.max(), 80)
    ax = axes[0]
    ax.scatter(d, per_size["measured_s"] * 1e3, color=_TOPK, marker="o", s=28, zorder=3,
               label=f"measured: {mine.device}")
    ax.plot(x, topk_time_s(mine.gamma_s, x) * 1e3, color=_TOPK, lw=1.6,
            label=f"fit γ·d·log2(d), γ = {_gamma_text(mine.gamma_s)}")
    ax.plot(x, topk_time_s(pub.gamma_s, x) * 1e3, color=DARK_GREY, ls="--", lw=1.4,
            label=f"published: P102-100 GPU, γ = {_gamma_text(pub.gamma_s)} (OMGS-SGD)")
    ax.set(xscale="log", yscale="log", xlabel="tensor size d (elements)", ylabel="top-k selection time (ms)")
    density = per_size["density"].iloc[0]
    ax.set_title(f"exact top-k of |x| (repro.families.sparse.topk), k = ⌈{density:g}·d⌉", fontsize="small")
    if abs(mine.gamma_s / pub.gamma_s - 1) < 0.25:
        add_note(ax, "the fitted and the published line nearly coincide: different hardware (CPU here, GPU there)")
    err = per_size["relative_error"].to_numpy() * 100
    axes[1].plot(d, err, color=_TOPK, marker="o", ms=5)
    _error_axis(axes[1], err)
    axes[1].set_xlabel("tensor size d (elements)")
    why = fit_error_note(d, per_size["relative_error"], "elements",
                         "Each point is the median of the repeats of one size; one γ for sizes over three decades "
                         "cannot follow both the fixed cost of a call (small d) and the sort (large d).")
    fig.suptitle(f"Top-k selection time vs tensor size ({note})")
    legend_below(fig, axes=[axes[0]], ncol=2)
    fig.tight_layout()
    add_gap_note(fig, [why] if why else [], head="The fit's error (right):")
    return fig


def plot_allgather_fit(errors: pd.DataFrame, fits: pd.DataFrame, note: str):
    """Left (log-log): measured all-gather seconds vs bytes per worker per P, with each world's fitted
    ``a + b * P * m`` (solid) and the paper's published 1GbE fits (dashed, same colour per P). Right:
    the measured fits' relative errors. Oversubscribed worlds are ringed."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), gridspec_kw={"width_ratios": [1.3, 1]})
    m = errors["bytes_per_worker"].to_numpy(dtype=float)
    x = np.geomspace(max(1.0, m.min()), m.max(), 80)
    any_over = False
    for i, (p, g) in enumerate(errors.groupby("workers")):
        f = fits[(fits["source"] == "measured") & (fits["workers"] == p)].iloc[0]
        c, mk = workers_color(p), _MARKERS[i % len(_MARKERS)]
        over = bool(g["oversubscribed"].any()) if "oversubscribed" in g else False
        any_over |= over
        tag = " (oversubscribed)" if over else ""
        axes[0].scatter(g["bytes_per_worker"], g["measured_s"] * 1e3, color=c, marker=mk, s=26, zorder=3,
                        label=f"P={p} measured{tag}")
        axes[0].plot(x, (f.a_s + f.b_s_per_byte * p * x) * 1e3, color=c, lw=1.5,
                     label=f"P={p} fit: a = {f.a_s * 1e3:.2f} ms, b = {f.b_s_per_byte * 1e9:.2f} ns/B")
        axes[1].plot(g["bytes_per_worker"], g["relative_error"] * 100, color=c, marker=mk, ms=5, label=f"P={p}")
        if over:
            mark_oversubscribed(axes[0], g["bytes_per_worker"], g["measured_s"] * 1e3)
            mark_oversubscribed(axes[1], g["bytes_per_worker"], g["relative_error"] * 100)
    for _, f in fits[fits["source"] == "published"].iterrows():
        p = int(f.workers)
        axes[0].plot(x, (f.a_s + f.b_s_per_byte * p * x) * 1e3, color=workers_color(p), ls="--", lw=1.2,
                     label=f"published 1GbE P={p}: a = {f.a_s * 1e3:.1f} ms, b = {f.b_s_per_byte * 1e9:.0f} ns/B")
    axes[0].set(xscale="log", yscale="log", xlabel="message size per worker m (bytes)", ylabel="all-gather time (ms)")
    axes[0].set_title("T(m) = a + b·P·m: measured fit (solid), published (dashed)", fontsize="small")
    _error_axis(axes[1], errors["relative_error"].to_numpy() * 100)
    axes[1].set_xlabel("message size per worker m (bytes)")
    why = fit_error_note(errors["bytes_per_worker"], errors["relative_error"], "B",
                         "Each point is the slowest rank's median of the repeats of one size on shared cores; "
                         "below a few KiB the loopback all-gather's time has no trend in size, which "
                         f"{AG_FORMULA} cannot follow (a stands for its level).")
    fig.suptitle(f"All-gather time vs message size ({note})")
    legend_below(fig, axes[0].get_legend_handles_labels()[0] + ([oversubscribed_handle()] if any_over else []), ncol=2)
    fig.tight_layout()
    add_gap_note(fig, [why] if why else [], head="The fit's error (right):")
    return fig


_QUANTITIES = {
    "topk_s": ("top-k selection of d elements", _TOPK, "o"),
    "sparse_allgather_s": ("sparse all-gather of its k values + k indices", _AG, "s"),
    "allgather_startup_s": ("all-gather start-up a", DARK_GREY, None),
}


def crossover_numel(table: pd.DataFrame, setting: str) -> int | None:
    """Smallest tensor size of ``setting`` whose top-k time exceeds the all-gather start-up (None: none)."""
    sub = table[table["setting"] == setting].pivot_table(index="numel", columns="quantity", values="seconds")
    if sub.empty or "topk_s" not in sub or "allgather_startup_s" not in sub:
        return None
    over = sub.index[sub["topk_s"] > sub["allgather_startup_s"]]
    return int(over.min()) if len(over) else None


def plot_cost_compare(table: pd.DataFrame, note: str, *, paper: bool = True):
    """Log-log seconds vs tensor size d: top-k selection, the sparse exchange (two all-gathers of
    ``4k`` bytes per worker) and one all-gather start-up; measured here (solid, markers) and, with
    ``paper``, the paper's setting from its published fits (dashed)."""
    fig, ax = plt.subplots(figsize=(7.2, 5.0))
    settings = [("measured", "-", 1.6)] + ([("paper", "--", 1.2)] if paper else [])
    for setting, ls, lw in settings:
        sub = table[table["setting"] == setting]
        if sub.empty:
            continue
        for q, (_label, color, marker) in _QUANTITIES.items():
            g = sub[sub["quantity"] == q].sort_values("numel")
            ax.plot(g["numel"], g["seconds"] * 1e3, color=color, ls=ls, lw=lw,
                    marker=marker if setting == "measured" else None, ms=5, label=f"{_label} ({setting})")
    ax.set(xscale="log", yscale="log", xlabel="tensor size d (elements)", ylabel="time (ms)")
    density = table["density"].iloc[0]
    measured_p = int(table.loc[table["setting"] == "measured", "workers"].iloc[0])
    ax.set_title(f"density {density:g} (k = ⌈{density:g}·d⌉); measured on P={measured_p} local ranks",
                 fontsize="small")
    handles = [Line2D([], [], color=c, marker=mk, lw=1.6, label=lab) for lab, c, mk in _QUANTITIES.values()]
    handles += [Line2D([], [], color="black", ls="-", lw=1.6, label="measured here (solid, markers)")]
    if paper:
        handles += [Line2D([], [], color="black", ls="--", lw=1.2,
                           label="paper setting from published fits: P102-100 γ, 1GbE all-gather at P=16 (dashed)")]
    notes = []
    for setting, _, _ in settings:
        d = crossover_numel(table, setting)
        if d is not None:
            notes.append(f"{d:,} ({'measured' if setting == 'measured' else 'paper setting'})")
    fig.suptitle(f"Top-k selection vs sparse all-gather vs all-gather start-up\n({note})")
    legend_below(fig, handles, ncol=1)
    fig.tight_layout()
    lines = ["first size d whose top-k time exceeds the start-up: " + ", ".join(notes)] if notes else []
    hidden = hidden_markers_text(hidden_markers(ax), x_text=lambda v: f"d = {v:,.0f}", y_text=lambda v: f"{v:.3g} ms")
    if hidden:  # with the final limits: a marker under another one named, not silently lost
        lines.append("markers drawn on top of each other: " + hidden)
    if lines:
        add_note(ax, "\n".join(textwrap.fill(t, 100) for t in lines))
        fig.tight_layout()
    return fig
