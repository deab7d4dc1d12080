"""Save a figure as PNG + PDF with a JSON sidecar (read by the figure index) saying where its numbers
come from; every notebook saves its figures through :func:`save_figure`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

__all__ = ["SCALES", "SOURCES", "MAX_ASPECT", "save_figure", "tag_title", "figure_stem", "normalize_source",
           "png_size"]

from repro.core.outputs import output_file, write_output  # noqa: E402

from .style import MAX_ASPECT  # noqa: E402 - the widest (or tallest) a saved figure may be

SCALES: tuple[str, ...] = ("tiny", "paper")
SOURCES: tuple[str, ...] = ("measured", "simulated", "estimate", "model", "trace")

_STEM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def figure_stem(fig_id: str) -> str:
    """Default file stem of a figure id: ``"mgwfbp.layer_sizes"`` -> ``"mgwfbp_layer_sizes"``."""
    return str(fig_id).replace(".", "_")


def normalize_source(source: str | Iterable[str]) -> str | list[str]:
    """``source`` validated: one of :data:`SOURCES`, or a non-empty list of them with duplicates dropped
    (one element comes back as a plain string); ValueError otherwise."""
    if isinstance(source, str):
        items = [source]
    else:
        try:
            items = list(source)
        except TypeError:
            raise ValueError(f"source must be a string or a list of strings, got {source!r}") from None
    if not items:
        raise ValueError(f"source must not be empty; use one or more of {', '.join(SOURCES)}")
    for s in items:
        if not isinstance(s, str) or s not in SOURCES:
            raise ValueError(f"unknown figure source {s!r}; expected one of {', '.join(SOURCES)}")
    out = list(dict.fromkeys(items))
    return out[0] if len(out) == 1 else out


def png_size(path: str | Path) -> tuple[int, int]:
    """(width, height) in pixels of a PNG file, read from its header."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or len(head) < 24:
        raise ValueError(f"{path} is not a PNG file")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _suptitle(fig) -> str:
    st = getattr(fig, "_suptitle", None)  # what Figure.get_suptitle (matplotlib >= 3.8) reads
    return st.get_text() if st is not None else ""


def _title_texts(fig) -> list[str]:
    texts = [_suptitle(fig)] + [_suptitle(sub) for sub in getattr(fig, "subfigs", []) or []]
    for ax in fig.axes:
        texts.extend(ax.get_title(loc=loc) for loc in ("center", "left", "right"))
    return [t for t in texts if t]


def tag_title(fig, *, scale: str, source: str | Iterable[str]) -> str:
    """Tag the figure's title and return the resulting title text (idempotent).

    Appends ``(tiny scale)`` when ``scale == "tiny"`` and ``(simulated)`` when ``source`` includes it,
    unless some title already says so (case-insensitive): to the suptitle if there is one, else to a
    single axes' title, else to a new suptitle.
    """
    if scale not in SCALES:
        raise ValueError(f"unknown figure scale {scale!r}; expected one of {', '.join(SCALES)}")
    src = normalize_source(source)
    sources = [src] if isinstance(src, str) else src
    joined = " ".join(_title_texts(fig)).lower()
    tags = []
    if scale == "tiny" and "tiny" not in joined:
        tags.append("(tiny scale)")
    if "simulated" in sources and "simulated" not in joined:
        tags.append("(simulated)")

    sup = _suptitle(fig)
    on_axes = not sup and len(fig.axes) == 1
    current = fig.axes[0].get_title() if on_axes else sup
    if not tags:
        return current or " ".join(_title_texts(fig))
    new = " ".join([current] + tags) if current else " ".join(tags)
    if on_axes:
        fig.axes[0].set_title(new)
    elif sup:
        fig._suptitle.set_text(new)
    else:  # just above the figure, so it cannot overlap axes titles
        fig.suptitle(new, y=1.0, va="bottom")
    return new


def save_figure(fig, fig_id: str, out_dir: str | Path, *, scale: str, source: str | Iterable[str],
                caption: str = "", paper_numbers: str | None = None, stem: str | None = None, dpi: int = 150,
                tables: Iterable[str] = ()) -> dict[str, Any]:
    """Write ``<out_dir>/<stem>.png``, ``<stem>.pdf`` and the sidecar ``<stem>.json``; return the sidecar.

    ``scale`` is ``"tiny"`` or ``"paper"``; ``source`` is one of ``measured``, ``simulated``,
    ``estimate``, ``model``, ``trace`` or a list of them; ``paper_numbers`` is a short note naming the
    published numbers drawn in the figure and where they come from (None when there are none).
    ``tables`` names the result tables (CSV stems of ``repro.results.tables.write_table``) holding
    everything the figure draws. The title is tagged first (:func:`tag_title`); the figure is not
    closed. A picture more than :data:`MAX_ASPECT` times wider than high (or higher than wide) warns.
    ValueError for a bad id, scale, source, caption, table name or stem.
    """
    if not isinstance(fig_id, str) or not fig_id.strip():
        raise ValueError(f"figure id must be a non-empty string, got {fig_id!r}")
    if scale not in SCALES:
        raise ValueError(f"unknown figure scale {scale!r}; expected one of {', '.join(SCALES)}")
    src = normalize_source(source)
    if not isinstance(caption, str):
        raise ValueError(f"caption must be a string, got {type(caption).__name__}")
    if paper_numbers is not None and not isinstance(paper_numbers, str):
        raise ValueError(f"paper_numbers must be a string or None, got {type(paper_numbers).__name__}")
    tables = [tables] if isinstance(tables, str) else list(tables)
    if not all(isinstance(t, str) and _STEM_RE.match(t) for t in tables):
        raise ValueError(f"tables must be result table names (plain file stems), got {tables!r}")
    stem = figure_stem(fig_id) if stem is None else stem
    if not _STEM_RE.match(stem):
        raise ValueError(f"figure stem {stem!r} is not a plain file name (letters, digits, '_', '-', '.')")

    title = tag_title(fig, scale=scale, source=src)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png, pdf, side = out / f"{stem}.png", out / f"{stem}.pdf", out / f"{stem}.json"
    # Written beside and renamed into place, the sidecar last: a figure whose sidecar exists is whole.
    with output_file(png) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
        width, height = png_size(tmp)
    with output_file(pdf) as tmp:  # no creation date in the PDF: the same figure gives the same file
        fig.savefig(tmp, bbox_inches="tight", metadata={"CreationDate": None})
    if max(width / height, height / width) > MAX_ASPECT:
        import warnings

        warnings.warn(f"figure {fig_id} is {width}x{height} px (aspect > {MAX_ASPECT:g}:1): hard to read in the "
                      "gallery; use small multiples or a legend below the axes", stacklevel=2)

    from repro import __version__ as version

    sidecar: dict[str, Any] = {
        "id": fig_id, "stem": stem, "title": title, "scale": scale, "source": src, "caption": caption,
        "paper_numbers": paper_numbers, "files": [png.name, pdf.name], "tables": tables,
        "size_px": [width, height], "repro_version": version,
    }
    write_output(side, json.dumps(sidecar, indent=2) + "\n")
    return sidecar
