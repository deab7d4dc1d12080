"""Plot helpers shared by the notebooks (Gantt timelines, per-scheduler lines, stacked bars); each draws
on a given ``Axes`` and returns it."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .style import (OVERSUBSCRIBED_HATCH, kind_color, legend_outside, mark_oversubscribed, oversubscribed_handle,
                    scheduler_style)

__all__ = ["gantt", "scheduler_lines", "stacked_bars", "OVERSUBSCRIBED_COLUMN", "flag_column"]

OVERSUBSCRIBED_COLUMN = "oversubscribed"

_OP_FIELDS = ("stream", "kind", "label", "start_s", "end_s")


def flag_column(df, column: str | None = OVERSUBSCRIBED_COLUMN):
    """``df[column]`` as a boolean numpy array; missing values, and a missing column, are False."""
    import numpy as np

    if not column or column not in df:
        return np.zeros(len(df), dtype=bool)
    return df[column].fillna(False).astype(bool).to_numpy()


def _normalize_ops(ops: Any) -> list[dict[str, Any]]:
    if hasattr(ops, "to_dict") and hasattr(ops, "columns"):  # a pandas DataFrame
        ops = ops.to_dict("records")
    out = []
    for i, op in enumerate(ops):
        d = {k: op.get(k) if isinstance(op, Mapping) else getattr(op, k, None) for k in _OP_FIELDS}
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


def _gantt_ops(ops, span_s: float, label_row: str, min_label_frac: float, sort_kind: str = "quicksort"):
    """Ops of a table with a ``row`` column ready for :func:`gantt` (``row`` as the stream), in start order
    (sorted with ``sort_kind``): back-to-back computation of one kind merged into one bar; only bars of
    ``label_row`` at least ``min_label_frac`` of ``span_s`` wide keep their label."""
    import pandas as pd

    out: list[dict] = []
    for r in ops.sort_values("start_s", kind=sort_kind).to_dict("records"):
        r = {**r, "stream": r["row"]}
        if r["row"] != label_row or (r["end_s"] - r["start_s"]) < min_label_frac * span_s:
            r["label"] = ""
        if r["row"] == "compute":  # the last computation bar (other rows interleave in time order)
            last = next((o for o in reversed(out) if o["stream"] == "compute"), None)
            if (last is not None and last["kind"] == r["kind"]
                    and abs(last["end_s"] - r["start_s"]) <= 1e-9 * max(1.0, span_s)):
                last["end_s"] = r["end_s"]
                continue
        out.append(r)
    return pd.DataFrame(out)


def _text_color(hex_color: str) -> str:
    h = hex_color.lstrip("#")
    if len(h) != 6:
        return "black"
    r, g, b = (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def gantt(ax, ops: Iterable[Any], *, streams: Sequence[str] | None = None, label_min_width_frac: float = 0.03,
          kind_colors: Mapping[str, str] | None = None, bar_height: float = 0.7, legend: bool = True,
          fontsize: float = 7):
    """A Gantt chart of operations on ``ax`` (x axis in ms); returns ``ax``.

    Each op is a dict or object (or DataFrame row) with ``stream``, ``kind``, ``label``, ``start_s``,
    ``end_s``; ValueError for a missing field, an op ending before it starts, or a stream not in
    ``streams``. One row per stream, top to bottom in ``streams`` order (default: first appearance,
    "compute" first). Bars are coloured by kind (``kind_colors`` over
    :func:`repro.figures.style.kind_color`); labels go inside bars at least ``label_min_width_frac`` of
    the span wide.
    """
    from matplotlib.patches import Patch

    items = _normalize_ops(ops)
    if streams is None:
        seen = list(dict.fromkeys(d["stream"] for d in items))
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

    t0 = min(min((d["start_s"] for d in items), default=0.0), 0.0)
    t1 = max((d["end_s"] for d in items), default=0.0)
    span_ms = max((t1 - t0) * 1e3, 1e-12)
    kinds = list(dict.fromkeys(d["kind"] for d in items))
    for d in items:
        left, width = d["start_s"] * 1e3, (d["end_s"] - d["start_s"]) * 1e3
        c = color(d["kind"])
        y = row[d["stream"]]
        ax.barh(y, width, left=left, height=bar_height, color=c, edgecolor="white", linewidth=0.6)
        if d["label"] and width >= label_min_width_frac * span_ms:
            ax.text(left + width / 2, y, d["label"], ha="center", va="center", fontsize=fontsize,
                    color=_text_color(c), clip_on=True)

    ax.set_yticks(range(len(streams)), streams)
    ax.set_ylim(len(streams) - 0.5, -0.5)  # first stream on top
    ax.set(xlim=(t0 * 1e3, (t0 * 1e3 + span_ms * 1.01) if items else 1.0), xlabel="time (ms)")
    ax.grid(axis="y", visible=False)
    if legend and kinds:
        handles = [Patch(facecolor=color(k), label=k.replace("_", "-")) for k in kinds]
        ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False,
                  fontsize="small", handlelength=1.2, borderaxespad=0.2)
    return ax


def scheduler_lines(ax, df, *, x: str, y: str, hue: str = "scheduler", order: Sequence[str] | None = None,
                    logx: bool = False, base: float = 2, markers: bool = True, legend: bool = True,
                    mark: str | None = OVERSUBSCRIBED_COLUMN):
    """One line per scheduler (``hue`` column of ``df``), sorted by ``x``, styled by
    :func:`repro.figures.style.scheduler_style`; returns ``ax``. Rows whose boolean column ``mark`` is
    true are ringed and the legend (right of the axes) says what the ring means."""
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
        flag = flag_column(sub, mark)
        if flag.any():
            mark_oversubscribed(ax, sub[x].to_numpy()[flag], sub[y].to_numpy()[flag])
            marked = True
    if logx:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log", base=base)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))  # 16, not 2^4
    ax.set(xlabel=x, ylabel=y)
    if legend and names:
        legend_outside(ax, ax.get_legend_handles_labels()[0] + ([oversubscribed_handle()] if marked else []))
    return ax


def stacked_bars(ax, df, *, x: str, parts: Sequence[str], colors: Mapping[str, str] | None = None,
                 labels: Mapping[str, str] | None = None, width: float = 0.75, legend: bool = True,
                 mark: str | None = OVERSUBSCRIBED_COLUMN):
    """Stacked bars, one per row of ``df``: ``x`` names the bar, ``parts`` are the stacked columns, coloured
    by :func:`repro.figures.style.kind_color` unless ``colors`` says; rows whose boolean column ``mark``
    is true are hatched. Returns ``ax``."""
    import numpy as np

    pos = np.arange(len(df))
    bottom = np.zeros(len(df))
    flags = flag_column(df, mark)
    for part in parts:
        vals = df[part].to_numpy(dtype=float)
        c = (colors or {}).get(part) or kind_color(part)
        bars = ax.bar(pos, vals, width, bottom=bottom, color=c, label=(labels or {}).get(part, part),
                      edgecolor="white", linewidth=0.5)
        for bar, flag in zip(bars, flags):
            if flag:
                bar.set_hatch(OVERSUBSCRIBED_HATCH)
        bottom = bottom + vals
    ax.set_xticks(pos, [str(v) for v in df[x]])
    ax.grid(axis="x", visible=False)
    if legend and len(parts):
        legend_outside(ax, ax.get_legend_handles_labels()[0] + ([oversubscribed_handle("bar")] if flags.any() else []))
    return ax
