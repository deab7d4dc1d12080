"""A paper's measured grid as data: grid files, the configurations they expand to, run ids, run status.

One YAML file per paper (``data/grids/<paper>.yaml``) says what the paper measured; the notebooks at
``scale="paper"`` and the launchers (:mod:`repro.grids.jobs`) read the same file. An experiment is
**throughput** (synthetic data, timed ``steps``) or **convergence** (``epochs`` over a real dataset),
told apart by ``epochs`` (:attr:`RunConfig.kind`). A grid file::

    paper: mgwfbp                      # mgwfbp, omgs, dear or osp
    notebook: mgwfbp_training          # the notebook that draws these runs
    source: "..."                      # where the setting comes from, and what is ours
    networks: ["10GbE", "56Gb InfiniBand"]   # run the grid once per network
    gpus_per_node: 4                   # P GPUs take ceil(P / gpus_per_node) nodes
    train: {dataset: synthetic, steps: 50, warmup_steps: 5}   # repro train options of every run
    experiments:                       # each one a Cartesian product
      - name: speedup
        models: {resnet152: {batch_size: 128}, densenet161: {batch_size: 64}}
        world_sizes: [1, 16]           # P: training ranks (dedicated servers come on top)
        schedulers: [wfbp, mgwfbp]     # or {ps_ssp: {staleness: 2}}: a scheduler with its own options
        precisions: [float32, float16] # wire dtypes (float32, the default, passes no flag)
        train: {}                      # this experiment's options (override the file's; null drops one)
      - name: convergence
        kind: convergence              # optional (epochs make it one); needs epochs and a real dataset
        models: {resnet50: {batch_size: 32, lr: 0.2}}   # a model's options may set train options too
        world_sizes: [16]
        schedulers: [ddp, mgwfbp, {osp: {stage1_share: 0.0}}, {osp: {stage1_share: 0.0, lgp: false}}]
        train: {dataset: imagenet, epochs: 30}

Run ids: ``<model>_<scheduler>_p<P>_<precision>_b<batch>-<hash>`` (:func:`run_id`), so a rerun finds its
finished runs. Status (:func:`run_status`): ``done``, ``damaged``, ``failed`` or ``pending``. A run on
this machine: :func:`local_stand_in`. Imports neither torch nor pandas."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from repro.core import ranges

__all__ = ["GRID_PAPERS", "DEFAULT_PRECISION", "GridError", "Grid", "RunConfig", "grids_dir", "grid_path", "load_grid", "parse_grid",
           "dedicated_servers",
           "run_id", "run_status", "run_problem", "status_table", "mark_failed", "clear_failed", "count_status", "grid_run_ids",
           "finished_run_ids", "FAILED_DIR", "STATUSES", "KINDS", "TINY_STAND_INS", "STAND_IN_MAX_RANKS",
           "local_stand_in", "distinct_stand_ins"]

#: papers with a shipped grid file (data/grids/<paper>.yaml)
GRID_PAPERS = ("mgwfbp", "omgs", "dear", "osp")
#: hidden folder under a runs folder with one ``<run_id>.failed`` marker per failed launch
FAILED_DIR = ".grid"
STATUSES = ("done", "damaged", "failed", "pending")
#: kinds of experiment: timed steps on synthetic data, or epochs over a real dataset
KINDS = ("throughput", "convergence")

# Keys of a configuration that are not `repro train` options of the run itself.
_PLACEMENT = ("paper", "experiment", "world_size", "nodes", "gpus_per_node", "processes")
_PRECISIONS = ("float32", "float16", "bfloat16")
#: an experiment's precision when it gives none: the models' own dtype, which every scheduler takes (the
#: launchers pass ``--wire-dtype`` only for another one)
DEFAULT_PRECISION = "float32"
#: a model family (:attr:`repro.workload.catalog.ModelInfo.family`) -> the tiny model that stands in for it
TINY_STAND_INS = {"vision": "tiny_resnet", "bert": "tiny_bert", "lm": "tiny_lstm"}
#: the most local ranks a stand-in gets (:func:`local_stand_in`)
STAND_IN_MAX_RANKS = 3
# train options a stand-in sets to keep it to a few seconds (the steps; not what the scheduler does)
_STAND_IN_SHORT = {"batch_size": 4, "warmup_steps": 1, "compute_steps": 1, "fit_repeats": 1}


class GridError(ValueError):
    """A grid file that cannot be used; the message is one line naming the file and the problem."""


@dataclass(frozen=True)
class RunConfig:
    """One run of a grid: ``config`` holds every setting (its canonical JSON gives :attr:`run_id`).
    ``world_size`` is P, the training ranks; ``processes`` adds dedicated server ranks;
    ``nodes`` x ``procs_per_node`` = ``processes`` (one process per GPU)."""

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

    @property
    def kind(self) -> str:
        """``convergence`` (``epochs`` passes over a real dataset) or ``throughput`` (timed steps)."""
        return "convergence" if self.config.get("epochs") else "throughput"

    @property
    def experiment(self) -> str:
        return str(self.config.get("experiment", ""))

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

    def select(self, kind: str | None = None, experiment: str | None = None) -> list[RunConfig]:
        """The runs of one ``kind`` (:data:`KINDS`) and/or one ``experiment`` (by name); all by default."""
        if kind is not None and kind not in KINDS:
            raise GridError(f"kind {kind!r} unknown: use {', '.join(KINDS)}")
        if experiment is not None and experiment not in self.experiments():
            raise GridError(f"{self.paper} grid has no experiment {experiment!r}: its experiments are "
                            f"{', '.join(self.experiments())}")
        return [r for r in self.runs
                if (kind is None or r.kind == kind) and (experiment is None or r.experiment == experiment)]

    def experiments(self, kind: str | None = None) -> list[str]:
        """The experiments' names in file order (of one ``kind`` if given)."""
        return list(dict.fromkeys(r.experiment for r in self.runs if kind is None or r.kind == kind))

    def models(self, kind: str | None = None) -> list[str]:
        return list(dict.fromkeys(r["model"] for r in self.select(kind)))

    def world_sizes(self, kind: str | None = None) -> list[int]:
        return sorted({int(r["world_size"]) for r in self.select(kind)})

    def run_ids(self, kind: str | None = None, experiment: str | None = None) -> list[str]:
        return [r.run_id for r in self.select(kind, experiment)]

    def summary(self) -> str:
        """One line: runs (per kind), models, P, nodes."""
        nodes = max(r.nodes for r in self.runs)
        kinds = ", ".join(f"{n} {k}" for k in KINDS if (n := len(self.select(k))))
        return (f"{self.paper} grid: {len(self.runs)} runs ({kinds}), models {', '.join(self.models())}, P in "
                f"{self.world_sizes()}, up to {nodes} node(s) x {self.gpus_per_node} GPU(s)")


def grids_dir() -> Path:
    """The shipped grid files' folder (``data/grids``)."""
    from repro.core.paths import shipped_path

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
    except UnicodeDecodeError as e:
        raise GridError(f"{path}: a grid file is UTF-8 YAML text, but byte {e.start} is not UTF-8") from None
    except (OSError, yaml.YAMLError) as e:
        raise GridError(f"{path}: cannot be read as YAML ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    except RecursionError:
        raise GridError(f"{path}: YAML nested too deeply to be a grid file") from None
    return parse_grid(data, path)


def _fail(where: str, msg: str) -> GridError:
    return GridError(f"{where}: {msg}")


def _positive_int(where: str, name: str, value: Any, quantity: ranges.Quantity = ranges.COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(where, f"{name} must be a positive integer, got {ranges.show(value)}")
    ranges.check(quantity, value, name, lambda msg: _fail(where, msg))
    return value


# Numeric train options a grid file sets, and their plausible ranges (repro.core.ranges says why).
_OPTION_RANGES = {"steps": ranges.COUNT, "warmup_steps": ranges.COUNT, "compute_steps": ranges.COUNT,
                  "epochs": ranges.COUNT, "staleness": ranges.COUNT, "fit_repeats": ranges.COUNT,
                  "servers": ranges.WORKERS, "batch_size": ranges.BATCH_SIZE}


def _names(where: str, name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(where, f"{name} must be a non-empty list of names, got {value!r}")
    return value


def _options(where: str, name: str, value: Any) -> dict[str, Any]:
    """A mapping of ``repro train`` options; a value ``None`` (YAML ``null``) drops an inherited one."""
    value = {} if value is None else value
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _fail(where, f"{name} must be a mapping of repro train options, got {value!r}")
    bad = [k for k in value if k in _PLACEMENT or k in ("model", "scheduler", "wire_dtype", "world_size",
                                                          "results_dir", "run_id", "overwrite", "device")]
    if bad:
        raise _fail(where, f"{name} may not set {', '.join(bad)} (the grid's axes and the launcher decide them)")
    for k, v in value.items():
        field_ = k if name == "options" else f"{name}.{k}"  # a model's or scheduler's options: where names it
        if k in _OPTION_RANGES and v is not None:
            ranges.check(_OPTION_RANGES[k], v, field_, lambda msg: _fail(where, msg))
        elif isinstance(v, float) and not math.isfinite(v):
            raise _fail(where, f"field '{field_}' must be a finite number, got {v!r}")
    return dict(value)


def _merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Options layered left to right; ``None`` in a later layer removes the key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for k, v in layer.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
    return out


def _schedulers(where: str, value: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(scheduler, options)`` pairs from a list of names and ``{name: options}`` items, or a mapping."""
    if isinstance(value, dict) and value:  # name -> options of that scheduler only
        return [(k, _options(f"{where}: schedulers.{k}", "options", v)) for k, v in value.items()]
    if not isinstance(value, list) or not value:
        raise _fail(where, f"schedulers must be a non-empty list of names (or of {{name: options}}), got {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str) and item:
            out.append((item, {}))
        elif isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item)), str):
            name, opts = next(iter(item.items()))
            out.append((name, _options(f"{where}: schedulers[{i}].{name}", "options", opts)))
        else:
            raise _fail(where, f"schedulers[{i}] must be a name or a one-key mapping {{name: options}}, got {item!r}")
    return out


def dedicated_servers(cfg: Mapping[str, Any]) -> int:
    """Processes a run adds beside its ``world_size`` trainers: its ``servers`` when they are dedicated
    ranks (the default placement), none when ``server_placement: colocated`` puts them on the trainers."""
    if cfg.get("server_placement", "dedicated") == "colocated":
        return 0
    return int(cfg.get("servers") or 0)


def _check_kind(where: str, declared: Any, cfg: Mapping[str, Any]) -> None:
    if declared is not None and declared not in KINDS:
        raise _fail(where, f"kind must be one of {', '.join(KINDS)}, got {declared!r}")
    epochs = cfg.get("epochs")
    if epochs is not None:
        _positive_int(where, "epochs", epochs)
        if cfg.get("dataset", "synthetic") == "synthetic":
            raise _fail(where, "epochs need a real dataset (train: {dataset: cifar10, ...}); synthetic data "
                               "runs timed steps")
    if declared == "convergence" and epochs is None:
        raise _fail(where, "a convergence experiment needs epochs (and a real dataset) in its train options")
    if declared == "throughput" and epochs is not None:
        raise _fail(where, "a throughput experiment runs timed steps: drop epochs or say kind: convergence")


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
    gpn = _positive_int(where, "gpus_per_node", data.get("gpus_per_node"), ranges.WORKERS)
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
        unknown = sorted(set(exp) - {"name", "kind", "models", "world_sizes", "schedulers", "precisions", "train"})
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
        sizes = [_positive_int(ew, f"world_sizes[{k}]", p, ranges.WORKERS) for k, p in enumerate(sizes)]
        sched_opts = _schedulers(ew, exp.get("schedulers"))
        precisions = _names(ew, "precisions", exp.get("precisions", [DEFAULT_PRECISION]))
        bad = [p for p in precisions if p not in _PRECISIONS]
        if bad:
            raise _fail(ew, f"precision(s) {', '.join(bad)} unknown: use {', '.join(_PRECISIONS)}")
        exp_train = _options(ew, "train", exp.get("train"))
        for model, mopts in models.items():
            mopts = _options(f"{ew}: models.{model}", "options", mopts)
            batch = _positive_int(f"{ew}: models.{model}", "batch_size", mopts.pop("batch_size", None),
                                  ranges.BATCH_SIZE)
            for p in sizes:
                for sched, sopts in sched_opts:
                    for prec in precisions:
                        cfg = _merge({"model": model, "scheduler": sched, "batch_size": batch, "world_size": p,
                                      "wire_dtype": prec}, base, exp_train, mopts, sopts)
                        _check_kind(ew, exp.get("kind"), cfg)
                        if cfg.get("epochs") is not None:
                            cfg.pop("steps", None)  # repro train ignores steps with epochs: not part of the id
                        procs = p + dedicated_servers(cfg)
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
    Stable across processes and Python versions; any change of any setting gives another id."""
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
    """``done`` if ``<runs_dir>/<rid>/run.json`` is a finished run's record
    (:func:`repro.results.runs.record_problem`), ``damaged`` if that file is there but is not
    (:func:`run_problem` says why), ``failed`` if a launch of it failed and it has not finished since,
    ``pending`` otherwise."""
    from repro.results.runs import RUN_JSON, record_problem

    root = Path(runs_dir)
    if os.path.lexists(root / rid / RUN_JSON):
        return "done" if record_problem(root / rid) is None else "damaged"
    return "failed" if _failed_marker(root, rid).is_file() else "pending"


def run_problem(runs_dir: str | Path, rid: str) -> str | None:
    """One line naming a ``damaged`` run's ``run.json`` and what is wrong with it; None otherwise."""
    from repro.results.runs import RUN_JSON, record_problem

    folder = Path(runs_dir) / rid
    return record_problem(folder) if os.path.lexists(folder / RUN_JSON) else None


def status_table(grid: Grid | Iterable[RunConfig], runs_dir: str | Path) -> list[dict[str, Any]]:
    """One row per run of ``grid`` (a :class:`Grid` or runs): run_id, status, model, scheduler, P,
    precision, batch, nodes, processes."""
    runs = grid.runs if isinstance(grid, Grid) else list(grid)
    return [{"run_id": r.run_id, "status": run_status(runs_dir, r.run_id),
             **{k: r[k] for k in ("model", "scheduler", "world_size", "wire_dtype", "batch_size")},
             "nodes": r.nodes, "processes": r.processes} for r in runs]


def count_status(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {s: sum(1 for r in rows if r["status"] == s) for s in STATUSES}


def grid_run_ids(paper: str | Path | Grid, kind: str | None = None, experiment: str | None = None) -> list[str]:
    """The run ids of ``paper``'s grid (a key, a grid file or a :class:`Grid`) of one ``kind`` and/or
    ``experiment``: what a notebook at ``scale="paper"`` reads for a figure."""
    grid = paper if isinstance(paper, Grid) else load_grid(paper)
    return grid.run_ids(kind, experiment)


def finished_run_ids(paper: str | Path | Grid, runs_dir: str | Path, kind: str | None = None,
                     experiment: str | None = None) -> tuple[list[str], list[str]]:
    """``(done, not_done)``: the run ids of :func:`grid_run_ids` finished under ``runs_dir``, and the others,
    each in the grid's order."""
    ids = grid_run_ids(paper, kind, experiment)
    done = [i for i in ids if run_status(runs_dir, i) == "done"]
    return done, [i for i in ids if i not in set(done)]


def _stand_in_ranks(run: RunConfig, max_ranks: int) -> int:
    """Local ranks of ``run``'s stand-in: one per node (one-node run: per process), at most ``max_ranks``, at
    least 2 workers plus its servers."""
    servers = run.processes - int(run["world_size"])
    ranks = min(run.nodes if run.nodes > 1 else run.processes, max_ranks)
    need = min(run.processes, servers + 2)
    if need > max_ranks:
        raise GridError(f"{run.run_id}: its stand-in needs {need} local ranks ({servers} server(s) + 2 workers), "
                        f"more than {max_ranks}")
    return max(ranks, need)


def local_stand_in(run: RunConfig, *, max_ranks: int = STAND_IN_MAX_RANKS, steps: int = 2) -> RunConfig:
    """``run`` as this machine can run it: one node of local ranks (:func:`_stand_in_ranks`), the tiny
    model of the same family (:data:`TINY_STAND_INS`) at its own shape, synthetic data for ``steps`` timed
    steps and short settings (4 samples per rank, one warm-up and computation-only step, one fit repeat). The
    scheduler, its options, wire dtype, ``amp``, optimizer, paper and experiment are ``run``'s; the run id
    is its own. :class:`GridError` when the model has no stand-in or needs more than ``max_ranks``."""
    from repro.workload.catalog import MODEL_NAMES, model_info

    model = str(run["model"])
    if model not in MODEL_NAMES:
        raise GridError(f"{run.run_id}: unknown model {model!r}")
    info = model_info(model)
    tiny = TINY_STAND_INS.get(info.family)
    if tiny is None:
        raise GridError(f"{run.run_id}: no tiny stand-in for {model} ({info.family} family; known: "
                        f"{', '.join(TINY_STAND_INS)})")
    ranks = _stand_in_ranks(run, max_ranks)
    cfg = {k: v for k, v in run.config.items() if k not in info.kwargs and k not in ("epochs", "dataset")}
    short = dict(_STAND_IN_SHORT, batch_size=min(int(run["batch_size"]), _STAND_IN_SHORT["batch_size"]))
    if run.config.get("compute_steps") == 0:
        short["compute_steps"] = 0
    cfg.update(short, model=tiny, steps=steps, world_size=ranks - (run.processes - int(run["world_size"])),
               nodes=1, gpus_per_node=ranks, processes=ranks)
    return RunConfig(cfg)


def _distinct_key(stand_in: RunConfig) -> str:
    """What makes a stand-in another test: model, scheduler and options, wire dtype, amp and ranks."""
    from repro.core.run_options import RUN_OPTIONS

    keep = {k: v for k, v in stand_in.config.items()
            if k in RUN_OPTIONS or k in ("model", "scheduler", "wire_dtype", "amp", "processes", "world_size")}
    return _canonical(keep)


def distinct_stand_ins(runs: Iterable[RunConfig], *, max_ranks: int = STAND_IN_MAX_RANKS,
                       steps: int = 2) -> list[tuple[RunConfig, list[RunConfig]]]:
    """One :func:`local_stand_in` per distinct configuration of ``runs`` (:func:`_distinct_key`), each
    with the runs it stands for, in the order of their first run."""
    groups: dict[str, tuple[RunConfig, list[RunConfig]]] = {}
    for run in runs:
        stand_in = local_stand_in(run, max_ranks=max_ranks, steps=steps)
        groups.setdefault(_distinct_key(stand_in), (stand_in, []))[1].append(run)
    return list(groups.values())
