"""The DeAR family's iteration model (Zhang et al., ICDCS 2023): per bucket (forward order) a
reduce-scatter in backward and an all-gather in the next forward, on one FCFS stream.

Steady-state period (seconds; ``T_B = max(sum_j b_j, e_1)`` the step barrier, ``e_1`` the end of the
last reduce-scatter)::

    period = max(pre, T_ag(n_1)) + sum_{k<K} max(u_k + f_k, T_ag(n_{k+1})) + u_K + f_K + T_B + straggler

:func:`dear_period_s` is this closed form, :func:`build_graph` the event graph of :data:`ITERATIONS`
iterations; the tests check they agree. Message bytes ignore the runtime's padding. Torch-free.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repro.families.allreduce.simulate import bucket_label, fifo_comm_end_s, ready_times_s
from repro.core.engine import Op, Task
from repro.core.sim_result import SimGraph, SimResult

__all__ = ["ITERATIONS", "check_buckets", "check_forward_order", "bucket_update_s", "dear_period_s",
           "forward_phase_s", "dear_tasks", "build_graph", "closed_form", "dear_inputs"]

ITERATIONS = 2  # iterations in the simulated timeline (the period is the last one)


def check_buckets(buckets) -> None:
    """Whole layers; exactly a backward reduce-scatter and a next-forward all-gather per bucket."""
    for i, b in enumerate(buckets):
        if b.piece is not None:
            raise ValueError(f"bucket {i}: DeAR buckets hold whole layers")
        kinds = [(m.collective, m.phase) for m in b.messages]
        if kinds != [("reduce_scatter", "backward"), ("allgather", "next_forward")]:
            raise ValueError(f"bucket {i}: a DeAR bucket sends a backward reduce_scatter then a next_forward "
                             f"allgather, got {kinds}")


def check_forward_order(groups: Sequence[Sequence[int]]) -> None:
    """DeAR buckets are contiguous runs of layers, given in forward order (bucket 1 = input side)."""
    from repro.core.plan import PlanError

    nxt = 0
    for k, g in enumerate(groups):
        if sorted(g) != list(range(nxt, nxt + len(g))):
            raise PlanError(f"DeAR bucket {k} must be the contiguous run of layers {nxt + 1}.. in forward order "
                            f"(buckets in forward order, input side first); got layers "
                            f"{[i + 1 for i in sorted(g)][:5]}")
        nxt += len(g)


def bucket_update_s(params: np.ndarray, groups: Sequence[Sequence[int]], update_s: float) -> list[float]:
    """``update_s`` split over buckets by their share of the parameters."""
    total = float(np.sum(params))
    if update_s <= 0 or total <= 0:
        return [0.0] * len(groups)
    return [update_s * float(sum(params[i] for i in g)) / total for g in groups]


def forward_phase_s(forward_s: Sequence[float], ag_s: Sequence[float], update_s: Sequence[float],
                    pre_forward_s: float = 0.0) -> float:
    """Seconds from the step barrier to the end of the forward: the ``phi`` recursion."""
    K = len(forward_s)
    phi = max(pre_forward_s, float(ag_s[0]))
    for k in range(K - 1):
        phi = max(phi + float(update_s[k]) + float(forward_s[k]), phi + float(ag_s[k + 1]))
    return phi + float(update_s[K - 1]) + float(forward_s[K - 1])


def dear_period_s(forward_s: Sequence[float], backward_s: np.ndarray, groups: Sequence[Sequence[int]],
                  rs_s: Sequence[float], ag_s: Sequence[float], update_s: Sequence[float] | None = None,
                  pre_forward_s: float = 0.0, straggler_s: float = 0.0) -> float:
    """Steady-state iteration seconds (module docstring): ``forward_s``, ``rs_s``, ``ag_s`` and
    ``update_s`` per bucket (forward order), ``backward_s`` per layer."""
    K = len(groups)
    upd = [0.0] * K if update_s is None else update_s
    ready = ready_times_s(backward_s)
    bucket_ready = [float(ready[min(g)]) for g in groups]
    e1 = fifo_comm_end_s(bucket_ready, rs_s)
    return float(forward_phase_s(forward_s, ag_s, upd, pre_forward_s) + max(float(ready[0]), e1) + straggler_s)


def dear_tasks(names: Sequence[str], forward_s: np.ndarray, backward_s: np.ndarray,
               groups: Sequence[Sequence[int]], rs_s: Sequence[float], ag_s: Sequence[float],
               update_s: Sequence[float], pre_forward_s: float = 0.0, straggler_s: float = 0.0,
               iterations: int = ITERATIONS) -> tuple[list[Task], list[int]]:
    """Task graph of ``iterations`` DeAR iterations, and the task index of every step barrier
    (``iterations + 1``). Per bucket a zero-length ``wait`` after AG(k) launches AG(k+1), then the bucket's
    ``update`` and forward; each reduce-scatter follows its layers' backward."""
    L = len(names)
    tasks: list[Task] = []
    barriers: list[int] = []
    prev_rs: tuple[int, ...] = ()
    for it in range(iterations + 1):
        barriers.append(len(tasks))
        tasks.append(Task("compute", "step", f"step {it}", straggler_s if it else 0.0, deps=prev_rs))
        if it == iterations:
            break
        if pre_forward_s:
            tasks.append(Task("compute", "pre_forward", "pre", pre_forward_s))
        ag_dep = barriers[-1]
        for k, g in enumerate(groups):
            label = bucket_label(g)
            ag = len(tasks)
            tasks.append(Task("comm", "allgather", label, float(ag_s[k]), deps=(ag_dep,)))
            ag_dep = len(tasks)
            tasks.append(Task("compute", "wait", label, 0.0, deps=(ag,)))
            if update_s[k]:
                tasks.append(Task("compute", "update", label, float(update_s[k])))
            tasks += [Task("compute", "forward", names[i], float(forward_s[i])) for i in sorted(g)]
        bwd = {}
        for i in reversed(range(L)):
            bwd[i] = len(tasks)
            tasks.append(Task("compute", "backward", names[i], float(backward_s[i])))
        first_rs = len(tasks)
        tasks += [Task("comm", "reduce_scatter", bucket_label(g), float(rs_s[k]), deps=tuple(bwd[i] for i in g))
                  for k, g in enumerate(groups)]
        prev_rs = tuple(range(first_rs, len(tasks)))
    return tasks, barriers


def dear_inputs(trace, plan, cost):
    """Per bucket (forward order): groups, forward seconds, RS and AG seconds, update seconds."""
    from repro.core.simulate import message_times_s  # the package is initialised before its submodules

    groups = plan.groups(trace)
    check_forward_order(groups)
    fwd = trace.forward_s()
    msgs = message_times_s(trace, plan, cost)
    rs = [row[0] for row in msgs]
    ag = [row[1] for row in msgs]
    upd = bucket_update_s(trace.params(), groups, trace.overheads.update_s)
    fwd_b = [float(sum(fwd[i] for i in g)) for g in groups]
    return groups, fwd_b, rs, ag, upd


def build_graph(trace, plan, cost) -> SimGraph:
    """The event-engine graph of :data:`ITERATIONS` DeAR iterations; the iteration time is the last
    barrier-to-barrier interval."""
    groups, fwd_b, rs, ag, upd = dear_inputs(trace, plan, cost)
    o = trace.overheads
    tasks, barriers = dear_tasks(trace.names, trace.forward_s(), trace.backward_s(), groups, rs, ag, upd,
                                 pre_forward_s=o.pre_forward_s, straggler_s=o.straggler_s)

    def period(ops: list[Op]) -> float:
        return ops[barriers[-1]].end_s - ops[barriers[-2]].end_s

    return SimGraph(tasks, frozenset({"compute"}), forward_s=float(sum(fwd_b)) + o.pre_forward_s + sum(upd),
                    backward_s=trace.total_backward_s + o.straggler_s, comm_s=float(sum(rs) + sum(ag)),
                    iteration_s=period)


def closed_form(trace, plan, cost) -> SimResult:
    """:func:`dear_period_s` for ``plan``."""
    groups, fwd_b, rs, ag, upd = dear_inputs(trace, plan, cost)
    o = trace.overheads
    t = dear_period_s(fwd_b, trace.backward_s(), groups, rs, ag, upd, o.pre_forward_s, o.straggler_s)
    return SimResult(iteration_s=t, forward_s=float(sum(fwd_b)) + o.pre_forward_s + sum(upd),
                     backward_s=trace.total_backward_s + o.straggler_s, comm_s=float(sum(rs) + sum(ag)))
