import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.cost import preset  # noqa: E402
from repro.figures import mgwfbp_plots  # noqa: E402
from repro.results import read_table, write_table  # noqa: E402
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
    lin = sweep[sweep.solver == "linear"]
    assert (lin.speedup == lin.workers).all()
    row = sweep[(sweep.model == "a") & (sweep.solver == "optimal") & (sweep.workers == 16) & (sweep.network == "10gbe-derived")].iloc[0]
    t = traces["a"]
    assert row.speedup == pytest.approx(16 * (t.total_forward_s + t.total_backward_s) / row.iteration_s)
    assert (sweep[sweep.solver != "linear"].speedup <= sweep[sweep.solver != "linear"].workers + 1e-9).all()


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
    assert set(table.algorithm) == {"ring", "tree", "recursive_doubling", "halving_doubling"}


def test_timeline_table_has_one_iteration_per_solver(traces):
    ops = study.timeline_table(traces["b"], preset("10gbe-v100", 16), ["wfbp", "syncea"])
    assert set(ops.solver) == {"wfbp", "syncea"}
    assert len(ops[(ops.solver == "syncea") & (ops.stream == "comm")]) == 1
    assert len(ops[(ops.solver == "wfbp") & (ops.stream == "comm")]) == 12


def test_find_trace_error_names_the_model():
    with pytest.raises(ValueError, match="no shipped trace for model 'nope'"):
        study.find_trace("nope")


def test_paper_numbers_are_labelled():
    paper = study.paper_speedups()
    assert set(paper.solver) == {"wfbp", "syncea", "mgwfbp"}
    assert paper.source.str.contains("INFOCOM 2019").all()
    assert paper[(paper.model == "googlenet") & (paper.solver == "mgwfbp") & (paper.workers == 8)].speedup.item() == 7.41


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
    fig = mgwfbp_plots.plot_sim_speedup(sweep, study.paper_speedups(), ["googlenet@k80"])
    assert len(fig.axes[0].collections) == 3  # one marker set per published method
    fig = mgwfbp_plots.plot_optimal_gap(study.optimal_gap_table(sweep))
    assert fig.axes
    ops = study.timeline_table(traces["b"], preset("10gbe-v100", 16), ["wfbp", "mgwfbp"])
    assert len(mgwfbp_plots.plot_timeline(ops, "t").axes) == 2
    curve = study.allreduce_curve(["10gbe-v100"], 16, [1e3, 1e6])
    assert mgwfbp_plots.plot_layer_sizes(study.layer_table(traces), curve, ["a", "b"]).axes
    assert mgwfbp_plots.plot_cost_models(study.cost_model_table(1e-5, 1e-9, 0, [4, 8]), "x").axes
