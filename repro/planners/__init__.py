"""Planners (solvers): Trace + CostModel -> Plan. Look one up by name with :func:`make_plan`."""

from __future__ import annotations

from typing import Any, Callable

from repro.cost import CostModel
from repro.plan import Plan
from repro.planners import allreduce
from repro.trace import Trace

__all__ = ["PLANNERS", "planner_names", "make_plan"]

PLANNERS: dict[str, Callable[..., Plan]] = {
    "wfbp": allreduce.wfbp,
    "syncea": allreduce.syncea,
    "threshold": allreduce.threshold,
    "ddp": allreduce.ddp,
    "mgwfbp": allreduce.mgwfbp,
    "optimal": allreduce.optimal,
}


def planner_names() -> list[str]:
    return list(PLANNERS)


def make_plan(name: str, trace: Trace, cost: CostModel, **options: Any) -> Plan:
    """Run planner ``name``; ``options`` are passed on (e.g. ``threshold_bytes`` for ``threshold``)."""
    try:
        fn = PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown solver '{name}'; choose one of {', '.join(PLANNERS)}") from None
    return fn(trace, cost, **options)
