"""repro.cluster.local: init_distributed, the local launcher (results and failure handling), torchrun commands.

Every launch spawns 2 ranks that import torch (about 1.5-3 s on 2 cores), so launches are few.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from repro.cluster import local as launch  # noqa: E402
from repro.cluster.local import (  # noqa: E402
    DistContext,
    DistributedSetupError,
    LaunchTimeoutError,
    RankFailedError,
    distributed,
    init_distributed,
    launch_local,
    shutdown_distributed,
    torchrun_command,
)
from tests import launch_targets as targets  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _spawned_children() -> list[tuple[int, str]]:
    """(pid, state) of this process's multiprocessing-spawned children, zombies included (from /proc)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me and "spawn_main" in cmdline:
            found.append((int(entry.name), state))
    return found


def _assert_no_children() -> None:
    assert multiprocessing.active_children() == []
    if Path("/proc/self/stat").exists():
        assert _spawned_children() == []


def _pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie no longer runs


# --------------------------------------------------------------------------------------------------
# launch_local: results
# --------------------------------------------------------------------------------------------------


def test_two_ranks_all_reduce_results_in_rank_order(capfd):
    t0 = time.monotonic()
    out = launch_local(targets.allreduce_and_report, 2, args=(5,), kwargs={"message": "hello from rank"},
                       timeout_s=120)
    elapsed = time.monotonic() - t0
    assert [r["rank"] for r in out] == [0, 1]
    for r in out:
        assert r["value"] == [3.0, 10.0]  # (1 + 2), (5 + 5)
        assert r["world_size"] == 2
        assert r["local_rank"] == r["rank"]
        assert r["backend"] == "gloo" and r["device"] == "cpu"
        assert r["threads"] == 1 and r["omp"] == "1"
    assert [r["is_main"] for r in out] == [True, False]
    assert out[0]["pid"] != out[1]["pid"] != os.getpid()
    captured = capfd.readouterr().out
    assert "hello from rank 0" in captured and "hello from rank 1" in captured
    _assert_no_children()
    assert elapsed < 60


def test_args_kwargs_env_and_quiet(capfd):
    out = launch_local(targets.allreduce_and_report, 2, args=(1.5,),
                       kwargs={"scale": 2.0, "message": "should not be seen"},
                       env={"REPRO_TEST_EXTRA": "xyz"}, quiet=True, timeout_s=120)
    assert [r["value"] for r in out] == [[6.0, 6.0], [6.0, 6.0]]  # 2*(1+2), 2*(1.5+1.5)
    assert [r["extra_env"] for r in out] == ["xyz", "xyz"]
    assert "should not be seen" not in capfd.readouterr().out
    _assert_no_children()


# --------------------------------------------------------------------------------------------------
# launch_local: failures
# --------------------------------------------------------------------------------------------------


def test_rank_raising_fails_fast_while_peer_blocks_in_all_reduce():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch_local(targets.raise_on_rank1, 2, timeout_s=120, pg_timeout_s=100)
    elapsed = time.monotonic() - t0
    err = info.value
    first, _, rest = str(err).partition("\n")
    assert first == "rank 1 of 2 failed: ValueError: boom from rank 1"
    assert "Traceback (most recent call last)" in rest and "raise_on_rank1" in rest
    assert "boom from rank 1" in err.rank_traceback and err.traceback == err.rank_traceback
    assert (err.rank, err.world_size, err.exc_type, err.exitcode) == (1, 2, "ValueError", None)
    assert isinstance(err, RuntimeError)
    assert elapsed < 30  # far below both timeouts: rank 0 was killed or failed, not waited for
    _assert_no_children()


def test_rank_exiting_without_raising_is_reported_with_exit_code():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch_local(targets.exit_on_rank1, 2, args=(3,), timeout_s=120)
    assert time.monotonic() - t0 < 30
    first = str(info.value).splitlines()[0]
    assert first.startswith("rank 1 of 2 died with exit code 3")
    assert info.value.exitcode == 3 and info.value.rank == 1 and info.value.rank_traceback is None
    assert info.value.other_failures == ()  # rank 0 (asleep, not in a collective) was killed by the launcher
    _assert_no_children()


def test_exit_code_of_a_signalled_rank_names_the_signal():
    # A rank killed by a signal (the OOM killer, kill -9) has exit code -N: the message names the signal.
    assert launch._signal_name(-9) == " (SIGKILL)"
    assert launch._signal_name(-15) == " (SIGTERM)"
    assert launch._signal_name(3) == ""


def test_hanging_rank_times_out_and_is_killed():
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch_local(targets.hang_on_rank1, 2, timeout_s=5)
    elapsed = time.monotonic() - t0
    assert 4.5 < elapsed < 15
    assert isinstance(info.value, TimeoutError)
    assert info.value.unfinished == (1,)
    assert "rank(s) [1] of 2 had not finished" in str(info.value)
    _assert_no_children()


def test_keyboard_interrupt_kills_the_ranks_and_is_reraised(tmp_path):
    main_thread = threading.main_thread().ident

    def interrupt_when_ranks_run():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        signal.pthread_kill(main_thread, signal.SIGINT)

    threading.Thread(target=interrupt_when_ranks_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        launch_local(targets.write_pid_and_hang, 2, args=(str(tmp_path),), timeout_s=120)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]
    assert len(pids) == 2 and all(_pid_gone(p) for p in pids)
    _assert_no_children()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_ranks_die_with_their_launcher(tmp_path):
    code = ("import sys; from repro.cluster.local import launch_local; from tests import launch_targets as t; "
            f"launch_local(t.write_pid_and_hang, 2, args=({str(tmp_path)!r},), timeout_s=300)")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            assert parent.poll() is None, "launcher exited early"
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.1)
        time.sleep(0.2)  # let the pid files be complete
        pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]
        assert all(not _pid_gone(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not all(_pid_gone(p) for p in pids):
            assert time.monotonic() < deadline, f"orphaned ranks still alive: {pids}"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# --------------------------------------------------------------------------------------------------
# launch_local: refused up front
# --------------------------------------------------------------------------------------------------


def test_lambda_and_closure_are_refused_with_a_clear_type_error():
    with pytest.raises(TypeError, match="lambda.*module-level|lambda.*top level"):
        launch_local(lambda ctx: ctx.rank, 2)

    def local_fn(ctx):
        return ctx.rank

    with pytest.raises(TypeError, match="nested function or closure"):
        launch_local(local_fn, 2)
    with pytest.raises(TypeError, match="nested function or closure"):
        launch_local(functools.partial(local_fn), 2)
    with pytest.raises(TypeError, match="args/kwargs cannot be pickled"):
        launch_local(targets.hang_on_rank1, 2, args=(lambda: 0,))
    _assert_no_children()


def test_bad_launch_arguments():
    with pytest.raises(ValueError, match="world_size"):
        launch_local(targets.hang_on_rank1, 0)
    with pytest.raises(ValueError, match="unknown backend"):
        launch_local(targets.hang_on_rank1, 2, backend="mpi2")
    with pytest.raises(ValueError, match="timeout_s"):
        launch_local(targets.hang_on_rank1, 2, timeout_s=0)


# --------------------------------------------------------------------------------------------------
# init_distributed
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def no_dist_env(monkeypatch):
    for name in DIST_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_init_distributed_without_environment_names_the_variable(no_dist_env):
    with pytest.raises(DistributedSetupError) as info:
        init_distributed()
    msg = str(info.value)
    assert "RANK" in msg and "torchrun" in msg and "launch_local" in msg
    no_dist_env.setenv("RANK", "0")
    no_dist_env.setenv("WORLD_SIZE", "1")
    with pytest.raises(DistributedSetupError, match="LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set"):
        init_distributed()


def _single_rank_env(monkeypatch, port=None):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port or launch._free_port("127.0.0.1")))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_forcing_nccl_without_cuda_is_a_clear_error(monkeypatch):
    _single_rank_env(monkeypatch)
    with pytest.raises(DistributedSetupError, match="nccl.*CUDA"):
        init_distributed(backend="nccl")
    with pytest.raises(DistributedSetupError, match="CUDA is not available"):
        init_distributed(device="cuda")
    assert not torch.distributed.is_initialized()


def test_unknown_backend_and_bad_environment(monkeypatch):
    _single_rank_env(monkeypatch)
    with pytest.raises(ValueError, match="unknown backend 'mpi2'"):
        init_distributed(backend="mpi2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(DistributedSetupError, match="RANK must be in"):
        init_distributed()
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(DistributedSetupError, match="RANK='zero' is not an integer"):
        init_distributed()


def test_single_rank_in_process_context_manager(monkeypatch):
    _single_rank_env(monkeypatch)
    with distributed(backend="gloo", timeout_s=30) as ctx:
        assert ctx == DistContext(rank=0, world_size=1, local_rank=0, backend="gloo",
                                  device=torch.device("cpu"), is_main=True)
        assert torch.distributed.is_initialized()
        with pytest.raises(DistributedSetupError, match="already initialised"):
            init_distributed()
        t = torch.ones(2)
        torch.distributed.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
        with pytest.raises(dataclasses.FrozenInstanceError):
            ctx.rank = 3
    assert not torch.distributed.is_initialized()
    shutdown_distributed()  # twice is fine
    shutdown_distributed()


# --------------------------------------------------------------------------------------------------
# torchrun
# --------------------------------------------------------------------------------------------------


def test_torchrun_command_lines():
    assert torchrun_command(["repro.train", "--steps", "10"], 2, python="python") == [
        "python", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", "2",
        "-m", "repro.train", "--steps", "10"]
    assert torchrun_command("-m repro.train --model tiny_resnet", 4)[:3] == [sys.executable, "-m",
                                                                           "torch.distributed.run"]
    assert torchrun_command("-m repro.train --model tiny_resnet", 4)[-4:] == ["-m", "repro.train", "--model",
                                                                            "tiny_resnet"]
    assert torchrun_command(["scripts/train.py", "--x"], "gpu", python="python")[-3:] == [
        "gpu", "scripts/train.py", "--x"]
    multi = torchrun_command(["repro.train"], 4, nnodes=2, node_rank=1, rdzv_endpoint="head:29500",
                             python="python")
    assert multi == ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
                     "--rdzv-endpoint", "head:29500", "--nproc-per-node", "4", "-m", "repro.train"]
    slurm = torchrun_command(["repro.train"], 4, nnodes="$SLURM_NNODES", node_rank="$SLURM_NODEID",
                             rdzv_endpoint="$HEAD:29500", python="python")
    assert " ".join(slurm) == ("python -m torch.distributed.run --nnodes $SLURM_NNODES --node-rank $SLURM_NODEID "
                               "--rdzv-endpoint $HEAD:29500 --nproc-per-node 4 -m repro.train")
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        torchrun_command(["repro.train"], 4, nnodes=2)
    with pytest.raises(ValueError, match="standalone"):
        torchrun_command(["repro.train"], 4, nnodes=2, rdzv_endpoint="h:1", standalone=True)
    with pytest.raises(ValueError, match="node_rank"):
        torchrun_command(["repro.train"], 4, nnodes=2, node_rank=2, rdzv_endpoint="h:1")
    with pytest.raises(ValueError, match="nproc_per_node"):
        torchrun_command(["repro.train"], 0)
    with pytest.raises(ValueError, match="module"):
        torchrun_command([], 1)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch.distributed.run") is None,
                    reason="torch.distributed.run not available")
def test_torchrun_standalone_two_ranks_use_init_distributed(tmp_path):
    # Automatic backend choice on CPU; gloo forced where CUDA would pick NCCL (one GPU per rank).
    extra = ["gloo"] if torch.cuda.is_available() else []
    cmd = torchrun_command(["-m", "tests.launch_targets", str(tmp_path), *extra], 2)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for name in DIST_ENV + ("TORCHELASTIC_USE_AGENT_STORE",):
        env.pop(name, None)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, info in enumerate(ranks):
        assert info == {"rank": r, "world_size": 2, "local_rank": r, "backend": "gloo", "device": "cpu",
                        "sum": 3.0}
