"""The DeAR, ByteScheduler and Horovod models of the torch-free core, against dear.md written out."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from repro.core.cost import CostModel, Linear
from repro.costs.presets import preset
from repro.core.plan import Bucket, Message, Plan, PlanError
from repro.core.planners import make_plan
from repro.families.dear.planners import DEAR_MESSAGES, dear_plan, groups_period_s, threshold_groups, threshold_sweep
from repro.core.simulate import simulate
from repro.families.allreduce.simulate import cycle_release_s
from repro.core.engine import Task, run_tasks
from repro.core.trace import Layer, Overheads, Trace


def _T(name, layers, overheads=None) -> Trace:
    return Trace(name, 1, "test", "float32", [_L(*l) for l in layers], overheads=overheads or Overheads())


def _L(name, params, forward_s, backward_s) -> Layer:
    return Layer(name, int(params), 4 * int(params), float(forward_s), float(backward_s))


def _trace(rng, L, overheads=False) -> Trace:
    layers = [(f"l{i}", int(rng.integers(1, 4_000_000)), float(rng.uniform(1e-4, 5e-3)),
               float(rng.uniform(1e-4, 8e-3))) for i in range(L)]
    o = Overheads(float(rng.uniform(0, 2e-3)), float(rng.uniform(0, 1e-3)), float(rng.uniform(0, 3e-3))) \
        if overheads else Overheads()
    return _T("random", layers, o)


def _cost(rng, P=8) -> CostModel:
    return CostModel(P, {"allreduce": Linear(float(rng.uniform(1e-5, 5e-3)), float(rng.uniform(1e-11, 2e-9))),
                         "reduce_scatter": Linear(float(rng.uniform(1e-5, 3e-3)), float(rng.uniform(1e-11, 1e-9))),
                         "allgather": Linear(float(rng.uniform(1e-5, 3e-3)), float(rng.uniform(1e-11, 1e-9)))})


def _random_groups(rng, L):
    cuts = sorted(rng.choice(np.arange(1, L), size=int(rng.integers(0, L)), replace=False).tolist()) if L > 1 else []
    bounds = [0, *cuts, L]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


def dear_md_period(trace: Trace, groups, cost: CostModel) -> float:
    """dear.md's "Timeline model", written out independently of repro.families.dear.simulate."""
    f, b, n, p = trace.forward_s(), trace.backward_s(), trace.bytes(), trace.params()
    o = trace.overheads
    K = len(groups)
    fk = [sum(f[i] for i in g) for g in groups]
    nk = [sum(n[i] for i in g) for g in groups]
    uk = [o.update_s * sum(p[i] for i in g) / p.sum() for g in groups]
    # backward: r_k = sum_{j >= first layer of bucket k} b_j; RS stream from k = K..1
    r = [sum(b[min(g):]) for g in groups]
    e = [0.0] * (K + 1)
    for k in range(K - 1, -1, -1):
        s_k = max(r[k], e[k + 1])
        e[k] = s_k + cost.reduce_scatter_s(nk[k])
    T_B = max(sum(b), e[0])
    # next forward, from the barrier (time 0): g_1 = T_ag(n_1), phi_1 = max(pre, g_1)
    phi = max(o.pre_forward_s, cost.allgather_s(nk[0]))
    for k in range(K - 1):
        g_next = phi + cost.allgather_s(nk[k + 1])
        phi = max(phi + uk[k] + fk[k], g_next)
    forward_end = phi + uk[-1] + fk[-1]
    return forward_end + T_B + o.straggler_s


@pytest.mark.parametrize("overheads", [False, True])
def test_dear_period_matches_dear_md_and_the_event_engine(overheads):
    rng = np.random.default_rng(1 if overheads else 0)
    for _ in range(150):
        L = int(rng.integers(1, 12))
        tr, cost = _trace(rng, L, overheads), _cost(rng)
        groups = _random_groups(rng, L)
        plan = dear_plan(tr, groups, cost, "custom")
        want = dear_md_period(tr, groups, cost)
        closed = simulate(tr, plan, cost, with_ops=False).iteration_s
        engine = simulate(tr, plan, cost).iteration_s
        assert closed == pytest.approx(want, rel=1e-12, abs=1e-15)
        assert engine == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert plan.meta["iteration_s"] == pytest.approx(want, rel=1e-12)


def test_dear_timeline_has_rs_under_backward_and_ag_before_each_bucket_forward():
    rng = np.random.default_rng(3)
    tr, cost = _trace(rng, 6), _cost(rng)
    groups = [[0, 1], [2, 3, 4], [5]]
    ops = simulate(tr, dear_plan(tr, groups, cost, "custom"), cost).ops
    rs = [op for op in ops if op.kind == "reduce_scatter"]
    ag = [op for op in ops if op.kind == "allgather"]
    assert len(rs) == len(ag) == 2 * len(groups)  # two iterations
    fwd = [op for op in ops if op.kind == "forward"]
    # iteration 2: every layer's forward starts after its bucket's all-gather ended
    second = fwd[6:]
    for k, g in enumerate(groups):
        for i in g:
            assert second[i].start_s >= ag[3 + k].end_s - 1e-12
    # reduce-scatters never overlap each other or the all-gathers (one stream)
    comm = sorted(rs + ag, key=lambda op: op.start_s)
    assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(comm, comm[1:]))


def test_dear_buckets_must_be_contiguous_in_forward_order():
    rng = np.random.default_rng(4)
    tr, cost = _trace(rng, 4), _cost(rng)
    backward_order = [Bucket(("l2", "l3"), DEAR_MESSAGES), Bucket(("l0", "l1"), DEAR_MESSAGES)]
    with pytest.raises(PlanError, match="forward order"):
        simulate(tr, Plan(backward_order, family="dear"), cost)
    with pytest.raises(PlanError, match="reduce_scatter then a next_forward"):
        Plan([Bucket(("l0", "l1", "l2", "l3"), (Message("reduce_scatter"),))], family="dear")
    with pytest.raises(PlanError, match="no 'allreduce'|does not send 'allreduce'"):
        Plan([Bucket(("l0", "l1", "l2", "l3"))], family="dear")


def test_threshold_rule_closes_before_reaching_the_threshold():
    nbytes = [10, 20, 5, 40, 1, 1]
    assert threshold_groups(nbytes, 0) == [[0], [1], [2], [3], [4], [5]]
    assert threshold_groups(nbytes, 31) == [[0, 1], [2], [3], [4, 5]]   # 10+20 = 30 < 31; 30+5 >= 31
    assert threshold_groups(nbytes, 30) == [[0], [1, 2], [3], [4, 5]]   # 10+20 reaches 30
    assert threshold_groups(nbytes, 10**9) == [[0, 1, 2, 3, 4, 5]]
    for t in range(0, 80):
        for g in threshold_groups(nbytes, t):
            assert len(g) == 1 or sum(nbytes[i] for i in g) < t


def test_threshold_sweep_lists_every_distinct_bucketing_once():
    rng = np.random.default_rng(5)
    for _ in range(30):
        L = int(rng.integers(1, 9))
        tr = _T("t", [(f"l{i}", int(rng.integers(1, 50)), 1e-3, 1e-3) for i in range(L)])
        nbytes = np.rint(tr.bytes()).astype(int)
        brute = {}
        for t in range(0, int(nbytes.sum()) + 3):
            brute.setdefault(tuple(map(tuple, threshold_groups(nbytes, t))), t)
        swept = [(t, tuple(map(tuple, g))) for t, g in threshold_sweep(tr)]
        assert len({g for _, g in swept}) == len(swept)
        assert {g: t for t, g in swept} == brute  # same bucketings, each at its smallest threshold


def test_dear_model_is_the_best_threshold_bucketing():
    rng = np.random.default_rng(6)
    for _ in range(20):
        L = int(rng.integers(2, 14))
        tr, cost = _trace(rng, L), _cost(rng)
        plan = make_plan("dear_model", tr, cost)
        best = min(groups_period_s(tr, g, cost) for _, g in threshold_sweep(tr))
        assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12)
        assert simulate(tr, plan, cost).iteration_s == pytest.approx(best, rel=1e-9)
        fixed = make_plan("dear_threshold", tr, cost, threshold_bytes=int(rng.integers(1, 2**25)))
        assert plan.meta["iteration_s"] <= fixed.meta["iteration_s"] + 1e-12


def test_dear_vs_wfbp_written_out():
    # dear.md's point: with RS + AG = AR, DeAR takes the all-gather half off backward's critical path.
    tr = _T("t", [(f"l{i}", 1_000_000, 4e-3, 4e-3) for i in range(8)])  # 4 MB per layer

    def costs(ar_a, ar_b):
        return CostModel(16, {"allreduce": Linear(ar_a, ar_b), "reduce_scatter": Linear(ar_a / 2, ar_b / 2),
                              "allgather": Linear(ar_a / 2, ar_b / 2)})

    # communication-bound (AR 6 ms per layer > 4 ms backward): WFBP's all-reduces queue up after backward
    # (first ready at 4 ms, then 8 x 6 ms); DeAR's 3 ms halves hide behind 4 ms of backward and of forward,
    # only AG(1) before the forward and RS(1) after backward stay exposed
    cost = costs(1e-3, 1.25e-9)
    assert make_plan("wfbp", tr, cost).meta["iteration_s"] == pytest.approx(32e-3 + 4e-3 + 8 * 6e-3)
    assert make_plan("dear_nofusion", tr, cost).meta["iteration_s"] == pytest.approx(3e-3 + 32e-3 + 32e-3 + 3e-3)
    # communication-light (AR 1.1 ms): WFBP exposes only the input layer's all-reduce, DeAR its two halves:
    # the same time
    cost = costs(1e-4, 2.5e-10)
    assert make_plan("wfbp", tr, cost).meta["iteration_s"] == pytest.approx(64e-3 + 1.1e-3)
    assert make_plan("dear_nofusion", tr, cost).meta["iteration_s"] == pytest.approx(64e-3 + 1.1e-3)


def test_ring_halves_on_the_dear_presets():
    for name in ("10gbe-dear64", "56gbib-dear64"):
        c = preset(name, 64)
        for n in (1e3, 1e6, 1e8):
            assert c.reduce_scatter_s(n) + c.allgather_s(n) == pytest.approx(c.allreduce_s(n))
    d = preset("10gbe-dear-derived", 64)
    assert d.allreduce_s(1e8) == pytest.approx(preset("10gbe-dear64", 64).allreduce_s(1e8))


# ---- ByteScheduler ---------------------------------------------------------------------------------

def test_bytescheduler_plan_partitions_layers_and_prioritises_the_input_side():
    tr = _T("t", [("a", 10, 1e-3, 1e-3), ("b", 9_000_001, 1e-3, 1e-3), ("c", 5, 1e-3, 1e-3)])
    cost = CostModel(4, {"allreduce": Linear(1e-4, 1e-9)})
    plan = make_plan("bytescheduler", tr, cost, partition_params=4_000_000, credit_bytes=16_000_000)
    assert [(b.layers[0], b.piece, b.messages[0].priority) for b in plan.buckets] == [
        ("c", None, 2.0), ("b", (0, 3), 1.0), ("b", (1, 3), 1.0), ("b", (2, 3), 1.0), ("a", None, 0.0)]
    assert sum(plan.bucket_bytes(tr)) == pytest.approx(tr.bytes().sum())
    assert plan.option("credit_bytes") == 16_000_000


def _bytescheduler_reference(f, b, comm, prio, iterations):
    """A direct reading of the ByteScheduler model (one chunk per layer): compute runs forward 1..L, then
    backward L..1; the forward of layer l in iteration i waits for layer l's all-reduce of iteration i-1;
    the link, whenever free, serves the released chunk of lowest (priority, release time), else waits for
    the next release. Link decisions are made in time order, never ahead of the releases compute has
    produced. Returns the start of layer 1's forward per iteration."""
    L = len(f)
    pending: list[tuple[float, float, int, int]] = []  # (priority, release, iteration, layer)
    done: dict[tuple[int, int], float] = {}
    link_free = 0.0

    def decide_next() -> float:
        nonlocal link_free
        start = max(link_free, min(c[1] for c in pending))
        c = min((c for c in pending if c[1] <= start), key=lambda c: (c[0], c[1]))
        pending.remove(c)
        link_free = start + comm[c[3]]
        done[(c[2], c[3])] = link_free
        return start

    def decide_before(limit: float) -> None:
        while pending and max(link_free, min(c[1] for c in pending)) < limit:
            decide_next()

    t = 0.0
    starts = []
    for it in range(iterations):
        for l in range(L):
            if it:
                while (it - 1, l) not in done:
                    decide_next()
                t = max(t, done[(it - 1, l)])
            if l == 0:
                starts.append(t)
            t += f[l]
        for l in reversed(range(L)):
            t += b[l]
            decide_before(t)
            pending.append((prio[l], t, it, l))
    return starts


def test_bytescheduler_simulation_matches_a_direct_reading_of_the_model():
    rng = np.random.default_rng(7)
    from repro.families.bytescheduler.simulate import ITERATIONS

    for _ in range(40):
        L = int(rng.integers(1, 7))
        tr = _T("t", [(f"l{i}", int(rng.integers(1, 3_000_000)), float(rng.uniform(1e-4, 3e-3)),
                       float(rng.uniform(1e-4, 3e-3))) for i in range(L)])
        cost = CostModel(4, {"allreduce": Linear(float(rng.uniform(1e-5, 2e-3)), float(rng.uniform(1e-11, 3e-9)))})
        plan = make_plan("bytescheduler", tr, cost, partition_params=10**9)
        comm = [cost.allreduce_s(n) for n in tr.bytes()]
        starts = _bytescheduler_reference(tr.forward_s(), tr.backward_s(), comm, list(range(L)), ITERATIONS)
        want = (starts[-1] - starts[1]) / (ITERATIONS - 2)
        assert simulate(tr, plan, cost).iteration_s == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_bytescheduler_next_forward_waits_only_for_its_own_layer():
    # comm-light: the input layer's all-reduce is short, the output layer's long; the next forward of
    # the input layer starts before the output layer's all-reduce ends.
    tr = _T("t", [("in", 1000, 1e-3, 1e-3), ("out", 10_000_000, 1e-3, 1e-3)])
    cost = CostModel(4, {"allreduce": Linear(1e-5, 1e-10)})
    res = simulate(tr, make_plan("bytescheduler", tr, cost), cost)
    out_ar = [op for op in res.ops if op.kind == "allreduce" and op.label.startswith("l2")][-1]
    in_fwd_next = [op for op in res.ops if op.kind == "forward" and op.label == "in"][1]
    assert in_fwd_next.start_s < out_ar.end_s
    # ... and an iteration is then shorter than WFBP's, whose next forward waits for everything
    assert res.iteration_s < make_plan("wfbp", tr, cost).meta["iteration_s"]


# ---- Horovod cycle time ----------------------------------------------------------------------------

def test_cycle_release_rounds_up_to_the_next_tick():
    assert cycle_release_s([0.0, 0.001, 0.005, 0.0051, 0.012], 0.005).tolist() == pytest.approx(
        [0.0, 0.005, 0.005, 0.010, 0.015])
    assert cycle_release_s([0.3], None).tolist() == [0.3]


def test_horovod_plan_fuses_per_cycle_and_the_engine_agrees_with_the_closed_form():
    rng = np.random.default_rng(8)
    for _ in range(60):
        L = int(rng.integers(1, 15))
        tr, cost = _trace(rng, L, overheads=bool(rng.integers(0, 2))), _cost(rng)
        cycle = float(rng.choice([1e-3, 5e-3, 2e-2]))
        thr = int(rng.integers(1, 2**24))
        plan = make_plan("horovod", tr, cost, threshold_bytes=thr, cycle_s=cycle)
        assert plan.option("cycle_s") == cycle
        ready = np.cumsum(tr.backward_s()[::-1])[::-1]
        nbytes = tr.bytes()
        for g in plan.groups(tr):
            ticks = {math.ceil(ready[i] / cycle - 1e-12) for i in g}
            assert len(ticks) == 1                          # one cycle's gradients
            assert len(g) == 1 or nbytes[g].sum() <= thr    # within the fusion buffer
        a = simulate(tr, plan, cost, with_ops=False).iteration_s
        b = simulate(tr, plan, cost).iteration_s
        assert a == pytest.approx(b, rel=1e-9) and plan.meta["iteration_s"] == pytest.approx(a, rel=1e-12)
        comm_ops = [op for op in simulate(tr, plan, cost).ops if op.kind == "allreduce"]
        bwd_start = tr.overheads.pre_forward_s + tr.total_forward_s
        for op in comm_ops:
            rel = (op.start_s - bwd_start) / cycle
            assert rel >= -1e-9
        no_cycle = Plan.from_groups(tr, plan.groups(tr), "x")
        assert a >= simulate(tr, no_cycle, cost, with_ops=False).iteration_s - 1e-12


def test_engine_earliest_start():
    ops = run_tasks([Task("c", "f", "a", 1.0), Task("q", "m", "x", 1.0, deps=(0,), earliest_s=2.5),
                     Task("q", "m", "y", 1.0, earliest_s=0.5), Task("c", "f", "b", 1.0, earliest_s=3.0)], {"c"})
    assert [(o.start_s, o.end_s) for o in ops] == [(0.0, 1.0), (2.5, 3.5), (0.5, 1.5), (3.0, 4.0)]
    with pytest.raises(ValueError, match="earliest"):
        run_tasks([Task("c", "f", "a", 1.0, earliest_s=float("nan"))], {"c"})


@pytest.mark.slow
def test_dear_optimal_is_the_brute_force_optimum_over_all_contiguous_bucketings():
    rng = np.random.default_rng(9)
    for trial in range(120):
        L = int(rng.integers(1, 10))
        tr, cost = _trace(rng, L, overheads=bool(trial % 2)), _cost(rng)
        best = min(groups_period_s(tr, [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])], cost)
                   for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, L), r) for r in range(L))
                   for bounds in [(0, *cuts, L)])
        plan = make_plan("dear_optimal", tr, cost)
        assert plan.meta["iteration_s"] == pytest.approx(best, rel=1e-12)
        assert simulate(tr, plan, cost).iteration_s == pytest.approx(best, rel=1e-9)
        assert plan.meta["iteration_s"] <= make_plan("dear_model", tr, cost).meta["iteration_s"] + 1e-15
