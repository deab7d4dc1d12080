"""The plotting convention every figure follows (repro.figures.style) and the figures that use it."""

import re
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.figures import mgwfbp_plots as mp  # noqa: E402
from repro.figures.save import save_figure  # noqa: E402
from repro.figures.validation_plots import plot_sim_vs_real  # noqa: E402
from repro.figures.style import (  # noqa: E402
    BLACK,
    DARK_GREY,
    EXTRA_COLORS,
    FAMILIES,
    MAX_ASPECT,
    PALETTE,
    PAPER_ZORDER,
    STYLES,
    add_note,
    coinciding_lines,
    legend_below,
    paper_marker_style,
    scheduler_style,
    use_style,
)
from repro.core.schedulers import SCHEDULERS  # noqa: E402

FUTURE = ["dear", "bytescheduler", "osp", "bsp", "asp", "ssp", "horovod"]


@pytest.fixture(autouse=True)
def _style():
    use_style()
    yield
    plt.close("all")


def test_every_scheduler_has_its_own_fixed_style():
    for name in [*SCHEDULERS, *FUTURE, "paper", "linear"]:
        assert name in STYLES, f"{name} has no style in repro/figures/style.py"
    pairs = [(s.color, s.marker) for s in STYLES.values()]
    assert len(set(pairs)) == len(pairs), "every (colour, marker) pair must be unique"
    safe = set(PALETTE) | set(EXTRA_COLORS) | {BLACK, DARK_GREY}
    for name, s in STYLES.items():
        assert re.fullmatch(r"#[0-9a-f]{6}", s.color), name
        assert s.color in safe, f"{name}: {s.color} is not from the colour-blind-safe palette"
        assert s.color != PALETTE[8], f"{name}: yellow is unreadable on white"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_schedulers_drawn_together_differ_in_colour_and_marker(family):
    names = FAMILIES[family]
    assert len({STYLES[n].color for n in names}) == len(names)
    assert len({STYLES[n].marker for n in names}) == len(names)


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))


def test_syncea_and_mgwfbp_are_told_apart():
    # both appear in every all-reduce figure: orange next to orange-red was hard to tell apart
    a, b = _rgb(STYLES["syncea"].color), _rgb(STYLES["mgwfbp"].color)
    assert sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 > 120


def test_references_and_paper_values():
    assert scheduler_style("linear")["linestyle"] == "--" and scheduler_style("linear")["marker"] == ""
    assert scheduler_style("optimal")["zorder"] > scheduler_style("mgwfbp")["zorder"]  # dotted, on top
    kw = paper_marker_style("mgwfbp")
    assert kw["zorder"] == PAPER_ZORDER > max(s.zorder for n, s in STYLES.items() if n != "paper")
    assert kw["facecolors"] == "none" and kw["edgecolors"] == STYLES["mgwfbp"].color


def test_coinciding_lines_are_found_and_noted_outside_the_data():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 2, 3], label="A")
    ax.plot([1, 2, 3], [1, 2, 3.0000001], label="B")
    ax.plot([1, 2, 3], [3, 2, 1], label="C")
    ax.set_title("t")
    assert coinciding_lines(ax) == [("A", "B")]
    note = add_note(ax, "A and B coincide")
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    assert note.get_window_extent(r).y0 >= ax.get_window_extent(r).y1 - 1  # above the data area
    assert ax.title.get_window_extent(r).y0 >= note.get_window_extent(r).y1 - 1  # below the title


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1


def _legends_clear_of_data(fig) -> None:
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends, "figure has no legend"
    for leg in legends:
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            assert not _overlaps(box, ax.get_window_extent(r)), f"legend covers the axes {ax.get_title()!r}"


def _sim_tables():
    from repro.costs.presets import preset
    from repro.studies import mgwfbp_sim as study
    from tests.helpers import random_trace

    rng = np.random.default_rng(3)
    traces = {"a": random_trace(rng, 30), "b": random_trace(rng, 12)}
    sweep = study.speedup_sweep({"googlenet@k80": traces["a"]}, ["10gbe-k80"], [2, 4, 8],
                                ["wfbp", "syncea", "threshold", "mgwfbp", "optimal"])
    return study, traces, sweep, preset


def _measured_tables():
    runs = pd.DataFrame([
        {"model": m, "scheduler": s, "workers": p, "wire_dtype": "float32", "source": src, "computation_s": 0.1,
         "exposed_comm_s": 0.02 * p, "oversubscribed": p > 2}
        for m in ("tiny_resnet", "tiny_vgg") for s in ("wfbp", "mgwfbp") for p in (2, 4)
        for src in ("measured", "simulated")])
    speedup = pd.DataFrame([{"model": m, "scheduler": s, "workers": p, "speedup": p * 0.7, "oversubscribed": p > 2}
                            for m in ("tiny_resnet", "tiny_vgg") for s in ("linear", "wfbp", "mgwfbp") for p in (2, 4)])
    sweep = pd.DataFrame([{"model": "tiny_resnet", "scheduler": "threshold", "workers": 2, "source": src,
                           "iteration_s": 0.1 + t * 1e-8, "threshold_bytes": t, "oversubscribed": False}
                          for t in (4096, 65536, 1048576) for src in ("measured", "simulated")]
                         + [{"model": "tiny_resnet", "scheduler": s, "workers": 2, "source": src, "iteration_s": 0.09,
                             "threshold_bytes": None, "oversubscribed": False}
                            for s in ("mgwfbp", "optimal") for src in ("measured", "simulated")])
    epochs = pd.DataFrame([{"scheduler": s, "epoch": e, "test_accuracy": 0.5 + 0.1 * e}
                           for s in ("ddp", "mgwfbp") for e in (1, 2, 3)])
    times = pd.DataFrame([{"workers": p, "bytes": n, "seconds": 1e-3 * p + n * 1e-8, "oversubscribed": p > 2}
                          for p in (2, 4) for n in (4096, 65536, 1048576)])
    val = pd.DataFrame([{"model": m, "network": net, "workers": 2, "scheduler": s, "measured_s": 0.1,
                         "simulated_s": 0.11, "error_pct": 10.0, "error_inrun_pct": 2.0 if s != "ddp" else None,
                         "oversubscribed": False}
                        for m in ("tiny_resnet",) for net in ("loopback", "100mbit")
                        for s in ("wfbp", "syncea", "mgwfbp", "optimal", "ddp")])
    return runs, speedup, sweep, epochs, times, val


def _every_figure():
    study, traces, sweep, preset = _sim_tables()
    yield "sim_speedup", mp.plot_sim_speedup(study.sim_speedup_table(sweep, study.paper_speedups(), ["googlenet@k80"]))
    yield "optimal_gap", mp.plot_optimal_gap(study.optimal_gap_table(sweep))
    yield "cost_models", mp.plot_cost_models(study.cost_model_table(4.5e-5, 1e-9, 2.5e-9, [4, 16, 64, 256]), "x",
                                             study.paper_allreduce_fits())
    curve = study.allreduce_curve(["10gbe-v100", "56gbib-v100"], 16, [1e3, 1e6, 1e8])
    yield "layer_sizes", mp.plot_layer_sizes(study.layer_table(traces), curve, ["a", "b"])
    yield "timeline", mp.plot_timeline(study.timeline_table(traces["b"], preset("10gbe-v100", 16),
                                                            ["wfbp", "syncea", "mgwfbp"]), "t")
    from repro.studies import mgwfbp_train as train

    runs, speedup, tsweep, epochs, times, val = _measured_tables()
    fits = train.allreduce_fit_table(times)
    # as the notebook draws them: with the papers' numbers and the paper-scale simulated panels
    yield "allreduce_fit", mp.plot_allreduce_fit(train.allreduce_fit_errors(times, fits), fits, "n",
                                                 study.paper_allreduce_fits())
    yield "real_speedup", mp.plot_real_speedup(speedup, "n", study.k80_speedup_table())
    yield "breakdown", mp.plot_breakdown(runs, "n", study.paper_breakdown_table(), study.journal_headline())
    yield "threshold_sweep", mp.plot_threshold_sweep(tsweep, note="n", paper_scale=study.paper_threshold_sweep_table())
    yield "convergence", mp.plot_convergence(epochs, "n")
    yield "sim_vs_real", plot_sim_vs_real(val, "n")


@pytest.mark.slow
def test_every_figure_keeps_legends_off_the_data_and_a_bounded_aspect(tmp_path):
    names = []
    for name, fig in _every_figure():
        names.append(name)
        _legends_clear_of_data(fig)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # save_figure warns beyond MAX_ASPECT
            side = save_figure(fig, f"test.{name}", tmp_path, scale="tiny", source="measured", tables=["t"])
        w, h = side["size_px"]
        assert max(w / h, h / w) <= MAX_ASPECT, (name, w, h)
        assert side["tables"] == ["t"]
        plt.close(fig)
    assert len(names) == 11


def test_convergence_figure_says_the_curves_coincide():
    *_, epochs, _, _ = _measured_tables()
    fig = mp.plot_convergence(epochs, "n")
    ax = fig.axes[0]
    assert any("coincide" in t.get_text() for t in ax.texts)
    first, second = ax.get_lines()[:2]
    assert first.get_markersize() > second.get_markersize()  # the one below stays visible around the one above


def test_sim_vs_real_in_run_markers_are_visible_on_black_bars():
    *_, val = _measured_tables()
    fig = plot_sim_vs_real(val, "n")
    inrun = [c for c in fig.axes[1].collections if len(c.get_offsets())]
    assert inrun and all(tuple(c.get_facecolor()[0][:3]) == (1.0, 1.0, 1.0) for c in inrun)  # white fill
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "from the in-run trace (check)" in labels and "network: loopback" in labels


@pytest.mark.slow
def test_save_figure_warns_on_a_long_strip(tmp_path):
    fig = plt.figure(figsize=(16, 3))
    fig.add_subplot().plot([0, 1])
    with pytest.warns(UserWarning, match="aspect"):
        save_figure(fig, "test.strip", tmp_path, scale="tiny", source="model")
    with pytest.raises(ValueError, match="tables"):
        save_figure(fig, "test.strip", tmp_path, scale="tiny", source="model", tables=["../x"])


def test_legend_below_collects_unique_entries():
    fig, axes = plt.subplots(1, 2)
    for ax in axes:
        ax.plot([0, 1], [0, 1], **scheduler_style("mgwfbp"))
    leg = legend_below(fig)
    assert [t.get_text() for t in leg.get_texts()] == ["MG-WFBP"]


def test_gap_lines_flag_every_pair_more_than_twice_apart_either_way():
    from repro.figures.style import GAP_FACTOR, add_gap_note, gap_lines

    assert GAP_FACTOR == 2.0
    lines = gap_lines([("a", 0.150, 0.010, "why a"), ("b", 0.010, 0.019, ""), ("c", 0.010, 0.021, "why c"),
                       ("d", 0.3, 0.0, ""), ("e", None, 0.1, ""), ("f", 0.001, 0.0001, "tiny")], min_value=0.002)
    assert lines == ["a: measured 150 ms vs 10 ms predicted (15.0x): why a",
                     "c: measured 10 ms vs 21 ms predicted (1/2.1x): why c",
                     "d: measured 300 ms vs 0 ms predicted (predicted none)"]
    assert gap_lines([("x", 2.0, 1.0, "")]) == []  # exactly 2x is not "more than 2x"
    with pytest.raises(ValueError, match="factor"):
        gap_lines([], factor=1.0)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="l")
    legend_below(fig)
    assert add_gap_note(fig, []) is None
    text = add_gap_note(fig, lines)
    assert text.get_text().startswith("Measured vs predicted more than 2x apart:") and "why c" in text.get_text()
    r = fig.canvas.get_renderer()
    assert text.get_window_extent(r).y1 <= fig.legends[0].get_window_extent(r).y0  # under the legend
