"""The sparse family's iteration model (OMGS-SGD, Shi et al., INFOCOM 2020).

When a bucket's last gradient is ready its top-k runs on the compute stream (``gamma d log2 d``
seconds, ``d`` elements), then ``k = ceil(density * d)`` values and int32 indices are all-gathered on
one FCFS stream (two messages, or one packed). ``topk_scope`` "model" is timed as "bucket" (same
start-ups and total bytes). :func:`build_graph` (event graph) and :func:`sparse_iteration_s` (closed
form) agree. Torch-free.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repro.families.allreduce.simulate import bucket_label, fifo_comm_end_s
from repro.core.engine import Task
from repro.core.sim_result import SimGraph, SimResult

__all__ = ["INDEX_BYTES", "TOPK_SCOPES", "topk_count", "bucket_numels", "value_bytes", "message_bytes",
           "check_buckets", "sparse_times_s", "sparse_iteration_s", "sparse_tasks", "build_graph", "closed_form"]

INDEX_BYTES = 4  # int32 indices on the wire
TOPK_SCOPES = ("bucket", "model")  # a sparse plan's topk_scope option (repro.families.sparse.executor.SparseExecutor)


def topk_count(numel, density: float):
    """``k = ceil(density * numel)``, at least 1 and at most ``numel`` (scalar or array)."""
    n = np.asarray(numel, dtype=float)
    k = np.minimum(n, np.maximum(1.0, np.ceil(density * n - 1e-9)))
    k = np.where(n > 0, k, 0.0)
    return float(k) if k.ndim == 0 else k


def bucket_numels(trace, plan) -> list[int]:
    """Elements per bucket."""
    params = trace.params()
    return [int(sum(int(params[i]) for i in g)) for g in plan.groups(trace)]


def value_bytes(trace) -> float:
    """Bytes of one gradient value (the trace's gradient bytes per element; 4 for float32)."""
    p = float(trace.params().sum())
    return float(trace.bytes().sum()) / p if p > 0 else 4.0


def message_bytes(trace, plan) -> list[list[float]]:
    """Per bucket, bytes per worker: ``[k * value_bytes, k * 4]`` (values, indices) or
    ``[k * (value_bytes + 4)]`` packed."""
    density = _density(plan)
    vb = value_bytes(trace)
    out = []
    for b, n in zip(plan.buckets, bucket_numels(trace, plan)):
        k = topk_count(n, density)
        out.append([k * vb, k * INDEX_BYTES] if len(b.messages) == 2 else [k * (vb + INDEX_BYTES)])
    return out


def _density(plan) -> float:
    d = plan.option("density")
    if d is None:  # Plan validation requires it; kept for plans built around the checks
        raise ValueError("a sparse plan needs option 'density'")
    return float(d)


def check_buckets(buckets) -> None:
    """Whole layers only; one (packed) or two (values, indices) sparse all-gather messages."""
    for i, b in enumerate(buckets):
        if b.piece is not None:
            raise ValueError(f"bucket {i}: sparse buckets hold whole layers (top-k of a piece is not modelled)")
        if len(b.messages) not in (1, 2):
            raise ValueError(f"bucket {i}: a sparse bucket sends one packed message or two (values, indices), "
                             f"got {len(b.messages)}")


def sparse_times_s(trace, plan, cost) -> tuple[list[float], list[list[float]]]:
    """Top-k seconds per bucket and the seconds of each of its messages."""
    from repro.core.simulate import message_times_s  # the package is initialised before its submodules

    spar = np.atleast_1d(cost.topk_s(np.asarray(bucket_numels(trace, plan), dtype=float))).tolist()
    return spar, message_times_s(trace, plan, cost)


def _compute_order(groups: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """Buckets whose top-k runs right after layer ``i``'s backward (their input-most layer)."""
    after: dict[int, list[int]] = {}
    for k, g in enumerate(groups):
        after.setdefault(min(g), []).append(k)
    return after


def sparse_iteration_s(forward_total_s: float, backward_s: np.ndarray, groups: Sequence[Sequence[int]],
                       spar_s: Sequence[float], comm_s: Sequence[float], fixed_s: float = 0.0) -> float:
    """Iteration seconds: backward with each bucket's top-k after its input-most layer, then one FCFS
    stream of the buckets' all-gathers (``comm_s``: a bucket's total; ties in plan order)."""
    bwd = np.asarray(backward_s, dtype=float)
    after = _compute_order(groups)
    t = 0.0
    ready = [0.0] * len(groups)
    for i in range(len(bwd) - 1, -1, -1):
        t += float(bwd[i])
        for k in after.get(i, ()):
            t += float(spar_s[k])
            ready[k] = t
    end = fifo_comm_end_s(ready, [float(c) for c in comm_s])
    return float(fixed_s + forward_total_s + max(t, end))


def sparse_tasks(names: Sequence[str], forward_s: np.ndarray, backward_s: np.ndarray,
                 groups: Sequence[Sequence[int]], spar_s: Sequence[float], messages_s: Sequence[Sequence[float]],
                 priorities: Sequence[float] | None = None, pre_forward_s: float = 0.0,
                 update_s: float = 0.0) -> list[Task]:
    """Task graph: [pre-forward], forward, backward with each bucket's ``sparsify`` task after its
    input-most layer, one ``sparse_allgather`` task per message, [the update after the last one]."""
    L = len(names)
    after = _compute_order(groups)
    tasks = [Task("compute", "pre_forward", "pre", pre_forward_s)] if pre_forward_s else []
    tasks += [Task("compute", "forward", names[i], float(forward_s[i])) for i in range(L)]
    spar_task: dict[int, int] = {}
    for i in reversed(range(L)):
        tasks.append(Task("compute", "backward", names[i], float(backward_s[i])))
        for k in after.get(i, ()):
            spar_task[k] = len(tasks)
            tasks.append(Task("compute", "sparsify", bucket_label(groups[k]), float(spar_s[k])))
    first_comm = len(tasks)
    for k, g in enumerate(groups):
        for m, secs in enumerate(messages_s[k]):
            part = "" if len(messages_s[k]) == 1 else (" values" if m == 0 else " indices")
            tasks.append(Task("comm", "sparse_allgather", bucket_label(g) + part, float(secs),
                              deps=(spar_task[k],),
                              priority=float(priorities[k]) if priorities is not None else 0.0))
    if update_s:
        tasks.append(Task("compute", "update", "update", update_s, deps=tuple(range(first_comm, len(tasks)))))
    return tasks


def _inputs(trace, plan, cost):
    return (plan.groups(trace), *sparse_times_s(trace, plan, cost), trace.forward_s(), trace.backward_s(),
            trace.overheads)


def build_graph(trace, plan, cost) -> SimGraph:
    """The event-engine graph of one sparse iteration (priorities from the buckets' first message)."""
    groups, spar, msgs, fwd, bwd, o = _inputs(trace, plan, cost)
    tasks = sparse_tasks(trace.names, fwd, bwd, groups, spar, msgs,
                         priorities=[b.messages[0].priority for b in plan.buckets],
                         pre_forward_s=o.pre_forward_s, update_s=o.after_backward_s)
    return SimGraph(tasks, frozenset({"compute"}), forward_s=float(fwd.sum()) + o.pre_forward_s,
                    backward_s=float(bwd.sum()) + o.after_backward_s, comm_s=float(sum(map(sum, msgs))),
                    sparsify_s=float(np.sum(spar)))


def closed_form(trace, plan, cost) -> SimResult | None:
    """:func:`sparse_iteration_s` when every message has the same priority (pure FCFS); else None."""
    if len({m.priority for b in plan.buckets for m in b.messages}) > 1:
        return None
    groups, spar, msgs, fwd, bwd, o = _inputs(trace, plan, cost)
    comm = [sum(row) for row in msgs]
    t = sparse_iteration_s(float(fwd.sum()), bwd, groups, spar, comm, o.total_s)
    return SimResult(iteration_s=t, forward_s=float(fwd.sum()) + o.pre_forward_s,
                     backward_s=float(bwd.sum()) + o.after_backward_s, comm_s=float(sum(comm)),
                     sparsify_s=float(np.sum(spar)))

