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

from repro.core.cost import CostModel, Linear
from repro.core.planners import make_plan
from repro.families.dear import planners as dear
from repro.families.sparse import planners as sparse
from repro.families.dear.planners import groups_period_s
from repro.families.sparse.planners import groups_time_s
from repro.core.trace import Layer, Overheads, Trace


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
# (DIVE_WIDTH, DIVE_EVERY): the default; a one-label dive at every position; no dive (threshold incumbent)
@pytest.mark.parametrize("dives", [(16, 4000), (1, 0), (0, 1)])
def test_dear_optimal_matches_brute_force_with_parameter_free_and_equal_layers(equal, stall_table, dives,
                                                                               monkeypatch):
    if not stall_table:
        monkeypatch.setattr(dear, "STALL_LAYERS", 0)
    monkeypatch.setattr(dear, "DIVE_WIDTH", dives[0])
    monkeypatch.setattr(dear, "DIVE_EVERY", dives[1])
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
        for width, every in ((1, 1), (16, 4000), (10_000, 10), (2, 0), (0, 1)):  # width 0: no dive at all
            monkeypatch.setattr(dear, "DIVE_WIDTH", width)
            monkeypatch.setattr(dear, "DIVE_EVERY", every)
            got.append(make_plan("dear_optimal", tr, cost).meta["iteration_s"])
        assert all(g == pytest.approx(got[0], rel=1e-12) for g in got)


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


@pytest.mark.parametrize("stall_table", [True, False])  # False: the cheaper bound used beyond STALL_LAYERS
def test_stall_table_is_the_least_forward_stall_over_every_bucketing(stall_table, monkeypatch):
    """``_Stalls.least(j, t)``: the least ``(T_ag(first) - t)^+ + sum_k (T_ag(bucket k+1) - c_k)^+`` over
    every bucketing of layers j..L-1; ``after(i, j)``: that after the bucket [i, j) itself;
    ``suffix(i)[w - i - 1]``: its least after a bucket [i, w') with w' >= w. A table too high (a bound
    that is not one) or too low fails here; beyond STALL_LAYERS they only have to be lower bounds."""

    def check(got, want):
        got, want = np.atleast_1d(np.asarray(got, dtype=float)), np.atleast_1d(np.asarray(want, dtype=float))
        if stall_table:
            assert np.allclose(got, want, rtol=1e-9, atol=1e-15)
        else:
            assert np.all(got <= want * (1 + 1e-9) + 1e-15)

    if not stall_table:
        monkeypatch.setattr(dear, "STALL_LAYERS", 0)
    rng = np.random.default_rng(12)
    for _ in range(40):
        L = int(rng.integers(1, 9))
        tr, cost = _dear_trace(rng, L), _dear_cost(rng)
        model = dear._Model(tr, cost)
        stalls = dear._Stalls(model)
        ag = lambda x, y: float(model.ag(model.cum_n[y] - model.cum_n[x]))  # noqa: E731
        comp = lambda x, y: float(model.cum_c[y] - model.cum_c[x])  # noqa: E731

        def least(j, t):
            out = []
            for bd in _bounds(L - j):
                b = [j + x for x in bd]
                st, prev = 0.0, t
                for x, y in zip(b[:-1], b[1:]):
                    st += max(ag(x, y) - prev, 0.0)
                    prev = comp(x, y)
                out.append(st)
            return min(out)

        for j in range(L):
            for t in [0.0, *rng.uniform(0, 0.01, 3), *(comp(i, j) for i in range(j))]:
                check(stalls.least(np.array([j]), np.array([t])), least(j, t))
        assert float(stalls.least(np.array([L]), np.array([0.5]))[0]) == 0.0  # nothing left to stall
        for i in range(L):  # after(i, j): the least stall after the bucket [i, j) itself
            got = stalls.after(i, np.arange(i + 1, L + 1))
            want = [least(w, comp(i, w)) if w < L else 0.0 for w in range(i + 1, L + 1)]
            check(got, want)
        for i in range(L):
            want = [least(w, comp(i, w)) if w < L else 0.0 for w in range(i + 1, L + 1)]
            want = np.minimum.accumulate(np.array(want)[::-1])[::-1]
            check(stalls.suffix(i), want)


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


def test_omgs_optimal_with_rounds_aborted_everywhere_matches_brute_force(monkeypatch):
    """Rounds that store too many states are aborted (they prove nothing) and tried again closer to the
    proven bound with twice the room: with a room of one state after every round that finds nothing,
    and first upper bounds just above the root's bound, the optimum is still found and proven."""
    monkeypatch.setattr(sparse, "FIRST_STEP", 1e-12)
    monkeypatch.setattr(sparse, "ABORT_STATES", 0)
    monkeypatch.setattr(sparse, "ABORT_MIN_STATES", 0)
    aborted = []
    rounds = sparse._omgs_round

    def counted(*args, **kwargs):
        out = rounds(*args, **kwargs)
        aborted.append(out[0] == "aborted")
        return out

    monkeypatch.setattr(sparse, "_omgs_round", counted)
    rng = np.random.default_rng(77)
    for _ in range(60):
        L = int(rng.integers(2, 10))
        tr, cost = _sparse_trace(rng, L), _sparse_cost(rng)
        density, pack = float(rng.choice([0.001, 0.01, 0.1, 1.0])), bool(rng.integers(0, 2))
        best = min(groups_time_s(tr, [[L - 1 - j for j in range(a, b)] for a, b in zip(bd[:-1], bd[1:])], cost,
                                 density, pack) for bd in _bounds(L))
        plan = make_plan("omgs_optimal", tr, cost, density=density, pack=pack)
        assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12)
        assert plan.meta["optimal"] is True
    assert sum(aborted) > 20


def test_omgs_optimal_does_not_depend_on_its_rounds_or_its_bound(monkeypatch):
    """The first round's upper bound (just above the root's bound, or far above it), the count bound
    (used, or not: COUNT_MAX_GROUPS 0) and its window change the work, never the optimum."""
    rng = np.random.default_rng(6)
    for _ in range(8):
        tr, cost = _sparse_trace(rng, int(rng.integers(20, 40))), _sparse_cost(rng)
        got = []
        for step, most, window, room in ((1e-6, 256, 64, 8), (1e-9, 256, 3, 8), (0.5, 256, 64, 8), (1e-6, 0, 64, 8),
                                         (1e-9, 256, 64, 0)):  # room 0: rounds aborted (ABORT_STATES)
            monkeypatch.setattr(sparse, "ABORT_STATES", room)
            monkeypatch.setattr(sparse, "ABORT_MIN_STATES", room)
            monkeypatch.setattr(sparse, "FIRST_STEP", step)
            monkeypatch.setattr(sparse, "COUNT_MAX_GROUPS", most)
            monkeypatch.setattr(sparse, "COUNT_WINDOW", window)
            plan = make_plan("omgs_optimal", tr, cost, density=0.01)
            assert plan.meta["optimal"] is True
            got.append(plan.meta["iteration_s"])
        assert all(g == pytest.approx(got[0], rel=1e-12) for g in got)


def _sparse_final_M(c, pB, tbB, C, M, cuts):
    """(C, M) after groups ``cuts`` (backward positions) from the state (C, M), as the search steps."""
    spar, comm = c.fast()
    for a, b in zip(cuts[:-1], cuts[1:]):
        d = float(pB[a:b].sum())
        C = C + float(tbB[a:b].sum()) + float(spar(d))
        M = max(M, C) + float(comm(d))
    return C, M


@pytest.mark.parametrize("window", [64, 1])
def test_the_count_bound_is_below_every_completion(window, monkeypatch):
    """omgs_optimal's count bound at every prefix of every grouping is at most the best completion's
    final M (brute force over all completions), also with its long-group split bound (window 1)."""
    monkeypatch.setattr(sparse, "COUNT_WINDOW", window)
    monkeypatch.setattr(sparse, "COUNT_MAX_GROUPS", 10**15)  # built for an upper bound of 1e9 s (every count)
    rng = np.random.default_rng(12 + window)
    checked = 0
    for _ in range(25):
        L = int(rng.integers(1, 8))
        tr, cost = _sparse_trace(rng, L, equal=bool(rng.random() < 0.2)), _sparse_cost(rng)
        density, pack = float(rng.choice([0.001, 0.1, 1.0])), bool(rng.integers(0, 2))
        c = sparse.SparseCosts(tr, cost, density, pack)
        pB, tbB = tr.params().astype(float)[::-1], tr.backward_s()[::-1]
        cumP, cumT = np.concatenate([[0.0], np.cumsum(pB)]), np.concatenate([[0.0], np.cumsum(tbB)])
        cumS = np.concatenate([[0.0], np.cumsum(np.atleast_1d(c.spar_s(pB)))])
        bound = sparse._CountBound(c, cumP, cumT, cumS, pB, upper=1e9)
        if not bound.usable:
            continue
        for bd in _bounds(L):
            for k in range(1, len(bd) - 1):  # the state after the first k groups
                C, M = _sparse_final_M(c, pB, tbB, 0.0, 0.0, bd[:k + 1])
                f = bd[k]
                best = min(_sparse_final_M(c, pB, tbB, C, M, [f + x for x in rest])[1] for rest in _bounds(L - f))
                assert float(bound(np.array([C]), np.array([M]), f)[0]) <= best * (1 + 1e-12)
                checked += 1
    assert checked > 100


def test_exact_planners_on_degenerate_traces():
    """One layer, only parameter-free layers, identical layers, a zero start-up (the count bound is
    not usable then): both exact planners equal brute force."""
    def trace(params, bwd):
        return Trace("edge", 32, "test", "float32", [Layer(f"l{i}", int(p), 4 * int(p), float(b / 2), float(b))
                                                     for i, (p, b) in enumerate(zip(params, bwd))])
    cases = [trace([1000], [1e-3]), trace([0, 0, 0], [1e-3, 2e-3, 0.0]), trace([5000] * 7, [1e-3] * 7),
             trace([0, 300000, 0, 0, 20, 0], [1e-3, 3e-3, 0.0, 1e-4, 2e-3, 5e-4])]
    sparse_costs = [CostModel(16, {"sparse_allgather": Linear(1e-3, 1e-9)}).with_topk(1e-10),
                    CostModel(2, {"sparse_allgather": Linear(0.0, 1e-9)}).with_topk(1e-10)]
    dear_cost = CostModel(8, {"reduce_scatter": Linear(1e-3, 1e-9), "allgather": Linear(1e-3, 1e-9),
                              "allreduce": Linear(1e-3, 1e-9)})
    for tr in cases:
        L = tr.num_layers
        for cost in sparse_costs:
            for pack in (False, True):
                best = min(groups_time_s(tr, [[L - 1 - j for j in range(a, b)] for a, b in zip(bd[:-1], bd[1:])],
                                         cost, 0.01, pack) for bd in _bounds(L))
                plan = make_plan("omgs_optimal", tr, cost, density=0.01, pack=pack)
                assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12) and plan.meta["optimal"] is True
        best = min(groups_period_s(tr, [list(range(a, b)) for a, b in zip(bd[:-1], bd[1:])], dear_cost)
                   for bd in _bounds(L))
        plan = make_plan("dear_optimal", tr, dear_cost)
        assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12) and plan.meta["optimal"] is True
