"""The DeAR figures' review fixes: each measured figure says which statistic it draws, the throughput figures
note computed when a run's own median and its interleaved samples' median disagree, the primitives' fitted
lines pass near their own points (outliers noted), the scaling figure is tagged by what it draws and names
both InfiniBand networks, and every bar says its method."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.figures import dear_plots  # noqa: E402
from repro.figures import dear_train_plots as plots  # noqa: E402
from repro.figures.save import tag_title  # noqa: E402
from repro.studies import dear_sim  # noqa: E402
from repro.studies import dear_train as study  # noqa: E402


def _measured(run_s=(0.061, 0.040)):
    return pd.DataFrame({"model": "tiny_resnet", "scheduler": ["bytescheduler", "fsdp"], "workers": 2,
                         "iteration_s": [0.028, 0.041], "throughput_samples_s": [1148.0, 780.0],
                         "predicted_s": [0.055, np.nan], "run_iteration_s": list(run_s), "samples": 5,
                         "oversubscribed": False})


def _sim_thr():
    return pd.DataFrame({"model": "resnet50", "network": "10gbe-dear64", "workers": 64,
                         "scheduler": ["bytescheduler", "dear_threshold"], "throughput": [900.0, 1000.0],
                         "iteration_s": [0.2, 0.18]})


def _texts(fig):
    return "\n".join([t.get_text() for t in fig.texts] + [ax.get_title() for ax in fig.axes]
                     + [t.get_text() for ax in fig.axes for t in ax.texts])


def test_throughput_states_its_statistic_and_notes_a_run_drift_over_1_5x():
    m = _measured()
    (line,) = plots.drift_lines(m)
    assert "ByteScheduler" in line and "27.9 ms" not in line and "28 ms" in line and "61 ms whole run" in line
    fig = plots.plot_throughput(m, _sim_thr(), ["bytescheduler", "fsdp"], ["bytescheduler", "dear_threshold"],
                                "T", "note", "sim")
    title = fig.axes[0].get_title().replace("\n", " ")
    assert "median of 5 interleaved side-by-side timing samples" in title and "own median step" in title
    text = _texts(fig)
    assert "the side-by-side samples cancel that drift" in text and "FSDP2" in text
    assert "no plan prediction" in text and "no simulated bar" in text
    # within 1.5x: no drift note
    fig = plots.plot_throughput(_measured(run_s=(0.030, 0.040)), _sim_thr(), ["bytescheduler"], ["bytescheduler"],
                                "T", "note", "sim")
    assert "cancel that drift" not in _texts(fig)
    # a table without the runs' own medians says it draws them
    assert plots.throughput_statistic(_measured().drop(columns=["run_iteration_s"])) == \
        "bars: each run's own median step"


def test_ddp_buckets_and_dear_threshold_colours_differ_in_dear_figures():
    assert dear_plots.method_style("ddp_buckets")["color"] != dear_plots.method_style("dear_threshold")["color"]


def test_primitive_fit_passes_near_the_large_points_and_notes_the_outliers():
    # CPU-like times: small messages start-up only, one 4 KiB all-gather outlier
    sizes = [4096, 32768, 262144, 2097152]
    ms = {"allgather": [3.41, 0.314, 11.0, 89.2], "reduce_scatter": [0.365, 0.300, 11.1, 88.6],
          "allreduce": [0.306, 2.67, 22.0, 178.3]}
    rows = [{"workers": 2, "bytes": n, "primitive": p, "seconds": t * 1e-3, "oversubscribed": False}
            for p, ts in ms.items() for n, t in zip(sizes, ts)]
    df = study.primitive_cost_table(pd.DataFrame(rows))
    for p in ms:
        big = df[(df.primitive == p) & (df.bytes == sizes[-1])].set_index("source").seconds
        assert 0.5 < big["fit"] / big["measured"] < 2.0, p  # was 4-5x off with the relative-error fit
    lines = plots.primitive_outlier_lines(df)
    ag4 = [ln for ln in lines if "all-gather (ring), 4 KiB" in ln]
    assert len(ag4) == 1 and "start-up noise" in ag4[0] and "fitted" in ag4[0]
    fig = plots.plot_primitive_cost(df, study.primitive_model_table(workers=(2, 4)), "m", "model")
    assert any("off its primitive's fitted line" in t.get_text() for t in fig.texts)


def test_fit_linear_log_recovers_a_line():
    x = np.array([4096.0, 65536, 2**20])
    a, b = study.fit_linear_log(x, 1e-3 + 8e-9 * x)
    assert a == pytest.approx(1e-3, rel=1e-3) and b == pytest.approx(8e-9, rel=1e-3)


def test_scaling_is_tagged_by_what_it_draws_and_names_both_ib_networks():
    table = pd.DataFrame({"model": ["resnet50", "bert_base"]})
    assert dear_sim.figure_scale(table) == "paper"
    assert dear_sim.figure_scale(pd.DataFrame({"model": ["tiny_resnet"]})) == "tiny"
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.suptitle("Throughput vs number of GPUs per method (simulated)")
    assert "tiny" not in tag_title(fig, scale=dear_sim.figure_scale(table), source=["simulated"])
    note = dear_plots.ib_network_note(["10gbe-dear-derived", "56gbib-dear-derived"])
    assert "56Gb" in note and "100Gb" in note and "56gbib-dear-derived" in note
    assert dear_plots.ib_network_note(["10gbe-dear-derived"]) == ""


def test_breakdown_states_its_statistic_and_labels_each_simulated_bar():
    parts = {"computation_s": 0.01, "exposed_rs_s": 0.002, "exposed_ag_s": 0.003, "exposed_allreduce_s": 0.0,
             "exposed_idle_s": 0.0}
    measured = pd.DataFrame([{"model": "tiny_resnet", "scheduler": "dear_threshold", "workers": 2, "source": src,
                              "iteration_s": 0.015, **parts} for src in ("measured", "simulated")])
    sim = pd.DataFrame([{"model": "resnet50", "network": "10gbe-dear64", "workers": 64, "scheduler": s,
                         "iteration_s": 0.015, **parts} for s in ("wfbp", "dear_threshold", "dear_optimal")])
    fig = plots.plot_breakdown(measured, sim, "m", "s")
    assert plots.BREAKDOWN_STATISTIC in fig.axes[0].get_title().replace("\n", " ")
    under = [t.get_text() for t in fig.axes[1].texts]
    assert under == [plots.short_label(s) for s in ("wfbp", "dear_threshold", "dear_optimal")]


def test_buffer_sweep_draws_the_reference_runs_by_the_sweeps_statistic():
    """The sweep's points are each run's own median step: a planner's line is its run's own median too."""
    sweep = pd.DataFrame({"model": "tiny_resnet", "workers": 2, "threshold_bytes": [8192, 131072], "buckets": [4, 1],
                          "source": "measured", "iteration_s": [0.05, 0.04]})
    refs = pd.DataFrame({"model": ["tiny_resnet"], "scheduler": ["dear_optimal"], "iteration_s": [0.020],
                         "run_iteration_s": [0.030]})
    fig = plots.plot_buffer_sweep(sweep, refs, pd.DataFrame(), "m", "s")
    ys = [ln.get_ydata()[0] for ln in fig.axes[0].get_lines() if len(ln.get_ydata()) == 2
          and ln.get_ydata()[0] == ln.get_ydata()[1]]
    assert ys and ys[-1] == pytest.approx(30.0)
    assert "own median step" in fig.axes[0].get_title().replace("\n", " ")
