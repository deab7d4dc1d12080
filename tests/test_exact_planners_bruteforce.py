"""The exact planners' pruning rules against brute force on awkward traces.

``dear_optimal`` normalises its labels, uses a dominance with slack and a reduce-scatter bound
(``_least_rs_end``); ``omgs_optimal`` bounds by the number of remaining groups and retires states.
Parameter-free layers (zero bytes: no message, no start-up), equal layers (ties) and overheads are
where such rules break first, so they are checked here over every contiguous bucketing.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from repro.cost import CostModel, Linear
from repro.planners import dear, make_plan, sparse
from repro.planners.dear import groups_period_s
from repro.planners.sparse import groups_time_s
from repro.trace import Layer, Overheads, Trace


def _layers(rng, L, zero_frac=0.3, equal=False):
    params = rng.integers(1, 3_000_000, size=L)
    params[rng.random(L) < zero_frac] = 0
    if equal:
        params[:] = params[0]
    small = rng.random(L) < 0.3
    params[small & (params > 0)] = rng.integers(1, 3000, size=int((small & (params > 0)).sum()))
    bwd = rng.uniform(1e-5, 4e-3, L)
    if equal:
        bwd[:] = bwd[0]
    return params, bwd


def _dear_trace(rng, L, equal=False):
    params, bwd = _layers(rng, L, equal=equal)
    o = Overheads(float(rng.uniform(0, 2e-3)), float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 3e-3))) \
        if rng.random() < 0.5 else Overheads()
    return Trace("edge", 1, "test", "float32",
                 [Layer(f"l{i}", int(p), 4 * int(p), float(b / 2), float(b)) for i, (p, b) in enumerate(zip(params, bwd))],
                 overheads=o)


def _dear_cost(rng):
    line = lambda: Linear(float(rng.uniform(1e-5, 3e-3)), float(rng.uniform(1e-11, 1e-9)))  # noqa: E731
    return CostModel(8, {"reduce_scatter": line(), "allgather": line(), "allreduce": line()})


def _bounds(L):
    for r in range(L):
        for cuts in itertools.combinations(range(1, L), r):
            yield (0, *cuts, L)


@pytest.mark.parametrize("equal", [False, True])
@pytest.mark.parametrize("stall_table", [True, False])  # False: the cheaper bound used beyond STALL_LAYERS
def test_dear_optimal_matches_brute_force_with_parameter_free_and_equal_layers(equal, stall_table, monkeypatch):
    if not stall_table:
        monkeypatch.setattr(dear, "STALL_LAYERS", 0)
    rng = np.random.default_rng(31 + equal)
    for _ in range(60):
        L = int(rng.integers(1, 10))
        tr, cost = _dear_trace(rng, L, equal), _dear_cost(rng)
        best = min(groups_period_s(tr, [list(range(a, b)) for a, b in zip(bd[:-1], bd[1:])], cost) for bd in _bounds(L))
        plan = make_plan("dear_optimal", tr, cost)
        assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12)
        assert plan.meta["optimal"] is True


def test_dear_optimal_does_not_depend_on_its_heuristic_pass(monkeypatch):
    rng = np.random.default_rng(5)
    for _ in range(8):
        tr, cost = _dear_trace(rng, int(rng.integers(20, 50))), _dear_cost(rng)
        got = []
        for beam in (1, 8, 10_000):
            monkeypatch.setattr(dear, "BEAM", beam)
            got.append(make_plan("dear_optimal", tr, cost).meta["iteration_s"])
        assert got[0] == pytest.approx(got[1], rel=1e-12) and got[1] == pytest.approx(got[2], rel=1e-12)


def test_least_rs_end_is_the_least_over_every_bucketing():
    rng = np.random.default_rng(8)
    for _ in range(40):
        L = int(rng.integers(1, 9))
        tr, cost = _dear_trace(rng, L), _dear_cost(rng)
        model = dear._Model(tr, cost)
        W = dear._least_rs_end(model)
        for j in range(L):
            ends = []
            for bd in _bounds(L - j):
                b = [j + x for x in bd]
                rs = np.atleast_1d(model.rs(model.cum_n[b[1:]] - model.cum_n[b[:-1]]))
                ends.append(max(model.ready[b[k]] + rs[:k + 1].sum() for k in range(len(b) - 1)))
            assert W[j] == pytest.approx(min(ends), rel=1e-12, abs=1e-15)


def _sparse_trace(rng, L, equal=False):
    params, bwd = _layers(rng, L, equal=equal)
    return Trace("edge", 32, "test", "float32",
                 [Layer(f"l{i}", int(p), 4 * int(p), float(b / 2), float(b)) for i, (p, b) in enumerate(zip(params, bwd))])


def _sparse_cost(rng):
    a = float(rng.choice([1e-4, 1e-3, 1e-2]) * rng.uniform(0.5, 2))
    b = float(rng.choice([1e-10, 1e-9, 1e-8]) * rng.uniform(0.5, 2))
    return CostModel(int(rng.choice([2, 16])), {"sparse_allgather": Linear(a, b)}).with_topk(
        float(rng.choice([1e-11, 1e-10, 1e-9])))


@pytest.mark.parametrize("equal", [False, True])
@pytest.mark.parametrize("window", [64, 1, 2])  # 1, 2: the count bound's long-group (split) bound is used
def test_omgs_optimal_matches_brute_force_with_parameter_free_and_equal_layers(equal, window, monkeypatch):
    monkeypatch.setattr(sparse, "COUNT_WINDOW", window)
    rng = np.random.default_rng(41 + equal + 2 * window)
    for _ in range(60):
        L = int(rng.integers(1, 10))
        tr, cost = _sparse_trace(rng, L, equal), _sparse_cost(rng)
        density, pack = float(rng.choice([0.001, 0.01, 0.1, 1.0])), bool(rng.integers(0, 2))
        best = min(groups_time_s(tr, [[L - 1 - j for j in range(a, b)] for a, b in zip(bd[:-1], bd[1:])], cost,
                                 density, pack) for bd in _bounds(L))
        plan = make_plan("omgs_optimal", tr, cost, density=density, pack=pack)
        assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12)
        assert plan.meta["optimal"] is True


def test_omgs_optimal_does_not_depend_on_its_rounds_or_its_bound(monkeypatch):
    """The first round's upper bound (just above the root's bound, or far above it), the count bound
    (used, or not: COUNT_MAX_GROUPS 0) and its window change the work, never the optimum."""
    rng = np.random.default_rng(6)
    for _ in range(8):
        tr, cost = _sparse_trace(rng, int(rng.integers(20, 40))), _sparse_cost(rng)
        got = []
        for step, most, window in ((1e-6, 256, 64), (1e-9, 256, 3), (0.5, 256, 64), (1e-6, 0, 64)):
            monkeypatch.setattr(sparse, "FIRST_STEP", step)
            monkeypatch.setattr(sparse, "COUNT_MAX_GROUPS", most)
            monkeypatch.setattr(sparse, "COUNT_WINDOW", window)
            plan = make_plan("omgs_optimal", tr, cost, density=0.01)
            assert plan.meta["optimal"] is True
            got.append(plan.meta["iteration_s"])
        assert all(g == pytest.approx(got[0], rel=1e-12) for g in got)
