"""Launch a paper's grid (:mod:`repro.grids.grid`): on this node's GPUs, through SLURM, or as job scripts.

Every run is one ``torchrun`` of ``repro.train`` per node (:func:`torchrun_argv`), writing its run folder
under ``runs_dir``, which every node must see. Launchers (a notebook's ``launcher``): ``"print"``
(:func:`write_job_scripts`), ``"local"`` (:func:`launch_local_grid`), ``"slurm"`` (:func:`submit_slurm`).
Every launcher first refuses, starting nothing, the runs their ranks would refuse (:func:`refuse_bad_runs`,
:class:`BadRuns`) and damaged runs (:func:`pending_runs`). See docs/design/launch.md."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from repro.core import ranges
from repro.grids.grid import (
    DEFAULT_PRECISION, Grid, RunConfig, clear_failed, count_status, load_grid, mark_failed, run_problem,
    run_status, status_table)

__all__ = ["LAUNCHERS", "GridStop", "BadRuns", "run_refusal", "refusal_line", "check_runs", "check_summary",
           "refuse_bad_runs", "DEFAULT_PORT", "train_argv", "torchrun_argv", "shell_command", "quiet_torch_env",
           "write_job_scripts", "launch_local_grid", "emulate_nodes", "submit_slurm", "wait_jobs",
           "local_gpu_count", "prepare_paper_runs", "pending_runs", "check_folder", "SlurmResources", "slurm_resources", "has_servers"]

#: values of a notebook's ``launcher`` parameter ("" = launch nothing)
LAUNCHERS = ("", "local", "slurm", "print")
#: TCP port of the c10d rendezvous on the first node
DEFAULT_PORT = 29500
#: seconds :func:`emulate_nodes` leaves the other agents, after one failed, to stop by themselves
_PEERS_GRACE_S = 30.0


class GridStop(ValueError):
    """The notebook stops here: a launch refused, or job scripts written. One line, shown as it is."""

    def _render_traceback_(self) -> list[str]:  # IPython: print the line, not a traceback
        return [f"{type(self).__name__}: {self}"]


def pending_runs(runs: Sequence[RunConfig], runs_dir: str | Path, *, overwrite: bool = False) -> list[RunConfig]:
    """The unfinished runs of ``runs`` (pending or failed), in order; a finished run is never launched.
    A damaged run (its ``run.json`` unreadable or not a finished run's record) raises :class:`BadRuns`
    (one line per run) unless ``overwrite``: then it is launched again and its folder replaced."""
    status = {r.run_id: run_status(runs_dir, r.run_id) for r in runs}
    damaged = [r for r in runs if status[r.run_id] == "damaged"]
    if damaged and not overwrite:
        lines = [f"{r.run_id}: damaged: {run_problem(runs_dir, r.run_id)}" for r in damaged]
        raise BadRuns(f"{len(damaged)} run(s) under {runs_dir} are damaged (first: {run_problem(runs_dir, damaged[0].run_id)}); "
                      "launch them again with --overwrite (overwrite=True), which replaces their folders, or "
                      "remove them", lines)
    return [r for r in runs if status[r.run_id] != "done"]


def check_folder(what: str, path: str | Path) -> Path:
    """``path`` if it is a folder or can be created as one; else :class:`GridStop`, one line naming ``what``
    (a file, FIFO or device is never replaced). Nothing is written."""
    p = Path(path)
    if os.path.lexists(p) and not p.is_dir():
        kind = "a file" if p.is_file() else ("a dangling link" if p.is_symlink() and not p.exists()
                                               else "a FIFO, device or socket")
        raise GridStop(f"{what} {p} is {kind}, not a folder; give a folder (created if missing)")
    for up in p.parents:
        if os.path.lexists(up):
            if not up.is_dir():
                raise GridStop(f"{what} {p} cannot be a folder: {up} is not a folder")
            break
    return p


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def has_servers(run: RunConfig) -> bool:
    """Whether ``run``'s scheduler runs dedicated server ranks (these take no in-run checkpoints)."""
    from repro.core.families import get_family
    from repro.core.schedulers import get_scheduler

    family = get_scheduler(str(run["scheduler"])).family
    return family is not None and bool(get_family(family).server)


def train_argv(run: RunConfig, runs_dir: str | Path, *, backend: str = "nccl", device: str = "cuda",
               checkpoint_every_min: float = 0.0) -> list[str]:
    """``-m repro.train`` and every flag of ``run``, its run id, ``--results-dir runs_dir``, backend, device,
    ``--overwrite --quiet``. ``--wire-dtype`` only for a precision other than :data:`DEFAULT_PRECISION`;
    ``--checkpoint-every-min`` (minutes) only when > 0 and the run has no server ranks. A grid-wide option
    with a default that the scheduler does not take is left out."""
    argv = ["-m", "repro.train", "--model", str(run["model"]), "--scheduler", str(run["scheduler"]),
            "--batch-size", str(run["batch_size"])]
    if run["wire_dtype"] != DEFAULT_PRECISION:
        argv += ["--wire-dtype", str(run["wire_dtype"])]
    from repro.core.run_options import RUN_OPTIONS, option_takers
    from repro.core.schedulers import get_scheduler

    try:
        sched = get_scheduler(str(run["scheduler"]))
    except ValueError:  # an unknown name: given as it is, refused by repro train (grid check's words)
        sched = None
    for key, value in run.train_options().items():
        if key in ("model", "scheduler", "batch_size", "wire_dtype"):
            continue
        if sched is not None and key == "fit_repeats" and not sched.has_plan:
            continue  # a grid-wide fit repeat count: unused by a scheduler that fits nothing (ddp, local)
        if sched is not None and key in RUN_OPTIONS and not RUN_OPTIONS[key].refused_elsewhere \
                and sched.name not in option_takers(key):
            continue  # a grid-wide option with a default (density); one without (servers) stays, refused
        if isinstance(value, bool):
            argv.append(_flag(key) if value else _flag(f"no_{key}"))
        else:
            argv += [_flag(key), str(value)]
    argv += ["--results-dir", str(runs_dir), "--run-id", run.run_id, "--backend", backend, "--device", device,
             "--overwrite", "--quiet"]
    if checkpoint_every_min > 0 and not has_servers(run):
        argv += ["--checkpoint-every-min", f"{checkpoint_every_min:g}"]
    return argv


def torchrun_argv(run: RunConfig, runs_dir: str | Path, *, head: str = "$REPRO_HEAD", port: int | str = DEFAULT_PORT,
                  rdzv_id: str | None = None, backend: str = "nccl", device: str = "cuda",
                  python: str | None = None, checkpoint_every_min: float = 0.0) -> list[str]:
    """The torchrun command of one node of ``run`` (the same on every node).

    One node: ``--standalone``. Several: c10d rendezvous at ``head:port`` with ``rdzv_id`` (default the run
    id), no ``--node-rank`` (c10d ranks the nodes, so global rank 0 may be on any node). ``head``, ``port``
    and ``rdzv_id`` may be shell variables. ``--max-restarts 0``: a failed run is not restarted."""
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if run.nodes == 1:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += ["--nnodes", str(run.nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{head}:{port}",
                "--rdzv-id", str(rdzv_id or run.run_id)]
    cmd += ["--nproc-per-node", str(run.procs_per_node), "--max-restarts", "0"]
    return cmd + train_argv(run, runs_dir, backend=backend, device=device, checkpoint_every_min=checkpoint_every_min)


_VAR = re.compile(r"\$\{?[A-Za-z_]")


def shell_command(argv: Sequence[str]) -> str:
    """``argv`` as one shell line: arguments quoted, except that ``$VAR`` inside one is left to expand."""
    return " ".join(f'"{a}"' if _VAR.search(a) and '"' not in a and "`" not in a else shlex.quote(a) for a in argv)


def run_refusal(run: RunConfig, *, backend: str = "nccl", device: str = "cuda") -> str | None:
    """Why the ranks of ``run`` would refuse it at start-up on ``backend``/``device`` (one line), or None:
    ``repro train``'s own checks on the launcher's command line, and the world checks on ``run.processes``
    ranks. Nothing is started."""
    from repro.training.config import config_from_argv

    argv = train_argv(run, "runs", backend=backend, device=device)[2:]
    try:
        cfg, _ = config_from_argv(argv)
        cfg.check_world(run.processes, backend=backend, device=device)
    except (ValueError, FileNotFoundError) as e:
        return (str(e).splitlines() or [type(e).__name__])[0]
    return None


def _what(run: RunConfig) -> str:
    return (f"{run.config.get('paper', '?')}/{run.experiment or '?'}: {run['scheduler']} on {run['model']}, "
            f"{run['world_size']} workers, {run['wire_dtype']}")


def refusal_line(run: RunConfig, reason: str) -> str:
    """One line naming ``run`` (paper/experiment, scheduler, model, workers, wire dtype, run id) and why."""
    return f"refused: {_what(run)} ({run.run_id}): {reason}"


def check_runs(runs: Sequence[RunConfig], *, backend: str = "nccl",
               device: str = "cuda") -> list[tuple[RunConfig, str]]:
    """``(run, reason)`` for every run of ``runs`` that :func:`run_refusal` refuses, in order."""
    reasons = [(run, run_refusal(run, backend=backend, device=device)) for run in runs]
    return [(run, reason) for run, reason in reasons if reason is not None]


def check_summary(name: str, runs: Sequence[RunConfig], bad: Sequence[tuple[RunConfig, str]], *, backend: str,
                  device: str) -> str:
    """The summary line of a check of ``runs`` (``name``: the grid)."""
    where = f"(backend {backend}, device {device})"
    if bad:
        return f"{name} grid: {len(bad)} of {len(runs)} runs would be refused at start-up {where}"
    return f"{name} grid: all {len(runs)} runs pass the ranks' start-up checks {where}"


class BadRuns(GridStop):
    """Runs their ranks would refuse: a one-line message; ``lines``: one per run (:func:`refusal_line`)."""

    def __init__(self, message: str, lines: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.lines = tuple(lines)


def refuse_bad_runs(runs: Sequence[RunConfig], *, backend: str = "nccl", device: str = "cuda",
                    launcher: str = "") -> None:
    """Raise :class:`BadRuns` when any of ``runs`` would be refused at start-up on ``backend``/``device``.
    A launcher calls it before it writes, starts or submits anything."""
    bad = check_runs(runs, backend=backend, device=device)
    if not bad:
        return
    first_run, first_reason = bad[0]
    how = f"launcher={launcher!r}: " if launcher else ""
    raise BadRuns(f"{how}{len(bad)} of {len(runs)} runs would be refused at start-up (backend {backend}, device "
                  f"{device}), nothing launched (`repro grid check` lists them); first: {_what(first_run)}: "
                  f"{first_reason}", [refusal_line(r, why) for r, why in bad])


_SAFE = re.compile(r"[A-Za-z0-9_.,:+-]+")
#: sbatch options that SlurmResources sets itself (an ``extra`` line may not set them again)
_OWN_OPTIONS = {"time": "time_min", "t": "time_min", "partition": "partition", "p": "partition", "account": "account",
                "A": "account", "mem": "mem_gb", "cpus-per-task": "cpus_per_task", "c": "cpus_per_task",
                "gpus-per-node": "gpus_per_node", "gres": "gpus_per_node", "signal": "signal_s",
                "nodes": "(the run's nodes)", "N": "(the run's nodes)", "ntasks-per-node": "(one task per node)",
                "requeue": "(always on)", "no-requeue": "(a stopped run is requeued)"}


@dataclass(frozen=True)
class SlurmResources:
    """What each SLURM job of a grid asks for (launcher ``slurm``; the ``#SBATCH`` lines of ``print``).

    ``time_min``: time limit, minutes; ``signal_s`` seconds before it SIGUSR1 makes the ranks checkpoint
    and stop, and the job is requeued (at most ``requeues`` times). ``checkpoint_every_min``: also checkpoint
    every this many minutes (0: only on the signal). ``mem_gb`` is per node; ``cpus_per_task``, ``partition``,
    ``account``: None = the cluster's default. ``gpus_per_node``: None = the run's ranks per node (on cuda).
    ``extra``: more sbatch options (``--name=value`` or ``--flag``), none that a field sets. Bad values:
    :class:`GridStop`, one line."""

    time_min: int = 120
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    extra: tuple[str, ...] = ()
    signal_s: int = 120
    checkpoint_every_min: float = 30.0
    requeues: int = 20

    def __post_init__(self) -> None:
        def integer(name: str, low: int, high: float) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise GridStop(f"slurm {name}={v!r}: expected an integer in [{low}, {high}]")

        # upper bounds: the plausible ranges of repro.core.ranges (minutes, counts, CPUs and GPUs of one node)
        integer("time_min", 1, int(ranges.MINUTES.high))
        integer("signal_s", 1, 65535)
        integer("requeues", 0, int(ranges.COUNT.high))
        if self.cpus_per_task is not None:
            integer("cpus_per_task", 1, ranges.CPUS.high)
        if self.gpus_per_node is not None:
            integer("gpus_per_node", 0, ranges.WORKERS.high)
        if self.signal_s >= self.time_min * 60:
            raise GridStop(f"slurm signal_s={self.signal_s}: the signal must come before the time limit "
                           f"(time_min={self.time_min} is {self.time_min * 60} s)")
        for name, what, bound in (("mem_gb", "a positive number of GB", ranges.MEMORY_GB),
                                  ("checkpoint_every_min", "a number of minutes >= 0 (0: only on the signal)",
                                   ranges.MINUTES)):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
                    (name == "mem_gb" and v == 0):
                raise GridStop(f"slurm {name}={v!r}: expected {what}")
            if v > bound.high:
                raise GridStop(f"slurm {name}={v!r}: outside the plausible range {bound.range_text()}")
        for name in ("partition", "account"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not _SAFE.fullmatch(v)):
                raise GridStop(f"slurm {name}={v!r}: expected a SLURM name (letters, digits, _ . , : + -)")
        if isinstance(self.extra, str) or not all(isinstance(e, str) for e in self.extra):
            raise GridStop(f"slurm extra={self.extra!r}: expected a list of sbatch options such as '--qos=high'")
        for line in self.extra:
            key = line[2:].split("=", 1)[0] if line.startswith("--") else ""
            if not re.fullmatch(r"--[A-Za-z][A-Za-z0-9-]*(=\S+)?", line):
                raise GridStop(f"slurm extra {line!r}: expected one sbatch option, --name=value or --flag, "
                               "without spaces")
            if key in _OWN_OPTIONS:
                raise GridStop(f"slurm extra {line!r}: set it as {_OWN_OPTIONS[key]}, not as an extra option")

    def gpus_for(self, run: RunConfig, device: str = "cuda") -> int:
        """GPUs per node for ``run``: ``gpus_per_node``, else its ranks per node on cuda (0 on the CPU)."""
        need = run.procs_per_node if device == "cuda" else 0
        return need if self.gpus_per_node is None else self.gpus_per_node

    def check_runs(self, runs: Sequence[RunConfig], device: str = "cuda") -> None:
        """:class:`GridStop` when a run needs more GPUs per node than ``gpus_per_node`` gives it."""
        for run in runs:
            if device == "cuda" and self.gpus_for(run, device) < run.procs_per_node:
                raise GridStop(f"slurm gpus_per_node={self.gpus_per_node}: {run.run_id} runs {run.procs_per_node} "
                               "ranks per node, one GPU each")

    def sbatch_lines(self, run: RunConfig, device: str = "cuda") -> list[str]:
        """The ``#SBATCH`` lines of one job of ``run`` (one task per node)."""
        lines = [f"--job-name={run.run_id}", f"--nodes={run.nodes}", "--ntasks-per-node=1",
                 f"--time={self.time_min}", f"--signal=B:USR1@{self.signal_s}", "--requeue"]
        optional = {"gpus-per-node": self.gpus_for(run, device) or None, "cpus-per-task": self.cpus_per_task,
                    "mem": None if self.mem_gb is None else f"{int(math.ceil(self.mem_gb * 1024))}M",
                    "partition": self.partition, "account": self.account}
        lines += [f"--{option}={value}" for option, value in optional.items() if value is not None]
        return ["#SBATCH " + line for line in [*lines, *self.extra]]

    def submitit_parameters(self, prefix: str = "slurm_") -> dict[str, Any]:
        """``update_parameters`` keywords beyond the job's shape (``prefix``: ``slurm_`` for an AutoExecutor,
        "" for a SlurmExecutor)."""
        out: dict[str, Any] = {f"{prefix}signal_delay_s": self.signal_s, f"{prefix}max_num_timeout": self.requeues}
        optional = {"cpus_per_task": self.cpus_per_task, "mem_gb": self.mem_gb,
                    f"{prefix}partition": self.partition, f"{prefix}account": self.account}
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.extra:
            pairs = (e[2:].split("=", 1) for e in self.extra)
            out[f"{prefix}additional_parameters"] = {p[0].replace("-", "_"): (p[1] if len(p) > 1 else True) for p in pairs}
        return out


_SLURM_KEYS = {f.name for f in fields(SlurmResources)}


def slurm_resources(spec: "SlurmResources | Mapping[str, Any] | str | None" = None, **overrides: Any) -> SlurmResources:
    """:class:`SlurmResources` from None or "" (defaults), a mapping of its fields, or ``key=value`` items
    separated by spaces or ``;`` (``"time_min=720 mem_gb=64 extra=--qos=high"``; ``extra`` may repeat).
    ``overrides`` (None skipped) win. Unknown keys and bad values: :class:`GridStop`, one line."""
    if isinstance(spec, SlurmResources):
        values: dict[str, Any] = asdict(spec)
    elif spec is None or spec == "":
        values = {}
    elif isinstance(spec, str):
        values = {}
        for item in re.split(r"[;\s]+", spec.strip()):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise GridStop(f"slurm {item!r}: expected key=value items ({', '.join(sorted(_SLURM_KEYS))})")
            values[key] = [*values.get(key, []), value] if key == "extra" else _parse_value(key, value)
    elif isinstance(spec, Mapping):
        values = dict(spec)
    else:
        raise GridStop(f"slurm={spec!r}: expected key=value items or a mapping of {', '.join(sorted(_SLURM_KEYS))}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - _SLURM_KEYS)
    if unknown:
        raise GridStop(f"slurm: unknown setting {unknown[0]!r}; known: {', '.join(sorted(_SLURM_KEYS))}")
    if "extra" in values:
        extra = values["extra"]
        values["extra"] = (extra,) if isinstance(extra, str) else tuple(extra) if isinstance(extra, (list, tuple)) \
            else extra
    return SlurmResources(**values)


def _parse_value(key: str, text: str) -> Any:
    kinds = {"time_min": int, "cpus_per_task": int, "gpus_per_node": int, "signal_s": int, "requeues": int,
             "mem_gb": float, "checkpoint_every_min": float}
    if key not in kinds:
        return text
    try:
        return kinds[key](text)
    except ValueError:
        raise GridStop(f"slurm {key}={text!r}: expected {'an integer' if kinds[key] is int else 'a number'}") from None


_SCRIPT = """#!/usr/bin/env bash
{sbatch}# {run_id}: {what}
# Needs {nodes} node(s) x {gpn} GPU(s). Run this script once on every node of the allocation{multi}.
# The run folder goes to {runs_dir}: every node must see that folder (a shared file system).
# Under SLURM (the #SBATCH lines hold when it is submitted with sbatch): on SIGUSR1 before the time limit
# the ranks checkpoint to $RUNS_DIR/{run_id}.incomplete/ and stop, and the job is requeued; the next
# start goes on from the checkpoint.
set -uo pipefail
# c10d's warnings about a closed store or socket (a node failed) carry pages of C++ frames; WARNING shows them
export TORCH_CPP_LOG_LEVEL="${{TORCH_CPP_LOG_LEVEL:-ERROR}}"
RUNS_DIR={runs_dir_q}
# finished: run.json is a finished run's record (a damaged one is not: repro.grids.grid.run_status)
finished() {{ {python_q} -c 'import sys; from repro.grids.grid import run_status; sys.exit(run_status(*sys.argv[1:]) != "done")' "$RUNS_DIR" {run_id} 2>/dev/null; }}
if finished; then echo "{run_id}: finished already"; exit 0; fi
{head_check}(trap '' USR1; exec {cmd}) &
agent=$!
forward() {{ pkill -USR1 -P "$agent" || true; }}  # to the ranks (torchrun itself ignores it)
trap forward USR1
while true; do wait "$agent"; rc=$?; kill -0 "$agent" 2>/dev/null || break; done
if [ "$rc" -ne 0 ] && [ -f "$RUNS_DIR/{run_id}.incomplete/checkpoint.pt" ] && [ -n "${{SLURM_JOB_ID:-}}" ] \\
    && ! finished; then
  echo "{run_id}: checkpointed; requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID" || true  # every node may ask: the first one does it
  exit 0
fi
if [ "$rc" -ne 0 ]; then
  mkdir -p "$RUNS_DIR/.grid" && echo "exit status $rc on $(hostname)" > "$RUNS_DIR/.grid/{run_id}.failed"
fi
exit "$rc"
"""


def write_job_scripts(runs: Sequence[RunConfig], runs_dir: str | Path, jobs_dir: str | Path, *,
                      port: int = DEFAULT_PORT, python: str = "python",
                      resources: "SlurmResources | Mapping[str, Any] | str | None" = None) -> Path:
    """Write ``commands.txt``, one ``<run_id>.sh`` per run and ``runs.json`` to ``jobs_dir``; returns it.
    Nothing is written when a run would be refused on nccl/cuda (:class:`BadRuns`) or ``resources`` is bad.

    Each script starts with ``resources``' ``#SBATCH`` lines; on SIGUSR1 it has the ranks checkpoint and
    requeues the job. Multi-node scripts read the first node's host from ``REPRO_HEAD`` (and the rendezvous
    id from ``REPRO_RDZV_ID``, default the run id); see docs/cluster.md."""
    refuse_bad_runs(runs, backend="nccl", device="cuda", launcher="print")  # before anything is written
    res = slurm_resources(resources)
    res.check_runs(runs)
    check_folder("runs dir", runs_dir)
    jobs = check_folder("jobs dir", jobs_dir)
    jobs.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(runs_dir).resolve()
    lines = []
    for run in runs:
        argv = torchrun_argv(run, runs_dir, head="${REPRO_HEAD}", port=port,
                             rdzv_id="${REPRO_RDZV_ID:-%s}" % run.run_id, python=python,
                             checkpoint_every_min=res.checkpoint_every_min)
        cmd = shell_command(argv)
        lines.append(cmd)
        multi = run.nodes > 1
        what = (f"{run['model']} batch {run['batch_size']}, {run['scheduler']}, P={run['world_size']}, "
                f"{run['wire_dtype']} ({run['paper']} grid, experiment {run['experiment']})")
        sbatch = "".join(f"{line}\n" for line in res.sbatch_lines(run))
        script = _SCRIPT.format(run_id=run.run_id, what=what, sbatch=sbatch, nodes=run.nodes, gpn=run.procs_per_node,
                                multi=" with REPRO_HEAD set to the first node's host" if multi else "",
                                runs_dir=runs_dir, runs_dir_q=shlex.quote(str(runs_dir)), cmd=cmd,
                                python_q=shlex.quote(python),
                                head_check=(': "${REPRO_HEAD:?set REPRO_HEAD to the host name of the first node}"\n'
                                            if multi else ""))
        path = jobs / f"{run.run_id}.sh"
        path.write_text(script)
        path.chmod(0o755)
    (jobs / "commands.txt").write_text("".join(line + "\n" for line in lines))
    (jobs / "runs.json").write_text(json.dumps([{"run_id": r.run_id, **r.config} for r in runs], indent=1) + "\n")
    return jobs


def local_gpu_count() -> int:
    """CUDA devices visible to this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _log_path(logs_dir: Path, run: RunConfig, suffix: str = "") -> Path:
    logs_dir.mkdir(parents=True, exist_ok=True)
    return logs_dir / f"{run.run_id}{suffix}.log"


def launch_local_grid(runs: Sequence[RunConfig], runs_dir: str | Path, logs_dir: str | Path, *,
                      gpus: int | None = None, timeout_s: float = 7200.0, overwrite: bool = False) -> dict[str, int]:
    """Run every unfinished run of ``runs`` with torchrun on this node's GPUs (NCCL), one after another.

    Refused (:class:`GridStop`) before any run starts when a run would be refused at start-up, needs more
    than ``gpus`` GPUs (default :func:`local_gpu_count`) or more than one node. Logs go to
    ``<logs_dir>/<run_id>.log``; a failed run is marked and the others go on. Returns the status counts."""
    todo = pending_runs(runs, runs_dir, overwrite=overwrite)
    refuse_bad_runs(todo, backend="nccl", device="cuda", launcher="local")
    gpus = local_gpu_count() if gpus is None else gpus
    for run in todo:
        if run.nodes > 1:
            raise GridStop(f"launcher='local' runs on this node only, but {run.run_id} needs {run.nodes} nodes x "
                           f"{run.procs_per_node} GPUs: use launcher='slurm' or 'print'")
        if run.processes > gpus:
            raise GridStop(f"launcher='local' needs {run.processes} GPU(s) for {run.run_id} (P={run['world_size']}), "
                           f"but this node has {gpus}: use launcher='slurm' or 'print'")
    logs = Path(logs_dir)
    for i, run in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {run.run_id}", flush=True)
        log = _log_path(logs, run)
        rc = _run_agents(torchrun_argv(run, runs_dir, backend="nccl", device="cuda"), [log], timeout_s)
        _record(runs_dir, run, rc, log)
    return count_status(status_table(runs, runs_dir))


def quiet_torch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) with ``TORCH_CPP_LOG_LEVEL=ERROR`` unless set: when a node fails, c10d
    logs every closed store or socket with a page of C++ frames; the ranks' own errors say what happened."""
    environ = dict(os.environ if env is None else env)
    environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return environ


def _kill(proc: subprocess.Popen) -> None:
    """End a torchrun agent we started and its workers (its own process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _record(runs_dir: str | Path, run: RunConfig, rc: int, log: Path) -> None:
    if rc == 0 and run_status(runs_dir, run.run_id) == "done":
        clear_failed(runs_dir, run.run_id)
    else:
        mark_failed(runs_dir, run.run_id, f"exit status {rc}; log {log}")


def emulate_nodes(run: RunConfig, runs_dir: str | Path, logs_dir: str | Path, *, port: int, backend: str = "gloo",
                  device: str = "cpu", timeout_s: float = 600.0, env: Mapping[str, str] | None = None) -> int:
    """Run ``run`` as ``run.nodes`` torchrun agents on this machine (c10d on 127.0.0.1:``port``): the
    multi-node path without a cluster. Refused (:class:`BadRuns`) before any agent starts.

    Returns 0 when every agent succeeded, else the first non-zero exit status. Once an agent fails the
    others have ``_PEERS_GRACE_S`` seconds to stop by themselves, then they are ended, as are agents that
    outlive ``timeout_s``: none is left behind. Logs: ``<logs_dir>/<run_id>.node<i>.log``."""
    refuse_bad_runs([run], backend=backend, device=device)
    argv = torchrun_argv(run, runs_dir, head="127.0.0.1", port=port, backend=backend, device=device)
    return _run_agents(argv, [_log_path(Path(logs_dir), run, f".node{i}") for i in range(run.nodes)], timeout_s, env)


def _run_agents(argv: Sequence[str], logs: Sequence[Path], timeout_s: float,
                env: Mapping[str, str] | None = None) -> int:
    """One agent of ``argv`` per log file (in its own session); 0 when every one succeeded, else the first
    non-zero exit status (124: ``timeout_s`` passed). See :func:`emulate_nodes`."""
    procs, files = [], []
    try:
        for log in logs:
            out = open(log, "wb")
            files.append(out)
            procs.append(subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=quiet_torch_env(env),
                                          start_new_session=True))
        deadline = time.monotonic() + timeout_s
        first_failure = None
        while any(p.poll() is None for p in procs):
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed and first_failure is None:  # the peers stop by themselves within seconds: let them say why
                first_failure = failed[0]
                deadline = min(deadline, time.monotonic() + _PEERS_GRACE_S)
            if time.monotonic() > deadline:
                return first_failure or 124
            time.sleep(0.2)
        return first_failure or next((p.returncode for p in procs if p.returncode), 0)
    finally:
        for p in procs:
            _kill(p)
        for f in files:
            f.close()


@dataclass(frozen=True)
class _NodeTask:
    """What one SLURM task (one per node) needs."""

    run: RunConfig
    runs_dir: str
    logs_dir: str
    port: int
    backend: str
    device: str
    checkpoint_every_min: float = 0.0
    grace_s: float = 100.0


#: the torchrun agent this job process runs, and an event set when it has exited (read by the signal path)
_AGENT: dict[str, Any] = {}


def _ignore_usr1() -> None:  # in the torchrun child before exec: the agent survives SIGUSR1, its ranks catch it
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc``): torchrun's ranks."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields_ = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields_[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _forward_usr1(grace_s: float = 0.0) -> bool:
    """Pass SIGUSR1 to this job's torchrun ranks (they checkpoint and stop), then wait up to ``grace_s``
    seconds for the agent to end; True when it has ended."""
    agent, ended = _AGENT.get("proc"), _AGENT.get("ended")
    if agent is None:
        return True
    _AGENT["stopping"] = True
    for pid in _children(agent.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    return ended.wait(grace_s) if grace_s > 0 else ended.is_set()


class _NodeJob:
    """What submitit runs on each node. ``checkpoint`` is submitit's pre-timeout hook (on the first task): the
    ranks checkpoint and stop, and the same call is returned for submitit to requeue."""

    def __call__(self, task: _NodeTask) -> int:
        return _node_main(task)

    def checkpoint(self, task: _NodeTask) -> Any:
        _forward_usr1(task.grace_s)
        import submitit

        return submitit.helpers.DelayedSubmission(self, task)


def _node_main(task: _NodeTask) -> int:
    """One node of one run in a submitit job: torchrun with c10d at the allocation's first host and the job id
    as rendezvous id. The node that fails marks the run failed; SLURM's node 0 records the outcome. On
    tasks other than the first this process forwards SIGUSR1 itself. A run stopped by its checkpoint is
    not marked failed: its requeued job goes on."""
    import submitit

    from repro.training.checkpoint import checkpoint_path

    job = submitit.JobEnvironment()
    head = job.hostnames[0] if task.run.nodes > 1 else "127.0.0.1"
    # two array tasks may share a head node: offset the rendezvous port by the job id (same on every node)
    port = task.port + int(re.sub(r"\D", "", str(job.job_id)) or 0) % 1000
    argv = torchrun_argv(task.run, task.runs_dir, head=head, port=port, rdzv_id=str(job.job_id),
                         backend=task.backend, device=task.device, checkpoint_every_min=task.checkpoint_every_min)
    log = _log_path(Path(task.logs_dir), task.run, f".node{job.node}")
    if job.node != 0 and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda *_: _forward_usr1())
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_ignore_usr1, env=quiet_torch_env())
        ended = threading.Event()
        _AGENT.update(proc=proc, ended=ended, stopping=False)
        threading.Thread(target=lambda: (proc.wait(), ended.set()), daemon=True).start()
        while not ended.wait(1.0):  # a signal handler may run between the waits (no lock held here)
            pass
    rc = proc.returncode
    stopped = _AGENT.get("stopping") and rc != 0 and run_status(task.runs_dir, task.run.run_id) != "done" and \
        checkpoint_path(task.runs_dir, task.run.run_id).is_file()
    _AGENT.clear()
    if stopped:  # checkpointed on SLURM's signal: the requeued job goes on
        return rc
    if job.node == 0 or rc != 0:
        _record(task.runs_dir, task.run, rc, log)
    if rc != 0:
        raise RuntimeError(f"{task.run.run_id}: torchrun exited with status {rc} on {job.hostname} (log {log})")
    return rc


def submit_slurm(runs: Sequence[RunConfig], runs_dir: str | Path, jobs_dir: str | Path, *, executor: Any = None,
                 port: int = DEFAULT_PORT, backend: str = "nccl", device: str = "cuda", timeout_min: int | None = None,
                 resources: "SlurmResources | Mapping[str, Any] | str | None" = None,
                 slurm_parameters: Mapping[str, Any] | None = None, overwrite: bool = False) -> list[Any]:
    """Submit every unfinished run through submitit: one job array per node shape, one task per node;
    returns the submitit jobs (see :func:`wait_jobs`).

    ``resources``: :func:`slurm_resources` (``timeout_min``, if given, is its ``time_min``). ``executor``:
    default ``submitit.AutoExecutor(folder=<jobs_dir>/submitit)``; SLURM's own keywords go only to a SLURM
    executor. ``slurm_parameters``: more ``update_parameters`` keywords, as they are. Nothing is submitted
    when a run would be refused (:class:`BadRuns`) or a resource is bad; without submitit: :class:`GridStop`.
    """
    res = slurm_resources(resources, time_min=timeout_min)
    todo = pending_runs(runs, runs_dir, overwrite=overwrite)
    refuse_bad_runs(todo, backend=backend, device=device, launcher="slurm")
    res.check_runs(todo, device)
    if executor is None:  # an executor given (a test's fake) needs no submitit here
        try:
            import submitit
        except ImportError:
            raise GridStop("launcher='slurm' submits through submitit, which is not installed: pip install submitit "
                           "(or pip install 'repro[cluster]')") from None
        executor = submitit.AutoExecutor(folder=Path(jobs_dir) / "submitit")
    logs = Path(jobs_dir) / "logs"
    shapes: dict[tuple[int, int], list[RunConfig]] = {}
    for run in todo:
        shapes.setdefault((run.nodes, run.procs_per_node), []).append(run)
    cluster = getattr(executor, "cluster", None)
    on_slurm = cluster == "slurm" or type(executor).__name__ == "SlurmExecutor"
    extra = res.submitit_parameters("slurm_" if cluster is not None else "") if on_slurm else {}
    grace_s = max(1.0, res.signal_s - 20.0)  # the ranks' checkpoint, within the signal's lead
    jobs: list[Any] = []
    for (nodes, per_node), group in shapes.items():
        gpus = res.gpus_for(group[0], device)
        executor.update_parameters(nodes=nodes, tasks_per_node=1, gpus_per_node=gpus, timeout_min=res.time_min,
                                   **extra, **dict(slurm_parameters or {}))
        for run in group:
            clear_failed(runs_dir, run.run_id)
        jobs += executor.map_array(_NodeJob(), [_NodeTask(r, str(Path(runs_dir).resolve()), str(logs.resolve()), port,
                                                          backend, device, res.checkpoint_every_min, grace_s)
                                                for r in group])
    return jobs


def wait_jobs(jobs: Sequence[Any], poll_s: float = 10.0, *, quiet: bool = False) -> tuple[int, int]:
    """Wait until every submitit job has ended, with a progress bar; ``(succeeded, failed)``."""
    from tqdm.auto import tqdm

    pending = list(jobs)
    with tqdm(total=len(pending), desc="grid runs", unit="run", disable=quiet) as bar:
        while pending:
            ended = [j for j in pending if j.done()]
            for j in ended:
                pending.remove(j)
            bar.update(len(ended))
            if pending:
                time.sleep(poll_s)
    failed = sum(1 for j in jobs if j.exception() is not None)
    return len(jobs) - failed, failed


def _check_finished(grid: Grid, runs_dir: Path) -> None:
    from repro.results.runs import list_runs

    rows = status_table(grid, runs_dir)
    done = sum(r["status"] == "done" for r in rows)
    if not done:
        raise GridStop(f"scale='paper': none of the {len(rows)} runs of the {grid.paper} grid has "
                       f"finished under {runs_dir}: launch them (launcher='local', 'slurm' or 'print') or copy a "
                       f"cluster job's run folders there")
    models = set(grid.models())
    foreign = sorted({str(r.config.get("model")) for r in list_runs(runs_dir)} - models)
    if foreign:
        raise GridStop(f"runs under {runs_dir} are not all the {grid.paper} grid's (models {', '.join(foreign)}): "
                       "they are not drawn under a paper label; read them at scale='tiny' or move them away")


def prepare_paper_runs(paper: str | None, *, scale: str, read_only: bool, launcher: str, runs_dir: str | Path,
                       jobs_dir: str | Path | None = None, what: str = "", how_to_read: str = "read_only=True",
                       slurm: "SlurmResources | Mapping[str, Any] | str | None" = None) -> bool:
    """What a measured notebook does about ``scale``; returns the ``read_only`` it goes on with.

    ``scale="tiny"``: ``read_only`` as given (a ``launcher`` is refused). ``scale="paper"``: the ``paper``
    grid. With ``read_only`` its finished runs under ``runs_dir`` are read (refused when none has finished,
    or other models' runs are there); else ``"print"`` writes job scripts to ``jobs_dir`` and stops
    (:class:`GridStop`), ``"local"``/``"slurm"`` run the unfinished runs and wait. ``paper=None``: the
    notebook has no paper grid, only ``read_only`` works (``what`` names it). ``how_to_read``: the parameter
    that reads finished runs, as messages name it. ``slurm``: :func:`slurm_resources`, checked first."""
    if launcher not in LAUNCHERS:
        raise GridStop(f"launcher={launcher!r} is not one of local, slurm, print (or '' for none)")
    resources = slurm_resources(slurm)
    if scale != "paper":
        if launcher:
            raise GridStop(f"launcher={launcher!r} launches the paper's grid: use it with scale='paper'")
        return read_only
    runs_dir = Path(runs_dir)
    if paper is None:
        if launcher or not read_only:
            raise GridStop(f"scale='paper': {what or 'this notebook'} measures this machine and has no paper grid; "
                           + (f"read a cluster's runs with {how_to_read}, or " if how_to_read else "")
                           + "run it at scale='tiny'")
        return True
    grid = load_grid(paper)
    if read_only:
        if launcher:
            raise GridStop(f"{how_to_read} reads finished runs and launches nothing: drop launcher={launcher!r}")
        _check_finished(grid, runs_dir)
        return True
    if not launcher:
        raise GridStop(f"scale='paper' trains the {grid.summary()}, not this machine's tiny models: set launcher "
                       f"to 'local' (this node's GPUs), 'slurm' (submitit) or 'print' (job scripts), or read finished "
                       f"runs with {how_to_read}")
    jobs = Path(jobs_dir) if jobs_dir is not None else runs_dir.parent / "jobs"
    todo = pending_runs(grid.runs, runs_dir)
    if launcher == "print":
        write_job_scripts(todo, runs_dir, jobs, resources=resources)
        raise GridStop(f"{len(todo)} job scripts of the {grid.paper} grid ({len(grid.runs) - len(todo)} finished, "
                       f"skipped) written to {jobs} (commands.txt, <run_id>.sh); run them, then rerun with "
                       f"{how_to_read}")
    if launcher == "local":
        launch_local_grid(todo, runs_dir, jobs / "logs")
    else:
        wait_jobs(submit_slurm(todo, runs_dir, jobs, resources=resources))
    rows = status_table(grid, runs_dir)
    counts = count_status(rows)
    print(f"{grid.paper} grid: {counts['done']} of {len(rows)} runs finished, {counts['failed']} failed "
          f"(logs under {jobs / 'logs'})")
    _check_finished(grid, runs_dir)
    return True
