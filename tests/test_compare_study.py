"""compare.schedulers: every scheduler of the four papers on one footing (repro.studies.compare)."""

import numpy as np
import pandas as pd
import pytest

from repro.core.planners import PLANNER_FAMILY, PLANNERS
from repro.studies import compare

# Written out here, not read from the module: the four papers' schedulers and the ones that change the math.
FOUR_PAPERS = {"wfbp", "syncea", "threshold", "horovod", "ddp_buckets", "mgwfbp", "optimal",
               "topk_layerwise", "topk_single", "omgs", "omgs_optimal",
               "dear_nofusion", "dear_threshold", "dear_model", "dear_optimal", "bytescheduler",
               "ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_auto"}
CHANGE_MATH = {"topk_layerwise", "topk_single", "omgs", "omgs_optimal", "ps_asp", "ps_ssp", "osp", "osp_auto"}
KEYS = ["model", "network", "workers"]


@pytest.fixture(scope="module")
def sim():
    # The paper model: independent of the shipped calibration files, and quick (one model, two P).
    return compare.simulated_table(["resnet50"], ["10gbe-derived", "56gbib-derived"], [4, 8], cost_mode="paper")


def _independent_best(df: pd.DataFrame, keys) -> tuple[pd.Series, pd.Series]:
    best = pd.Series(False, index=df.index)
    best_sync = pd.Series(False, index=df.index)
    for _, g in df.groupby(keys):
        low = g["iteration_s"].min()
        best[g.index] = np.isclose(g["iteration_s"], low, rtol=1e-9, atol=0)
        sync = g[~g["scheduler"].isin(CHANGE_MATH)]
        best_sync[sync.index] = np.isclose(sync["iteration_s"], sync["iteration_s"].min(), rtol=1e-9, atol=0)
    return best, best_sync


@pytest.mark.slow
def test_every_scheduler_of_the_four_papers_is_compared(sim):
    assert set(compare.SCHEDULERS) == FOUR_PAPERS == set(PLANNERS)  # every planner of every family
    assert {PLANNER_FAMILY[s] for s in FOUR_PAPERS} == {"allreduce", "sparse", "dear", "bytescheduler", "ps"}
    assert len(sim) == len(FOUR_PAPERS) * 2 * 2
    for _, g in sim.groupby(KEYS):
        assert set(g["scheduler"]) == FOUR_PAPERS
    assert (sim["iteration_s"] > 0).all() and np.isfinite(sim["iteration_s"]).all()
    t = sim.iloc[0]
    np.testing.assert_allclose(sim["throughput_samples_s"], sim["workers"] * sim["batch_size"] / sim["iteration_s"])
    assert t["trace"] == "resnet50_b64_v100-estimate" and t["origin"] == "simulated, paper"


def test_best_flags_are_the_minimum_per_configuration(sim):
    best, best_sync = _independent_best(sim, KEYS)
    assert (sim["best"] == best).all()
    assert (sim["best_sync_sgd"] == best_sync).all()
    for _, g in sim.groupby(KEYS):
        assert g["best"].any() and g["best_sync_sgd"].any()
        assert g["relative_to_best"].min() == pytest.approx(1.0)
    summary = compare.best_table(sim, KEYS)
    assert len(summary) == 4
    for r in summary.itertuples():
        g = sim[(sim.model == r.model) & (sim.network == r.network) & (sim.workers == r.workers)]
        assert r.best_iteration_s == pytest.approx(g.iteration_s.min())
        assert r.best_sync_iteration_s == pytest.approx(g[~g.scheduler.isin(CHANGE_MATH)].iteration_s.min())
        tied = g[np.isclose(g.iteration_s, g.iteration_s.min(), rtol=1e-9, atol=0)]
        assert set(r.best.split(", ")) == set(tied.scheduler)


def test_math_changing_schedulers_are_marked_with_the_stated_density(sim):
    changed = set(sim.loc[~sim["keeps_sync_sgd"], "scheduler"])
    assert changed == CHANGE_MATH
    notes = sim.drop_duplicates("scheduler").set_index("scheduler")["math_note"]
    assert all(notes[s].startswith("changes the update") for s in CHANGE_MATH)
    assert all(notes[s] == "" for s in FOUR_PAPERS - CHANGE_MATH)
    sparse = sim[sim.scheduler.isin(["topk_layerwise", "topk_single", "omgs", "omgs_optimal"])]
    assert (sparse["density"] == compare.DEFAULT_DENSITY).all()
    assert sparse["math_note"].str.contains("top-k, density 0.001").all()
    assert sim.loc[~sim.scheduler.isin(sparse.scheduler), "density"].isna().all()
    ps = sim[sim.scheduler.isin(["ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_auto"])]
    assert (ps["servers"] == np.ceil(ps["workers"] / 4)).all()  # one server per node of 4 GPUs


def test_mark_best_ties_nan_and_sync_only():
    df = pd.DataFrame({"model": ["m"] * 4 + ["n"] * 2, "network": "x", "workers": 8,
                       "scheduler": ["a", "b", "c", "d", "a", "c"],
                       "keeps_sync_sgd": [True, True, False, True, True, False],
                       "iteration_s": [2.0, 2.0, 1.0, np.nan, 3.0, 4.0]})
    out = compare.mark_best(df, KEYS)
    assert out["best"].tolist() == [False, False, True, False, True, False]
    assert out["best_sync_sgd"].tolist() == [True, True, False, False, True, False]  # the tie: both
    assert out["relative_to_best"].iloc[0] == pytest.approx(2.0)


@pytest.mark.parametrize("kwargs, match", [
    ({"schedulers": ["wfbp", "nope"]}, "schedulers: unknown scheduler"),
    ({"schedulers": []}, "schedulers: give at least one"),
    ({"models": ["no_such_model"]}, "models: no shipped V100 estimate trace"),
    ({"workers": [6], "cost_mode": "calibrated"}, "P=6 is not whole nodes"),
    ({"workers": [1]}, "workers: 1 is not a worker count"),
    ({"density": 0.0}, "density: must be a number in"),
    ({"cost_mode": "magic"}, "cost_mode must be one of"),
    ({"networks": ["no-such-net"]}, "network 'no-such-net'"),
    ({"topk_gamma_s": -1.0}, "topk_gamma_s"),
])
def test_bad_inputs_give_one_clear_line(kwargs, match):
    args = {"models": ["resnet50"], "networks": ["10gbe-derived"], "workers": [8], "schedulers": ["wfbp"],
            "cost_mode": "paper", **kwargs}
    with pytest.raises(ValueError, match=match) as e:
        compare.simulated_table(args.pop("models"), args.pop("networks"), args.pop("workers"), args.pop("schedulers"),
                                **args)
    assert "\n" not in str(e.value)


def test_calibrated_mode_uses_the_calibrated_clusters():
    from repro.costs.published_fits import calibrated_presets

    assert {"10gbe-calibrated", "100gbib-calibrated"} <= set(calibrated_presets())   # package data
    sim = compare.simulated_table(["resnet50"], ["10gbe-derived", "56gbib-derived"], [8],
                                  ["mgwfbp", "topk_single", "dear_threshold", "ps_bsp"])
    assert set(sim["cost_model"]) == {"10gbe-calibrated", "100gbib-calibrated"}
    assert (sim["cost_mode"] == "calibrated").all() and (sim["origin"] == "simulated, calibrated").all()
    best, best_sync = _independent_best(sim, KEYS)
    assert (sim["best"] == best).all() and (sim["best_sync_sgd"] == best_sync).all()


def test_measured_configs_one_run_per_scheduler_in_the_right_world():
    by_world = compare.measured_configs(["wfbp", "omgs", "ps_ssp", "osp"], "tiny_resnet", workers=2,
                                        bandwidth="100mbit", steps=3)
    assert sorted(by_world) == [2, 3]
    two, three = ({c["scheduler"]: c for c in by_world[w]} for w in (2, 3))
    assert set(two) == {"wfbp", "omgs"} and set(three) == {"ps_ssp", "osp"}
    assert two["omgs"]["density"] == compare.DEFAULT_DENSITY and "density" not in two["wfbp"]
    assert three["ps_ssp"]["servers"] == 1 and three["ps_ssp"]["staleness"] == 2
    assert three["osp"]["stage1_share"] == 0.5
    ids = [c["run_id"] for cs in by_world.values() for c in cs]
    assert len(set(ids)) == 4 and all(i.endswith("_bw100mbit") for i in ids)
    from repro.train import TrainConfig

    for cs in by_world.values():
        for c in cs:
            TrainConfig(**c)  # every config is a valid run
    with pytest.raises(ValueError, match="schedulers: unknown scheduler.*ddpx") as e:
        compare.measured_configs(["ddpx", "wfbp"])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="workers: the measured runs need 2"):
        compare.measured_configs(["wfbp"], workers=1)


@pytest.mark.slow
def test_figure_draws_every_row_and_marks_the_best(sim):
    import matplotlib

    matplotlib.use("Agg")
    from repro.figures.compare_plots import BEST_MARK, BEST_SYNC_MARK, plot_compare

    measured = compare.mark_best(pd.DataFrame({
        "model": "tiny_resnet", "link": "100mbit", "workers": 2, "scheduler": ["wfbp", "topk_single", "ps_bsp"],
        "keeps_sync_sgd": [True, False, True], "iteration_s": [0.08, 0.07, 0.15],
        "oversubscribed": [False, False, True]}), ["model", "link", "workers"])
    fig = plot_compare(sim, measured, sim_note="simulated note", measured_note="measured note")
    axes = fig.axes
    assert len(axes) == 4  # two networks, measured, colour bar
    labels = [t.get_text() for t in axes[0].get_yticklabels()]
    for s in FOUR_PAPERS:
        assert any(lab.startswith(s + ":") or lab == s for lab in labels), s
    assert sum(lab.endswith("\u2020") for lab in labels) == len(CHANGE_MATH)
    stars = sum(t.get_text().endswith(BEST_MARK) for ax in axes[:2] for t in ax.texts)
    assert stars == int(sim["best"].sum())
    assert [t.get_text() for t in axes[2].texts if t.get_text().endswith((BEST_MARK, BEST_SYNC_MARK))] == \
        ["1.14" + BEST_SYNC_MARK, "1.00" + BEST_MARK]
    titles = " ".join(ax.get_title() for ax in axes)
    assert "simulated, paper model" in titles and "measured,\ntiny scale" in titles
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.distributed
@pytest.mark.slow
def test_measured_tiny_runs_give_a_table_with_best_flags(tmp_path):
    """Two schedulers on loopback (one all-reduce world of 2 ranks, one PS world of 3), 2 timed steps each."""
    df = compare.run_measured(["wfbp", "ps_asp"], tmp_path, model="tiny_resnet", workers=2, bandwidth=None,
                              steps=2, warmup_steps=1, batch_size=8)
    assert set(df["scheduler"]) == {"wfbp", "ps_asp"}
    r = df.set_index("scheduler")
    assert r.loc["wfbp", "ranks"] == 2 and r.loc["ps_asp", "ranks"] == 3 and r.loc["ps_asp", "servers"] == 1
    assert (df["link"] == "loopback").all() and (df["origin"] == "measured, tiny scale").all()
    assert bool(r.loc["ps_asp", "oversubscribed"]) == (3 > r.loc["ps_asp", "cpu_count"])
    assert not r.loc["ps_asp", "keeps_sync_sgd"] and r.loc["wfbp", "keeps_sync_sgd"]
    assert (df["iteration_s"] > 0).all()
    assert df["best"].sum() == 1 and df.loc[df["best"], "iteration_s"].iloc[0] == df["iteration_s"].min()
    assert r.loc["wfbp", "best_sync_sgd"]


@pytest.mark.parametrize("cost_mode", ["paper", "calibrated"])
def test_parameter_server_rows_equal_a_fresh_simulation(cost_mode):
    """The table takes a PS plan's own simulated period (no second simulation): it must be simulate's."""
    from repro.core.planners import make_plan
    from repro.core.simulate import simulate
    from repro.core.trace import load_trace

    names = ["ps_bsp", "ps_ssp", "osp", "osp_auto"]
    sim = compare.simulated_table(["resnet50"], ["10gbe-derived"], [8], names, cost_mode=cost_mode)
    trace = load_trace("resnet50_b64_v100-estimate")
    cost = compare._cost("10gbe-derived", 8, cost_mode, compare.TOPK_GAMMA_S)
    for s in names:
        plan = make_plan(s, trace, cost, **compare.plan_options(s, 8))
        fresh = simulate(trace, plan, cost, with_ops=False).iteration_s
        assert sim.set_index("scheduler").loc[s, "iteration_s"] == pytest.approx(fresh, rel=1e-12)
