"""Trace-based simulation of one training iteration under a Plan and a CostModel.

:func:`simulate` lets the plan's family build its task graph and runs it on the event engine
(:mod:`repro.core.engine`), or uses the family's closed form when no timeline is asked for. Torch-free.
"""

from __future__ import annotations

from repro.core.cost import CostModel
from repro.core.families import get_family
from repro.core.plan import Plan
from repro.core.contention import run_tasks_with_contention
from repro.core.engine import Op, Task, run_tasks
from repro.core.sim_result import SimGraph, SimResult
from repro.core.trace import Trace

__all__ = ["simulate", "SimResult", "SimGraph", "Op", "Task", "run_tasks", "comm_times_s", "message_times_s"]


def message_times_s(trace: Trace, plan: Plan, cost: CostModel) -> list[list[float]]:
    """Seconds of every message of every bucket under ``cost`` (bytes as the plan's family sends them)."""
    family = get_family(plan.family)
    nbytes = family.bytes_per_message(trace, plan)
    return [[float(cost.time_s(m.collective, n)) for m, n in zip(b.messages, row)]
            for b, row in zip(plan.buckets, nbytes)]


def comm_times_s(trace: Trace, plan: Plan, cost: CostModel) -> list[float]:
    """Seconds of communication per bucket (the sum of its messages)."""
    return [sum(row) for row in message_times_s(trace, plan, cost)]


def simulate(trace: Trace, plan: Plan, cost: CostModel, *, with_ops: bool = True) -> SimResult:
    """Simulate one iteration of ``trace`` under ``plan`` with communication costs from ``cost``.

    The plan's family builds the model. ``with_ops=False`` skips the timeline and uses the family's
    closed form when it has one (same result). A cost model's :class:`~repro.core.realism.Realism`
    is applied (trace side, cast cost, contention and in-flight charges: :mod:`repro.core.contention`).
    Raises :class:`~repro.core.plan.PlanError` when the plan does not fit the trace and
    :class:`~repro.core.cost.CostModelError` when the cost model lacks a collective the plan uses.
    """
    family = get_family(plan.family)
    plan.groups(trace)  # every layer covered exactly once, every name known
    contention = in_flight_s = 0.0
    if cost.realism is not None:
        trace = cost.realism.apply_to_trace(trace)
        cost = cost.for_wire_dtype(plan.options.get("wire_dtype"))
        if cost.realism is not None:
            contention = cost.realism.contention
            in_flight_s = cost.realism.message_overhead_per_in_flight_s
    if not with_ops and contention == 0 and in_flight_s == 0:
        closed = family.hook("closed_form")
        if closed is not None:
            result = closed(trace, plan, cost)
            if result is not None:
                return result
    graph: SimGraph = family.hook("simulator")(trace, plan, cost)
    ops = run_tasks_with_contention(list(graph.tasks), graph.in_order_streams, contention, in_flight_s=in_flight_s)
    iteration = graph.iteration_s(ops) if graph.iteration_s else max((op.end_s for op in ops), default=0.0)
    return SimResult(iteration_s=float(iteration), forward_s=graph.forward_s, backward_s=graph.backward_s,
                     comm_s=graph.comm_s, ops=ops if with_ops else [], sparsify_s=graph.sparsify_s)
