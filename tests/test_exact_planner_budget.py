"""The exact planners' time budget: bounded search, the optimality record in ``meta``, the log lines.

``dear_optimal`` and ``omgs_optimal`` search until their plan is a proven optimum or
``time_budget_s`` runs out; then they return the best plan found (never worse than the published
heuristic) with its proven gap. Speed itself is a benchmark (``benchmarks/bench_planners.py``).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest

from repro.costs.presets import preset
from repro.core.planners import make_plan
from repro.core import budget as _budget
from repro.core.simulate import simulate
from repro.core.trace import Layer, Trace

MARGIN_S = 2.0  # building the incumbent and the plan after the deadline
# The bound is on this process's CPU time (time.process_time): other processes sharing the cores stretch
# the wall clock, not the work the planner does past its deadline.


def _random_trace(layers: int, seed: int = 0) -> Trace:
    """As ``benchmarks/bench_planners.py``: bytes log-uniform in 40 B..20 MB, backward up to 3 ms."""
    rng = np.random.default_rng(seed)
    nbytes = (4 * np.exp(rng.uniform(np.log(10), np.log(5e6), layers))).astype(int)
    bwd = rng.uniform(0, 3e-3, layers)
    return Trace("random", 32, "synthetic", "float32",
                 [Layer(f"l{i}", int(n) // 4, int(n), float(b / 2), float(b)) for i, (n, b) in enumerate(zip(nbytes, bwd))])


CASES = {
    "dear_optimal": (lambda: preset("10gbe-derived", 64), {}, "dear_threshold"),
    "omgs_optimal": (lambda: preset("1gbe-allgather", 16), {"density": 0.001}, "omgs"),
}


def _check_valid(plan, trace, cost):
    groups = plan.groups(trace)
    assert sorted(i for g in groups for i in g) == list(range(trace.num_layers))
    assert all(sorted(g) == list(range(min(g), max(g) + 1)) for g in groups)
    assert simulate(trace, plan, cost).iteration_s == pytest.approx(plan.meta["iteration_s"], rel=1e-9)


@pytest.mark.parametrize("planner", sorted(CASES))
def test_a_tiny_budget_on_a_large_trace_returns_in_time_with_a_proven_gap(planner, caplog):
    make_cost, options, heuristic = CASES[planner]
    trace, cost = _random_trace(1000), make_cost()
    budget = 0.02  # the whole search of this trace takes ~0.095 s on a quiet core (0.1 s was a race there)
    with caplog.at_level(logging.WARNING, logger="repro"):
        t0 = time.process_time()
        plan = make_plan(planner, trace, cost, time_budget_s=budget, **options)
        cpu_s = time.process_time() - t0
    assert cpu_s < budget + MARGIN_S
    m = plan.meta
    assert m["optimal"] is False
    assert math.isfinite(m["gap_pct"]) and m["gap_pct"] >= 0
    assert 0 < m["lower_bound_s"] <= m["iteration_s"]
    assert m["gap_pct"] == pytest.approx(100 * (m["iteration_s"] - m["lower_bound_s"]) / m["lower_bound_s"])
    assert plan.solver == planner
    _check_valid(plan, trace, cost)
    assert m["iteration_s"] <= make_plan(heuristic, trace, cost, **options).meta["iteration_s"] + 1e-12
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and planner in r.getMessage()]
    assert len(warnings) == 1 and "time budget" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


@pytest.mark.parametrize("planner", sorted(CASES))
def test_a_finished_search_says_its_plan_is_a_proven_optimum(planner, caplog):
    make_cost, options, heuristic = CASES[planner]
    trace, cost = _random_trace(12, seed=3), make_cost()
    with caplog.at_level(logging.WARNING, logger="repro"):
        plan = make_plan(planner, trace, cost, **options)
    m = plan.meta
    assert m["optimal"] is True and m["gap_pct"] == 0.0 and m["lower_bound_s"] == m["iteration_s"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    _check_valid(plan, trace, cost)
    assert m["iteration_s"] <= make_plan(heuristic, trace, cost, **options).meta["iteration_s"] + 1e-12


@pytest.mark.parametrize("planner", sorted(CASES))
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "10", None, True])
def test_bad_budgets_are_refused_in_one_line(planner, bad):
    make_cost, options, _ = CASES[planner]
    with pytest.raises(ValueError, match=r"time_budget_s must be a finite positive number of seconds") as e:
        make_plan(planner, _random_trace(5), make_cost(), time_budget_s=bad, **options)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("planner", sorted(CASES))
def test_a_long_search_logs_progress_lines(planner, caplog, monkeypatch):
    monkeypatch.setattr(_budget, "PROGRESS_EVERY_S", 0.0)  # a line at every step instead of every 2 s
    make_cost, options, _ = CASES[planner]
    trace = _random_trace(30, seed=1)
    with caplog.at_level(logging.INFO, logger="repro"):
        make_plan(planner, trace, make_cost(), **options)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.getMessage().startswith(planner)]
    assert lines, "no progress line"
    assert all("/30 layers, best " in s and " s, bound " in s for s in lines)


def test_the_budget_check_accepts_numbers_only():
    assert _budget.check_time_budget(3) == 3.0
    assert _budget.check_time_budget(np.float64(0.5)) == 0.5
    for bad in (0.0, -2, math.inf, -math.inf, math.nan, "1", [1], np.bool_(True)):
        with pytest.raises(ValueError, match="time_budget_s"):
            _budget.check_time_budget(bad)
