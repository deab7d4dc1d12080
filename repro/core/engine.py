"""A small discrete-event engine: tasks with durations and dependencies on named streams.

*In-order* streams (compute) run their tasks in the given order, each once the stream is free and its
dependencies are done. *Queue* streams (communication) are non-preemptive servers: when free they run
the released task with the smallest ``(priority, release time, task index)`` (first-come first-served
at equal priority), else the one released earliest, at its release time. A task is released when its
dependencies are done and not before its ``earliest_s``. Across streams, the smallest candidate
``(start, stream rank by sorted name, task)`` runs next; O((n + e) log n) for n tasks and e edges
(design: docs/design/core.md). Durations and priorities must not be NaN. Knows nothing of layers or
collectives; torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heapify, heappop, heappush, heappushpop

__all__ = ["Task", "Op", "run_tasks"]


@dataclass(frozen=True)
class Task:
    """A unit of work: ``duration_s`` seconds on ``stream`` after all ``deps`` (task indices) end."""

    stream: str
    kind: str
    label: str
    duration_s: float
    deps: tuple[int, ...] = ()
    priority: float = 0.0
    earliest_s: float = 0.0   # released no earlier than this absolute time (seconds)


@dataclass(frozen=True)
class Op:
    """A timed operation of the simulated (or measured) timeline, in seconds from iteration start."""

    stream: str
    kind: str
    label: str
    start_s: float
    end_s: float

    def to_dict(self) -> dict[str, object]:
        return {"stream": self.stream, "kind": self.kind, "label": self.label,
                "start_s": self.start_s, "end_s": self.end_s}


def run_tasks(tasks: list[Task], in_order_streams: frozenset[str] | set[str],
              durations: list[float] | None = None) -> list[Op]:
    """Schedule ``tasks``; one :class:`Op` per task, in task order. ``durations`` (seconds, one per
    task) replaces the tasks' own ``duration_s`` when given.

    Raises ``ValueError`` on a negative duration, a dependency on an unknown task, or a dependency
    cycle (including an in-order stream whose next task waits on a later task of that stream).
    """
    n = len(tasks)
    if durations is None:
        durations = [t.duration_s for t in tasks]
    elif len(durations) != n:
        raise ValueError(f"durations has {len(durations)} entries for {n} tasks")
    dependents: list[list[int]] = [[] for _ in range(n)]
    missing = [0] * n
    for i, t in enumerate(tasks):
        if durations[i] < 0:
            raise ValueError(f"task {i} ({t.label}) has a negative duration {durations[i]}")
        if not t.earliest_s >= 0:
            raise ValueError(f"task {i} ({t.label}) has a negative or NaN earliest start {t.earliest_s}")
        for d in t.deps:
            if not 0 <= d < n:
                raise ValueError(f"task {i} ({t.label}) depends on unknown task {d}")
            dependents[d].append(i)
            missing[i] += 1
    release = [float(t.earliest_s) for t in tasks]
    start = [0.0] * n
    end = [0.0] * n

    streams = sorted({t.stream for t in tasks})
    rank_of = {s: r for r, s in enumerate(streams)}
    is_queue = [s not in in_order_streams for s in streams]
    task_rank = [rank_of[t.stream] for t in tasks]
    priorities = [t.priority for t in tasks]
    free = [0.0] * len(streams)
    order: list[list[int]] = [[] for _ in streams]
    head = [0] * len(streams)
    # Queue streams: released tasks split against the stream's free time (never decreasing):
    # ``ready`` (release <= free) on (priority, release, index), ``future`` on (release, priority, index).
    ready: list[list[tuple]] = [[] for _ in streams]
    future: list[list[tuple]] = [[] for _ in streams]
    for i, r in enumerate(task_rank):
        if not is_queue[r]:
            order[r].append(i)
        elif missing[i] == 0:
            future[r].append((release[i], priorities[i], i))
    for fu in future:
        heapify(fu)

    def candidate(r: int, now: float) -> tuple[float, int, int] | None:
        """Stream r's candidate (start, stream rank, task) once free at ``now``, or None."""
        if is_queue[r]:
            rd, fu = ready[r], future[r]
            while fu and fu[0][0] <= now:
                rel, prio, j = heappop(fu)
                heappush(rd, (prio, rel, j))
            if rd:
                return now, r, rd[0][2]
            return (fu[0][0], r, fu[0][2]) if fu else None
        seq, h = order[r], head[r]
        if h < len(seq) and not missing[seq[h]]:
            return max(now, release[seq[h]]), r, seq[h]
        return None

    # ``events`` holds every current candidate (the very tuple in ``cand``) plus stale ones, dropped
    # when they surface.
    cand = [candidate(r, 0.0) for r in range(len(streams))]
    events = [c for c in cand if c is not None]
    heapify(events)

    cycle = "task graph has a dependency cycle (or an in-order stream waits on itself)"
    nxt = None  # the new candidate of the stream that ran last, not yet in ``events``
    for _ in range(n):
        if nxt is not None:
            best = heappushpop(events, nxt)
        elif events:
            best = heappop(events)
        else:
            raise ValueError(cycle)
        while cand[best[1]] is not best:
            if not events:
                raise ValueError(cycle)
            best = heappop(events)
        t0, r, i = best
        if is_queue[r]:
            rd = ready[r]
            if rd and rd[0][2] == i:
                heappop(rd)
            else:
                heappop(future[r])
        else:
            head[r] += 1
        start[i] = t0
        e = end[i] = t0 + durations[i]
        free[r] = e
        for j in dependents[i]:
            missing[j] -= 1
            release[j] = max(release[j], e)
            if missing[j]:
                continue
            # j is released; push another stream's candidate it changes (stream r's is recomputed below)
            rj = task_rank[j]
            rel = release[j]
            if is_queue[rj]:
                f = free[rj]
                if rel <= f:
                    rd = ready[rj]
                    heappush(rd, (priorities[j], rel, j))
                    if rj != r and rd[0][2] == j:
                        c = cand[rj] = (f, rj, j)
                        heappush(events, c)
                else:
                    fu = future[rj]
                    heappush(fu, (rel, priorities[j], j))
                    if rj != r and not ready[rj] and fu[0][2] == j:
                        c = cand[rj] = (rel, rj, j)
                        heappush(events, c)
            elif rj != r and order[rj][head[rj]] == j:
                c = cand[rj] = (max(free[rj], rel), rj, j)
                heappush(events, c)
        nxt = cand[r] = candidate(r, e)
    return [Op(t.stream, t.kind, t.label, start[i], end[i]) for i, t in enumerate(tasks)]
