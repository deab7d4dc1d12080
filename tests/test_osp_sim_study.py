"""The OSP simulation study (repro.studies.osp_sim): its tables (throughput, speedup summary, stage ratio,
timeline) and the figures drawn from them. The notebooks run at their tiny defaults in
tests/test_figures_pipeline.py."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.figures import osp_plots as plots  # noqa: E402
from repro.figures.style import FAMILIES, STYLES, use_style  # noqa: E402
from repro.core.planners import make_plan  # noqa: E402
from repro.families.ps.simulate import trace_compute_s  # noqa: E402
from repro.studies import osp_sim as study  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _style():
    use_style()
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def traces():
    return study.load_traces(["resnet50", "vgg16"])


@pytest.fixture(scope="module")
def thr(traces):
    return study.throughput_table(traces, ["10gbit", "100gbit"])


def test_network_cost_is_one_message_alpha_beta():
    c = study.network_cost("10gbit", 8, 50e-6)
    assert c.workers == 8
    for line in ("push", "pull"):
        assert c.line(line)(1e6) == pytest.approx(50e-6 + 1e6 * 8 / 10e9)
    assert study.network_label("10gbit") == "10 Gbit/s" and study.network_label("100mbit") == "100 Mbit/s"
    with pytest.raises(ValueError):
        study.network_cost("fast")


def test_find_trace_and_unknown_model():
    assert study.find_trace("vgg16") == "vgg16_b32_v100-estimate"
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        study.find_trace("nope")


def test_throughput_table_definitions(traces, thr):
    assert len(thr) == 2 * 2 * len(study.SIM_METHODS)
    assert not thr.duplicated(["model", "network", "scheduler"]).any()
    batch = thr.model.map({m: t.batch_size for m, t in traces.items()})
    assert np.allclose(thr.throughput, 8 * batch / thr.iteration_s)
    bsp = thr[thr.scheduler == "ps_bsp"]
    assert np.allclose(bsp.speedup_vs_bsp, 1.0) and (bsp.stage1_bytes_share == 1.0).all()
    compute = thr.model.map({m: trace_compute_s(t) for m, t in traces.items()})
    assert (thr.iteration_s >= compute - 1e-12).all()  # no method beats one computation per iteration
    # identical simulated workers: SSP never waits for its bound, so it equals ASP
    a = thr[thr.scheduler == "ps_asp"].set_index(["model", "network"]).iteration_s
    s = thr[thr.scheduler == "ps_ssp"].set_index(["model", "network"]).iteration_s
    assert np.allclose(a, s.loc[a.index])
    # each row is its planner's simulated period (plan meta)
    r = thr[(thr.scheduler == "osp") & (thr.model == "resnet50") & (thr.network == "10gbit")].iloc[0]
    plan = make_plan("osp", traces["resnet50"], study.network_cost("10gbit"), servers=1, stage1_share=0.5,
                     importance="position")
    assert r.iteration_s == pytest.approx(plan.meta["iteration_s"]) and r.stage1_share == 0.5
    assert r.stage1_bytes_share == pytest.approx(plan.meta["stage1_bytes_share"])
    auto = thr[thr.scheduler == "osp_auto"]
    assert np.allclose(auto.stage1_share, 1 - auto.auto_stage2_share)


def test_speedup_summary_against_bsp_and_the_paper_claim(thr):
    s = study.speedup_summary(thr)
    per = s[~s.model.str.startswith("all models")]
    assert len(per) == 4 and set(per.best_osp) == {"osp"}   # osp_auto is ours, not the paper's OSP
    for r in per.itertuples():
        g = thr[(thr.model == r.model) & (thr.network == r.network)].set_index("scheduler")
        best = g.loc["osp", "iteration_s"]
        assert r.speedup_vs_bsp_pct == pytest.approx(100 * (g.loc["ps_bsp", "iteration_s"] / best - 1))
        other = min(g.loc[s, "iteration_s"] for s in ("ps_bsp", "ps_asp", "ps_ssp"))
        assert r.best_other in {"ps_bsp", "ps_asp", "ps_ssp"}
        assert r.speedup_vs_best_other_pct == pytest.approx(100 * (other / best - 1))
    tops = s[s.model.str.startswith("all models")]
    assert len(tops) == 2 and (tops.paper_claim_pct == study.PAPER_CLAIM_PCT).all()
    assert (s.paper_claim.str.contains("paper's claim")).all()


def test_stage_ratio_share_one_is_bsp_and_auto_is_marked(traces):
    t = study.stage_ratio_table(traces, [0.0, 0.5, 1.0], ["10gbit"])
    assert len(t) == 2 * 4 and (t.groupby("model").point.apply(lambda p: (p == "auto").sum()) == 1).all()
    one = t[(t.point == "sweep") & (t.stage1_share == 1.0)]
    assert np.allclose(one.speedup_vs_bsp, 1.0) and (one.stage1_bytes_share == 1.0).all()
    zero = t[(t.point == "sweep") & (t.stage1_share == 0.0)]
    assert (zero.stage1_bytes_share == 0.0).all()
    ref = study.throughput_table(traces, ["10gbit"], ["osp_auto"])
    auto = t[t.point == "auto"].set_index("model")
    assert np.allclose(auto.loc[ref.model, "iteration_s"], ref.iteration_s)


def test_timeline_window_messages_and_stages(traces):
    cost = study.network_cost("10gbit")
    ops = study.timeline_table(traces["resnet50"], cost, ["ps_bsp", "osp"], stage1_share=0.5, iterations=3)
    assert set(ops.scheduler) == {"ps_bsp", "osp"}
    assert (ops.start_s >= 0).all() and (ops.end_s <= ops.window_s + 1e-12).all() and (ops.end_s > ops.start_s).all()
    bsp, osp = ops[ops.scheduler == "ps_bsp"], ops[ops.scheduler == "osp"]
    assert set(bsp[bsp.kind.isin(["push", "pull"])].stage) == {"stage 1"}
    assert set(osp[osp.kind.isin(["push", "pull"])].stage) == {"stage 1", "stage 2"}
    # steady state: the window is three periods; worker 0 computes three times in it
    assert bsp.window_s.iloc[0] == pytest.approx(3 * bsp.iteration_s.iloc[0], rel=1e-6)
    assert len(bsp[(bsp.stream == "worker0") & (bsp.kind == "compute")]) == 3
    # BSP: every worker's push of an iteration lies on the server's in-link, one after the other
    pushes = bsp[bsp.kind == "push"].sort_values("start_s")
    assert (pushes.start_s.to_numpy()[1:] >= pushes.end_s.to_numpy()[:-1] - 1e-12).all()
    with pytest.raises(ValueError, match="iterations"):
        study.timeline_table(traces["resnet50"], cost, ["ps_bsp"], iterations=20)


def test_the_ps_schedulers_have_styles_distinct_when_drawn_together():
    names = FAMILIES["ps"]
    assert {"ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_nolgp", "osp_auto"} <= set(names)
    assert len({STYLES[n].color for n in names}) == len(names)
    assert plots.method_label("ps_bsp") == "BSP" and plots.method_label("osp_nolgp") == "OSP w/o LGP"


def _legends_clear_of_axes(fig) -> None:
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert legends
    for leg in legends:
        b = leg.get_window_extent(r)
        for ax in fig.axes:
            a = ax.get_window_extent(r)
            assert not (b.x0 < a.x1 - 1 and a.x0 < b.x1 - 1 and b.y0 < a.y1 - 1 and a.y0 < b.y1 - 1)


def _measured_throughput() -> pd.DataFrame:
    rows = []
    for method, sched, share, it in (("ps_bsp", "ps_bsp", 1.0, 0.2), ("ps_asp", "ps_asp", 1.0, 0.15),
                                     ("osp", "osp", 0.5, 0.14), ("osp_nolgp", "osp", 0.5, 0.14),
                                     ("osp_auto", "osp_auto", 0.0, 0.12)):
        rows.append({"run_id": method, "method": method, "scheduler": sched, "label": method, "workers": 2,
                     "batch_size": 32, "stage1_share": share, "stage1_bytes_share": share, "iteration_s": it,
                     "throughput_samples_s": 64 / it, "speedup_vs_bsp": 0.2 / it, "predicted_s": it * 0.9,
                     "oversubscribed": True})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_figures_draw_from_the_tables(tmp_path, traces, thr):
    from repro.figures import save_figure

    ops = study.timeline_table(traces["resnet50"], study.network_cost("10gbit"), ["ps_bsp", "osp_auto"])
    fig = plots.plot_timeline(ops, "t (simulated)", "note")
    assert len(fig.axes) == 2 and "ms" in fig.axes[-1].get_xlabel()
    _legends_clear_of_axes(fig)
    fig = plots.plot_throughput(_measured_throughput(), thr, "measured note", "sim note", summary="ours vs claim")
    assert len(fig.axes) == 3 and "samples/s" in fig.axes[0].get_ylabel()
    assert all("simulated" in ax.get_title() for ax in fig.axes[1:])
    _legends_clear_of_axes(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("paper's claim" in t for t in labels)
    m = _measured_throughput()
    ratio = m[m.method.isin(["ps_bsp", "osp", "osp_auto"])].assign(
        point=lambda d: d.scheduler.map({"ps_bsp": "bsp", "osp": "sweep", "osp_auto": "auto"}),
        final_accuracy=0.8, epochs=3)
    sim_ratio = study.stage_ratio_table(traces, [0.0, 1.0], ["10gbit"])
    fig = plots.plot_stage_ratio(ratio, sim_ratio, "m", "s")
    assert len(fig.axes) == 3
    _legends_clear_of_axes(fig)
    side = save_figure(fig, "osp.stage_ratio", tmp_path, scale="tiny", source=["measured", "simulated"])
    assert "tiny" in side["title"] and (tmp_path / "osp_stage_ratio.png").is_file()


# ------------------------------------------------------------------------------------------ cost modes

def test_paper_mode_is_the_alpha_beta_link(traces, thr):
    """Paper mode (the default) is :func:`network_cost` itself: every row equals a simulation on it."""
    assert set(thr.cost_mode) == {"paper"}
    for rate in ("10gbit", "100gbit", "1gbit"):
        assert study.cost_for_rate(rate, 8, 50e-6) == study.network_cost(rate, 8, 50e-6)
    for r in thr.itertuples():
        ref = study.iteration(traces[r.model], r.scheduler, study.network_cost(r.network, 8))
        assert r.iteration_s == ref["iteration_s"], r
    ratio = study.stage_ratio_table(traces, [0.0, 1.0], ["10gbit"], cost_mode="paper")
    bsp = {m: study.iteration(t, "ps_bsp", study.network_cost("10gbit", 8))["iteration_s"] for m, t in traces.items()}
    one = ratio[(ratio.point == "sweep") & (ratio.stage1_share == 1.0)]
    assert np.allclose(one.iteration_s, one.model.map(bsp)) and set(ratio.cost_mode) == {"paper"}
    assert set(study.speedup_summary(thr).cost_mode) == {"paper"}


@pytest.mark.slow
def test_calibrated_mode_differs_is_finite_and_says_so(traces, thr):
    for rate, net in (("10gbit", "10gbe"), ("100gbit", "100gbib")):
        c = study.cost_for_rate(rate, 8, 50e-6, "calibrated")
        assert f"calibrated {net}-calibrated" in c.source and not c.is_paper_model, rate
        assert c.line("push")(1e6) > 0 and c.line("pull")(1e6) > 0
    other = study.cost_for_rate("1gbit", 8, 50e-6, "calibrated")  # no measured 1 Gbit/s network: its link + realism
    assert "calibrated mode" in other.source and not other.is_paper_model
    assert other.lines == study.network_cost("1gbit", 8, 50e-6).lines
    cal = study.throughput_table(traces, ["10gbit", "100gbit"], cost_mode="calibrated")
    keys = ["model", "network", "scheduler"]
    assert (cal[keys].to_numpy() == thr[keys].to_numpy()).all() and set(cal.cost_mode) == {"calibrated"}
    assert np.isfinite(cal.iteration_s).all() and (cal.iteration_s > 0).all()
    assert not np.allclose(cal.iteration_s, thr.iteration_s)
    ratio = study.stage_ratio_table(traces, [0.0, 1.0], ["10gbit"], cost_mode="calibrated")
    assert set(ratio.cost_mode) == {"calibrated"} and np.isfinite(ratio.iteration_s).all()
    cost = study.cost_for_rate("10gbit", 8, cost_mode="calibrated")
    ops = study.timeline_table(traces["resnet50"], cost, ["ps_bsp", "osp_auto"], cost_mode="calibrated")
    assert set(ops.cost_mode) == {"calibrated"}
    fig = plots.plot_timeline(ops, "t (simulated)", "note")
    assert fig.get_suptitle() == "t (simulated) (calibrated on ddl-benchmarks)"
    _legends_clear_of_axes(fig)
    fig = plots.plot_throughput(_measured_throughput(), cal, "measured note", "sim note")
    assert all("simulated (calibrated on ddl-benchmarks)" in ax.get_title() for ax in fig.axes[1:])
    fig = plots.plot_throughput(_measured_throughput(), thr, "measured note", "sim note")
    assert all("simulated (paper model)" in ax.get_title() for ax in fig.axes[1:])


def test_a_bad_cost_mode_is_one_line(traces):
    for call in (lambda: study.throughput_table(traces, cost_mode="fitted"),
                 lambda: study.stage_ratio_table(traces, [0.5], cost_mode="fitted"),
                 lambda: study.cost_for_rate("10gbit", cost_mode="fitted"),
                 lambda: study.timeline_table(traces["resnet50"], study.network_cost("10gbit"), cost_mode="fitted")):
        with pytest.raises(ValueError, match="cost_mode must be one of paper, calibrated") as e:
            call()
        assert "\n" not in str(e.value)
