"""The sparse family's torch-free core: cost, plans, the OMGS timeline model and its planners.

The paper's recursion (omgs.md, "Timeline model") and merge rule are written out here a second
time, naively, and the package's closed form, event-engine graph and planners must match them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from repro.core.cost import CostModel, CostModelError, Linear, fit_topk_gamma, topk_time_s
from repro.costs.presets import preset
from repro.core.plan import Bucket, Message, Plan, PlanError
from repro.core.planners import make_plan, planner_names
from repro.families.sparse.planners import groups_time_s
from repro.core.simulate import simulate
from repro.families.sparse.simulate import message_bytes, topk_count
from repro.core.trace import Layer, Trace

SPARSE = ["topk_layerwise", "topk_single", "omgs", "omgs_optimal"]


def _trace(rng: np.random.Generator, L: int, *, fwd_total_s: float | None = None) -> Trace:
    params = rng.integers(1, 2_000_000, size=L)
    small = rng.random(L) < 0.3
    params[small] = rng.integers(1, 5000, size=int(small.sum()))
    bwd = rng.exponential(0.004, size=L)
    fwd = bwd / 2 if fwd_total_s is None else np.full(L, fwd_total_s / L)
    return Trace("rand", 32, "test", "float32",
                 [Layer(f"l{i}", int(p), int(p) * 4, float(f), float(b))
                  for i, (p, f, b) in enumerate(zip(params, fwd, bwd))])


def _cost(rng: np.random.Generator, P: int = 16) -> CostModel:
    a = float(rng.choice([1e-4, 1e-3, 1e-2]) * rng.uniform(0.5, 2))
    b = float(rng.choice([1e-10, 1e-9, 1e-8]) * rng.uniform(0.5, 2))
    gamma = float(rng.choice([1e-11, 1e-10, 1e-9]) * rng.uniform(0.5, 2))
    return CostModel(P, {"sparse_allgather": Linear(a, b)}).with_topk(gamma)


# ---------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------

def test_topk_cost_is_gamma_d_log2_d_and_the_fit_recovers_gamma():
    assert topk_time_s(2e-10, 1024) == pytest.approx(2e-10 * 1024 * 10)
    assert topk_time_s(2e-10, 1) == 0.0
    d = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    assert fit_topk_gamma(d, 3.3e-10 * d * np.log2(d)) == pytest.approx(3.3e-10)
    noisy = 3.3e-10 * d * np.log2(d) * np.array([1.1, 0.9, 1.05, 0.95, 1.0])
    assert 3.0e-10 < fit_topk_gamma(d, noisy) < 3.6e-10
    with pytest.raises(CostModelError, match="sizes >= 2"):
        fit_topk_gamma([1, 100], [1e-6, 1e-5])


def test_cost_model_carries_topk_through_json_and_says_how_to_get_it():
    c = preset("1gbe-allgather", 16)
    assert c.topk_gamma_s == 2.19e-10  # the paper's P102-100 fit (omgs.md)
    assert CostModel.from_json(c.to_json()) == c
    bare = CostModel(4, {"sparse_allgather": Linear(1e-3, 1e-8)})
    with pytest.raises(CostModelError, match="no top-k cost.*with_topk"):
        bare.topk_s(1000)
    with pytest.raises(CostModelError, match="topk_gamma_s"):
        bare.with_topk(-1.0)


def test_paper_allgather_cost_of_a_sparse_layer():
    """omgs.md: t_c(d) = 2 (a + b * 4 * P * rho * d) for values and indices of float32 gradients."""
    P, rho, d = 16, 0.001, 1_000_000
    c = preset("1gbe-allgather", P)
    a, b = 1.1e-2, 1.7e-8
    tr = Trace("m", 1, "x", "float32", [Layer("w", d, 4 * d, 0.0, 0.01)])
    plan = make_plan("topk_layerwise", tr, c, density=rho)
    assert message_bytes(tr, plan) == [[4 * rho * d, 4 * rho * d]]
    r = simulate(tr, plan, c)
    assert r.comm_s == pytest.approx(2 * (a + b * 4 * P * rho * d))
    packed = make_plan("topk_layerwise", tr, c, density=rho, pack=True)
    assert message_bytes(tr, packed) == [[8 * rho * d]]
    assert simulate(tr, packed, c).comm_s == pytest.approx(a + b * 8 * P * rho * d)


def test_topk_count_is_ceil_of_density_times_elements():
    assert topk_count(1000, 0.001) == 1
    assert topk_count(1001, 0.001) == 2
    assert topk_count(3, 0.001) == 1
    assert topk_count(10, 1.0) == 10
    assert list(topk_count(np.array([0, 5, 2000]), 0.001)) == [0, 1, 2]


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------

def test_sparse_plans_validate_and_round_trip():
    two = (Message("sparse_allgather"),) * 2
    plan = Plan([Bucket(("a", "b"), two), Bucket(("c",), two[:1])], "custom", family="sparse",
                options={"density": 0.01})
    assert Plan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError, match="needs option 'density'"):
        Plan([Bucket(("a",), two)], family="sparse")
    for bad in (0, 0.0, 1.5, -0.1, "0.1", True):
        with pytest.raises(PlanError, match="density"):
            Plan([Bucket(("a",), two)], family="sparse", options={"density": bad})
    with pytest.raises(PlanError, match="one packed message or two"):
        Plan([Bucket(("a",), two + two[:1])], family="sparse", options={"density": 0.1})
    with pytest.raises(PlanError, match="does not send 'allreduce'"):
        Plan([Bucket(("a",))], family="sparse", options={"density": 0.1})
    with pytest.raises(PlanError, match="whole layers"):
        Plan([Bucket(("a",), two, piece=(0, 1))], family="sparse", options={"density": 0.1})
    with pytest.raises(PlanError, match="has no option 'wire_dtype'"):
        Plan([Bucket(("a",), two)], family="sparse", options={"density": 0.1, "wire_dtype": "float16"})


def test_sparse_planners_refuse_bad_input_in_one_line():
    rng = np.random.default_rng(0)
    tr, c = _trace(rng, 5), _cost(rng)
    for name in SPARSE:
        with pytest.raises(ValueError, match="density must be a number in"):
            make_plan(name, tr, c, density=0)
        with pytest.raises(CostModelError, match="no sparse_allgather line"):
            make_plan(name, tr, preset("10gbe-v100", 16), density=0.01)
        with pytest.raises(CostModelError, match="no top-k cost"):
            make_plan(name, tr, CostModel(16, {"sparse_allgather": Linear(1e-3, 1e-9)}), density=0.01)
    assert set(planner_names("sparse")) == set(SPARSE)


# ---------------------------------------------------------------------------------------------
# the timeline model, written out
# ---------------------------------------------------------------------------------------------

def _paper_recursion(t_f: float, t_b, t_s, t_c) -> float:
    """omgs.md, with layers 1..L as list indices 0..L-1 (a merged-away layer has t_b = t_s = t_c = 0):

        tau_b(L) = 0;  tau_s(l) = tau_b(l) + t_b(l);  tau_b(l-1) = tau_s(l) + t_s(l)
        tau_c(L) = tau_s(L) + t_s(L);  tau_c(l) = max(tau_c(l+1) + t_c(l+1), tau_s(l) + t_s(l))
        t_iter = t_f + tau_c(1) + t_c(1)
    """
    L = len(t_b)
    tau_b, tau_s, tau_c = [0.0] * L, [0.0] * L, [0.0] * L
    for l in range(L - 1, -1, -1):
        tau_b[l] = 0.0 if l == L - 1 else tau_s[l + 1] + t_s[l + 1]
        tau_s[l] = tau_b[l] + t_b[l]
        tau_c[l] = tau_s[l] + t_s[l] if l == L - 1 else max(tau_c[l + 1] + t_c[l + 1], tau_s[l] + t_s[l])
    return t_f + tau_c[0] + t_c[0]


def _merged_arrays(trace: Trace, groups, c: CostModel, density: float):
    """Per layer (forward order): a group's totals sit on its input-most layer, the others are 0."""
    from repro.families.sparse.planners import SparseCosts

    sc = SparseCosts(trace, c, density, False)
    L = trace.num_layers
    t_b, t_s, t_c = [0.0] * L, [0.0] * L, [0.0] * L
    p = trace.params()
    for g in groups:
        low = min(g)
        t_b[low] = float(sum(trace.backward_s()[i] for i in g))
        d = float(sum(p[i] for i in g))
        t_s[low], t_c[low] = float(sc.spar_s(d)), float(sc.comm_s(d))
    return t_b, t_s, t_c


@pytest.mark.parametrize("seed", range(40))
def test_closed_form_and_engine_match_the_papers_recursion(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 30))
    tr, c = _trace(rng, L), _cost(rng)
    density = float(rng.choice([0.001, 0.01, 0.1, 1.0]))
    # a random contiguous grouping in backward order
    cuts = sorted(set(rng.integers(1, L, size=int(rng.integers(0, L))).tolist())) if L > 1 else []
    bounds = [0] + cuts + [L]
    groups = [[L - 1 - j for j in range(a, b)] for a, b in zip(bounds[:-1], bounds[1:])]
    two = (Message("sparse_allgather"),) * 2
    plan = Plan([Bucket(tuple(tr.names[i] for i in g), two) for g in groups], family="sparse",
                options={"density": density})
    expected = _paper_recursion(tr.total_forward_s, *_merged_arrays(tr, groups, c, density))
    closed = simulate(tr, plan, c, with_ops=False).iteration_s
    engine = simulate(tr, plan, c)
    assert closed == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert engine.iteration_s == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert groups_time_s(tr, groups, c, density) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # the timeline: top-k on the compute stream right after the bucket's input-most layer
    ops = engine.ops
    compute = [o for o in ops if o.stream == "compute"]
    assert all(a.end_s <= b.start_s + 1e-15 for a, b in zip(compute, compute[1:]))
    assert sum(o.kind == "sparsify" for o in ops) == len(groups)
    assert sum(o.kind == "sparse_allgather" for o in ops) == 2 * len(groups)
    for k, o in enumerate(o for o in compute if o.kind == "sparsify"):
        before = compute[compute.index(o) - 1]
        assert before.kind == "backward" and before.label == tr.names[min(groups[k])]


def test_noncontiguous_buckets_and_priorities_use_the_engine():
    rng = np.random.default_rng(7)
    tr, c = _trace(rng, 6), _cost(rng)
    two = (Message("sparse_allgather"),) * 2
    hi = (Message("sparse_allgather", priority=-1),) * 2
    plan = Plan([Bucket(("l5", "l1"), two), Bucket(("l4", "l3", "l2"), two), Bucket(("l0",), hi)],
                family="sparse", options={"density": 0.01})
    closed = simulate(tr, plan, c, with_ops=False)
    full = simulate(tr, plan, c)
    assert closed.iteration_s == pytest.approx(full.iteration_s)  # priority only matters when contended
    assert full.sparsify_s > 0 and full.compute_s == pytest.approx(full.forward_s + full.backward_s + full.sparsify_s)


# ---------------------------------------------------------------------------------------------
# the planners
# ---------------------------------------------------------------------------------------------

def _paper_rule(trace: Trace, c: CostModel, density: float) -> list[list[int]]:
    """The OMGS rule exactly as omgs.md words it, recomputing every start time from scratch after
    each decision (O(L^2)): merge l into l-1 iff t_w < t_save."""
    from repro.families.sparse.planners import SparseCosts

    sc = SparseCosts(trace, c, density, False)
    L = trace.num_layers
    p = [float(v) for v in trace.params()]
    t_b = [float(v) for v in trace.backward_s()]
    members = [[i] for i in range(L)]
    for l in range(L - 1, 0, -1):
        t_s = [float(sc.spar_s(v)) if v else 0.0 for v in p]
        t_c = [float(sc.comm_s(v)) if v else 0.0 for v in p]
        tau_b, tau_s, tau_c = [0.0] * L, [0.0] * L, [0.0] * L
        for j in range(L - 1, l - 1, -1):
            tau_b[j] = 0.0 if j == L - 1 else tau_s[j + 1] + t_s[j + 1]
            tau_s[j] = tau_b[j] + t_b[j]
            tau_c[j] = tau_s[j] + t_s[j] if j == L - 1 else max(tau_c[j + 1] + t_c[j + 1], tau_s[j] + t_s[j])
        merged = p[l] + p[l - 1]
        t_w = t_b[l - 1] + float(sc.spar_s(merged)) - t_s[l] - t_s[l - 1] - (tau_c[l] - tau_s[l] - t_s[l])
        t_save = t_c[l] + t_c[l - 1] - float(sc.comm_s(merged))
        if t_w < t_save:
            p[l - 1], p[l] = merged, 0.0
            t_b[l - 1], t_b[l] = t_b[l - 1] + t_b[l], 0.0
            members[l - 1] = members[l] + members[l - 1]
            members[l] = []
    return [m for m in reversed(members) if m]


@pytest.mark.parametrize("seed", range(60))
def test_omgs_planner_is_the_published_rule(seed):
    rng = np.random.default_rng(100 + seed)
    tr, c = _trace(rng, int(rng.integers(1, 40))), _cost(rng)
    density = float(rng.choice([0.001, 0.004, 0.05]))
    assert make_plan("omgs", tr, c, density=density).groups(tr) == _paper_rule(tr, c, density)


def _all_contiguous(L: int):
    for mask in range(2 ** (L - 1)):
        cuts = [j for j in range(1, L) if mask >> (j - 1) & 1]
        bounds = [0] + cuts + [L]
        yield [[L - 1 - j for j in range(a, b)] for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("seed", range(80))
def test_omgs_optimal_equals_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    L = int(rng.integers(1, 10))
    tr, c = _trace(rng, L), _cost(rng)
    density = float(rng.choice([0.001, 0.01, 0.1]))
    pack = bool(rng.integers(0, 2))
    best = min(groups_time_s(tr, g, c, density, pack) for g in _all_contiguous(L))
    plan = make_plan("omgs_optimal", tr, c, density=density, pack=pack)
    assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12)
    assert simulate(tr, plan, c).iteration_s == pytest.approx(best, rel=1e-12)


@pytest.mark.slow
def test_omgs_optimal_is_never_worse_on_thousands_of_random_traces():
    rng = np.random.default_rng(2024)
    worse = []
    for trial in range(2000):
        L = int(rng.integers(1, 25))
        tr, c = _trace(rng, L), _cost(rng, P=int(rng.choice([2, 4, 8, 16])))
        density = float(rng.choice([0.001, 0.004, 0.01, 0.1, 1.0]))
        t = {n: make_plan(n, tr, c, density=density).meta["iteration_s"] for n in SPARSE}
        if any(t["omgs_optimal"] > v * (1 + 1e-12) for v in t.values()):
            worse.append((trial, t))
    assert not worse, worse[:3]


def test_sparse_plans_predict_what_the_simulator_says_on_a_shipped_trace():
    from repro.core.trace import load_trace

    tr = load_trace("resnet50_b32_p102-estimate")
    for P in (2, 16):
        c = preset("1gbe-allgather", P)
        for n in SPARSE:
            plan = make_plan(n, tr, c, density=0.001)
            assert plan.family == "sparse" and plan.option("density") == 0.001
            assert plan.meta["iteration_s"] == pytest.approx(simulate(tr, plan, c).iteration_s, rel=1e-12)
            assert sorted(i for g in plan.groups(tr) for i in g) == list(range(tr.num_layers))
    # (the planners' speed is a benchmark, benchmarks/bench_omgs.py, not a timed test)


def test_layerwise_and_single_are_what_their_names_say():
    rng = np.random.default_rng(3)
    tr, c = _trace(rng, 7), _cost(rng)
    lw = make_plan("topk_layerwise", tr, c, density=0.01)
    single = make_plan("topk_single", tr, c, density=0.01)
    assert lw.groups(tr) == [[i] for i in reversed(range(7))]
    assert single.groups(tr) == [list(reversed(range(7)))]
    assert all(len(b.messages) == 2 for b in lw.buckets)
    assert math.isclose(single.meta["iteration_s"],
                        tr.total_forward_s + tr.total_backward_s + float(c.topk_s(int(tr.params().sum())))
                        + 2 * float(c.sparse_allgather_s(4 * topk_count(int(tr.params().sum()), 0.01))),
                        rel_tol=1e-12)


def test_every_sparse_planner_plan_is_a_sparse_family_plan():
    rng = np.random.default_rng(11)
    tr, c = _trace(rng, 12), _cost(rng)
    for name in SPARSE:
        plan = make_plan(name, tr, c, density=0.004)
        assert Plan.from_json(plan.to_json()) == plan
    assert len(list(_all_contiguous(4))) == 8  # the brute force enumerates 2^(L-1) groupings
