"""Failures end fast under torchrun (repro.launch.torchrun.distributed, repro.train.main): a rank that
fails posts one line on the job's store and aborts its process group; its peers stop within seconds with
one line naming it, not at the process-group timeout; a rank that never arrives ends the roll call at
--join-timeout-s. Exit statuses: 2 for a refused configuration (on the peers too), 1 otherwise.

The end-to-end tests run two torchrun agents with c10d rendezvous on 127.0.0.1 (the emulated two-node
path of repro.grids.jobs), one gloo rank each, and make one rank fail with the test-only hook
REPRO_INJECT_FAULT (repro.launch.faults)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest

from repro.launch import faults
from repro.launch import torchrun
from repro.grids.grid import parse_grid
from repro.grids.jobs import emulate_nodes, quiet_torch_env, torchrun_argv, write_job_scripts
from repro.launch.torchrun import JoinTimeoutError, PeerFailedError, is_config_error, peer_failure, report_failure


def _run(nodes: int = 2, per_node: int = 1, steps: int = 4):
    return parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": per_node,
                       "train": {"steps": steps, "warmup_steps": 1, "compute_steps": 0, "fit_repeats": 1},
                       "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 4}},
                                        "world_sizes": [nodes * per_node], "schedulers": ["mgwfbp"]}]}, "t").runs[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ --node-rank under c10d

def test_the_multi_node_command_is_the_same_on_every_node_without_node_rank(tmp_path):
    """c10d ignores --node-rank (the agents rank the nodes): the command has none and takes none."""
    run = _run(nodes=2)
    cmd = torchrun_argv(run, "/shared/runs", head="node001", python="python")
    assert "--node-rank" not in cmd and cmd[cmd.index("--rdzv-backend") + 1] == "c10d"
    with pytest.raises(TypeError):
        torchrun_argv(run, "/shared/runs", node_rank=0)  # type: ignore[call-arg]
    script = (write_job_scripts([run], tmp_path / "runs", tmp_path / "jobs") / f"{run.run_id}.sh").read_text()
    assert "--node-rank" not in script
    assert 'export TORCH_CPP_LOG_LEVEL="${TORCH_CPP_LOG_LEVEL:-ERROR}"' in script


def test_quiet_torch_env_keeps_a_level_the_user_set():
    assert quiet_torch_env({})["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    assert quiet_torch_env({"TORCH_CPP_LOG_LEVEL": "INFO"})["TORCH_CPP_LOG_LEVEL"] == "INFO"


# ------------------------------------------------------------------------------ the fault hook, the statuses

def test_the_fault_hook_fails_only_the_rank_and_point_it_names(monkeypatch):
    monkeypatch.setenv(faults.ENV, "1:step2:config")
    faults.maybe_fail("step2", 0)  # another rank
    faults.maybe_fail("step1", 1)  # another point
    with pytest.raises(ValueError, match="fault injected"):
        faults.maybe_fail("step2", 1)
    monkeypatch.setenv(faults.ENV, "0:join:error")
    with pytest.raises(RuntimeError, match="fault injected"):
        faults.maybe_fail("join", 0)
    monkeypatch.setenv(faults.ENV, "0:step:boom")
    with pytest.raises(ValueError, match="RANK:WHERE:KIND") as e:
        faults.maybe_fail("join", 0)
    assert "\n" not in str(e.value)
    monkeypatch.delenv(faults.ENV)
    faults.maybe_fail("join", 0)


def test_which_failures_are_configuration_errors():
    assert is_config_error(ValueError("x")) and is_config_error(FileNotFoundError("x"))
    assert is_config_error(JoinTimeoutError("x")) and is_config_error(torchrun.DistributedSetupError("x"))
    assert not is_config_error(RuntimeError("x"))
    assert is_config_error(PeerFailedError("x", config=True)) and not is_config_error(PeerFailedError("x"))


@pytest.fixture
def agent_store(monkeypatch):
    """A TCPStore served here, as torchrun's agent serves one; the ranks' environment points to it."""
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setattr(torchrun, "_STORE_CLIENT", None)
    yield server
    torchrun._STORE_CLIENT = None


def test_a_peer_names_the_rank_that_posted_its_failure(agent_store):
    from repro.results.runs import RunExistsError

    assert report_failure(RunExistsError("run 'r' already exists"), rank=0)
    assert not report_failure(RuntimeError("gloo: Connection closed by peer"), rank=1)  # a consequence
    peer = peer_failure(RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:1"), 1)
    assert peer is not None and peer.peer == 0 and peer.config
    assert str(peer) == ("rank 1: peer rank 0 refused the configuration (see its log: RunExistsError: run 'r' "
                         "already exists); stopping")
    assert peer_failure(ValueError("mine"), 1) is None  # this rank's own failure, not a peer's


def test_a_broken_collective_without_a_report_is_one_line(agent_store, monkeypatch):
    monkeypatch.setattr(torchrun, "REPORT_WAIT_S", 0.2)
    peer = peer_failure(RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:1"), 1)
    assert peer.peer is None and not peer.config and "\n" not in str(peer)
    assert str(peer).startswith("rank 1: lost the connection to a peer (it died or was stopped")


def test_the_roll_call_ends_at_the_join_timeout_naming_who_is_missing(agent_store):
    t0 = time.monotonic()
    with pytest.raises(JoinTimeoutError) as e:
        torchrun._roll_call(1, 3, 0.5)
    assert time.monotonic() - t0 < 5
    assert e.value.missing == (0, 2)
    assert str(e.value) == ("rank 1: rank(s) 0, 2 of 3 did not join within 0.5 s (not started, hung, or died "
                            "before joining: see their logs); stopping")


def test_the_roll_call_ends_at_once_when_a_peer_failed_before_joining(agent_store):
    report_failure(ValueError("bad option"), rank=0)
    t0 = time.monotonic()
    with pytest.raises(PeerFailedError, match="rank 1: peer rank 0 refused the configuration") as e:
        torchrun._roll_call(1, 2, 30.0)
    assert time.monotonic() - t0 < 5 and e.value.config


# ------------------------------------------------------------------------------ end to end: two torchrun agents

def _agents(tmp_path: Path, fault: str, extra: list[str], *, nodes: int = 2, grace_s: float = 20.0,
            limit_s: float = 90.0) -> tuple[list[int | None], list[str], float]:
    # (an agent may take ~10 s more than its rank to exit: torchrun's rendezvous shutdown, not the ranks)
    """Two (``nodes``) torchrun agents of one run, c10d on 127.0.0.1, the run's command plus ``extra``;
    rank ``fault``'s fault injected. Waits until all have exited (at most ``grace_s`` after the first
    exit), then ends the rest. Returns exit statuses (None: ended here), logs, seconds from the first
    agent's exit to the last one's."""
    run = _run(nodes=nodes)
    argv = torchrun_argv(run, tmp_path / "runs", head="127.0.0.1", port=_free_port(), backend="gloo",
                         device="cpu") + extra
    env = quiet_torch_env({**os.environ, "OMP_NUM_THREADS": "1", faults.ENV: fault})
    logs = [tmp_path / f"node{i}.log" for i in range(nodes)]
    files = [open(p, "wb") for p in logs]
    procs = [subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
             for f in files]
    exits: list[float] = []
    start = time.monotonic()
    deadline = start + limit_s
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if not exits and any(p.poll() is not None for p in procs):
                exits.append(time.monotonic())
                deadline = min(deadline, exits[0] + grace_s)
            time.sleep(0.1)
        last = time.monotonic()
        codes = [p.poll() for p in procs]
    finally:
        from repro.grids.jobs import _kill

        for p in procs:
            _kill(p)
        for f in files:
            f.close()
    return codes, [p.read_text(errors="replace") for p in logs], last - (exits[0] if exits else start)


def _errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("repro: error:")]


def _rank_exit_times(logs: list[str]) -> list[float]:
    """When each agent saw its rank fail (seconds of the day, from torchrun's ``E... failed (exitcode`` lines)."""
    out = []
    for log in logs:
        for h, m, s in re.findall(r"^E\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*failed \(exitcode", log, re.M):
            out.append(int(h) * 3600 + int(m) * 60 + float(s))
    return out


def _worker_status(log: str) -> list[int]:
    """The exit statuses of the ranks the agent reports (torchrun's own exit status is 1 for any failure)."""
    return [int(x) for x in re.findall(r"^\s+exitcode\s+:\s+(-?\d+)", log, re.M)]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_that_raises_mid_run_stops_its_peer_within_seconds(tmp_path):
    """Rank 0 raises at its second timed step (a RuntimeError: exit 1); rank 1, on the other agent, stops
    within seconds with one line naming rank 0 (before: it waited the whole process-group timeout, here
    120 s, in the shutdown barrier), status 1; no C++ frames anywhere."""
    codes, logs, _ = _agents(tmp_path, "0:step1:error", ["--pg-timeout-s", "120"])
    assert codes == [1, 1], logs  # both agents exited by themselves (within 20 s of each other)
    times = _rank_exit_times(logs)
    assert len(times) == 2 and max(times) - min(times) < 8, (times, logs)  # the ranks: within seconds
    lines = sorted(line for log in logs for line in _errors(log))
    assert lines == ["repro: error: rank 0: RuntimeError: fault injected by REPRO_INJECT_FAULT on rank 0 at step1",
                     "repro: error: rank 1: peer rank 0 failed (see its log: RuntimeError: fault injected by "
                     "REPRO_INJECT_FAULT on rank 0 at step1); stopping"], logs
    assert sorted(s for log in logs for s in _worker_status(log)) == [1, 1]
    assert not any("frame #" in log or "Exception raised from" in log for log in logs), logs


@pytest.mark.distributed
@pytest.mark.slow
def test_a_refused_configuration_on_one_rank_exits_2_on_every_rank(tmp_path):
    """Rank 0 refuses its configuration before joining (exit 2); rank 1 leaves the roll call at once, status
    2 too (the job's configuration was refused), one line naming rank 0. Through emulate_nodes."""
    run = _run(nodes=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", faults.ENV: "0:join:config"}
    t0 = time.monotonic()
    rc = emulate_nodes(run, tmp_path / "runs", tmp_path / "logs", port=_free_port(), timeout_s=90, env=env)
    took = time.monotonic() - t0
    logs = [p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("*.log"))]
    assert rc == 1, logs  # torchrun's own status for any failed rank
    assert took < 60, (took, logs)
    lines = sorted(line for log in logs for line in _errors(log))
    assert lines == ["repro: error: fault injected by REPRO_INJECT_FAULT on rank 0 at join",
                     "repro: error: rank 1: peer rank 0 refused the configuration (see its log: ValueError: fault "
                     "injected by REPRO_INJECT_FAULT on rank 0 at join); stopping"], logs
    # each agent reports its rank's status in a table, unless the agent that kept the rendezvous store has
    # gone first and torchrun's other agent ends on the lost store instead (seen under load): every table
    # that was printed says 2
    statuses = [s for log in logs for s in _worker_status(log)]
    assert statuses and set(statuses) == {2}, logs
    assert not any("frame #" in log for log in logs), logs


@pytest.mark.distributed
@pytest.mark.slow
def test_a_rank_that_never_arrives_ends_the_wait_at_the_join_timeout(tmp_path):
    """Rank 1 hangs before joining; rank 0 waits --join-timeout-s (5 s), not the process-group timeout
    (120 s), then stops with one line naming rank 1, status 2 (the job could not be formed). The hung
    rank's agent is ended here (nothing can reach a hung process)."""
    codes, logs, _ = _agents(tmp_path, "1:join:hang", ["--pg-timeout-s", "120", "--join-timeout-s", "5"],
                             grace_s=3.0)
    # the waiting agent exited; the hung one was ended here, or ended itself when the rendezvous store it
    # talks to (kept by the first agent) went away with that agent (seen on a loaded machine)
    assert sorted(codes, key=str) in ([1, None], [1, 1]), logs
    lines = [line for log in logs for line in _errors(log)]
    assert lines == ["repro: error: rank 0: rank(s) 1 of 2 did not join within 5 s (not started, hung, or died "
                     "before joining: see their logs); stopping"], logs
    assert [s for log in logs for s in _worker_status(log)] == [2], logs
    assert not any("frame #" in log for log in logs), logs
