"""The OMGS training study's tables and figures, on hand-built run folders and frames (the numbers here
test the code's arithmetic; they are not results)."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.costs.presets import preset
from repro.core.planners import make_plan  # noqa: E402
from repro.results.runs import BUCKETS_CSV, EPOCHS_CSV, ITERATIONS_CSV, RunWriter  # noqa: E402
from repro.core.simulate import simulate  # noqa: E402
from repro.studies import omgs_train as study  # noqa: E402
from repro.core.trace import load_trace  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _write_run(root, run_id, *, model="tiny_resnet", scheduler="omgs", density=0.05, dataset="synthetic",
               epochs=None, iterations=None, buckets=None, epoch_rows=None, world=2, cpus=2, plan=True):
    """A run folder as repro.train writes it (run.json, iterations.csv, [buckets.csv, epochs.csv], trace,
    plan and cost of a sparse scheduler)."""
    trace = load_trace("tiny_resnet_b32_cpu")
    cost = preset("1gbe-allgather", 2)
    p = make_plan(scheduler, trace, cost, density=density) if plan else None
    summary = {"run_id": run_id, "model": model, "scheduler": scheduler, "world_size": world, "steps": 1, "iteration_s": 0.1,
               "compute_s": 0.05, "exposed_comm_s": 0.05, "buckets": p.num_buckets if p else None,
               "emulated_bandwidth_bps": 1e7, "wire_dtype": "float32"}
    config = {"model": model, "scheduler": scheduler, "density": density, "dataset": dataset, "epochs": epochs,
              "seed": 0, "lr": 0.05, "batch_size": 32}
    with RunWriter(root, run_id) as w:
        w.table(ITERATIONS_CSV, pd.DataFrame(iterations if iterations is not None else
                                             [{"step": 0, "epoch": 0, "iteration_s": 0.1, "forward_s": 0.02,
                                               "backward_call_s": 0.05, "step_s": 0.03, "update_s": 0.01,
                                               "loss": 1.0}]).assign(run_id=run_id))
        if buckets is not None:
            w.table(BUCKETS_CSV, pd.DataFrame(buckets).assign(run_id=run_id))
        if epoch_rows is not None:
            w.table(EPOCHS_CSV, pd.DataFrame(epoch_rows).assign(run_id=run_id))
        if p is not None:
            w.trace(trace)
            w.plan(p)
            w.cost(cost)
        w.record({"run_id": run_id, "config": config, "summary": summary,
                  "environment": {"cpu_count": cpus, "threads_per_rank": 1}})
    return trace, p, cost


# ------------------------------------------------------------------------------------- breakdown, measured

def test_measured_bars_come_from_iterations_and_the_timeline_and_add_up(tmp_path):
    runs = tmp_path / "runs"
    its = [{"step": i, "epoch": 0, "iteration_s": 0.0, "forward_s": f, "backward_call_s": b, "step_s": s,
            "update_s": u, "loss": 1.0}
           for i, (f, b, s, u) in enumerate([(0.020, 0.050, 0.030, 0.010), (0.022, 0.054, 0.034, 0.012),
                                             (0.030, 0.070, 0.050, 0.010)])]
    timeline = [{"bucket": 0, "layers": 3, "bytes": 100, "start_s": 0.031, "end_s": 0.05, "numel": 10, "k": 1,
                 "messages": 2, "compress_start_s": 0.030, "compress_end_s": 0.031},
                {"bucket": 1, "layers": 2, "bytes": 100, "start_s": 0.065, "end_s": 0.08, "numel": 10, "k": 1,
                 "messages": 2, "compress_start_s": 0.062, "compress_end_s": 0.065}]
    trace, plan, cost = _write_run(runs, "a", iterations=its, buckets=timeline)
    df = study.measured_breakdown_table(study.load_runs(tmp_path))
    m = df[df.source == "measured"].iloc[0]
    assert m.forward_s == pytest.approx(0.022)                      # median forward_s
    assert m.sparsify_s == pytest.approx(0.004)                     # 1 ms + 3 ms of compression
    assert m.backward_s == pytest.approx(0.054 - 0.004)             # backward call minus top-k
    assert m.comm_exposed_s == pytest.approx(0.022)                 # median of step_s - update_s
    assert m.other_s == pytest.approx(0.010)
    assert m.iteration_s == pytest.approx(sum(m[c] for c in study.PHASES))
    assert m.network == "emulated 10 Mbit/s links" and "timeline" in m.derivation
    s = df[df.source == "simulated"].iloc[0]                        # the run's own trace, plan and cost
    assert s.iteration_s == pytest.approx(simulate(trace, plan, cost, with_ops=False).iteration_s)
    assert s.iteration_s == pytest.approx(sum(s[c] for c in study.PHASES))
    assert not df.oversubscribed.any()


def test_without_a_timeline_the_top_k_comes_from_the_runs_fitted_cost_and_convergence_runs_are_left_out(tmp_path):
    runs = tmp_path / "runs"
    _, plan, cost = _write_run(runs, "timing", world=4, cpus=2)
    _write_run(runs, "conv", dataset="digits", epochs=1)
    df = study.measured_breakdown_table(study.load_runs(tmp_path))
    assert set(df.run_id) == {"timing"}
    m = df[df.source == "measured"].iloc[0]
    trace = load_trace("tiny_resnet_b32_cpu")
    from repro.families.sparse.simulate import bucket_numels

    assert m.sparsify_s == pytest.approx(float(np.sum(cost.topk_s(np.array(bucket_numels(trace, plan), float)))))
    assert "fitted" in m.derivation
    assert df.oversubscribed.all()  # 4 ranks on 2 cores


def test_a_cluster_jobs_bare_folder_of_runs_is_read_with_usable_paths(tmp_path):
    _write_run(tmp_path / "job", "x")
    runs = study.load_runs(tmp_path / "job")
    assert list(runs.run_id) == ["x"] and str(tmp_path / "job" / "x") == runs.path.iloc[0]
    assert len(study.measured_breakdown_table(runs)) == 2


# ------------------------------------------------------------------------------------------- convergence

def test_convergence_table_perplexity_for_language_models_and_gaps_to_dense(tmp_path):
    runs = tmp_path / "runs"
    for s, losses in (("wfbp", (5.0, 4.0)), ("topk_single", (5.2, 4.5)), ("omgs", (5.1, 4.2))):
        _write_run(runs, f"lm_{s}", model="tiny_lstm", scheduler=s, dataset="pydoc", epochs=2, plan=s != "wfbp",
                   density=0.004, epoch_rows=[{"epoch": e + 1, "train_loss": l + 0.1, "test_loss": l,
                                               "test_accuracy": 0.1} for e, l in enumerate(losses)])
    _write_run(runs, "cnn_omgs", scheduler="omgs", dataset="digits", epochs=1, density=0.05,
               epoch_rows=[{"epoch": 1, "train_loss": 1.0, "test_loss": 0.9, "test_accuracy": 0.7}])
    conv = study.convergence_table(tmp_path)
    lm = conv[conv.model == "tiny_lstm"].set_index(["scheduler", "epoch"])
    assert lm.loc[("omgs", 2), "perplexity"] == pytest.approx(math.exp(4.2))
    assert math.isnan(lm.loc[("wfbp", 1), "density"]) and lm.loc[("omgs", 1), "density"] == 0.004
    assert conv[conv.model == "tiny_resnet"].perplexity.isna().all()
    assert list(conv[conv.model == "tiny_lstm"].scheduler.unique()) == ["wfbp", "topk_single", "omgs"]
    cnn = conv[conv.model == "tiny_resnet"].iloc[0]
    trace = load_trace("tiny_resnet_b32_cpu")
    plan = make_plan("omgs", trace, preset("1gbe-allgather", 2), density=0.05)
    from repro.families.sparse.simulate import bucket_numels, topk_count

    assert cnn.min_elements_sent_per_bucket == min(topk_count(n, 0.05) for n in bucket_numels(trace, plan))
    final = study.final_epoch_table(conv).set_index(["model", "scheduler"])
    assert final.loc[("tiny_lstm", "topk_single"), "test_loss_vs_dense"] == pytest.approx(0.5)
    assert final.loc[("tiny_lstm", "wfbp"), "epoch"] == 2


# ------------------------------------------------------------------------------ paper scale and the paper

def test_paper_numbers_are_read_tidy_from_the_shipped_table_or_a_long_one(tmp_path):
    paper = study.paper_iteration_table()
    if len(paper):  # shipped: the four models, both methods, 16 workers, omgs.md's values
        p = paper.set_index(["model", "scheduler"]).iteration_s
        assert p[("resnet50", "topk_single")] == 0.666 and p[("lstm_ptb", "omgs")] == 0.916
        assert (paper.workers == 16).all() and (paper.source == "paper").all()
    long = tmp_path / "long.csv"
    long.write_text("model,scheduler,iteration_s\nm,TopK-SGD,1.5\nm,OMGS-SGD,1.2\nm,dense,9\n")
    t = study.paper_iteration_table(long)
    assert t.set_index("scheduler").iteration_s.to_dict() == {"topk_single": 1.5, "omgs": 1.2}


def test_paper_scale_bars_add_up_and_match_the_planner(tmp_path):
    df = study.paper_breakdown_table([("resnet50", 32, 0.001), ("lstm_ptb", 20, 0.004)])
    assert set(df.scheduler) == {"topk_single", "omgs"} and (df.workers == 16).all()
    for _, r in df.iterrows():
        assert r.iteration_s == pytest.approx(sum(r[c] for c in study.PHASES))
        trace = load_trace(r.trace)
        plan = make_plan(r.scheduler, trace, preset("1gbe-allgather", 16), density=r.density)
        assert r.iteration_s == pytest.approx(plan.meta["iteration_s"])
        assert r.gpu == ("P102-100" if r.trace.endswith("p102-estimate") else "V100")
    t = study.breakdown_table(df.iloc[0:0], df, study.paper_iteration_table())
    assert set(t.panel) == {"paper"}


def test_run_ids_and_configs():
    conv = study.convergence_configs({"tiny_resnet": ("digits", 0.05), "tiny_lstm": ("pydoc", 0.004)}, 2,
                                     epochs=2, batch_size=16, lr=0.1, lm_lr=0.5)
    ids = {c["run_id"]: c for c in conv}
    assert set(ids) == {"tiny_resnet_wfbp_p2_digits-e2", "tiny_resnet_topk_single_p2_d0.05_digits-e2",
                        "tiny_resnet_omgs_p2_d0.05_digits-e2", "tiny_lstm_wfbp_p2_pydoc-e2",
                        "tiny_lstm_topk_single_p2_d0.004_pydoc-e2", "tiny_lstm_omgs_p2_d0.004_pydoc-e2"}
    assert "density" not in ids["tiny_resnet_wfbp_p2_digits-e2"]
    assert ids["tiny_lstm_omgs_p2_d0.004_pydoc-e2"]["lr"] == 0.5 and ids["tiny_resnet_wfbp_p2_digits-e2"]["lr"] == 0.1
    assert {c["seed"] for c in conv} == {0} and all(c["compute_steps"] == 0 for c in conv)
    from repro.train import TrainConfig

    for c in conv:
        TrainConfig(**{k: v for k, v in c.items() if k != "run_id"})
    timing = study.breakdown_configs({"tiny_lstm": 0.05}, 2, batch_size=8, steps=3, bandwidth="10mbit")
    assert [c["run_id"] for c in timing] == ["tiny_lstm_topk_single_p2_d0.05_bw10mbit",
                                             "tiny_lstm_omgs_p2_d0.05_bw10mbit"]
    assert all(c["record_timeline"] for c in timing)


def test_language_dataset_prefers_penn_treebank(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_DATA_DIR", str(tmp_path / "nothing"))
    assert study.language_dataset()[0] == "pydoc"
    with pytest.raises(FileNotFoundError, match="ptb.train.txt"):
        study.language_dataset(tmp_path)
    d = tmp_path / "penn"
    d.mkdir()
    (d / "ptb.train.txt").write_text("a b\n")
    name, note = study.language_dataset(d)
    import os

    assert name == "ptb" and "Penn Treebank" in note
    assert (tmp_path / "penn" / "ptb.train.txt").samefile(os.path.join(os.environ["REPRO_DATA_DIR"], "ptb",
                                                                       "ptb.train.txt"))


# ------------------------------------------------------------------------------------------------ figures

def _conv_frame(same: bool):
    rows = []
    for m, lm in (("tiny_resnet", False), ("tiny_lstm", True)):
        for s in ("wfbp", "topk_single", "omgs"):
            for e in (1, 2):
                loss = 2.0 / e + (0 if same or s == "wfbp" else 0.1)
                rows.append({"model": m, "dataset": "pydoc" if lm else "digits", "scheduler": s, "epoch": e,
                             "density": None if s == "wfbp" else 0.05, "train_loss": loss, "test_loss": loss,
                             "test_accuracy": 1 - loss / 3, "perplexity": math.exp(loss) if lm else np.nan,
                             "lm": lm})
    return pd.DataFrame(rows)


def test_convergence_figure_panels_and_coinciding_note():
    from repro.figures.omgs_train_plots import plot_convergence

    fig = plot_convergence(_conv_frame(same=True), title_note="test")
    assert len(fig.axes) == 6 and fig.subfigs[1].get_suptitle().startswith("tiny_lstm on pydoc")
    assert fig.axes[5].get_title().strip() == "test perplexity = exp(test loss)"
    assert fig.axes[2].get_title().strip() == "test accuracy"
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("S-SGD = TopK = OMGS" in n for n in notes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["S-SGD (dense, WFBP)", "TopK-SGD", "OMGS-SGD"]
    fig = plot_convergence(_conv_frame(same=False))
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("TopK = OMGS" in n for n in notes) and not any("S-SGD =" in n for n in notes)


def test_breakdown_figure_measured_solid_simulated_light_paper_diamonds_oversubscribed_hatched():
    from repro.figures.omgs_train_plots import plot_breakdown
    from repro.figures.style import OVERSUBSCRIBED_HATCH, OVERSUBSCRIBED_LABEL

    phases = {"forward_s": 0.01, "backward_s": 0.02, "sparsify_s": 0.005, "comm_exposed_s": 0.01, "other_s": 0.001}
    tiny = pd.DataFrame([{"panel": "tiny", "model": "tiny_lstm", "scheduler": s, "source": src, **phases,
                          "iteration_s": 0.046, "oversubscribed": s == "omgs" and src == "measured"}
                         for s in ("topk_single", "omgs") for src in ("measured", "simulated")])
    sim = study.paper_breakdown_table([("lstm_ptb", 20, 0.004)]).assign(panel="paper")
    paper = pd.DataFrame([{"panel": "paper", "model": "lstm_ptb", "scheduler": s, "source": "paper",
                           "iteration_s": v} for s, v in (("topk_single", 1.0), ("omgs", 0.9))])
    fig = plot_breakdown(pd.concat([tiny, sim, paper], ignore_index=True), "tiny", "paper")
    left, right = fig.axes
    alphas = {p.get_alpha() for p in left.patches}
    assert alphas == {None, 0.5} or alphas == {1.0, 0.5}
    assert sum(p.get_hatch() == OVERSUBSCRIBED_HATCH for p in left.patches) == 5  # one bar, five phases
    diamonds = [c for c in right.collections if len(c.get_offsets())]
    assert sorted(float(c.get_offsets()[0][1]) for c in diamonds) == [0.9, 1.0]  # seconds on the right
    assert left.get_ylabel() == "time per iteration (ms)" and right.get_ylabel() == "time per iteration (s)"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert OVERSUBSCRIBED_LABEL in labels and "sparsification (top-k)" in labels
    assert any(t.get_text() == "46 ms" for t in left.texts)  # totals written on the bars, with their unit
    totals = [t.get_text() for t in right.texts if t.get_text()[:1].isdigit()]
    assert len(totals) == 2 and all(t.endswith(" s") for t in totals)


def test_paper_breakdown_table_in_calibrated_mode_adds_the_realism_and_says_so():
    paper = study.paper_breakdown_table([("resnet50", 32, 0.001)], schedulers=["omgs"])
    cal = study.paper_breakdown_table([("resnet50", 32, 0.001)], schedulers=["omgs"], cost_mode="calibrated")
    assert set(paper.cost_mode) == {"paper"} and set(cal.cost_mode) == {"calibrated"}
    assert cal.iteration_s.iloc[0] > paper.iteration_s.iloc[0]   # overheads and contention only add time
    with pytest.raises(ValueError, match="cost_mode must be one of"):
        study.paper_breakdown_table([("resnet50", 32, 0.001)], cost_mode="optimistic")


# ------------------------------------------------------------------------------------- seeds

def _seeded_conv() -> pd.DataFrame:
    """Three seeds of two schedulers over two epochs (accuracies made up to test the arithmetic)."""
    acc = {("wfbp", 0): [0.5, 0.80], ("wfbp", 1): [0.6, 0.90], ("wfbp", 2): [0.4, 0.70],
           ("omgs", 0): [0.3, 0.60], ("omgs", 1): [0.5, 0.95], ("omgs", 2): [0.2, 0.65]}
    rows = []
    for (s, seed), values in acc.items():
        for e, a in enumerate(values, 1):
            rows.append({"model": "tiny_resnet", "dataset": "digits", "scheduler": s,
                         "density": 0.2 if s == "omgs" else None, "world_size": 2, "epoch": e,
                         "train_loss": 1 - a, "test_loss": 1.5 - a, "test_accuracy": a, "perplexity": np.nan,
                         "lm": False, "buckets": 3 + seed if s == "omgs" else None,
                         "min_elements_sent_per_bucket": 4 + seed if s == "omgs" else None, "seed": seed,
                         "lr": 0.05, "batch_size": 32, "oversubscribed": False, "run_id": f"{s}_s{seed}"})
    return pd.DataFrame(rows)


def test_headline_numbers_are_medians_over_seeds_with_the_spread():
    final = study.final_epoch_table(_seeded_conv()).set_index("scheduler")
    assert final.loc["wfbp", "test_accuracy"] == pytest.approx(0.80)  # median of 0.80, 0.90, 0.70
    assert final.loc["omgs", "test_accuracy"] == pytest.approx(0.65)  # median, not the lucky 0.95
    assert (final.loc["omgs", "test_accuracy_min"], final.loc["omgs", "test_accuracy_max"]) == (0.60, 0.95)
    assert final.loc["omgs", "test_accuracy_vs_dense"] == pytest.approx(0.65 - 0.80)
    assert final.loc["omgs", "seeds"] == 3 and final.loc["omgs", "seed_list"] == "0,1,2"
    assert (final.loc["omgs", "buckets_min"], final.loc["omgs", "buckets_max"]) == (3, 5)
    assert final.loc["omgs", "min_elements_sent_per_bucket"] == 4  # the fewest over the seeds


def test_convergence_figure_draws_the_median_and_the_seeds_band():
    from repro.figures.omgs_train_plots import plot_convergence

    fig = plot_convergence(_seeded_conv())
    assert "median of 3 seeds" in fig._suptitle.get_text()
    acc_ax = [ax for ax in fig.get_axes() if "accuracy" in ax.get_ylabel()][0]
    line = [ln for ln in acc_ax.get_lines() if ln.get_label() and "OMGS" in ln.get_label()][0]
    assert list(line.get_ydata()) == pytest.approx([0.3, 0.65])
    bands = acc_ax.collections
    assert len(bands) == 2  # one band per scheduler
    ys = np.concatenate([b.get_paths()[0].vertices[:, 1] for b in bands])
    assert ys.max() == pytest.approx(0.95) and ys.min() == pytest.approx(0.2)
