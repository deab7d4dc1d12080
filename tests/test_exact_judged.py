"""Exact planners are never slower than their family's heuristics under the model that judges them.

``optimal``, ``omgs_optimal`` and ``dear_optimal`` search the contention-free model; under a realism with
contention (the calibrated presets) they also simulate the heuristics' plans and return the fastest
(:mod:`repro.core.judge`). Checked over the shipped GPU traces (estimates and measurements; the tiny
CPU ones are left out), the calibrated and derived presets and P in {16, 64, 256, 2048}: a small sample
always, the whole sweep under ``slow``. ``python tests/test_exact_judged.py`` prints the sweep's
violations (whatever ``repro`` is on the path).
"""

from __future__ import annotations

import sys
from functools import lru_cache

import pytest

from repro.costs.cluster_cost import PUBLISHED_TOPK_GAMMA_S, topk_device_of_trace, topk_gamma_for_device
from repro.core.planners import make_plan
from repro.costs.presets import preset, preset_names
from repro.core.simulate import simulate
from repro.core.trace import load_trace

RTOL = 1e-9
WORKERS = (16, 64, 256, 2048)
FAMILIES = {  # exact planner -> the heuristics of its plan family
    "optimal": ("wfbp", "syncea", "threshold", "ddp_buckets", "horovod", "mgwfbp"),
    "omgs_optimal": ("topk_layerwise", "topk_single", "omgs"),
    "dear_optimal": ("dear_nofusion", "dear_threshold", "dear_model"),
}
DENSITY = 0.001


def presets() -> list[str]:
    return [n for n in preset_names() if n.endswith("-calibrated") or n.endswith("-derived")]


def traces() -> list[str]:
    from repro.core.paths import shipped_traces

    return [s for s in shipped_traces() if not s.startswith("tiny_")]


@lru_cache(maxsize=None)
def _trace(stem: str):
    return load_trace(stem)


def _cost(stem: str, network: str, workers: int):
    device = topk_device_of_trace(_trace(stem))
    gamma = topk_gamma_for_device(device)[0] if device else PUBLISHED_TOPK_GAMMA_S
    return preset(network, workers).with_topk(gamma)


def _options(name: str) -> dict:
    return {"density": DENSITY} if name in FAMILIES["omgs_optimal"] + ("omgs_optimal",) else {}


def violations(stem: str, network: str, workers: int) -> list[tuple]:
    """``(exact, its seconds, heuristic, its seconds)`` wherever the exact planner's simulated iteration
    is slower than a heuristic's of its family (relative tolerance :data:`RTOL`)."""
    trace, cost = _trace(stem), _cost(stem, network, workers)
    out = []
    for exact, rivals in FAMILIES.items():
        t = {}
        for name in (exact, *rivals):
            plan = make_plan(name, trace, cost, **_options(name))
            t[name] = float(simulate(trace, plan, cost, with_ops=False).iteration_s)
            if name == exact and "iteration_s" in plan.meta and "plan_from" in plan.meta:
                # the prediction the plan records is the judge's own
                assert plan.meta["iteration_s"] == pytest.approx(t[name], rel=1e-9), (stem, network, workers, exact)
        best = min(rivals, key=t.__getitem__)
        if t[exact] > t[best] * (1 + RTOL):
            out.append((exact, t[exact], best, t[best]))
    return out


def sweep(stems=None, networks=None, workers=WORKERS) -> dict[tuple, list[tuple]]:
    found = {}
    for stem in stems or traces():
        for net in networks or presets():
            for p in workers:
                bad = violations(stem, net, p)
                if bad:
                    found[(stem, net, p)] = bad
    return found


SAMPLE = [("densenet201_b64_v100-estimate", "10gbe-calibrated", 16),       # issue 34's cases
          ("densenet201_b64_v100-estimate", "100gbib-calibrated", 2048),
          ("resnet50_b32_h200-bf16", "100gbib-calibrated", 64),
          ("vgg16_b32_v100-estimate", "10gbe-derived", 256)]


@pytest.mark.parametrize("stem,network,workers", SAMPLE)
def test_exact_planners_never_lose_to_their_family_under_the_judging_model(stem, network, workers):
    assert violations(stem, network, workers) == []


def test_issue_34_cases_record_the_winner_and_the_exact_plans_own_time(tmp_path):
    trace = _trace("densenet201_b64_v100-estimate")
    cost = _cost("densenet201_b64_v100-estimate", "10gbe-calibrated", 16)
    plan = make_plan("optimal", trace, cost)
    m = plan.meta
    assert plan.solver == "optimal" and m["plan_from"] == "mgwfbp"  # the DP's plan loses under contention
    assert m["exact_plan_iteration_s"] > m["iteration_s"] == min(m["candidate_iterations"].values())
    assert m["search_iteration_s"] < m["exact_plan_iteration_s"]  # the DP's model leaves contention out
    assert "contention" in m["judged_by"] and "contention-free" in m["exact_under"]
    assert simulate(trace, plan, cost).iteration_s == pytest.approx(m["iteration_s"], rel=1e-9)
    from repro.core.plan import Plan

    plan.save(tmp_path / "plan.json")  # the record is a valid plan file's meta
    assert Plan.load(tmp_path / "plan.json").meta["plan_from"] == "mgwfbp"


def test_without_contention_a_finished_search_is_returned_as_it_is():
    trace = _trace("resnet50_b32_v100-estimate")
    cost = _cost("resnet50_b32_v100-estimate", "10gbe-derived", 16)
    for exact in FAMILIES:
        m = make_plan(exact, trace, cost, **_options(exact)).meta
        assert m["plan_from"] == exact and m["candidate_iterations"] == {exact: m["iteration_s"]}
        assert m["exact_plan_iteration_s"] == m["search_iteration_s"] == m["iteration_s"]
        assert m.get("optimal", True) is True


@pytest.mark.slow
def test_every_shipped_trace_and_preset_has_no_violation():
    """Every shipped trace (the CPU ones aside) under the two calibrated presets (the presets with
    contention, where the searches are not exact), each at the P of the issue's case on it: 10GbE at 16,
    100Gb IB at 2048. Under the derived presets (no contention) the searches are exact, which
    tests/test_exact_planners_bruteforce.py checks; the whole sweep, every preset at P in 16, 64, 256,
    2048, is ``python tests/test_exact_judged.py`` (0 violations in 816 configurations)."""
    assert set(n for n in presets() if n.endswith("-calibrated")) == {"10gbe-calibrated", "100gbib-calibrated"}
    assert sweep(networks=["10gbe-calibrated"], workers=(16,)) == {}
    assert sweep(networks=["100gbib-calibrated"], workers=(2048,)) == {}


if __name__ == "__main__":  # the sweep's violations, e.g. before and after a change
    found = sweep(*(sys.argv[1:2] and [sys.argv[1].split(",")]))
    for key, bad in sorted(found.items()):
        for b in bad:
            print(*key, b[0], f"{b[1]:.6g}", b[2], f"{b[3]:.6g}", f"{100 * (b[1] / b[3] - 1):+.2f}%")
    n = sum(len(b) for b in found.values())
    print(f"violations: {n} (exact planner x configuration) in {len(found)} configurations")


@pytest.mark.parametrize("planner", ["dear_optimal", "omgs_optimal"])
def test_under_contention_a_spent_budget_skips_the_rivals_and_says_so(planner):
    import time

    from tests.test_exact_planner_budget import MARGIN_S, _random_trace

    trace, cost = _random_trace(400), preset("10gbe-calibrated", 16).with_topk(PUBLISHED_TOPK_GAMMA_S)
    budget = 0.01
    t0 = time.process_time()   # CPU time: see MARGIN_S
    plan = make_plan(planner, trace, cost, time_budget_s=budget, **_options(planner))
    assert time.process_time() - t0 < budget + MARGIN_S
    m = plan.meta
    assert m["optimal"] is False and m["plan_from"] == planner and m["candidates_skipped"]
    assert m["iteration_s"] == pytest.approx(simulate(trace, plan, cost).iteration_s, rel=1e-9)  # still the judge's
