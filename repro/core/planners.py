"""Planners: Trace + CostModel -> Plan, each a pure function ``fn(trace, cost, **options) -> Plan``
registered by its family; look one up by name with :func:`make_plan`. Torch-free.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping

from repro.core.cost import CostModel
from repro.core.plan import Plan
from repro.core.registry import Registry
from repro.core.trace import Trace

__all__ = ["PLANNERS", "PLANNER_FAMILY", "planner_names", "make_plan", "register_planner"]

#: every registered planner by name (filled by the family packages: :mod:`repro.core.registry`)
PLANNERS: Registry[Callable[..., Plan]] = Registry("planner")


def register_planner(name: str, fn: Callable[..., Plan], *, replace: bool = False) -> Callable[..., Plan]:
    """Add planner ``fn`` under ``name``; its plans' family is ``fn.family``, else its module's ``FAMILY``."""
    if not callable(fn):
        raise TypeError(f"register_planner takes a function, got {type(fn).__name__}")
    return PLANNERS.add(name, fn, replace=replace)


class _PlannerFamilies(Mapping[str, str]):
    """Planner name -> its plans' family, read from :data:`PLANNERS` when asked."""

    def __getitem__(self, name: str) -> str:
        fn = PLANNERS[name]
        family = getattr(fn, "family", None) or getattr(sys.modules.get(fn.__module__), "FAMILY", None)
        if not family:
            raise KeyError(f"planner '{name}' names no family: give the function a 'family' attribute "
                           f"or its module a FAMILY")
        return family

    def __iter__(self) -> Iterator[str]:
        return iter(list(PLANNERS))

    def __len__(self) -> int:
        return len(PLANNERS)


#: The family of the plans each planner makes.
PLANNER_FAMILY: Mapping[str, str] = _PlannerFamilies()

_RENAMED = {"ddp": "'ddp' is PyTorch DDP itself (a runtime baseline, see `repro schedulers`); its default "
                   "bucketing as a plan is the planner 'ddp_buckets'"}


def planner_names(family: str | None = None) -> list[str]:
    """Every planner's name, or those making plans of ``family``."""
    return [n for n in PLANNERS if family is None or PLANNER_FAMILY[n] == family]


def make_plan(name: str, trace: Trace, cost: CostModel, **options: Any) -> Plan:
    """Run planner ``name`` with ``options`` and record the plan's provenance. A cost model's
    :class:`~repro.core.realism.Realism` is applied to the trace first, as the simulator does."""
    try:
        fn = PLANNERS[name]
    except (KeyError, TypeError):
        hint = f" ({_RENAMED[name]})" if name in _RENAMED else ""
        raise ValueError(f"unknown solver '{name}'{hint}; choose one of {', '.join(PLANNERS)}") from None
    if cost.realism is not None:
        trace = cost.realism.apply_to_trace(trace)
        # The trace side is applied: a planner that simulates its candidates must not apply it again.
        cost = cost.for_wire_dtype(options.get("wire_dtype")).with_realism(
            replace(cost.realism, compute_scale=1.0, update_s_per_byte=0.0))
    try:
        plan = fn(trace, cost, **options)
    except TypeError as e:
        if "unexpected keyword" in str(e):
            raise ValueError(f"planner '{name}' does not take option(s) {sorted(options)}: {e}") from None
        raise
    return plan.replace(meta={**plan.meta, "provenance": provenance(trace, cost, options.get("wire_dtype"))})


def provenance(trace: Trace, cost: CostModel, wire_dtype: str | None = None) -> dict[str, Any]:
    """``plan.meta["provenance"]``: the trace (model, batch, device, layers, layer ``view``), the cost
    model's source and P, and the wire dtype."""
    return {"trace_model": trace.model, "batch_size": trace.batch_size, "device": trace.device,
            "layers": trace.num_layers, "view": (trace.extra or {}).get("view"), "cost_source": cost.source,
            "workers": cost.workers, "wire_dtype": wire_dtype}
