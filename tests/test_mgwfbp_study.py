import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.costs.presets import preset
from repro.figures import mgwfbp_plots  # noqa: E402
from repro.figures.style import PAPER_ZORDER  # noqa: E402
from repro.results.tables import read_table, write_table  # noqa: E402
from repro.studies import mgwfbp_sim as study  # noqa: E402
from tests.helpers import random_trace  # noqa: E402


@pytest.fixture
def traces():
    rng = np.random.default_rng(3)
    return {"a": random_trace(rng, 30), "b": random_trace(rng, 12)}


def test_speedup_sweep_rows_and_definition(traces):
    sweep = study.speedup_sweep(traces, ["10gbe-derived", "10gbe-v100"], [4, 16, 32], ["wfbp", "mgwfbp", "optimal"])
    # 10gbe-v100 has no P=32 fit: skipped for that network only
    assert set(sweep[sweep.network == "10gbe-v100"].workers) == {4, 16}
    assert set(sweep[sweep.network == "10gbe-derived"].workers) == {4, 16, 32}
    lin = sweep[sweep.scheduler == "linear"]
    assert (lin.speedup == lin.workers).all() and (lin.origin == "ideal").all()
    row = sweep[(sweep.model == "a") & (sweep.scheduler == "optimal") & (sweep.workers == 16) & (sweep.network == "10gbe-derived")].iloc[0]
    t = traces["a"]
    assert row.speedup == pytest.approx(16 * (t.total_forward_s + t.total_backward_s) / row.iteration_s)
    sim = sweep[sweep.scheduler != "linear"]
    assert (sim.speedup <= sim.workers + 1e-9).all()
    # relative to the best scheduler at the same model, network and P: the optimum is the best
    assert (sim.relative_to_best <= 1 + 1e-12).all()
    opt = sim[sim.scheduler == "optimal"].relative_to_best
    assert opt.to_list() == pytest.approx([1.0] * len(opt))
    assert lin.relative_to_best.isna().all()


def test_sim_speedup_table_holds_paper_values_and_comparison(traces):
    sweep = study.speedup_sweep({"googlenet@k80": traces["a"]}, ["10gbe-k80"], [2, 4, 8], ["wfbp", "mgwfbp"])
    paper = study.paper_speedups()
    table = study.sim_speedup_table(sweep, paper, ["googlenet@k80"])
    pub = table[table.origin == "paper"]
    assert set(pub.model) == {"googlenet@k80"} and set(pub.network) == {"10gbe-k80"}
    assert len(pub) == len(paper[paper.model == "googlenet"])
    assert pub.citation.str.contains("INFOCOM 2019").all()
    cmp = study.paper_comparison(table)
    assert set(cmp.scheduler) == {"wfbp", "mgwfbp"} and set(cmp.workers) == {2, 4, 8}
    assert (cmp.simulated_over_paper == cmp.speedup_simulated / cmp.speedup_paper).all()
    assert study.paper_comparison(sweep).empty  # no published values: an empty table, not an error


def test_gap_is_non_negative_and_summary_counts(traces):
    sweep = study.speedup_sweep(traces, ["10gbe-derived"], [4, 64, 1024], ["wfbp", "syncea", "mgwfbp", "optimal"])
    gap = study.optimal_gap_table(sweep)
    assert len(gap) == 2 * 3 and (gap.gap_pct >= -1e-9).all()
    summary = study.gap_summary(gap)
    assert list(summary.model) == ["a", "b", "all"]
    assert summary.iloc[-1]["cases"] == 6
    assert summary.iloc[-1]["max_gap_pct"] == pytest.approx(gap.gap_pct.max())


def test_cost_model_table_matches_formulas():
    table = study.cost_model_table(1e-5, 1e-9, 0.0, [4, 64])
    ring = table[(table.algorithm == "ring") & (table.workers == 64)].iloc[0]
    assert ring.a_s == pytest.approx(2 * 63 * 1e-5)
    assert ring.alpha_s == 1e-5 and ring.beta_s_per_byte == 1e-9  # the constants are in the table too
    assert set(table.algorithm) == {"ring", "tree", "recursive_doubling", "halving_doubling"}


def test_timeline_table_has_one_iteration_per_solver(traces):
    ops = study.timeline_table(traces["b"], preset("10gbe-v100", 16), ["wfbp", "syncea"])
    assert set(ops.scheduler) == {"wfbp", "syncea"}
    assert len(ops[(ops.scheduler == "syncea") & (ops.stream == "comm")]) == 1
    assert len(ops[(ops.scheduler == "wfbp") & (ops.stream == "comm")]) == 12


def test_find_trace_error_names_the_model():
    with pytest.raises(ValueError, match="no shipped trace for model 'nope'"):
        study.find_trace("nope")


def test_paper_numbers_are_labelled():
    paper = study.paper_speedups()
    assert set(paper.scheduler) == {"wfbp", "syncea", "mgwfbp"}
    assert paper.source.str.contains("INFOCOM 2019").all()
    assert paper[(paper.model == "googlenet") & (paper.scheduler == "mgwfbp") & (paper.workers == 8)].speedup.item() == 7.41


def test_results_round_trip_with_metadata(tmp_path, traces):
    df = study.layer_table(traces)
    write_table(df, tmp_path, "layers", {"models": ["a", "b"]})
    back = read_table(tmp_path, "layers")
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    import json

    meta = json.loads((tmp_path / "layers.json").read_text())
    assert meta["params"] == {"models": ["a", "b"]} and meta["rows"] == len(df)
    assert meta["environment"]["repro"]
    with pytest.raises(FileNotFoundError, match="result table not found"):
        read_table(tmp_path, "nope")


def test_plots_draw_from_tables(traces):
    sweep = study.speedup_sweep({"googlenet@k80": traces["a"]}, ["10gbe-k80"], [2, 4, 8],
                                ["wfbp", "syncea", "mgwfbp", "optimal"])
    table = study.sim_speedup_table(sweep, study.paper_speedups(), ["googlenet@k80"])
    fig = mgwfbp_plots.plot_sim_speedup(table)
    top = fig.axes[0]
    paper_sets = [c for c in top.collections if c.get_zorder() == PAPER_ZORDER]
    assert len(paper_sets) == 3  # one marker set per published method, drawn above every line
    assert all(c.get_zorder() > max(ln.get_zorder() for ln in top.get_lines()) for c in paper_sets)
    assert len(fig.axes) == 2 and fig.axes[1].get_ylim()[1] <= 1.1  # the "relative to the best" panel, linear
    assert "paper (MG-WFBP INFOCOM'19" in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    # the same figure from the bare sweep plus the published table
    assert len(mgwfbp_plots.plot_sim_speedup(sweep, study.paper_speedups(), ["googlenet@k80"]).axes) == 2
    fig = mgwfbp_plots.plot_optimal_gap(study.optimal_gap_table(sweep))
    assert fig.axes[0].get_xlabel() and fig.axes[1].get_xlabel()
    ops = study.timeline_table(traces["b"], preset("10gbe-v100", 16), ["wfbp", "mgwfbp"])
    assert len(mgwfbp_plots.plot_timeline(ops, "t").axes) == 2
    curve = study.allreduce_curve(["10gbe-v100"], 16, [1e3, 1e6])
    fig = mgwfbp_plots.plot_layer_sizes(study.layer_table(traces), curve, ["a", "b"])
    assert len(fig.axes) == 2 + 2 * 2  # one small multiple per model, two histograms with twin axes


def test_cost_models_figure_names_the_coinciding_curves():
    fig = mgwfbp_plots.plot_cost_models(study.cost_model_table(1e-5, 1e-9, 0, [4, 8, 16]), "x")
    a_ax, b_ax = fig.axes[:2]
    notes = [t.get_text() for ax in (a_ax, b_ax) for t in ax.texts]
    assert any("binary tree = recursive halving-doubling" in n for n in notes)
    assert any("ring = recursive halving-doubling" in n for n in notes)
    styles = {(ln.get_linestyle(), ln.get_marker()) for ln in a_ax.get_lines()}
    assert len(styles) == 4  # every algorithm has its own dashes and marker
    assert len(fig.get_suptitle().splitlines()[0]) < 60


# ------------------------------------------------------------------------------------------ cost modes

def test_paper_mode_is_the_presets_own_simulation(traces):
    """Paper mode (the default) simulates the presets themselves: every iteration equals a plan made on
    ``preset(...)`` directly, and the table says which mode."""
    from repro.core.planners import make_plan

    nets, ps, scheds = ["10gbe-derived", "10gbe-v100"], [4, 16], ["wfbp", "threshold", "mgwfbp", "optimal"]
    sweep = study.speedup_sweep(traces, nets, ps, scheds, threshold_bytes=2**20)
    assert sweep.equals(study.speedup_sweep(traces, nets, ps, scheds, threshold_bytes=2**20, cost_mode="paper"))
    assert set(sweep.cost_mode) == {"paper"}
    sim = sweep[sweep.origin == "simulated"]
    for r in sim.itertuples():
        opts = {"threshold_bytes": 2**20} if r.scheduler == "threshold" else {}
        plan = make_plan(r.scheduler, traces[r.model], preset(r.network, r.workers), **opts)
        assert r.iteration_s == plan.meta["iteration_s"], r
    assert set(study.optimal_gap_table(sweep).cost_mode) == {"paper"}
    ops = study.timeline_table(traces["b"], preset("10gbe-v100", 16), ["wfbp"])
    assert set(ops.cost_mode) == {"paper"}


@pytest.mark.slow
def test_calibrated_mode_differs_is_finite_and_says_so(traces):
    from repro.costs.published_fits import cost_for_mode

    cost = cost_for_mode("10gbe-derived", 16, "calibrated")
    assert "calibrated" in cost.source and not cost.is_paper_model
    args = (traces, ["10gbe-derived", "56gbib-derived"], [4, 16, 64], ["wfbp", "mgwfbp", "optimal"])
    paper, cal = study.speedup_sweep(*args), study.speedup_sweep(*args, cost_mode="calibrated")
    assert set(cal.cost_mode) == {"calibrated"}
    keys = ["model", "network", "workers", "scheduler"]
    assert (paper[keys].to_numpy() == cal[keys].to_numpy()).all()  # the same points
    assert np.isfinite(cal.iteration_s).all() and (cal.iteration_s > 0).all()
    sim = (cal.origin == "simulated").to_numpy()
    assert not np.allclose(cal.iteration_s[sim], paper.iteration_s[sim])
    gap = study.optimal_gap_table(cal)
    assert set(gap.cost_mode) == {"calibrated"} and np.isfinite(gap.gap_pct).all()
    from repro.core.planners import make_plan
    from repro.core.simulate import simulate

    r = cal[(cal.scheduler == "mgwfbp") & (cal.workers == 16)].iloc[0]
    c16 = cost_for_mode(r.network, 16, "calibrated")
    plan = make_plan("mgwfbp", traces[r.model], c16)
    assert r.iteration_s == simulate(traces[r.model], plan, c16, with_ops=False).iteration_s  # the simulator's
    fig = mgwfbp_plots.plot_sim_speedup(cal)
    assert "calibrated on ddl-benchmarks" in fig.get_suptitle()
    assert "paper model" in mgwfbp_plots.plot_optimal_gap(study.optimal_gap_table(paper)).get_suptitle()
    ops = study.timeline_table(traces["b"], cost, ["wfbp", "mgwfbp"], "calibrated")
    assert mgwfbp_plots.plot_timeline(ops, "t").get_suptitle() == "t (calibrated on ddl-benchmarks)"
    import matplotlib.pyplot as plt

    plt.close("all")


def test_a_bad_cost_mode_is_one_line(traces):
    for call in (lambda: study.speedup_sweep(traces, ["10gbe-derived"], [4], ["wfbp"], cost_mode="fitted"),
                 lambda: study.timeline_table(traces["b"], preset("10gbe-v100", 16), ["wfbp"], "Paper")):
        with pytest.raises(ValueError, match="cost_mode must be one of paper, calibrated") as e:
            call()
        assert "\n" not in str(e.value)
