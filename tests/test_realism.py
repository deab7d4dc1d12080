"""Realism (repro.core.realism) and contention (repro.core.contention), torch-free: each effect written out,
and the paper model untouched."""

import math

import pytest

from repro.core.cost import CostModel, CostModelError, Linear
from repro.costs.presets import preset
from repro.core.planners import make_plan
from repro.core.realism import PAPER_MODEL, Realism, RealismError
from repro.core.simulate import simulate
from repro.core.contention import overlap_s, run_tasks_with_contention
from repro.core.engine import Task, run_tasks
from repro.core.trace import load_trace

TRACE = "resnet50_b32_v100-estimate"


def test_defaults_are_the_paper_model_and_bad_values_name_the_parameter():
    assert Realism().is_paper_model and PAPER_MODEL.is_paper_model
    assert not Realism(contention=0.1).is_paper_model
    for bad in ({"contention": -0.1}, {"message_overhead_s": float("nan")}, {"compute_scale": 0},
                {"copy_s_per_byte": "1e-9"}, {"update_s_per_byte": True}):
        name = next(iter(bad))
        with pytest.raises(RealismError, match=name):
            Realism(**bad)
    with pytest.raises(RealismError, match="unknown realism parameter"):
        Realism.from_dict({"contention": 0.1, "speed_of_light": 3e8})


def test_round_trip_through_a_cost_model_json():
    r = Realism(message_overhead_s=5e-5, copy_s_per_byte=1e-11, fp16_cast_s_per_byte=2e-11, contention=0.3,
                update_s_per_byte=6e-12, compute_scale=1.2)
    cm = preset("10gbe-derived", 8).with_realism(r)
    back = CostModel.from_json(cm.to_json())
    assert back.realism == r and back == cm
    assert CostModel.from_json(preset("10gbe-derived", 8).to_json()).realism is None
    with pytest.raises(CostModelError, match="realism"):
        CostModel.from_dict({**cm.to_dict(), "realism": {"contention": -1}})


def test_lines_gain_the_message_overhead_and_copy_cost_and_16_bit_plans_the_cast():
    base = CostModel.linear(4, 1e-4, 1e-9)
    cm = base.with_realism(Realism(message_overhead_s=3e-5, copy_s_per_byte=2e-10, fp16_cast_s_per_byte=5e-10))
    assert cm.line("allreduce") == Linear(1e-4 + 3e-5, 1e-9 + 2e-10)
    assert cm.lines["allreduce"] == Linear(1e-4, 1e-9)           # the network's own line is kept
    assert cm.allreduce_s(1e6) == pytest.approx(1e-4 + 3e-5 + (1e-9 + 2e-10) * 1e6)
    h = cm.for_wire_dtype("float16")
    assert h.line("allreduce").b_s_per_byte == pytest.approx(1e-9 + 2e-10 + 5e-10)
    assert cm.for_wire_dtype("float32") is cm and base.for_wire_dtype("float16") is base
    # An all-off realism is the paper model.
    assert base.with_realism(Realism()).is_paper_model


def test_trace_side_scales_compute_and_adds_the_update_once():
    tr = load_trace(TRACE)
    r = Realism(compute_scale=1.5, update_s_per_byte=1e-11)
    out = r.apply_to_trace(tr)
    assert out.total_forward_s == pytest.approx(1.5 * tr.total_forward_s)
    assert out.total_backward_s == pytest.approx(1.5 * tr.total_backward_s)
    assert out.overheads.update_s == pytest.approx(1e-11 * tr.total_bytes)
    # A measured update is kept, not replaced.
    assert Realism(update_s_per_byte=1.0).apply_to_trace(out).overheads.update_s == out.overheads.update_s
    assert Realism().apply_to_trace(tr) is tr
    # Scaled to a measured single device: forward + backward + update = the measurement.
    s = Realism(update_s_per_byte=1e-11).scaled_to_measured(tr, 0.5)
    t = s.apply_to_trace(tr)
    assert t.total_forward_s + t.total_backward_s + t.overheads.update_s == pytest.approx(0.5)
    with pytest.raises(RealismError, match="measured single-device"):
        Realism().scaled_to_measured(tr, -1.0)


def test_simulate_and_make_plan_apply_the_same_realism():
    tr = load_trace(TRACE)
    paper = preset("10gbe-derived", 16)
    r = Realism(message_overhead_s=1e-3, compute_scale=2.0)
    cm = paper.with_realism(r)
    # The paper model is unchanged by an all-off realism, with and without the timeline.
    plan = make_plan("mgwfbp", tr, paper)
    assert simulate(tr, plan, paper.with_realism(Realism())).iteration_s == simulate(tr, plan, paper).iteration_s
    # With realism: the same as the paper model on a hand-scaled trace and hand-shifted lines.
    scaled = r.apply_to_trace(tr)
    shifted = paper.with_line("allreduce", Linear(paper.line("allreduce").a_s + 1e-3, paper.line("allreduce").b_s_per_byte))
    assert make_plan("mgwfbp", tr, cm).groups(tr) == make_plan("mgwfbp", scaled, shifted).groups(tr)
    p = make_plan("wfbp", tr, cm)
    assert simulate(tr, p, cm).iteration_s == pytest.approx(simulate(scaled, p, shifted).iteration_s)
    assert simulate(tr, p, cm, with_ops=False).iteration_s == pytest.approx(simulate(tr, p, cm).iteration_s)


def test_contention_stretches_compute_by_the_overlap_written_out():
    # Compute of 1 s and a 0.5 s message both start at 0; with slowdown c the compute does 0.5/(1+c)
    # of work during the message, the rest at full speed: it ends at 1 + 0.5 c/(1+c).
    for c in (0.0, 0.5, 1.0, 3.0):
        ops = run_tasks_with_contention([Task("compute", "backward", "b", 1.0), Task("net", "comm", "m", 0.5)],
                                        {"compute"}, c)
        assert ops[0].end_s == pytest.approx(1 + 0.5 * c / (1 + c), abs=1e-9)
        assert ops[1].end_s == pytest.approx(0.5)
    # A message longer than the compute slows all of it: 1 s of work at 1/(1+c) speed.
    for c in (0.5, 1.0, 3.0):
        ops = run_tasks_with_contention([Task("compute", "backward", "b", 1.0), Task("net", "comm", "m", 10.0)],
                                        {"compute"}, c)
        assert ops[0].end_s == pytest.approx(1 + c, rel=1e-6)
    # No overlap, no slowdown: the plain engine's schedule.
    tasks = [Task("compute", "backward", "b", 1.0), Task("net", "comm", "m", 0.5, deps=(0,))]
    assert run_tasks_with_contention(tasks, {"compute"}, 2.0) == run_tasks(tasks, {"compute"})
    with pytest.raises(ValueError, match="contention"):
        run_tasks_with_contention(tasks, {"compute"}, -1.0)


def test_overlap_of_an_interval_with_disjoint_intervals():
    starts, ends = [0.0, 2.0, 5.0], [1.0, 3.0, 6.0]
    assert overlap_s(0.5, 5.5, starts, ends) == pytest.approx(0.5 + 1.0 + 0.5)
    assert overlap_s(3.0, 5.0, starts, ends) == 0.0
    assert overlap_s(-1.0, 10.0, starts, ends) == pytest.approx(3.0)


def test_contention_in_the_simulator_slows_overlapped_schedules_only():
    tr = load_trace(TRACE)
    paper = preset("56gbib-derived", 4)   # compute-bound: stretched compute shows in the iteration
    slow = paper.with_realism(Realism(contention=0.5))
    sync = make_plan("syncea", tr, paper)   # one all-reduce after the backward: nothing overlaps
    wfbp = make_plan("wfbp", tr, paper)
    assert simulate(tr, sync, slow).iteration_s == pytest.approx(simulate(tr, sync, paper).iteration_s)
    a, b = simulate(tr, wfbp, paper).iteration_s, simulate(tr, wfbp, slow).iteration_s
    assert b > a
    # At most every compute second overlapped: c/(1+c) of the backward.
    assert b - a <= 0.5 / 1.5 * tr.total_backward_s + 1e-9
    assert math.isfinite(b)


def test_a_planner_that_simulates_its_candidates_sees_the_trace_side_once():
    # osp_auto simulates candidate plans; with compute scaled by 3 its view must equal simulate's.
    from repro.families.ps.simulate import PSSetting  # noqa: F401  (the PS family is importable torch-free)

    tr = load_trace(TRACE)
    cm = preset("10gbe-derived", 8).with_realism(Realism(compute_scale=3.0, message_overhead_s=1e-4))
    scaled = Realism(compute_scale=3.0).apply_to_trace(tr)
    direct = preset("10gbe-derived", 8).with_realism(Realism(message_overhead_s=1e-4))
    a = make_plan("osp_auto", tr, cm)
    b = make_plan("osp_auto", scaled, direct)
    assert a.groups(tr) == b.groups(tr) and a.meta == b.meta
