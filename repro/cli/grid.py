"""``repro grid`` (or ``python -m repro.cli.grid grid``): a paper's grid from the command line.

    repro grid show mgwfbp                       # the runs: id, kind, model, scheduler, P, data, nodes
    repro grid status mgwfbp --runs-dir DIR      # done / damaged / failed / pending per run, and counts
    repro grid launch mgwfbp --runs-dir DIR --launcher print --jobs-dir JOBS
    repro grid launch osp --kind convergence ... # only the convergence runs (or --experiment NAME)
    repro grid check dear                        # every run through its ranks' start-up checks, none started
    repro grid check dear --smoke                # ... and a tiny stand-in per distinct configuration trained

``check`` and ``launch`` behave as the notebooks' launchers (:mod:`repro.grids.jobs`): a run that would
be refused, or a damaged run without ``--overwrite``, launches nothing. Bad input and refusals are one
line on stderr with exit status 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from repro.core.text import text_table
from repro.grids.grid import (
    GRID_PAPERS, KINDS, GridError, count_status, distinct_stand_ins, load_grid, run_problem, status_table)
from repro.grids.check import BadRuns, check_runs, check_summary, refusal_line, smoke, stand_in_line
from repro.grids.jobs import (
    GridStop, check_folder, launch_local_grid, pending_runs, slurm_resources, submit_slurm, wait_jobs,
    write_job_scripts)

__all__ = ["main", "build_parser", "add_grid_parser", "run_grid_command"]


def add_grid_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``grid`` (show / status / check / launch) to a subparsers action."""
    parser = sub.add_parser("grid", help="a paper's measured grid: show it, check it, see which runs finished, "
                                         "launch the rest",
                            description="A paper's measured grid (data/grids): show its runs, check them before "
                                        "launching, see which finished, launch the others (print, local or slurm).")
    actions = parser.add_subparsers(dest="grid_action", required=True, metavar="ACTION",
                                    parser_class=type(parser))
    for name, text in (("show", "list the grid's runs"), ("status", "done / damaged / failed / pending per run"),
                       ("check", "put every run through its ranks' start-up checks (none is started); --smoke: "
                                 "train a tiny stand-in of each distinct configuration here"),
                       ("launch", "run the unfinished runs (print, local or slurm) after the same check")):
        p = actions.add_parser(name, help=text, description=text)
        p.add_argument("grid", help=f"{', '.join(GRID_PAPERS)} or a grid .yaml file")
        p.add_argument("--format", choices=("table", "json"), default="table", help="output format")
        p.add_argument("--kind", choices=KINDS, help="only the throughput runs (timed steps, synthetic data) or "
                                                     "the convergence runs (epochs over a real dataset)")
        p.add_argument("--experiment", help="only the runs of this experiment of the grid file")
        if name == "check":
            p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                           help="the backend the runs will have (the launchers': nccl)")
            p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                           help="the device the runs will train on (the launchers': cuda)")
            p.add_argument("--smoke", action="store_true",
                           help="then train one tiny stand-in per distinct configuration on this machine (gloo, "
                                "CPU, at most 3 local ranks, 2 steps; repro.grids.grid.local_stand_in)")
            p.add_argument("--smoke-dir", type=Path,
                           help="write the stand-ins' run folders here (default: a temporary folder, removed)")
        if name not in ("show", "check"):
            p.add_argument("--runs-dir", required=True, type=Path,
                           help="folder of the run folders (a notebook's results_dir/<notebook>/runs; shared by "
                                "every node)")
        if name == "launch":
            p.add_argument("--launcher", required=True, choices=("print", "local", "slurm"), help="how to run them")
            p.add_argument("--jobs-dir", type=Path,
                           help="job scripts, logs and submitit files (if not given: <runs-dir>/../jobs)")
            p.add_argument("--overwrite", action="store_true",
                           help="launch damaged runs again (a run.json that is empty, not JSON or not a finished "
                                "run's record; without it the launch is refused), replacing their folders; a "
                                "finished run is never launched")
            g = p.add_argument_group("SLURM jobs (--launcher slurm; the #SBATCH lines of --launcher print)")
            g.add_argument("--slurm-time-min", type=int, help="time limit of each job, minutes (default 120); a "
                                                              "longer run checkpoints and is requeued")
            g.add_argument("--slurm-cpus-per-task", type=int, help="CPUs per task (one task per node)")
            g.add_argument("--slurm-mem-gb", type=float, help="memory per node, GB")
            g.add_argument("--slurm-partition", help="SLURM partition")
            g.add_argument("--slurm-account", help="SLURM account")
            g.add_argument("--slurm-gpus-per-node", type=int, help="GPUs per node (default: the run's ranks per node)")
            g.add_argument("--slurm-extra", action="append", metavar="OPTION",
                           help="another sbatch option, e.g. --slurm-extra=--qos=high (repeatable)")
            g.add_argument("--slurm-signal-s", type=int,
                           help="SIGUSR1 this many seconds before the time limit: the ranks checkpoint and the job is "
                                "requeued (default 120)")
            g.add_argument("--slurm-requeues", type=int, help="times a job may be requeued (default 20)")
            g.add_argument("--checkpoint-every-min", type=float,
                           help="each run also checkpoints every this many minutes (default 30; 0: only on the signal)")
        p.set_defaults(func=run_grid_command)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """``python -m repro.cli.grid``'s parser: the ``grid`` command of ``repro`` on its own."""
    parser = argparse.ArgumentParser(prog="python -m repro.cli.grid", description=__doc__.split("\n\n")[0])
    add_grid_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def _table(rows: list[dict], columns: Sequence[str]) -> str:
    return text_table([[str(r[c]) for c in columns] for r in rows], columns)


def run_grid_command(args: argparse.Namespace) -> None:
    """Carry out ``repro grid ACTION``; bad input and refusals raise :class:`GridError` / :class:`GridStop`
    (ValueErrors, one line)."""
    grid = load_grid(args.grid)
    selected = grid.select(getattr(args, "kind", None), getattr(args, "experiment", None))
    for attr in ("runs_dir", "jobs_dir"):  # before anything is read or written
        if getattr(args, attr, None) is not None:
            check_folder("--" + attr.replace("_", "-"), getattr(args, attr))
    if args.grid_action == "show":
        rows = [{"run_id": r.run_id, "experiment": r.experiment, "kind": r.kind, **{k: r[k] for k in (
            "model", "scheduler", "world_size", "wire_dtype", "batch_size")},
            "dataset": r.config.get("dataset", "synthetic"), "epochs": r.config.get("epochs") or "",
            "nodes": r.nodes, "procs_per_node": r.procs_per_node} for r in selected]
        print(json.dumps(rows, indent=1) if args.format == "json"
              else f"{grid.summary()}\n" + _table(rows, list(rows[0])))
        return
    if args.grid_action == "status":
        rows = status_table(selected, args.runs_dir)
        counts = count_status(rows)
        for row in rows:
            if row["status"] == "damaged":
                row["problem"] = run_problem(args.runs_dir, row["run_id"])
        if args.format == "json":
            print(json.dumps({"counts": counts, "runs": rows}, indent=1))
        else:
            print(_table(rows, ["run_id", "status", "model", "scheduler", "world_size", "wire_dtype", "nodes"]))
            for row in rows:
                if row["status"] == "damaged":
                    print(f"damaged: {row['problem']}")
            print(", ".join(f"{v} {k}" for k, v in counts.items()) + f" of {len(rows)} runs")
        return
    if args.grid_action == "check":
        _check(grid, selected, args)
        return
    resources = _resources(args)  # checked before anything is written or submitted
    jobs = check_folder("--jobs-dir", args.jobs_dir or args.runs_dir.parent / "jobs")
    try:
        todo = pending_runs(selected, args.runs_dir, overwrite=args.overwrite)
        if args.launcher == "print":
            write_job_scripts(todo, args.runs_dir, jobs, resources=resources)
            print(f"{len(todo)} job scripts ({len(selected) - len(todo)} runs finished, skipped) written to {jobs}")
        elif args.launcher == "local":
            launch_local_grid(todo, args.runs_dir, jobs / "logs", overwrite=args.overwrite)
        else:
            wait_jobs(submit_slurm(todo, args.runs_dir, jobs, resources=resources, overwrite=args.overwrite))
    except BadRuns as e:
        for line in e.lines:
            print(line, file=sys.stderr)
        raise


def _resources(args: argparse.Namespace) -> Any:
    """The ``--slurm-*`` flags as :class:`repro.grids.jobs.SlurmResources` (GridStop, one line, if bad)."""
    names = ("time_min", "cpus_per_task", "mem_gb", "partition", "account", "gpus_per_node", "signal_s", "requeues")
    return slurm_resources(None, **{name: getattr(args, f"slurm_{name}") for name in names},
                           extra=tuple(args.slurm_extra) if args.slurm_extra else None,
                           checkpoint_every_min=args.checkpoint_every_min)


def _check(grid: Any, selected: list, args: argparse.Namespace) -> None:
    """``repro grid check``: one line per refused run and a summary; with ``--smoke``, one line per stand-in.
    :class:`GridStop` (exit status 2) when a run is refused or a stand-in fails."""
    bad = check_runs(selected, backend=args.backend, device=args.device)
    summary = check_summary(grid.paper, selected, bad, backend=args.backend, device=args.device)
    if args.format == "json" and not args.smoke:
        print(json.dumps({"runs": len(selected), "refused": [{"run_id": r.run_id, "reason": why} for r, why in bad]},
                         indent=1))
    else:
        for run, why in bad:
            print(refusal_line(run, why), flush=True)
        if not bad:  # else the summary is the error line (stderr)
            print(summary, flush=True)
    failed = []
    if args.smoke:
        groups = distinct_stand_ins(selected)
        print(f"training {len(groups)} stand-ins (one per distinct configuration of {len(selected)} runs) here, "
              "gloo on the CPU ...", flush=True)
        results = smoke(groups, args.smoke_dir, on_result=lambda r: print(stand_in_line(r), flush=True))
        failed = [r for r in results if r.error is not None]
        print(f"{grid.paper} grid: {len(results) - len(failed)} of {len(results)} stand-ins trained"
              + (f", {len(failed)} failed" if failed else ""), flush=True)
    if bad or failed:
        raise GridStop(summary if bad else f"{len(failed)} of the {grid.paper} grid's stand-ins failed")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m repro.cli.grid grid ACTION ...`` (the same as ``repro grid ACTION ...``)."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
        return 0
    except (GridError, GridStop, OSError) as e:
        print(f"repro: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
