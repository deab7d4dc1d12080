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
    from repro.studies import common

    launched = []
    monkeypatch.setattr(study, "available_cpus", lambda: 2)
    monkeypatch.setattr(common, "available_cpus", lambda: 2)
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
