"""Launching a paper's grid (repro.grids.jobs): job scripts for any scheduler, this node's GPUs, SLURM
through submitit, the notebooks' gate at scale="paper" — and the multi-node path run here as two torchrun
"nodes" that meet by c10d rendezvous on 127.0.0.1 and write the same run folder as one node."""

from __future__ import annotations

import json
import re
import shlex
import socket
import sys
from pathlib import Path

import pytest

from repro.grids.grid import load_grid, mark_failed, parse_grid, run_status
from repro.grids.jobs import (
    GridStop, emulate_nodes, launch_local_grid, prepare_paper_runs, submit_slurm, torchrun_argv,
    write_job_scripts)

ROOT = Path(__file__).resolve().parents[1]


def _tiny_grid(gpus_per_node: int, world_sizes=(2,), schedulers=("mgwfbp",)):
    """A tiny CPU grid (gloo): few steps, one warm-up, no compute-only steps."""
    return parse_grid({"paper": "tiny", "notebook": "nb", "gpus_per_node": gpus_per_node,
                       "train": {"steps": 2, "warmup_steps": 1, "compute_steps": 1, "fit_repeats": 1},
                       "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 8}},
                                        "world_sizes": list(world_sizes), "schedulers": list(schedulers)}]}, "tiny")


def _finish(runs_dir: Path, rid: str, model: str = "resnet152") -> None:
    (runs_dir / rid).mkdir(parents=True)
    (runs_dir / rid / "run.json").write_text(json.dumps({"run_id": rid, "config": {"model": model},
                                                         "summary": {"steps": 3, "iteration_s": 0.1}}))


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------- command lines

def test_one_node_is_standalone_and_several_meet_by_c10d():
    grid = _tiny_grid(2, world_sizes=(2, 4))
    one, two = (r for r in grid.runs)
    cmd = torchrun_argv(one, "/shared/runs", python="python")
    assert cmd[:6] == ["python", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    assert "--rdzv-backend" not in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"
    cmd = torchrun_argv(two, "/shared/runs", head="node001", rdzv_id="4242", python="python")
    flags = dict(zip(cmd[3:15:2], cmd[4:16:2]))
    assert flags["--nnodes"] == "2" and flags["--rdzv-backend"] == "c10d"
    assert flags["--rdzv-endpoint"] == "node001:29500" and flags["--rdzv-id"] == "4242"
    assert "--node-rank" not in cmd  # c10d assigns node ranks: the same command on every node
    train = cmd[cmd.index("repro.train") + 1:]
    assert train[train.index("--run-id") + 1] == two.run_id
    assert train[train.index("--results-dir") + 1] == "/shared/runs"
    assert (train[train.index("--backend") + 1], train[train.index("--device") + 1]) == ("nccl", "cuda")


# ------------------------------------------------------------------------------------------ launcher=print

def test_print_writes_one_command_and_one_script_per_unfinished_run(tmp_path):
    grid = load_grid("mgwfbp")
    runs_dir, jobs = tmp_path / "runs", tmp_path / "jobs"
    _finish(runs_dir, grid.runs[0].run_id)
    with pytest.raises(GridStop) as e:
        prepare_paper_runs("mgwfbp", scale="paper", read_only=False, launcher="print", runs_dir=runs_dir,
                           jobs_dir=jobs)
    assert str(jobs) in _one_line(e) and f"{len(grid.runs) - 1} job scripts" in str(e.value)
    lines = (jobs / "commands.txt").read_text().splitlines()
    assert len(lines) == len(grid.runs) - 1  # the finished run is skipped
    todo = grid.runs[1:]
    for line, run in zip(lines, todo):
        argv = shlex.split(line)
        assert argv[argv.index("--run-id") + 1] == run.run_id
        length = ("--epochs", "epochs") if run.kind == "convergence" else ("--steps", "steps")
        for flag, key in [("--model", "model"), ("--scheduler", "scheduler"), ("--batch-size", "batch_size"),
                          length, ("--warmup-steps", "warmup_steps")]:
            assert argv[argv.index(flag) + 1] == str(run[key]), (run.run_id, flag)
        if run["wire_dtype"] == "float32":  # the models' own dtype: no flag, which every scheduler takes
            assert "--wire-dtype" not in argv, run.run_id
        else:
            assert argv[argv.index("--wire-dtype") + 1] == run["wire_dtype"], run.run_id
        if run.kind == "convergence":  # a real dataset, epochs instead of steps
            assert "--steps" not in argv and argv[argv.index("--dataset") + 1] == run["dataset"]
        assert argv[argv.index("--nnodes") + 1] == str(run.nodes)
        script = (jobs / f"{run.run_id}.sh").read_text()
        assert line in script and f'RUNS_DIR={runs_dir.resolve()}' in script
        assert "if finished; then" in script and "run_status" in script  # a finished run is skipped on the node
        assert ("REPRO_HEAD:?" in script) == (run.nodes > 1)
    assert not (jobs / f"{grid.runs[0].run_id}.sh").exists()
    assert len(json.loads((jobs / "runs.json").read_text())) == len(todo)


def test_print_scripts_expand_the_head_on_each_node(tmp_path):
    """The multi-node line leaves $REPRO_HEAD / $REPRO_RDZV_ID to the node's shell (not quoted away)."""
    run = _tiny_grid(1).runs[0]  # 2 nodes x 1
    write_job_scripts([run], tmp_path / "runs", tmp_path / "jobs", python="python")
    line = (tmp_path / "jobs" / "commands.txt").read_text().strip()
    assert '--rdzv-endpoint "${REPRO_HEAD}:29500"' in line
    assert f'--rdzv-id "${{REPRO_RDZV_ID:-{run.run_id}}}"' in line


# ------------------------------------------------------------------------------------------ launcher=local

def test_local_refuses_in_one_line_without_enough_gpus(tmp_path):
    grid = load_grid("mgwfbp")
    single = [r for r in grid.runs if r.nodes == 1]
    with pytest.raises(GridStop) as e:
        launch_local_grid(single, tmp_path / "runs", tmp_path / "logs")  # this machine: no GPU
    assert "launcher='local' needs" in _one_line(e) and "this node has 0" in str(e.value)
    with pytest.raises(GridStop) as e:
        launch_local_grid(grid.runs, tmp_path / "runs", tmp_path / "logs", gpus=8)
    assert "runs on this node only" in _one_line(e) and "needs 2 nodes x 4 GPUs" in str(e.value)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "logs").exists()  # nothing started


def test_notebook_gate_local_refuses_here(tmp_path):
    with pytest.raises(GridStop) as e:
        prepare_paper_runs("dear", scale="paper", read_only=False, launcher="local", runs_dir=tmp_path / "runs")
    assert "needs 16 nodes x 4 GPUs" in _one_line(e)  # DeAR's 64 GPUs


# ------------------------------------------------------------------------------------------ launcher=slurm

def test_slurm_without_submitit_refuses_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    with pytest.raises(GridStop) as e:
        submit_slurm(load_grid("omgs").runs, tmp_path / "runs", tmp_path / "jobs")
    assert "pip install submitit" in _one_line(e)
    with pytest.raises(GridStop, match="pip install submitit"):
        prepare_paper_runs("omgs", scale="paper", read_only=False, launcher="slurm", runs_dir=tmp_path / "runs")
    assert not (tmp_path / "jobs").exists()


@pytest.mark.distributed
@pytest.mark.slow
def test_slurm_path_through_submitits_local_executor(tmp_path):
    """submitit's LocalExecutor runs the same job function a SLURM array task runs (one task per node,
    torchrun inside); the run finishes and a second submission skips it."""
    submitit = pytest.importorskip("submitit")
    run = _tiny_grid(2, schedulers=("wfbp",)).runs[0]  # 1 node x 2 ranks, gloo
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    jobs = submit_slurm([run], tmp_path / "runs", tmp_path / "jobs", executor=executor, backend="gloo",
                        device="cpu", port=_free_port(), timeout_min=10)
    from repro.grids.jobs import wait_jobs

    logs = lambda: "".join(p.read_text()[-1500:] for p in sorted((tmp_path / "jobs" / "logs").glob("*.log")))
    assert wait_jobs(jobs, poll_s=0.5, quiet=True) == (1, 0), logs()
    assert run_status(tmp_path / "runs", run.run_id) == "done"
    assert submit_slurm([run], tmp_path / "runs", tmp_path / "jobs", executor=executor, backend="gloo",
                        device="cpu") == []


# ------------------------------------------------------------------------------------- the notebooks' gate

def test_gate_tiny_scale_changes_nothing_and_refuses_a_launcher(tmp_path):
    assert prepare_paper_runs("mgwfbp", scale="tiny", read_only=False, launcher="", runs_dir=tmp_path) is False
    assert prepare_paper_runs("mgwfbp", scale="tiny", read_only=True, launcher="", runs_dir=tmp_path) is True
    with pytest.raises(GridStop, match="use it with scale='paper'"):
        prepare_paper_runs("mgwfbp", scale="tiny", read_only=False, launcher="print", runs_dir=tmp_path)
    with pytest.raises(GridStop, match="not one of"):
        prepare_paper_runs("mgwfbp", scale="tiny", read_only=False, launcher="pbs", runs_dir=tmp_path)


def test_gate_paper_scale_never_trains_tiny_models(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(GridStop) as e:  # the old behaviour trained the tiny CPU models here
        prepare_paper_runs("mgwfbp", scale="paper", read_only=False, launcher="", runs_dir=runs)
    assert "set launcher" in _one_line(e) and "read_only=True" in str(e.value)
    with pytest.raises(GridStop) as e:  # nothing finished to read
        prepare_paper_runs("mgwfbp", scale="paper", read_only=True, launcher="", runs_dir=runs)
    assert "none of the" in _one_line(e)
    grid = load_grid("mgwfbp")
    _finish(runs, grid.runs[0].run_id)
    assert prepare_paper_runs("mgwfbp", scale="paper", read_only=True, launcher="", runs_dir=runs) is True
    _finish(runs, "tiny_resnet_mgwfbp_p2_1", model="tiny_resnet")  # a tiny run beside it
    with pytest.raises(GridStop) as e:
        prepare_paper_runs("mgwfbp", scale="paper", read_only=True, launcher="", runs_dir=runs)
    assert "tiny_resnet" in _one_line(e) and "not drawn under a paper label" in str(e.value)
    with pytest.raises(GridStop, match="launches nothing"):
        prepare_paper_runs("mgwfbp", scale="paper", read_only=True, launcher="print", runs_dir=runs)


def test_gate_without_a_grid_reads_or_refuses(tmp_path):
    with pytest.raises(GridStop) as e:
        prepare_paper_runs(None, scale="paper", read_only=False, launcher="", runs_dir=tmp_path, what="validation")
    assert "validation measures this machine" in _one_line(e)
    assert prepare_paper_runs(None, scale="paper", read_only=True, launcher="", runs_dir=tmp_path) is True


def test_a_failed_run_is_relaunched_and_a_finished_one_is_not(tmp_path):
    grid = _tiny_grid(2, world_sizes=(2,), schedulers=("wfbp", "mgwfbp"))
    runs = tmp_path / "runs"
    a, b = grid.runs
    _finish(runs, a.run_id, model="tiny_resnet")
    mark_failed(runs, b.run_id, "exit status 1")
    write_job_scripts(grid.runs, runs, tmp_path / "jobs")  # every run given: the scripts still skip done ones
    assert "if finished; then" in (tmp_path / "jobs" / f"{a.run_id}.sh").read_text()
    from repro.grids.jobs import pending_runs

    assert [r.run_id for r in pending_runs(grid.runs, runs)] == [b.run_id]


def test_gridstop_shows_one_line_in_a_notebook():
    assert GridStop("scripts written to /x")._render_traceback_() == ["GridStop: scripts written to /x"]


# --------------------------------------------------------------------------------- multi-node, tested here

@pytest.mark.distributed
@pytest.mark.slow
def test_two_nodes_write_the_same_run_folder_as_one(tmp_path):
    """Two torchrun agents (--nnodes 2, --node-rank 0/1, c10d rendezvous on 127.0.0.1, one gloo rank each)
    train tiny_resnet end to end, and their run folder has the files and configuration of a one-node run
    with two ranks; only what must differ does (run id, results folder; measured times)."""
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    two_nodes = _tiny_grid(1).runs[0]
    one_node = _tiny_grid(2).runs[0]
    assert (two_nodes.nodes, two_nodes.procs_per_node, one_node.nodes, one_node.procs_per_node) == (2, 1, 1, 2)
    for run, out in ((two_nodes, tmp_path / "two"), (one_node, tmp_path / "one")):
        rc = emulate_nodes(run, out / "runs", out / "logs", port=_free_port(), timeout_s=300, env=env)
        logs = "".join(p.read_text()[-1500:] for p in sorted((out / "logs").glob("*.log")))
        assert rc == 0, logs
        assert run_status(out / "runs", run.run_id) == "done"
    a = tmp_path / "two" / "runs" / two_nodes.run_id
    b = tmp_path / "one" / "runs" / one_node.run_id
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    ra, rb = (json.loads((p / "run.json").read_text()) for p in (a, b))
    differ = {k for k in set(ra["config"]) | set(rb["config"]) if ra["config"].get(k) != rb["config"].get(k)}
    assert differ == {"run_id", "results_dir"}, differ
    assert set(ra["summary"]) == set(rb["summary"])
    assert ra["summary"]["world_size"] == rb["summary"]["world_size"] == 2
    assert len((a / "iterations.csv").read_text().splitlines()) == len((b / "iterations.csv").read_text().splitlines())


# --------------------------------------------------------------------------------- the check

@pytest.mark.notebook
@pytest.mark.slow
def test_mgwfbp_training_at_paper_scale_draws_nothing_here(tmp_path):
    """`papermill notebooks/mgwfbp_training.ipynb out.ipynb -p scale paper` without the paper's GPUs and
    without finished runs stops in one line (it used to train the tiny CPU models under a paper label)."""
    import papermill as pm
    from jupyter_client.kernelspec import KernelSpecManager

    kernel = "repro" if "repro" in KernelSpecManager().find_kernel_specs() else "python3"
    figures, results = tmp_path / "figures", tmp_path / "data"
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(ROOT / "notebooks" / "mgwfbp_training.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={"scale": "paper", "output_dir": str(figures), "results_dir": str(results)},
                            kernel_name=kernel, progress_bar=False)
    assert e.value.ename == "GridStop" and "set launcher" in e.value.evalue and "\n" not in e.value.evalue
    assert not figures.exists() or not any(figures.iterdir())
    assert not (results / "mgwfbp_training" / "runs").exists()
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(ROOT / "notebooks" / "mgwfbp_training.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={"scale": "paper", "launcher": "print", "output_dir": str(figures),
                                        "results_dir": str(results)}, kernel_name=kernel, progress_bar=False)
    jobs = results / "mgwfbp_training" / "jobs"
    assert e.value.ename == "GridStop" and str(jobs) in e.value.evalue
    assert len((jobs / "commands.txt").read_text().splitlines()) == len(load_grid("mgwfbp").runs)
    assert not figures.exists() or not any(figures.iterdir())


# ------------------------------------------------------------------------------------ SLURM resources

class _FakeExecutor:
    """Records what submit_slurm asks submitit for (an AutoExecutor on a SLURM cluster)."""

    cluster = "slurm"

    def __init__(self):
        self.parameters, self.submitted = [], []

    def update_parameters(self, **kw):
        self.parameters.append(kw)

    def map_array(self, fn, tasks):
        self.submitted.append((fn, list(tasks)))
        return [object() for _ in tasks]


def test_slurm_resources_reach_submitit_and_the_runs_checkpoint(tmp_path):
    run = _tiny_grid(2, world_sizes=(2,)).runs[0]  # one node x 2 GPUs
    ex = _FakeExecutor()
    jobs = submit_slurm([run], tmp_path / "runs", tmp_path / "jobs", executor=ex,
                        resources="time_min=720 cpus_per_task=16 mem_gb=64 partition=gpu account=proj "
                                  "extra=--qos=high extra=--exclusive signal_s=300 checkpoint_every_min=45 requeues=9")
    assert len(jobs) == 1
    assert ex.parameters == [{"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 2, "timeout_min": 720,
                              "slurm_signal_delay_s": 300, "slurm_max_num_timeout": 9, "cpus_per_task": 16,
                              "mem_gb": 64.0, "slurm_partition": "gpu", "slurm_account": "proj",
                              "slurm_additional_parameters": {"qos": "high", "exclusive": True}}]
    fn, (task,) = ex.submitted[0]
    assert callable(getattr(fn, "checkpoint", None))  # submitit's requeue hook
    assert task.checkpoint_every_min == 45.0 and 0 < task.grace_s < 300
    from repro.grids.jobs import torchrun_argv

    argv = torchrun_argv(run, "/r", checkpoint_every_min=task.checkpoint_every_min)
    assert argv[argv.index("--checkpoint-every-min") + 1] == "45"


def test_slurm_timeout_min_keeps_its_meaning_and_a_local_executor_gets_no_slurm_keywords(tmp_path):
    run = _tiny_grid(2).runs[0]
    ex = _FakeExecutor()
    ex.cluster = "local"
    submit_slurm([run], tmp_path / "runs", tmp_path / "jobs", executor=ex, timeout_min=10, backend="gloo",
                 device="cpu")
    assert ex.parameters == [{"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "timeout_min": 10}]


@pytest.mark.parametrize("spec, message", [
    ("time_min=0", "time_min=0: expected an integer in [1, 100000]"),
    ("time_min=abc", "time_min='abc': expected an integer"),
    ("mem_gb=-1", "mem_gb=-1.0: expected a positive number of GB"),
    ("partition=a b", "expected key=value items"),
    ("partition=gpu;x", "expected key=value items"),
    ("account=pro$j", "expected a SLURM name"),
    ("gpus_per_node=1", "runs 2 ranks per node"),
    ("signal_s=7200 time_min=60", "the signal must come before the time limit"),
    ("extra=--time=5", "set it as time_min"),
    ("extra=qos=high", "expected one sbatch option"),
    ("colour=blue", "unknown setting 'colour'"),
    ("checkpoint_every_min=nan", "checkpoint_every_min=nan"),
])
def test_bad_slurm_resources_are_one_line_and_nothing_is_written(tmp_path, spec, message):
    run = _tiny_grid(2).runs[0]
    ex = _FakeExecutor()
    with pytest.raises(GridStop, match=re.escape(message)) as e:
        submit_slurm([run], tmp_path / "runs", tmp_path / "jobs", executor=ex, resources=spec)
    _one_line(e)
    with pytest.raises(GridStop, match=re.escape(message)):
        write_job_scripts([run], tmp_path / "runs", tmp_path / "jobs", resources=spec)
    assert ex.parameters == [] and not (tmp_path / "jobs").exists()


def test_job_scripts_carry_the_sbatch_lines_and_requeue_after_a_checkpoint(tmp_path):
    run = _tiny_grid(2).runs[0]
    write_job_scripts([run], tmp_path / "runs", tmp_path / "jobs",
                      resources={"time_min": 600, "mem_gb": 32, "partition": "gpu", "extra": ["--qos=high"]})
    script = (tmp_path / "jobs" / f"{run.run_id}.sh").read_text()
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == ["#SBATCH --job-name=" + run.run_id, "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --time=600", "#SBATCH --signal=B:USR1@120", "#SBATCH --requeue",
                      "#SBATCH --gpus-per-node=2", "#SBATCH --mem=32768M", "#SBATCH --partition=gpu",
                      "#SBATCH --qos=high"]
    assert "--checkpoint-every-min 30" in script and "scontrol requeue" in script
    assert script.index("#SBATCH") < script.index("set -uo pipefail")  # sbatch reads them before any command
    import subprocess

    assert subprocess.run(["bash", "-n", str(tmp_path / "jobs" / f"{run.run_id}.sh")]).returncode == 0


def test_grid_cli_slurm_flags(tmp_path, capsys):
    from repro.cli.grid import main

    base = ["grid", "launch", "mgwfbp", "--runs-dir", str(tmp_path / "runs"), "--launcher", "print",
            "--jobs-dir", str(tmp_path / "jobs")]
    assert main(base + ["--slurm-mem-gb", "-3"]) == 2
    assert capsys.readouterr().err.strip() == "repro: error: slurm mem_gb=-3.0: expected a positive number of GB"
    assert not (tmp_path / "jobs").exists()
    assert main(base + ["--slurm-time-min", "720", "--slurm-partition", "gpu", "--slurm-extra=--qos=high",
                        "--checkpoint-every-min", "20"]) == 0
    script = next((tmp_path / "jobs").glob("*.sh")).read_text()
    assert "#SBATCH --time=720" in script and "#SBATCH --partition=gpu" in script and "#SBATCH --qos=high" in script
    assert "--checkpoint-every-min 20" in script


def test_notebook_gate_checks_the_slurm_parameter_first(tmp_path):
    with pytest.raises(GridStop, match="unknown setting 'x'") as e:
        prepare_paper_runs("mgwfbp", scale="tiny", read_only=False, launcher="", runs_dir=tmp_path, slurm="x=1")
    _one_line(e)
    from repro.figures.params import validate_parameters
    from repro.figures.schemas.omgs_training import OmgsTrainingParams

    assert validate_parameters(OmgsTrainingParams, {"slurm": "time_min=720 mem_gb=64"}).slurm == "time_min=720 mem_gb=64"
    with pytest.raises(ValueError, match="^slurm: .*mem_gb=0.0: expected a positive number of GB"):
        validate_parameters(OmgsTrainingParams, {"slurm": "mem_gb=0"})
