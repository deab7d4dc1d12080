"""Small plot helpers shared by the notebooks: Gantt timelines, per-scheduler lines, stacked bars.

All of them draw on a given ``Axes`` and return it; they work under the Agg backend.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .style import (OVERSUBSCRIBED_HATCH, kind_color, legend_outside, mark_oversubscribed, oversubscribed_handle,
                    scheduler_style)

__all__ = ["gantt", "scheduler_lines", "stacked_bars", "OVERSUBSCRIBED_COLUMN"]

OVERSUBSCRIBED_COLUMN = "oversubscribed"

_OP_FIELDS = ("stream", "kind", "label", "start_s", "end_s")


def _field(op: Any, name: str, default: Any = None) -> Any:
    if isinstance(op, Mapping):
        return op.get(name, default)
    return getattr(op, name, default)


def _normalize_ops(ops: Any) -> list[dict[str, Any]]:
    if hasattr(ops, "to_dict") and hasattr(ops, "columns"):  # a pandas DataFrame
        ops = ops.to_dict("records")
    out = []
    for i, op in enumerate(ops):
        d = {k: _field(op, k) for k in _OP_FIELDS}
        for k in ("stream", "kind", "start_s", "end_s"):
            if d[k] is None:
                raise ValueError(f"operation {i} has no '{k}': {op!r}")
        d["start_s"], d["end_s"] = float(d["start_s"]), float(d["end_s"])
        if d["end_s"] < d["start_s"]:
            raise ValueError(f"operation {i} ends before it starts: {op!r}")
        d["stream"], d["kind"] = str(d["stream"]), str(d["kind"])
        d["label"] = "" if d["label"] is None else str(d["label"])
        out.append(d)
    return out


def _text_color(hex_color: str) -> str:
    h = hex_color.lstrip("#")
    if len(h) != 6:
        return "black"
    r, g, b = (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def gantt(
    ax,
    ops: Iterable[Any],
    *,
    streams: Sequence[str] | None = None,
    label_min_width_frac: float = 0.03,
    kind_colors: Mapping[str, str] | None = None,
    bar_height: float = 0.7,
    legend: bool = True,
    fontsize: float = 7,
):
    """Draw a Gantt chart of operations on ``ax`` (x axis in milliseconds); return ``ax``.

    Each op is a dict or object with ``stream``, ``kind``, ``label``, ``start_s``, ``end_s`` (a
    DataFrame with those columns works too). One row per stream, in ``streams`` order or, by default,
    in order of first appearance with "compute" first; the first row is drawn on top. Bars are
    coloured by kind (:func:`repro.figures.style.kind_color` unless ``kind_colors`` overrides it), and
    an op's label is written inside its bar when the bar is at least ``label_min_width_frac`` of the
    time span wide.
    """
    from matplotlib.patches import Patch

    items = _normalize_ops(ops)
    if streams is None:
        seen: list[str] = []
        for d in items:
            if d["stream"] not in seen:
                seen.append(d["stream"])
        streams = sorted(seen, key=lambda s: (s != "compute", seen.index(s)))
    else:
        streams = list(streams)
        unknown = sorted({d["stream"] for d in items} - set(streams))
        if unknown:
            raise ValueError(f"operations on streams not listed in streams=: {', '.join(unknown)}")
    row = {s: i for i, s in enumerate(streams)}
    colors = dict(kind_colors or {})

    def color(kind: str) -> str:
        return colors.get(kind) or kind_color(kind)

    t0 = min((d["start_s"] for d in items), default=0.0)
    t1 = max((d["end_s"] for d in items), default=0.0)
    t0 = min(t0, 0.0)
    span_ms = max((t1 - t0) * 1e3, 1e-12)

    kinds: list[str] = []
    for d in items:
        if d["kind"] not in kinds:
            kinds.append(d["kind"])
        left, width = d["start_s"] * 1e3, (d["end_s"] - d["start_s"]) * 1e3
        c = color(d["kind"])
        y = row[d["stream"]]
        ax.barh(y, width, left=left, height=bar_height, color=c, edgecolor="white", linewidth=0.6)
        if d["label"] and width >= label_min_width_frac * span_ms:
            ax.text(left + width / 2, y, d["label"], ha="center", va="center", fontsize=fontsize,
                    color=_text_color(c), clip_on=True)

    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels(streams)
    ax.set_ylim(len(streams) - 0.5, -0.5)  # first stream on top
    ax.set_xlim(t0 * 1e3, (t0 * 1e3 + span_ms * 1.01) if items else 1.0)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="y", visible=False)
    if legend and kinds:
        handles = [Patch(facecolor=color(k), label=k.replace("_", "-")) for k in kinds]
        # outside on the right: never collides with titles or bars
        ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False,
                  fontsize="small", handlelength=1.2, borderaxespad=0.2)
    return ax


def scheduler_lines(
    ax,
    df,
    *,
    x: str,
    y: str,
    hue: str = "scheduler",
    order: Sequence[str] | None = None,
    logx: bool = False,
    base: float = 2,
    markers: bool = True,
    legend: bool = True,
    mark: str | None = OVERSUBSCRIBED_COLUMN,
):
    """One line per scheduler (``hue`` column of the DataFrame ``df``), sorted by ``x``; return ``ax``.

    Colours, display names, markers, line styles and drawing order come from
    :func:`repro.figures.style.scheduler_style`, so "linear" is dashed grey, "optimal" dotted black
    (above the line it often equals) and every scheduler has its own marker. Rows whose boolean
    column ``mark`` (default ``"oversubscribed"``) is true are ringed
    (:func:`repro.figures.style.mark_oversubscribed`) and the legend says what the ring means.
    The legend goes right of the axes, outside the data. Suits speedup-vs-workers and
    time-vs-size plots.
    """
    names = list(order) if order is not None else list(dict.fromkeys(df[hue]))
    marked = False
    for name in names:
        sub = df[df[hue] == name].sort_values(x)
        if sub.empty:
            continue
        kw = scheduler_style(name)
        if not markers and kw["linestyle"]:
            kw["marker"] = ""
        ax.plot(sub[x].to_numpy(), sub[y].to_numpy(), **kw)
        if mark and mark in sub.columns:
            flag = sub[mark].fillna(False).astype(bool).to_numpy()
            if flag.any():
                mark_oversubscribed(ax, sub[x].to_numpy()[flag], sub[y].to_numpy()[flag])
                marked = True
    if logx:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log", base=base)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))  # 16, not 2^4
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if legend and names:
        handles, labels = ax.get_legend_handles_labels()
        if marked:
            h = oversubscribed_handle()
            handles, labels = handles + [h], labels + [h.get_label()]
        legend_outside(ax, handles, labels)
    return ax


def stacked_bars(
    ax,
    df,
    *,
    x: str,
    parts: Sequence[str],
    colors: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    width: float = 0.75,
    legend: bool = True,
    mark: str | None = OVERSUBSCRIBED_COLUMN,
):
    """Stacked bars, one per row of ``df``: ``x`` names the bar, ``parts`` are the stacked columns.

    Colours default to :func:`repro.figures.style.kind_color` of the part name (so "backward",
    "allreduce"... match the Gantt charts). Rows whose boolean column ``mark`` is true are hatched
    (:data:`repro.figures.style.OVERSUBSCRIBED_HATCH`). The legend goes right of the axes. Suits
    computation vs exposed-communication breakdowns.
    """
    import numpy as np

    pos = np.arange(len(df))
    bottom = np.zeros(len(df))
    flags = (df[mark].fillna(False).astype(bool).to_numpy() if mark and mark in df.columns
             else np.zeros(len(df), dtype=bool))
    for part in parts:
        vals = df[part].to_numpy(dtype=float)
        c = (colors or {}).get(part) or kind_color(part)
        bars = ax.bar(pos, vals, width, bottom=bottom, color=c, label=(labels or {}).get(part, part),
                      edgecolor="white", linewidth=0.5)
        for bar, flag in zip(bars, flags):
            if flag:
                bar.set_hatch(OVERSUBSCRIBED_HATCH)
        bottom = bottom + vals
    ax.set_xticks(pos)
    ax.set_xticklabels([str(v) for v in df[x]])
    ax.grid(axis="x", visible=False)
    if legend and len(parts):
        handles, labs = ax.get_legend_handles_labels()
        if flags.any():
            h = oversubscribed_handle("bar")
            handles, labs = handles + [h], labs + [h.get_label()]
        legend_outside(ax, handles, labs)
    return ax
