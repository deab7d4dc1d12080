"""repro.launch.local (the local launcher: results, roles, failure handling, bounds) and
repro.launch.torchrun (init_distributed, torchrun commands).

Every launch spawns 2 ranks that import torch (about 1.5-3 s on 2 cores), so launches are few.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from repro.launch import local as launch  # noqa: E402
from repro.launch.local import LaunchTimeoutError, RankFailedError, Role, launch_local  # noqa: E402
from repro.launch.torchrun import (  # noqa: E402
    DistContext, DistributedSetupError, distributed, init_distributed, shutdown_distributed, torchrun_command)
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


@pytest.mark.distributed
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


@pytest.mark.distributed
def test_args_kwargs_env_and_quiet(capfd):
    out = launch_local(targets.allreduce_and_report, 2, args=(1.5,),
                       kwargs={"scale": 2.0, "message": "should not be seen"},
                       env={"REPRO_TEST_EXTRA": "xyz"}, quiet=True, timeout_s=120)
    assert [r["value"] for r in out] == [[6.0, 6.0], [6.0, 6.0]]  # 2*(1+2), 2*(1.5+1.5)
    assert [r["extra_env"] for r in out] == ["xyz", "xyz"]
    assert [(r["role"], r["role_rank"]) for r in out] == [("worker", 0), ("worker", 1)]  # a plain launch
    assert "should not be seen" not in capfd.readouterr().out
    _assert_no_children()


# --------------------------------------------------------------------------------------------------
# launch_local: failures
# --------------------------------------------------------------------------------------------------


@pytest.mark.distributed
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


@pytest.mark.distributed
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


@pytest.mark.distributed
def test_hanging_rank_times_out_and_is_killed():
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch_local(targets.hang_on_rank1, 2, timeout_s=5)
    elapsed = time.monotonic() - t0
    assert 4.5 < elapsed < 15
    assert isinstance(info.value, TimeoutError)
    assert 1 in info.value.unfinished
    # rank 0 returns at once, unless starting it (spawn, import torch, join the group) took the whole 5 s,
    # as it can on 2 cores busy with other work
    if info.value.unfinished == (1,):
        assert "rank(s) [1] of 2 had not finished" in str(info.value)
    else:
        assert "rank(s) [0, 1] of 2 had not finished" in str(info.value)
    _assert_no_children()


def kill_self_on_rank1(ctx, out_dir):
    """Rank 1 kills itself with SIGKILL (as the OOM killer or ``kill -9`` would) while rank 0 waits for it
    in an all_reduce. (Module level: the ranks import it from here.)"""
    import torch.distributed as dist

    Path(out_dir, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    if ctx.rank == 1:
        time.sleep(0.5)  # let rank 0 block in its all_reduce first
        Path(out_dir, "killed_at").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(3))  # never completes: rank 1 is gone
    time.sleep(3600)  # should gloo notice the closed connection and return, still never finish
    return "unreachable"


@pytest.mark.distributed
def test_rank_killed_by_sigkill_is_named_and_its_peer_is_not_left_hanging(tmp_path):
    """End to end: a rank really dies of SIGKILL (exit code -9, no report through its pipe). The launcher
    names that rank and the signal (not its peer's consequent "connection closed"), and ends the peer
    blocked in a collective within a bound: the half-second grace for further reports, then SIGTERM and
    at most 3 s to SIGKILL (the limit below leaves room for a loaded machine), far below timeout_s."""
    with pytest.raises(RankFailedError) as info:
        launch_local(kill_self_on_rank1, 2, args=(str(tmp_path),), timeout_s=120, pg_timeout_s=120)
    returned_after_s = time.time() - float((tmp_path / "killed_at").read_text())
    err = info.value
    first = str(err).splitlines()[0]
    assert first.startswith("rank 1 of 2 died with exit code -9 (SIGKILL)"), str(err)
    assert (err.rank, err.world_size, err.exitcode, err.exc_type, err.rank_traceback) == (1, 2, -9, None, None)
    assert returned_after_s < 20, f"the launcher returned {returned_after_s:.1f} s after the kill"
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
    assert all(_pid_gone(p) for p in pids)  # rank 0 was ended, not left in its all_reduce
    _assert_no_children()


_KEPT: list = []  # a rank's own named semaphores, alive until the rank leaves


def make_progress_bar(ctx, fail_on_rank1=False):
    """What a training rank does: draw a tqdm progress bar (the launcher gives tqdm a thread lock, so its
    bars make no named semaphore), and hold a ``multiprocessing.RLock`` of its own (a named POSIX
    semaphore under the spawn start method, registered with the launcher's resource tracker) until it
    leaves. Returns ``{"tqdm": tqdm's semaphore names, "own": the rank's}``."""
    import multiprocessing

    from tqdm import tqdm

    if fail_on_rank1 and ctx.rank == 0:
        # rank 0 may be terminated by the launcher once rank 1 has failed, and a killed process cannot
        # clean up; only the rank that raises (and leaves through its error path) makes a semaphore
        return {"tqdm": [], "own": []}
    for _ in tqdm(range(2), disable=True):
        pass
    tqdm_names = [getattr(getattr(lock, "_semlock", None), "name", None)
                  for lock in getattr(tqdm.get_lock(), "locks", [])]
    _KEPT.append(multiprocessing.get_context("spawn").RLock())
    own = [_KEPT[-1]._semlock.name]
    if fail_on_rank1 and ctx.rank == 1:
        raise ValueError("boom after drawing a progress bar")
    return {"tqdm": [n for n in tqdm_names if n], "own": own}


_SEMAPHORE_LAUNCHER = """
import json
from repro.launch.local import RankFailedError, launch_local
from tests.test_launch import make_progress_bar

names = launch_local(make_progress_bar, 2, timeout_s=120)
try:  # a rank that raises leaves through the launcher's error path
    launch_local(make_progress_bar, 2, kwargs={"fail_on_rank1": True}, timeout_s=120)
except RankFailedError as e:
    failed = str(e).splitlines()[0]
print(json.dumps({"names": names, "failed": failed}))
"""


@pytest.mark.distributed
def test_launches_leak_no_semaphores():
    """Ranks leave with os._exit (a process group's teardown can hang or abort), which used to skip
    multiprocessing's exit finalizers: every launch whose ranks drew a progress bar ended with the resource
    tracker's "There appear to be N leaked semaphore objects to clean up at shutdown". Ranks that return
    and ranks that raise now unlink their semaphores before leaving (and tqdm's bars make none)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _SEMAPHORE_LAUNCHER], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(r["own"] for r in out["names"])  # each rank did hold a named semaphore of its own ...
    assert not any(r["tqdm"] for r in out["names"])  # ... and tqdm made none (the launcher's thread lock)
    assert out["failed"].startswith("rank 1 of 2 failed: ValueError: boom after drawing a progress bar")
    assert "leaked semaphore" not in proc.stderr and "resource_tracker" not in proc.stderr, proc.stderr[-4000:]


@pytest.mark.distributed
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


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_ranks_die_with_their_launcher(tmp_path):
    code = ("import sys; from repro.launch.local import launch_local; from tests import launch_targets as t; "
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


@pytest.fixture
def no_ranks(monkeypatch):
    """Make starting ranks an error: what is refused must be refused before any rank starts."""
    def refuse(*args, **kwargs):
        raise AssertionError("ranks would have been started")

    monkeypatch.setattr(launch, "_launch", refuse)
    return monkeypatch


def test_bad_launch_arguments(no_ranks):
    with pytest.raises(ValueError, match="world_size"):
        launch_local(targets.hang_on_rank1, 0)
    with pytest.raises(ValueError, match="unknown backend"):
        launch_local(targets.hang_on_rank1, 2, backend="mpi2")
    with pytest.raises(ValueError, match="timeout_s"):
        launch_local(targets.hang_on_rank1, 2, timeout_s=0)


@pytest.mark.parametrize("kwargs", [{"timeout_s": float("inf")}, {"timeout_s": float("nan")},
                                    {"pg_timeout_s": float("inf")}, {"pg_timeout_s": -1.0},
                                    {"timeout_s": "10"}])
def test_timeouts_must_be_finite_and_positive(no_ranks, kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{name} must be a finite positive number of seconds"):
        launch_local(targets.hang_on_rank1, 2, **kwargs)
    _assert_no_children()


def test_more_ranks_than_this_machine_can_run_are_refused_up_front(no_ranks):
    limit, why = launch.max_local_ranks()
    assert limit >= 2 and "MiB per rank" in why and "process slots" in why  # says what it is derived from
    t0 = time.monotonic()
    with pytest.raises(ValueError) as info:
        launch_local(targets.hang_on_rank1, 1_000_000_000)
    msg = str(info.value)
    assert "\n" not in msg and "1000000000" in msg and "available memory" in msg
    assert re.search(r"at most \d+ ranks \(", msg)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match=r"world_size 1000001 .* at most \d+ ranks"):
        launch_local(roles=[Role("server", targets.hang_on_rank1), Role("worker", targets.hang_on_rank1, 10**6)])
    _assert_no_children()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_nccl_without_cuda_is_refused_before_any_rank_starts(no_ranks):
    with pytest.raises(DistributedSetupError, match="nccl.*CUDA"):
        launch_local(targets.hang_on_rank1, 2, backend="nccl")
    _assert_no_children()


# --------------------------------------------------------------------------------------------------
# launch_local: roles
# --------------------------------------------------------------------------------------------------


@pytest.mark.distributed
def test_server_and_two_workers_exchange_tensors_and_see_their_roles():
    out = launch_local(roles=[Role("server", targets.sum_server, kwargs={"label": "s"}),
                              Role("worker", targets.send_to_server, 2, args=(10.0,), kwargs={"scale": 2.0})],
                       timeout_s=120)
    assert [(r["rank"], r["role"], r["role_rank"], r["role_world_size"]) for r in out] == [
        (0, "server", 0, 1), (1, "worker", 0, 2), (2, "worker", 1, 2)]
    assert [r["env"] for r in out] == [["server", "0", "1"], ["worker", "0", "2"], ["worker", "1", "2"]]
    server, w0, w1 = out
    assert server["label"] == "s" and server["world_size"] == 3
    assert server["received"] == [[20.0, 2.0], [22.0, 4.0]]  # (10 + role_rank, rank) * 2
    assert w0["total"] == w1["total"] == [42.0, 6.0]
    assert [r["all_reduce"] for r in out] == [3.0, 3.0, 3.0]
    _assert_no_children()


@pytest.mark.distributed
def test_failing_worker_role_is_named_in_the_error():
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch_local(roles=[Role("server", targets.server_waits_for_workers),
                            Role("worker", targets.worker_fails_on_role_rank1, 2)], timeout_s=120, pg_timeout_s=100)
    assert time.monotonic() - t0 < 30
    err = info.value
    assert str(err).splitlines()[0] == "rank 2 of 3 (role worker, 1 of 2) failed: ValueError: worker 1 gave up"
    assert (err.rank, err.world_size, err.role, err.role_rank, err.exc_type) == (2, 3, "worker", 1, "ValueError")
    _assert_no_children()


@pytest.mark.distributed
def test_hanging_role_times_out_naming_the_roles():
    with pytest.raises(LaunchTimeoutError) as info:
        launch_local(roles=[Role("server", targets.hang_if_worker), Role("worker", targets.hang_if_worker)],
                     timeout_s=5)
    msg = str(info.value)
    assert 1 in info.value.unfinished and "rank 1: role worker, 0 of 1" in msg
    if info.value.unfinished == (1,):  # the server started and returned within the 5 s (not under heavy load)
        assert "rank(s) [1] of 2 had not finished (rank 1: role worker, 0 of 1)" in msg
    _assert_no_children()


def test_bad_roles_are_refused(no_ranks):
    fn = targets.hang_on_rank1
    with pytest.raises(ValueError, match="either fn and world_size or roles"):
        launch_local(fn, 2, roles=[Role("worker", fn, 2)])
    with pytest.raises(ValueError, match="either fn and world_size or roles"):
        launch_local()
    with pytest.raises(ValueError, match="args and kwargs belong to each Role"):
        launch_local(roles=[Role("worker", fn, 2)], args=(1,))
    with pytest.raises(ValueError, match="at least one Role"):
        launch_local(roles=[])
    with pytest.raises(ValueError, match="duplicate role name 'a'"):
        launch_local(roles=[Role("a", fn), Role("a", fn)])
    with pytest.raises(ValueError, match="count"):
        Role("a", fn, 0)
    with pytest.raises(ValueError, match="name"):
        Role("", fn)
    with pytest.raises(TypeError, match="Role"):
        launch_local(roles=[(fn, 2)])
    with pytest.raises(TypeError, match="role 'w'.*lambda"):
        launch_local(roles=[Role("w", lambda ctx: 0)])
    _assert_no_children()


# --------------------------------------------------------------------------------------------------
# launch_local: the rendezvous store listens on MASTER_ADDR only
# --------------------------------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads /proc/PID/net/tcp")
def test_rendezvous_store_listens_on_the_master_address_only():
    (out,) = launch_local(targets.store_listeners, 1, timeout_s=120)
    assert out["master_addr"] == "127.0.0.1"
    assert out["listeners"] == ["127.0.0.1"]  # not 0.0.0.0 / :: (every interface)
    _assert_no_children()


def _emulation_available() -> bool:
    from repro.launch import netns

    try:
        netns.check_emulation_available()
    except netns.EmulationUnavailableError:
        return False
    return True


@pytest.mark.distributed
@pytest.mark.netns
@pytest.mark.skipif(not sys.platform.startswith("linux") or not _emulation_available(),
                    reason="network emulation needs root, ip and tc")
def test_emulated_launch_with_roles_binds_the_store_to_the_bridge():
    out = launch_local(roles=[Role("server", targets.store_listeners), Role("worker", targets.store_listeners)],
                       emulate_bandwidth="1gbit", timeout_s=120, quiet=True)
    assert [(r["role"], r["role_rank"]) for r in out] == [("server", 0), ("worker", 0)]
    bridge = out[0]["master_addr"]
    assert bridge != "127.0.0.1" and out[1]["master_addr"] == bridge
    assert out[0]["listeners"] == [bridge]  # the launcher's socket, seen from its namespace
    _assert_no_children()


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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _single_rank_env(monkeypatch, port=None):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port or _free_port()))
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


def test_init_distributed_refuses_non_finite_timeouts(monkeypatch):
    _single_rank_env(monkeypatch)
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="timeout_s must be a finite positive number of seconds"):
            init_distributed(backend="gloo", timeout_s=bad)
    assert not torch.distributed.is_initialized()


def test_role_environment_is_read_and_checked(monkeypatch):
    from repro.launch import torchrun

    _single_rank_env(monkeypatch)
    monkeypatch.setenv("ROLE_NAME", "server")
    monkeypatch.setenv("ROLE_RANK", "0")
    monkeypatch.setenv("ROLE_WORLD_SIZE", "1")
    assert torchrun._read_role(0, 1) == ("server", 0, 1)
    monkeypatch.setenv("ROLE_RANK", "1")
    with pytest.raises(DistributedSetupError, match="ROLE_RANK must be in"):
        init_distributed()
    for name in ("ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE"):
        monkeypatch.delenv(name)
    assert torchrun._read_role(0, 1) == ("worker", 0, 1)


def test_per_rank_setup_lives_in_torchrun_and_is_reexported_by_local():
    from repro.launch import torchrun

    shared = ["DistContext", "DistributedSetupError", "init_distributed", "shutdown_distributed", "distributed",
              "torchrun_command", "SUPPORTED_BACKENDS"]
    for name in shared:
        assert name in torchrun.__all__ and name in launch.__all__
        assert getattr(launch, name) is getattr(torchrun, name)
        assert name == "SUPPORTED_BACKENDS" or getattr(launch, name).__module__ == "repro.launch.torchrun"
    assert "launch_local" not in torchrun.__all__ and not hasattr(torchrun, "launch_local")
    ctx = DistContext(rank=1, world_size=2, local_rank=1, backend="gloo", device=torch.device("cpu"), is_main=False)
    assert (ctx.role, ctx.role_rank, ctx.role_world_size) == ("worker", 1, 2)


@pytest.mark.distributed
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


@pytest.mark.distributed
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
