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


# ---------------------------------------------------------------------------------------------
# The notebook's tables (moved from notebooks/dear_training.ipynb): hand-built frames in the shapes the
# notebook passes, concrete values
# ---------------------------------------------------------------------------------------------

def test_interleaved_configs_alternate_then_append_the_rest():
    t = [{"id": f"t{i}"} for i in range(3)]
    s = [{"id": f"s{i}"} for i in range(3)]
    ids = lambda cs: [c["id"] for c in cs]  # noqa: E731
    assert ids(study.interleaved_configs(t, s[:1])) == ["t0", "s0", "t1", "t2"]
    assert ids(study.interleaved_configs(t[:1], s)) == ["t0", "s0", "s1", "s2"]
    assert ids(study.interleaved_configs(t[:2], s[:2])) == ["t0", "s0", "t1", "s1"]
    assert study.interleaved_configs([], []) == []


def test_at_workers_and_the_scheduler_selections():
    table = pd.DataFrame({"scheduler": ["wfbp", "dear_model", "dear_optimal"], "workers": [2, 2, 4]})
    assert study.at_workers(table, 2).scheduler.tolist() == ["wfbp", "dear_model"]
    empty = pd.DataFrame()
    assert study.at_workers(empty, 2) is empty
    assert study.planner_references(table).scheduler.tolist() == ["dear_model", "dear_optimal"]
    assert study.breakdown_schedulers(["horovod", "dear_optimal", "wfbp", "fsdp"]) == ["wfbp", "dear_optimal"]
    assert study.split_dear(["wfbp", "dear_nofusion", "bytescheduler", "dear_model"]) == (
        ["dear_nofusion", "dear_model"], ["wfbp", "bytescheduler"])


def _measured_runs() -> pd.DataFrame:
    return pd.DataFrame({"model": "tiny_resnet", "scheduler": ["wfbp", "dear_threshold", "wfbp"],
                         "workers": [2, 2, 4], "iteration_s": [0.2, 0.16, 0.5],
                         "throughput_samples_s": [160.0, 200.0, 128.0], "predicted_s": [0.25, np.nan, 0.4]})


def test_measured_throughput_takes_the_sample_median_and_rescales_the_throughput():
    samples = pd.DataFrame({"model": "tiny_resnet", "workers": 2, "scheduler": "wfbp",
                            "iteration_s": [0.1, 0.3, 0.4]})
    thr = study.measured_throughput(_measured_runs(), samples, 2).set_index("scheduler")
    assert list(thr.index) == ["wfbp", "dear_threshold"]
    assert thr.loc["wfbp", "iteration_s"] == pytest.approx(0.3)
    assert thr.loc["wfbp", "run_iteration_s"] == pytest.approx(0.2)
    assert thr.loc["wfbp", "samples"] == 3
    assert thr.loc["wfbp", "throughput_samples_s"] == pytest.approx(160.0 * 0.2 / 0.3)
    assert thr.loc["wfbp", "prediction_error"] == pytest.approx(0.25 / 0.3 - 1)
    # no sample of dear_threshold: its run's own values, nothing predicted
    assert thr.loc["dear_threshold", "samples"] == 0
    assert thr.loc["dear_threshold", "throughput_samples_s"] == pytest.approx(200.0)
    assert np.isnan(thr.loc["dear_threshold", "prediction_error"])
    read = study.measured_throughput(_measured_runs(), None, 4)
    assert read.iteration_s.tolist() == [0.5] and read.prediction_error.tolist() == [pytest.approx(-0.2)]


def test_paper_claim_text():
    assert study.paper_claim_text("10gbe-dear64") == "83%"
    assert study.paper_claim_text("56gbib-dear64") == "15%"
    assert study.paper_claim_text("loopback") == "n/a"


def _sim_throughput() -> pd.DataFrame:
    rows = [("m1", "wfbp", 1.0), ("m1", "bytescheduler", 0.9), ("m1", "dear_nofusion", 0.6), ("m1", "horovod", 0.1),
            ("m2", "wfbp", 2.0), ("m2", "bytescheduler", 2.2), ("m2", "dear_nofusion", 1.6)]
    t = pd.DataFrame(rows, columns=["model", "scheduler", "iteration_s"])
    return t.assign(network="10gbe-dear64", workers=64, throughput=64 * 32 / t.iteration_s, cost_mode="paper")


def test_throughput_group_tables_and_its_summary_line():
    measured = pd.DataFrame({"model": "tiny_resnet", "scheduler": ["wfbp", "bytescheduler", "dear_nofusion", "horovod"],
                             "iteration_s": [0.2, 0.25, 0.16, 0.1]})
    names = ["wfbp", "bytescheduler", "dear_nofusion"]
    sim_rows, speedups, text = study.throughput_group(measured, _sim_throughput(), names, names, model="tiny_resnet",
                                                      workers=64, cost_mode="paper",
                                                      networks=["10gbe-dear64", "56gbib-dear64"])
    assert sorted(set(sim_rows.scheduler)) == sorted(names) and len(sim_rows) == 6  # horovod is not in the group
    assert speedups.model.tolist() == ["m1", "m2", "all models (max: m1)", "tiny_resnet"]
    assert speedups.origin.tolist() == ["simulated"] * 3 + ["measured"]
    assert speedups.speedup_pct.tolist() == pytest.approx([50.0, 25.0, 50.0, 25.0])
    assert speedups.best_baseline.tolist() == ["bytescheduler", "wfbp", "bytescheduler", "wfbp"]
    assert text == ("DeAR vs best baseline here - simulated (64 GPUs, paper model), largest over the models: "
                    "10gbe-dear64 +50% (m1); measured (tiny_resnet): dear_nofusion vs wfbp +25%; paper's claim "
                    "(Zhang et al., ICDCS 2023), best DeAR vs best of all baselines, 64 GPUs: up to 83% on "
                    "10gbe-dear64, 15% on 56gbib-dear64")


def test_speedup_text_leaves_out_a_missing_measurement():
    from repro.studies.dear_sim import speedup_summary

    summary = speedup_summary(_sim_throughput())
    text = study.speedup_text(summary, pd.DataFrame(), model="tiny_resnet", workers=64, cost_mode="paper",
                              networks=["10gbe-dear64"])
    # horovod (0.1 s) is the best baseline of m1: DeAR loses there, so m2 (2.0 / 1.6) is the largest
    assert text == ("DeAR vs best baseline here - simulated (64 GPUs, paper model), largest over the models: "
                    "10gbe-dear64 +25% (m2); paper's claim (Zhang et al., ICDCS 2023), best DeAR vs best of all "
                    "baselines, 64 GPUs: up to 83% on 10gbe-dear64")


def test_measured_sweep_bounds_and_the_tuning_objectives(trace, cost):
    sweep = pd.DataFrame({"threshold_bytes": [8192, 32768, 131072, 8192, 524288],
                          "iteration_s": [0.4, 0.2, 0.3, 0.35, 0.5],
                          "source": ["measured", "measured", "measured", "simulated", "measured"]})
    points = study.measured_sweep(sweep)
    assert points.threshold_bytes.tolist() == [8192, 32768, 131072, 524288]
    assert study.sweep_bounds(points) == (8192, 524288)
    objectives = study.tuning_objectives(points, trace, cost)
    assert list(objectives) == ["measured", "model"]
    assert objectives["measured"](8192) == pytest.approx(0.4)
    assert objectives["measured"](16384) == pytest.approx(0.3)  # halfway in log2 between 0.4 and 0.2
    assert objectives["model"](32768) == pytest.approx(study.model_objective(trace, cost)(32768))


def test_paper_trace_cost_is_the_shipped_trace_on_the_preset_itself():
    from repro.studies.dear_sim import load_traces

    trace, cost = study.paper_trace_cost("bert_base", "10gbe-dear64", 64)
    assert cost == preset("10gbe-dear64", 64)
    assert trace.num_layers == load_traces(["bert_base"])["bert_base"].num_layers


def test_offline_search_table_adds_the_paper_objective_on_its_bounds():
    f = lambda t: abs(np.log2(t) - 15.0) + 1.0  # noqa: E731
    table = study.offline_search_table({"measured": f}, (2**13, 2**19), f, trials=4, seeds=[0, 1])
    assert list(dict.fromkeys(table.objective)) == ["measured", "paper"]
    # per objective: bo and random once per seed, grid once; 4 trials each
    assert table.groupby("objective").size().to_dict() == {"measured": 20, "paper": 20}
    bounds = table.groupby("objective")[["bounds_low_bytes", "bounds_high_bytes"]].first()
    assert bounds.loc["measured"].tolist() == [2**13, 2**19]
    assert bounds.loc["paper"].tolist() == [2**20, 2**28]
    assert (table.threshold_bytes >= table.bounds_low_bytes).all()
    assert (table.threshold_bytes <= table.bounds_high_bytes).all()


def test_planner_marks_and_their_long_table():
    measured_marks = pd.DataFrame({"model": "tiny_resnet", "scheduler": ["dear_model", "dear_optimal"],
                                   "buckets": [3, 2], "measured_s": [0.12, 0.11], "predicted_s": [0.1, 0.09],
                                   "threshold_bytes": [16384.0, np.nan]})
    objective = lambda t: t / 1e6  # noqa: E731
    measured = study.measured_planner_marks(measured_marks, objective)
    assert list(measured.columns) == ["scheduler", "seconds", "kind"]
    assert measured.values.tolist() == [["dear_model", 0.12, "measured run"], ["dear_optimal", 0.11, "measured run"],
                                        ["dear_model", pytest.approx(0.016384), "its threshold on the sweep"]]
    periods = pd.DataFrame({"scheduler": ["dear_model", "dear_optimal"], "seconds": [0.2, 0.18], "buckets": [4, 3],
                            "threshold_bytes": [65536.0, np.nan]})
    marks = study.planner_marks(measured_marks, objective, periods, periods.assign(seconds=[2.0, 1.8]))
    assert list(marks) == ["measured", "model", "paper"]
    assert marks["model"].kind.tolist() == ["predicted", "predicted"]
    table = study.marks_long_table(marks)
    assert list(table.columns) == ["scheduler", "seconds", "kind", "objective", "buckets", "threshold_bytes"]
    assert table.objective.tolist() == ["measured"] * 3 + ["model"] * 2 + ["paper"] * 2
    assert table.seconds.tolist()[3:] == [0.2, 0.18, 2.0, 1.8]
    assert table.buckets.iloc[:3].isna().all() and table.buckets.iloc[3:].tolist() == [4, 3, 4, 3]


def test_best_found_is_each_searchs_last_best():
    comparison = pd.DataFrame({"objective": "measured", "method": ["bo"] * 3 + ["grid"] * 2, "seed": 0,
                               "trial": [1, 2, 3, 1, 2], "best_so_far_s": [3.0, 2.0, 2.0, 5.0, 4.0],
                               "best_threshold_bytes": [10, 20, 20, 40, 50]})
    found = study.best_found(comparison)
    assert found.index.tolist() == [("measured", "bo", 0), ("measured", "grid", 0)]
    assert found.to_dict("list") == {"best_s": [2.0, 4.0], "threshold_bytes": [20, 50]}


def test_chosen_trial_text_and_the_live_tuners_range(monkeypatch):
    live = pd.DataFrame({"trial": [1, 2, 3], "chosen": [False, True, True],
                         "threshold_bytes": [2**20, 2**17, 2**18], "buckets": [1, 2, 3]})
    assert study.chosen_trial_text(live) == "chosen 0.125 MiB (2 bucket(s))"
    assert study.chosen_trial_text(live.assign(chosen=False)) == "no trial chosen"
    assert study.chosen_trial_text(pd.DataFrame()) == "no trial chosen"
    monkeypatch.setattr(study, "tuner_options_supported", lambda: True)
    assert study.live_tuner_range(8192, 524288) == "8192-524288 bytes"
    monkeypatch.setattr(study, "tuner_options_supported", lambda: False)
    assert study.live_tuner_range(8192, 524288) == "1-256 MiB, the tuner's default (a run cannot set its range yet)"


def test_bo_tuning_titles():
    titles = plots.bo_tuning_titles("tiny_resnet", (8192, 524288), "tiny scale", workers=64, network="10gbe-dear64",
                                    tuning_model="bert_base", sim_note="V100")
    assert titles == {
        "measured": "measured sweep of tiny_resnet, interpolated in log2(threshold), 8192-524288 bytes (tiny scale)",
        "model": "DeAR model of the tiny_resnet run (its warm-up trace and fitted cost), 8192-524288 bytes",
        "paper": "simulated, 64 GPUs, 10gbe-dear64, bert_base (V100), 1-256 MiB"}


def test_the_live_tuners_starting_threshold_outside_its_range_is_said():
    live = pd.DataFrame({"trial": [0, 1], "threshold_bytes": [25 * 2**20, 80287]})
    assert study.starting_trial_text(live, 8192, 524288) == "trial 0: the starting threshold, 25 MiB, outside the range"
    assert study.starting_trial_text(live, 8192, 2**28) == ""
    assert study.starting_trial_text(live.iloc[0:0], 8192, 524288) == ""
