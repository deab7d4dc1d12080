"""The ByteScheduler family's iteration model (Peng et al., SOSP 2019, as DeAR's baselines use it).

Chunks are all-reduced on one stream that starts the released chunk of lowest ``priority`` (ties:
released first); a layer's next forward waits only for its own chunks and update. The schedule varies
between iterations, so :func:`build_graph` simulates :data:`ITERATIONS` iterations and reports the mean
interval between the starts of iterations 1.. . The credit is not modelled beyond one chunk. Torch-free.
"""

from __future__ import annotations

import numpy as np

from repro.families.allreduce.simulate import bucket_label
from repro.core.engine import Op, Task
from repro.core.sim_result import SimGraph

__all__ = ["ITERATIONS", "check_buckets", "bytescheduler_tasks", "build_graph"]

ITERATIONS = 5


def check_buckets(buckets) -> None:
    """One backward all-reduce per bucket (a whole layer or a piece of one)."""
    for i, b in enumerate(buckets):
        if len(b.messages) != 1:
            raise ValueError(f"bucket {i}: a ByteScheduler bucket (chunk) has exactly one all-reduce message")
        if b.piece is None and len(b.layers) != 1:
            raise ValueError(f"bucket {i}: ByteScheduler chunks hold one layer (or one piece of it), "
                             f"got {len(b.layers)} layers")


def bytescheduler_tasks(names, forward_s, backward_s, chunk_layer, chunk_s, chunk_priority, update_s,
                        pre_forward_s: float = 0.0, straggler_s: float = 0.0,
                        iterations: int = ITERATIONS) -> tuple[list[Task], list[int]]:
    """Task graph of ``iterations`` iterations, and per iteration the index of its first layer's forward.

    ``chunk_layer[c]``: layer index of chunk c; ``chunk_s``/``chunk_priority``: its seconds and
    priority; ``update_s[l]``: layer l's update seconds."""
    L = len(names)
    chunks_of: dict[int, list[int]] = {}
    for c, l in enumerate(chunk_layer):
        chunks_of.setdefault(int(l), []).append(c)
    tasks: list[Task] = []
    starts: list[int] = []
    prev_chunk_task: dict[int, int] = {}
    for it in range(iterations):
        if pre_forward_s:
            tasks.append(Task("compute", "pre_forward", "pre", pre_forward_s))
        for l in range(L):
            deps = tuple(prev_chunk_task[c] for c in chunks_of.get(l, ())) if it else ()
            if it and update_s[l]:
                tasks.append(Task("compute", "update", names[l], float(update_s[l]), deps=deps))
                deps = ()
            if l == 0:
                starts.append(len(tasks))
            tasks.append(Task("compute", "forward", names[l], float(forward_s[l]), deps=deps))
        bwd = {}
        for l in reversed(range(L)):
            bwd[l] = len(tasks)
            tasks.append(Task("compute", "backward", names[l], float(backward_s[l])))
        if straggler_s:
            tasks.append(Task("compute", "straggler", "straggler", straggler_s))
        for c, l in enumerate(chunk_layer):
            prev_chunk_task[c] = len(tasks)
            tasks.append(Task("comm", "allreduce", _chunk_label(names, l, c, chunks_of), float(chunk_s[c]),
                              deps=(bwd[int(l)],), priority=float(chunk_priority[c])))
    return tasks, starts


def _chunk_label(names, l, c, chunks_of) -> str:
    mine = chunks_of[int(l)]
    base = bucket_label([int(l)])
    return base if len(mine) == 1 else f"{base}#{mine.index(c) + 1}/{len(mine)}"


def build_graph(trace, plan, cost) -> SimGraph:
    """The event-engine graph of :data:`ITERATIONS` iterations; the iteration time is the mean interval
    between the starts of the first layer's forward in iterations 1..ITERATIONS-1."""
    from repro.core.simulate import message_times_s  # the package is initialised before its submodules

    groups = plan.groups(trace)
    chunk_layer = [g[0] for g in groups]
    chunk_s = [row[0] for row in message_times_s(trace, plan, cost)]
    prio = [b.messages[0].priority for b in plan.buckets]
    params = trace.params().astype(float)
    o = trace.overheads
    upd = (o.update_s * params / params.sum()).tolist() if o.update_s and params.sum() > 0 else [0.0] * len(params)
    tasks, starts = bytescheduler_tasks(trace.names, trace.forward_s(), trace.backward_s(), chunk_layer, chunk_s,
                                        prio, upd, o.pre_forward_s, o.straggler_s)

    def period(ops: list[Op]) -> float:
        return (ops[starts[-1]].start_s - ops[starts[1]].start_s) / (len(starts) - 2)

    return SimGraph(tasks, frozenset({"compute"}), forward_s=trace.total_forward_s + o.pre_forward_s + o.update_s,
                    backward_s=trace.total_backward_s + o.straggler_s, comm_s=float(np.sum(chunk_s)),
                    iteration_s=period)
