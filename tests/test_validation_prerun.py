"""The validation study's pre-run prediction: warm-up trace + fitted cost model + measured contention.

Fast tests build run folders from a shipped CPU trace (no training); the end-to-end test (slow) runs
the study for real on loopback: contention measured first, then one scheduler trained."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from repro.core.cost import CostModel, Linear
from repro.core.planners import make_plan
from repro.core.realism import Realism
from repro.results.runs import RunWriter
from repro.core.simulate import simulate
from repro.studies import validation
from repro.studies.mgwfbp_train import load_runs
from repro.core.trace import load_trace


def _cost() -> CostModel:
    return CostModel(2, {"allreduce": Linear(2e-4, 1e-9)}, source="test line")


def _write_run(root, model: str, scheduler: str, iteration_s: float, bandwidth_bps=None) -> None:
    trace = load_trace(f"{model}_b32_cpu")
    plan = make_plan(scheduler, trace, _cost())
    run_id = f"{model}_{scheduler}_p2" + ("_bw" if bandwidth_bps else "")
    summary = {"run_id": run_id, "model": model, "scheduler": scheduler, "world_size": 2, "backend": "gloo",
               "emulated_bandwidth_bps": bandwidth_bps, "batch_size": 32, "wire_dtype": "float32",
               "iteration_s": iteration_s, "buckets": plan.num_buckets, "steps": 10}
    with RunWriter(root, run_id) as w:
        w.trace(trace)
        w.plan(plan)
        w.cost(_cost())
        w.record({"run_id": run_id, "config": {"model": model, "scheduler": scheduler}, "summary": summary,
                  "environment": {"cpu_count": 2, "threads_per_rank": 1}})


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    for s in ("wfbp", "mgwfbp", "syncea"):
        _write_run(root, "tiny_vgg", s, 0.05)
        _write_run(root, "tiny_vgg", s, 0.08, bandwidth_bps=1e8)
    return load_runs(tmp_path)


def _contention_table() -> pd.DataFrame:
    """A table shaped like measure_contention's (values made up for the arithmetic, not measured)."""
    rows = []
    for net, slowdowns in (("loopback", [0.3, 0.5, 0.4]), ("100mbit", [0.1, -0.05, 0.2])):
        for n, s in zip((16384, 65536, 262144), slowdowns):
            rows.append({"network": net, "model": "tiny_vgg", "batch_size": 32, "workers": 2, "bytes": n,
                         "kernel_alone_s": 0.05, "kernel_with_comm_s": 0.05 * (1 + s), "allreduce_s": 1e-3,
                         "queued_allreduces": 10, "covered": True, "slowdown": s})
    df = pd.DataFrame(rows)
    from repro.runtime.contention import fit_contention

    df["contention"] = df.groupby(["model", "network", "workers"]).slowdown.transform(fit_contention)
    return df


def test_prerun_column_equals_simulate_with_measured_contention(runs):
    contention = _contention_table()
    table = validation.validation_table(runs, contention)
    assert {"simulated_prerun_s", "error_prerun_pct", "prerun_contention", "simulated_s",
            "simulated_inrun_s"} <= set(table.columns)
    assert len(table) == 6
    expected_c = {"loopback": 0.4, "100mbit": 0.1}  # medians over sizes
    for _, row in table.iterrows():
        c = expected_c[row.network]
        assert row.prerun_contention == pytest.approx(c)
        trace = load_trace("tiny_vgg_b32_cpu")
        plan = make_plan(row.scheduler, trace, _cost())
        ref = simulate(trace, plan, _cost().with_realism(Realism(contention=c)), with_ops=False).iteration_s
        assert row.simulated_prerun_s == pytest.approx(ref, rel=1e-12)
        assert row.simulated_s == pytest.approx(simulate(trace, plan, _cost(), with_ops=False).iteration_s)
        assert row.error_prerun_pct == pytest.approx(100 * (ref / row.measured_s - 1))
    # contention only slows computation down: never faster than the paper model; WFBP overlaps most
    assert (table.simulated_prerun_s >= table.simulated_s - 1e-12).all()
    wfbp = table[(table.scheduler == "wfbp") & (table.network == "loopback")].iloc[0]
    assert wfbp.simulated_prerun_s > wfbp.simulated_s


def test_prerun_missing_contention_is_nan_and_fits_table(runs):
    table = validation.validation_table(runs)
    assert table.simulated_prerun_s.isna().all() and table.error_prerun_pct.isna().all()
    fits = validation.contention_fits(_contention_table())
    assert list(fits.columns[:4]) == ["model", "network", "workers", "contention"]
    assert dict(zip(fits.network, fits.contention)) == pytest.approx({"loopback": 0.4, "100mbit": 0.1})
    by_net = validation.validation_table(runs, {("tiny_vgg", "loopback", 2): 0.25})
    assert (by_net[by_net.network == "loopback"].prerun_contention == 0.25).all()
    assert by_net[by_net.network == "100mbit"].simulated_prerun_s.isna().all()


def test_prerun_cost_keeps_existing_realism():
    cost = _cost().with_realism(Realism(message_overhead_s=1e-4))
    out = validation.prerun_cost(cost, 0.3)
    assert out.realism == Realism(message_overhead_s=1e-4, contention=0.3)
    assert validation.prerun_cost(_cost(), 0.0).realism is None  # c = 0: the paper model


@pytest.mark.distributed
@pytest.mark.slow
def test_run_validation_measures_contention_before_runs(tmp_path):
    configs = [{"model": "tiny_vgg", "scheduler": "wfbp", "batch_size": 8, "steps": 2, "warmup_steps": 1}]
    runs = validation.run_validation(configs, ["loopback"], [2], tmp_path,
                                     contention={"repeats": 1, "sizes_bytes": [4096, 65536]})
    c = validation.load_contention(tmp_path)
    assert c is not None and set(c.network) == {"loopback"} and len(c) == 2
    table = validation.validation_table(runs, c)
    row = table.iloc[0]
    assert math.isfinite(row.simulated_prerun_s) and row.prerun_contention >= 0
    from repro.results.runs import load_run

    run = load_run(runs.iloc[0].path)
    ref = simulate(run.trace, run.plan, validation.prerun_cost(run.cost, row.prerun_contention), with_ops=False)
    assert row.simulated_prerun_s == pytest.approx(ref.iteration_s, rel=1e-12)
