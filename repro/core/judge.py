"""The exact planners' last step: judge their plan and their family's heuristic plans under the model
the simulator applies (contention included, which no exact search covers; docs/design/core.md) and
return the fastest, recording in ``plan.meta`` which won and why (:func:`judged_best`). Torch-free.
"""

from __future__ import annotations

from typing import Callable, Sequence

from repro.core.cost import CostModel
from repro.core.plan import Plan
from repro.core.budget import Search
from repro.core.trace import Trace

__all__ = ["EXACT_UNDER", "judged_best"]

# What the search records about itself (kept whichever plan wins).
_SEARCH_RECORD = ("optimal", "lower_bound_s", "gap_pct", "labels")
EXACT_UNDER = ("the contention-free model: the trace's computation (compute scale and update applied), the cost "
               "model's lines with their per-message overhead and copy/cast costs, perfect overlap")


def judged_best(trace: Trace, cost: CostModel, own: Plan, rivals: Sequence[tuple[str, Callable[[], Plan]]],
                search: Search | None, solver: str) -> Plan:
    """The fastest of ``own`` (the search's plan, ``meta["iteration_s"]`` its contention-free iteration)
    and the plans ``rivals`` make (``(planner name, thunk)``, published heuristic first), as a plan of
    ``solver`` whose ``meta`` says which won and why (module docstring)."""
    from repro.core.simulate import simulate

    c = float(cost.realism.contention) if cost.realism is not None else 0.0
    search_s = float(own.meta["iteration_s"])
    finished = own.meta.get("optimal", True) is not False
    if c == 0:
        judged_by = "closed form (no contention: the search's model is the judging model)"
    else:
        judged_by = f"simulator (event engine, contention {c:.4g}: computation slowed while communication runs)"
    extra = {"exact_under": EXACT_UNDER, "judged_by": judged_by, "search_iteration_s": search_s}
    if c == 0 and finished:  # a proven optimum of the judging model itself
        return own.replace(meta={**own.meta, **extra, "plan_from": solver, "exact_plan_iteration_s": search_s,
                                 "candidate_iterations": {solver: search_s}})

    def judge(plan: Plan) -> float:
        if c == 0:
            return float(plan.meta["iteration_s"])  # the family's closed form, equal to simulate's
        return float(simulate(trace, plan, cost, with_ops=False).iteration_s)

    own_s = judge(own)
    times = {solver: own_s}
    best_name, best_plan, best_s = solver, own, own_s
    skipped = []
    for name, make in rivals:
        if c and search is not None and search.expired():
            skipped.append(name)
            continue
        plan = make()
        t = judge(plan)
        times[name] = t
        if t < best_s:
            best_name, best_plan, best_s = name, plan, t
    meta = {**best_plan.meta, **{k: v for k, v in own.meta.items() if k in _SEARCH_RECORD}, **extra,
            "iteration_s": best_s, "plan_from": best_name, "exact_plan_iteration_s": own_s,
            "candidate_iterations": times}
    if skipped:
        meta["candidates_skipped"] = skipped
    if c == 0 and "lower_bound_s" in meta and best_name != solver:  # a heuristic beat an unfinished search
        lb = float(meta["lower_bound_s"])
        meta["gap_pct"] = 100.0 * (best_s - lb) / lb if lb > 0 else meta["gap_pct"]
    return best_plan.replace(solver=solver, meta=meta)
