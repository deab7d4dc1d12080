"""A small discrete-event engine: tasks with durations and dependencies on named streams.

Two kinds of stream:

- *in-order* streams (the compute stream) run their tasks in the order given, each as soon as the
  stream is free and its dependencies have finished;
- *queue* streams (communication streams) are non-preemptive servers: when free, they run the
  released task (all dependencies done) with the smallest ``(priority, release time, task index)``,
  so with equal priorities they serve first-come first-served.

Schedulers of every family build a task graph and hand it to :func:`run_tasks`; nothing here knows
about layers, buckets or collectives. Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def run_tasks(tasks: list[Task], in_order_streams: frozenset[str] | set[str]) -> list[Op]:
    """Schedule ``tasks``; returns one :class:`Op` per task, in task order.

    Raises ``ValueError`` on a dependency cycle or a dependency on an unknown task.
    """
    n = len(tasks)
    dependents: list[list[int]] = [[] for _ in range(n)]
    missing = [0] * n
    for i, t in enumerate(tasks):
        if t.duration_s < 0:
            raise ValueError(f"task {i} ({t.label}) has a negative duration {t.duration_s}")
        for d in t.deps:
            if not 0 <= d < n:
                raise ValueError(f"task {i} ({t.label}) depends on unknown task {d}")
            dependents[d].append(i)
            missing[i] += 1
    release = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n

    streams = sorted({t.stream for t in tasks})
    free = {s: 0.0 for s in streams}
    order: dict[str, list[int]] = {s: [] for s in streams if s in in_order_streams}
    for i, t in enumerate(tasks):
        if t.stream in order:
            order[t.stream].append(i)
    head = {s: 0 for s in order}
    pending: dict[str, list[int]] = {s: [] for s in streams if s not in in_order_streams}
    for i, t in enumerate(tasks):
        if missing[i] == 0 and t.stream in pending:
            pending[t.stream].append(i)

    done = 0
    while done < n:
        best: tuple[float, int, int] | None = None  # (start, stream rank, task)
        for rank, s in enumerate(streams):
            if s in order:
                if head[s] >= len(order[s]):
                    continue
                i = order[s][head[s]]
                if missing[i]:
                    continue
                cand = (max(free[s], release[i]), rank, i)
            else:
                q = pending[s]
                if not q:
                    continue
                t_free = free[s]
                ready_now = [i for i in q if release[i] <= t_free]
                pool = ready_now or [i for i in q if release[i] == min(release[j] for j in q)]
                i = min(pool, key=lambda k: (tasks[k].priority, release[k], k))
                cand = (max(t_free, release[i]), rank, i)
            if best is None or cand < best:
                best = cand
        if best is None:
            raise ValueError("task graph has a dependency cycle (or an in-order stream waits on itself)")
        t0, _, i = best
        s = tasks[i].stream
        if s in order:
            head[s] += 1
        else:
            pending[s].remove(i)
        start[i] = t0
        end[i] = t0 + tasks[i].duration_s
        free[s] = end[i]
        done += 1
        for j in dependents[i]:
            missing[j] -= 1
            release[j] = max(release[j], end[i])
            if missing[j] == 0 and tasks[j].stream in pending:
                pending[tasks[j].stream].append(j)
    return [Op(t.stream, t.kind, t.label, start[i], end[i]) for i, t in enumerate(tasks)]
