import pytest

from repro.core.cost import CostModel
from repro.core.plan import Bucket, Plan, PlanError
from repro.core.simulate import Task, run_tasks, simulate
from repro.core.trace import Overheads, Trace
from tests.helpers import make_trace, random_trace


def reference_iteration_s(t_f, t_b, t_c_per_group_head, merged):
    """The mgwfbp.md recursion written literally (1-based layers, merged[l]: l merged into l-1)."""
    L = len(t_b)
    tb = {l: t_b[l - 1] for l in range(1, L + 1)}
    tc = {l: (0.0 if merged.get(l) else t_c_per_group_head[l]) for l in range(1, L + 1)}
    tau_b = {L: 0.0}
    for l in range(L - 1, 0, -1):
        tau_b[l] = tau_b[l + 1] + tb[l + 1]
    ready = {l: tau_b[l] + tb[l] for l in range(1, L + 1)}
    tau_c = {L: ready[L]}
    for l in range(L - 1, 0, -1):
        tau_c[l] = max(tau_c[l + 1] + tc[l + 1], ready[l])
    return t_f + tau_c[1] + tc[1]


def test_hand_computed_wfbp_timeline():
    # backward 3 s, 2 s, 1 s for l2, l1, l0; each all-reduce 2 s; forward 3 s in total
    trace = make_trace([1.0, 2.0, 3.0], [400, 400, 400])
    cost = CostModel.linear(2, 2.0, 0.0)
    plan = Plan.from_groups(trace, [[2], [1], [0]], "wfbp")
    res = simulate(trace, plan, cost)
    assert res.iteration_s == pytest.approx(12.0)
    comm = [(op.label, op.start_s, op.end_s) for op in res.ops if op.stream == "comm"]
    assert comm == [("l3", 6.0, 8.0), ("l2", 8.0, 10.0), ("l1", 10.0, 12.0)]
    bwd = [(op.label, op.start_s, op.end_s) for op in res.ops if op.kind == "backward"]
    assert bwd == [("l2", 3.0, 6.0), ("l1", 6.0, 8.0), ("l0", 8.0, 9.0)]
    assert res.exposed_comm_s == pytest.approx(3.0)
    merged = simulate(trace, Plan.from_groups(trace, [[2, 1, 0]], "syncea"), cost)
    assert merged.iteration_s == pytest.approx(3 + 6 + 2)


def test_simulator_matches_the_papers_recursion_on_random_contiguous_plans(rng):
    for _ in range(200):
        L = int(rng.integers(1, 30))
        trace = random_trace(rng, L)
        cost = CostModel.linear(8, float(rng.uniform(0, 2e-3)), float(rng.uniform(0, 2e-9)))
        cuts = sorted(set(rng.integers(1, L + 1, size=int(rng.integers(0, L + 1))).tolist()) | {L})
        groups, lo = [], 0
        for hi in cuts:
            groups.append(list(range(lo, hi)))
            lo = hi
        groups.reverse()
        plan = Plan.from_groups(trace, groups, "random")
        nbytes = trace.bytes()
        tc_head = {}
        merged = {}
        for g in groups:
            head = min(g) + 1
            tc_head[head] = float(cost.allreduce_s(nbytes[g].sum()))
            for i in g:
                if i + 1 != head:
                    merged[i + 1] = True
        ref = reference_iteration_s(trace.total_forward_s, list(trace.backward_s()), tc_head, merged)
        full = simulate(trace, plan, cost)
        fast = simulate(trace, plan, cost, with_ops=False)
        assert full.iteration_s == pytest.approx(ref, rel=1e-12, abs=1e-15)
        assert fast.iteration_s == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_fcfs_serves_earliest_ready_bucket_whatever_the_plan_order():
    trace = make_trace([1.0, 1.0, 1.0], [4, 4, 4])
    cost = CostModel.linear(2, 0.5, 0.0)
    a = simulate(trace, Plan.from_groups(trace, [[0], [1], [2]], "x"), cost)
    b = simulate(trace, Plan.from_groups(trace, [[2], [1], [0]], "x"), cost)
    assert a.iteration_s == b.iteration_s


def test_non_contiguous_bucket_waits_for_its_last_gradient():
    trace = make_trace([1.0, 1.0, 1.0], [4, 4, 4], forward_s=[0, 0, 0])
    cost = CostModel.linear(2, 0.5, 0.0)
    res = simulate(trace, Plan.from_groups(trace, [[2, 0], [1]], "x"), cost)
    comm = {op.label: (op.start_s, op.end_s) for op in res.ops if op.stream == "comm"}
    assert comm == {"l2": (2.0, 2.5), "l1,l3": (3.0, 3.5)}


def test_fp16_wire_halves_message_bytes():
    trace = make_trace([1e-3] * 4, [4000] * 4)
    plan = Plan.from_groups(trace, [[3, 2, 1, 0]], "syncea")
    half = Plan(plan.buckets, "syncea", wire_dtype="float16")
    assert plan.bucket_bytes(trace) == [16000.0]
    assert half.bucket_bytes(trace) == [8000.0]
    cost = CostModel.linear(2, 0.0, 1e-6)
    assert simulate(trace, half, cost).comm_s == pytest.approx(simulate(trace, plan, cost).comm_s / 2)


def test_plan_errors_name_the_problem(tmp_path):
    trace = make_trace([1.0, 1.0], [4, 4])
    with pytest.raises(PlanError, match="'zz' is not in trace"):
        Plan((Bucket(("zz",)),)).groups(trace)
    with pytest.raises(PlanError, match="does not cover 1 layer"):
        Plan((Bucket(("l0",)),)).groups(trace)
    with pytest.raises(PlanError, match="more than one bucket"):
        Plan((Bucket(("l0",)), Bucket(("l0", "l1"))))
    with pytest.raises(PlanError, match="unknown collective"):
        Bucket(("l0",), "broadcast")
    with pytest.raises(PlanError, match="does not send 'reduce_scatter'"):
        simulate(trace, Plan((Bucket(("l0", "l1"), "reduce_scatter"),)), CostModel.linear(2, 0, 0))
    p = tmp_path / "p.json"
    p.write_text("[]")
    with pytest.raises(PlanError, match="must be a JSON object"):
        Plan.load(p)


def test_plan_json_round_trip(tmp_path):
    trace = make_trace([1.0, 1.0, 1.0], [4, 4, 4])
    plan = Plan.from_groups(trace, [[2, 1], [0]], "mine", wire_dtype="float16", meta={"iteration_s": 1.5})
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json")
    assert back == plan and back.meta == {"iteration_s": 1.5}


def test_engine_priorities_and_cycles():
    tasks = [Task("compute", "backward", "b", 1.0),
             Task("comm", "x", "low", 1.0, deps=(0,), priority=5),
             Task("comm", "x", "high", 1.0, deps=(0,), priority=1)]
    ops = run_tasks(tasks, {"compute"})
    assert (ops[2].start_s, ops[1].start_s) == (1.0, 2.0)
    with pytest.raises(ValueError, match="cycle"):
        run_tasks([Task("comm", "x", "a", 1.0, deps=(1,)), Task("comm", "x", "b", 1.0, deps=(0,))], set())
    with pytest.raises(ValueError, match="unknown task"):
        run_tasks([Task("comm", "x", "a", 1.0, deps=(7,))], set())


def test_measured_pre_forward_and_update_costs_wrap_the_iteration():
    trace = make_trace([1.0, 2.0, 3.0], [400, 400, 400])
    timed = trace.replace_layers(trace.layers, overheads=Overheads(pre_forward_s=0.5, update_s=1.0))
    cost = CostModel.linear(2, 2.0, 0.0)
    plan = Plan.from_groups(trace, [[2], [1], [0]], "wfbp")
    res = simulate(timed, plan, cost)
    assert res.iteration_s == pytest.approx(12.0 + 1.5)
    update = [op for op in res.ops if op.kind == "update"][0]
    assert (update.start_s, update.end_s) == (12.5, 13.5)  # after the last all-reduce
    assert simulate(timed, plan, cost, with_ops=False).iteration_s == pytest.approx(13.5)
    with pytest.raises(ValueError, match="'overheads.update_s' = -1 is outside the plausible range"):
        Overheads(update_s=-1)
    with pytest.raises(ValueError, match="must not hold the typed field"):  # no string-keyed overheads
        trace.replace_layers(trace.layers, extra={"update_s": 1.0})
    legacy = {**trace.to_dict(), "pre_forward_s": 0.5, "update_s": 1.0}  # a repro 0.1 trace file
    assert Trace.from_dict(legacy).overheads == Overheads(pre_forward_s=0.5, update_s=1.0)
    assert Trace.from_dict(timed.to_dict()).overheads == timed.overheads
