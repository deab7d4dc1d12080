"""Readability fixes of the figures: titles fit their panels, labels under bars clear of the tick labels,
trial labels clear of the best-so-far steps, sparse log ticks, and markers hidden under others named."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.figures import dear_train_plots as dtp  # noqa: E402
from repro.figures.style import (add_note, fit_title, hidden_markers, hidden_markers_text,  # noqa: E402
                                 sparse_log_ticks, use_style)


@pytest.fixture(autouse=True)
def _style():
    use_style()
    yield
    plt.close("all")


def test_hidden_markers_names_the_marker_underneath_and_skips_apart_ones():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2], [1.0, 1.1545], marker="o", label="WFBP")
    ax.plot([1, 2], [1.0, 1.1515], marker="s", label="SyncEASGD")
    ax.plot([1, 2], [1.0, 1.9], marker="^", label="far")  # hides at x=1 only
    ax.plot([1, 2], [1.0, 1.15], label="_hidden")  # unlabelled: left out
    ax.set_ylim(0.9, 2.0)
    hidden = hidden_markers(ax)
    pairs = {(h.under, h.over, h.x) for h in hidden}
    assert ("WFBP", "SyncEASGD", 2.0) in pairs and ("WFBP", "far", 2.0) not in pairs
    assert ("SyncEASGD", "far", 1.0) in pairs
    text = hidden_markers_text(hidden, skip=[("far", "WFBP"), ("SyncEASGD", "far")])
    assert text == "WFBP under SyncEASGD at 1 (1 vs 1), 2 (1.15 vs 1.15)"
    # zorder decides what is on top, before the drawing order
    fig, ax = plt.subplots()
    ax.plot([1], [1], marker="o", label="top", zorder=5)
    ax.plot([1], [1], marker="o", label="bottom", zorder=1)
    assert [(h.under, h.over) for h in hidden_markers(ax)] == [("bottom", "top")]


def test_fit_title_wraps_to_the_axes_width_and_add_note_keeps_its_size():
    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    t = fit_title(axes[0], "a long title " * 12, fontsize="small")
    r = fig.canvas.get_renderer()
    assert t.get_window_extent(r).width <= axes[0].get_window_extent(r).width
    size = axes[1].set_title("x", fontsize="small").get_fontsize()
    add_note(axes[1], "a note")
    assert axes[1].title.get_fontsize() == size


def test_sparse_log_ticks_thin_out_over_many_decades():
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(0.001, 300)  # five decades: 1, 2, 5 would be 15 ticks
    sparse_log_ticks(ax.yaxis, max_ticks=7)
    ticks = [v for v in ax.yaxis.get_major_locator().tick_values(0.001, 300) if 0.001 <= v <= 300]
    assert 3 <= len(ticks) <= 8
    ax.set_ylim(1, 50)
    sparse_log_ticks(ax.yaxis, max_ticks=7)
    ticks = [v for v in ax.yaxis.get_major_locator().tick_values(1, 50) if 1 <= v <= 50]
    assert ticks == [1, 2, 5, 10, 20, 50]


def test_throughput_titles_stay_within_their_panels():
    m = pd.DataFrame({"model": "tiny_resnet", "scheduler": ["bytescheduler", "wfbp"], "workers": 2,
                      "iteration_s": [0.028, 0.041], "throughput_samples_s": [1148.0, 780.0],
                      "predicted_s": [0.055, 0.04], "run_iteration_s": [0.03, 0.04], "samples": 5,
                      "oversubscribed": False})
    sim = pd.DataFrame({"model": "resnet50", "network": ["10gbe-dear64"] * 2 + ["56gbib-dear64"] * 2,
                        "workers": 64, "scheduler": ["bytescheduler", "wfbp"] * 2,
                        "throughput": [900.0, 1000.0] * 2, "iteration_s": [0.2, 0.18] * 2})
    fig = dtp.plot_throughput(m, sim, ["bytescheduler", "wfbp"], ["bytescheduler", "wfbp"], "T",
                              "a rather long measured note with many words in it, " * 2, "sim note " * 6)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(r)
        assert ax.title.get_window_extent(r).width <= box.width + 1
    for left, right in zip(fig.axes, fig.axes[1:]):
        assert left.title.get_window_extent(r).x1 <= right.yaxis.label.get_window_extent(r).x0


def test_breakdown_bar_labels_end_above_the_model_names():
    parts = {"computation_s": 0.01, "exposed_rs_s": 0.002, "exposed_ag_s": 0.003, "exposed_allreduce_s": 0.0,
             "exposed_idle_s": 0.0}
    measured = pd.DataFrame([{"model": "tiny_resnet", "scheduler": "dear_threshold", "workers": 2, "source": src,
                              "iteration_s": 0.015, **parts} for src in ("measured", "simulated")])
    sim = pd.DataFrame([{"model": m, "network": "10gbe-dear64", "workers": 64, "scheduler": s,
                         "iteration_s": 0.015, **parts}
                        for m in ("resnet50", "densenet201") for s in ("wfbp", "dear_model", "dear_optimal")])
    fig = dtp.plot_breakdown(measured, sim, "m", "s")
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[1]
    lowest = min(t.get_window_extent(r).y0 for t in ax.texts)
    names = [t for t in ax.get_xticklabels() if t.get_text()]
    assert names and all(t.get_window_extent(r).y1 < lowest for t in names)


def test_trial_labels_go_below_the_trials_that_lowered_the_best():
    live = pd.DataFrame({"trial": [0, 1, 2, 3], "iteration_s": [0.047, 0.029, 0.055, 0.028],
                         "best_so_far_s": [0.047, 0.029, 0.029, 0.028]})
    assert dtp.trial_label_sides(live) == ["above", "below", "above", "below"]


def test_real_speedup_says_top_panel_and_names_hidden_markers():
    from repro.figures import mgwfbp_plots as mp

    speedup = pd.DataFrame({"model": "tiny_resnet", "scheduler": ["wfbp", "syncea", "mgwfbp", "linear", "linear"],
                            "workers": [2, 2, 2, 1, 2], "speedup": [1.1545, 1.1515, 1.56, 1.0, 2.0]})
    from repro.studies import mgwfbp_sim

    fig = mp.plot_real_speedup(speedup, "tiny scale", mgwfbp_sim.k80_speedup_table())
    assert "top panel measured" in fig._suptitle.get_text() and "top panels" not in fig._suptitle.get_text()
    top = fig.axes[0]
    notes = " ".join(t.get_text() for t in top.texts).replace("\n", " ")
    assert "WFBP under SyncEASGD at 2 workers" in notes
    bottom = [ax for ax in fig.axes if ax.get_visible()][1]
    assert bottom.title.get_fontsize() == top.title.get_fontsize()  # a note above keeps the title's size


def test_cost_compare_names_a_hidden_marker_and_the_allgather_formula_stays_whole():
    from repro.figures import omgs_micro_plots as om

    rows = []
    for d, t, ag in ((1024, 0.001, 0.3), (1048576, 1.95, 1.98), (4194304, 6.0, 0.5)):
        rows += [{"setting": "measured", "numel": d, "quantity": "topk_s", "seconds": t / 1e3},
                 {"setting": "measured", "numel": d, "quantity": "sparse_allgather_s", "seconds": ag / 1e3},
                 {"setting": "measured", "numel": d, "quantity": "allgather_startup_s", "seconds": 0.26e-3}]
    table = pd.DataFrame(rows).assign(density=0.001, workers=2)
    fig = om.plot_cost_compare(table, "n", paper=False)
    notes = " ".join(t.get_text() for t in fig.axes[0].texts).replace("\n", " ")
    assert "under sparse all-gather" in notes and "d = 1,048,576" in notes
    import textwrap
    wrapped = textwrap.fill("x " * 40 + f"which {om.AG_FORMULA} cannot follow", 50)
    assert any(om.AG_FORMULA in line for line in wrapped.split("\n"))


def _acc_rows():
    rows = []
    for method, label, accs, t in (("ps_bsp", "BSP", (0.5, 0.7, 0.9), 2.2), ("ps_asp", "ASP", (0.4, 0.6, 0.8), 1.7),
                                   ("ps_ssp", "SSP (s=2)", (0.4, 0.6, 0.8), 1.7)):
        for e, a in enumerate(accs, start=1):
            rows.append({"run_id": method, "method": method, "label": label, "epoch": e, "stage1_bytes_share": 0.0,
                         "test_accuracy": a, "train_loss": 2.0 - a, "time_s": t * e})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("x", ["epoch", "time_s"])
def test_accuracy_keeps_a_coinciding_curve_visible_and_says_so(x):
    from repro.figures import osp_plots

    fig = osp_plots.plot_accuracy(_acc_rows(), x, "t", "n")
    asp = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "ASP"][0]
    ssp = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "SSP (s=2)"][0]
    assert asp.get_markersize() > ssp.get_markersize() and asp.get_markerfacecolor() == "none"
    assert asp.get_linewidth() > ssp.get_linewidth()
    text = " ".join(t.get_text() for t in fig.texts)
    assert "ASP under SSP (s=2): every point of both panels" in text
    bsp = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "BSP"][0]
    assert bsp.get_markerfacecolor() != "none"  # apart from the others: drawn as usual
