"""The DeAR training study (repro.studies.dear_train) and its figures: tables on hand-built run folders
(the numbers test the code's arithmetic; they are not results) and one tiny real run on loopback. The
notebook itself runs at its tiny defaults in tests/test_figures_pipeline.py."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.costs.presets import preset
from repro.figures import dear_train_plots as plots  # noqa: E402
from repro.core.planners import make_plan  # noqa: E402
from repro.families.dear.planners import groups_period_s, threshold_groups  # noqa: E402
from repro.results.runs import BUCKETS_CSV, ITERATIONS_CSV, RunWriter  # noqa: E402
from repro.studies import dear_train as study  # noqa: E402
from repro.core.trace import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def trace():
    return load_trace("tiny_resnet_b32_cpu")


@pytest.fixture(scope="module")
def cost():
    return preset("10gbe-dear-derived", 2)


def _write_run(root, run_id, trace, cost, *, scheduler="dear_threshold", iteration_s=0.1, compute_s=0.05,
               iterations=None, timeline=None, threshold=None, model="tiny_resnet"):
    """A run folder as repro.train writes it for a timing run with a plan."""
    plan = make_plan(scheduler, trace, cost, **({"threshold_bytes": threshold} if threshold is not None else {}))
    summary = {"run_id": run_id, "model": model, "scheduler": scheduler, "world_size": 2, "steps": 1, "iteration_s": iteration_s,
               "compute_s": compute_s, "exposed_comm_s": max(0.0, iteration_s - compute_s),
               "throughput_samples_s": 2 * 16 / iteration_s, "buckets": plan.num_buckets,
               "predicted_iteration_s": plan.meta.get("iteration_s"), "emulated_bandwidth_bps": 1e8,
               "wire_dtype": "float32", "threshold_bytes": threshold, "batch_size": 16}
    with RunWriter(root, run_id) as w:
        w.table(ITERATIONS_CSV, pd.DataFrame(iterations if iterations is not None else
                                             [{"step": 0, "epoch": 0, "iteration_s": iteration_s, "forward_s": 0.02,
                                               "backward_call_s": 0.03, "step_s": 0.05, "pre_forward_s": 0.0,
                                               "update_s": 0.001, "loss": 1.0}]).assign(run_id=run_id))
        if timeline is not None:
            w.table(BUCKETS_CSV, pd.DataFrame(timeline).assign(run_id=run_id))
        w.trace(trace)
        w.plan(plan)
        w.cost(cost)
        w.record({"run_id": run_id, "config": {"model": model, "scheduler": scheduler, "dataset": "synthetic",
                                               "threshold_bytes": threshold, "batch_size": 16},
                  "summary": summary, "environment": {"cpu_count": 2, "threads_per_rank": 1}})
    return plan


# ------------------------------------------------------------------------------------------ breakdown

def test_measured_breakdown_splits_the_exposed_time_by_the_timeline_and_adds_up(tmp_path, trace, cost):
    runs = tmp_path / "runs"
    # forward 20 ms, backward call 30 ms: backward ends at 50 ms; RS intervals run to 65 ms (15 ms after,
    # 5 of them overlapping each other), AGs during the forward.
    timeline = [{"bucket": 0, "kind": "reduce_scatter", "layers": 3, "bytes": 100, "launch_s": 0.04,
                 "start_s": 0.045, "end_s": 0.060},
                {"bucket": 1, "kind": "reduce_scatter", "layers": 3, "bytes": 100, "launch_s": 0.05,
                 "start_s": 0.055, "end_s": 0.065},
                {"bucket": 0, "kind": "allgather", "layers": 3, "bytes": 100, "launch_s": 0.0,
                 "start_s": 0.0, "end_s": 0.010}]
    _write_run(runs, "tiny_resnet_dear_threshold_p2_bw100mbit", trace, cost, iteration_s=0.100, compute_s=0.050,
               timeline=timeline)
    _write_run(runs, "tiny_resnet_wfbp_p2_bw100mbit", trace, cost, scheduler="wfbp", iteration_s=0.090,
               compute_s=0.070)
    _write_run(runs, "tiny_resnet_dear_threshold_p2_t4096_bw100mbit", trace, cost, threshold=4096)  # sweep: left out
    df = study.measured_breakdown_table(tmp_path)
    assert set(df.scheduler) == {"dear_threshold", "wfbp"} and set(df.source) == {"measured", "simulated"}
    m = df[(df.source == "measured")].set_index("scheduler")
    comp = 0.060  # the median of the two timing runs' compute_s, one estimate per model
    assert m.loc["dear_threshold", "computation_s"] == pytest.approx(comp)
    assert m.loc["dear_threshold", "rs_after_backward_s"] == pytest.approx(0.015)
    assert m.loc["dear_threshold", "exposed_rs_s"] == pytest.approx(0.015)
    assert m.loc["dear_threshold", "exposed_ag_s"] == pytest.approx(0.100 - comp - 0.015)
    assert m.loc["wfbp", "exposed_allreduce_s"] == pytest.approx(0.090 - comp)
    assert m.loc["wfbp", "exposed_rs_s"] == 0 and m.loc["wfbp", "exposed_ag_s"] == 0
    parts = ["computation_s", "exposed_rs_s", "exposed_ag_s", "exposed_allreduce_s", "exposed_idle_s"]
    for _, r in df.iterrows():
        assert sum(r[c] for c in parts) == pytest.approx(r.iteration_s, rel=1e-6), (r.scheduler, r.source)
    assert (m.derivation == study.MEASURED_DERIVATION).all()
    assert "simulated" in df[df.source == "simulated"].derivation.iloc[0]


def test_exposed_reduce_scatter_is_capped_at_the_exposed_time(tmp_path, trace, cost):
    timeline = [{"bucket": 0, "kind": "reduce_scatter", "layers": 3, "bytes": 100, "launch_s": 0.0,
                 "start_s": 0.04, "end_s": 0.20}]
    _write_run(tmp_path / "runs", "a", trace, cost, iteration_s=0.1, compute_s=0.08, timeline=timeline)
    m = study.measured_breakdown_table(tmp_path).query("source == 'measured'").iloc[0]
    assert m.exposed_rs_s == pytest.approx(0.02) and m.exposed_ag_s == pytest.approx(0.0)


def test_throughput_table_keeps_the_plans_threshold_and_marks_the_planners(tmp_path, trace, cost):
    runs = tmp_path / "runs"
    _write_run(runs, "tiny_resnet_dear_model_p2", trace, cost, scheduler="dear_model", iteration_s=0.08)
    _write_run(runs, "tiny_resnet_dear_optimal_p2", trace, cost, scheduler="dear_optimal", iteration_s=0.07)
    _write_run(runs, "tiny_resnet_wfbp_p2", trace, cost, scheduler="wfbp", iteration_s=0.10)
    thr = study.throughput_table(tmp_path)
    t = thr.set_index("scheduler")
    assert t.loc["dear_model", "plan_threshold_bytes"] >= 0 and np.isnan(t.loc["wfbp", "plan_threshold_bytes"])
    marks = study.planner_marks_table(thr, "tiny_resnet")
    assert set(marks.scheduler) == {"dear_model", "dear_optimal"}
    assert set(marks.measured_s) == {0.08, 0.07}
    sp = study.speedup_vs_best_baseline(thr, ["dear_model", "dear_optimal"])
    assert sp.iloc[0].best_dear == "dear_optimal" and sp.iloc[0].best_baseline == "wfbp"
    assert sp.iloc[0].speedup_pct == pytest.approx(100 * (0.10 / 0.07 - 1))
    tr, c = study.run_trace_cost(tmp_path, "tiny_resnet", "dear_model")
    assert tr.num_layers == trace.num_layers and c.workers == 2
    with pytest.raises(ValueError, match="no dear_threshold run"):
        study.run_trace_cost(tmp_path, "tiny_resnet")
    assert study.gradient_bytes(tmp_path, "tiny_resnet") == int(np.sum(trace.bytes()))


# ------------------------------------------------------------------------------------------ primitives

def test_primitive_cost_table_fits_each_primitive_and_the_ring_model_halves_the_all_reduce():
    sizes = [4096, 65536, 1048576]
    ar = lambda n: 1e-3 + 8e-9 * n  # noqa: E731
    rows = []
    for n in sizes:
        for prim, t in (("allreduce", ar(n)), ("reduce_scatter", ar(n) / 2), ("allgather", ar(n) / 2),
                        ("rs_plus_ag", ar(n))):
            rows.append({"workers": 2, "bytes": n, "primitive": prim, "seconds": t, "oversubscribed": False})
    df = study.primitive_cost_table(pd.DataFrame(rows))
    assert set(df.source) == {"measured", "fit", "ring model"}
    fit = df[(df.source == "fit") & (df.primitive == "allreduce")]
    assert fit.a_s.iloc[0] == pytest.approx(1e-3, rel=1e-3)
    assert fit.b_s_per_byte.iloc[0] == pytest.approx(8e-9, rel=1e-3)
    ring = df[(df.source == "ring model") & (df.primitive == "reduce_scatter")].sort_values("bytes")
    assert np.allclose(ring.seconds, [ar(n) / 2 for n in sizes], rtol=1e-3)
    assert np.allclose(ring.relative_error, 0, atol=1e-3)


def test_primitive_model_table_halves():
    df = study.primitive_model_table(presets=("10gbe-dear-derived",), workers=(2, 8), nbytes=2**20)
    piv = df.pivot_table(index="workers", columns="primitive", values="seconds")
    assert np.allclose(piv.reduce_scatter, piv.allgather)
    assert np.allclose(piv.allreduce, piv.reduce_scatter + piv.allgather)
    assert (df.source == "model").all() and piv.allreduce.loc[8] > piv.allreduce.loc[2]


# ------------------------------------------------------------------------------------------ tuning

def test_interpolated_objective_joins_measurements_in_log2():
    f = study.interpolated_objective([1024, 4096, 16384], [0.3, 0.1, 0.2])
    assert f(4096) == pytest.approx(0.1)
    assert f(2048) == pytest.approx(0.2)  # halfway in log2 between 1024 and 4096
    assert f(10) == pytest.approx(0.3) and f(2**30) == pytest.approx(0.2)  # constant beyond the ends


def test_model_objective_and_where_the_planners_land(trace, cost):
    f = study.model_objective(trace, cost)
    nbytes = np.rint(trace.bytes()).astype(np.int64)
    assert f(65536) == pytest.approx(groups_period_s(trace, threshold_groups(nbytes, 65536), cost))
    marks = study.planner_periods(trace, cost).set_index("scheduler")
    assert marks.loc["dear_optimal", "seconds"] <= marks.loc["dear_model", "seconds"] + 1e-12
    best_threshold = min(f(int(t)) for t in np.geomspace(64, 2**22, 60))
    assert marks.loc["dear_model", "seconds"] <= best_threshold + 1e-12


def test_search_comparison_table_same_budget_grid_once_seeds_for_the_others():
    f = study.interpolated_objective([2**10, 2**14, 2**18], [0.3, 0.1, 0.2])
    df = study.search_comparison_table({"m": f}, (2**10, 2**18), trials=4, seeds=(0, 1))
    counts = df.groupby(["method", "seed"]).size()
    assert set(counts) == {4} and set(df[df.method == "grid"].seed) == {0}
    assert set(df[df.method == "bo"].seed) == {0, 1} and set(df[df.method == "random"].seed) == {0, 1}
    assert df.trial.min() == 1 and df.trial.max() == 4
    for _, g in df.groupby(["method", "seed"]):
        assert (np.diff(g.best_so_far_s.to_numpy()) <= 1e-15).all()
    assert df.threshold_bytes.between(2**10, 2**18).all()


# ------------------------------------------------------------------------------------------ figures

def _sim_frames():
    thr, bd = study.paper_scale_tables(["resnet50"], ["10gbe-dear64"], ["wfbp", "bytescheduler", "dear_nofusion",
                                                                        "dear_threshold"],
                                       ["wfbp", "dear_threshold"], workers=64)
    return thr, bd


def test_paper_scale_tables_match_the_simulation_study():
    from repro.studies import dear_sim

    thr, bd = _sim_frames()
    ref = dear_sim.throughput_table(["resnet50"], ["10gbe-dear64"], ["wfbp", "dear_threshold"], 64)
    got = thr.set_index("scheduler").loc[["wfbp", "dear_threshold"], "iteration_s"].to_numpy()
    assert np.allclose(got, ref.set_index("scheduler").loc[["wfbp", "dear_threshold"], "iteration_s"].to_numpy())
    ref_bd = dear_sim.breakdown_table(["resnet50"], ["10gbe-dear64"], ["wfbp", "dear_threshold"], 64)
    assert np.allclose(bd.sort_values("scheduler").computation_s, ref_bd.sort_values("scheduler").computation_s)
    assert (thr.relative_to_best <= 1 + 1e-12).all() and set(bd.columns) >= {"exposed_rs_s", "exposed_ag_s"}


def test_figures_draw_from_the_tables(tmp_path, trace, cost):
    runs = tmp_path / "runs"
    for s, it in (("wfbp", 0.1), ("bytescheduler", 0.11), ("dear_nofusion", 0.12), ("dear_model", 0.08)):
        _write_run(runs, f"tiny_resnet_{s}_p2", trace, cost, scheduler=s, iteration_s=it,
                   timeline=[{"bucket": 0, "kind": "reduce_scatter", "layers": 1, "bytes": 10, "launch_s": 0.0,
                              "start_s": 0.04, "end_s": 0.06}])
    for t, it in ((4096, 0.09), (65536, 0.07)):
        _write_run(runs, f"tiny_resnet_dear_threshold_p2_t{t}", trace, cost, threshold=t, iteration_s=it)
    thr = study.throughput_table(tmp_path)
    sim_thr, sim_bd = _sim_frames()
    fig = plots.plot_throughput(thr, sim_thr, ["wfbp", "bytescheduler", "dear_nofusion"],
                                ["wfbp", "bytescheduler", "dear_nofusion"], "Throughput", "measured note", "sim note",
                                summary="ours vs paper's claim")
    assert len(fig.axes) == 2 and "samples/s" in fig.axes[0].get_ylabel()
    assert "ratio" in fig.axes[1].get_ylabel() and "simulated" in fig.axes[1].get_title()
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)  # no truncated axis
    bd = study.measured_breakdown_table(tmp_path)
    fig = plots.plot_breakdown(bd, sim_bd, "measured note", "sim note")
    assert all("ms" in ax.get_ylabel() for ax in fig.axes)
    sweep = study.buffer_sweep_table(tmp_path)
    from repro.studies import dear_sim

    sim_sweep = dear_sim.buffer_sweep_table(["resnet50"], ["10gbe-dear64"], points=5)
    fig = plots.plot_buffer_sweep(sweep, thr[thr.scheduler == "dear_model"], sim_sweep, "m", "s")
    assert "KiB" in fig.axes[0].get_xlabel() and "MiB" in fig.axes[1].get_xlabel()
    rows = [{"workers": 2, "bytes": n, "primitive": p, "seconds": 1e-3 + n * k * 1e-8, "oversubscribed": False}
            for n in (4096, 65536) for p, k in (("allreduce", 2), ("reduce_scatter", 1), ("allgather", 1),
                                                 ("rs_plus_ag", 2))]
    fig = plots.plot_primitive_cost(study.primitive_cost_table(pd.DataFrame(rows)),
                                    study.primitive_model_table(workers=(2, 4)), "m", "model")
    assert len(fig.axes) == 2 and all("ms" in ax.get_ylabel() for ax in fig.axes)
    live = pd.DataFrame({"trial": [0, 1], "threshold_bytes": [2**20, 2**22], "buckets": [1, 1],
                         "iteration_s": [0.08, 0.07], "best_so_far_s": [0.08, 0.07], "source": ["initial", "bo"],
                         "chosen": [False, True]})
    cmp = study.search_comparison_table({"model": study.model_objective(trace, cost)}, (2**10, 2**20), trials=3,
                                        seeds=(0,), methods=("grid", "random"))
    marks = {"model": study.planner_periods(trace, cost).assign(kind="predicted")}
    fig = plots.plot_bo_tuning(live, cmp, marks, "live note", {"model": "simulated objective"})
    assert len(fig.axes) == 2 and fig.axes[1].get_title() == "simulated objective"
    fig.savefig(tmp_path / "bo.png")


def test_gaps_over_2x_between_measured_and_predicted_are_noted_on_the_figure(tmp_path, trace, cost):
    """A measured run 3x its plan's prediction gets a computed note on dear.throughput_*; one within 2x none;
    dear.breakdown notes a measured exposed all-gather far above the same run simulated, with its reason."""
    runs = tmp_path / "runs"
    timeline = [{"bucket": 0, "kind": "reduce_scatter", "layers": 1, "bytes": 10, "launch_s": 0.0, "start_s": 0.0,
                 "end_s": 0.001}]
    for s, factor in (("wfbp", 1.3), ("dear_nofusion", 3.0)):
        pred = make_plan(s, trace, cost).meta["iteration_s"]
        _write_run(runs, f"tiny_resnet_{s}_p2", trace, cost, scheduler=s, iteration_s=pred * factor,
                   compute_s=pred * 0.6, timeline=timeline)
    thr = study.throughput_table(tmp_path)
    sim_thr, sim_bd = _sim_frames()

    def notes(fig):
        return [t.get_text() for t in fig.texts if t.get_text().startswith("Measured vs predicted")]

    fig = plots.plot_throughput(thr, sim_thr, ["wfbp", "dear_nofusion"], ["wfbp", "dear_nofusion"], "T", "m", "s")
    (note,) = notes(fig)
    assert "DeAR (no fusion) (tiny_resnet) iteration" in note and "(3.0x)" in note and "WFBP" not in note
    fig = plots.plot_throughput(thr[thr.scheduler == "wfbp"], sim_thr, ["wfbp"], ["wfbp"], "T", "m", "s")
    assert notes(fig) == []
    fig = plots.plot_breakdown(study.measured_breakdown_table(tmp_path), sim_bd, "m", "s")
    (note,) = notes(fig)
    assert "exposed all-gather: DeAR (no fusion): measured 112 ms" in note and "ring all-gathers" in note


# ------------------------------------------------------------------------------------------ real runs

@pytest.mark.distributed
def test_a_tiny_real_run_and_primitive_timing_on_loopback(tmp_path):
    """2 ranks on loopback: a DeAR run with its timeline, read back as the breakdown; the primitives timed."""
    configs = study.throughput_configs(["tiny_resnet"], ["dear_threshold"], 2, steps=2, warmup_steps=1,
                                       batch_size=8, extra={"fit_repeats": 1})
    configs += study.buffer_sweep_configs("tiny_resnet", [16384], 2, steps=2, warmup_steps=1, batch_size=8,
                                          extra={"fit_repeats": 1})
    assert configs[1]["run_id"] == "tiny_resnet_dear_threshold_p2_t16384"
    study.run_grid(configs, [2], tmp_path)
    thr = study.throughput_table(tmp_path)
    assert list(thr.scheduler) == ["dear_threshold"] and thr.iteration_s.iloc[0] > 0
    bd = study.measured_breakdown_table(tmp_path)
    m = bd[bd.source == "measured"].iloc[0]
    assert m.rs_after_backward_s >= 0 and m.exposed_rs_s + m.exposed_ag_s == pytest.approx(
        max(0.0, m.iteration_s - m.computation_s))
    sweep = study.buffer_sweep_table(tmp_path)
    assert set(sweep.source) == {"measured", "simulated"} and set(sweep.threshold_bytes) == {16384}
    times = study.measure_primitives([2], [4096, 65536], tmp_path, repeats=1)
    assert set(times.primitive) == set(study.PRIMITIVES) and (times.seconds > 0).all()
    assert (tmp_path / "primitive_times.csv").is_file()


@pytest.mark.slow
def test_bench_dear_simulated_half_runs():
    import runpy
    import sys

    argv = sys.argv
    sys.argv = ["bench_dear.py", "--no-measure", "--paper-models", "resnet50"]
    try:
        runpy.run_path(str(ROOT / "benchmarks" / "bench_dear.py"), run_name="__main__")
    finally:
        sys.argv = argv


def test_tuning_configs_set_the_tuners_range_only_where_a_run_can(monkeypatch):
    plain = study.tuning_configs("tiny_resnet", 2, trials=5, bounds_bytes=(8192, 524288))[0]
    if not study.tuner_options_supported():
        assert not set(study.TUNER_FIELDS) & set(plain)
    monkeypatch.setattr(study, "tuner_options_supported", lambda: True)
    c = study.tuning_configs("tiny_resnet", 2, "100mbit", trials=5, bounds_bytes=(8192, 524288))[0]
    assert (c["tuner_trials"], c["tuner_min_bytes"], c["tuner_max_bytes"]) == (5, 8192, 524288)
    assert c["scheduler"] == "dear_bo" and c["run_id"] == "tiny_resnet_dear_bo_p2_bw100mbit"
    assert "tuner_trials" not in study.tuning_configs("tiny_resnet", 2)[0]


def test_paper_scale_tables_take_the_cost_mode():
    thr_p, _ = study.paper_scale_tables(["resnet50"], ["10gbe-dear64"], ["wfbp"], [], 64)
    thr_c, _ = study.paper_scale_tables(["resnet50"], ["10gbe-dear64"], ["wfbp"], [], 64, cost_mode="calibrated")
    assert set(thr_p.cost_mode) == {"paper"} and set(thr_c.cost_mode) == {"calibrated"}
    assert thr_c.iteration_s.iloc[0] != thr_p.iteration_s.iloc[0]
    with pytest.raises(ValueError, match="cost_mode must be one of"):
        study.paper_scale_tables(["resnet50"], ["10gbe-dear64"], ["wfbp"], [], 64, cost_mode="x")
