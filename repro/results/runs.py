"""Run folders: the one module that writes and reads them.

A run (:mod:`repro.train`) leaves ``<results_dir>/<run_id>/``: ``run.json`` (config, summary,
environment; written last), ``iterations.csv`` (per-step seconds and loss), ``epochs.csv`` (convergence
runs), ``buckets.csv`` (the last step's measured per-message timeline), ``trace.json`` (measured in the
warm-up), ``trace_inrun.json`` (measured during the timed steps), ``plan.json`` and ``cost.json``. While
a convergence run trains, ``<run_id>.incomplete/`` holds its completed epochs (:class:`ProgressWriter`).

A run folder appears only complete (written into a hidden ``.<id>.partial-*`` folder and renamed into
place); an existing run id is refused unless ``overwrite=True``. Never imports torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from repro.core.cost import CostModel
from repro.core.plan import Plan
from repro.core.trace import Trace

if TYPE_CHECKING:  # pandas is imported where tables are read or written
    import pandas as pd

__all__ = ["RUN_JSON", "TRACE_JSON", "TRACE_INRUN_JSON", "PLAN_JSON", "COST_JSON", "ITERATIONS_CSV", "EPOCHS_CSV",
           "BUCKETS_CSV", "PROGRESS_JSON", "RunError", "RunExistsError", "check_run_id", "check_results_dir", "prepare_run",
           "RunWriter", "ProgressWriter", "Run", "load_run", "list_runs", "runs_table", "load_progress",
           "list_incomplete", "record_problem", "SUMMARY_FIELDS"]

RUN_JSON = "run.json"
TRACE_JSON = "trace.json"
TRACE_INRUN_JSON = "trace_inrun.json"
PLAN_JSON = "plan.json"
COST_JSON = "cost.json"
ITERATIONS_CSV = "iterations.csv"
EPOCHS_CSV = "epochs.csv"
BUCKETS_CSV = "buckets.csv"
PROGRESS_JSON = "progress.json"
INCOMPLETE = ".incomplete"

_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+@-]{0,199}$")
_PARTIAL = ".partial-"


class RunError(ValueError):
    """A run folder cannot be written or read as asked (bad id, unwritable place, missing files)."""


class RunExistsError(RunError):
    """The run id is taken and overwriting was not asked for."""


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is one safe path component: letters, digits and ``_ . = + @ -``, not starting
    with a dot or dash, at most 200 characters; else :class:`RunError`."""
    if not isinstance(run_id, str) or not _ID.match(run_id) or run_id in (".", ".."):
        raise RunError(f"run id {run_id!r} is not allowed: use 1-200 letters, digits and _ . = + @ - "
                       "(no path separators, not starting with '.' or '-')")
    return run_id


def check_results_dir(results_dir: str | Path) -> Path:
    """The results folder, created if missing; :class:`RunError` if it is a file or cannot be written."""
    root = Path(results_dir)
    if root.exists() and not root.is_dir():
        raise RunError(f"results dir {root} is a file, not a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-probe-{uuid.uuid4().hex}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise RunError(f"results dir {root} is not writable: {e.strerror or e}") from None
    return root


def prepare_run(results_dir: str | Path, run_id: str, overwrite: bool = False, *, own_progress: bool = False) -> Path:
    """The path of run folder ``<results_dir>/<run_id>``, checked before any work: a valid id, a
    writable results folder (created if missing), and no run of that id, complete or stopped part-way,
    unless ``overwrite`` (``own_progress``: the progress folder is this run's own)."""
    check_run_id(run_id)
    root = check_results_dir(results_dir)
    final = root / run_id
    if final.exists() and not overwrite:
        raise RunExistsError(f"run '{run_id}' already exists in {root}; choose another run id or ask to "
                             "overwrite it (--overwrite)")
    if (root / f"{run_id}{INCOMPLETE}").exists() and not overwrite and not own_progress:
        raise RunExistsError(f"an earlier run '{run_id}' stopped part-way in {root} (its completed epochs are in "
                             f"{run_id}{INCOMPLETE}); choose another run id or ask to overwrite it (--overwrite)")
    return final


class RunWriter:
    """Write one run folder atomically, as a context manager::

        with RunWriter(results_dir, run_id) as w:
            w.table(ITERATIONS_CSV, df); w.record({...})

    Files go to a hidden temporary folder, renamed to ``<results_dir>/<run_id>`` on a clean exit (replacing
    an existing run whole when ``overwrite``) and removed on an exception."""

    def __init__(self, results_dir: str | Path, run_id: str, *, overwrite: bool = False) -> None:
        self.final = prepare_run(results_dir, run_id, overwrite, own_progress=True)
        self.run_id = run_id
        self.overwrite = overwrite
        self.tmp = self.final.parent / f".{run_id}{_PARTIAL}{uuid.uuid4().hex[:12]}"
        self.tmp.mkdir()
        self._has_record = False

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    # ---- writing ----
    def path(self, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise RunError(f"bad run file name {name!r}")
        return self.tmp / name

    def table(self, name: str, df: pd.DataFrame) -> None:
        df.to_csv(self.path(name), index=False)

    def json(self, name: str, obj: Any) -> None:
        self.path(name).write_text(json.dumps(obj, indent=1, default=str) + "\n")

    def trace(self, trace: Trace, name: str = TRACE_JSON) -> None:
        trace.save(self.path(name))

    def plan(self, plan: Plan) -> None:
        plan.save(self.path(PLAN_JSON))

    def cost(self, cost: CostModel) -> None:
        cost.save(self.path(COST_JSON))

    def record(self, run: Mapping[str, Any]) -> None:
        """``run.json``: run_id, config, summary, environment."""
        self.json(RUN_JSON, dict(run))
        self._has_record = True

    # ---- finishing ----
    def commit(self) -> Path:
        if not self._has_record:
            self.abort()
            raise RunError(f"run '{self.run_id}' has no run.json; nothing was written")
        old = None
        if self.final.exists():
            if not self.overwrite:
                self.abort()
                raise RunExistsError(f"run '{self.run_id}' appeared in {self.final.parent} while this run was "
                                     "being written; its files were not touched")
            old = self.final.parent / f".{self.run_id}.replaced-{uuid.uuid4().hex[:12]}"
            os.replace(self.final, old)
        os.replace(self.tmp, self.final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(self.final.parent / f"{self.run_id}{INCOMPLETE}", ignore_errors=True)  # superseded
        return self.final

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class ProgressWriter:
    """A convergence run's progress, rewritten after every epoch: ``<run_id>.incomplete/`` with
    ``epochs.csv`` and ``progress.json``, each renamed into place whole."""

    def __init__(self, results_dir: str | Path, run_id: str) -> None:
        check_run_id(run_id)
        self.run_id = run_id
        self.folder = Path(results_dir) / f"{run_id}{INCOMPLETE}"

    def _replace(self, name: str, write) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:8]}"
        write(tmp)
        os.replace(tmp, self.folder / name)

    def update(self, epoch_rows: list[Mapping[str, Any]], config: Mapping[str, Any]) -> None:
        import pandas as pd

        df = pd.DataFrame(list(epoch_rows)).assign(run_id=self.run_id)
        self._replace(EPOCHS_CSV, lambda p: df.to_csv(p, index=False))
        info = {"run_id": self.run_id, "complete": False, "epochs_completed": len(epoch_rows), "config": dict(config)}
        self._replace(PROGRESS_JSON, lambda p: p.write_text(json.dumps(info, indent=1, default=str) + "\n"))


def list_incomplete(results_dir: str | Path) -> list[Path]:
    """The progress folders of runs under ``results_dir`` that stopped part-way (or are running)."""
    root = Path(results_dir)
    return sorted(p for p in root.glob(f"*{INCOMPLETE}") if (p / PROGRESS_JSON).is_file()) if root.is_dir() else []


def load_progress(path: str | Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """``(progress.json, epochs.csv)`` of a progress folder; :class:`RunError` if it is not one."""
    import pandas as pd

    p = Path(path)
    if not (p / PROGRESS_JSON).is_file():
        raise RunError(f"{p} is not the progress folder of a run (no {PROGRESS_JSON})")
    info = json.loads((p / PROGRESS_JSON).read_text())
    epochs = pd.read_csv(p / EPOCHS_CSV) if (p / EPOCHS_CSV).is_file() else pd.DataFrame()
    return info, epochs


# Reading

@dataclass
class Run:
    """A finished run folder, read lazily."""

    path: Path
    run_id: str
    config: dict[str, Any]
    summary: dict[str, Any]
    environment: dict[str, Any] = field(default_factory=dict)

    def _file(self, name: str) -> Path | None:
        p = self.path / name
        return p if p.is_file() else None

    @property
    def trace(self) -> Trace | None:
        p = self._file(TRACE_JSON)
        return Trace.load(p) if p else None

    @property
    def inrun_trace(self) -> Trace | None:
        p = self._file(TRACE_INRUN_JSON)
        return Trace.load(p) if p else None

    @property
    def plan(self) -> Plan | None:
        p = self._file(PLAN_JSON)
        return Plan.load(p) if p else None

    @property
    def cost(self) -> CostModel | None:
        p = self._file(COST_JSON)
        return CostModel.load(p) if p else None

    def table(self, name: str) -> pd.DataFrame | None:
        import pandas as pd

        p = self._file(name)
        return pd.read_csv(p) if p else None

    @property
    def can_simulate(self) -> bool:
        return all(self._file(n) for n in (TRACE_JSON, PLAN_JSON, COST_JSON))


#: what a finished run's ``summary`` always has (:func:`repro.training.record.summarise` writes them)
SUMMARY_FIELDS = ("steps", "iteration_s")


def _read_record(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` when ``<folder>/run.json`` is the record of a finished run, else ``(None, why)``."""
    f = folder / RUN_JSON
    try:
        text = f.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return None, f"cannot be read ({getattr(e, 'strerror', None) or e})"
    if not text.strip():
        return None, "is empty"
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return None, f"is not JSON ({e.msg if isinstance(e, json.JSONDecodeError) else 'nested too deeply'})"
    if not isinstance(d, dict):
        return None, f"is JSON {type(d).__name__}, not a run record (an object)"
    if not isinstance(d.get("run_id"), str):
        return None, "has no run_id"
    if d["run_id"] != folder.name:
        return None, f"is the record of run {d['run_id']!r}, not of this folder's {folder.name!r}"
    for key in ("config", "summary"):
        if not isinstance(d.get(key), dict):
            return None, f"has no {key} (an object)"
    missing = [k for k in SUMMARY_FIELDS if k not in d["summary"]]
    if missing:
        return None, f"has a summary without {', '.join(missing)}: the run did not finish"
    if "environment" in d and not isinstance(d["environment"], dict):
        return None, "has an environment that is not an object"
    return d, None


def record_problem(folder: str | Path) -> str | None:
    """None when ``folder`` holds a finished run (a ``run.json`` naming this folder, with ``config`` and
    a ``summary`` with :data:`SUMMARY_FIELDS`); else one line naming the file and what is wrong."""
    f = Path(folder) / RUN_JSON
    if not f.exists():
        return f"{f} does not exist"
    if not f.is_file():
        return f"{f} is not a regular file"
    return None if (why := _read_record(Path(folder))[1]) is None else f"{f} {why}"


def load_run(path: str | Path) -> Run:
    """The finished run in folder ``path``; :class:`RunError` (one line) when its ``run.json`` is missing
    or damaged."""
    p = Path(path)
    f = p / RUN_JSON
    if not f.is_file():
        raise RunError(f"{p} is not a run folder (no {RUN_JSON})")
    d, why = _read_record(p)
    if d is None:
        raise RunError(f"{f} {why}; it is not a finished run: remove the folder or train it again (--overwrite)")
    return Run(p, d["run_id"], dict(d["config"]), dict(d["summary"]), dict(d.get("environment", {})))


def list_runs(results_dir: str | Path) -> list[Run]:
    """Every complete run directly under ``results_dir`` (hidden partial folders are skipped)."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no runs under {root}: run the notebook with read_only=False or copy a "
                                "cluster job's results there")
    return [load_run(p.parent) for p in sorted(root.glob(f"*/{RUN_JSON}")) if not p.parent.name.startswith(".")]


def runs_table(results_dir: str | Path) -> pd.DataFrame:
    """One row per run: its summary plus a few config fields and the folder's ``path``."""
    import pandas as pd

    return pd.DataFrame([{"run_id": run.run_id, **run.summary, "threshold_bytes": run.config.get("threshold_bytes"),
                          "dataset": run.config.get("dataset"), "epochs": run.config.get("epochs"),
                          "path": str(run.path)} for run in list_runs(results_dir)])
