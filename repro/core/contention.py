"""Compute slowed by communication in flight: the engine's schedule with contention.

With a slowdown ``c`` (``Realism.contention``), compute tasks (in-order streams) progress at ``1/(1+c)``
of their speed while any communication task (queue streams) runs: ``w`` seconds of work overlapping
communication for ``o`` seconds take ``w + o·c/(1+c)``. Each communication task also costs
``a2 · q`` more (``Realism.message_overhead_per_in_flight_s``; ``q`` other tasks of its stream waiting
when it starts). Durations and schedule are found together by fixed-point iteration (design:
docs/design/core.md). Torch-free.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from repro.core.engine import Op, Task, run_tasks

__all__ = ["run_tasks_with_contention", "overlap_s", "waiting_at_start"]


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


def waiting_at_start(tasks: list[Task], ops: list[Op], in_order_streams: frozenset[str] | set[str]) -> list[int]:
    """For every task, how many *other* tasks of its queue stream were released (dependencies done,
    ``earliest_s`` passed) but not yet started when it started; 0 for in-order streams."""
    out = [0] * len(tasks)
    by_stream: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        if t.stream not in in_order_streams:
            by_stream.setdefault(t.stream, []).append(i)
    for idx in by_stream.values():
        # Tasks started by time s were released by s: waiting = released - started (itself cancels).
        releases = sorted(max([tasks[i].earliest_s] + [ops[d].end_s for d in tasks[i].deps]) for i in idx)
        starts = sorted(ops[i].start_s for i in idx)
        for i in idx:
            s = ops[i].start_s
            out[i] = max(0, bisect_right(releases, s) - bisect_right(starts, s))
    return out


def run_tasks_with_contention(tasks: list[Task], in_order_streams: frozenset[str] | set[str],
                              contention: float, *, in_flight_s: float = 0.0, tol_s: float = 1e-9,
                              max_rounds: int = 200) -> list[Op]:
    """Schedule ``tasks`` with contention and the in-flight charge (module docstring), iterating until
    no duration moves by more than ``tol_s`` or for ``max_rounds`` rounds (the last schedule is
    returned). Raises ``ValueError`` for a negative or non-finite slowdown or charge."""
    if not contention >= 0 or contention == float("inf"):
        raise ValueError(f"contention must be a finite non-negative slowdown, got {contention!r}")
    if not in_flight_s >= 0 or in_flight_s == float("inf"):
        raise ValueError(f"in_flight_s must be a finite non-negative number of seconds, got {in_flight_s!r}")
    ops = run_tasks(tasks, in_order_streams)
    if contention == 0 and in_flight_s == 0:
        return ops
    k = contention / (1.0 + contention)
    comm = [i for i, t in enumerate(tasks) if t.stream not in in_order_streams]
    compute = [i for i, t in enumerate(tasks) if t.stream in in_order_streams and t.duration_s > 0]
    charged = [i for i in comm if tasks[i].duration_s > 0] if in_flight_s > 0 else []
    durations = [t.duration_s for t in tasks]
    for _ in range(max_rounds):
        change = 0.0
        if charged:
            waiting = waiting_at_start(tasks, ops, in_order_streams)
            for i in charged:
                d = tasks[i].duration_s + in_flight_s * waiting[i]
                change = max(change, abs(d - durations[i]))
                durations[i] = d
        if k > 0:
            starts, ends = _union([(ops[i].start_s, ops[i].end_s) for i in comm])
            for i in compute:
                d = tasks[i].duration_s + k * overlap_s(ops[i].start_s, ops[i].end_s, starts, ends)
                change = max(change, abs(d - durations[i]))
                durations[i] = d
        ops = run_tasks(tasks, in_order_streams, durations)
        if change <= tol_s:
            break
    return ops
