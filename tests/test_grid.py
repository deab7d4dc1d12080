"""The papers' grids as data (repro.grids.grid): shipped files that agree with the paper notes and with
`repro train`, run ids derived from the configuration, and the done / failed / pending status that makes a
relaunch skip finished runs and redo failed ones."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from repro.grids.grid import (
    GRID_PAPERS, GridError, RunConfig, clear_failed, count_status, grid_path, grids_dir, load_grid,
    mark_failed, parse_grid, run_id, run_status, status_table)
from repro.results.runs import check_run_id


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
    assert {(r["model"], r["batch_size"]) for r in mg.select("throughput")} == {("resnet152", 128), ("densenet161", 64),
                                                                ("densenet201", 64), ("inception_v4", 128)}
    assert mg.gpus_per_node == 4 and max(mg.world_sizes()) == 16 and max(r.nodes for r in mg.runs) == 4
    assert {r["wire_dtype"] for r in mg.runs} == {"float32", "float16"}
    # the journal's FP16 is half-precision training: float16 compute (--amp fp16) and float16 on the wire
    assert {(r["wire_dtype"], r.config.get("amp", "off")) for r in mg.runs} == {("float32", "off"), ("float16", "fp16")}
    assert {"wfbp", "syncea", "mgwfbp"} <= {r["scheduler"] for r in mg.runs}
    dear = load_grid("dear")  # 64 GPUs = 16 hosts x 4; no convergence figure (FIGURES.md)
    assert not dear.select("convergence")
    assert {r.processes for r in dear.runs} == {64} and {r.nodes for r in dear.runs} == {16}
    assert {(r["model"], r["batch_size"]) for r in dear.runs} == {("resnet50", 64), ("densenet201", 32),
                                                                  ("inception_v4", 64), ("bert_base", 64),
                                                                  ("bert_large", 32)}
    omgs = load_grid("omgs")  # 16 nodes x 1 GPU; density 0.001 (CNNs), 0.004 (LSTM)
    assert {r.nodes for r in omgs.runs} == {16} and omgs.gpus_per_node == 1
    assert {r["model"]: r["density"] for r in omgs.select("throughput")} == {"vgg16_cifar": 0.001, "resnet50": 0.001,
                                                            "inception_v4": 0.001, "lstm_ptb": 0.004}
    osp = load_grid("osp")  # the testbed's 8 workers and 1 server, co-located on the first (NCCL can run it)
    assert {(r["world_size"], r.processes, r.nodes, r["servers"]) for r in osp.runs} == {(8, 8, 8, 1)}
    dedicated = parse_grid({**yaml.safe_load(grid_path("osp").read_text()),
                            "train": {"steps": 3, "servers": 1}}, "t.yaml")  # the testbed's layout, on gloo
    assert {(r.processes, r.nodes) for r in dedicated.runs} == {(9, 9)}


def test_the_grids_hold_the_papers_convergence_runs():
    """mgwfbp.convergence, omgs.convergence and the OSP accuracy figures have their runs in the grids: a real
    dataset, epochs instead of steps, the schedulers each figure compares."""
    for paper in GRID_PAPERS:
        for r in load_grid(paper).select("convergence"):
            assert r.kind == "convergence" and r["epochs"] >= 1 and "steps" not in r.config
            assert r["dataset"] in ("cifar10", "imagenet", "ptb")
        for r in load_grid(paper).select("throughput"):
            assert "epochs" not in r.config and r.config.get("dataset", "synthetic") == "synthetic"
    mg = load_grid("mgwfbp").select("convergence")  # S-SGD (DDP) vs MG-WFBP, identical updates
    assert sorted(r["scheduler"] for r in mg) == ["ddp", "mgwfbp"]
    assert {(r["model"], r["dataset"], r["world_size"], r["momentum"], r["weight_decay"]) for r in mg} == {
        ("resnet50", "imagenet", 16, 0.9, 0.0001)}
    omgs = load_grid("omgs").select("convergence")  # dense S-SGD, TopK-SGD, OMGS-SGD per paper model and data
    assert {(r["model"], r["dataset"], r["density"], r["batch_size"]) for r in omgs} == {
        ("vgg16_cifar", "cifar10", 0.001, 32), ("resnet50", "imagenet", 0.001, 32), ("lstm_ptb", "ptb", 0.004, 20)}
    assert sorted({r["scheduler"] for r in omgs}) == ["omgs", "topk_single", "wfbp"] and len(omgs) == 9
    osp = load_grid("osp").select("convergence")  # 8 workers, the first of which also serves, per run
    assert {(r["world_size"], r.processes, r["dataset"]) for r in osp} == {(8, 8, "cifar10")}
    osp_runs = {(r["scheduler"], r.config.get("stage1_share"), r.config.get("lgp", True)) for r in osp}
    assert {("osp", s, True) for s in (0.0, 0.25, 0.5, 0.75)} | {("osp", 0.0, False), ("osp", 0.5, False)} \
        | {("ps_bsp", None, True), ("ps_asp", None, True), ("ps_ssp", None, True), ("osp_auto", None, True)} == osp_runs
    assert load_grid("osp").experiments() == ["throughput", "convergence"]


def test_convergence_experiments_parse_and_refuse_what_cannot_run():
    exp = {"name": "conv", "models": {"tiny_resnet": {"batch_size": 8, "lr": 0.1}}, "world_sizes": [2],
           "schedulers": ["wfbp", {"osp": {"stage1_share": 0.0}}, {"osp": {"stage1_share": 0.0, "lgp": False}}],
           "train": {"dataset": "digits", "epochs": 3, "warmup_steps": None}}
    grid = _grid(train={"steps": 3, "warmup_steps": 2}, experiments=[exp])
    assert [r.kind for r in grid.runs] == ["convergence"] * 3
    first = grid.runs[0].config
    assert first["epochs"] == 3 and first["lr"] == 0.1 and "steps" not in first and "warmup_steps" not in first
    assert [r.config.get("lgp") for r in grid.runs] == [None, None, False]  # one scheduler, several options
    assert len(set(grid.run_ids())) == 3 and grid.run_ids("convergence") == grid.run_ids()
    assert grid.run_ids("throughput") == [] and grid.experiments("convergence") == ["conv"]
    base = {"paper": "t", "notebook": "nb", "gpus_per_node": 2}
    one = {"name": "e", "models": {"m": {"batch_size": 8}}, "world_sizes": [2], "schedulers": ["wfbp"]}
    assert "real dataset" in _one_line_error({**base, "experiments": [{**one, "train": {"epochs": 2}}]})
    assert "needs epochs" in _one_line_error({**base, "experiments": [{**one, "kind": "convergence",
                                                                       "train": {"dataset": "digits"}}]})
    assert "drop epochs" in _one_line_error({**base, "experiments": [{**one, "kind": "throughput",
                                                                      "train": {"dataset": "digits", "epochs": 1}}]})
    assert "kind must be" in _one_line_error({**base, "experiments": [{**one, "kind": "speed"}]})
    assert "epochs must be" in _one_line_error({**base, "experiments": [{**one, "train": {"dataset": "digits",
                                                                                          "epochs": 0}}]})
    assert "one-key mapping" in _one_line_error({**base, "experiments": [{**one, "schedulers": [{"a": {}, "b": {}}]}]})


def test_every_grid_run_passes_repro_trains_checks():
    """What the launchers run is accepted by `repro train` (flags, per-scheduler options, world size)."""
    from repro.grids.jobs import train_argv
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
    (runs_dir / rid / "run.json").write_text(json.dumps({"run_id": rid, "config": {}, "summary": {"steps": 3, "iteration_s": 0.1}}))


def test_status_done_failed_pending(tmp_path):
    from repro.grids.jobs import pending_runs

    grid = _grid()
    a, b, c, d = grid.run_ids()
    _finish(tmp_path, a)
    mark_failed(tmp_path, b, "exit status 1")
    (tmp_path / c).mkdir()  # a folder without run.json is not a finished run
    assert [run_status(tmp_path, r) for r in (a, b, c, d)] == ["done", "failed", "pending", "pending"]
    assert count_status(status_table(grid, tmp_path)) == {"done": 1, "damaged": 0, "failed": 1, "pending": 2}
    assert [r.run_id for r in pending_runs(grid.runs, tmp_path)] == [b, c, d]  # finished skipped, failed redone
    _finish(tmp_path, b)  # the redo finished: done wins over an old failure marker
    assert run_status(tmp_path, b) == "done"
    clear_failed(tmp_path, b)
    assert not (tmp_path / ".grid" / f"{b}.failed").exists()
    from repro.results.runs import list_runs

    assert sorted(r.run_id for r in list_runs(tmp_path)) == sorted([a, b])  # markers are not runs


def test_run_config_is_a_plain_value():
    run = _grid().runs[0]
    assert isinstance(run, RunConfig) and run["model"] == "tiny_resnet" and run.run_id == run_id(run.config)


# ------------------------------------------------------------------------------- python -m repro.cli.grid

def test_grid_cli_show_status_and_print(tmp_path, capsys):
    from repro.cli.main import main

    assert main(["grid", "show", "omgs", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in shown] == load_grid("omgs").run_ids()
    runs = tmp_path / "runs"
    first = load_grid("omgs").run_ids()[0]
    (runs / first).mkdir(parents=True)
    (runs / first / "run.json").write_text(json.dumps({"run_id": first, "config": {}, "summary": {"steps": 3, "iteration_s": 0.1}}))
    assert main(["grid", "status", "omgs", "--runs-dir", str(runs), "--format", "json"]) == 0
    n = len(load_grid("omgs").runs)
    assert json.loads(capsys.readouterr().out)["counts"] == {"done": 1, "damaged": 0, "failed": 0, "pending": n - 1}
    assert main(["grid", "show", "omgs", "--kind", "convergence", "--format", "json"]) == 0
    conv = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in conv] == load_grid("omgs").run_ids("convergence") and len(conv) == 9
    assert {(r["kind"], r["dataset"]) for r in conv} == {("convergence", d) for d in ("cifar10", "imagenet", "ptb")}
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "print", "--kind",
                 "convergence"]) == 0
    assert "9 job scripts" in capsys.readouterr().out
    commands = (tmp_path / "jobs" / "commands.txt").read_text().splitlines()
    assert len(commands) == 9 and all("--epochs" in c and "--steps" not in c for c in commands)
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "print"]) == 0
    assert f"{n - 1} job scripts" in capsys.readouterr().out
    assert len((tmp_path / "jobs" / "commands.txt").read_text().splitlines()) == n - 1
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "local"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs 16 nodes" in err
    assert main(["grid", "status", "nope", "--runs-dir", str(runs)]) == 2
    assert "repro: error: no grid 'nope'" in capsys.readouterr().err
    from repro.cli.grid import main as grid_main  # the same without repro's other commands

    assert grid_main(["grid", "status", "omgs", "--runs-dir", str(runs), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["done"] == 1


# ------------------------------------------------------------------------- a damaged run is not finished

@pytest.mark.parametrize("content", ["{broken", "", "[]", '{"run_id": "x"}'])
def test_a_damaged_run_json_is_not_done(tmp_path, content):
    from repro.grids.grid import run_problem
    from repro.grids.jobs import BadRuns, pending_runs
    from repro.results.runs import RunError, list_runs, load_run

    grid = _grid()
    a, b = grid.run_ids()[:2]
    _finish(tmp_path, a)
    (tmp_path / b).mkdir()
    (tmp_path / b / "run.json").write_text(content)
    assert [run_status(tmp_path, r) for r in (a, b)] == ["done", "damaged"]
    why = run_problem(tmp_path, b)
    assert why.startswith(str(tmp_path / b / "run.json")) and "\n" not in why
    assert count_status(status_table(grid, tmp_path))["damaged"] == 1
    with pytest.raises(BadRuns, match="damaged.*--overwrite"):  # neither skipped as done nor silently redone
        pending_runs(grid.runs, tmp_path)
    assert b in [r.run_id for r in pending_runs(grid.runs, tmp_path, overwrite=True)]
    assert a not in [r.run_id for r in pending_runs(grid.runs, tmp_path, overwrite=True)]  # never a finished one
    with pytest.raises(RunError, match="run.json"):
        load_run(tmp_path / b)
    with pytest.raises(RunError, match="run.json"):  # a reader of every run does not pass it off as finished
        list_runs(tmp_path)


def test_a_record_of_another_run_or_without_a_summary_is_damaged(tmp_path):
    grid = _grid()
    a, b = grid.run_ids()[:2]
    (tmp_path / a).mkdir()
    (tmp_path / a / "run.json").write_text(json.dumps({"run_id": b, "config": {}, "summary": {"steps": 1,
                                                                                              "iteration_s": 1.0}}))
    (tmp_path / b).mkdir()
    (tmp_path / b / "run.json").write_text(json.dumps({"run_id": b, "config": {}, "summary": {}}))
    assert [run_status(tmp_path, r) for r in (a, b)] == ["damaged", "damaged"]


def test_grid_cli_reports_and_refuses_a_damaged_run(tmp_path, capsys):
    from repro.cli.main import main

    runs, jobs = tmp_path / "gruns", tmp_path / "jobs"
    first = load_grid("omgs").run_ids()[0]
    (runs / first).mkdir(parents=True)
    (runs / first / "run.json").write_text("{broken")
    assert main(["grid", "status", "omgs", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^{first} +damaged ", out, re.M) and f"damaged: {runs / first / 'run.json'} is not JSON" in out
    assert "0 done, 1 damaged" in out
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "print",
                 "--jobs-dir", str(jobs)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("repro: error: 1 run(s)") and "--overwrite" in err
    assert not jobs.exists()  # nothing written
    n = len(load_grid("omgs").runs)
    assert main(["grid", "launch", "omgs", "--runs-dir", str(runs), "--launcher", "print",
                 "--jobs-dir", str(jobs), "--overwrite"]) == 0
    assert f"{n} job scripts" in capsys.readouterr().out and (jobs / f"{first}.sh").exists()


def test_a_job_script_runs_a_damaged_run_and_skips_a_finished_one(tmp_path):
    import subprocess
    import sys

    from repro.grids.jobs import write_job_scripts

    grid = _grid()
    a, b = grid.runs[:2]
    runs = tmp_path / "runs"
    _finish(runs, a.run_id)
    (runs / b.run_id).mkdir()
    (runs / b.run_id / "run.json").write_text("")
    write_job_scripts([a, b], runs, tmp_path / "jobs", python=sys.executable)
    for run, skipped in ((a, True), (b, False)):
        script = (tmp_path / "jobs" / f"{run.run_id}.sh").read_text()
        head = script[:script.index("if finished; then")]  # up to the check: RUNS_DIR and finished()
        probe = head + 'if finished; then echo SKIP; else echo RUN; fi\n'
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, env=env).stdout
        assert out.strip() == ("SKIP" if skipped else "RUN"), (run.run_id, out)


# ----------------------------------------------------------------- --runs-dir and --jobs-dir are folders

@pytest.mark.parametrize("flag", ["--jobs-dir", "--runs-dir"])
@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_grid_launch_refuses_a_file_as_a_folder(tmp_path, capsys, flag, kind):
    import os

    from repro.cli.main import main

    bad = tmp_path / "x"
    bad.write_text("keep") if kind == "file" else os.mkfifo(bad)
    args = {"--runs-dir": str(tmp_path / "runs"), "--jobs-dir": str(tmp_path / "jobs"), flag: str(bad)}
    assert main(["grid", "launch", "omgs", "--launcher", "print", *[x for kv in args.items() for x in kv]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"repro: error: {flag} {bad} is")
    assert "not a folder" in captured.err
    assert not (tmp_path / "jobs").exists() and not (tmp_path / "runs").exists()
    assert kind == "fifo" or bad.read_text() == "keep"


def test_grid_status_refuses_a_file_as_runs_dir(tmp_path, capsys):
    from repro.cli.main import main

    (tmp_path / "f").write_text("")
    assert main(["grid", "status", "omgs", "--runs-dir", str(tmp_path / "f")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("repro: error: --runs-dir") and "not a folder" in captured.err
