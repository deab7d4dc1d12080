"""Compute slowed by communication in flight: the engine's schedule with contention.

Measured on real machines (and on this one, :mod:`repro.runtime.contention`): while a collective is
in flight, computation runs slower, because both share memory bandwidth, PCIe and CPU cores. With a
slowdown ``c`` (``Realism.contention``), compute progresses at ``1/(1+c)`` of its speed whenever any
communication task runs. A compute task of ``w`` seconds of work that overlaps communication for
``o`` seconds of its span therefore takes

    d = w + o · c / (1 + c)

seconds (the work done during the overlap, ``o/(1+c)``, plus the rest at full speed). The overlap
depends on the schedule, which depends on the durations, so :func:`run_tasks_with_contention` finds
the fixed point by iteration: schedule with the current durations, measure each compute task's
overlap with the union of the communication intervals, recompute the durations, until no
duration moves by more than ``tol_s`` (or ``max_rounds`` rounds; the last schedule is returned).
Each round contracts the error by at most ``c/(1+c)``. ``c = 0`` is one plain :func:`~repro.sim.engine.run_tasks`.

"Compute" tasks are those of the in-order streams; "communication" those of every other (queue)
stream. Never imports torch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from repro.sim.engine import Op, Task, run_tasks

__all__ = ["run_tasks_with_contention", "overlap_s"]


def _union(intervals: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Sorted disjoint (starts, ends) covering ``intervals``."""
    starts: list[float] = []
    ends: list[float] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if ends and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
        else:
            starts.append(s)
            ends.append(e)
    return starts, ends


def overlap_s(start_s: float, end_s: float, starts: list[float], ends: list[float]) -> float:
    """Seconds of ``[start_s, end_s]`` covered by the disjoint sorted intervals (starts, ends)."""
    total = 0.0
    i = max(0, bisect_right(ends, start_s))
    j = bisect_left(starts, end_s)
    for k in range(i, j):
        total += max(0.0, min(end_s, ends[k]) - max(start_s, starts[k]))
    return total


def run_tasks_with_contention(tasks: list[Task], in_order_streams: frozenset[str] | set[str],
                              contention: float, *, tol_s: float = 1e-9, max_rounds: int = 200) -> list[Op]:
    """Schedule ``tasks`` with in-order (compute) tasks slowed by ``contention`` while any other
    stream runs a task (module docstring). Raises ``ValueError`` for a negative or non-finite slowdown."""
    if not contention >= 0 or contention == float("inf"):
        raise ValueError(f"contention must be a finite non-negative slowdown, got {contention!r}")
    ops = run_tasks(tasks, in_order_streams)
    if contention == 0:
        return ops
    k = contention / (1.0 + contention)
    comm = [i for i, t in enumerate(tasks) if t.stream not in in_order_streams]
    compute = [i for i, t in enumerate(tasks) if t.stream in in_order_streams and t.duration_s > 0]
    durations = [t.duration_s for t in tasks]
    for _ in range(max_rounds):
        starts, ends = _union([(ops[i].start_s, ops[i].end_s) for i in comm])
        change = 0.0
        for i in compute:
            d = tasks[i].duration_s + k * overlap_s(ops[i].start_s, ops[i].end_s, starts, ends)
            change = max(change, abs(d - durations[i]))
            durations[i] = d
        ops = run_tasks(tasks, in_order_streams, durations)
        if change <= tol_s:
            break
    return ops
