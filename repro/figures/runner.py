"""``python -m repro.figures {run,index,list}``: run the figure notebooks with papermill, check their
figures, and write the gallery.

``run`` executes every notebook with a ``done`` figure (or those ``--only`` names) with
``output_dir = <out>/figures``, ``results_dir = <out>/data`` and ``scale = "tiny"``, writes the executed
copy, its HTML and a run record to ``<out>/notebooks/``, checks every declared figure is whole, and
writes the gallery. Every input (options, parameters against their schemas, manifest, kernel, ``--out``)
is checked before anything is deleted, written or started. Exit status: 2 for bad input, 1 when a
notebook or figure fails, 130 on Ctrl-C. A lock file refuses a second runner into the same folder.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .gallery import (_claim_verdicts, figure_problem, notebook_html_path, render_notebook_html, run_record_path,
                      write_index, write_run_record)
from .manifest import STATUSES, FigureEntry, ManifestError, done_notebooks, load_manifest, paper_titles

__all__ = ["FiguresError", "FiguresInputError", "check_notebook_parameters", "RunReport", "KERNEL_NAME",
           "KERNEL_DISPLAY_NAME", "check_kernel", "select_notebooks", "notebook_parameters",
           "declared_parameters", "parameters_by_notebook", "check_out_folder", "out_folder_lock",
           "missing_figures", "figure_claim_verdicts", "run", "write_index", "main"]

RESERVED_PARAMETERS = ("output_dir", "results_dir")
DEFAULT_SCALE = "tiny"
KERNEL_NAME = "repro"
KERNEL_DISPLAY_NAME = "Python (repro)"
HEARTBEAT_S = 30.0


class FiguresError(RuntimeError):
    """The figure run failed; the message (one line) says what is missing or which notebook failed."""


class FiguresInputError(FiguresError):
    """A bad option, parameter, manifest, kernel name or output folder, found before anything is written or
    any kernel starts; the command line exits with status 2 (a failed run exits with 1)."""


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
    """Notebooks to run: all with a ``done`` figure, or those matching a token of ``only`` (a figure id,
    stem, notebook with or without ``.ipynb``, or paper prefix); :class:`FiguresInputError` for a token
    naming a planned figure or matching nothing."""
    done = done_notebooks(entries)
    if not only:
        return done
    chosen: set[str] = set()
    for token in only:
        t = token.strip()
        hits = [e for e in entries if t in (e.id, e.stem, e.notebook, Path(e.notebook).stem, e.paper)]
        exact_planned = [e for e in hits if not e.done and t in (e.id, e.stem)]
        if exact_planned:
            raise FiguresInputError(f"'{t}' is planned, not done: {exact_planned[0].notebook} does not make it yet")
        nbs = {e.notebook for e in hits if e.done}
        if not nbs:
            raise FiguresInputError(f"--only '{t}' matches no done figure id, stem, notebook or paper of the manifest")
        chosen |= nbs
    return [nb for nb in done if nb in chosen]


def notebook_parameters(out: str | Path, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Papermill parameters for a run writing under ``out``: output_dir, results_dir, scale, + user's."""
    out = Path(out).resolve()
    user = dict(parameters or {})
    clash = [k for k in RESERVED_PARAMETERS if k in user]
    if clash:
        raise FiguresInputError(f"parameter(s) {', '.join(clash)} are set by --out and cannot be overridden")
    params = {"output_dir": str(out / "figures"), "results_dir": str(out / "data"), "scale": DEFAULT_SCALE,
              **user}
    if params["scale"] not in ("tiny", "paper"):
        raise FiguresInputError(f"scale must be 'tiny' or 'paper', got {params['scale']!r}")
    return params


def declared_parameters(notebook_path: str | Path) -> list[str]:
    """Names of the parameters ``notebook_path`` declares in its ``parameters`` cell (papermill's own
    reading of the cell, :func:`papermill.inspect_notebook`)."""
    import papermill as pm

    return list(pm.inspect_notebook(str(notebook_path)))


def parameters_by_notebook(entries: Sequence[FigureEntry], notebooks: Sequence[str],
                           params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The parameters each notebook gets: those of ``params`` it declares; :class:`FiguresInputError` for a
    parameter (other than the runner's own) that no selected notebook declares, so a typo never passes."""
    paths = {e.notebook: e.notebook_path for e in entries}
    declared = {nb: set(declared_parameters(paths[nb])) for nb in notebooks}
    user = [k for k in params if k not in (*RESERVED_PARAMETERS, "scale")]
    unknown = [k for k in user if not any(k in d for d in declared.values())]
    if unknown and notebooks:
        raise FiguresInputError(f"parameter(s) {', '.join(unknown)} are declared by none of the notebooks to run "
                           f"({', '.join(notebooks)}); `papermill --help-notebook notebooks/<name>.ipynb` lists "
                           "each notebook's parameters")
    return {nb: {k: v for k, v in params.items() if k in declared[nb]} for nb in notebooks}


def check_notebook_parameters(nb_params: dict[str, dict[str, Any]]) -> None:
    """Check each notebook's parameters against its schema (:mod:`repro.figures.schemas`) as its first cell
    would: a bad value is one :class:`FiguresInputError` line naming the notebook, the parameter, the value
    and the range. A notebook without a schema is left to its own checks."""
    from .params import ParameterError, validate_parameters
    from .schemas import SCHEMAS, schema_for

    for nb, params in nb_params.items():
        stem = Path(nb).stem
        if stem not in SCHEMAS:
            continue
        try:
            validate_parameters(schema_for(stem), params)
        except ParameterError as e:
            raise FiguresInputError(f"{nb}: bad parameter: {' '.join(str(e).split())}") from None


def check_out_folder(out: str | Path) -> Path:
    """The output folder, resolved, if the runner can write there; :class:`FiguresInputError` (one line)
    when it is a file, lies below a file, or is not writable. Creates nothing."""
    out = Path(out).resolve()
    if out.exists():
        if not out.is_dir():
            raise FiguresInputError(f"--out {out} is a file, not a folder")
        for sub in ("figures", "data", "notebooks"):
            if (out / sub).exists() and not (out / sub).is_dir():
                raise FiguresInputError(f"--out {out}: {out / sub} is a file, not a folder")
        if not os.access(out, os.W_OK | os.X_OK):
            raise FiguresInputError(f"--out {out} is not writable (read-only or not ours)")
        return out
    for up in out.parents:
        if up.exists():
            if not up.is_dir():
                raise FiguresInputError(f"--out {out}: {up} is a file, not a folder")
            if not os.access(up, os.W_OK | os.X_OK):
                raise FiguresInputError(f"--out {out} cannot be created: {up} is not writable (read-only or not ours)")
            break
    return out


LOCK_NAME = ".repro-figures.lock"


@contextmanager
def out_folder_lock(out: Path):
    """Hold ``<out>/.repro-figures.lock`` (an exclusive ``flock``) while writing into ``out``: a second
    runner into the same folder is refused in one line instead of deleting the first one's files."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise FiguresError(f"--out {out}: cannot create its lock file: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise FiguresError(f"another figure run (pid {holder}) is writing to {out}; wait for it to end or "
                               "choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # closing releases the lock


def missing_figures(entries: Sequence[FigureEntry], notebooks: Iterable[str],
                    figures_dir: str | Path) -> list[str]:
    """Descriptions of the declared figures of ``notebooks`` that are not whole (see
    :func:`repro.figures.gallery.figure_problem`: PNG decodes, PDF complete, sidecar present)."""
    nbs = set(notebooks)
    problems = ((e, figure_problem(e.files(figures_dir))) for e in entries if e.done and e.notebook in nbs)
    return [f"{problem} ({e.id}, from {e.notebook})" for e, problem in problems if problem]


def _install_hint(name: str) -> str:
    return (f"register it with: {_display_path(Path(sys.executable))} -m ipykernel install --sys-prefix "
            f"--name {name} --display-name \"{KERNEL_DISPLAY_NAME if name == KERNEL_NAME else name}\" "
            "(make install does this)")


def _display_path(p: Path) -> str:
    """``p`` relative to the working directory when it lies below it, else absolute."""
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def check_kernel(name: str = KERNEL_NAME, cwd: str | Path | None = None) -> Path:
    """The folder of Jupyter kernel ``name``, checked to be installed and, when it runs another interpreter
    than this one, to import ``repro`` in ``cwd``; :class:`FiguresInputError` with one line saying how to
    register it otherwise."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        raise FiguresInputError("jupyter_client is not installed; install the notebooks extra: "
                           "pip install -e '.[notebooks]' (make install does this)") from None
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise FiguresInputError(f"Jupyter kernel '{name}' is not installed; {_install_hint(name)}") from None
    argv = list(spec.argv or [])
    exe = shutil.which(argv[0]) if argv else None
    if exe and Path(exe).resolve() != Path(sys.executable).resolve():
        try:
            ok = subprocess.run([exe, "-c", "import repro"], capture_output=True, timeout=120,
                                cwd=str(cwd) if cwd else None).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if not ok:
            raise FiguresInputError(f"Jupyter kernel '{name}' runs {exe}, which cannot import repro; "
                               f"{_install_hint(name)}")
    return Path(spec.resource_dir)


def _cell_progress(executed: Path) -> str:
    """``"cell 4/12"`` from the notebook papermill is writing (it saves at each cell start), or ``""``."""
    try:
        nb = json.loads(executed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""  # not written yet, or caught mid-write
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    for i, c in enumerate(code, 1):
        if ((c.get("metadata") or {}).get("papermill") or {}).get("status") == "running":
            return f"cell {i}/{len(code)}"
    return ""


@contextmanager
def _heartbeat(prefix: str, executed: Path, say: Callable[[str], None], every: float):
    """Says every ``every`` seconds (0: never) how long a notebook has been running (and which cell),
    until the block ends."""
    t0 = time.perf_counter()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            cell = _cell_progress(executed)
            say(f"{prefix} running {_duration(time.perf_counter() - t0)}" + (f", {cell}" if cell else ""))

    thread = threading.Thread(target=loop, name="repro-figures-heartbeat", daemon=True)
    if every > 0:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s} s" if s < 60 else f"{s // 60}m{s % 60:02d}s"


@functools.cache
def _engine() -> str:
    """Name of papermill's nbclient engine, registered on first use, with one change: on Ctrl-C the kernel
    gets SIGKILL before the client is torn down. (papermill interrupts it and asks it to shut down at once;
    the kernel then answers on the closed socket and prints a zmq traceback.)"""
    import signal

    from nbclient.util import ensure_async, run_sync
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.log import logger
    from papermill.utils import merge_kwargs, remove_args

    class Client(PapermillNotebookClient):
        @contextmanager
        def setup_kernel(self, **kwargs: Any):
            with super().setup_kernel(**kwargs):
                try:
                    yield
                except KeyboardInterrupt:
                    self.shutdown_kernel = "immediate"  # whatever is left to do: no shutdown request
                    km = self.km
                    if km is not None and km.has_kernel:
                        try:
                            run_sync(lambda: ensure_async(km.signal_kernel(getattr(signal, "SIGKILL",
                                                                                   signal.SIGTERM))))()
                        except Exception:  # noqa: BLE001 - already gone: the cleanup copes
                            pass
                    raise

    class Engine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None,
                                     stderr_file=None, start_timeout=60, execution_timeout=None, **kwargs):
            # as NBClientEngine.execute_managed_notebook (papermill 2.x), with Client
            kwargs = remove_args(["input_path"], **kwargs)
            safe_kwargs = remove_args(["timeout", "startup_timeout"], **kwargs)
            final_kwargs = merge_kwargs(
                safe_kwargs, timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
                startup_timeout=start_timeout, kernel_name=kernel_name, log=logger, log_output=log_output,
                stdout_file=stdout_file, stderr_file=stderr_file)
            return Client(nb_man, **final_kwargs).execute()

    papermill_engines.register("repro-nbclient", Engine)
    return "repro-nbclient"


def _execute(src: Path, dst: Path, params: dict[str, Any], cwd: Path, kernel_name: str,
             log_output: bool, execution_timeout: float | None) -> str | None:
    """Execute one notebook; return None on success or a one-line reason."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        pm.execute_notebook(str(src), str(dst), parameters=params, kernel_name=kernel_name,
                            engine_name=_engine(), cwd=str(cwd), progress_bar=False, log_output=log_output,
                            execution_timeout=execution_timeout)
    except PapermillExecutionError as e:
        evalue = " ".join(str(e.evalue).split())[:300]
        return f"{src.name} failed in cell {e.exec_count}: {e.ename}: {evalue} (see {dst.with_suffix('.html')})"
    except Exception as e:  # kernel died, bad notebook JSON, timeout...
        msg = " ".join(str(e).split())[:300]
        hint = f" ({_install_hint(kernel_name)})" if "kernel" in msg.lower() else ""
        return f"{src.name} could not be executed: {type(e).__name__}: {msg}{hint}"
    return None


def figure_claim_verdicts(entries: Sequence[FigureEntry], data_dir: Path,
                          say: Callable[[str], None] = _say) -> dict[str, list[dict[str, str]]]:
    """Figure id -> :func:`repro.figures.claims.figure_verdicts` from the tables in ``data_dir``, for the
    figures of ``entries`` that show a claim; a broken claims file costs a warning, not the run."""
    verdicts = ((e.id, _claim_verdicts(e.id, data_dir, say)) for e in entries)
    return {fid: v for fid, v in verdicts if v}


def _record_interrupted(out: Path, nb: str, params: dict[str, Any], kernel_name: str, started: _dt.datetime,
                        seconds: float, tables: list[str], manifest: str | Path | None,
                        entries: Sequence[FigureEntry]) -> None:
    """After Ctrl-C stopped ``nb``: its run record says ``interrupted`` and the gallery is rewritten; a
    second Ctrl-C or an error while writing leaves them as they are."""
    try:
        write_run_record(out, nb, {"status": "interrupted", "error": f"{nb} was interrupted (Ctrl-C) after "
                                   f"{_duration(seconds)}", "seconds": round(seconds, 3),
                                   "started_utc": started.isoformat(timespec="seconds"), "kernel": kernel_name,
                                   "parameters": params, "tables": tables, "claims": {}})
        write_index(out, manifest=manifest, entries=entries, warn=lambda _msg: None)
    except (KeyboardInterrupt, Exception):  # noqa: BLE001 - stopping wins over the bookkeeping
        pass


def _table_stamps(data_dir: Path) -> dict[str, int]:
    return {p.stem: p.stat().st_mtime_ns for p in data_dir.glob("*.csv")}


def run(out: str | Path, *, only: Iterable[str] | None = None, parameters: dict[str, Any] | None = None,
        manifest: str | Path | None = None, kernel_name: str = KERNEL_NAME, log_output: bool = False,
        execution_timeout: float | None = None, say: Callable[[str], None] = _say,
        heartbeat_s: float = HEARTBEAT_S) -> RunReport:
    """Execute the selected notebooks, verify their figures, write the gallery.

    Raises :class:`FiguresInputError` for bad input before anything is written or run,
    :class:`repro.figures.manifest.ManifestError` for a bad manifest, and :class:`FiguresError` (one line
    naming failed notebooks and missing files) after writing the gallery.
    """
    if execution_timeout is not None and not (math.isfinite(execution_timeout) and execution_timeout > 0):
        raise FiguresInputError(f"--cell-timeout must be a finite positive number of seconds, got {execution_timeout}")
    if not (math.isfinite(heartbeat_s) and heartbeat_s >= 0):
        raise FiguresInputError(f"--heartbeat must be a finite number of seconds >= 0, got {heartbeat_s}")
    entries = load_manifest(manifest)
    out = check_out_folder(out)
    params = notebook_parameters(out, parameters)
    notebooks = select_notebooks(entries, only)
    nb_params = parameters_by_notebook(entries, notebooks, params)
    check_notebook_parameters(nb_params)
    if notebooks:
        check_kernel(kernel_name, cwd=entries[0].notebooks_dir)
    with out_folder_lock(out):
        return _run_locked(out, entries, notebooks, nb_params, manifest, kernel_name, log_output,
                           execution_timeout, say, heartbeat_s)


def _run_locked(out: Path, entries: Sequence[FigureEntry], notebooks: list[str],
                nb_params: dict[str, dict[str, Any]], manifest: str | Path | None, kernel_name: str,
                log_output: bool, execution_timeout: float | None, say: Callable[[str], None],
                heartbeat_s: float) -> RunReport:
    fig_dir, data_dir, nb_out = out / "figures", out / "data", out / "notebooks"
    for d in (fig_dir, data_dir, nb_out):
        d.mkdir(parents=True, exist_ok=True)
    report = RunReport(out=out, notebooks=list(notebooks))
    if not notebooks:
        say("no notebook has a done figure; writing the index only")

    failures: list[str] = []
    n = len(notebooks)
    for i, nb in enumerate(notebooks, 1):
        declared = [e for e in entries if e.done and e.notebook == nb]
        src = declared[0].notebook_path
        dst = nb_out / nb
        figures = [p for e in declared for p in e.files(fig_dir).values()]
        for stale in (*figures, dst, notebook_html_path(out, nb), run_record_path(out, nb)):
            stale.unlink(missing_ok=True)  # stale files from an earlier run must not pass the check
        prefix = f"[{i}/{n}] {nb}:"
        say(f"{prefix} {len(declared)} figure(s), running ...")
        before = _table_stamps(data_dir)
        started = _dt.datetime.now(_dt.timezone.utc)
        t0 = time.perf_counter()
        try:
            with _heartbeat(prefix, dst, say, heartbeat_s):
                err = _execute(src, dst, nb_params[nb], src.parent, kernel_name, log_output, execution_timeout)
        except KeyboardInterrupt:  # Ctrl-C: the record and the gallery say "interrupted", then exit 130
            _record_interrupted(out, nb, nb_params[nb], kernel_name, started, time.perf_counter() - t0,
                                sorted(t for t, s in _table_stamps(data_dir).items() if before.get(t) != s),
                                manifest, entries)
            raise
        dt = time.perf_counter() - t0
        report.seconds[nb] = dt
        tables = sorted(t for t, stamp in _table_stamps(data_dir).items() if before.get(t) != stamp)
        if dst.is_file():
            report.executed.append(dst)
            try:
                render_notebook_html(dst, notebook_html_path(out, nb))
            except Exception as exc:  # the run itself is fine; the gallery just lacks the page
                say(f"warning: could not render {nb} as HTML: {type(exc).__name__}: "
                    f"{' '.join(str(exc).split())[:200]}")
        missing = missing_figures(declared, [nb], fig_dir)
        status = "failed" if (err or missing) else "done"
        verdicts = figure_claim_verdicts(declared, data_dir, say)
        write_run_record(out, nb, {"status": status, "error": err, "seconds": round(dt, 3),
                                   "started_utc": started.isoformat(timespec="seconds"),
                                   "kernel": kernel_name, "parameters": nb_params[nb], "tables": tables,
                                   "claims": verdicts})
        if err:
            failures.append(err)
        say(f"{prefix} {status} in {_duration(dt)}")
        width = max(len(e.id) for e in declared)
        for e in declared:
            files = e.files(fig_dir)
            problem = figure_problem(files)
            if problem:
                say(f"    failed  {e.id:<{width}}  {problem}")
            else:
                report.figures += [files["png"], files["pdf"]]
                say(f"    done    {e.id:<{width}}  {_display_path(files['png'])}")
            for v in verdicts.get(e.id, []):
                say(f"            {'':<{width}}  claim {v['line']}")

    missing = missing_figures(entries, notebooks, fig_dir)
    known = {e.stem for e in entries}
    extra = sorted(p.name for p in fig_dir.glob("*.png") if p.stem not in known)
    if extra:
        say(f"warning: figures not in the manifest (not indexed): {', '.join(extra)}")

    report.index_md, report.index_html = write_index(out, manifest=manifest, entries=entries, warn=say)
    say(f"index: {_display_path(report.index_html)} (and {report.index_md.name})")

    problems = list(failures)
    if missing:
        problems.append(f"not whole (missing, empty or cut short) in {fig_dir}: " + "; ".join(missing))
    if problems:
        raise FiguresError(" | ".join(problems))
    return report


# -- CLI

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
    r.add_argument("--kernel", default=KERNEL_NAME,
                   help=f"Jupyter kernel to run the notebooks on (default: {KERNEL_NAME}, registered by "
                        "make install)")
    r.add_argument("--log-output", action="store_true", help="stream the notebooks' output")
    r.add_argument("--heartbeat", type=float, default=HEARTBEAT_S, metavar="SECONDS",
                   help=f"say every SECONDS how long a notebook has run, 0: never (default: {HEARTBEAT_S:g})")
    r.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds per cell (default: none)")
    i = sub.add_parser("index", help="rebuild the gallery <out>/index.html and index.md only")
    i.add_argument("--out", default="results", help="results folder (default: results)")
    i.add_argument("--manifest", default=None, help="manifest path (default: notebooks/figures.yaml)")
    ls = sub.add_parser("list", help="print the manifest")
    ls.add_argument("--manifest", default=None, help="manifest path (default: notebooks/figures.yaml)")
    ls.add_argument("--status", choices=STATUSES, default=None, help="only figures with this status")
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
                    raise FiguresInputError(f"--parameters-json is not valid JSON: {e}") from None
                if not isinstance(params, dict):
                    raise FiguresInputError("--parameters-json must be a JSON object, e.g. '{\"steps\": 4}', "
                                            f"not {type(params).__name__} {args.parameters_json!r}")
            t0 = time.perf_counter()
            report = run(args.out, only=args.only, parameters=params, manifest=args.manifest,
                         kernel_name=args.kernel, log_output=args.log_output,
                         execution_timeout=args.cell_timeout, heartbeat_s=args.heartbeat)
            print(f"done: {len(report.notebooks)} notebook(s), {len(report.figures) // 2} figure(s) in "
                  f"{_display_path(report.out / 'figures')} ({_duration(time.perf_counter() - t0)}); "
                  f"open {_display_path(report.index_html)}")
        elif args.command == "index":
            out = check_out_folder(args.out)
            with out_folder_lock(out):
                md, page = write_index(out, manifest=args.manifest, warn=print)
            print(f"wrote {_display_path(page)} and {md.name}")
        else:
            _print_manifest(load_manifest(args.manifest, check_files=False),
                            paper_titles(args.manifest), args.status)
    except (FiguresError, ManifestError) as e:  # bad input (2): nothing was written, nothing ran
        print(f"repro.figures: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2 if isinstance(e, (FiguresInputError, ManifestError)) else 1
    except OSError as e:  # e.g. the disk filled up or a folder vanished mid-run: one line, not a traceback
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"repro.figures: error: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("repro.figures: interrupted", file=sys.stderr)
        return 130
    return 0
