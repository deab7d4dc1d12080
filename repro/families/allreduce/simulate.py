"""The all-reduce family's iteration model (MG-WFBP): one FCFS stream of bucket all-reduces behind the
backward, ``t_f + max(t_b, end of the last all-reduce)`` plus the trace's overheads; with ``cycle_s``
a bucket is released at its next tick. :func:`allreduce_tasks` (event graph) and
:func:`fifo_iteration_s` (closed form) implement the same model.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repro.core.simulate import comm_times_s  # the package is initialised before its submodules
from repro.core.engine import Task
from repro.core.sim_result import SimGraph, SimResult

__all__ = ["ready_times_s", "cycle_release_s", "fifo_comm_end_s", "fifo_iteration_s", "allreduce_tasks",
           "bucket_label", "build_graph", "closed_form", "check_buckets"]


def ready_times_s(backward_s: np.ndarray) -> np.ndarray:
    """Seconds after backward start at which each layer's gradient is ready (forward order input)."""
    return np.cumsum(np.asarray(backward_s, dtype=float)[::-1])[::-1]


def cycle_release_s(ready_s, cycle_s: float | None):
    """When a background loop ticking every ``cycle_s`` seconds launches what is ready at ``ready_s``
    (seconds from backward start): the next tick at or after it (``ready_s`` itself without a cycle)."""
    r = np.asarray(ready_s, dtype=float)
    if not cycle_s:
        return r
    return np.ceil(r / cycle_s - 1e-12) * cycle_s


def fifo_comm_end_s(bucket_ready_s: Sequence[float], bucket_comm_s: Sequence[float]) -> float:
    """End of the last message on one FCFS stream; buckets given in plan order (the tie-break)."""
    order = sorted(range(len(bucket_ready_s)), key=lambda k: (bucket_ready_s[k], k))
    t = 0.0
    for k in order:
        t = max(t, bucket_ready_s[k]) + bucket_comm_s[k]
    return t


def fifo_iteration_s(forward_total_s: float, backward_s: np.ndarray, groups: Sequence[Sequence[int]],
                     comm_s: Sequence[float], fixed_s: float = 0.0, cycle_s: float | None = None) -> float:
    """Iteration seconds for bucket ``groups`` (layer indices) whose messages take ``comm_s`` each;
    ``fixed_s`` (pre-forward + update seconds) is added; ``cycle_s``: launches only at cycle ticks."""
    ready = ready_times_s(backward_s)
    bucket_ready = cycle_release_s([float(ready[min(g)]) for g in groups], cycle_s).tolist()
    end = fifo_comm_end_s(bucket_ready, comm_s)
    return float(fixed_s + forward_total_s + max(float(ready[0]), end))


def bucket_label(indices: Sequence[int]) -> str:
    """Human label of a bucket by 1-based forward layer numbers: ``l5``, ``l3-l7`` or ``l2,l5,l9``."""
    idx = sorted(i + 1 for i in indices)
    if len(idx) == 1:
        return f"l{idx[0]}"
    if idx[-1] - idx[0] + 1 == len(idx):
        return f"l{idx[0]}-l{idx[-1]}"
    return ",".join(f"l{i}" for i in idx)


def allreduce_tasks(names: Sequence[str], forward_s: np.ndarray, backward_s: np.ndarray,
                    groups: Sequence[Sequence[int]], comm_s: Sequence[float],
                    kinds: Sequence[str] | None = None, pre_forward_s: float = 0.0,
                    update_s: float = 0.0, priorities: Sequence[float] | None = None,
                    cycle_s: float | None = None) -> list[Task]:
    """Task graph of one iteration: [pre-forward], forward tasks, backward tasks, one message per
    bucket (with ``cycle_s``: not before its cycle tick), [the update after the last message]."""
    L = len(names)
    tasks = [Task("compute", "pre_forward", "pre", pre_forward_s)] if pre_forward_s else []
    tasks += [Task("compute", "forward", names[i], float(forward_s[i])) for i in range(L)]
    bwd_task = {}
    for i in reversed(range(L)):
        bwd_task[i] = len(tasks)
        tasks.append(Task("compute", "backward", names[i], float(backward_s[i])))
    backward_start = pre_forward_s + float(np.sum(forward_s))
    ready = ready_times_s(backward_s)
    for k, g in enumerate(groups):
        kind = kinds[k] if kinds else "allreduce"
        earliest = backward_start + float(cycle_release_s(float(ready[min(g)]), cycle_s)) if cycle_s else 0.0
        tasks.append(Task("comm", kind, bucket_label(g), float(comm_s[k]),
                          deps=tuple(bwd_task[i] for i in g),
                          priority=float(priorities[k]) if priorities is not None else 0.0, earliest_s=earliest))
    if update_s:
        tasks.append(Task("compute", "update", "update", update_s,
                          deps=tuple(range(len(tasks) - len(groups), len(tasks)))))
    return tasks


def check_buckets(buckets) -> None:
    """All-reduce buckets carry exactly one message (a backward all-reduce)."""
    for i, b in enumerate(buckets):
        if len(b.messages) != 1:
            raise ValueError(f"bucket {i}: an all-reduce bucket has exactly one message, got {len(b.messages)}")


def _inputs(trace, plan, cost):
    return plan.groups(trace), comm_times_s(trace, plan, cost), trace.forward_s(), trace.backward_s(), trace.overheads


def build_graph(trace, plan, cost) -> SimGraph:
    """The event-engine graph of one all-reduce iteration (priorities from the plan's messages)."""
    groups, comm, fwd, bwd, o = _inputs(trace, plan, cost)
    tasks = allreduce_tasks(trace.names, fwd, bwd, groups, comm, pre_forward_s=o.pre_forward_s,
                            update_s=o.after_backward_s,
                            priorities=[b.messages[0].priority for b in plan.buckets],
                            cycle_s=plan.option("cycle_s"))
    return SimGraph(tasks, frozenset({"compute"}), forward_s=float(fwd.sum()) + o.pre_forward_s,
                    backward_s=float(bwd.sum()) + o.after_backward_s, comm_s=float(np.sum(comm)))


def closed_form(trace, plan, cost) -> SimResult | None:
    """:func:`fifo_iteration_s` when every bucket has the same priority (pure FCFS); else None."""
    if len({b.messages[0].priority for b in plan.buckets}) > 1:
        return None
    groups, comm, fwd, bwd, o = _inputs(trace, plan, cost)
    t = fifo_iteration_s(float(fwd.sum()), bwd, groups, comm, o.total_s, plan.option("cycle_s"))
    return SimResult(iteration_s=t, forward_s=float(fwd.sum()) + o.pre_forward_s,
                     backward_s=float(bwd.sum()) + o.after_backward_s, comm_s=float(np.sum(comm)))
