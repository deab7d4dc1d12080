"""One plotting convention for every figure of the project; call :func:`use_style` once per notebook.

Every scheduler has one fixed :class:`SchedulerStyle` (colour-blind-safe colour, marker, line style,
display name, drawing order), unique per (colour, marker) pair, so it looks the same in every figure::

    ax.plot(p, speedup, **scheduler_style("mgwfbp"))      # color, label, linestyle, marker, zorder

Rules every figure follows: paper values as hollow diamonds on top; coinciding curves kept visible and
named in a note; legends never over data; bounded aspect ratios (:data:`MAX_ASPECT`); measured ÷
predicted gaps beyond :data:`GAP_FACTOR` written under the axes with their reason; oversubscribed
measurements (more ranks than CPU cores) ringed or hatched. Unknown names get a deterministic colour.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = [
    "PALETTE", "EXTRA_COLORS", "SchedulerStyle", "STYLES", "FAMILIES", "SCHEDULER_COLORS", "SCHEDULER_LABELS",
    "KIND_COLORS", "PAPER_ZORDER", "MAX_ASPECT", "OVERSUBSCRIBED_HATCH", "OVERSUBSCRIBED_LABEL", "GAP_FACTOR",
    "gap_lines", "add_gap_note", "use_style", "canonical_scheduler", "scheduler_color", "scheduler_label",
    "scheduler_marker", "scheduler_style", "paper_marker_style", "paper_handle", "kind_color",
    "panel_figsize", "legend_below", "legend_outside", "add_note", "coinciding_lines", "flat_brackets",
    "mark_oversubscribed", "oversubscribed_handle", "ordered", "ms_text", "wrap_paragraphs",
    "HiddenMarker", "hidden_markers", "hidden_markers_text", "fit_title", "fit_titles", "sparse_log_ticks",
]

# seaborn.color_palette("colorblind") (Okabe-Ito based), fixed here.
PALETTE: tuple[str, ...] = (
    "#0173b2",  # 0 blue
    "#de8f05",  # 1 orange
    "#029e73",  # 2 green
    "#d55e00",  # 3 vermillion
    "#cc78bc",  # 4 purple
    "#ca9161",  # 5 brown
    "#fbafe4",  # 6 pink
    "#949494",  # 7 grey
    "#ece133",  # 8 yellow (weak on white: not used for schedulers)
    "#56b4e9",  # 9 sky blue
)
# Paul Tol's "muted" scheme (colour-blind safe), for the families that need more colours.
EXTRA_COLORS: tuple[str, ...] = (
    "#332288",  # 0 indigo
    "#882255",  # 1 wine
    "#44aa99",  # 2 teal
)
BLACK = "#000000"
DARK_GREY = "#4d4d4d"

# Line styles (matplotlib dash patterns; proposed methods solid, baselines dashed variants).
_SOLID = "-"
_DOTTED = ":"
_DASHED = "--"
_DASH_DOT = "-."
_LONG_DASH = (0, (6, 2))
_SHORT_DASH = (0, (2, 1.5))
_DASH_DOT_DOT = (0, (4, 1.5, 1, 1.5, 1, 1.5))
_LONG_DASH_DOT = (0, (6, 2, 1, 2))
_LOOSE_DOT = (0, (1, 2.5))

PAPER_ZORDER = 10
_REFERENCE_ZORDER = 1.5
_METHOD_ZORDER = 2.0
_TOP_ZORDER = 2.6  # the exact optimum, dotted, above the method it often equals

MAX_ASPECT = 3.0  # width / height (and height / width) that save_figure accepts
OVERSUBSCRIBED_HATCH = "///"
OVERSUBSCRIBED_LABEL = "oversubscribed: more ranks than CPU cores"


@dataclass(frozen=True)
class SchedulerStyle:
    """How one scheduler is drawn everywhere."""

    color: str
    marker: str
    linestyle: Any
    label: str
    family: str
    zorder: float = _METHOD_ZORDER

    def plot_kwargs(self) -> dict[str, Any]:
        return {"color": self.color, "label": self.label, "linestyle": self.linestyle,
                "marker": self.marker, "zorder": self.zorder}


_s = SchedulerStyle
STYLES: dict[str, SchedulerStyle] = {
    # all-reduce family (MG-WFBP): repro.core.schedulers.SCHEDULERS
    "wfbp": _s(PALETTE[0], "o", _LONG_DASH, "WFBP", "allreduce"),
    "syncea": _s(EXTRA_COLORS[1], "s", _DASH_DOT, "SyncEASGD", "allreduce"),
    "threshold": _s(PALETTE[4], "^", _SHORT_DASH, "Fixed threshold", "allreduce"),
    "ddp_buckets": _s(PALETTE[2], "v", _DASH_DOT_DOT, "DDP buckets (plan)", "allreduce"),
    "mgwfbp": _s(PALETTE[3], "P", _SOLID, "MG-WFBP", "allreduce"),
    "optimal": _s(BLACK, "*", _DOTTED, "Optimal (ours, exact DP)", "allreduce", _TOP_ZORDER),
    "ddp": _s(EXTRA_COLORS[0], "X", _LONG_DASH_DOT, "PyTorch DDP", "allreduce"),
    "ddp_threshold": _s(PALETTE[9], "h", (0, (6, 2, 1, 2, 1, 2)), "DDP, threshold buckets", "allreduce"),
    "local": _s(PALETTE[5], "8", _LOOSE_DOT, "Local (no communication)", "allreduce"),
    "horovod": _s(PALETTE[9], "<", _SHORT_DASH, "Horovod (fusion)", "allreduce"),
    # DeAR
    "dear": _s(PALETTE[2], "d", _SOLID, "DeAR", "dear"),
    "bytescheduler": _s(EXTRA_COLORS[1], ">", _DASH_DOT, "ByteScheduler", "dear"),
    "dear_nofusion": _s(PALETTE[5], "p", _SOLID, "DeAR (no fusion)", "dear"),
    "dear_threshold": _s(EXTRA_COLORS[2], "d", _SOLID, "DeAR (25 MiB threshold)", "dear"),
    "dear_model": _s(PALETTE[4], "*", _SOLID, "DeAR (ours: model-tuned threshold)", "dear"),
    "dear_bo": _s(PALETTE[6], "h", _SOLID, "DeAR (BO-tuned threshold)", "dear"),
    "dear_optimal": _s(BLACK, "^", _DOTTED, "DeAR optimum (ours, exact DP)", "dear", _TOP_ZORDER),
    "fsdp": _s(PALETTE[1], "8", _LONG_DASH_DOT, "FSDP2 (no reshard)", "dear"),
    # OMGS-SGD
    "ssgd": _s(EXTRA_COLORS[0], "8", _LONG_DASH, "S-SGD (dense)", "omgs"),
    "topk_single": _s(PALETTE[1], "p", _DASH_DOT, "TopK-SGD", "omgs"),
    "topk_layerwise": _s(PALETTE[9], "v", _SHORT_DASH, "Layer-wise top-k", "omgs"),
    "omgs": _s(EXTRA_COLORS[2], "H", _SOLID, "OMGS-SGD", "omgs"),
    "omgs_optimal": _s(BLACK, "d", _DOTTED, "OMGS optimum (ours, exact DP)", "omgs", _TOP_ZORDER),
    # OSP (parameter server)
    "bsp": _s(EXTRA_COLORS[0], "s", _LONG_DASH, "BSP", "osp"),
    "asp": _s(PALETTE[1], "v", _DASH_DOT, "ASP", "osp"),
    "ssp": _s(PALETTE[4], "<", _SHORT_DASH, "SSP", "osp"),
    "osp": _s(PALETTE[2], "h", _SOLID, "OSP", "osp"),
    "osp_nolgp": _s(PALETTE[9], ">", _LONG_DASH_DOT, "OSP w/o LGP", "osp"),
    # the parameter-server schedulers (repro.core.schedulers: ps_bsp, ps_asp, ps_ssp, osp, osp_auto)
    "ps_bsp": _s(EXTRA_COLORS[0], "o", _LONG_DASH, "BSP", "osp"),
    "ps_asp": _s(PALETTE[1], "^", _DASH_DOT, "ASP", "osp"),
    "ps_ssp": _s(PALETTE[4], "P", _SHORT_DASH, "SSP", "osp"),
    "osp_auto": _s(EXTRA_COLORS[1], "*", _SOLID, "OSP (ours: automatic share)", "osp"),  # not ASP's orange's twin
    # references
    "linear": _s(PALETTE[7], "", _DASHED, "Linear", "reference", _REFERENCE_ZORDER),
    "paper": _s(DARK_GREY, "D", "", "Paper (published)", "reference", PAPER_ZORDER),
}

# Which names are drawn together (their colours must differ): each family with the references and
# the baselines its paper compares against.
FAMILIES: dict[str, tuple[str, ...]] = {
    "allreduce": ("wfbp", "syncea", "threshold", "ddp_buckets", "mgwfbp", "optimal", "ddp", "ddp_threshold",
                  "local", "linear", "paper"),
    "dear": ("dear_nofusion", "dear_threshold", "dear_model", "dear_bo", "dear_optimal", "bytescheduler", "horovod",
             "ddp", "ddp_buckets", "fsdp", "wfbp", "mgwfbp", "linear", "paper"),
    "omgs": ("ssgd", "topk_single", "topk_layerwise", "omgs", "omgs_optimal", "wfbp", "linear", "paper"),
    "osp": ("bsp", "asp", "ssp", "osp", "osp_nolgp", "linear", "paper"),
    "ps": ("ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_nolgp", "osp_auto", "linear", "paper"),
}

SCHEDULER_COLORS: dict[str, str] = {k: v.color for k, v in STYLES.items()}
SCHEDULER_LABELS: dict[str, str] = {k: v.label for k, v in STYLES.items()}

_ALIASES: dict[str, str] = {
    "syncea_sgd": "syncea", "synceasgd": "syncea", "mg_wfbp": "mgwfbp", "optimum": "optimal",
    "exact": "optimal", "exact_dp": "optimal", "published": "paper", "ideal": "linear", "s_sgd": "ssgd",
    "dense": "ssgd", "topk": "topk_single", "topk_sgd": "topk_single", "omgs_sgd": "omgs",
    "osp_no_lgp": "osp_nolgp", "osp_without_lgp": "osp_nolgp", "ddp_plan": "ddp_threshold", "none": "local",
}

# Gantt-chart colours per operation kind.
KIND_COLORS: dict[str, str] = {
    "forward": PALETTE[9], "backward": PALETTE[0], "allreduce": PALETTE[3], "reduce_scatter": PALETTE[1],
    "allgather": PALETTE[2], "sparsify": PALETTE[4], "update": PALETTE[5], "push": PALETTE[3],
    "pull": PALETTE[2], "comm": PALETTE[3], "wait": "#d9d9d9", "idle": "#d9d9d9",
}

_HASH_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">")


def _hashed_color(name: str) -> str:
    usable = [c for c in PALETTE if c != PALETTE[8]]
    return usable[zlib.crc32(name.encode("utf-8")) % len(usable)]


def canonical_scheduler(name: str) -> str:
    """Lower-case key of a scheduler name: ``"MG-WFBP"`` -> ``"mgwfbp"``, ``"SyncEA-SGD"`` -> ``"syncea"``."""
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    if key in STYLES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    squashed = key.replace("_", "")
    return next((k for k in STYLES if k.replace("_", "") == squashed), _ALIASES.get(squashed, key))


def _style(name: str) -> SchedulerStyle:
    key = canonical_scheduler(name)
    st = STYLES.get(key)
    if st is not None:
        return st
    h = zlib.crc32(key.encode("utf-8"))
    return SchedulerStyle(_hashed_color(key), _HASH_MARKERS[h % len(_HASH_MARKERS)], _SOLID, str(name), "unknown")


def scheduler_color(name: str) -> str:
    """Fixed colour (hex) of a scheduler; deterministic fallback for unknown names."""
    return _style(name).color


def scheduler_label(name: str) -> str:
    """Display name of a scheduler (``"mgwfbp"`` -> ``"MG-WFBP"``); unknown names are returned as given."""
    return _style(name).label


def scheduler_marker(name: str) -> str:
    """Marker of a scheduler (empty for the "linear" reference)."""
    return _style(name).marker


def scheduler_style(name: str) -> dict[str, Any]:
    """Keyword arguments for ``ax.plot``: color, label, linestyle, marker, zorder."""
    return _style(name).plot_kwargs()


def paper_marker_style(name: str | None = None, *, size: float = 80) -> dict[str, Any]:
    """``ax.scatter`` keywords for published values: large hollow diamonds edged in ``name``'s colour
    (dark grey without a name), above every line so the point of the same colour stays visible inside."""
    color = scheduler_color(name) if name else DARK_GREY
    return {"marker": STYLES["paper"].marker, "s": size, "facecolors": "none", "edgecolors": color,
            "linewidths": 1.6, "zorder": PAPER_ZORDER}


def paper_handle(label: str = "Paper (published)"):
    """A legend handle for published values (hollow dark-grey diamond)."""
    from matplotlib.lines import Line2D

    return Line2D([], [], ls="", marker=STYLES["paper"].marker, markersize=8, markerfacecolor="none",
                  markeredgecolor=DARK_GREY, markeredgewidth=1.6, label=label)


def kind_color(kind: str) -> str:
    """Colour of an operation kind in Gantt charts (``"allreduce"``, ``"backward"``...)."""
    key = str(kind).strip().lower().replace("-", "_").replace(" ", "_")
    key = {"all_reduce": "allreduce", "all_gather": "allgather", "reducescatter": "reduce_scatter",
           "fwd": "forward", "bwd": "backward"}.get(key, key)
    return KIND_COLORS.get(key) or _hashed_color(key)


def ordered(names: Iterable[str], order: Sequence[str]) -> list[str]:
    """``names`` once each: those in ``order`` first, in its order, then the others as they come."""
    names = list(dict.fromkeys(names))
    return [m for m in order if m in names] + [m for m in names if m not in order]


def ms_text(seconds: float) -> str:
    """Seconds as milliseconds for a title: ``"123 ms"``, or ``"12.3 ms"`` below 0.1 s."""
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def wrap_paragraphs(text: str, width: int) -> str:
    """Each line of ``text`` wrapped to ``width`` characters."""
    import textwrap

    return "\n".join(textwrap.fill(p, width) for p in text.split("\n"))


# -- layout helpers

def panel_figsize(n_panels: int, *, ncols: int | None = None, panel: tuple[float, float] = (3.4, 2.8),
                  max_cols: int = 4, extra_height: float = 0.9) -> tuple[int, int, tuple[float, float]]:
    """``(nrows, ncols, figsize)`` for ``n_panels`` small multiples of ``panel`` inches, at most ``max_cols``
    columns; ``extra_height`` (inches) leaves room for a title and a legend below."""
    n = max(1, int(n_panels))
    cols = max(1, min(ncols or max_cols, n))
    rows = -(-n // cols)
    return rows, cols, (panel[0] * cols, panel[1] * rows + extra_height)


def legend_below(fig, handles: Sequence[Any] | None = None, labels: Sequence[str] | None = None, *,
                 ncol: int | None = None, axes: Sequence[Any] | None = None, max_ncol: int = 5, **kwargs):
    """One legend for the whole figure, centred under the axes; returns it (None without handles).

    Without ``handles``, the unique handles of ``axes`` (default: all of the figure's axes). Call it
    before ``fig.tight_layout``.
    """
    if handles is None:
        seen: dict[str, Any] = {}
        for ax in (axes if axes is not None else fig.axes):
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab and not lab.startswith("_") and lab not in seen:
                    seen[lab] = h
        handles, labels = list(seen.values()), list(seen.keys())
    elif labels is None:
        labels = [h.get_label() for h in handles]
    if not handles:
        return None
    n = ncol or min(len(handles), max_ncol)
    kw = {"loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "frameon": False, "fontsize": "small",
          "borderaxespad": 0.0, **kwargs}
    return fig.legend(list(handles), list(labels), ncol=n, **kw)


def legend_outside(ax, handles: Sequence[Any] | None = None, labels: Sequence[str] | None = None, **kwargs):
    """The legend of one axes, to its right, outside the data area."""
    kw = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "frameon": False, "fontsize": "small",
          "borderaxespad": 0.0, **kwargs}
    if handles is None:
        return ax.legend(**kw)
    if labels is None:
        labels = [h.get_label() for h in handles]
    return ax.legend(list(handles), list(labels), **kw)


def add_note(ax, text: str, *, loc: str = "above", fontsize: str = "x-small"):
    """A short note: ``loc="above"`` between the axes and their title (set the title first: it is moved
    up), or boxed inside the axes in a corner (``"upper left"``, ``"lower right"``...)."""
    if loc == "above":
        title = ax.get_title()
        if title:  # moved up over every line of the note, in its own font size (set_title alone resets it)
            from matplotlib.font_manager import FontProperties

            size = ax.title.get_fontsize()
            note_pts = FontProperties(size=fontsize).get_size_in_points()
            lines = text.count("\n") + 1
            ax.set_title(title, pad=max(size * 1.35 + 4, lines * note_pts * 1.3 + 6), fontsize=size)
        return ax.annotate(text, xy=(0.5, 1.0), xycoords="axes fraction", xytext=(0, 3), textcoords="offset points",
                           ha="center", va="bottom", fontsize=fontsize, style="italic", color="#333333")
    x, ha = (0.98, "right") if "right" in loc else (0.02, "left")
    y, va = (0.03, "bottom") if "lower" in loc else (0.97, "top")
    return ax.text(x, y, text, transform=ax.transAxes, ha=ha, va=va, fontsize=fontsize, style="italic",
                   zorder=PAPER_ZORDER + 1,
                   bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": "#bbbbbb", "alpha": 0.9})


#: measured and predicted (simulated) values further apart than this factor, either way, get a note
GAP_FACTOR = 2.0


def gap_lines(items: Iterable[tuple[str, float, float, str]], *, factor: float = GAP_FACTOR,
              unit: str = "ms", scale: float = 1e3, min_value: float = 0.0) -> list[str]:
    """One line per ``(label, measured, predicted, reason)`` whose ratio ``measured / predicted`` is above
    ``factor`` or below ``1 / factor``: ``"<label>: measured 150 ms vs 10 ms predicted (15x): <reason>"``
    (values multiplied by ``scale`` and printed in ``unit``; ``reason`` may be ""); a pair with one side 0
    and the other not counts as apart. Pairs with a value that is missing, not finite or negative are
    skipped, and so are pairs whose values are both at most ``min_value`` (in the values' own unit: parts
    too small to matter). ``factor`` must be > 1."""
    import math

    if not (factor > 1 and math.isfinite(factor)):
        raise ValueError(f"factor must be a finite number > 1, got {factor}")
    out = []
    for label, measured, predicted, reason in items:
        try:
            m, p = float(measured), float(predicted)
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(m) and math.isfinite(p)) or m < 0 or p < 0 or max(m, p) <= min_value:
            continue
        if min(m, p) == 0:  # one side nothing at all: no finite ratio, and certainly more than factor apart
            ratio = "predicted none" if p == 0 else "measured none"
        else:
            r = m / p
            if 1 / factor <= r <= factor:
                continue
            ratio = f"{r:.1f}x" if r >= 1 else f"1/{1 / r:.1f}x"
        out.append(f"{label}: measured {m * scale:.3g} {unit} vs {p * scale:.3g} {unit} predicted ({ratio})"
                   + (f": {reason}" if reason else ""))
    return out


def add_gap_note(fig, lines: Sequence[str], *, width_chars: int | None = None, factor: float = GAP_FACTOR,
                 head: str | None = None, color: str = "#8a1c1c"):
    """:func:`gap_lines`' lines under the figure's axes and legends (call it after :func:`legend_below`),
    below ``head`` (default "Measured vs predicted more than <factor>x apart:"), in ``color`` (red for gaps);
    returns the text artist, None when ``lines`` is empty."""
    import textwrap

    if not lines:
        return None
    width = width_chars or max(60, int(fig.get_figwidth() * 15))
    y = -0.005
    if fig.legends:
        renderer = fig.canvas.get_renderer()
        to_fig = fig.transFigure.inverted()
        y = min(leg.get_window_extent(renderer).transformed(to_fig).y0 for leg in fig.legends) - 0.01
    head = textwrap.fill(head or f"Measured vs predicted more than {factor:g}x apart:", width)
    body = "\n".join(textwrap.fill(f"• {ln}", width, subsequent_indent="   ") for ln in lines)
    return fig.text(0.02, y, f"{head}\n{body}", ha="left", va="top", fontsize="x-small", color=color,
                    transform=fig.transFigure)


def flat_brackets(text: str) -> str:
    """``text`` without brackets inside brackets: an inner "(...)" becomes ", ..." (``"a (b, c (d))"`` ->
    ``"a (b, c, d)"``), so a title built from parts that carry their own brackets stays readable."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
            if depth > 1:
                if out and out[-1] == " ":
                    out.pop()
                out.append(", ")
                continue
        elif ch == ")":
            depth -= 1
            if depth >= 1:
                continue
        out.append(ch)
    return "".join(out)


def coinciding_lines(ax, *, rtol: float = 1e-3) -> list[tuple[str, str]]:
    """Pairs of labelled lines of ``ax`` with the same x values whose y values agree within ``rtol``."""
    import numpy as np

    lines = [ln for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")]
    out = []
    for i, a in enumerate(lines):
        xa, ya = (np.asarray(v, dtype=float) for v in a.get_data())
        for b in lines[i + 1:]:
            xb, yb = (np.asarray(v, dtype=float) for v in b.get_data())
            if xa.shape == xb.shape and xa.size and np.allclose(xa, xb) and np.allclose(ya, yb, rtol=rtol, atol=0):
                out.append((a.get_label(), b.get_label()))
    return out


def mark_oversubscribed(ax, x: Iterable[float], y: Iterable[float], *, size: float = 150, label: str | None = None):
    """Ring the points measured with more ranks than CPU cores (a black circle around each, above the data)."""
    import numpy as np

    x, y = np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)
    if not x.size:
        return None
    return ax.scatter(x, y, s=size, marker="o", facecolors="none", edgecolors=BLACK, linewidths=1.1,
                      zorder=PAPER_ZORDER - 1,
                      label=label if label is not None else "_oversubscribed")


def oversubscribed_handle(kind: str = "marker", label: str = OVERSUBSCRIBED_LABEL):
    """Legend handle for oversubscribed points (``kind="marker"``) or bars (``kind="bar"``)."""
    if kind == "bar":
        from matplotlib.patches import Patch

        return Patch(facecolor=PALETTE[7], edgecolor="white", hatch=OVERSUBSCRIBED_HATCH, label=label)
    from matplotlib.lines import Line2D

    return Line2D([], [], ls="", marker="o", markersize=11, markerfacecolor="none", markeredgecolor=BLACK,
                  markeredgewidth=1.1, label=label)


_RC_PARAMS: dict[str, Any] = {
    "figure.figsize": (6.4, 4.0), "figure.dpi": 100, "savefig.dpi": 150, "savefig.bbox": "tight",
    "axes.titlesize": "medium", "axes.titleweight": "bold", "figure.titlesize": "large",
    "figure.titleweight": "bold", "axes.labelsize": "medium", "legend.fontsize": "small",
    "legend.title_fontsize": "small", "legend.frameon": False, "grid.linewidth": 0.6, "lines.linewidth": 1.8,
    "lines.markersize": 5,
    "pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none",  # embedded TrueType: text stays editable
}


def use_style(*, context: str = "notebook", font_scale: float = 1.0) -> None:
    """Apply the project's style (seaborn whitegrid, colour-blind palette) to rcParams; idempotent, never
    changes the backend."""
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", palette=[c for c in PALETTE if c != PALETTE[8]],
                  font_scale=font_scale, rc=_RC_PARAMS)


# -- markers hidden under other markers

@dataclass(frozen=True)
class HiddenMarker:
    """A marker of line ``under`` drawn (nearly) under one of line ``over`` at ``x``, with both y values."""

    under: str
    over: str
    x: float
    y_under: float
    y_over: float


def _has_markers(line) -> bool:
    m = line.get_marker()
    return line.get_visible() and m not in (None, "", " ", "None", "none") and line.get_markersize() > 0


def hidden_markers(ax, *, overlap: float = 0.5, labelled_only: bool = True) -> list[HiddenMarker]:
    """The markers of ``ax``'s lines that another line's marker covers: two markers whose centres are
    closer than ``overlap`` times the larger one's size (on screen, with ``ax``'s current limits and
    size: call it once the limits are set), the one drawn first (lower zorder, else earlier) ``under``.
    Lines without markers, hidden ones and (with ``labelled_only``) those whose label starts with "_" are
    left out; points with a missing value are skipped."""
    import numpy as np

    lines = [ln for ln in ax.get_lines() if _has_markers(ln)
             and not (labelled_only and (not ln.get_label() or ln.get_label().startswith("_")))]
    order = {id(ln): k for k, ln in enumerate(ax.get_lines())}
    lines.sort(key=lambda ln: (ln.get_zorder(), order[id(ln)]))  # drawing order: later ones on top
    to_pts = 72.0 / ax.figure.dpi
    pts = []
    for ln in lines:
        x, y = (np.asarray(v, dtype=float) for v in ln.get_data())
        with np.errstate(all="ignore"):
            xy = ax.transData.transform(np.column_stack([x, y])) * to_pts if x.size else np.empty((0, 2))
        pts.append((x, y, xy))
    out = []
    for i, (a, (xa, ya, pa)) in enumerate(zip(lines, pts)):
        for b, (_, yb, pb) in zip(lines[i + 1:], pts[i + 1:]):
            limit = overlap * max(a.get_markersize(), b.get_markersize())
            for k in range(len(xa)):
                if not np.all(np.isfinite(pa[k])):
                    continue
                d = np.hypot(*(pb - pa[k]).T) if len(pb) else np.empty(0)
                near = np.flatnonzero(np.isfinite(d) & (d < limit))
                if near.size:
                    m = near[np.argmin(d[near])]
                    out.append(HiddenMarker(a.get_label(), b.get_label(), float(xa[k]), float(ya[k]), float(yb[m])))
    return out


def hidden_markers_text(hidden: Sequence[HiddenMarker], *, x_text=None, y_text=None, skip=()) -> str:
    """One clause per pair of lines of :func:`hidden_markers`: ``"WFBP under SyncEASGD at 2 (1.15 vs 1.15)"``
    (``x_text(x)`` and ``y_text(y)`` format the values, ``:g`` and 3 significant digits by default), "at
    every point" where no other marker of the two lines is apart; pairs in ``skip`` ((a, b) either way:
    already named, e.g. coinciding lines) left out. "" when there is none."""
    x_text = x_text or (lambda v: f"{v:g}")
    y_text = y_text or (lambda v: f"{v:.3g}")
    skip = {frozenset(p) for p in skip}
    groups: dict[tuple[str, str], list[HiddenMarker]] = {}
    for h in hidden:
        if frozenset((h.under, h.over)) not in skip:
            groups.setdefault((h.under, h.over), []).append(h)
    parts = []
    for (under, over), hs in groups.items():
        where = ", ".join(f"{x_text(h.x)} ({y_text(h.y_under)} vs {y_text(h.y_over)})" for h in hs)
        parts.append(f"{under} under {over} at {where}")
    return "; ".join(parts)


# -- text that fits

def fit_title(ax, text: str, *, fontsize: Any = "small", min_chars: int = 12, **kwargs):
    """``text`` as ``ax``'s title, each paragraph wrapped at the most characters whose widest line is no
    wider than the axes as they are now (call it after the layout, then lay out again: the title may have
    gained lines), so the title never reaches over a neighbour's labels. Returns the title."""
    renderer = ax.figure.canvas.get_renderer()
    limit = ax.get_window_extent(renderer).width
    width = max(*map(len, text.split("\n")), min_chars)
    while True:
        ax.set_title(wrap_paragraphs(text, width), fontsize=fontsize, **kwargs)
        if width <= min_chars or ax.title.get_window_extent(renderer).width <= limit:
            return ax.title
        width -= max(1, width // 20)


def fit_titles(fig, titles: Sequence[tuple[Any, str]], *, fontsize: Any = "small", rounds: int = 3, **layout):
    """:func:`fit_title` for each ``(ax, text)`` of ``titles``, alternating with ``fig.tight_layout(**layout)``
    until no title changes (at most ``rounds`` times)."""
    fig.tight_layout(**layout)
    for _ in range(rounds):
        before = [ax.get_title() for ax, _ in titles]
        for ax, text in titles:
            fit_title(ax, text, fontsize=fontsize)
        fig.tight_layout(**layout)
        if [ax.get_title() for ax, _ in titles] == before:
            break


def sparse_log_ticks(axis, *, max_ticks: int = 7) -> None:
    """Major ticks of a log ``axis`` (``ax.yaxis``, ``ax.xaxis``) at 1, 2, 5 x 10^k where at most
    ``max_ticks`` fit in its current limits, else at 1 and 3, else at powers of ten only (every second,
    third... decade as needed), labelled plainly (``200``, ``0.005``); minor ticks unlabelled. Call it once
    the limits are set."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = sorted(axis.get_view_interval())
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    for subs in ((1.0, 2.0, 5.0), (1.0, 3.0), (1.0,)):
        if decades * len(subs) <= max_ticks:
            break
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=max_ticks + 2))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())
