"""The all-reduce family's iteration model (MG-WFBP, ``../shared/papers/mgwfbp.md``).

Forward runs layers 1..L, then backward L..1 on the compute stream. A bucket becomes ready when the
last of its gradients is produced; one communication stream serves ready buckets first-come
first-served (ties: plan order). Iteration time = forward + backward + the communication not hidden
behind backward, i.e. ``t_f + max(t_b, end of the last all-reduce measured from backward start)``.

Optional fixed costs a measured trace may carry in ``trace.extra`` (seconds; absent = 0, which is
the papers' model): ``pre_forward_s`` (blocking work before the forward, e.g. a buffer broadcast),
``straggler_s`` (how much later than the average rank the slowest rank finishes its computation, so
the last collective completes that much later) and ``update_s`` (the optimizer step, after the last
all-reduce).

Two implementations of the same model: :func:`allreduce_tasks` builds the event-engine task graph
(gives the full timeline), :func:`fifo_iteration_s` is the closed-form recursion the planners call
thousands of times. Tests check that they agree.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repro.sim.engine import Task

__all__ = ["ready_times_s", "fifo_comm_end_s", "fifo_iteration_s", "allreduce_tasks", "bucket_label",
           "fixed_costs_s"]


def fixed_costs_s(extra: dict) -> tuple[float, float]:
    """(pre_forward_s, straggler_s + update_s) from a trace's extras; 0 when absent."""
    out = []
    for key in ("pre_forward_s", "straggler_s", "update_s"):
        v = extra.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
            raise ValueError(f"trace extra '{key}' must be a non-negative number of seconds, got {v!r}")
        out.append(float(v))
    return out[0], out[1] + out[2]


def ready_times_s(backward_s: np.ndarray) -> np.ndarray:
    """Seconds after backward start at which each layer's gradient is ready (forward order input)."""
    return np.cumsum(np.asarray(backward_s, dtype=float)[::-1])[::-1]


def fifo_comm_end_s(bucket_ready_s: Sequence[float], bucket_comm_s: Sequence[float]) -> float:
    """End of the last message on one FCFS stream; buckets given in plan order (the tie-break)."""
    order = sorted(range(len(bucket_ready_s)), key=lambda k: (bucket_ready_s[k], k))
    t = 0.0
    for k in order:
        t = max(t, bucket_ready_s[k]) + bucket_comm_s[k]
    return t


def fifo_iteration_s(forward_total_s: float, backward_s: np.ndarray, groups: Sequence[Sequence[int]],
                     comm_s: Sequence[float], fixed_s: float = 0.0) -> float:
    """Iteration seconds for bucket ``groups`` (layer indices) whose messages take ``comm_s`` each;
    ``fixed_s`` (pre-forward + update seconds) is added."""
    ready = ready_times_s(backward_s)
    bucket_ready = [float(ready[min(g)]) for g in groups]
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
                    update_s: float = 0.0) -> list[Task]:
    """Task graph of one iteration: [pre-forward], forward tasks, backward tasks, one message per
    bucket, [the update after the last message]."""
    L = len(names)
    tasks = [Task("compute", "pre_forward", "pre", pre_forward_s)] if pre_forward_s else []
    tasks += [Task("compute", "forward", names[i], float(forward_s[i])) for i in range(L)]
    bwd_task = {}
    for i in reversed(range(L)):
        bwd_task[i] = len(tasks)
        tasks.append(Task("compute", "backward", names[i], float(backward_s[i])))
    for k, g in enumerate(groups):
        kind = kinds[k] if kinds else "allreduce"
        tasks.append(Task("comm", kind, bucket_label(g), float(comm_s[k]),
                          deps=tuple(bwd_task[i] for i in g)))
    if update_s:
        tasks.append(Task("compute", "update", "update", update_s,
                          deps=tuple(range(len(tasks) - len(groups), len(tasks)))))
    return tasks
