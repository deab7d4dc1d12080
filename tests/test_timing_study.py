"""repro.studies.timing: interleaved timing samples of several schedulers (the tables behind measured verdicts)."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.studies import timing

COLUMNS = {"model", "workers", "scheduler", "pair", "iteration_s", "mode", "steps", "position", "ranks", "cpu_count",
           "oversubscribed"}


def test_interleaved_order_reverses_every_other_round():
    assert timing.interleaved_order(2, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert timing.interleaved_order(3, 2) == [[0, 1, 2], [2, 1, 0]]


@pytest.mark.parametrize("kwargs, match", [
    ({"schedulers": ["wfbp"]}, r"^a timing comparison needs at least 2 schedulers, got 1$"),
    ({"schedulers": ["wfbp", "wfbp"]}, r"^the same scheduler configuration is listed twice"),
    ({"schedulers": ["wfbp", {"threshold_bytes": 1}]}, r"^a scheduler is a name or a dict with a 'scheduler' name"),
    ({"mode": "blocks"}, r"^mode must be one of steps, runs, got 'blocks'$"),
    ({"pairs": 0}, r"^pairs must be an integer >= 1, got 0$"),
    ({"block_steps": 2.5}, r"^block_steps must be an integer >= 1, got 2.5$"),
    ({"workers": 1}, r"^workers must be an integer >= 2, got 1$"),
    ({"servers": 1}, r"^servers > 0 \(dedicated parameter servers\) needs mode='runs'"),
])
def test_bad_arguments_fail_in_one_line_before_any_rank_starts(kwargs, match):
    args = {"schedulers": ["wfbp", "mgwfbp"], "workers": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        timing.interleaved_samples("tiny_resnet", args.pop("schedulers"), args.pop("workers"), **args)


def test_timing_params_say_how_the_samples_were_taken():
    p = timing.timing_params(mode="runs", pairs=6, block_steps=4, warmup_steps=2, workers=2, servers=1, cpus=2)
    assert p["timing_pairs"] == 6 and p["timing_steps_per_block"] == 4 and p["timing_warmup_steps"] == 2
    assert p["timing_ranks"] == 3 and p["timing_threads_per_rank"] == 1 and p["timing_oversubscribed"] is True
    assert "oversubscribed" in p["timing_ranks_vs_cores"]
    assert timing.timing_params(workers=2, cpus=4)["timing_oversubscribed"] is False


def test_pair_ratios_and_their_summary():
    s = pd.DataFrame({"model": "m", "pair": [0, 0, 1, 1, 2, 2], "scheduler": ["a", "b"] * 3,
                      "iteration_s": [2.0, 1.0, 3.0, 1.0, 1.0, 1.0]})
    r = timing.pair_ratios(s, {"scheduler": "a"}, {"scheduler": "b"})
    assert r.sort_values("pair")["ratio"].tolist() == [2.0, 3.0, 1.0]
    summ = timing.ratio_summary(r["ratio"])
    assert summ["pairs"] == 3 and summ["median"] == 2.0 and summ["min"] == 1.0 and summ["max"] == 3.0
    assert 1.0 <= summ["ci_low"] <= summ["median"] <= summ["ci_high"] <= 3.0
    assert timing.ratio_summary([1.1])["ci_low"] != timing.ratio_summary([1.1])["ci_low"]  # NaN below 2 pairs


def _check_table(df: pd.DataFrame, schedulers: list[str], pairs: int, mode: str, steps: int) -> None:
    assert COLUMNS <= set(df.columns)
    assert len(df) == len(schedulers) * pairs
    assert (df["mode"] == mode).all() and (df["steps"] == steps).all() and (df["workers"] == 2).all()
    assert (df["iteration_s"] > 0).all() and df["iteration_s"].notna().all()
    assert df["pair"].dtype.kind == "i"
    # every pair holds one sample of every scheduler
    for _, g in df.groupby("pair"):
        assert sorted(g["scheduler"]) == sorted(schedulers)
    assert sorted(df["pair"].unique()) == list(range(pairs))


@pytest.mark.slow
@pytest.mark.distributed
def test_steps_mode_samples_two_schedulers_side_by_side_in_pairs():
    df = timing.interleaved_samples("tiny_resnet", ["wfbp", {"scheduler": "threshold", "threshold_bytes": 4096}], 2,
                                    pairs=timing.MIN_PAIRS, block_steps=2, warmup_steps=1, batch_size=8)
    _check_table(df, ["wfbp", "threshold"], timing.MIN_PAIRS, "steps", 2)
    assert timing.MIN_PAIRS >= 5
    assert df.loc[df.scheduler == "threshold", "threshold_bytes"].eq(4096).all()
    assert df.loc[df.scheduler == "wfbp", "threshold_bytes"].isna().all()
    # the plan each copy ran: WFBP one bucket per parameter tensor, a 4 KiB threshold fewer of them
    per = df.groupby("scheduler").buckets.agg(["min", "max"])
    assert (per["min"] == per["max"]).all() and per.loc["wfbp", "min"] > per.loc["threshold", "min"] >= 1
    assert "buckets" not in timing.config_columns(df)
    ratios = timing.pair_ratios(df, {"scheduler": "threshold"}, {"scheduler": "wfbp"})
    assert len(ratios) == timing.MIN_PAIRS and (ratios["ratio"] > 0).all()


@pytest.mark.slow
@pytest.mark.distributed
def test_runs_mode_interleaves_whole_runs_abba():
    df = timing.interleaved_samples("tiny_resnet", ["wfbp", "syncea"], 2, mode="runs", pairs=5, block_steps=2,
                                    warmup_steps=1, batch_size=8)
    _check_table(df, ["wfbp", "syncea"], 5, "runs", 2)
    first = df[df.position == 0].sort_values("pair")["scheduler"].tolist()
    assert first == ["wfbp", "syncea", "wfbp", "syncea", "wfbp"]  # A B, B A, A B, ...


def test_ratio_table_compares_every_configuration_with_the_reference_pair_by_pair():
    s = pd.DataFrame({"model": "m", "pair": [0, 0, 0, 1, 1, 1], "scheduler": ["a", "b", "t"] * 2,
                      "iteration_s": [2.0, 1.0, 1.5, 3.0, 1.0, 1.2], "threshold_bytes": [None, None, 5] * 2})
    r = timing.ratio_table(s, {"scheduler": "b"}).set_index("scheduler")
    assert list(r.index) == ["a", "t"]  # the reference is not compared with itself
    assert r.loc["a", "median"] == 2.5 and r.loc["a", "pairs"] == 2
    assert r.loc["t", "threshold_bytes"] == 5 and r.loc["t", "min"] == pytest.approx(1.2)


def test_with_sample_medians_replaces_a_runs_value_by_its_samples_median():
    runs = pd.DataFrame({"model": "m", "workers": 2, "scheduler": ["a", "b", "c"], "iteration_s": [9.0, 8.0, 7.0]})
    s = pd.DataFrame({"model": "m", "workers": 2, "pair": [0, 0, 1, 1, 2, 2], "scheduler": ["a", "b"] * 3,
                      "iteration_s": [1.0, 2.0, 3.0, 4.0, 2.0, 6.0]})
    out = timing.with_sample_medians(runs, s).set_index("scheduler")
    assert out["iteration_s"].tolist() == [2.0, 4.0, 7.0]
    assert out["run_iteration_s"].tolist() == [9.0, 8.0, 7.0] and out["samples"].tolist() == [3, 3, 0]
    assert timing.with_sample_medians(runs, None)["iteration_s"].tolist() == [9.0, 8.0, 7.0]


def test_an_option_a_sample_does_not_set_matches_any_runs_value():
    runs = pd.DataFrame({"model": "m", "scheduler": ["a", "t", "t"], "threshold_bytes": [25, 4, 8],
                         "iteration_s": [9.0, 8.0, 7.0]})
    s = pd.DataFrame({"model": "m", "pair": [0, 0, 0], "scheduler": ["a", "t", "t"], "threshold_bytes": [None, 4, 16],
                      "iteration_s": [1.0, 2.0, 3.0]})
    out = timing.with_sample_medians(runs, s, keys=("model", "scheduler", "threshold_bytes"))
    assert out["iteration_s"].tolist() == [1.0, 2.0, 7.0] and out["samples"].tolist() == [1, 1, 0]


SHIPPED_INPUTS = "omgs_timing_inputs.json"
RECORDED = {"workers": 2, "batch_size": 32, "emulate_bandwidth": "10mbit"}


def test_recorded_plan_inputs_apply_only_under_the_settings_they_were_measured_under(tmp_path):
    inputs, note = timing.load_plan_inputs(SHIPPED_INPUTS, ["tiny_resnet", "tiny_lstm"], RECORDED)
    assert set(inputs) == {"tiny_resnet", "tiny_lstm"} and "recorded" in note
    trace, cost = inputs["tiny_resnet"]
    assert trace.num_layers > 1 and cost.workers == 2
    for other, word in (({**RECORDED, "workers": 3}, "workers 3"), ({**RECORDED, "emulate_bandwidth": None}, "emulate_bandwidth None")):
        none, why = timing.load_plan_inputs(SHIPPED_INPUTS, ["tiny_resnet"], other)
        assert none == {} and "own warm-up" in why and word in why
    none, why = timing.load_plan_inputs(SHIPPED_INPUTS, ["tiny_vgg"], RECORDED)
    assert none == {} and "no recorded tiny_vgg" in why
    # a round trip through a file of one's own
    out = tmp_path / "mine.json"
    timing.save_plan_inputs(out, {"tiny_resnet": (trace, cost)}, RECORDED, "test")
    again, _ = timing.load_plan_inputs(out, ["tiny_resnet"], RECORDED)
    assert again["tiny_resnet"][0].to_dict() == trace.to_dict() and again["tiny_resnet"][1].to_dict() == cost.to_dict()
    with pytest.raises(ValueError, match="miss batch_size"):
        timing.save_plan_inputs(out, {}, {"workers": 2, "emulate_bandwidth": None}, "test")
    with pytest.raises(FileNotFoundError, match="no recorded plan inputs"):
        timing.load_plan_inputs(tmp_path / "absent.json", ["tiny_resnet"], RECORDED)


@pytest.mark.slow
@pytest.mark.distributed
def test_an_online_planner_times_the_plan_of_the_recorded_inputs_not_its_own_warm_up():
    from repro.core.planners import make_plan

    inputs, _ = timing.load_plan_inputs(SHIPPED_INPUTS, ["tiny_resnet"], RECORDED)
    want = len(make_plan("omgs", *inputs["tiny_resnet"], density=0.001).buckets)
    df = timing.interleaved_samples("tiny_resnet", [{"scheduler": "omgs", "density": 0.001},
                                                    {"scheduler": "topk_single", "density": 0.001}], 2,
                                    pairs=1, block_steps=1, warmup_steps=1, batch_size=8, plan_inputs=inputs)
    assert df.loc[df.scheduler == "omgs", "buckets"].tolist() == [want] and want > 1
    assert df.loc[df.scheduler == "topk_single", "buckets"].tolist() == [1]
    with pytest.raises(ValueError, match="plan_inputs needs mode='steps'"):
        timing.interleaved_samples("tiny_resnet", ["wfbp", "mgwfbp"], 2, mode="runs", plan_inputs=inputs)
