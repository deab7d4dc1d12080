"""`repro grid check` (repro.grids.check): every run of a grid through the checks its ranks make at
start-up, none started, one line per refused run, exit status 2; the launchers make the same check first
and launch nothing when a run is bad. And the stand-ins (repro.grids.grid.local_stand_in): every
distinct configuration of every shipped grid trains a few steps on this machine."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from repro.grids.grid import (
    GRID_PAPERS, GridError, distinct_stand_ins, load_grid, local_stand_in, parse_grid, run_status)
from repro.grids.check import BadRuns, check_runs, run_refusal, smoke, stand_in_line
from repro.grids.jobs import (
    GridStop, launch_local_grid, prepare_paper_runs, refuse_bad_runs, submit_slurm, write_job_scripts)

# One good run (wfbp) and three that their ranks would refuse: an unknown scheduler, an option the
# scheduler does not take (staleness is ps_ssp's), a wire dtype the scheduler cannot cast to (ddp).
BAD_GRID = {
    "paper": "t", "notebook": "nb", "gpus_per_node": 2, "train": {"steps": 3},
    "experiments": [
        {"name": "names", "models": {"tiny_resnet": {"batch_size": 8}}, "world_sizes": [2],
         "schedulers": ["wfbp", "nosuch"]},
        {"name": "options", "models": {"tiny_resnet": {"batch_size": 8}}, "world_sizes": [4],
         "schedulers": {"mgwfbp": {"staleness": 2}}},
        {"name": "precision", "models": {"tiny_resnet": {"batch_size": 8}}, "world_sizes": [2],
         "schedulers": ["ddp"], "precisions": ["float16"]},
    ]}
REFUSED = {("names", "nosuch"): "unknown scheduler 'nosuch'",
           ("options", "mgwfbp"): "--staleness does not apply to --scheduler mgwfbp",
           ("precision", "ddp"): "wire_dtype float16 does not apply to scheduler 'ddp'"}


def _bad_grid_file(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(BAD_GRID))
    return path


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ repro grid check

def test_check_refuses_each_bad_run_in_one_line_with_exit_status_2(tmp_path, capsys):
    from repro.cli.main import main

    path = _bad_grid_file(tmp_path)
    assert main(["grid", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = _lines(out)
    assert len(lines) == len(REFUSED), out
    for line, ((experiment, scheduler), words) in zip(lines, REFUSED.items()):
        workers = 4 if experiment == "options" else 2
        assert line.startswith(f"refused: t/{experiment}: {scheduler} on tiny_resnet, {workers} workers"), line
        assert words in line, line
    assert _lines(err) == ["repro: error: t grid: 3 of 4 runs would be refused at start-up (backend nccl, device cuda)"]
    assert main(["grid", "check", str(path), "--experiment", "names", "--format", "json"]) == 2
    shown = json.loads(capsys.readouterr().out)
    assert shown["runs"] == 2 and len(shown["refused"]) == 1
    assert "_nosuch_" in shown["refused"][0]["run_id"] and "unknown scheduler" in shown["refused"][0]["reason"]


def test_a_grid_whose_runs_all_pass_exits_0_with_a_summary(tmp_path, capsys):
    from repro.cli.main import main

    path = tmp_path / "good.yaml"
    good = {**BAD_GRID, "experiments": [{**BAD_GRID["experiments"][0], "schedulers": ["wfbp", "omgs"]}]}
    path.write_text(yaml.safe_dump(good))
    assert main(["grid", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert _lines(out) == ["t grid: all 2 runs pass the ranks' start-up checks (backend nccl, device cuda)"]
    assert err == ""


def test_launch_writes_no_job_script_when_a_run_is_bad(tmp_path, capsys):
    from repro.cli.main import main

    path = _bad_grid_file(tmp_path)
    jobs, runs = tmp_path / "jobs", tmp_path / "runs"
    jobs.mkdir()
    assert main(["grid", "launch", str(path), "--launcher", "print", "--runs-dir", str(runs), "--jobs-dir",
                 str(jobs)]) == 2
    out, err = capsys.readouterr()
    assert list(jobs.iterdir()) == [] and not runs.exists()
    lines = _lines(err)
    assert len(lines) == len(REFUSED) + 1 and all(line.startswith("refused: t/") for line in lines[:-1])
    assert lines[-1].startswith("repro: error: launcher='print': 3 of 4 runs would be refused at start-up")
    assert "nothing launched" in lines[-1] and "unknown scheduler 'nosuch'" in lines[-1]
    assert "job scripts" not in out


def test_every_launcher_checks_first(tmp_path, monkeypatch):
    bad = parse_grid(BAD_GRID, "bad.yaml").runs
    jobs = tmp_path / "jobs"
    with pytest.raises(BadRuns) as e:
        write_job_scripts(bad, tmp_path / "runs", jobs)
    assert "\n" not in str(e.value) and len(e.value.lines) == 3 and isinstance(e.value, GridStop)
    assert not jobs.exists()
    with pytest.raises(BadRuns):  # before its GPU count (none here)
        launch_local_grid(bad, tmp_path / "runs", tmp_path / "logs", gpus=8)
    import builtins

    real_import = builtins.__import__

    def no_submitit(name, *args, **kwargs):
        if name == "submitit":
            raise AssertionError("submit_slurm reached submitit with a bad run")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_submitit)
    with pytest.raises(BadRuns):
        submit_slurm(bad, tmp_path / "runs", jobs)
    assert not jobs.exists() and not (tmp_path / "logs").exists()


def test_the_shipped_grids_pass_on_the_launchers_backend(tmp_path):
    """All four grids pass as the launchers run them (nccl, cuda); mgwfbp, omgs and dear used to lose 17,
    18 and 30 runs to --wire-dtype float32, and osp all 30 to its dedicated server rank, which NCCL cannot
    serve (a thread per worker, point to point): its server is now co-located on the first worker."""
    for paper in GRID_PAPERS:
        assert check_runs(load_grid(paper).runs) == [], paper
    assert all(r["server_placement"] == "colocated" and r.processes == r["world_size"] == 8
               for r in load_grid("osp").runs)


def test_dedicated_servers_on_nccl_and_cuda_tensors_over_gloo_are_refused_before_any_job(tmp_path):
    """The paper's layout (a dedicated server rank beside 8 workers) on nccl, and the families whose
    executors cannot hand CUDA tensors to gloo (the parameter servers' send/recv, DeAR's CPU ring): one
    line per run, nothing written."""
    dedicated = {"paper": "osp", "notebook": "nb", "gpus_per_node": 1, "train": {"steps": 3, "servers": 1},
                 "experiments": [{"name": "e", "models": {"resnet50": {"batch_size": 8}}, "world_sizes": [8],
                                  "schedulers": ["ps_bsp", "osp"]}]}
    runs = parse_grid(dedicated, "t.yaml").runs
    assert [r.processes for r in runs] == [9, 9]
    bad = check_runs(runs)
    assert len(bad) == 2 and all("dedicated server rank" in why and "--server-placement colocated" in why
                                 for _, why in bad)
    assert check_runs(runs, backend="gloo", device="cpu") == []
    on_gpus_over_gloo = check_runs(runs, backend="gloo", device="cuda")
    assert len(on_gpus_over_gloo) == 2 and all("cannot train CUDA tensors over gloo" in why and "send/recv" in why
                                               for _, why in on_gpus_over_gloo)
    dear = [r for r in load_grid("dear").runs if r["scheduler"].startswith("dear")]
    assert dear and all("gloo as a ring of CPU tensors" in why
                        for _, why in check_runs(dear, backend="gloo", device="cuda"))
    allreduce = [r for r in load_grid("mgwfbp").runs]
    assert check_runs(allreduce, backend="gloo", device="cuda") == []  # gloo takes CUDA tensors for all-reduce
    with pytest.raises(GridStop, match="2 of 2 runs would be refused") as e:
        refuse_bad_runs(runs)
    assert "\n" not in str(e.value)


def test_run_refusal_sees_world_size_and_device():
    grid = parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": 1, "train": {"steps": 3},
                       "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 8}},
                                        "world_sizes": [1], "schedulers": ["mgwfbp", {"ps_bsp": {"servers": 1}}]}]},
                      "t.yaml")
    mg, ps = grid.runs
    assert "needs at least 2 ranks" in run_refusal(mg, backend="gloo", device="cpu")
    assert "at least 2 workers besides" in run_refusal(ps, backend="gloo", device="cpu")
    engine = parse_grid({**BAD_GRID, "experiments": [{**BAD_GRID["experiments"][0], "schedulers":
                                                      {"wfbp": {"engine": "reducer"}}}]}, "t.yaml").runs[0]
    assert "engine 'reducer' runs on the CPU only" in run_refusal(engine)
    assert run_refusal(engine, backend="gloo", device="cpu") is None


# ------------------------------------------------------------------------------------------------ stand-ins

def test_a_stand_in_keeps_the_configuration_and_shrinks_the_rest():
    mg = load_grid("mgwfbp")
    shape = {(r.nodes, r.procs_per_node): local_stand_in(r).processes for r in mg.runs}
    assert shape == {(1, 1): 1, (1, 4): 3, (2, 4): 2, (4, 4): 3}  # one rank per node (one-node runs: per GPU)
    run = next(r for r in mg.runs if r["scheduler"] == "mgwfbp" and r["wire_dtype"] == "float16")
    s = local_stand_in(run)
    assert (s["model"], s["scheduler"], s["wire_dtype"], s["batch_size"], s["steps"]) == (
        "tiny_resnet", "mgwfbp", "float16", 4, 2)
    assert (s["momentum"], s["weight_decay"], s["paper"], s.experiment) == (0.9, 0.0001, "mgwfbp", "speedup_fp16")
    assert s["amp"] == "fp16"  # the journal's FP16 runs: float16 compute too, not only on the wire
    assert (s.nodes, s.processes, s["world_size"]) == (1, s.processes, s.processes) and s.run_id != run.run_id
    conv = next(r for r in mg.runs if r.kind == "convergence")
    s = local_stand_in(conv)
    assert s.kind == "throughput" and "dataset" not in s.config and s["compute_steps"] == 0 and s["lr"] == 0.2
    bert = next(r for r in load_grid("dear").runs if r["model"] == "bert_base")
    s = local_stand_in(bert)
    assert s["model"] == "tiny_bert" and "seq_len" not in s.config and s.processes == 3
    lstm = next(r for r in load_grid("omgs").runs if r["model"] == "lstm_ptb" and r["scheduler"] == "omgs")
    assert (local_stand_in(lstm)["model"], local_stand_in(lstm)["density"]) == ("tiny_lstm", 0.004)
    osp = next(r for r in load_grid("osp").runs if r.config.get("lgp") is False)
    s = local_stand_in(osp)  # 8 workers, one co-located server, on 8 nodes -> 3 workers
    assert (s.processes, s["world_size"], s["servers"], s["lgp"], s["stage1_share"]) == (3, 3, 1, False, 0.0)
    two_servers = parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": 1, "train": {"servers": 2},
                              "experiments": [{"name": "e", "models": {"resnet50": {"batch_size": 8}},
                                               "world_sizes": [8], "schedulers": ["ps_bsp"]}]}, "t.yaml").runs[0]
    with pytest.raises(GridError, match="needs 4 local ranks"):
        local_stand_in(two_servers)
    assert local_stand_in(two_servers, max_ranks=4).processes == 4


def test_distinct_stand_ins_cover_every_run_once():
    counts = {}
    for paper in GRID_PAPERS:
        runs = load_grid(paper).runs
        groups = distinct_stand_ins(runs)
        covered = [r.run_id for _, members in groups for r in members]
        assert sorted(covered) == sorted(r.run_id for r in runs), paper
        assert all(run_refusal(s, backend="gloo", device="cpu") is None for s, _ in groups), paper
        counts[paper] = len(groups)
    # mgwfbp: local + 4 planners x 2 precisions x {2, 3} ranks + ddp x {2, 3}; omgs: 4 x {vision, lstm}
    # (other densities); dear: 9 x {vision, bert}; osp: 5 x {vision, bert} + 5 more OSP options
    assert counts == {"mgwfbp": 19, "omgs": 8, "dear": 18, "osp": 15}


@pytest.mark.distributed
@pytest.mark.slow
def test_every_distinct_configuration_of_every_grid_trains_here(tmp_path):
    """The 60 distinct configurations of the four shipped grids, each as its stand-in (gloo, CPU, up to 3
    local ranks, 2 steps) through the launchers' own `repro train` arguments: each trains and writes its run
    folder. Before the wire-dtype fix 36 of them failed at start-up."""
    groups = [g for paper in GRID_PAPERS for g in distinct_stand_ins(load_grid(paper).runs)]
    results = smoke(groups, tmp_path / "runs", timeout_s=900)
    failed = [stand_in_line(r) for r in results if r.error is not None]
    assert not failed, "\n".join(failed)
    for r in results:
        assert run_status(tmp_path / "runs", r.stand_in.run_id) == "done", stand_in_line(r)
        record = json.loads((tmp_path / "runs" / r.stand_in.run_id / "run.json").read_text())
        assert record["summary"]["steps"] == 2 and record["config"]["scheduler"] == r.stand_in["scheduler"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_two_node_grid_run_of_a_scheduler_that_cannot_cast_finishes(tmp_path):
    """The report's emulated two-node runs (bytescheduler exited 1 on --wire-dtype float32): two torchrun
    agents, c10d on 127.0.0.1, the command the launchers build for a float32 grid run."""
    import os

    from repro.grids.jobs import emulate_nodes

    run = parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": 1,
                      "train": {"steps": 2, "warmup_steps": 1, "compute_steps": 0, "fit_repeats": 1},
                      "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 4}}, "world_sizes": [2],
                                       "schedulers": ["bytescheduler"], "precisions": ["float32"]}]}, "t.yaml").runs[0]
    assert run.nodes == 2
    rc = emulate_nodes(run, tmp_path / "runs", tmp_path / "logs", port=_free_port(), timeout_s=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    logs = "".join(p.read_text()[-1500:] for p in sorted((tmp_path / "logs").glob("*.log")))
    assert rc == 0, logs
    assert run_status(tmp_path / "runs", run.run_id) == "done"


@pytest.mark.distributed
@pytest.mark.slow
def test_grid_check_smoke_from_the_command_line(tmp_path, capsys):
    from repro.cli.main import main

    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"paper": "t", "notebook": "nb", "gpus_per_node": 1, "train": {"steps": 50},
                                    "experiments": [{"name": "e", "models": {"resnet50": {"batch_size": 32}},
                                                     "world_sizes": [4, 8], "schedulers": ["omgs"]}]}))
    assert main(["grid", "check", str(path), "--smoke", "--smoke-dir", str(tmp_path / "smoke")]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[0] == "t grid: all 2 runs pass the ranks' start-up checks (backend nccl, device cuda)"
    assert lines[-1] == "t grid: 1 of 1 stand-ins trained"  # P=4 and P=8 on 1-GPU nodes: the same 3 ranks
    assert lines[-2].startswith("ok") and "omgs on tiny_resnet, 3 local rank(s)" in lines[-2]
    assert "stands for 2 run(s)" in lines[-2]
    assert len(list((tmp_path / "smoke").iterdir())) == 1


@pytest.mark.distributed
@pytest.mark.slow
def test_a_failing_stand_in_is_one_line_and_the_others_still_train(tmp_path):
    grid = parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": 2, "train": {"steps": 50},
                       "experiments": [{"name": "e", "models": {"resnet50": {"batch_size": 32}}, "world_sizes": [2],
                                        "schedulers": ["wfbp", "nosuch", "mgwfbp"]}]}, "t.yaml")
    groups = distinct_stand_ins(grid.runs)  # the unknown scheduler is not checked here: it fails in its ranks
    results = smoke(groups, tmp_path / "runs", timeout_s=300)
    assert [r.error is None for r in results] == [True, False, True]
    line = stand_in_line(results[1])
    assert "\n" not in line and line.startswith("FAILED  t/e: nosuch on tiny_resnet, 2 local rank(s)")
    assert "unknown scheduler 'nosuch'" in line
    assert [run_status(tmp_path / "runs", r.stand_in.run_id) for r in results] == ["done", "pending", "done"]
