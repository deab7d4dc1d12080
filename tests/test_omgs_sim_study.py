"""The OMGS-SGD simulation study: its tables (the optimal-gap grid, the worst case, the paper's setting,
the timelines) and the figures drawn from them."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.costs.presets import preset
from repro.figures import omgs_plots  # noqa: E402
from repro.core.planners import make_plan  # noqa: E402
from repro.studies import omgs_sim as study  # noqa: E402
from tests.helpers import random_trace  # noqa: E402

PLANNERS = list(study.SPARSE_PLANNERS)


@pytest.fixture(scope="module")
def traces():
    rng = np.random.default_rng(7)
    return {"a": random_trace(rng, 14), "b": random_trace(rng, 6)}


@pytest.fixture(scope="module")
def sweep(traces):
    return study.sparse_sweep(traces, [2, 16, 32], [0.001, 0.05], PLANNERS)


def test_sweep_shape_and_gap_definition(traces, sweep):
    # 1gbe-allgather has fits for P in {2, 4, 8, 16}: P=32 is skipped
    assert set(sweep.workers) == {2, 16}
    assert len(sweep) == 2 * 2 * 2 * len(PLANNERS)
    assert not sweep.duplicated(["model", "workers", "density", "planner"]).any()
    assert np.allclose(sweep.gap_pct, 100 * (sweep.iteration_s / sweep.optimal_s - 1))
    assert (sweep.gap_pct >= -1e-9).all()  # the optimum is never slower than any planner
    best = sweep.groupby(["model", "workers", "density"]).iteration_s.transform("min")
    opt = sweep[sweep.planner == "omgs_optimal"]
    assert np.allclose(opt.iteration_s, best[opt.index])
    assert (sweep[sweep.planner == "topk_single"].buckets == 1).all()
    assert (sweep[sweep.planner == "topk_layerwise"].buckets == [traces[m].num_layers for m in
                                                                 sweep[sweep.planner == "topk_layerwise"].model]).all()


def test_the_rules_row_is_make_plan_omgs(traces, sweep):
    for r in sweep[sweep.planner == "omgs"].itertuples():
        plan = make_plan("omgs", traces[r.model], preset("1gbe-allgather", r.workers), density=r.density)
        assert r.iteration_s == pytest.approx(plan.meta["iteration_s"], rel=1e-12)
        assert r.buckets == plan.num_buckets


def test_gap_summary_and_worst_case(traces, sweep):
    summary = study.gap_summary(sweep, "omgs")
    assert list(summary.model) == ["a", "b", "all"]
    rule = sweep[sweep.planner == "omgs"]
    assert summary.iloc[-1].cases == len(rule)
    assert summary.iloc[-1].max_gap_pct == pytest.approx(rule.gap_pct.max())
    assert summary.iloc[0].median_gap_pct == pytest.approx(rule[rule.model == "a"].gap_pct.median())
    case = study.worst_case(sweep, "omgs")
    assert case["model"] == summary.iloc[-1].worst_model and case["workers"] == summary.iloc[-1].worst_workers
    cost = preset("1gbe-allgather", case["workers"])
    b = study.bucket_table(traces[case["model"]], cost, ["omgs", "omgs_optimal"], case["density"])
    for name, g in b.groupby("planner"):
        plan = make_plan(name, traces[case["model"]], cost, density=case["density"])
        assert len(g) == plan.num_buckets
        assert g.num_layers.sum() == traces[case["model"]].num_layers
        assert g.comm_end_s.max() <= g.iteration_s.iloc[0] + 1e-12
        assert (g.comm_start_s >= g.sparsify_end_s - 1e-12).all()  # an all-gather waits for its top-k
    text = study.explain_case(b, traces[case["model"]], cost)
    assert "slower than the optimum" in text and f"P={case['workers']}" in text


def test_paper_setting_carries_the_published_times():
    traces = study.load_traces(["lstm_ptb"])
    t = study.paper_setting_table(traces, ["topk_single", "omgs", "omgs_optimal"])
    assert set(t.planner) == {"topk_single", "omgs", "omgs_optimal"} and (t.workers == 16).all()
    assert (t.density == 0.004).all()  # the paper's LSTM density
    row = t.set_index("planner")
    assert row.loc["topk_single", "paper_s"] == 1.019 and row.loc["omgs", "paper_s"] == 0.916
    assert np.isnan(row.loc["omgs_optimal", "paper_s"]) and row.loc["omgs", "citation"].startswith("OMGS-SGD")
    assert row.loc["omgs_optimal", "iteration_s"] <= row.loc["omgs", "iteration_s"] + 1e-12


def test_find_trace_prefers_the_papers_gpu_and_falls_back_with_a_warning():
    assert study.find_trace("resnet50") == "resnet50_b32_p102-estimate"
    with pytest.warns(UserWarning, match="using googlenet_b64_v100-estimate"):
        assert study.find_trace("googlenet") == "googlenet_b64_v100-estimate"
    with pytest.raises(ValueError, match="no shipped estimate trace for model 'nope'"):
        study.find_trace("nope")


def test_timeline_table_rows(traces):
    ops = study.timeline_table(traces["b"], preset("1gbe-allgather", 16), PLANNERS, 0.01)
    assert list(dict.fromkeys(ops.planner)) == PLANNERS
    lw = ops[ops.planner == "topk_layerwise"]
    assert (lw.row == "sparsify").sum() == 6 and (lw.kind == "sparse_allgather").sum() == 12  # values + indices
    assert set(ops[ops.row == "sparsify"].stream) == {"compute"}  # top-k runs on the compute stream
    single = ops[ops.planner == "topk_single"]
    assert (single.row == "sparsify").sum() == 1
    for _, g in ops.groupby("planner"):
        assert g.end_s.max() == pytest.approx(g.iteration_s.iloc[0])


def _measured_ops():
    rows = []
    for p, it in (("topk_single", 0.05), ("omgs", 0.04)):
        rows += [{"planner": p, "stream": "compute", "row": "compute", "kind": "forward", "label": "", "start_s": 0.0,
                  "end_s": 0.01},
                 {"planner": p, "stream": "compute", "row": "compute", "kind": "backward", "label": "",
                  "start_s": 0.01, "end_s": 0.03},
                 {"planner": p, "stream": "compute", "row": "sparsify", "kind": "sparsify", "label": "b1",
                  "start_s": 0.02, "end_s": 0.025},
                 {"planner": p, "stream": "comm", "row": "comm", "kind": "sparse_allgather", "label": "b1",
                  "start_s": 0.025, "end_s": it}]
    return pd.DataFrame(rows).assign(iteration_s=lambda d: d.end_s.where(d.row == "comm").groupby(d.planner)
                                     .transform("max"), buckets=1)


def test_plots_draw_from_the_tables(traces, sweep):
    fig = omgs_plots.plot_optimal_gap(sweep, "omgs", {"a": 0.001, "b": 0.05})
    heat = [ax for ax in fig.axes if ax.images]
    assert len(heat) == 2  # one heatmap per model
    texts = [t.get_text() for t in heat[0].texts]
    assert len(texts) == 2 * 2 and all("%" in t and " vs " in t for t in texts)
    lines = [ax for ax in fig.axes if ax.get_lines()]
    assert len(lines) == 2 and all(len(ax.get_lines()) == len(PLANNERS) for ax in lines)
    assert "optimum" in fig.axes[-1].get_ylabel()  # the colour bar says what the colour is
    labels = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert "Optimum" in labels and "published rule" in labels

    ops = study.timeline_table(traces["b"], preset("1gbe-allgather", 16), PLANNERS, 0.01)
    fig = omgs_plots.plot_timeline(ops, "t")
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == len(PLANNERS)
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["computation", "top-k", "all-gather"]
    assert len({ax.get_xlim() for ax in axes}) == 1  # one shared time axis
    assert all("ms" in ax.get_title(loc="left") for ax in axes)  # iteration times written, with their unit

    fig = omgs_plots.plot_timeline(ops, "t", _measured_ops(), "measured at tiny scale: 2 ranks on 2 CPU cores")
    assert len([ax for ax in fig.axes if ax.axison]) == len(PLANNERS) + 2
    # an axes title says "tiny scale", so tag_title adds no "(tiny scale)" to the simulated suptitle
    assert any("tiny scale" in ax.get_title(loc="left") for ax in fig.axes)
    # one recorded step per scheduler: said, beside the run's median, and no speedup printed from it
    med = _measured_ops().assign(median_iteration_s=0.045, timed_steps=10)
    fig = omgs_plots.plot_timeline(ops, "t", med, "measured at tiny scale")
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert "not a speedup" in " ".join(titles)
    assert sum("one step, 50.0 ms (the run's median step of 10: 45.0 ms)" in t for t in titles) == 1
    texts = " ".join(titles + [fig._suptitle.get_text()])
    assert "0.05 s ÷" not in texts and "1.25x" not in texts  # 50 ms / 40 ms of single steps: not printed


def test_drawable_merges_back_to_back_compute():
    ops = pd.DataFrame([
        {"row": "compute", "stream": "compute", "kind": "backward", "label": "l3", "start_s": 0.0, "end_s": 1.0},
        {"row": "compute", "stream": "compute", "kind": "backward", "label": "l2", "start_s": 1.0, "end_s": 2.0},
        {"row": "sparsify", "stream": "compute", "kind": "sparsify", "label": "l2-l3", "start_s": 2.0, "end_s": 3.0},
        {"row": "compute", "stream": "compute", "kind": "backward", "label": "l1", "start_s": 3.0, "end_s": 4.0}])
    d = omgs_plots._drawable(ops, 4.0)
    assert len(d) == 3 and d.iloc[0].end_s == 2.0 and (d.stream == d.row).all()
    assert list(d.label) == ["", "l2-l3", ""]


# ------------------------------------------------------------------------------------------ cost modes

def test_paper_mode_is_the_presets_own_simulation(traces, sweep):
    """Paper mode (the default) simulates ``preset("1gbe-allgather", P)`` itself, and says so."""
    assert set(sweep.cost_mode) == {"paper"}
    again = study.sparse_sweep(traces, [2, 16], [0.001, 0.05], PLANNERS, cost_mode="paper")
    pd.testing.assert_frame_equal(again.drop(columns="plan_wall_s"), sweep.drop(columns="plan_wall_s"))
    for r in sweep.itertuples():
        plan = make_plan(r.planner, traces[r.model], preset("1gbe-allgather", r.workers), density=r.density)
        assert r.iteration_s == plan.meta["iteration_s"], r
    setting = study.paper_setting_table(traces, ["omgs"])
    for r in setting.itertuples():
        plan = make_plan("omgs", traces[r.model], preset("1gbe-allgather", 16), density=r.density)
        assert r.iteration_s == plan.meta["iteration_s"] and r.cost_mode == "paper"
    assert set(study.timeline_table(traces["b"], preset("1gbe-allgather", 16), ["omgs"], 0.01).cost_mode) == {"paper"}


def test_calibrated_mode_differs_is_finite_and_says_so(traces, sweep):
    from repro.costs.published_fits import cost_for_mode

    cost = cost_for_mode("1gbe-allgather", 16, "calibrated")
    assert "calibrated" in cost.source and not cost.is_paper_model
    assert cost.topk_gamma_s == preset("1gbe-allgather", 16).topk_gamma_s  # the paper's top-k cost is kept
    cal = study.sparse_sweep(traces, [2, 16], [0.001, 0.05], PLANNERS, cost_mode="calibrated")
    keys = ["model", "workers", "density", "planner"]
    assert (cal[keys].to_numpy() == sweep[keys].to_numpy()).all() and set(cal.cost_mode) == {"calibrated"}
    assert np.isfinite(cal.iteration_s).all() and (cal.iteration_s > 0).all()
    assert not np.allclose(cal.iteration_s, sweep.iteration_s)
    assert np.isfinite(cal.gap_pct).all()  # the planners' optimum need not stay optimal under realism
    buckets = study.bucket_table(traces["a"], cost, ["omgs", "omgs_optimal"], 0.01, cost_mode="calibrated")
    assert set(buckets.cost_mode) == {"calibrated"} and np.isfinite(buckets.iteration_s).all()
    setting = study.paper_setting_table(traces, ["omgs"], cost_mode="calibrated")
    assert set(setting.cost_mode) == {"calibrated"}
    assert "(simulated, calibrated on ddl-benchmarks)" in omgs_plots.plot_optimal_gap(cal).get_suptitle()
    assert "paper model" in omgs_plots.plot_optimal_gap(sweep).get_suptitle()
    ops = study.timeline_table(traces["b"], cost, PLANNERS, 0.01, cost_mode="calibrated")
    assert omgs_plots.plot_timeline(ops, "t").get_suptitle().split("\n")[0] == "t (calibrated on ddl-benchmarks)"
    import matplotlib.pyplot as plt

    plt.close("all")


def test_a_bad_cost_mode_is_one_line(traces):
    for call in (lambda: study.sparse_sweep(traces, [2], [0.01], ["omgs"], cost_mode="calibrate"),
                 lambda: study.paper_setting_table(traces, ["omgs"], cost_mode=""),
                 lambda: study.timeline_table(traces["b"], preset("1gbe-allgather", 16), ["omgs"], 0.01,
                                              cost_mode=None)):
        with pytest.raises(ValueError, match="cost_mode must be one of paper, calibrated") as e:
            call()
        assert "\n" not in str(e.value)


def test_timeline_draws_the_papers_iteration_times_and_says_how_the_simulation_compares():
    """omgs.timeline carries the paper's measured TopK-SGD and OMGS-SGD seconds of its model (the shipped
    table) as dotted lines on their panels and a line under the title with both ratios and the verdict."""
    import matplotlib.pyplot as plt

    trace = study.load_traces(["lstm_ptb"], "p102")["lstm_ptb"]
    ops = study.timeline_table(trace, preset("1gbe-allgather", 16), ["topk_single", "omgs"], 0.004)
    paper = study.paper_iterations()
    paper = paper[paper.model == "lstm_ptb"]
    fig = omgs_plots.plot_timeline(ops, "t", paper=paper, claim_id="omgs.speedup_lstm")
    title = fig.get_suptitle().replace("\n", " ")
    assert "1.019 s ÷ 0.916 s = 1.11x" in title and "simulated:" in title
    assert any(v in title for v in ("reproduced", "direction only", "not reproduced"))
    drawn = {round(float(ln.get_xdata()[0]), 6) for ax in fig.axes for ln in ax.get_lines() if ln.get_linestyle() == ":"}
    assert {round(s * 1e3, 6) for s in paper.paper_s} <= drawn
    assert sum("paper (OMGS-SGD INFOCOM'20, measured)" in ax.get_title(loc="left") for ax in fig.axes) == 2
    plt.close(fig)
    assert "÷" not in omgs_plots.plot_timeline(ops, "t").get_suptitle()  # no paper rows: no line
