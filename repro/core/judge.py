"""The exact planners' last step: judge their plan, and their family's heuristic plans, under the model
the simulator applies, and return the fastest.

The exact planners (``optimal``, ``omgs_optimal``, ``dear_optimal``) search their family's
**contention-free** timeline: the trace's computation (with the realism's compute scale and update
applied, as :func:`repro.core.planners.make_plan` does), the cost model's lines (per-message overhead,
copy and cast costs included: :meth:`repro.core.cost.CostModel.line`; a cluster's intra- and inter-node
links are already folded into its lines), perfect overlap of computation and communication. That is
everything :func:`repro.core.simulate.simulate` applies except **contention**
(:attr:`repro.core.realism.Realism.contention`: computation slowed while communication is in flight,
:mod:`repro.core.contention`). Contention breaks the searches' substructure (how fast a bucket's
layers compute depends on messages later in the plan), so no exact search covers it.

:func:`judged_best` therefore evaluates the search's own plan and the plans of the family's heuristics
with the judge itself and returns the fastest:

- no contention (the paper model, or a realism without contention): the search is exact under the
  judging model, so a finished search's plan is returned as it is; a search whose time budget ran out
  is compared with the heuristics' plans in closed form (each equal to ``simulate``);
- contention: every candidate is simulated (``simulate(trace, plan, cost, with_ops=False)``, the event
  engine with the contention fixed point), the search's plan first, then the family's published
  heuristic, then the others, while the time budget lasts (skipped ones are listed).

``plan.meta`` records ``plan_from`` (the planner whose plan won: the exact planner itself or a
heuristic), ``iteration_s`` (the winner's predicted iteration under the judging model),
``exact_plan_iteration_s`` (the search's own plan under the judging model), ``search_iteration_s``
(the search's plan under the contention-free model it optimises), ``candidate_iterations`` (every
candidate's prediction), ``candidates_skipped`` (when the budget ran out), ``exact_under`` and
``judged_by`` (in words). ``optimal``, ``lower_bound_s`` and ``gap_pct``
(:mod:`repro.core.budget`) stay the search's record under its contention-free model. Ties keep the
search's plan. Never imports torch.
"""

from __future__ import annotations

from typing import Callable, Sequence

from repro.core.cost import CostModel
from repro.core.plan import Plan
from repro.core.budget import Search
from repro.core.trace import Trace

__all__ = ["EXACT_UNDER", "contention_of", "judged_best"]

EXACT_UNDER = ("the contention-free model: the trace's computation (compute scale and update applied), the cost "
               "model's lines with their per-message overhead and copy/cast costs, perfect overlap")


def contention_of(cost: CostModel) -> float:
    """The slowdown of computation while communication is in flight that ``cost`` carries (0: none)."""
    return float(cost.realism.contention) if cost.realism is not None else 0.0


def judged_best(trace: Trace, cost: CostModel, own: Plan, rivals: Sequence[tuple[str, Callable[[], Plan]]],
                search: Search | None, solver: str) -> Plan:
    """The fastest of ``own`` (the exact search's plan, ``meta["iteration_s"]`` its contention-free
    iteration) and the plans ``rivals`` make (``(planner name, thunk)``, the family's published
    heuristic first) under the model :func:`repro.core.simulate.simulate` applies (module docstring), as a plan
    of ``solver`` whose ``meta`` says which won and why."""
    from repro.core.simulate import simulate  # the package __init__ (planners import its submodules only)

    c = contention_of(cost)
    search_s = float(own.meta["iteration_s"])
    finished = own.meta.get("optimal", True) is not False
    if c == 0:
        judged_by = "closed form (no contention: the search's model is the judging model)"
    else:
        judged_by = f"simulator (event engine, contention {c:.4g}: computation slowed while communication runs)"
    extra = {"exact_under": EXACT_UNDER, "judged_by": judged_by, "search_iteration_s": search_s}
    if c == 0 and finished:  # a proven optimum of the judging model itself: nothing can beat it
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


# What the search records about itself (kept whichever plan wins).
_SEARCH_RECORD = ("optimal", "lower_bound_s", "gap_pct", "labels")
