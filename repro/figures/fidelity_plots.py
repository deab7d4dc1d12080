"""Figure ``validation.fidelity``: every published number against the simulation (log-log, y = x,
±10% band), iteration times and MG-WFBP speedups side by side."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["plot_fidelity"]

_MARK = {"10gbe": "o", "100gbib": "s"}
_NET = {"10gbe": "10GbE", "100gbib": "100Gb IB"}


def plot_fidelity(rows: Any, title: str) -> Any:
    """``rows``: :func:`repro.costs.fidelity.fidelity_rows`: the paper model (hollow) and the shipped
    calibrated presets (filled) against the published numbers. Left: iteration seconds; right: speedups."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5.6))
    for ax, (q, unit) in zip(axes, (("iteration_s", "iteration time (s)"), ("speedup", "MG-WFBP speedup (x)"))):
        d = rows[rows.quantity == q]
        lo = 0.9 * min(d.published.min(), d[["paper", "shipped"]].min().min())
        hi = 1.1 * max(d.published.max(), d[["paper", "shipped"]].max().max())
        x = np.geomspace(lo, hi, 50)
        ax.plot(x, x, color="black", lw=1, label="y = x")
        ax.fill_between(x, x * 0.9, x * 1.1, color="0.85", label="±10%")
        for net, m in _MARK.items():
            s = d[d.network == net]
            ax.scatter(s.published, s.paper, marker=m, facecolors="none", edgecolors="tab:gray", s=22,
                       label=f"simulated, paper model, {_NET[net]}")
            ax.scatter(s.published, s.shipped, marker=m, color="tab:blue" if net == "10gbe" else "tab:orange", s=22,
                       label=f"simulated, calibrated preset, {_NET[net]}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        from matplotlib.ticker import FormatStrFormatter, NullFormatter

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
        ticks = [t for t in (0.2, 0.3, 0.5, 1, 2, 3) if lo <= t <= hi] if q == "iteration_s" else \
            [t for t in (0.9, 1.0, 1.2, 1.5, 2.0) if lo <= t <= hi]
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_xlabel(f"published {unit}\n(ddl-benchmarks, arXiv 2005.13247, measured)")
        ax.set_ylabel(f"simulated {unit}")
        ax.set_title("iteration time" if q == "iteration_s" else "MG-WFBP over WFBP and over BSP")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    return fig
