"""At scale="paper" a convergence figure is drawn from the paper grid's convergence runs only (data/grids:
epochs over a real dataset), found by run id, never from the grid's synthetic throughput runs or from stray
runs in the folder; with none finished it has nothing to draw. Run folders are hand-built as repro.train
writes them (the numbers are not results)."""

from __future__ import annotations

import pandas as pd
import pytest

from repro.grids.grid import finished_run_ids, grid_run_ids, load_grid
from repro.results.runs import EPOCHS_CSV, ITERATIONS_CSV, RunWriter


def _write(runs_dir, run_id: str, config: dict, *, epochs: int | None = 2, accuracy: float = 0.5) -> None:
    """A finished run folder: run.json, iterations.csv and (convergence runs) epochs.csv."""
    world = int(config.get("world_size", 2))
    summary = {"run_id": run_id, "model": config["model"], "scheduler": config["scheduler"], "world_size": world,
               "steps": 3, "iteration_s": 0.1, "compute_s": 0.05, "exposed_comm_s": 0.05, "throughput_samples_s": 320.0,
               "batch_size": config.get("batch_size", 32), "wire_dtype": "float32", "buckets": 3,
               "predicted_iteration_s": 0.1}
    its = pd.DataFrame([{"step": i, "epoch": i // 3, "iteration_s": 0.1, "forward_s": 0.02, "backward_call_s": 0.05,
                         "step_s": 0.03, "update_s": 0.01, "loss": 1.0} for i in range(3 * (epochs or 1))])
    with RunWriter(runs_dir, run_id) as w:
        w.table(ITERATIONS_CSV, its.assign(run_id=run_id))
        if epochs:
            w.table(EPOCHS_CSV, pd.DataFrame([{"epoch": e + 1, "train_loss": 1.0 / (e + 1), "test_loss": 1.0,
                                               "test_accuracy": accuracy + 0.1 * e} for e in range(epochs)]
                                             ).assign(run_id=run_id))
        w.record({"run_id": run_id, "config": {k: v for k, v in config.items() if k != "world_size"},
                  "summary": summary, "environment": {"cpu_count": 64, "threads_per_rank": 1}})


def _fill(runs_dir, paper: str, *, throughput: int = 2, stray: bool = True) -> list[str]:
    """Every convergence run of ``paper``'s grid finished, ``throughput`` of its throughput runs, and a
    stray tiny convergence run that is not the grid's. Returns the convergence run ids."""
    grid = load_grid(paper)
    for r in grid.select("convergence"):
        _write(runs_dir, r.run_id, dict(r.config))
    for r in grid.select("throughput")[:throughput]:
        _write(runs_dir, r.run_id, dict(r.config), epochs=None)
    if stray:
        _write(runs_dir, "tiny_resnet_wfbp_p2_stray", {"model": "tiny_resnet", "scheduler": "wfbp", "dataset": "digits",
                                                       "epochs": 2, "world_size": 2, "density": 0.05})
    return grid.run_ids("convergence")


def test_grid_run_ids_and_finished_run_ids(tmp_path):
    ids = _fill(tmp_path, "omgs")
    assert grid_run_ids("omgs", "convergence") == ids and len(ids) == 9
    done, todo = finished_run_ids("omgs", tmp_path, "convergence")
    assert done == ids and todo == []
    done, todo = finished_run_ids("omgs", tmp_path, "throughput")
    assert len(done) == 2 and len(todo) == 14
    with pytest.raises(ValueError, match="no experiment 'nope'"):
        grid_run_ids("omgs", experiment="nope")


def test_mgwfbp_convergence_at_paper_scale_reads_the_grids_convergence_runs(tmp_path):
    from repro.studies import mgwfbp_train as study

    ids = _fill(tmp_path / "runs", "mgwfbp")
    paper = study.convergence_epochs(tmp_path, scale="paper")
    assert set(paper.run_id) == set(ids) and sorted(set(paper.scheduler)) == ["ddp", "mgwfbp"]
    assert set(paper.model) == {"resnet50"} and set(paper.world_size) == {16}
    tiny = study.convergence_epochs(tmp_path, scale="tiny", model="tiny_resnet", world_size=2)
    assert set(tiny.run_id) == {"tiny_resnet_wfbp_p2_stray"}  # the tiny path is unchanged
    assert set(study.grid_runs(study.load_runs(tmp_path), "mgwfbp", "convergence").run_id) == set(ids)
    empty = tmp_path / "none"
    _fill(empty / "runs", "mgwfbp", stray=False)
    for rid in ids:  # only throughput runs finished: nothing to draw under a paper label
        import shutil

        shutil.rmtree(empty / "runs" / rid)
    assert study.convergence_epochs(empty, scale="paper").empty


def test_omgs_convergence_at_paper_scale_reads_the_grids_convergence_runs(tmp_path):
    from repro.studies import omgs_train as study

    ids = _fill(tmp_path / "runs", "omgs")
    conv = study.convergence_table(tmp_path, scale="paper")
    assert set(conv.run_id) == set(ids)
    assert {(m, d) for m, d in zip(conv.model, conv.dataset)} == {("vgg16_cifar", "cifar10"),
                                                                  ("resnet50", "imagenet"), ("lstm_ptb", "ptb")}
    assert sorted(set(conv.scheduler)) == ["omgs", "topk_single", "wfbp"]
    assert conv[conv.model == "lstm_ptb"].perplexity.notna().all()  # a language model's curve is perplexity
    final = study.final_epoch_table(conv)
    assert len(final) == 9 and (final[final.scheduler == "wfbp"].test_loss_vs_dense == 0).all()
    assert "tiny_resnet_wfbp_p2_stray" in set(study.convergence_table(tmp_path).run_id)  # tiny: every run
    only_throughput = tmp_path / "t"
    _fill(only_throughput / "runs", "omgs", stray=False)
    import shutil

    for rid in ids:
        shutil.rmtree(only_throughput / "runs" / rid)
    assert study.convergence_table(only_throughput, scale="paper").empty


def test_osp_accuracy_figures_at_paper_scale_read_the_grids_convergence_runs(tmp_path):
    from repro.studies import osp_train as study

    ids = _fill(tmp_path / "runs", "osp", throughput=5)
    runs = study.load_runs(tmp_path)
    conv = study.convergence_runs(runs, "paper")
    assert set(conv.run_id) == set(ids) and len(conv) == 10
    assert set(study.convergence_runs(runs, "tiny").run_id) == set(runs.run_id)
    acc = study.accuracy_table(tmp_path, conv)
    assert set(acc.run_id) == set(ids) and set(acc.model) == {"vgg16_cifar"}
    abl = study.lgp_ablation_table(acc, [0.0, 0.5])
    assert set(abl[abl.scheduler == "osp"].lgp) == {True, False}
    ratio = study.stage_ratio_table(study.throughput_table(tmp_path, conv), acc)
    assert set(ratio.run_id) <= set(ids) and ratio.final_accuracy.notna().all()
    sweep = ratio[ratio.point == "sweep"]
    assert sorted(sweep.stage1_share.round(2)) == [0.0, 0.25, 0.5, 0.75]
