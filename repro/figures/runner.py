"""Run the figure notebooks with papermill, check their outputs, and write the figure index.

``python -m repro.figures run --out results`` (what ``make figures`` does):

1. reads the manifest (``notebooks/figures.yaml``) and picks every notebook with a ``done`` figure
   (or those named by ``--only``: a figure id, a stem, a notebook or a paper prefix);
2. executes each once with papermill (kernel ``python3``, working directory = the notebooks folder)
   with the parameters ``output_dir = <out>/figures``, ``results_dir = <out>/data``,
   ``scale = "tiny"`` plus any ``--parameters-json``; executed copies go to ``<out>/notebooks/``;
3. checks that every declared figure of those notebooks exists as non-empty PNG and PDF in
   ``<out>/figures/``;
4. writes ``<out>/index.md`` and ``<out>/index.html`` listing every manifest id.

``index`` rebuilds only the index; ``list`` prints the manifest.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import html
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .manifest import FigureEntry, ManifestError, done_notebooks, load_manifest, paper_titles

__all__ = [
    "FiguresError",
    "RunReport",
    "select_notebooks",
    "notebook_parameters",
    "missing_figures",
    "run",
    "write_index",
    "main",
]

RESERVED_PARAMETERS = ("output_dir", "results_dir")
DEFAULT_SCALE = "tiny"


class FiguresError(RuntimeError):
    """The figure run failed; the message (one line) says what is missing or which notebook failed."""


@dataclass
class RunReport:
    """What :func:`run` did."""

    out: Path
    notebooks: list[str] = field(default_factory=list)
    executed: list[Path] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    index_md: Path | None = None
    index_html: Path | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def _say(msg: str) -> None:
    print(msg, flush=True)


def select_notebooks(entries: Sequence[FigureEntry], only: Iterable[str] | None = None) -> list[str]:
    """Notebooks to run: all with a ``done`` figure, or those matching ``only``.

    Each token of ``only`` may be a figure id, a stem, a notebook (with or without ``.ipynb``) or a
    paper prefix (``mgwfbp``). Naming a planned figure or matching nothing raises :class:`FiguresError`.
    """
    done = done_notebooks(entries)
    if not only:
        return done
    chosen: set[str] = set()
    for token in only:
        t = token.strip()
        hits = [e for e in entries
                if t in (e.id, e.stem, e.notebook, Path(e.notebook).stem, e.paper)]
        exact_planned = [e for e in hits if not e.done and t in (e.id, e.stem)]
        if exact_planned:
            raise FiguresError(f"'{t}' is planned, not done: {exact_planned[0].notebook} does not make it yet")
        nbs = {e.notebook for e in hits if e.done}
        if not nbs:
            raise FiguresError(f"--only '{t}' matches no done figure id, stem, notebook or paper of the manifest")
        chosen |= nbs
    return [nb for nb in done if nb in chosen]


def notebook_parameters(out: str | Path, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Papermill parameters for a run writing under ``out``: output_dir, results_dir, scale, + user's."""
    out = Path(out).resolve()
    user = dict(parameters or {})
    clash = [k for k in RESERVED_PARAMETERS if k in user]
    if clash:
        raise FiguresError(f"parameter(s) {', '.join(clash)} are set by --out and cannot be overridden")
    params: dict[str, Any] = {
        "output_dir": str(out / "figures"),
        "results_dir": str(out / "data"),
        "scale": DEFAULT_SCALE,
    }
    params.update(user)
    if params["scale"] not in ("tiny", "paper"):
        raise FiguresError(f"scale must be 'tiny' or 'paper', got {params['scale']!r}")
    return params


def missing_figures(entries: Sequence[FigureEntry], notebooks: Iterable[str],
                    figures_dir: str | Path) -> list[str]:
    """Descriptions of the declared PNG/PDF files of ``notebooks`` that are absent or empty."""
    nbs = set(notebooks)
    problems = []
    for e in entries:
        if not (e.done and e.notebook in nbs):
            continue
        files = e.files(figures_dir)
        bad = [files[x].name for x in ("png", "pdf")
               if not files[x].is_file() or files[x].stat().st_size == 0]
        if bad:
            problems.append(f"{', '.join(bad)} ({e.id}, from {e.notebook})")
    return problems


def _execute(src: Path, dst: Path, params: dict[str, Any], cwd: Path, kernel_name: str,
             log_output: bool, execution_timeout: float | None) -> str | None:
    """Execute one notebook; return None on success or a one-line reason."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    dst.parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {}
    if execution_timeout is not None:
        kwargs["execution_timeout"] = execution_timeout
    try:
        pm.execute_notebook(str(src), str(dst), parameters=params, kernel_name=kernel_name,
                            cwd=str(cwd), progress_bar=False, log_output=log_output, **kwargs)
    except PapermillExecutionError as e:
        evalue = " ".join(str(e.evalue).split())[:300]
        return f"{src.name} failed in cell {e.exec_count}: {e.ename}: {evalue} (see {dst})"
    except Exception as e:  # kernel missing, bad notebook JSON, timeout...
        msg = " ".join(str(e).split())[:300]
        hint = ""
        if "kernel" in msg.lower():
            hint = " (register it with: python -m ipykernel install --sys-prefix --name python3)"
        return f"{src.name} could not be executed: {type(e).__name__}: {msg}{hint}"
    return None


def run(
    out: str | Path,
    *,
    only: Iterable[str] | None = None,
    parameters: dict[str, Any] | None = None,
    manifest: str | Path | None = None,
    kernel_name: str = "python3",
    log_output: bool = False,
    execution_timeout: float | None = None,
    say: Callable[[str], None] = _say,
) -> RunReport:
    """Execute the selected notebooks, verify their figures, write the index; raise on any failure.

    Raises :class:`FiguresError` (one-line message naming failed notebooks and missing files) after
    writing the index, or :class:`repro.figures.manifest.ManifestError` for a bad manifest.
    """
    entries = load_manifest(manifest)
    out = Path(out).resolve()
    params = notebook_parameters(out, parameters)
    notebooks = select_notebooks(entries, only)
    fig_dir, data_dir, nb_out = out / "figures", out / "data", out / "notebooks"
    for d in (fig_dir, data_dir, nb_out):
        d.mkdir(parents=True, exist_ok=True)
    report = RunReport(out=out, notebooks=list(notebooks))
    if not notebooks:
        say("no notebook has a done figure; writing the index only")

    failures: list[str] = []
    for i, nb in enumerate(notebooks, 1):
        declared = [e for e in entries if e.done and e.notebook == nb]
        for e in declared:  # stale files from an earlier run must not pass the check
            for p in e.files(fig_dir).values():
                p.unlink(missing_ok=True)
        src = declared[0].notebook_path
        dst = nb_out / nb
        dst.unlink(missing_ok=True)
        say(f"[{i}/{len(notebooks)}] {nb}: {len(declared)} figure(s) ...")
        t0 = time.perf_counter()
        err = _execute(src, dst, params, src.parent, kernel_name, log_output, execution_timeout)
        dt = time.perf_counter() - t0
        report.seconds[nb] = dt
        if dst.is_file():
            report.executed.append(dst)
        if err:
            failures.append(err)
            say(f"[{i}/{len(notebooks)}] {nb}: FAILED after {dt:.1f} s")
        else:
            say(f"[{i}/{len(notebooks)}] {nb}: ok in {dt:.1f} s")

    missing = missing_figures(entries, notebooks, fig_dir)
    for e in entries:
        if e.done and e.notebook in notebooks:
            files = e.files(fig_dir)
            report.figures += [files[x] for x in ("png", "pdf") if files[x].is_file()]
            if files["png"].is_file() and not files["json"].is_file():
                say(f"warning: {e.id} has no sidecar {files['json'].name} (save it with save_figure)")
    known = {e.stem for e in entries}
    extra = sorted(p.name for p in fig_dir.glob("*.png") if p.stem not in known)
    if extra:
        say(f"warning: figures not in the manifest (not indexed): {', '.join(extra)}")

    report.index_md, report.index_html = write_index(out, manifest=manifest, entries=entries)
    say(f"index: {report.index_md} and {report.index_html.name}")

    problems = list(failures)
    if missing:
        problems.append(f"missing or empty in {fig_dir}: " + "; ".join(missing))
    if problems:
        raise FiguresError(" | ".join(problems))
    return report


# ------------------------------------------------------------------------------------------ index

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


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _source_text(src: Any) -> str:
    if isinstance(src, list):
        return " + ".join(str(s) for s in src)
    return str(src) if src else "?"


def _figure_rows(out: Path, entries: Sequence[FigureEntry]) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        files = e.files(out / "figures")
        exists = files["png"].is_file()
        side = _read_sidecar(files["json"]) if files["json"].is_file() else {}
        executed = out / "notebooks" / e.notebook
        if exists:
            state = "generated"
        elif e.done:
            state = "missing"
        else:
            state = "planned"
        rows.append({
            "entry": e,
            "state": state,
            "png": f"figures/{files['png'].name}" if exists else None,
            "pdf": f"figures/{files['pdf'].name}" if files["pdf"].is_file() else None,
            "scale": side.get("scale"),
            "source": _source_text(side.get("source")) if side else None,
            "caption": side.get("caption") or "",
            "paper_numbers": side.get("paper_numbers") or "",
            "notebook": f"notebooks/{e.notebook}" if executed.is_file() else None,
        })
    return rows


def _status_text(row: dict[str, Any]) -> str:
    e = row["entry"]
    if row["state"] == "planned":
        return "planned — not yet generated"
    if row["state"] == "missing":
        return f"{e.status} — missing: not generated in this folder (run make figures)"
    return e.status


def write_index(out: str | Path, *, manifest: str | Path | None = None,
                entries: Sequence[FigureEntry] | None = None) -> tuple[Path, Path]:
    """Write ``<out>/index.md`` and ``<out>/index.html`` listing every manifest id; return both paths."""
    from repro import __version__

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if entries is None:
        entries = load_manifest(manifest, check_files=False)
    titles = paper_titles(manifest)
    rows = _figure_rows(out, entries)
    where = entries[0].notebooks_dir if entries else Path(__file__).resolve().parent
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rev = _git_revision(where)
    n_gen = sum(r["state"] == "generated" for r in rows)
    n_done = sum(r["entry"].done for r in rows)
    header = (f"Generated {date} · repro {__version__} · git {rev} · "
              f"{n_gen} of {len(rows)} figures present ({n_done} done, {len(rows) - n_done} planned)")
    papers: list[str] = []
    for r in rows:
        if r["entry"].paper not in papers:
            papers.append(r["entry"].paper)

    md_path, html_path = out / "index.md", out / "index.html"
    md_path.write_text(_render_md(rows, papers, titles, header), encoding="utf-8")
    html_path.write_text(_render_html(rows, papers, titles, header), encoding="utf-8")
    return md_path, html_path


def _render_md(rows, papers, titles, header) -> str:
    lines = ["# Figures", "", header, "",
             "Scale \"tiny\" = CPU-sized runs; \"paper\" = the papers' settings. Source says whether a figure is "
             "measured, simulated, an estimate, a cost model or read from a trace.", ""]
    lines += ["| id | title | status |", "|---|---|---|"]
    for r in rows:
        e = r["entry"]
        lines.append(f"| [`{e.id}`](#{e.stem}) | {e.title} | {r['state']} |")
    for paper in papers:
        lines += ["", f"## {titles.get(paper, paper)}", ""]
        for r in (r for r in rows if r["entry"].paper == paper):
            e = r["entry"]
            lines += [f'<a id="{e.stem}"></a>', "", f"### `{e.id}` — {e.title}", ""]
            lines.append(f"- status: {_status_text(r)}")
            lines.append(f"- kind: {e.kind}")
            if r["state"] == "generated":
                lines.append(f"- scale: {r['scale'] or '?'} · source: {r['source'] or '?'}")
            if r["paper_numbers"]:
                lines.append(f"- paper numbers: {r['paper_numbers']}")
            if r["notebook"]:
                lines.append(f"- notebook: [{e.notebook}]({r['notebook']})")
            else:
                lines.append(f"- notebook: {e.notebook}" + (" (planned)" if not e.done else " (not executed here)"))
            if e.notes:
                lines.append(f"- notes: {e.notes}")
            if r["caption"]:
                lines += ["", r["caption"]]
            if r["png"]:
                pdf = f" ([PDF]({r['pdf']}))" if r["pdf"] else ""
                lines += ["", f"![{e.id}]({r['png']}){pdf}"]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1,h2{border-bottom:1px solid #ddd;padding-bottom:.2em} code{background:#f4f4f4;padding:0 .25em}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left}
.figure{margin:1.2em 0 2em} .meta{color:#555;font-size:.92em;margin:.2em 0}
.planned{color:#888} .missing{color:#b00020} .generated{color:#1a7f37}
img{max-width:100%;border:1px solid #eee}
"""


def _render_html(rows, papers, titles, header) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>repro figures</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>Figures</h1>", f"<p>{esc(header)}</p>",
             "<table><tr><th>id</th><th>title</th><th>status</th></tr>"]
    for r in rows:
        e = r["entry"]
        parts.append(f'<tr><td><a href="#{esc(e.stem)}"><code>{esc(e.id)}</code></a></td>'
                     f'<td>{esc(e.title)}</td><td class="{r["state"]}">{r["state"]}</td></tr>')
    parts.append("</table>")
    for paper in papers:
        parts.append(f"<h2>{esc(titles.get(paper, paper))}</h2>")
        for r in (r for r in rows if r["entry"].paper == paper):
            e = r["entry"]
            parts.append(f'<div class="figure" id="{esc(e.stem)}">')
            parts.append(f"<h3><code>{esc(e.id)}</code> — {esc(e.title)}</h3>")
            parts.append(f'<p class="meta">status: <span class="{r["state"]}">{esc(_status_text(r))}</span>'
                         f" · kind: {esc(e.kind)}</p>")
            if r["state"] == "generated":
                parts.append(f'<p class="meta">scale: {esc(r["scale"] or "?")} · '
                             f'source: {esc(r["source"] or "?")}</p>')
            if r["paper_numbers"]:
                parts.append(f'<p class="meta">paper numbers: {esc(r["paper_numbers"])}</p>')
            if r["notebook"]:
                parts.append(f'<p class="meta">notebook: <a href="{esc(r["notebook"])}">'
                             f"{esc(e.notebook)}</a></p>")
            else:
                suffix = " (planned)" if not e.done else " (not executed here)"
                parts.append(f'<p class="meta">notebook: {esc(e.notebook)}{suffix}</p>')
            if e.notes:
                parts.append(f'<p class="meta">notes: {esc(e.notes)}</p>')
            if r["caption"]:
                parts.append(f"<p>{esc(r['caption'])}</p>")
            if r["png"]:
                pdf = f' (<a href="{esc(r["pdf"])}">PDF</a>)' if r["pdf"] else ""
                parts.append(f'<p><img src="{esc(r["png"])}" alt="{esc(e.id)}">{pdf}</p>')
            parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# -------------------------------------------------------------------------------------------- CLI

def _print_manifest(entries: Sequence[FigureEntry], titles: dict[str, str], status: str | None) -> None:
    shown = [e for e in entries if status is None or e.status == status]
    w_id = max((len(e.id) for e in shown), default=2)
    w_nb = max((len(e.notebook) for e in shown), default=8)
    paper = None
    for e in shown:
        if e.paper != paper:
            paper = e.paper
            print(f"\n{titles.get(paper, paper)}")
        print(f"  {e.id:<{w_id}}  {e.status:<7}  {e.notebook:<{w_nb}}  {e.title}")
    n_done = sum(e.done for e in entries)
    print(f"\n{len(entries)} figures: {n_done} done, {len(entries) - n_done} planned; "
          f"notebooks to run: {', '.join(done_notebooks(entries)) or '(none)'}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro.figures",
                                description="Regenerate the project's figures from the notebooks.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="execute the notebooks of done figures, check outputs, write the index")
    r.add_argument("--out", default="results", help="output folder (default: results)")
    r.add_argument("--only", nargs="+", action="extend", metavar="ID_OR_NOTEBOOK",
                   help="run only these: figure ids, stems, notebooks or paper prefixes")
    r.add_argument("--parameters-json", default=None, metavar="JSON",
                   help='extra notebook parameters, e.g. \'{"scale": "paper"}\'')
    r.add_argument("--manifest", default=None, help="manifest path (default: notebooks/figures.yaml)")
    r.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
    r.add_argument("--log-output", action="store_true", help="stream the notebooks' output")
    r.add_argument("--cell-timeout", type=float, default=None, help="seconds per cell (default: none)")
    i = sub.add_parser("index", help="rebuild <out>/index.md and index.html only")
    i.add_argument("--out", default="results")
    i.add_argument("--manifest", default=None)
    ls = sub.add_parser("list", help="print the manifest")
    ls.add_argument("--manifest", default=None)
    ls.add_argument("--status", choices=("done", "planned"), default=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            params = None
            if args.parameters_json:
                try:
                    params = json.loads(args.parameters_json)
                except ValueError as e:
                    raise FiguresError(f"--parameters-json is not valid JSON: {e}") from None
                if not isinstance(params, dict):
                    raise FiguresError("--parameters-json must be a JSON object")
            t0 = time.perf_counter()
            report = run(args.out, only=args.only, parameters=params, manifest=args.manifest,
                         kernel_name=args.kernel, log_output=args.log_output,
                         execution_timeout=args.cell_timeout)
            print(f"ok: {len(report.notebooks)} notebook(s), {len(report.figures)} file(s) in "
                  f"{report.out / 'figures'} ({time.perf_counter() - t0:.0f} s)")
        elif args.command == "index":
            md, _ = write_index(args.out, manifest=args.manifest)
            print(f"wrote {md} and {md.with_suffix('.html').name}")
        else:
            _print_manifest(load_manifest(args.manifest, check_files=False),
                            paper_titles(args.manifest), args.status)
    except (FiguresError, ManifestError) as e:
        print(f"repro.figures: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0
