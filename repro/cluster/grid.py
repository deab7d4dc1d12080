"""A paper's measured grid as data: grid files, the configurations they expand to, run ids, run status.

One YAML file per paper (``data/grids/<paper>.yaml``, shipped with the package) says what the
paper measured: models with their per-GPU batch sizes (and per-model options such as a top-k density),
GPU counts ``P``, GPUs per node, schedulers, wire precisions, the networks it ran on and the training
settings (steps, warm-up, dataset). The notebooks at ``scale="paper"`` and the launchers
(:mod:`repro.cluster.jobs`) read the same file, so what a notebook draws and what a cluster runs cannot
drift apart.

A grid file::

    paper: mgwfbp                      # key of /work/shared/papers (mgwfbp, omgs, dear, osp)
    notebook: mgwfbp_training          # the notebook that draws these runs (results_dir/<notebook>/runs)
    source: "..."                      # where the setting comes from (the paper notes), and what is ours
    networks: ["10GbE", "56Gb InfiniBand"]   # the paper's networks: run the grid once per network
    gpus_per_node: 4                   # the paper's node size: P GPUs take ceil(P / gpus_per_node) nodes
    train: {dataset: synthetic, steps: 50, warmup_steps: 5}   # repro train options of every run
    experiments:                       # each one a Cartesian product
      - name: speedup
        models: {resnet152: {batch_size: 128}, densenet161: {batch_size: 64}}
        world_sizes: [1, 16]           # P: training ranks (a parameter server's ranks come on top)
        schedulers: [wfbp, mgwfbp]     # or a mapping: scheduler -> its own options ({ps_ssp: {staleness: 2}})
        precisions: [float32, float16] # wire dtypes (repro train --wire-dtype)
        train: {}                      # options of this experiment only (override the file's)

Run ids derive from the configuration: ``<model>_<scheduler>_p<P>_<precision>_b<batch>-<hash>``, the hash
being the first 10 hex digits of the SHA-256 of the configuration's canonical JSON. The same
configuration always gets the same id, so a rerun finds its finished runs (a folder with ``run.json``,
:mod:`repro.runs`) and skips them, and any other change of setting is a new id.

Status of a run (:func:`run_status`): ``done`` (``<runs_dir>/<id>/run.json``), ``failed`` (the launcher
left ``<runs_dir>/.grid/<id>.failed``, the exit status and the log's path) or ``pending``. Launching again
runs the failed and pending ones. Imports neither torch nor pandas.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["GRID_PAPERS", "GridError", "Grid", "RunConfig", "grids_dir", "grid_path", "load_grid", "parse_grid",
           "run_id", "run_status", "status_table", "mark_failed", "clear_failed", "count_status", "FAILED_DIR",
           "STATUSES"]

#: papers with a shipped grid file (data/grids/<paper>.yaml)
GRID_PAPERS = ("mgwfbp", "omgs", "dear", "osp")
#: hidden folder under a runs folder with one ``<run_id>.failed`` marker per failed launch
FAILED_DIR = ".grid"
STATUSES = ("done", "failed", "pending")

# Keys of a configuration that are not `repro train` options of the run itself.
_PLACEMENT = ("paper", "experiment", "world_size", "nodes", "gpus_per_node", "processes")
_PRECISIONS = ("float32", "float16", "bfloat16")


class GridError(ValueError):
    """A grid file that cannot be used; the message is one line naming the file and the problem."""


@dataclass(frozen=True)
class RunConfig:
    """One run of a grid: ``config`` holds every setting (its canonical JSON gives :attr:`run_id`).

    ``world_size`` is P, the training ranks; ``processes`` adds a parameter server's ranks (``servers``);
    ``nodes`` x ``procs_per_node`` = ``processes`` (one process per GPU).
    """

    config: Mapping[str, Any]

    @property
    def run_id(self) -> str:
        return run_id(self.config)

    def __getitem__(self, key: str) -> Any:
        return self.config[key]

    @property
    def nodes(self) -> int:
        return int(self.config["nodes"])

    @property
    def processes(self) -> int:
        return int(self.config["processes"])

    @property
    def procs_per_node(self) -> int:
        return self.processes // self.nodes

    def train_options(self) -> dict[str, Any]:
        """The ``repro train`` options of this run (placement keys left out), in a stable order."""
        return {k: v for k, v in self.config.items() if k not in _PLACEMENT}


@dataclass(frozen=True)
class Grid:
    """A parsed grid file (see the module docstring)."""

    paper: str
    notebook: str
    source: str
    networks: tuple[str, ...]
    gpus_per_node: int
    runs: tuple[RunConfig, ...]
    path: Path | None = field(default=None, compare=False)

    @property
    def max_processes(self) -> int:
        return max(r.processes for r in self.runs)

    def models(self) -> list[str]:
        return list(dict.fromkeys(r["model"] for r in self.runs))

    def world_sizes(self) -> list[int]:
        return sorted({int(r["world_size"]) for r in self.runs})

    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]

    def summary(self) -> str:
        """One line: runs, models, P, nodes."""
        nodes = max(r.nodes for r in self.runs)
        return (f"{self.paper} grid: {len(self.runs)} runs, models {', '.join(self.models())}, P in "
                f"{self.world_sizes()}, up to {nodes} node(s) x {self.gpus_per_node} GPU(s)")


def grids_dir() -> Path:
    """The shipped grid files' folder (``data/grids``)."""
    from repro.paths import shipped_path

    return shipped_path("grids")


def grid_path(paper: str) -> Path:
    """The grid file of ``paper`` (a key of :data:`GRID_PAPERS`, or a path to a ``.yaml`` file)."""
    if paper in GRID_PAPERS:
        return grids_dir() / f"{paper}.yaml"
    p = Path(paper)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    raise GridError(f"no grid {paper!r}: use one of {', '.join(GRID_PAPERS)} or a path to a grid .yaml file")


def load_grid(paper: str | Path) -> Grid:
    """Read and check a grid file (a paper key or a path); :class:`GridError` in one line if it is wrong."""
    import yaml

    path = grid_path(str(paper))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise GridError(f"{path}: cannot be read as YAML ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return parse_grid(data, path)


def _fail(where: str, msg: str) -> GridError:
    return GridError(f"{where}: {msg}")


def _positive_int(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(where, f"{name} must be a positive integer, got {value!r}")
    return value


def _names(where: str, name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"{name} must be a non-empty list of names, got {value!r}")
    return value


def _options(where: str, name: str, value: Any) -> dict[str, Any]:
    value = {} if value is None else value
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _fail(where, f"{name} must be a mapping of repro train options, got {value!r}")
    bad = [k for k in value if k in _PLACEMENT or k in ("model", "scheduler", "wire_dtype", "world_size",
                                                          "results_dir", "run_id", "overwrite", "device")]
    if bad:
        raise _fail(where, f"{name} may not set {', '.join(bad)} (the grid's axes and the launcher decide them)")
    return dict(value)


def parse_grid(data: Any, path: Path | str | None = None) -> Grid:
    """A :class:`Grid` from a grid file's parsed YAML (``path`` only names it in messages)."""
    where = str(path or "grid")
    if not isinstance(data, dict):
        raise _fail(where, "a grid file is a mapping (paper, notebook, gpus_per_node, train, experiments)")
    unknown = sorted(set(data) - {"paper", "notebook", "source", "networks", "gpus_per_node", "train", "experiments"})
    if unknown:
        raise _fail(where, f"unknown key(s) {', '.join(unknown)}")
    for key in ("paper", "notebook"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise _fail(where, f"{key} must be a name, got {data.get(key)!r}")
    gpn = _positive_int(where, "gpus_per_node", data.get("gpus_per_node"))
    networks = tuple(_names(where, "networks", data.get("networks", ["unspecified"])))
    base = _options(where, "train", data.get("train"))
    experiments = data.get("experiments")
    if not isinstance(experiments, list) or not experiments:
        raise _fail(where, "experiments must be a non-empty list")
    runs: list[RunConfig] = []
    for i, exp in enumerate(experiments):
        ew = f"{where}: experiments[{i}]"
        if not isinstance(exp, dict):
            raise _fail(ew, "an experiment is a mapping (name, models, world_sizes, schedulers, precisions)")
        unknown = sorted(set(exp) - {"name", "models", "world_sizes", "schedulers", "precisions", "train"})
        if unknown:
            raise _fail(ew, f"unknown key(s) {', '.join(unknown)}")
        name = exp.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(ew, f"name must be a name, got {name!r}")
        models = exp.get("models")
        if not isinstance(models, dict) or not models:
            raise _fail(ew, "models must map each model to its options (batch_size at least)")
        sizes = exp.get("world_sizes")
        if not isinstance(sizes, list) or not sizes:
            raise _fail(ew, f"world_sizes must be a non-empty list of GPU counts, got {sizes!r}")
        sizes = [_positive_int(ew, "world_sizes", p) for p in sizes]
        schedulers = exp.get("schedulers")
        if isinstance(schedulers, dict) and schedulers:  # name -> options of that scheduler only
            sched_opts = {k: _options(f"{ew}: schedulers.{k}", "options", v) for k, v in schedulers.items()}
        else:
            sched_opts = {k: {} for k in _names(ew, "schedulers", schedulers)}
        precisions = _names(ew, "precisions", exp.get("precisions", ["float32"]))
        bad = [p for p in precisions if p not in _PRECISIONS]
        if bad:
            raise _fail(ew, f"precision(s) {', '.join(bad)} unknown: use {', '.join(_PRECISIONS)}")
        options = {**base, **_options(ew, "train", exp.get("train"))}
        for model, mopts in models.items():
            mopts = _options(f"{ew}: models.{model}", "options", mopts)
            batch = _positive_int(f"{ew}: models.{model}", "batch_size", mopts.pop("batch_size", None))
            for p in sizes:
                for sched, sopts in sched_opts.items():
                    for prec in precisions:
                        cfg = {"model": model, "scheduler": sched, "batch_size": batch, "world_size": p,
                               "wire_dtype": prec, **options, **mopts, **sopts}
                        procs = p + int(cfg.get("servers") or 0)
                        if procs > gpn and procs % gpn:
                            raise _fail(ew, f"{procs} processes ({model}, P={p}) do not fill whole nodes of "
                                            f"{gpn} GPUs")
                        nodes = max(1, math.ceil(procs / gpn))
                        cfg.update(paper=data["paper"], experiment=name, nodes=nodes, gpus_per_node=gpn,
                                   processes=procs)
                        runs.append(RunConfig(cfg))
    ids = [r.run_id for r in runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _fail(where, f"the same configuration appears twice ({dup[0]}); each run must be listed once")
    return Grid(paper=data["paper"], notebook=data["notebook"], source=str(data.get("source", "")),
                networks=networks, gpus_per_node=gpn, runs=tuple(runs), path=Path(path) if path else None)


def _canonical(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=str)


def run_id(config: Mapping[str, Any]) -> str:
    """The run id of a configuration: readable prefix + 10 hex digits of its canonical JSON's SHA-256.

    Stable across processes and Python versions (sorted keys, no floats' repr beyond JSON's); any change
    of any setting gives another id."""
    digest = hashlib.sha256(_canonical(config).encode()).hexdigest()[:10]
    prefix = (f"{config.get('model', 'run')}_{config.get('scheduler', 'x')}_p{config.get('world_size', 0)}_"
              f"{config.get('wire_dtype', 'float32')}_b{config.get('batch_size', 0)}")
    return f"{prefix}-{digest}"


def _failed_marker(runs_dir: Path, rid: str) -> Path:
    return Path(runs_dir) / FAILED_DIR / f"{rid}.failed"


def mark_failed(runs_dir: str | Path, rid: str, detail: str) -> Path:
    """Leave the marker of a failed launch of ``rid`` (``detail``: exit status, log path)."""
    marker = _failed_marker(Path(runs_dir), rid)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(detail.rstrip() + "\n")
    return marker


def clear_failed(runs_dir: str | Path, rid: str) -> None:
    _failed_marker(Path(runs_dir), rid).unlink(missing_ok=True)


def run_status(runs_dir: str | Path, rid: str) -> str:
    """``done`` if ``<runs_dir>/<rid>/run.json`` exists, ``failed`` if a launch of it failed (and it has
    not finished since), ``pending`` otherwise."""
    from repro.runs import RUN_JSON

    root = Path(runs_dir)
    if (root / rid / RUN_JSON).is_file():
        return "done"
    return "failed" if _failed_marker(root, rid).is_file() else "pending"


def status_table(grid: Grid | Iterable[RunConfig], runs_dir: str | Path) -> list[dict[str, Any]]:
    """One row per run of ``grid`` (a :class:`Grid` or runs): run_id, status, model, scheduler, P,
    precision, batch, nodes, processes."""
    runs = grid.runs if isinstance(grid, Grid) else list(grid)
    return [{"run_id": r.run_id, "status": run_status(runs_dir, r.run_id), "model": r["model"],
             "scheduler": r["scheduler"], "world_size": r["world_size"], "wire_dtype": r["wire_dtype"],
             "batch_size": r["batch_size"], "nodes": r.nodes, "processes": r.processes}
            for r in runs]


def count_status(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {s: sum(1 for r in rows if r["status"] == s) for s in STATUSES}
