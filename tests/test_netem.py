"""repro.launch.netns: emulated networks (namespaces, bridge, tbf) and launch_local(..., emulate_bandwidth=...).

Tests that build networks need root, ``ip`` and ``tc``; without them they are skipped with the reason
:func:`repro.launch.netns.check_emulation_available` gives. Parsing and the "unavailable" error run everywhere.

Timing model (checked on 2 and 3 gloo ranks): every rank has a full-duplex link of bandwidth B (a ``tbf``
on each direction). gloo's ring all-reduce of n bytes on P ranks sends 2(P-1)/P * n bytes from every rank
to its successor while receiving as much from its predecessor, concurrently and over separate links, so
its time is the ring model's bandwidth term

    t = 2 (P - 1) / P * n * 8 / B    seconds,

which each measured median must match within 15 %. (Frame headers make TCP goodput about 95.6 % of B,
so the measurements run about 5 % above the model.)
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from repro.launch import netns as netem
from repro.launch.netns import (
    EmulatedNetwork, EmulationError, EmulationUnavailableError, check_emulation_available, cleanup_stale,
    default_burst_bytes, default_limit_bytes, format_bandwidth, parse_bandwidth)

REPO = Path(__file__).resolve().parents[1]

try:
    check_emulation_available()
    _UNAVAILABLE = None
except EmulationUnavailableError as e:  # pragma: no cover - depends on the machine
    _UNAVAILABLE = str(e)

needs_emulation = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"network emulation unavailable: {_UNAVAILABLE}")
_OUR_NAME = re.compile(rf"^{netem.DEFAULT_PREFIX}([a-z0-9]+)-(b|\d+)$")


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines() if line.count(":") >= 2}


def _snapshot() -> tuple[set[str], set[str]]:
    return _netns(), _links()


def _foreign_live_run_ids() -> set[str]:
    """Run ids of emulated networks that other live processes hold (a concurrent test session, say)."""
    ids = set()
    with netem._registry_lock() as d:
        for _f, rec in netem._read_records(d):
            if rec and netem._owner_alive(rec) and rec.get("pid") != os.getpid():
                ids.add(rec.get("run_id"))
    return ids


def _assert_nothing_new(before: tuple[set[str], set[str]]) -> None:
    """No namespace or link appeared since ``before``, other than other processes' live networks."""
    allowed = _foreign_live_run_ids()
    ns, links = _snapshot()

    def ours(name: str) -> bool:
        m = _OUR_NAME.match(name)
        return not (m and m.group(1) in allowed)

    new_ns = sorted(n for n in ns - before[0] if ours(n))
    new_links = sorted(n for n in links - before[1] if ours(n))
    assert new_ns == [] and new_links == [], f"left behind: namespaces {new_ns}, links {new_links}"


def _assert_run_gone(run_id: str) -> None:
    ns, links = _snapshot()
    left = sorted(n for n in ns | links if (m := _OUR_NAME.match(n)) and m.group(1) == run_id)
    assert left == [], f"run {run_id} left {left}"
    assert not (netem._state_dir() / f"{netem.DEFAULT_PREFIX}{run_id}.json").exists()


def _tbf_rate(text: str) -> str | None:
    m = re.search(r"qdisc tbf \S+ (?:dev \S+ )?root .*?rate (\S+)", text)
    return m.group(1) if m else None


# --------------------------------------------------------------------------------------------------
# Bandwidths (everywhere)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, bps", [
    ("1gbit", 1e9), ("200mbit", 2e8), ("10Gbit", 1e10), ("500kbit", 5e5), ("1e9", 1e9), ("1.5gbit", 1.5e9),
    (" 100 mbit ", 1e8), ("56GBIT", 5.6e10), ("1tbit", 1e12), ("8000bit", 8000.0), ("1mibit", 2.0 ** 20),
    (1e9, 1e9), (250_000_000, 2.5e8),
])
def test_parse_bandwidth_reads_tc_rates_in_bits_per_second(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text, needle", [
    ("1gbps", "bytes per second"), ("100mbps", "bytes per second"), ("10g", "ambiguous"), ("fast", "cannot read"),
    ("1 furlong", "unknown bandwidth unit"), ("-1mbit", "cannot read"), ("0mbit", "positive"), ("", "cannot read"),
    ("1kbit", "below"), (True, "bits per second"), (None, "string"), ("inf", "cannot read"),
])
def test_parse_bandwidth_rejects_unclear_input(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_bandwidth(text)


def test_format_bandwidth_round_trips():
    assert format_bandwidth(1e9) == "1gbit"
    assert format_bandwidth(2e8) == "200mbit"
    assert format_bandwidth(1.5e9) == "1.5gbit"
    assert format_bandwidth(5e5) == "500kbit"
    assert format_bandwidth(1e10) == "10gbit"
    for bps in (8000.0, 123456.0, 1e9, 2.5e10, 56e9):
        assert parse_bandwidth(format_bandwidth(bps)) == pytest.approx(bps, rel=1e-6)
    with pytest.raises(ValueError):
        format_bandwidth(0)


def test_default_burst_and_queue():
    assert default_burst_bytes(2e8) == 64 * 1024  # 64 KiB floor (one GSO super-packet)
    assert default_burst_bytes(1e9) == 125_000  # 1 ms at 1 Gb/s
    assert default_burst_bytes(1e10) == 1_250_000
    assert default_limit_bytes(2e8, 65536) == 65536 + 2_500_000  # burst + 100 ms
    assert default_limit_bytes(1e6, 65536) == 1 << 20  # at least 1 MiB
    assert default_limit_bytes(1e12, 10**9) == 256 << 20  # at most 256 MiB


def test_network_arguments_are_checked_before_anything_is_made():
    with pytest.raises(ValueError, match="world_size"):
        EmulatedNetwork(0)
    with pytest.raises(ValueError, match="does not fit a /24"):
        EmulatedNetwork(300)
    with pytest.raises(ValueError, match="cannot read bandwidth"):
        EmulatedNetwork(2, "lots")
    with pytest.raises(ValueError, match="smaller than one frame"):
        EmulatedNetwork(2, "1gbit", burst_bytes=1000)
    with pytest.raises(ValueError, match="run_id"):
        EmulatedNetwork(2, run_id="Has-Dash")
    with pytest.raises(ValueError, match="prefix"):
        EmulatedNetwork(2, prefix="toolong")
    with pytest.raises(ValueError, match="room for 3 hosts"):
        EmulatedNetwork(2, subnet="10.9.9.0/30")
    net = EmulatedNetwork(2, "10gbit")
    assert (net.burst_bytes, net.limit_bytes) == (1_250_000, 1_250_000 + 125_000_000)
    assert not net.is_open
    net.close()  # closing a network never opened does nothing


def test_unavailable_emulation_is_a_clear_error(monkeypatch):
    torch = pytest.importorskip("torch")  # noqa: F841 - launch_local is only useful with torch
    from repro.launch.local import launch_local
    from tests import launch_targets as targets

    monkeypatch.setattr(netem, "_is_root", lambda: False)
    with pytest.raises(EmulationUnavailableError) as info:
        check_emulation_available()
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "network emulation is not available here" in msg and "root" in msg
    assert msg.endswith("(--emulate-bandwidth on the command line, emulate_bandwidth=None in Python and the "
                        "notebooks).")
    assert "without network emulation" in msg
    with pytest.raises(EmulationUnavailableError, match="root"):
        EmulatedNetwork(2, "1gbit").open()
    t0 = time.monotonic()
    with pytest.raises(EmulationUnavailableError, match="emulate_bandwidth=None"):
        launch_local(targets.allreduce_and_report, 2, args=(1.0,), emulate_bandwidth="1gbit", timeout_s=60)
    assert time.monotonic() - t0 < 5  # refused before any rank starts
    import multiprocessing

    assert multiprocessing.active_children() == []

    monkeypatch.setattr(netem, "_is_root", lambda: True)
    monkeypatch.setattr(netem, "_which", lambda tool: None if tool == "tc" else "/usr/sbin/ip")
    with pytest.raises(EmulationUnavailableError, match=r"'tc' not found; install iproute2"):
        check_emulation_available()


def test_launch_rejects_bad_emulation_arguments():
    pytest.importorskip("torch")
    from repro.launch.local import launch_local
    from tests import launch_targets as targets

    with pytest.raises(ValueError, match="cannot read bandwidth"):
        launch_local(targets.allreduce_and_report, 2, args=(1.0,), emulate_bandwidth="quick")
    with pytest.raises(ValueError, match="only used with emulate_bandwidth"):
        launch_local(targets.allreduce_and_report, 2, args=(1.0,), emulate_burst_bytes=65536)


# --------------------------------------------------------------------------------------------------
# EmulatedNetwork (root)
# --------------------------------------------------------------------------------------------------


@pytest.mark.netns
@needs_emulation
def test_three_rank_network_is_built_as_described_and_fully_removed():
    before = _snapshot()
    with EmulatedNetwork(3, "500mbit") as net:
        assert net.is_open and net.bandwidth_bps == 5e8 and net.bandwidth == "500mbit"
        assert net.burst_bytes == 65536 and net.limit_bytes == 65536 + 6_250_000
        assert len(net.namespaces) == len(set(net.namespaces)) == 3
        assert set(net.namespaces) <= _netns()
        assert {net.bridge, *net.host_links} <= _links()
        assert all(len(n) <= 15 for n in [net.bridge, *net.host_links])
        subnet = ipaddress.ip_network(net.subnet)
        assert subnet.prefixlen >= 24 and subnet.subnet_of(ipaddress.ip_network("10.0.0.0/8"))
        addrs = [net.master_address, *net.rank_addresses]
        assert len(set(addrs)) == 4 and all(ipaddress.ip_address(a) in subnet for a in addrs)
        # The bridge carries the master address in the root namespace.
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", net.bridge], capture_output=True, text=True)
        assert f"inet {net.master_address}/" in out.stdout
        for rank in range(3):
            links = net.run_in(rank, ["ip", "-o", "link", "show"]).stdout
            assert re.search(rf"\d+: {net.interface}@\S+:.*\bUP\b", links), links
            assert re.search(r"\d+: lo:.*\bUP\b", links), links
            addr = net.run_in(rank, ["ip", "-o", "-4", "addr", "show", "dev", net.interface]).stdout
            assert f"inet {net.rank_addresses[rank]}/" in addr
            # Both directions shaped: the namespace end (what the rank sends), the bridge end (what it receives).
            sent = net.run_in(rank, ["tc", "qdisc", "show", "dev", net.interface]).stdout
            received = subprocess.run(["tc", "qdisc", "show", "dev", net.host_links[rank]], capture_output=True,
                                      text=True).stdout
            assert _tbf_rate(sent) == "500Mbit" and _tbf_rate(received) == "500Mbit", (sent, received)
        record = json.loads((netem._state_dir() / f"{netem.DEFAULT_PREFIX}{net.run_id}.json").read_text())
        assert record["pid"] == os.getpid() and record["subnet"] == str(net.subnet)
        run_id, subnet_text = net.run_id, str(net.subnet)
    assert not net.is_open
    _assert_run_gone(run_id)
    _assert_nothing_new(before)
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    assert subnet_text not in routes
    net.close()  # a second close does nothing


@pytest.mark.netns
@needs_emulation
def test_exception_inside_the_with_block_still_removes_everything():
    before = _snapshot()
    with pytest.raises(RuntimeError, match="raised inside"):
        with EmulatedNetwork(3, "1gbit") as net:
            run_id = net.run_id
            raise RuntimeError("raised inside the with block")
    _assert_run_gone(run_id)
    _assert_nothing_new(before)


@pytest.mark.netns
@needs_emulation
def test_failure_half_way_through_setup_removes_what_was_made(monkeypatch):
    before = _snapshot()
    real_tc = netem._tc
    calls = []

    def failing_tc(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:  # rank 1's first qdisc: rank 0 and the bridge are complete by now
            raise EmulationError("injected tc failure")
        return real_tc(*args, **kwargs)

    monkeypatch.setattr(netem, "_tc", failing_tc)
    net = EmulatedNetwork(3, "1gbit")
    with pytest.raises(EmulationError, match="injected"):
        net.open()
    assert len(calls) == 3
    _assert_run_gone(net.run_id)
    _assert_nothing_new(before)


@pytest.mark.netns
@needs_emulation
def test_concurrent_networks_get_different_names_and_subnets():
    before = _snapshot()
    nets: list[EmulatedNetwork] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            nets.append(EmulatedNetwork(2, "1gbit").open())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and len(nets) == 3
        assert len({n.run_id for n in nets}) == 3
        names = [name for n in nets for name in (n.bridge, *n.host_links)]
        assert len(names) == len(set(names))
        assert len({name for n in nets for name in n.namespaces}) == 6
        subnets = [ipaddress.ip_network(n.subnet) for n in nets]
        assert not any(a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1:])
        # Every network still works while the others exist.
        for n in nets:
            n.check_connectivity()
        # A name or subnet in use is refused.
        with pytest.raises(EmulationError, match="in use"):
            EmulatedNetwork(2, "1gbit", run_id=nets[0].run_id).open()
        with pytest.raises(EmulationError, match="overlaps"):
            EmulatedNetwork(2, "1gbit", subnet=str(nets[1].subnet)).open()
    finally:
        for n in nets:
            n.close()
    for n in nets:
        _assert_run_gone(n.run_id)
    _assert_nothing_new(before)


_HOLDER = ("import sys, time; from repro.launch.netns import EmulatedNetwork; "
           "net = EmulatedNetwork(2, '1gbit').open(); print(net.run_id, flush=True); time.sleep(120)")


def _start_holder() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    run_id = proc.stdout.readline().strip()
    assert run_id, f"holder process failed (exit {proc.poll()})"
    return proc, run_id


@pytest.mark.netns
@needs_emulation
def test_leftovers_of_a_killed_run_are_removed_by_the_next_run():
    before = _snapshot()
    proc, run_id = _start_holder()
    try:
        ns, links = _snapshot()
        assert f"{netem.DEFAULT_PREFIX}{run_id}-0" in ns and f"{netem.DEFAULT_PREFIX}{run_id}-b" in links
        # A live owner's network is left alone.
        assert cleanup_stale() == [] or all(run_id not in n for n in cleanup_stale())
        assert f"{netem.DEFAULT_PREFIX}{run_id}-b" in _links()
        proc.send_signal(signal.SIGKILL)  # no handler can run
        proc.wait(10)
        assert f"{netem.DEFAULT_PREFIX}{run_id}-b" in _links()
        with EmulatedNetwork(2, "1gbit") as net:  # cleans up dead runs first
            _assert_run_gone(run_id)
            assert net.run_id != run_id
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    _assert_nothing_new(before)

    # A leftover that no registry file explains (named like ours) is removed too.
    subprocess.run(["ip", "link", "add", f"{netem.DEFAULT_PREFIX}zz9zz9-b", "type", "bridge"], check=True)
    subprocess.run(["ip", "netns", "add", f"{netem.DEFAULT_PREFIX}zz9zz9-0"], check=True)
    removed = cleanup_stale()
    assert {f"{netem.DEFAULT_PREFIX}zz9zz9-b", f"{netem.DEFAULT_PREFIX}zz9zz9-0"} <= set(removed)
    _assert_nothing_new(before)


@pytest.mark.netns
@needs_emulation
def test_sigterm_removes_the_network():
    before = _snapshot()
    proc, run_id = _start_holder()
    try:
        assert f"{netem.DEFAULT_PREFIX}{run_id}-b" in _links()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM  # the handler cleans up, then dies of SIGTERM as before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    _assert_run_gone(run_id)
    _assert_nothing_new(before)


@pytest.mark.netns
@needs_emulation
def test_interpreter_exit_removes_a_network_left_open():
    before = _snapshot()
    code = ("from repro.launch.netns import EmulatedNetwork; net = EmulatedNetwork(2, '1gbit').open(); "
            "print(net.run_id, flush=True)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    _assert_run_gone(out.stdout.strip())
    _assert_nothing_new(before)


@pytest.mark.netns
@needs_emulation
def test_enter_namespace_moves_the_calling_thread():
    with EmulatedNetwork(1, "1gbit") as net:
        seen = {}

        def probe() -> None:
            netem.enter_namespace(net.namespaces[0])
            seen["ns"] = os.stat("/proc/thread-self/ns/net").st_ino
            import socket

            seen["ifaces"] = sorted(name for _i, name in socket.if_nameindex())

        t = threading.Thread(target=probe)
        t.start()
        t.join(10)
        assert seen["ifaces"] == ["eth0", "lo"]
        assert seen["ns"] != os.stat("/proc/thread-self/ns/net").st_ino
    with pytest.raises(EmulationError, match="cannot open network namespace"):
        netem.enter_namespace("rpn-no-such-namespace")


# --------------------------------------------------------------------------------------------------
# launch_local(..., emulate_bandwidth=...) (root, torch)
# --------------------------------------------------------------------------------------------------


def _ring_prediction(nbytes: int, world: int, bps: float) -> float:
    """Ring all-reduce bandwidth term: every rank sends (and concurrently receives) 2(P-1)/P * n bytes."""
    return 2 * (world - 1) / world * nbytes * 8 / bps


def _measure(world: int, sizes: list[int], bandwidth: str, tolerance: float = 0.15, attempts: int = 2):
    from repro.launch.local import launch_local
    from tests import launch_targets as targets

    bps = parse_bandwidth(bandwidth)
    rows = []
    for attempt in range(attempts):
        results = launch_local(targets.time_allreduce, world, args=(sizes,), kwargs={"repeats": 5, "warmup": 1,
                               "report_network": True}, emulate_bandwidth=bandwidth, timeout_s=180, quiet=True)
        rows = []
        for size in sizes:
            # The collective ends when its slowest rank does.
            measured = max(statistics.median(r["times"][size]) for r in results)
            predicted = _ring_prediction(size, world, bps)
            rows.append((size, measured, predicted, measured / predicted))
        print(f"\n{world} ranks at {bandwidth} (attempt {attempt + 1}): "
              + "; ".join(f"{s / 2**20:g} MiB: {m * 1e3:.1f} ms measured vs {p * 1e3:.1f} ms ring model "
                          f"(x{q:.3f})" for s, m, p, q in rows))
        if all(abs(q - 1) <= tolerance for *_x, q in rows):
            break
    return results, rows


@pytest.mark.distributed
@pytest.mark.netns
@needs_emulation
def test_two_ranks_all_reduce_time_follows_the_bandwidth(record_property):
    pytest.importorskip("torch")
    before = _snapshot()
    sizes = [2 * 2**20, 8 * 2**20]  # 2 MiB and 8 MiB: 168 ms and 671 ms at 100 Mb/s
    results, rows = _measure(2, sizes, "100mbit")
    record_property("allreduce_2ranks_100mbit", [(s, round(m, 4), round(p, 4)) for s, m, p, _q in rows])
    for size, measured, predicted, ratio in rows:
        assert abs(ratio - 1) <= 0.15, f"{size} bytes: {measured:.4f} s measured, {predicted:.4f} s predicted"
    # Each rank ran in its own namespace, on the namespace's interface, and knew the bandwidth.
    seen = [r["network"] for r in results]
    assert len({s["netns_inode"] for s in seen}) == 2
    assert all(s["netns_inode"] != os.stat("/proc/self/ns/net").st_ino for s in seen)
    assert all(s["interfaces"] == ["eth0", "lo"] and s["gloo_ifname"] == "eth0" for s in seen)
    assert all(float(s["bandwidth_bps"]) == 1e8 for s in seen)
    assert all(ipaddress.ip_address(s["master_addr"]).is_private and s["master_addr"] != "127.0.0.1" for s in seen)
    _assert_nothing_new(before)


@pytest.mark.distributed
@pytest.mark.netns
@needs_emulation
def test_three_ranks_all_reduce_time_follows_the_ring_model(record_property):
    pytest.importorskip("torch")
    before = _snapshot()
    sizes = [3 * 2**19, 3 * 2**21]  # 1.5 MiB and 6 MiB (divisible by 3 ranks x 4 bytes): 168 ms and 671 ms at 100 Mb/s
    _results, rows = _measure(3, sizes, "100mbit")
    record_property("allreduce_3ranks_100mbit", [(s, round(m, 4), round(p, 4)) for s, m, p, _q in rows])
    for size, measured, predicted, ratio in rows:
        assert abs(ratio - 1) <= 0.15, f"{size} bytes: {measured:.4f} s measured, {predicted:.4f} s predicted"
    _assert_nothing_new(before)


@pytest.mark.distributed
@pytest.mark.netns
@needs_emulation
def test_failing_rank_in_an_emulated_launch_leaves_nothing_behind():
    pytest.importorskip("torch")
    import multiprocessing

    from repro.launch.local import RankFailedError, launch_local
    from tests import launch_targets as targets

    before = _snapshot()
    with pytest.raises(RankFailedError, match="rank 1 of 2 failed: ValueError: boom from rank 1") as info:
        launch_local(targets.raise_on_rank1_after_allreduce, 2, emulate_bandwidth="1gbit", timeout_s=120, quiet=True)
    assert info.value.rank == 1
    assert multiprocessing.active_children() == []
    _assert_nothing_new(before)


@pytest.mark.distributed
@pytest.mark.netns
@needs_emulation
def test_timeout_and_interrupt_in_an_emulated_launch_leave_nothing_behind():
    pytest.importorskip("torch")
    import multiprocessing

    from repro.launch.local import LaunchTimeoutError, launch_local
    from tests import launch_targets as targets

    before = _snapshot()
    with pytest.raises(LaunchTimeoutError):
        launch_local(targets.hang_on_rank1, 2, emulate_bandwidth="1gbit", timeout_s=2, quiet=True)
    assert multiprocessing.active_children() == []
    _assert_nothing_new(before)

    main_thread = threading.main_thread().ident
    threading.Timer(1.5, lambda: signal.pthread_kill(main_thread, signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        launch_local(targets.hang_on_rank1, 2, emulate_bandwidth="1gbit", timeout_s=60, quiet=True)
    assert multiprocessing.active_children() == []
    _assert_nothing_new(before)


@pytest.mark.distributed
@pytest.mark.netns
@needs_emulation
def test_repro_launch_records_the_emulated_rate_in_the_run(tmp_path):
    import json
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "repro", "launch", "--nproc", "2", "--emulate-bandwidth", "1gbit", "--",
                        "--model", "tiny_vgg", "--scheduler", "syncea", "--steps", "1", "--warmup-steps", "1",
                        "--compute-steps", "0", "--batch-size", "4", "--results-dir", str(tmp_path), "--run-id", "r"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["config"]["emulated_bandwidth_bps"] == 1e9
    assert run["summary"]["emulated_bandwidth_bps"] == 1e9
