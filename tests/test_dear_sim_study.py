"""The DeAR simulation study: its tables (timeline, scaling, throughput, breakdown, buffer sweep, speedup
summary), the figures drawn from them and the notebook."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.costs.presets import preset
from repro.figures import dear_plots  # noqa: E402
from repro.core.planners import make_plan  # noqa: E402
from repro.families.dear.planners import dear_model  # noqa: E402
from repro.studies import dear_sim as study  # noqa: E402
from tests.helpers import random_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = list(study.ALL_METHODS)


@pytest.fixture(scope="module")
def traces():
    rng = np.random.default_rng(11)
    return {"a": random_trace(rng, 12), "b": random_trace(rng, 7)}


@pytest.fixture(scope="module")
def resnet():
    return study.load_traces(["resnet50"])


@pytest.fixture(scope="module")
def scaling(traces):
    return study.scaling_table(traces, [8, 16, 64], methods=METHODS)


def test_find_trace_uses_the_papers_batch_sizes():
    for m, b in study.DEAR_MODELS.items():
        assert study.find_trace(m) == f"{m}_b{b}_v100-estimate"
    with pytest.raises(ValueError, match="no shipped V100 estimate trace for model 'nope'"):
        study.find_trace("nope")


def test_scaling_table_shape_and_throughput_definition(traces, scaling):
    assert len(scaling) == 2 * 2 * 3 * len(METHODS)  # models x networks x P x methods
    assert not scaling.duplicated(["model", "network", "workers", "scheduler"]).any()
    assert set(scaling.network) == set(study.SCALING_NETWORKS)
    batch = scaling.model.map({m: t.batch_size for m, t in traces.items()})
    assert np.allclose(scaling.throughput, scaling.workers * batch / scaling.iteration_s)
    assert np.allclose(scaling.groupby(["model", "network", "workers"]).relative_to_best.max(), 1.0)
    assert (scaling.relative_to_best <= 1 + 1e-12).all()
    for r in scaling.sample(8, random_state=0).itertuples():  # each row is its planner's simulated period
        plan = make_plan(r.scheduler, traces[r.model], preset(r.network, r.workers))
        assert r.iteration_s == pytest.approx(plan.meta["iteration_s"], rel=1e-9)
    assert (scaling[scaling.scheduler == "dear_nofusion"].buckets == scaling[scaling.scheduler == "dear_nofusion"]
            .model.map({m: t.num_layers for m, t in traces.items()})).all()


def test_no_method_beats_computation_or_its_own_communication(traces, scaling):
    """Lower bounds the models guarantee: the compute stream runs forward + backward every period; DeAR's
    reduce-scatters and all-gathers of one iteration all run inside one barrier-to-barrier period on one stream."""
    compute = scaling.model.map({m: t.total_forward_s + t.total_backward_s for m, t in traces.items()})
    assert (scaling.iteration_s >= compute - 1e-12).all()
    for r in scaling[scaling.scheduler.str.startswith("dear")].itertuples():
        cost = preset(r.network, r.workers)
        plan = make_plan(r.scheduler, traces[r.model], cost)
        b = study.exposed_breakdown(traces[r.model], plan, cost)
        assert r.iteration_s >= b["rs_s"] + b["ag_s"] - 1e-12


def test_dear_equals_compute_when_communication_is_free_and_wfbp_with_one_bucket_is_not_faster(resnet):
    """With the all-gather of bucket 1 exposed, DeAR is not guaranteed to beat WFBP; what the model does
    guarantee: its period never exceeds WFBP-style all-reduce of the same trace by more than its all-gathers
    (RS is shorter than AR, and each all-gather costs at most its own time)."""
    tr = resnet["resnet50"]
    for net in study.PAPER_NETWORKS:
        cost = preset(net, 64)
        for name in ("dear_nofusion", "dear_threshold"):
            plan = make_plan(name, tr, cost)
            b = study.exposed_breakdown(tr, plan, cost)
            assert b["exposed_ag_s"] > 0  # AG(1) runs before any forward: never hidden
            # the same buckets as all-reduces, backward order, FIFO: T = F + max(B, e'_1)
            from repro.families.allreduce.planners import groups_time_s

            groups = plan.groups(tr)
            wfbp_same = groups_time_s(tr, [list(g) for g in reversed(groups)], cost)
            assert b["iteration_s"] <= wfbp_same + b["ag_s"] + 1e-12


@pytest.mark.slow
def test_throughput_rises_with_p_when_communication_is_cheap(resnet):
    t = study.scaling_table(resnet, [8, 16, 32, 64], ["56gbib-dear-derived"], METHODS)
    for s, g in t.groupby("scheduler"):
        assert (np.diff(g.sort_values("workers").throughput) > 0).all(), s


def test_throughput_table_and_speedup_summary(traces):
    t = study.throughput_table(traces, methods=METHODS)
    assert set(t.workers) == {64} and set(t.network) == set(study.PAPER_NETWORKS)
    assert set(study.NOFUSION_METHODS) | set(study.FUSION_METHODS) == set(METHODS)
    s = study.speedup_summary(t)
    per = s[~s.model.str.startswith("all models")]
    assert len(per) == 2 * 2 and len(s) == len(per) + 2
    for r in per.itertuples():
        g = t[(t.model == r.model) & (t.network == r.network)]
        d, b = g[g.scheduler.isin(study.DEAR_METHODS)], g[~g.scheduler.isin(study.DEAR_METHODS)]
        assert r.dear_iteration_s == d.iteration_s.min() and r.baseline_iteration_s == b.iteration_s.min()
        assert r.best_dear in study.DEAR_METHODS and r.best_baseline not in study.DEAR_METHODS
        assert r.speedup_pct == pytest.approx(100 * (r.dear_throughput / r.baseline_throughput - 1))
    top = s[s.model.str.startswith("all models")].set_index("network")
    for net, g in per.groupby("network"):
        assert top.loc[net, "speedup_pct"] == pytest.approx(g.speedup_pct.max())
    assert dict(zip(s.network, s.paper_claim_pct)) == {"10gbe-dear64": 83.0, "56gbib-dear64": 15.0}
    assert all("paper's claim" in c for c in s.paper_claim)


def test_timeline_windows(resnet):
    tr = resnet["resnet50"]
    cost = preset("10gbe-dear64", 64)
    ops = study.timeline_table(tr, cost, ["wfbp", "dear_threshold"], "10gbe-dear64")
    assert set(ops.row) == {"compute", "comm"} and (ops.end_s > ops.start_s).all()
    w = ops[ops.scheduler == "wfbp"]
    it = w.iteration_s.iloc[0]
    assert it == pytest.approx(make_plan("wfbp", tr, cost).meta["iteration_s"])
    nxt = w[w.iteration == 2]
    assert set(nxt.kind) == {"forward"} and nxt.start_s.min() == pytest.approx(it)
    assert w[w.kind == "allreduce"].end_s.max() == pytest.approx(it)  # the next forward waits for all of them
    assert (w[w.kind == "forward"].groupby("iteration").size() == tr.num_layers).all()
    d = ops[ops.scheduler == "dear_threshold"]
    barrier = d.boundary_s.iloc[0]
    assert d.iteration_s.iloc[0] == pytest.approx(make_plan("dear_threshold", tr, cost).meta["iteration_s"])
    assert barrier == pytest.approx(d.iteration_s.iloc[0])  # iteration 1 starts at the first barrier, t = 0
    rs, ag = d[d.kind == "reduce_scatter"], d[d.kind == "allgather"]
    assert (rs.iteration == 1).all() and rs.end_s.max() <= barrier + 1e-12  # RS under backward, before the barrier
    assert set(ag.iteration) == {1, 2} and (ag[ag.iteration == 2].start_s >= barrier - 1e-12).all()
    assert "backward" not in set(d[d.iteration == 2].kind)  # window ends with the second forward
    assert d[d.iteration == 2].end_s.max() == pytest.approx(d[(d.iteration == 2) & (d.kind == "forward")].end_s.max())
    with pytest.raises(ValueError, match="bytescheduler"):
        study.timeline_table(tr, cost, ["bytescheduler"])


def test_breakdown_partitions_the_period(traces):
    b = study.breakdown_table(traces, schedulers=["wfbp", "horovod", "dear_nofusion", "dear_threshold", "dear_model"])
    parts = b[["computation_s", "exposed_rs_s", "exposed_ag_s", "exposed_allreduce_s", "exposed_idle_s"]].sum(axis=1)
    assert np.allclose(parts, b.iteration_s, rtol=1e-9, atol=1e-12)
    compute = b.model.map({m: t.total_forward_s + t.total_backward_s for m, t in traces.items()})
    assert np.allclose(b.computation_s, compute)
    dear = b.scheduler.str.startswith("dear")
    assert (b[dear].exposed_allreduce_s == 0).all() and (b[~dear][["exposed_rs_s", "exposed_ag_s"]] == 0).all().all()
    assert (b.exposed_rs_s <= b.rs_s + 1e-12).all() and (b.exposed_ag_s <= b.ag_s + 1e-12).all()
    assert (b[b.scheduler == "wfbp"].exposed_idle_s < 1e-12).all()  # WFBP never waits without communicating


def test_buffer_sweep_contains_the_models_choice_as_its_minimum(traces):
    t = study.buffer_sweep_table(traces, ["10gbe-dear64"], min_bytes=2**12, max_bytes=2**24, points=9)
    for m, g in t.groupby("model"):
        assert g.threshold_bytes.is_monotonic_increasing and not g.threshold_bytes.duplicated().any()
        assert g.threshold_bytes.min() >= 2**12 and g.threshold_bytes.max() <= 2**24
        assert (g.point == "grid").sum() >= 1 and (g.point == "breakpoint").sum() >= 1
        assert g.model_choice.sum() == 1
        choice = g[g.model_choice].iloc[0]
        assert choice.iteration_s == pytest.approx(g.iteration_s.min(), rel=1e-12)
        plan = dear_model(traces[m], preset("10gbe-dear64", 64), 2**12, 2**24)
        assert choice.threshold_bytes == plan.meta["threshold_bytes"]
        assert choice.iteration_s == pytest.approx(plan.meta["iteration_s"], rel=1e-12)
        assert (g.buckets.diff().dropna() <= 0).all()  # larger thresholds never make more buckets
    d = study.buffer_sweep(traces["a"], preset("10gbe-dear64", 64))
    assert (d.point == "default").sum() == 1 and d[d.point == "default"].threshold_mib.iloc[0] == 25


def test_plots_draw_from_the_tables(resnet, scaling):
    tr = resnet["resnet50"]
    ops = study.timeline_table(tr, preset("56gbib-dear64", 64), ["wfbp", "dear_threshold"], "56gbib-dear64")
    fig = dear_plots.plot_timeline(ops, "t, simulated", "56gbib-dear64, V100 roofline-estimate traces")
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == 2 and len({ax.get_xlim() for ax in axes}) == 1
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["computation", "communication"]
    assert all("ms" in ax.get_title(loc="left") for ax in axes) and "ms" in axes[-1].get_xlabel()
    labels = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert "reduce-scatter" in labels and "all-gather" in labels and "all-reduce" in labels

    fig = dear_plots.plot_scaling(scaling, note="presets")
    lines = [ax for ax in fig.axes if ax.get_lines()]
    assert len(lines) == 2 * 2 * 2  # (throughput, ÷ best) per model x network
    assert all(len(ax.get_lines()) == len(METHODS) for ax in lines)
    assert any("samples/s" in ax.get_ylabel() for ax in fig.axes)
    assert all(ax.get_xlabel() in ("", "GPUs P") for ax in fig.axes)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(legend) == len(METHODS) and "DeAR (no fusion)" in legend
    colors = [dear_plots.method_style(m)["color"] for m in METHODS]
    assert len(set(colors)) == len(colors), "every method of the figure has its own colour"
    import matplotlib.pyplot as plt

    plt.close("all")


def test_simulated_halves_plot(traces):
    import matplotlib.pyplot as plt

    t = study.throughput_table(traces, methods=study.NOFUSION_METHODS)
    assert len(dear_plots.plot_throughput(t).axes) == 2
    b = study.breakdown_table(traces, schedulers=["wfbp", "dear_threshold"])
    assert len(dear_plots.plot_breakdown(b).axes) == 2
    s = study.buffer_sweep_table(traces, ["10gbe-dear64"], min_bytes=2**12, max_bytes=2**24, points=5)
    assert len(dear_plots.plot_buffer_sweep(s).axes) == 2
    plt.close("all")


def _kernel() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    return "repro" if "repro" in KernelSpecManager().find_kernel_specs() else "python3"


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_runs_with_tiny_parameters(tmp_path, monkeypatch):
    import papermill as pm

    monkeypatch.chdir(ROOT)
    out = tmp_path / "out.ipynb"
    params = {"models": "[resnet50]", "workers": "[8, 64]", "timeline_model": "resnet50",
              "schedulers": "[wfbp, ddp_buckets, dear_threshold]", "output_dir": str(tmp_path / "figures"),
              "results_dir": str(tmp_path / "data")}
    pm.execute_notebook(str(ROOT / "notebooks" / "dear_simulation.ipynb"), str(out), parameters=params,
                        kernel_name=_kernel(), progress_bar=False)
    for stem in ("dear_timeline", "dear_scaling"):
        for ext in ("png", "pdf", "json"):
            assert (tmp_path / "figures" / f"{stem}.{ext}").stat().st_size > 0, (stem, ext)
    side = json.loads((tmp_path / "figures" / "dear_scaling.json").read_text())
    # the paper's model simulated at its GPU counts: tagged by what is drawn, not as tiny scale
    assert "simulated" in side["title"] and side["scale"] == "paper" and "tiny scale" not in side["title"]
    summary = pd.read_csv(tmp_path / "data" / "dear_speedup_summary.csv")
    assert set(summary.network) == {"10gbe-dear64", "56gbib-dear64"} and (summary.workers == 64).all()
    # the claims' table holds both cost modes (issue 35), the summary one per mode
    setting = pd.read_csv(tmp_path / "data" / "dear_paper_setting.csv")
    assert set(setting.cost_mode) == set(summary.cost_mode) == {"paper", "calibrated"}
    assert len(setting[setting.cost_mode == "paper"]) == len(setting[setting.cost_mode == "calibrated"])
    scaling = pd.read_csv(tmp_path / "data" / "dear_scaling.csv")
    assert set(scaling.workers) == {8, 64} and set(scaling.scheduler) == {"wfbp", "ddp_buckets", "dear_threshold"}
    executed = json.loads(out.read_text())
    stderr = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", [])
                     if o.get("name") == "stderr")
    assert "DeprecationWarning" not in stderr and "FutureWarning" not in stderr, stderr


# ------------------------------------------------------------------------------------------ cost modes

def test_paper_mode_is_the_presets_own_simulation(traces):
    """Paper mode (the default) simulates the presets themselves: every row equals a simulation of a plan
    made on ``preset(...)`` directly, and the tables say which mode."""
    from repro.core.simulate import simulate

    methods = ["wfbp", "horovod", "mgwfbp", "dear_threshold", "dear_model"]
    t = study.throughput_table(traces, study.PAPER_NETWORKS + study.SCALING_NETWORKS, methods, 64)
    assert set(t.cost_mode) == {"paper"}
    for r in t.itertuples():
        cost = preset(r.network, r.workers)
        assert r.iteration_s == simulate(traces[r.model], make_plan(r.scheduler, traces[r.model], cost), cost,
                                         with_ops=False).iteration_s, r
    scaling = study.scaling_table(traces, [8, 64], methods=["wfbp"], cost_mode="paper")
    for r in scaling.itertuples():
        assert r.iteration_s == study.iteration(traces[r.model], "wfbp", preset(r.network, r.workers))["iteration_s"]
    b = study.breakdown_table(traces, ["10gbe-dear64"], ["wfbp", "dear_threshold"])
    for r in b.itertuples():
        cost = preset("10gbe-dear64", 64)
        assert r.iteration_s == study.exposed_breakdown(traces[r.model], make_plan(r.scheduler, traces[r.model], cost),
                                                        cost)["iteration_s"] and r.cost_mode == "paper"
    s = study.buffer_sweep_table(traces, ["10gbe-dear64"], min_bytes=2**12, max_bytes=2**24, points=5)
    ref = study.buffer_sweep(traces["a"], preset("10gbe-dear64", 64), 2**12, 2**24, 5)
    assert s[s.model == "a"].iteration_s.to_list() == ref.iteration_s.to_list() and set(s.cost_mode) == {"paper"}
    assert set(study.speedup_summary(t).cost_mode) == {"paper"}


def test_calibrated_mode_differs_is_finite_and_says_so(traces):
    import matplotlib.pyplot as plt

    from repro.costs.published_fits import cost_for_mode

    for net in study.PAPER_NETWORKS + study.SCALING_NETWORKS:
        cost = cost_for_mode(net, 64, "calibrated")
        assert "calibrated" in cost.source and not cost.is_paper_model, net
    methods = ["wfbp", "mgwfbp", "dear_threshold", "dear_model"]
    paper = study.scaling_table(traces, [8, 64], methods=methods)
    cal = study.scaling_table(traces, [8, 64], methods=methods, cost_mode="calibrated")
    keys = ["model", "network", "workers", "scheduler"]
    assert (cal[keys].to_numpy() == paper[keys].to_numpy()).all() and set(cal.cost_mode) == {"calibrated"}
    assert np.isfinite(cal.iteration_s).all() and (cal.iteration_s > 0).all()
    assert not np.allclose(cal.iteration_s, paper.iteration_s)
    assert set(study.speedup_summary(cal).cost_mode) == {"calibrated"}
    b = study.breakdown_table(traces, ["56gbib-dear64"], ["wfbp", "dear_threshold"], cost_mode="calibrated")
    assert set(b.cost_mode) == {"calibrated"} and np.isfinite(b.iteration_s).all()
    s = study.buffer_sweep_table(traces, ["10gbe-dear64"], min_bytes=2**12, max_bytes=2**24, points=5,
                                 cost_mode="calibrated")
    assert set(s.cost_mode) == {"calibrated"} and np.isfinite(s.iteration_s).all()
    assert "(simulated, calibrated on ddl-benchmarks)" in dear_plots.plot_scaling(cal).get_suptitle()
    assert "(simulated, paper model)" in dear_plots.plot_scaling(paper).get_suptitle()
    assert "calibrated on ddl-benchmarks" in dear_plots.plot_breakdown(b).get_suptitle()
    assert "calibrated on ddl-benchmarks" in dear_plots.plot_buffer_sweep(s).get_suptitle()
    ops = study.timeline_table(traces["a"], cost_for_mode("56gbib-dear64", 64, "calibrated"),
                               ["wfbp", "dear_threshold"], "56gbib-dear64", "calibrated")
    assert set(ops.cost_mode) == {"calibrated"}
    assert dear_plots.plot_timeline(ops, "t").get_suptitle() == "t (calibrated on ddl-benchmarks)"
    plt.close("all")


def test_a_bad_cost_mode_is_one_line(traces):
    for call in (lambda: study.throughput_table(traces, methods=["wfbp"], cost_mode="measured"),
                 lambda: study.scaling_table(traces, [8], methods=["wfbp"], cost_mode="PAPER"),
                 lambda: study.breakdown_table(traces, cost_mode="x"),
                 lambda: study.buffer_sweep_table(traces, cost_mode="x"),
                 lambda: study.timeline_table(traces["a"], preset("10gbe-dear64", 64), cost_mode="x")):
        with pytest.raises(ValueError, match="cost_mode must be one of paper, calibrated") as e:
            call()
        assert "\n" not in str(e.value)


def test_scaling_figure_puts_the_papers_headline_beside_the_simulated_gain():
    """dear.scaling draws the DeAR paper's +83% / +15% (study.PAPER_CLAIM_PCT) under its title, beside
    DeAR as released against the best baseline at the largest P and the claims' verdicts."""
    import matplotlib.pyplot as plt

    rows = [{"model": "m", "network": net, "workers": p, "scheduler": s, "iteration_s": t,
             "throughput": p * 32 / t, "relative_to_best": 1.0}
            for net in ("10gbe-dear-derived", "56gbib-dear-derived") for p in (8, 64)
            for s, t in (("wfbp", 1.5), ("mgwfbp", 1.2), ("dear_threshold", 1.0), ("dear_optimal", 0.9))]
    table = pd.DataFrame(rows)
    text = dear_plots.scaling_headline_text(table)
    assert "paper up to +83%" in text and "paper up to +15%" in text
    assert "simulated +20% (m)" in text  # 1.2 / 1.0: the best baseline over DeAR as released, not ours
    assert text.count(", direction only") == 2  # +20% against "up to 83%" and against "up to 15%" (two-sided)
    fig = dear_plots.plot_scaling(table, note="presets")
    assert any("paper up to +83%" in t.get_text() for t in fig.texts)
    plt.close(fig)
    assert dear_plots.scaling_headline_text(table[table.scheduler != "dear_threshold"]) == ""
