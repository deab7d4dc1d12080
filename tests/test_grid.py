"""The papers' grids as data (repro.cluster.grid): shipped files that agree with the paper notes and with
`repro train`, run ids derived from the configuration, and the done / failed / pending status that makes a
relaunch skip finished runs and redo failed ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from repro.cluster.grid import (GRID_PAPERS, GridError, RunConfig, clear_failed, count_status, grids_dir, load_grid,
                                mark_failed, parse_grid, run_id, run_status, status_table)
from repro.runs import check_run_id


def _grid(**over):
    data = {"paper": "t", "notebook": "nb", "gpus_per_node": 2, "train": {"steps": 3},
            "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 8}}, "world_sizes": [2, 4],
                             "schedulers": ["wfbp", "mgwfbp"], "precisions": ["float32"]}]}
    data.update(over)
    return parse_grid(data, "t.yaml")


def _one_line_error(data) -> str:
    with pytest.raises(GridError) as e:
        parse_grid(data, "t.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("t.yaml"), msg
    return msg


# ------------------------------------------------------------------------------------------- shipped grids

def test_every_paper_has_a_grid_file_in_the_package():
    assert sorted(p.stem for p in grids_dir().glob("*.yaml")) == sorted(GRID_PAPERS)
    for paper in GRID_PAPERS:
        grid = load_grid(paper)
        assert grid.paper == paper and grid.runs and grid.source
        assert len(set(grid.run_ids())) == len(grid.runs)


def test_grids_carry_the_papers_setting():
    """Models, per-GPU batch sizes, GPU counts and node sizes as /work/shared/papers/*.md give them."""
    mg = load_grid("mgwfbp")  # journal: 16 V100 = 4 x 4, ResNet-152 128, DenseNet-161/201 64, Inception-v4 128
    assert {(r["model"], r["batch_size"]) for r in mg.runs} == {("resnet152", 128), ("densenet161", 64),
                                                                ("densenet201", 64), ("inception_v4", 128)}
    assert mg.gpus_per_node == 4 and max(mg.world_sizes()) == 16 and max(r.nodes for r in mg.runs) == 4
    assert {r["wire_dtype"] for r in mg.runs} == {"float32", "float16"}
    assert {"wfbp", "syncea", "mgwfbp"} <= {r["scheduler"] for r in mg.runs}
    dear = load_grid("dear")  # 64 GPUs = 16 hosts x 4
    assert {r.processes for r in dear.runs} == {64} and {r.nodes for r in dear.runs} == {16}
    assert {(r["model"], r["batch_size"]) for r in dear.runs} == {("resnet50", 64), ("densenet201", 32),
                                                                  ("inception_v4", 64), ("bert_base", 64),
                                                                  ("bert_large", 32)}
    omgs = load_grid("omgs")  # 16 nodes x 1 GPU; density 0.001 (CNNs), 0.004 (LSTM)
    assert {r.nodes for r in omgs.runs} == {16} and omgs.gpus_per_node == 1
    assert {r["model"]: r["density"] for r in omgs.runs} == {"vgg16_cifar": 0.001, "resnet50": 0.001,
                                                            "inception_v4": 0.001, "lstm_ptb": 0.004}
    osp = load_grid("osp")  # 9 nodes: 1 server + 8 workers
    assert {(r["world_size"], r.processes, r.nodes) for r in osp.runs} == {(8, 9, 9)}


def test_every_grid_run_passes_repro_trains_checks():
    """What the launchers run is accepted by `repro train` (flags, per-scheduler options, world size)."""
    from repro.cluster.jobs import train_argv
    from repro.train import config_from_argv

    for paper in GRID_PAPERS:
        for run in load_grid(paper).runs:
            cfg, _ = config_from_argv(train_argv(run, "/tmp/runs")[2:])
            cfg.check_world(run.processes)
            assert (cfg.model, cfg.scheduler, cfg.batch_size, cfg.run_id) == (run["model"], run["scheduler"],
                                                                               run["batch_size"], run.run_id)


# ------------------------------------------------------------------------------------------------- run ids

def test_run_id_derives_from_the_whole_configuration():
    cfg = {"model": "resnet50", "scheduler": "mgwfbp", "world_size": 16, "wire_dtype": "float16",
           "batch_size": 32, "steps": 50}
    rid = run_id(cfg)
    assert rid == run_id(dict(reversed(list(cfg.items()))))  # key order does not matter
    canonical = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
    assert rid == "resnet50_mgwfbp_p16_float16_b32-" + hashlib.sha256(canonical.encode()).hexdigest()[:10]
    assert check_run_id(rid) == rid
    changed = {run_id({**cfg, k: v}) for k, v in [("steps", 51), ("world_size", 8), ("lr", 0.1),
                                                  ("wire_dtype", "float32")]}
    assert len(changed) == 4 and rid not in changed


def test_the_same_file_gives_the_same_ids():
    assert load_grid("dear").run_ids() == load_grid("dear").run_ids()
    assert _grid().run_ids() == _grid().run_ids()
    assert _grid().run_ids() != _grid(train={"steps": 4}).run_ids()


def test_placement_follows_the_node_size():
    runs = {r["world_size"]: r for r in _grid().runs if r["scheduler"] == "wfbp"}
    assert (runs[2].nodes, runs[2].procs_per_node) == (1, 2)
    assert (runs[4].nodes, runs[4].procs_per_node) == (2, 2)
    ps = _grid(train={"servers": 1}, gpus_per_node=1).runs[0]  # a parameter server's ranks come on top
    assert (ps["world_size"], ps.processes, ps.nodes) == (2, 3, 3)
    assert "world_size" not in ps.train_options() and "nodes" not in ps.train_options()


@pytest.mark.parametrize("change, words", [
    ({"colour": 1}, "unknown key"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"experiments": []}, "experiments"),
    ({"train": {"model": "x"}}, "may not set model"),
    ({"experiments": [{"name": "e", "models": {"m": {}}, "world_sizes": [2], "schedulers": ["wfbp"]}]}, "batch_size"),
    ({"experiments": [{"name": "e", "models": {"m": {"batch_size": 8}}, "world_sizes": [3],
                       "schedulers": ["wfbp"]}]}, "whole nodes"),
    ({"experiments": [{"name": "e", "models": {"m": {"batch_size": 8}}, "world_sizes": [2],
                       "schedulers": ["wfbp"], "precisions": ["float8"]}]}, "float8"),
    ({"experiments": [{"name": "e", "models": {"m": {"batch_size": 8}}, "world_sizes": [2, 2],
                       "schedulers": ["wfbp"]}]}, "twice"),
])
def test_a_bad_grid_is_refused_in_one_line(change, words):
    data = {"paper": "t", "notebook": "nb", "gpus_per_node": 2,
            "experiments": [{"name": "e", "models": {"m": {"batch_size": 8}}, "world_sizes": [2],
                             "schedulers": ["wfbp"]}]}
    assert words in _one_line_error({**data, **change})


def test_an_unknown_paper_is_refused_in_one_line():
    with pytest.raises(GridError, match="no grid 'nope'.*mgwfbp"):
        load_grid("nope")


# ------------------------------------------------------------------------------------- skip and redo

def _finish(runs_dir: Path, rid: str) -> None:
    (runs_dir / rid).mkdir(parents=True)
    (runs_dir / rid / "run.json").write_text(json.dumps({"run_id": rid, "config": {}, "summary": {}}))


def test_status_done_failed_pending(tmp_path):
    from repro.cluster.jobs import pending_runs

    grid = _grid()
    a, b, c, d = grid.run_ids()
    _finish(tmp_path, a)
    mark_failed(tmp_path, b, "exit status 1")
    (tmp_path / c).mkdir()  # a folder without run.json is not a finished run
    assert [run_status(tmp_path, r) for r in (a, b, c, d)] == ["done", "failed", "pending", "pending"]
    assert count_status(status_table(grid, tmp_path)) == {"done": 1, "failed": 1, "pending": 2}
    assert [r.run_id for r in pending_runs(grid.runs, tmp_path)] == [b, c, d]  # finished skipped, failed redone
    _finish(tmp_path, b)  # the redo finished: done wins over an old failure marker
    assert run_status(tmp_path, b) == "done"
    clear_failed(tmp_path, b)
    assert not (tmp_path / ".grid" / f"{b}.failed").exists()
    from repro.runs import list_runs

    assert sorted(r.run_id for r in list_runs(tmp_path)) == sorted([a, b])  # markers are not runs


def test_run_config_is_a_plain_value():
    run = _grid().runs[0]
    assert isinstance(run, RunConfig) and run["model"] == "tiny_resnet" and run.run_id == run_id(run.config)


# ------------------------------------------------------------------------------- python -m repro.grid_cli

def test_grid_cli_show_status_and_print(tmp_path, capsys):
    from repro.cli import main

    assert main(["grid", "show", "omgs", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in shown] == load_grid("omgs").run_ids()
    runs = tmp_path / "runs"
    first = load_grid("omgs").run_ids()[0]
    (runs / first).mkdir(parents=True)
    (runs / first / "run.json").write_text("{}")
    assert main(["grid", "status", "omgs", "--runs-dir", str(runs), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"done": 1, "failed": 0, "pending": 15}
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "print"]) == 0
    assert "15 job scripts" in capsys.readouterr().out
    assert len((tmp_path / "jobs" / "commands.txt").read_text().splitlines()) == 15
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "local"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs 16 nodes" in err
    assert main(["grid", "status", "nope", "--runs-dir", str(runs)]) == 2
    assert "repro: error: no grid 'nope'" in capsys.readouterr().err
    from repro.grid_cli import main as grid_main  # the same without repro's other commands

    assert grid_main(["grid", "status", "omgs", "--runs-dir", str(runs), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["done"] == 1
