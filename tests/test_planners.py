import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.core.cost import CostModel
from repro.costs.presets import preset
from repro.core.paths import shipped_traces
from repro.core.planners import make_plan, planner_names
from repro.families.allreduce.planners import groups_time_s
from repro.core.trace import load_trace
from tests.helpers import make_trace, random_trace


def brute_force_best_s(trace, cost):
    """Minimum over all 2^(L-1) contiguous groupings."""
    L = trace.num_layers
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=L - 1):
        groups, cur = [], [0]
        for i, cut in enumerate(cuts, start=1):
            if cut:
                groups.append(cur)
                cur = []
            cur.append(i)
        groups.append(cur)
        best = min(best, groups_time_s(trace, groups[::-1], cost))
    return best


def _cost(rng):
    return CostModel.linear(8, float(rng.choice([0, 1e-5, 1e-4, 1e-3, 5e-3])), float(rng.uniform(1e-10, 3e-9)))


def test_optimal_equals_brute_force_on_small_traces(rng):
    for _ in range(150):
        trace = random_trace(rng, int(rng.integers(1, 10)))
        cost = _cost(rng)
        opt = make_plan("optimal", trace, cost)
        assert opt.meta["iteration_s"] == pytest.approx(brute_force_best_s(trace, cost), rel=1e-12)


def test_all_planners_cover_every_layer_in_communication_order(rng):
    trace = random_trace(rng, 25)
    cost = _cost(rng)
    for name in planner_names("allreduce"):
        plan = make_plan(name, trace, cost)
        groups = plan.groups(trace)
        assert sorted(i for g in groups for i in g) == list(range(25))
        heads = [min(g) for g in groups]
        assert heads == sorted(heads, reverse=True), name  # output side first
        assert all(sorted(g) == list(range(min(g), max(g) + 1)) for g in groups), name  # contiguous


def test_wfbp_syncea_threshold_shapes(rng):
    trace = make_trace([1e-3] * 6, [100, 200, 300, 400, 500, 600])
    cost = CostModel.linear(4, 1e-4, 1e-9)
    assert make_plan("wfbp", trace, cost).num_buckets == 6
    assert make_plan("syncea", trace, cost).num_buckets == 1
    assert make_plan("threshold", trace, cost, threshold_bytes=0).groups(trace) == [[i] for i in range(5, -1, -1)]
    assert make_plan("threshold", trace, cost, threshold_bytes=10**9).num_buckets == 1
    # backward order: 600+500 >= 900 | 400+300+200 >= 900 | 100
    assert make_plan("threshold", trace, cost, threshold_bytes=900).groups(trace) == [[5, 4], [3, 2, 1], [0]]
    with pytest.raises(ValueError, match="unknown solver 'nope'"):
        make_plan("nope", trace, cost)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_property_optimal_is_best_and_mgwfbp_beats_both_extremes(data):
    L = data.draw(st.integers(1, 40), label="layers")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, L)
    cost = _cost(rng)
    times = {name: make_plan(name, trace, cost).meta["iteration_s"] for name in planner_names("allreduce")}
    eps = 1e-12 * max(times.values())
    assert all(times["optimal"] <= t + eps for t in times.values()), times
    assert times["mgwfbp"] <= min(times["wfbp"], times["syncea"]) + eps, times


@pytest.mark.slow
def test_mgwfbp_never_worse_than_wfbp_or_syncea_on_thousands_of_traces():
    rng = np.random.default_rng(7)
    worse = 0
    for _ in range(2000):
        trace = random_trace(rng, int(rng.integers(2, 60)))
        cost = _cost(rng)
        t = {n: make_plan(n, trace, cost).meta["iteration_s"] for n in ("wfbp", "syncea", "mgwfbp")}
        worse += t["mgwfbp"] > min(t["wfbp"], t["syncea"]) * (1 + 1e-12)
    assert worse == 0


def test_mgwfbp_merges_when_the_next_gradient_arrives_within_one_startup():
    # l1 is ready 0.5 ms after l2's all-reduce could start; a = 1 ms -> merge. b = 0.
    trace = make_trace([0.5e-3, 10e-3], [4, 4])
    assert make_plan("mgwfbp", trace, CostModel.linear(2, 1e-3, 0)).num_buckets == 1
    # a = 0.1 ms: waiting 0.5 ms costs more than a start-up -> keep separate
    assert make_plan("mgwfbp", trace, CostModel.linear(2, 1e-4, 0)).num_buckets == 2


@pytest.mark.parametrize("stem", [s for s in shipped_traces() if "estimate" in s][:3])
def test_planners_on_shipped_traces(stem):
    trace = load_trace(stem)
    cost = preset("10gbe-v100", 16)
    t = {n: make_plan(n, trace, cost).meta["iteration_s"] for n in planner_names("allreduce")}
    assert t["optimal"] <= t["mgwfbp"] * (1 + 1e-12) <= min(t["wfbp"], t["syncea"]) * (1 + 1e-12)


def test_ddp_plan_has_a_small_first_bucket():
    trace = make_trace([1e-3] * 8, [600_000] * 8)
    plan = make_plan("ddp_buckets", trace, CostModel.linear(2, 1e-4, 1e-9), first_bucket_bytes=1_000_000,
                     bucket_bytes=2_000_000)
    assert plan.groups(trace) == [[7, 6], [5, 4, 3, 2], [1, 0]]


def test_a_planner_registered_from_another_module_has_a_family_and_a_name(monkeypatch, rng):
    import types

    from repro.core.planners import PLANNER_FAMILY, PLANNERS, make_plan, planner_names

    outside = types.ModuleType("someone_elses_planners")
    outside.FAMILY = "allreduce"

    def every_layer_alone(trace, cost, **options):
        return PLANNERS["wfbp"](trace, cost, **options)

    every_layer_alone.__module__ = outside.__name__
    monkeypatch.setitem(__import__("sys").modules, outside.__name__, outside)
    monkeypatch.setitem(PLANNERS, "every_layer_alone", every_layer_alone)
    assert PLANNER_FAMILY["every_layer_alone"] == "allreduce"
    assert "every_layer_alone" in planner_names("allreduce") and "every_layer_alone" not in planner_names("ps")
    trace = random_trace(rng, 6)
    assert make_plan("every_layer_alone", trace, _cost(rng)).buckets == make_plan("wfbp", trace, _cost(rng)).buckets
    nameless = lambda trace, cost, **o: None  # noqa: E731
    monkeypatch.setitem(PLANNERS, "nameless", nameless)
    with pytest.raises(KeyError, match="names no family"):
        PLANNER_FAMILY["nameless"]
