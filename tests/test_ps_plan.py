"""The parameter-server plans (repro.families.ps.planners) and their simulator (repro.families.ps.simulate's plan part), torch-free:

- shards balanced by bytes (largest first to the least-loaded shard), checked against brute force;
- the stage split rule (a layer joins stage 1 when at least half its bytes fit in the share), written
  out here; share 1 = every layer, share 0 = none;
- the magnitude policy needs measured magnitudes (clear error without them);
- plans survive JSON; ``simulate`` of a ps plan is ``simulate_ps`` of the same setting; osp_auto's
  share is ``auto_stage2_share``'s;
- bad plans raise a one-line PlanError.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from repro.core.cost import CostModel, Linear
from repro.core.plan import Bucket, Message, Plan, PlanError
from repro.core.planners import make_plan
from repro.families.ps.planners import importance_order, shard_layers, stage_one_layers
from repro.core.simulate import simulate
from repro.families.ps.simulate import PSSetting, auto_stage2_share, plan_layout, simulate_ps, trace_compute_s
from repro.core.trace import Layer, Overheads, Trace

LINE = Linear(1e-4, 1e-8)


def _trace(sizes, magnitudes=None, update_s=0.0, backward_s=2e-3):
    layers = [Layer(f"l{i}", int(b) // 4, int(b), 1e-3, backward_s,
                    extra={} if magnitudes is None else {"grad_abs_mean": float(magnitudes[i])})
              for i, b in enumerate(sizes)]
    return Trace("t", 8, "cpu", "float32", layers, overheads=Overheads(update_s=update_s))


def _cost(workers=4):
    return CostModel(workers, {"push": LINE, "pull": LINE})


# ---- shards ----

def test_shards_follow_the_written_rule():
    # largest first, each to the least-loaded shard (ties: the lower one): 5->0, 4->1, 3->1, 3->0, 1->1
    assert shard_layers([3, 5, 1, 4, 3], 2) == [1, 0, 1, 1, 0]
    assert shard_layers([7, 7, 7], 3) == [0, 1, 2]
    assert shard_layers([1, 2, 3], 1) == [0, 0, 0]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="servers must be a positive integer"):
            shard_layers([1, 2], bad)


def test_shards_are_balanced_by_bytes_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(60):
        n, S = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        sizes = rng.integers(1, 1000, n).tolist()
        shard = shard_layers(sizes, S)
        load = [sum(b for b, s in zip(sizes, shard) if s == k) for k in range(S)]
        best = min(max(sum(b for b, s in zip(sizes, a) if s == k) for k in range(S))
                   for a in itertools.product(range(S), repeat=n))
        assert max(load) <= sum(sizes) / S + max(sizes)       # list scheduling's bound
        assert max(load) <= (4 / 3 - 1 / (3 * S)) * best + 1e-9  # LPT's bound (Graham)
        if n <= S:
            assert max(load) == best == max(sizes)             # one layer per shard


# ---- stage split ----

def _written_stage_one(sizes, order, share):
    """osp.md/planners' rule written out: in importance order, a layer joins stage 1 when half of its
    bytes still fit within share x total bytes (layers that do not fit are skipped, later ones may join)."""
    budget, used, out = share * sum(sizes), 0.0, set()
    for i in order:
        if used + sizes[i] / 2 <= budget:
            out.add(i)
            used += sizes[i]
    return out


def test_stage_split_rule():
    t = _trace([400, 400, 400, 400])
    assert stage_one_layers(t, 1.0) == {0, 1, 2, 3}
    assert stage_one_layers(t, 0.0) == set()
    assert stage_one_layers(t, 0.5) == {0, 1}          # layer 1: 400 + 200 <= 800
    assert stage_one_layers(t, 0.125) == {0}           # exactly half of layer 0 fits
    assert stage_one_layers(t, 0.124) == set()         # not quite half
    assert stage_one_layers(_trace([400, 1200, 80]), 0.4) == {0, 2}  # layer 1 skipped, layer 2 joins
    rng = np.random.default_rng(1)
    for _ in range(50):
        sizes = (rng.integers(1, 500, int(rng.integers(1, 12))) * 4).tolist()
        mags = rng.uniform(0, 1, len(sizes))
        share = float(rng.uniform(0, 1))
        t = _trace(sizes, mags)
        assert stage_one_layers(t, share, "position") == _written_stage_one(sizes, range(len(sizes)), share)
        order = sorted(range(len(sizes)), key=lambda i: -mags[i])
        assert stage_one_layers(t, share, "magnitude") == _written_stage_one(sizes, order, share)
        assert stage_one_layers(t, 1.0, "magnitude") == set(range(len(sizes)))
        assert stage_one_layers(t, 0.0, "magnitude") == set()
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="stage1_share must be a number in"):
            stage_one_layers(t, bad)


def test_osp_plan_layout_matches_the_split():
    t = _trace([400, 400, 400, 400])
    plan = make_plan("osp", t, _cost(), servers=2, stage1_share=0.5, importance="position")
    stage1 = {name for b, (stage, _) in zip(plan.buckets, plan_layout(plan)) if stage == 1 for name in b.layers}
    assert stage1 == {"l0", "l1"}
    assert all(m.phase == ("backward" if stage == 1 else "background")
               for b, (stage, _) in zip(plan.buckets, plan_layout(plan)) for m in b.messages)
    assert plan.meta["stage1_bytes_share"] == 0.5 and plan.meta["iteration_s"] > 0
    assert make_plan("osp", t, _cost(), stage1_share=1.0).num_buckets == 1   # one server, stage 1 only
    everything2 = make_plan("osp", t, _cost(), stage1_share=0.0)
    assert [stage for stage, _ in plan_layout(everything2)] == [2]
    bsp = make_plan("ps_bsp", t, _cost(), servers=2)
    assert [stage for stage, _ in plan_layout(bsp)] == [1, 1] and bsp.option("mode") == "bsp"


def test_magnitude_policy_needs_measured_magnitudes():
    t = _trace([400, 800, 1200])
    with pytest.raises(ValueError, match="needs each layer's measured 'grad_abs_mean'.*use importance 'position'"):
        importance_order(t, "magnitude")
    with pytest.raises(ValueError, match="grad_abs_mean"):
        make_plan("osp", t, _cost(), stage1_share=0.5, importance="magnitude")
    with pytest.raises(ValueError, match="unknown importance policy"):
        importance_order(t, "size")
    assert importance_order(_trace([400, 800, 1200], [0.1, 0.3, 0.2]), "magnitude") == [1, 2, 0]
    with pytest.raises(ValueError, match="layer 'l1' has nan"):
        importance_order(_trace([400, 800], [0.1, float("nan")]), "magnitude")


# ---- plans: JSON, simulation, automatic share ----

def test_plans_survive_json():
    t = _trace([400, 1200, 800, 40, 4000], [0.1, 0.3, 0.2, 0.9, 0.05])
    c = _cost()
    plans = [make_plan("ps_bsp", t, c, servers=2), make_plan("ps_asp", t, c), make_plan("ps_ssp", t, c, staleness=3),
             make_plan("osp", t, c, servers=2, stage1_share=0.3, importance="magnitude", lgp=False),
             make_plan("osp_auto", t, c, servers=2)]
    for plan in plans:
        back = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
        assert back == plan and back.options == plan.options and back.meta == plan.meta
        assert plan_layout(back) == plan_layout(plan)
    assert plans[2].option("staleness") == 3 and plans[3].option("lgp") is False
    assert len({p.solver for p in plans}) == 5


@pytest.mark.parametrize("planner,options,mode,staleness", [
    ("ps_bsp", {}, "bsp", 0), ("ps_asp", {}, "asp", 0), ("ps_ssp", {"staleness": 1}, "ssp", 1),
    ("osp", {"stage1_share": 0.4}, "osp", 0), ("osp", {"stage1_share": 0.4, "lgp": False}, "osp", 0),
    ("osp", {"stage1_share": 0.0}, "osp", 0)])
def test_simulate_of_a_ps_plan_is_simulate_ps(planner, options, mode, staleness):
    sizes = [4000, 400_000, 40_000, 800_000, 4000]
    t = _trace(sizes, update_s=3e-4, backward_s=4e-3)
    for workers in (2, 5):
        c = _cost(workers)
        plan = make_plan(planner, t, c, **options)
        share = plan.meta["stage1_bytes_share"]
        stage2 = 1.0 - share if mode == "osp" else 0.0
        lgp_s = 3e-4 * stage2 if mode == "osp" and options.get("lgp", True) else 0.0
        ref = simulate_ps([trace_compute_s(t)] * workers, float(sum(sizes)), LINE, LINE,
                          PSSetting(workers, 1, mode, staleness, stage1_share=share), 3e-4, lgp_s)
        got = simulate(t, plan, c)
        assert got.iteration_s == pytest.approx(ref.period_s, rel=1e-12)
        assert plan.meta["iteration_s"] == pytest.approx(ref.period_s, rel=1e-12)
    # the modes differ under this load, so the comparison can fail
    bsp = simulate(t, make_plan("ps_bsp", t, _cost(5)), _cost(5)).iteration_s
    osp = simulate(t, make_plan("osp", t, _cost(5), stage1_share=0.0), _cost(5)).iteration_s
    assert osp < bsp


def test_osp_auto_takes_the_automatic_share():
    sizes = [40_000, 400_000, 200_000, 40_000, 800_000]
    t = _trace(sizes, backward_s=2e-3)
    for workers, servers in ((2, 1), (4, 1), (4, 2), (8, 1)):
        c = _cost(workers)
        plan = make_plan("osp_auto", t, c, servers=servers)
        share2 = auto_stage2_share(trace_compute_s(t), float(sum(sizes)), LINE, LINE, workers=workers,
                                   servers=servers)
        assert plan.meta["auto_stage2_share"] == share2
        assert plan.meta["stage1_share"] == 1.0 - share2
        assert {n for b, (s, _) in zip(plan.buckets, plan_layout(plan)) if s == 1 for n in b.layers} == \
            {f"l{i}" for i in stage_one_layers(t, 1.0 - share2)}
        if 0.0 < share2 < 1.0:  # the largest share that hides behind one computation
            def traffic(x):
                return workers * 2 * LINE(x * sum(sizes) / servers)
            assert traffic(share2) <= trace_compute_s(t) < traffic(share2 + 2e-3)
    shares = [make_plan("osp_auto", t, _cost(w)).meta["auto_stage2_share"] for w in (2, 8)]
    assert 0.0 < shares[1] < shares[0] <= 1.0   # more workers on the link: less can hide


# ---- bad plans ----

def _bucket(layers, phase="backward"):
    return Bucket(tuple(layers), (Message("push", phase), Message("pull", phase)))


@pytest.mark.parametrize("buckets,options,match", [
    ([["l0"], ["l1"]], {"mode": "bsp", "servers": 2, "bucket_servers": [0]}, "names the server of each of its 2"),
    ([["l0", "l1"]], {"mode": "bsp", "servers": 1, "bucket_servers": [1]}, "names a server >= servers=1"),
    ([["l0"], ["l1", "background"]], {"mode": "bsp", "servers": 1, "bucket_servers": [0, 0]},
     "only OSP plans have stage-2"),
    ([["l0"], ["l1"]], {"mode": "osp", "servers": 1, "bucket_servers": [0, 0]}, "one bucket per"),
])
def test_bad_plans_raise_one_clear_line(buckets, options, match):
    made = [_bucket(b[:1], b[1]) if len(b) == 2 and b[1] == "background" else _bucket(b) for b in buckets]
    with pytest.raises(PlanError, match=match) as e:  # refused when the plan is made (the family's check_plan)
        Plan(made, family="ps", options=options)
    assert "\n" not in str(e.value)
    with pytest.raises(PlanError, match=match):  # ... and when a plan JSON is read
        Plan.from_dict({"family": "ps", "solver": "custom", "options": options,
                        "buckets": [b.to_json_value() for b in made]})


def test_ps_plans_are_checked_by_the_family():
    with pytest.raises(PlanError, match="bucket_servers"):
        Plan([_bucket(["l0"])], family="ps", options={"mode": "bsp", "servers": 1})
    with pytest.raises(PlanError, match="mode"):
        Plan([_bucket(["l0"])], family="ps", options={"mode": "bulk", "servers": 1, "bucket_servers": [0]})
    with pytest.raises(PlanError):
        Plan([Bucket(("l0",), (Message("pull", "backward"), Message("push", "backward")))], family="ps",
             options={"mode": "bsp", "servers": 1, "bucket_servers": [0]})


def test_ps_planning_is_torch_free():
    code = ("import sys\nfrom repro.core.planners import make_plan\nfrom repro.core.simulate import simulate\n"
            "from repro.core.cost import CostModel, Linear\nfrom repro.core.trace import load_trace\n"
            "t = load_trace('resnet50_b32_v100-estimate'); c = CostModel(8, {'push': Linear(1e-4, 1e-9), "
            "'pull': Linear(1e-4, 1e-9)})\n"
            "for n, kw in [('ps_bsp', {}), ('ps_ssp', {}), ('osp', {'servers': 2}), ('osp_auto', {})]:\n"
            "    simulate(t, make_plan(n, t, c, **kw), c)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_more_servers_than_layers_is_refused():
    t = _trace([400, 400, 400])
    assert make_plan("ps_bsp", t, _cost(2), servers=3).option("servers") == 3
    with pytest.raises(ValueError, match=r"servers \(4\) exceeds the model's 3 layers"):
        make_plan("ps_bsp", t, _cost(2), servers=4)
