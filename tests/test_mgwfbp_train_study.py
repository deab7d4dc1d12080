import pandas as pd
import pytest

from repro.studies import mgwfbp_train as study


def _runs():
    rows = [
        {"model": "m", "scheduler": "local", "world_size": 1, "iteration_s": 1.0, "wire_dtype": "float32"},
        {"model": "m", "scheduler": "wfbp", "world_size": 2, "iteration_s": 1.6, "wire_dtype": "float32"},
        {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 1.25, "wire_dtype": "float32"},
        {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 1.1, "wire_dtype": "float16"},
    ]
    return pd.DataFrame(rows)


def test_speedup_is_p_t1_over_tp_in_fp32_with_linear_reference():
    s = study.speedup_table(_runs(), ["wfbp", "mgwfbp"]).set_index(["scheduler", "workers"])["speedup"]
    assert s[("wfbp", 2)] == pytest.approx(2 * 1.0 / 1.6)
    assert s[("mgwfbp", 2)] == pytest.approx(2 * 1.0 / 1.25)  # the fp16 run is not mixed in
    assert s[("linear", 1)] == 1 and s[("linear", 2)] == 2


def test_allreduce_fit_table_recovers_lines():
    times = pd.DataFrame([{"workers": p, "bytes": n, "seconds": a + b * n}
                          for p, a, b in ((2, 1e-4, 1e-9), (4, 3e-4, 2e-9)) for n in (1e3, 1e5, 1e7)])
    fits = study.allreduce_fit_table(times).set_index("workers")
    assert fits.loc[4, "a_s"] == pytest.approx(3e-4) and fits.loc[2, "b_s_per_byte"] == pytest.approx(1e-9)


def test_reading_a_missing_results_dir_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="read_only=False or copy a cluster job"):
        study.load_runs(tmp_path)


def test_convergence_runs_are_not_mixed_into_timings():
    runs = _runs().assign(dataset="synthetic")
    conv = {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 9.0, "wire_dtype": "float32",
            "dataset": "digits"}
    runs = pd.concat([runs, pd.DataFrame([conv])], ignore_index=True)
    s = study.speedup_table(runs, ["mgwfbp"])
    assert len(s[s.scheduler == "mgwfbp"]) == 1


def test_allreduce_fit_honours_small_messages_and_reports_relative_errors():
    # a start-up-dominated small message and bandwidth-dominated large ones, with noise on the large
    sizes = [4096, 65536, 1048576, 16777216, 67108864]
    secs = [5e-3, 6e-3, 2.2e-2, 0.30, 1.25]
    times = pd.DataFrame({"workers": 2, "bytes": sizes, "seconds": secs})
    fits = study.allreduce_fit_table(times)
    errors = study.allreduce_fit_errors(times, fits)
    assert list(errors.columns[:5]) == ["workers", "bytes", "measured_s", "fitted_s", "relative_error"]
    assert errors.relative_error.to_list() == pytest.approx((errors.fitted_s / errors.measured_s - 1).to_list())
    small = errors[errors.bytes == 4096].iloc[0]
    assert abs(small.relative_error) < 0.1  # an unweighted fit is 79 % low here
    assert fits.iloc[0].max_abs_relative_error == pytest.approx(errors.relative_error.abs().max())
    assert fits.iloc[0].weighting == "relative"


# ------------------------------------------------------------------------------ oversubscription

def _runs_on(cpus: int):
    rows = [
        {"model": "m", "scheduler": "local", "world_size": 1, "iteration_s": 1.0},
        {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 1.2},
        {"model": "m", "scheduler": "mgwfbp", "world_size": 4, "iteration_s": 2.5},
        {"model": "m", "scheduler": "wfbp", "world_size": 2, "iteration_s": 1.4},
        {"model": "m", "scheduler": "wfbp", "world_size": 4, "iteration_s": 2.9},
    ]
    return pd.DataFrame(rows).assign(wire_dtype="float32", cpu_count=cpus, threads_per_rank=1)


def test_runs_with_more_ranks_than_cores_are_marked_in_the_table_and_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures.mgwfbp_plots import plot_real_speedup
    from repro.figures.style import OVERSUBSCRIBED_LABEL
    from repro.studies.common import with_oversubscription

    runs = with_oversubscription(_runs_on(cpus=2))
    assert runs.set_index(["scheduler", "world_size"]).oversubscribed.to_dict() == {
        ("local", 1): False, ("mgwfbp", 2): False, ("mgwfbp", 4): True, ("wfbp", 2): False, ("wfbp", 4): True}
    s = study.speedup_table(runs, ["wfbp", "mgwfbp"])
    assert "oversubscribed" in s
    real = s[s.scheduler != "linear"]
    assert real.set_index(["scheduler", "workers"]).oversubscribed.to_dict() == {
        ("mgwfbp", 2): False, ("mgwfbp", 4): True, ("wfbp", 2): False, ("wfbp", 4): True}
    assert not s[s.scheduler == "linear"].oversubscribed.any()
    fig = plot_real_speedup(s, "test")
    rings = [c for c in fig.axes[0].collections if c.get_label() == "_oversubscribed"]
    assert len(rings) == 2 and all(len(c.get_offsets()) == 1 for c in rings)  # the P=4 point of each scheduler
    assert [list(c.get_offsets()[0]) for c in rings][0][0] == 4
    assert OVERSUBSCRIBED_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)

    # enough cores: nothing is marked, no legend entry
    s = study.speedup_table(with_oversubscription(_runs_on(cpus=8)), ["wfbp", "mgwfbp"])
    assert not s.oversubscribed.any()
    fig = plot_real_speedup(s, "test")
    assert not [c for c in fig.axes[0].collections if c.get_label() == "_oversubscribed"]
    assert OVERSUBSCRIBED_LABEL not in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)


def test_breakdown_bars_of_oversubscribed_runs_are_hatched():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures.mgwfbp_plots import plot_breakdown
    from repro.figures.style import OVERSUBSCRIBED_HATCH, OVERSUBSCRIBED_LABEL

    bd = pd.DataFrame([{"model": "m", "scheduler": s, "workers": 4, "wire_dtype": "float32", "source": "measured",
                        "computation_s": 0.1, "exposed_comm_s": 0.05, "oversubscribed": s == "wfbp"}
                       for s in ("wfbp", "mgwfbp")])
    fig = plot_breakdown(bd, "test")
    hatched = [p for p in fig.axes[0].patches if p.get_hatch() == OVERSUBSCRIBED_HATCH]
    assert len(hatched) == 2  # both stacked parts of the one oversubscribed bar
    assert OVERSUBSCRIBED_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)


def test_launching_more_ranks_than_cores_warns_before_the_ranks_start(monkeypatch, tmp_path):
    from repro.launch import cpus
    from repro.studies import common

    launched = []
    monkeypatch.setattr(study, "available_cpus", lambda: 2)
    monkeypatch.setattr(cpus, "available_cpus", lambda: 2)
    monkeypatch.setattr(study, "launch_local", lambda fn, p, **kw: launched.append(p) or [[1e-3, 2e-3]] * p)
    monkeypatch.setattr(study, "load_runs", lambda d: pd.DataFrame())
    with pytest.warns(common.OversubscriptionWarning, match="4 ranks.*2 CPU core"):
        study.run_grid([{"model": "tiny_resnet", "scheduler": "wfbp"}], [2, 4], tmp_path)
    assert launched == [2, 4]
    with pytest.warns(common.OversubscriptionWarning, match="all-reduce timing: 4 ranks"):
        times = study.measure_allreduce([2, 4], [1024, 4096], tmp_path)
    assert times.set_index("workers").oversubscribed.groupby(level=0).all().to_dict() == {2: False, 4: True}
    assert (times.cpu_count == 2).all()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", common.OversubscriptionWarning)
        study.run_grid([{"model": "tiny_resnet", "scheduler": "wfbp"}], [2], tmp_path, overwrite=True)


# ------------------------------------------------------------------------------ breakdown and threshold sweep
# Run folders as repro.train writes them (2 ranks): each run measured its own warm-up trace (its layers'
# times scaled by ``speed``) and its own computation-only time; the threshold runs were timed slower.

def _trace(speed: float):
    from dataclasses import replace

    from repro.core.trace import load_trace

    t = load_trace("tiny_resnet_b32_cpu")
    return t.replace_layers([replace(lay, forward_s=lay.forward_s * speed, backward_s=lay.backward_s * speed)
                             for lay in t.layers])


def _write_mg_run(root, scheduler, *, iteration_s, compute_s, speed, wire_dtype=None, threshold=None, stamp=0):
    from repro.core.cost import CostModel
    from repro.core.planners import make_plan
    from repro.results.runs import ITERATIONS_CSV, RunWriter

    trace = _trace(speed)
    cost = CostModel.from_alpha_beta(2, 1e-4, 8 / 1e8)
    opts = {"threshold_bytes": threshold} if threshold is not None else {}
    plan = make_plan(scheduler, trace, cost, wire_dtype=wire_dtype, **opts)
    run_id = "_".join(str(x) for x in ("tiny_resnet", scheduler, "p2", wire_dtype or "float32")
                      + ((f"t{threshold}",) if threshold is not None else ()))
    summary = {"run_id": run_id, "model": "tiny_resnet", "scheduler": scheduler, "world_size": 2, "steps": 4,
               "iteration_s": iteration_s, "compute_s": compute_s, "exposed_comm_s": max(0.0, iteration_s - compute_s),
               "throughput_samples_s": 64 / iteration_s, "buckets": plan.num_buckets, "batch_size": 32,
               "wire_dtype": wire_dtype or "float32", "predicted_iteration_s": plan.meta.get("iteration_s")}
    with RunWriter(root, run_id) as w:
        w.table(ITERATIONS_CSV, pd.DataFrame([{"step": i, "iteration_s": iteration_s} for i in range(4)])
                .assign(run_id=run_id))
        w.trace(trace)
        w.plan(plan)
        w.cost(cost)
        w.record({"run_id": run_id, "summary": summary,
                  "config": {"model": "tiny_resnet", "scheduler": scheduler, "threshold_bytes": threshold,
                             "dataset": None, "epochs": None},
                  "environment": {"cpu_count": 2, "threads_per_rank": 1,
                                  "time_utc": f"2026-11-28T10:{stamp:02d}:00+00:00"}})
    return run_id


@pytest.fixture
def mg_runs(tmp_path):
    root = tmp_path / "runs"
    _write_mg_run(root, "wfbp", iteration_s=0.30, compute_s=0.55, speed=1.6, stamp=1)
    _write_mg_run(root, "syncea", iteration_s=0.32, compute_s=0.20, speed=1.0, stamp=2)
    _write_mg_run(root, "mgwfbp", iteration_s=0.28, compute_s=0.28, speed=1.2, stamp=3)
    _write_mg_run(root, "optimal", iteration_s=0.28, compute_s=0.26, speed=1.1, stamp=4)
    _write_mg_run(root, "wfbp", iteration_s=0.29, compute_s=0.27, speed=1.0, wire_dtype="float16", stamp=5)
    # thresholds whose plans are WFBP's (below every layer) and SyncEASGD's (above the model), timed later
    _write_mg_run(root, "threshold", iteration_s=0.66, compute_s=0.27, speed=0.9, threshold=1, stamp=6)
    _write_mg_run(root, "threshold", iteration_s=0.70, compute_s=0.27, speed=0.9, threshold=2**30, stamp=7)
    _write_mg_run(root, "threshold", iteration_s=0.68, compute_s=0.27, speed=0.9, threshold=65536, stamp=8)
    return study.load_runs(tmp_path)


def test_breakdown_measures_computation_once_per_model_and_simulates_on_one_trace(mg_runs):
    bd = study.breakdown_table(mg_runs, ["wfbp", "syncea", "mgwfbp"])
    meas, sim = bd[bd.source == "measured"], bd[bd.source == "simulated"]
    assert len(meas) == 4 and len(sim) == 4  # wfbp FP32 and FP16, syncea, mgwfbp
    want = pd.Series([0.55, 0.20, 0.28, 0.27]).median()
    assert meas.computation_s.to_list() == pytest.approx([want] * 4)  # not 550 ms for one and 200 for another
    assert (meas.exposed_comm_s == (meas.iteration_s - want).clip(lower=0)).all()
    assert sorted(meas.run_compute_s) == pytest.approx([0.20, 0.27, 0.28, 0.55])
    assert set(sim.trace_from) == {"tiny_resnet_mgwfbp_p2_float32"}
    assert sim.computation_s.nunique() == 1  # one trace: the same computation for every scheduler
    assert "median" in bd.derivation.iloc[0]


def test_breakdown_figure_keeps_one_bar_meaning_and_prints_no_gain_of_its_own(mg_runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures.mgwfbp_plots import plot_breakdown
    from repro.studies import mgwfbp_sim

    bd = study.breakdown_table(mg_runs, ["wfbp", "syncea", "mgwfbp"])
    paper = mgwfbp_sim.paper_breakdown_table(models=("densenet201",), networks=("10gbe-v100",))
    fig = plot_breakdown(bd, "tiny scale, test", paper, mgwfbp_sim.journal_headline())
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "every panel: left bar FP32" in texts and "every panel: right bar (lighter) FP16" in texts
    assert not any("upper panels" in t or "lower panels" in t for t in texts)
    titles = " ".join(ax.get_title() for ax in fig.axes) + fig._suptitle.get_text()
    assert "x WFBP" not in titles  # no simulated gain in a panel title
    assert "up to 1.7x over WFBP" in fig._suptitle.get_text() and "claims page" in fig._suptitle.get_text()
    assert "median of 4 runs' computation-only steps (theirs ranged 200-550 ms)" in titles.replace("\n", " ")
    assert "tiny_resnet_mgwfbp_p2_float32" in titles
    plt.close(fig)


def test_threshold_sweep_simulates_every_point_on_one_trace_and_finds_same_plan_runs(mg_runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from repro.figures.mgwfbp_plots import plot_threshold_sweep

    sweep = study.threshold_sweep_table(mg_runs)
    sim = sweep[sweep.source == "simulated"]
    assert set(sim.trace_from) == {"tiny_resnet_mgwfbp_p2_float32"} and len(sim) == 7  # 3 thresholds + 4 refs
    by = sweep[sweep.source == "measured"].set_index("threshold_bytes", drop=False)
    assert by.loc[1, "same_plan_as"] == "wfbp" and by.loc[2**30, "same_plan_as"] == "syncea"
    assert sweep.run_order.max() == 6 and by.loc[1, "run_order"] == 4  # the FP16 run is not in the sweep
    # one plan, one trace: a threshold below every layer simulates exactly as WFBP
    s = sim.assign(threshold_bytes=sim.threshold_bytes.fillna(-1)).set_index(["scheduler", "threshold_bytes"])
    assert s.loc[("threshold", 1), "iteration_s"] == pytest.approx(s.loc[("wfbp", -1), "iteration_s"])
    fig = plot_threshold_sweep(sweep, note="tiny scale, test")
    note = " ".join(" ".join(t.get_text() for t in fig.texts).split())
    assert "threshold 1 B ran WFBP's bucketing but measured 660 ms vs 300 ms (2.2x)" in note
    assert "one plan, two timings" in note and "SyncEASGD's bucketing" in note
    plt.close(fig)
