"""Trace-based simulation of one training iteration under a Plan and a CostModel.

``simulate(trace, plan, cost)`` returns a :class:`SimResult` with the iteration time and the timed
operations (stream, kind, label, start, end) that the Gantt plots draw. Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from repro.cost import CostModel
from repro.plan import Plan, PlanError
from repro.sim.allreduce import allreduce_tasks, fifo_iteration_s, fixed_costs_s
from repro.sim.engine import Op, Task, run_tasks
from repro.trace import Trace

__all__ = ["simulate", "SimResult", "Op", "Task", "run_tasks", "comm_times_s"]

_SUPPORTED = {"allreduce"}  # other families add their task builders beside allreduce.py


@dataclass(frozen=True)
class SimResult:
    """Simulated iteration: ``iteration_s`` and the ops of its timeline (seconds from start)."""

    iteration_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    ops: list[Op] = field(default_factory=list, repr=False)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def exposed_comm_s(self) -> float:
        """Communication not hidden behind computation."""
        return max(0.0, self.iteration_s - self.compute_s)

    def to_dict(self, with_ops: bool = True) -> dict[str, object]:
        d: dict[str, object] = {"iteration_s": self.iteration_s, "forward_s": self.forward_s,
                                "backward_s": self.backward_s, "comm_s": self.comm_s,
                                "exposed_comm_s": self.exposed_comm_s}
        if with_ops:
            d["ops"] = [op.to_dict() for op in self.ops]
        return d


def comm_times_s(trace: Trace, plan: Plan, cost: CostModel) -> list[float]:
    """Seconds of each bucket's message under ``cost`` (bytes after the plan's wire dtype)."""
    return [float(cost.time_s(b.collective, n)) for b, n in zip(plan.buckets, plan.bucket_bytes(trace))]


def simulate(trace: Trace, plan: Plan, cost: CostModel, *, with_ops: bool = True) -> SimResult:
    """Simulate one iteration of ``trace`` under ``plan`` with communication costs from ``cost``.

    Every bucket is one message on a single FCFS communication stream, sent when all its gradients
    are ready (the model of mgwfbp.md). A measured trace's ``pre_forward_s`` / ``update_s`` extras are
    added as compute before the forward and after the last message (see :mod:`repro.sim.allreduce`). Later families (DeAR, OMGS, OSP) add their own task builders.
    """
    groups = plan.groups(trace)
    for b in plan.buckets:
        if b.collective not in _SUPPORTED:
            raise PlanError(f"the simulator does not execute '{b.collective}' buckets yet "
                            f"(supported: {', '.join(sorted(_SUPPORTED))})")
    comm = comm_times_s(trace, plan, cost)
    fwd, bwd = trace.forward_s(), trace.backward_s()
    pre, update = fixed_costs_s(trace.extra)
    if with_ops:
        tasks = allreduce_tasks(trace.names, fwd, bwd, groups, comm, pre_forward_s=pre, update_s=update)
        ops = run_tasks(tasks, {"compute"})
        iteration = max(op.end_s for op in ops)
    else:
        ops = []
        iteration = fifo_iteration_s(float(fwd.sum()), bwd, groups, comm, pre + update)
    return SimResult(iteration_s=float(iteration), forward_s=float(fwd.sum()) + pre,
                     backward_s=float(bwd.sum()) + update, comm_s=float(np.sum(comm)), ops=ops)
