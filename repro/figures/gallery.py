"""The figure gallery: ``<out>/index.html`` and ``<out>/index.md`` for a results folder, with relative
links only: per paper one card per manifest figure (thumbnail, PNG, PDF, CSV tables, executed
notebook, claim verdicts). Status words: :data:`STATES`; which tables a card lists:
:func:`figure_tables` (rules in ``docs/design/figures.md``).
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import quote

from repro.core.outputs import output_file, write_output

from .manifest import FigureEntry, load_manifest, paper_titles

__all__ = ["STATES", "STATE_HELP", "Card", "run_record_path", "read_run_record", "write_run_record",
           "notebook_html_path", "render_notebook_html", "make_thumbnail", "notebook_tables", "figure_tables",
           "collect_cards", "figure_problem", "write_index"]

STATES: tuple[str, ...] = ("done", "planned", "failed", "interrupted", "missing")
STATE_HELP: dict[str, str] = {
    "done": "figure whole (PNG decodes, PDF complete, sidecar) from a finished run of its notebook here",
    "planned": "no notebook makes it yet",
    "failed": "its notebook ran here but the figure was not made (see the notebook)",
    "interrupted": "its notebook's run here was stopped (e.g. Ctrl-C) before it made the figure; run it again",
    "missing": "its notebook has not run in this folder (make figures)",
}
THUMB_BOX: tuple[int, int] = (640, 520)  # 2x a card's picture area, for sharp thumbnails on HiDPI


# -- side files

def run_record_path(out: str | Path, notebook: str) -> Path:
    """``<out>/notebooks/<name>.run.json``: what the runner did with ``notebook`` in ``out``."""
    return Path(out) / "notebooks" / Path(notebook).with_suffix(".run.json")


def notebook_html_path(out: str | Path, notebook: str) -> Path:
    """``<out>/notebooks/<name>.html``: the executed notebook rendered by nbconvert."""
    return Path(out) / "notebooks" / Path(notebook).with_suffix(".html")


def write_run_record(out: str | Path, notebook: str, record: dict[str, Any]) -> Path:
    p = run_record_path(out, notebook)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_output(p, json.dumps({"notebook": notebook, **record}, indent=1) + "\n")
    return p


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_run_record(out: str | Path, notebook: str) -> dict[str, Any] | None:
    """The run record of ``notebook`` in ``out``, or None if it never ran there (or it is unreadable)."""
    return _read_json(run_record_path(out, notebook))


def render_notebook_html(ipynb: str | Path, html_path: str | Path | None = None) -> Path:
    """Render an executed notebook to standalone HTML with nbconvert (``lab`` template); return its path."""
    import nbformat
    from nbconvert import HTMLExporter

    ipynb = Path(ipynb)
    dst = Path(html_path) if html_path is not None else ipynb.with_suffix(".html")
    nb = nbformat.read(str(ipynb), as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb, resources={"metadata": {"name": ipynb.stem}})
    write_output(dst, body)
    return dst


def make_thumbnail(png: str | Path, thumb: str | Path, box: tuple[int, int] = THUMB_BOX) -> Path:
    """Write a copy of ``png`` downscaled to fit ``box`` (aspect kept, never upscaled), flattened onto white
    with a 256-colour palette; return its path."""
    from PIL import Image

    thumb = Path(thumb)
    thumb.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(png) as src:
        rgba = src.convert("RGBA")
        im = Image.new("RGB", rgba.size, "white")
        im.paste(rgba, mask=rgba.getchannel("A"))
        im.thumbnail(box, Image.Resampling.LANCZOS)
        im = im.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        with output_file(thumb) as tmp:
            im.save(tmp, format="PNG", optimize=True)
    return thumb


def _fresh(derived: Path, source: Path) -> bool:
    return derived.is_file() and derived.stat().st_mtime_ns >= source.stat().st_mtime_ns


# -- tables

def _parse_time(value: Any) -> _dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        t = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def _tables_in_time_window(data_dir: Path, executed: Path) -> list[str]:
    """Tables whose write_table time lies within the executed notebook's papermill start/end."""
    nb = _read_json(executed)
    pm = ((nb or {}).get("metadata") or {}).get("papermill") or {}
    start, end = _parse_time(pm.get("start_time")), _parse_time(pm.get("end_time"))
    if start is None or end is None:
        return []
    slack = _dt.timedelta(seconds=1)  # time_utc is rounded down to whole seconds
    names = []
    for name in sorted(p.stem for p in data_dir.glob("*.csv")):
        meta = _read_json(data_dir / f"{name}.json") or {}
        t = _parse_time((meta.get("environment") or {}).get("time_utc"))
        if t is not None and start - slack <= t <= end + slack:
            names.append(name)
    return names


def notebook_tables(out: str | Path, notebook: str, record: dict[str, Any] | None = None) -> list[str]:
    """Names of the ``data/`` tables written by ``notebook`` in ``out``: its run record's list, else those
    written while its executed copy ran (a notebook run by hand with papermill)."""
    out = Path(out)
    data_dir = out / "data"
    if record is None:
        record = read_run_record(out, notebook)
    if record is not None and isinstance(record.get("tables"), list):
        return [str(t) for t in record["tables"] if (data_dir / f"{t}.csv").is_file()]
    executed = out / "notebooks" / notebook
    return _tables_in_time_window(data_dir, executed) if executed.is_file() else []


def _sidecar_table_name(item: Any) -> str | None:
    if not isinstance(item, str) or not item.strip():
        return None
    name = Path(item.strip()).name
    return name[:-4] if name.endswith(".csv") else name


def figure_tables(out: str | Path, entry: FigureEntry, sidecar: dict[str, Any] | None = None,
                  record: dict[str, Any] | None = None) -> tuple[list[str], list[str], str]:
    """The tables ``entry`` is drawn from: ``(present names, absent names, rule)``, by the first rule that
    gives one: ``"sidecar"`` (its sidecar's ``tables``; absent names only come from it), ``"name"`` (tables
    its notebook wrote named ``<stem>`` or ``<stem>_*``), ``"notebook"`` (all its notebook wrote), else
    ``""``."""
    out = Path(out)
    data_dir = out / "data"
    listed = (sidecar or {}).get("tables")
    if isinstance(listed, (list, tuple)) and listed:
        names = list(dict.fromkeys(n for n in (_sidecar_table_name(t) for t in listed) if n))
        present = [n for n in names if (data_dir / f"{n}.csv").is_file()]
        if names:
            return present, [n for n in names if n not in present], "sidecar"
    written = notebook_tables(out, entry.notebook, record)
    named = [n for n in written if n == entry.stem or n.startswith(entry.stem + "_")]
    if named:
        return named, [], "name"
    if written:
        return written, [], "notebook"
    return [], [], ""


# -- cards

@dataclass
class Card:
    """One figure as the index shows it; paths are relative to the index's folder (POSIX)."""

    entry: FigureEntry
    state: str
    png: str | None = None
    pdf: str | None = None
    thumb: str | None = None
    notebook_html: str | None = None
    tables: list[str] = field(default_factory=list)          # relative CSV paths
    other_tables: list[str] = field(default_factory=list)    # the notebook's other tables (rule "name")
    tables_absent: list[str] = field(default_factory=list)   # names a sidecar lists but data/ lacks
    tables_rule: str = ""
    scale: str | None = None
    source: str | None = None
    caption: str = ""
    paper_numbers: str = ""
    error: str = ""                                           # the notebook's failure, if it failed
    claims: list[dict[str, str]] = field(default_factory=list)  # verdicts: claim_id, verdict, line

    @property
    def anchor(self) -> str:
        return self.entry.stem


def _source_text(src: Any) -> str | None:
    if isinstance(src, list):
        return " + ".join(str(s) for s in src) or None
    return str(src) if src else None


def _rel(out: Path, p: Path) -> str:
    return p.relative_to(out).as_posix()


def _nonempty(p: Path) -> bool:
    return p.is_file() and p.stat().st_size > 0


def _png_problem(png: Path) -> str | None:
    if not _nonempty(png):
        return f"{png.name} is missing or empty"
    try:
        from PIL import Image

        with Image.open(png) as im:
            im.load()  # decodes every pixel: a truncated file fails here
    except Exception as exc:
        return f"{png.name} does not decode ({type(exc).__name__})"
    return None


def _pdf_problem(pdf: Path) -> str | None:
    if not _nonempty(pdf):
        return f"{pdf.name} is missing or empty"
    with open(pdf, "rb") as f:
        head = f.read(5)
        f.seek(max(0, pdf.stat().st_size - 1024))
        tail = f.read()
    if head != b"%PDF-" or b"%%EOF" not in tail:
        return f"{pdf.name} is not a whole PDF"
    return None


def figure_problem(files: dict[str, Path]) -> str | None:
    """Why the figure at ``files`` (``png``, ``pdf``, ``json`` paths, as ``FigureEntry.files`` gives them)
    is not whole, or None when it is: the PNG decodes, the PDF has its header and end marker, and the
    sidecar (written last by :func:`repro.figures.save_figure`) is a JSON object."""
    absent = [files[x].name for x in ("png", "pdf") if not _nonempty(files[x])]
    if absent:
        return "missing " + ", ".join(absent)
    problems = [p for p in (_png_problem(files["png"]), _pdf_problem(files["pdf"])) if p]
    if not problems and _read_json(files["json"]) is None:
        problems.append(f"{files['json'].name} (the sidecar) is missing or unreadable")
    return ", ".join(problems) or None


def _executed_status(out: Path, notebook: str) -> dict[str, Any] | None:
    """A run record for a notebook executed by hand with papermill into ``notebooks/``: from the
    executed copy's papermill metadata, when papermill finished it (an end time); else None."""
    nb = _read_json(out / "notebooks" / notebook)
    pm = ((nb or {}).get("metadata") or {}).get("papermill") or {}
    if not pm.get("end_time"):
        return None
    failed = bool(pm.get("exception"))
    return {"status": "failed" if failed else "done", "error": "the notebook failed (see it)" if failed else None,
            "by_hand": True}


def collect_cards(out: str | Path, entries: Sequence[FigureEntry], *,
                  warn: Callable[[str], None] | None = None) -> list[Card]:
    """A :class:`Card` per manifest entry, refreshing thumbnails and notebook HTML on the way."""
    out = Path(out).resolve()
    warn = warn or (lambda _msg: None)
    records: dict[str, dict[str, Any] | None] = {}
    html_links: dict[str, str | None] = {}
    cards = []
    for e in entries:
        if not e.done:
            cards.append(Card(entry=e, state="planned"))
            continue
        if e.notebook not in records:
            records[e.notebook] = (read_run_record(out, e.notebook)
                                   or _executed_status(out, e.notebook))
            html_links[e.notebook] = _notebook_link(out, e.notebook, warn)
        record = records[e.notebook]
        files = e.files(out / "figures")
        problem = figure_problem(files)
        stopped = record is None and (out / "notebooks" / e.notebook).is_file()  # no record: runner stopped
        interrupted = stopped or (record is not None and record.get("status") == "interrupted")
        if record is not None and problem is None:
            state = "done"  # a run of its notebook here made it (the runner deleted older files first)
        elif interrupted:
            state = "interrupted"
        elif record is not None:
            state = "failed"
        else:
            state = "missing"  # never run here (files without a finished run are not trusted)
        card = Card(entry=e, state=state, notebook_html=html_links[e.notebook])
        if record is not None and record.get("status") in ("failed", "interrupted"):
            card.error = str(record.get("error") or f"the notebook {record['status']}")
        elif stopped:
            card.error = "its run stopped part-way (no run record): interrupted"
        elif state == "failed" and problem:
            card.error = problem
        if _png_problem(files["png"]) is None:
            card.png = _rel(out, files["png"])
            thumb = out / "figures" / "thumbs" / files["png"].name
            try:
                if not _fresh(thumb, files["png"]):
                    make_thumbnail(files["png"], thumb)
                card.thumb = _rel(out, thumb)
            except Exception as exc:  # a PNG Pillow cannot read: show the full picture instead
                warn(f"warning: no thumbnail for {e.id}: {type(exc).__name__}: {exc}")
                card.thumb = card.png
        if _pdf_problem(files["pdf"]) is None:
            card.pdf = _rel(out, files["pdf"])
        side = _read_json(files["json"])
        if side:
            card.scale = str(side["scale"]) if side.get("scale") else None
            card.source = _source_text(side.get("source"))
            card.caption = str(side.get("caption") or "")
            card.paper_numbers = str(side.get("paper_numbers") or "")
        if state == "done":
            card.claims = _card_claims(out, e, record, warn)
            present, absent, rule = figure_tables(out, e, side, record)
            card.tables = [_rel(out, out / "data" / f"{n}.csv") for n in present]
            card.tables_absent, card.tables_rule = absent, rule
            if rule == "name":
                others = [n for n in notebook_tables(out, e.notebook, record) if n not in present]
                card.other_tables = [_rel(out, out / "data" / f"{n}.csv") for n in others]
        cards.append(card)
    return cards


def _card_claims(out: Path, entry: FigureEntry, record: dict[str, Any] | None,
                 warn: Callable[[str], None]) -> list[dict[str, str]]:
    """The claim verdicts of ``entry``: those its run record holds (the runner stored them after the
    notebook ran), else computed now from ``<out>/data``."""
    claims = (record or {}).get("claims")
    stored = claims.get(entry.id) if isinstance(claims, dict) else None
    if isinstance(stored, list):
        return [{k: str(v.get(k, "")) for k in ("claim_id", "verdict", "line")} for v in stored if isinstance(v, dict)]
    return _claim_verdicts(entry.id, out / "data", warn)


def _claim_verdicts(figure_id: str, data_dir: Path, warn: Callable[[str], None]) -> list[dict[str, str]]:
    """:func:`repro.figures.claims.figure_verdicts` from the tables in ``data_dir``; a broken claims file
    costs a warning, not the run."""
    from .claims import ClaimsError, figure_verdicts

    try:
        return figure_verdicts(figure_id, data_dir)
    except (ClaimsError, OSError, ValueError) as exc:
        warn(f"warning: no claim verdict for {figure_id}: {' '.join(str(exc).split())[:200]}")
        return []


def _notebook_link(out: Path, notebook: str, warn: Callable[[str], None]) -> str | None:
    """Relative link to the executed notebook's HTML (rendered now if absent or stale), or None."""
    executed = out / "notebooks" / notebook
    if not executed.is_file():
        return None
    page = notebook_html_path(out, notebook)
    if not _fresh(page, executed):
        try:
            render_notebook_html(executed, page)
        except Exception as exc:  # nbconvert missing or the notebook unreadable: no link, say why
            warn(f"warning: could not render {executed.name} as HTML: {type(exc).__name__}: "
                 f"{' '.join(str(exc).split())[:200]}")
            return None
    return _rel(out, page)


# -- index

def _git_revision(where: Path) -> str:
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        rev = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10, env=env)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(where), "diff", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=10, env=env)
        return rev.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_index(out: str | Path, *, manifest: str | Path | None = None,
                entries: Sequence[FigureEntry] | None = None,
                warn: Callable[[str], None] | None = None) -> tuple[Path, Path]:
    """Write ``<out>/index.md`` and ``<out>/index.html`` listing every manifest id; return both paths."""
    from repro import __version__

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if entries is None:
        entries = load_manifest(manifest, check_files=False)
    titles = paper_titles(manifest)
    cards = collect_cards(out, entries, warn=warn)
    where = entries[0].notebooks_dir if entries else Path(__file__).resolve().parent
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    counts = {s: sum(c.state == s for c in cards) for s in STATES}
    header = (f"Generated {date} · repro {__version__} · git {_git_revision(where)} · "
              f"{len(cards)} figures: " + ", ".join(f"{counts[s]} {s}" for s in STATES
                                                    if counts[s] or s != "interrupted"))  # rare: said when there
    papers = list(dict.fromkeys(c.entry.paper for c in cards))
    md_path, html_path = out / "index.md", out / "index.html"
    write_output(md_path, _render_md(cards, papers, titles, header))
    write_output(html_path, _render_html(cards, papers, titles, header))
    return md_path, html_path


_INTRO = ("Scale: \"tiny\" = CPU-sized runs, \"paper\" = the papers' settings. Source: measured, simulated, "
          "estimate, model (cost model) or trace.")


def _href(path: str) -> str:
    return quote(path, safe="/#")


def _tables_label(card: Card) -> str:
    return f"tables of {card.entry.notebook}" if card.tables_rule == "notebook" else "data"


def _links(c: Card, link: Callable[[str, str], str], text: Callable[[str], str], notebook: str) -> list[str]:
    """A card's links (PNG, PDF, its tables, its notebook) in a page's markup: ``link(href, label)``,
    ``text(words)``; ``notebook`` is the notebook's name as that page writes it."""
    links = [link(path, kind) for path, kind in ((c.png, "PNG"), (c.pdf, "PDF")) if path]
    if c.tables:
        links.append(f"{text(_tables_label(c))}: " + ", ".join(link(t, Path(t).name) for t in c.tables))
    links.append(f"notebook: {link(c.notebook_html, notebook) if c.notebook_html else text(notebook)}")
    return links


# -- Markdown

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_link(href: str, label: str) -> str:
    return f"[{label}]({_href(href)})"


def _md_card(c: Card) -> str:
    e = c.entry
    parts = []
    if c.thumb and c.png:
        parts.append(f"[![{e.id}]({_href(c.thumb)})]({_href(c.png)})")
    parts.append(f'<a id="{e.stem}"></a>**`{e.id}`** · **{c.state}**')
    parts.append(_md_cell(e.title))
    if c.scale or c.source:
        parts.append(f"scale: {c.scale or '?'} · source: {_md_cell(c.source or '?')}")
    else:
        parts.append(f"kind: {_md_cell(e.kind)}")
    parts.append(" · ".join(_links(c, _md_link, str, _md_cell(e.notebook))))
    if c.other_tables:
        parts.append(f"other tables of {_md_cell(e.notebook)}: "
                     + ", ".join(_md_link(t, Path(t).name) for t in c.other_tables))
    if c.tables_absent:
        parts.append("tables not found: " + ", ".join(c.tables_absent))
    for v in c.claims:
        parts.append(f"claim: **{_md_cell(v['verdict'])}** — {_md_cell(v['line'].split(': ', 1)[-1])}")
    if c.caption:
        parts.append(f"*{_md_cell(c.caption)}*")
    if c.state in ("failed", "interrupted", "missing"):
        parts.append(_md_cell(c.error or STATE_HELP[c.state]))
    return "<br>".join(parts)


def _render_md(cards: list[Card], papers: list[str], titles: dict[str, str], header: str) -> str:
    lines = ["# Figures", "", header, "", _INTRO, "",
             "Status: " + "; ".join(f"**{s}** = {STATE_HELP[s]}" for s in STATES) + ".", "",
             "| id | title | scale | source | status |", "|---|---|---|---|---|"]
    for c in cards:
        e = c.entry
        lines.append(f"| [`{e.id}`](#{e.stem}) | {_md_cell(e.title)} | {c.scale or '—'} | "
                     f"{_md_cell(c.source or '—')} | {c.state} |")
    per_row = 3
    for paper in papers:
        group = [c for c in cards if c.entry.paper == paper]
        lines += ["", f"## {titles.get(paper, paper)}", "",
                  "|" + " |" * per_row, "|" + "---|" * per_row]
        for i in range(0, len(group), per_row):
            row = [_md_card(c) for c in group[i:i + per_row]]
            row += [""] * (per_row - len(row))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines).rstrip() + "\n"


# -- HTML

_CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#f6f8fa}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1440px;
padding:1.2em 1.6em 3em;color:var(--fg);line-height:1.45;font-size:15px}
h1{margin:.2em 0 .1em} h2{margin:1.8em 0 .6em;padding-bottom:.25em;border-bottom:1px solid var(--line)}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.92em}
a{color:#0969da;text-decoration:none} a:hover{text-decoration:underline}
.header,.intro{color:var(--muted);margin:.2em 0}
table.summary{border-collapse:collapse;margin:1em 0;font-size:.92em;width:100%}
.summary th,.summary td{border-bottom:1px solid var(--line);padding:.25em .6em;text-align:left;vertical-align:top}
.summary th{background:var(--bg)}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:16px;align-items:start}
.card{border:1px solid var(--line);border-radius:8px;background:#fff;overflow:hidden;display:flex;
flex-direction:column}
.card:target{outline:3px solid #0969da}
.thumb{display:flex;align-items:center;justify-content:center;height:260px;background:#fff;
border-bottom:1px solid var(--line);padding:6px}
.thumb img{max-width:100%;max-height:100%;object-fit:contain}
.placeholder{height:64px;display:flex;align-items:center;justify-content:center;color:var(--muted);
background:repeating-linear-gradient(45deg,#f6f8fa,#f6f8fa 8px,#eef1f4 8px,#eef1f4 16px);
border-bottom:1px solid var(--line);font-size:.85em}
.card.failed .placeholder,.card.interrupted .placeholder,.card.missing .placeholder{height:120px}
.body{padding:.6em .8em .7em}
.id{display:flex;justify-content:space-between;align-items:baseline;gap:.5em}
.id code{font-weight:600;word-break:break-all}
.title{margin:.25em 0}
.meta{color:var(--muted);font-size:.86em;margin:.2em 0}
.links{font-size:.86em;margin:.35em 0 0}
.links a{white-space:nowrap}
.error{color:#b3261e;font-size:.85em;margin:.3em 0;word-break:break-word}
details{font-size:.86em;margin-top:.35em;color:var(--muted)} summary{cursor:pointer}
details p{margin:.3em 0}
.badge{display:inline-block;font-size:.72em;font-weight:600;letter-spacing:.04em;text-transform:uppercase;
padding:.1em .55em;border-radius:1em;white-space:nowrap}
.badge.done{background:#dafbe1;color:#116329} .badge.planned{background:#eaeef2;color:#59636e}
.badge.failed{background:#ffebe9;color:#a40e26} .badge.missing{background:#fff8c5;color:#7d4e00}
.badge.interrupted{background:#fbefff;color:#6e2b8b}
.claim{font-size:.84em;margin:.3em 0}
.verdict{display:inline-block;font-size:.78em;font-weight:600;padding:0 .45em;border-radius:.3em;white-space:nowrap}
.verdict.yes{background:#dafbe1;color:#116329} .verdict.partly{background:#fff8c5;color:#7d4e00}
.verdict.no{background:#ffebe9;color:#a40e26} .verdict.na{background:#eaeef2;color:#59636e}
"""


def _badge(state: str) -> str:
    return f'<span class="badge {state}" title="{html.escape(STATE_HELP[state])}">{state}</span>'


def _verdict_badge(verdict: str) -> str:
    kind = {"reproduced": "yes", "direction only": "partly", "not reproduced": "no"}.get(verdict, "na")
    return (f'<span class="verdict {kind}" title="the paper\'s claim, our number against the paper\'s '
            f'(repro.figures.claims)">{html.escape(verdict)}</span>')


def _html_link(href: str, label: str) -> str:
    return f'<a href="{html.escape(_href(href))}">{html.escape(label)}</a>'


def _html_card(c: Card) -> str:
    esc = html.escape
    e = c.entry
    out = [f'<article class="card {c.state}" id="{esc(e.stem)}">']
    if c.thumb and c.png:
        out.append(f'<a class="thumb" href="{esc(_href(c.png))}" title="full-size PNG">'
                   f'<img src="{esc(_href(c.thumb))}" alt="{esc(e.id)}: {esc(e.title)}" loading="lazy"></a>')
    else:
        out.append(f'<div class="placeholder">{esc(STATE_HELP[c.state])}</div>')
    out.append('<div class="body">')
    out.append(f'<div class="id"><code>{esc(e.id)}</code>{_badge(c.state)}</div>')
    out.append(f'<p class="title">{esc(e.title)}</p>')
    if c.scale or c.source:
        out.append(f'<p class="meta">scale: {esc(c.scale or "?")} · source: {esc(c.source or "?")}</p>')
    else:
        out.append(f'<p class="meta">kind: {esc(e.kind)}</p>')
    out.append(f'<p class="links">{" · ".join(_links(c, _html_link, esc, e.notebook))}</p>')
    if c.other_tables:
        csvs = ", ".join(_html_link(t, Path(t).name) for t in c.other_tables)
        out.append(f'<details class="more"><summary>{len(c.other_tables)} other table(s) of '
                   f"{esc(e.notebook)}</summary><p>{csvs}</p></details>")
    if c.tables_absent:
        out.append(f'<p class="error">tables not found: {esc(", ".join(c.tables_absent))}</p>')
    if c.error and c.state != "done":
        out.append(f'<p class="error">{esc(c.error)}</p>')
    for v in c.claims:
        out.append(f'<p class="claim">{_verdict_badge(v["verdict"])} {esc(v["line"].split(": ", 1)[-1])}</p>')
    more = []
    if c.caption:
        more.append(f"<p>{esc(c.caption)}</p>")
    if c.paper_numbers:
        more.append(f"<p>paper numbers: {esc(c.paper_numbers)}</p>")
    if c.scale or c.source:
        more.append(f"<p>kind: {esc(e.kind)}</p>")
    if c.error and c.state == "done":
        more.append(f'<p class="error">{esc(c.error)}</p>')
    if e.notes:
        more.append(f"<p>notes: {esc(e.notes)}</p>")
    if more:
        label = "caption" if c.caption else "details"
        out.append(f"<details><summary>{label}</summary>{''.join(more)}</details>")
    out.append("</div></article>")
    return "".join(out)


def _render_html(cards: list[Card], papers: list[str], titles: dict[str, str], header: str) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>repro figures</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>Figures</h1>", f'<p class="header">{esc(header)}</p>', f'<p class="intro">{esc(_INTRO)} '
             "Status: " + "; ".join(f"{_badge(s)} {esc(STATE_HELP[s])}" for s in STATES) + ".</p>",
             '<table class="summary"><thead><tr><th>id</th><th>title</th><th>scale</th><th>source</th>'
             "<th>status</th></tr></thead><tbody>"]
    for c in cards:
        e = c.entry
        parts.append(f'<tr><td><a href="#{esc(e.stem)}"><code>{esc(e.id)}</code></a></td>'
                     f"<td>{esc(e.title)}</td><td>{esc(c.scale or '—')}</td><td>{esc(c.source or '—')}</td>"
                     f"<td>{_badge(c.state)}</td></tr>")
    parts.append("</tbody></table>")
    for paper in papers:
        parts.append(f'<section id="paper-{esc(paper)}"><h2>{esc(titles.get(paper, paper))}</h2>'
                     '<div class="grid">')
        parts += [_html_card(c) for c in cards if c.entry.paper == paper]
        parts.append("</div></section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
