"""``repro grid check``: every run checked before anything is launched (:func:`run_refusal` and friends,
re-exported from :mod:`repro.grids.jobs`), and stand-ins trained on this machine (:func:`smoke`)."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from repro.grids.grid import RunConfig
from repro.grids.jobs import (
    BadRuns, check_runs, check_summary, refusal_line, refuse_bad_runs, run_refusal, train_argv)

__all__ = ["BadRuns", "run_refusal", "refusal_line", "check_runs", "refuse_bad_runs", "check_summary",
           "SmokeResult", "smoke", "stand_in_line"]


@dataclass(frozen=True)
class SmokeResult:
    """One stand-in's outcome: ``error`` None when it trained, else the first line of why not; ``seconds``:
    its wall time (its launch's start-up excluded), NaN when it failed."""

    stand_in: RunConfig
    runs: tuple[RunConfig, ...]
    error: str | None
    seconds: float


def stand_in_line(result: SmokeResult) -> str:
    """One line: ok or failed, the stand-in and how many grid runs it stands for."""
    s = result.stand_in
    from repro.core.run_options import RUN_OPTIONS

    opts = ", ".join(f"{k}={v}" for k, v in s.config.items() if k in RUN_OPTIONS)
    amp = f", amp {s.config['amp']}" if s.config.get("amp", "off") != "off" else ""  # compute precision
    what = (f"{s.config.get('paper', '?')}/{s.experiment}: {s['scheduler']} on {s['model']}, {s.processes} local "
            f"rank(s), {s['wire_dtype']}{amp}{', ' + opts if opts else ''} (stands for {len(result.runs)} run(s))")
    if result.error is None:
        return f"ok {result.seconds:5.1f} s  {what}"
    return f"FAILED  {what}: {result.error}"


def _smoke_ranks(ctx: Any, argvs: Sequence[Sequence[str]], progress: str) -> None:
    """Launch target: train every ``repro train`` argument list of ``argvs`` in turn; after each, rank 0
    appends its seconds to ``progress``, so the lines there count the stand-ins done when a rank fails."""
    import torch.distributed as dist

    from repro.train import worker_from_argv

    for argv in argvs:
        t0 = time.perf_counter()
        worker_from_argv(ctx, list(argv))
        dist.barrier()
        if ctx.rank == 0:
            with open(progress, "a") as f:
                f.write(f"{time.perf_counter() - t0:.3f}\n")


def smoke(groups: Sequence[tuple[RunConfig, Sequence[RunConfig]]], runs_dir: str | Path | None = None, *,
          timeout_s: float = 600.0, pg_timeout_s: float = 60.0, on_result: Any = None) -> list[SmokeResult]:
    """Train each stand-in of ``groups`` (``(stand_in, runs)`` pairs, as from
    :func:`repro.grids.grid.distinct_stand_ins`) on this machine with gloo on the CPU, run folders under
    ``runs_dir`` (default: a temporary folder). Stand-ins of one world size share one launch; when one
    fails that launch ends and the next starts after it. ``timeout_s``: per launch, seconds;
    ``on_result(result)`` is called as each result is known. Returns one :class:`SmokeResult` per stand-in,
    in order."""
    from repro.launch.local import LaunchTimeoutError, RankFailedError, launch_local

    results: dict[int, SmokeResult] = {}
    with tempfile.TemporaryDirectory(prefix="repro-smoke-") as tmp:
        out = Path(runs_dir) if runs_dir is not None else Path(tmp) / "runs"
        progress = Path(tmp) / "progress"
        by_world: dict[int, list[int]] = {}
        for i, (stand_in, _) in enumerate(groups):
            by_world.setdefault(stand_in.processes, []).append(i)
        for world, todo in sorted(by_world.items()):
            while todo:
                argvs = [train_argv(groups[i][0], out, backend="gloo", device="cpu")[2:] for i in todo]
                progress.write_text("")
                error = None
                try:
                    launch_local(_smoke_ranks, world, args=(argvs, str(progress)), backend="gloo",
                                 timeout_s=timeout_s, pg_timeout_s=pg_timeout_s, quiet=True)
                except (RankFailedError, LaunchTimeoutError) as e:
                    error = (str(e).splitlines() or [type(e).__name__])[0]
                seconds = [float(x) for x in progress.read_text().split()]
                for k, i in enumerate(todo[:len(seconds)]):
                    _record(results, groups, i, None, seconds[k], on_result)
                if error is None:
                    break
                failed = min(len(seconds), len(todo) - 1)  # (a failure after the last one: that one's)
                _record(results, groups, todo[failed], error, float("nan"), on_result)
                todo = todo[failed + 1:]
    return [results[i] for i in range(len(groups))]


def _record(results: dict, groups, i: int, error: str | None, seconds: float, on_result: Any) -> None:
    stand_in, runs = groups[i]
    results[i] = SmokeResult(stand_in, tuple(runs), error, seconds)
    if on_result is not None:
        on_result(results[i])
