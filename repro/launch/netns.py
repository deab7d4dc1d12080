"""Emulated slow networks on one Linux machine: one network namespace per rank, a bridge, ``tbf`` shaping.

Each rank gets a full-duplex link of the chosen bandwidth to a bridge (a non-blocking switch). Needs root
(CAP_NET_ADMIN and CAP_SYS_ADMIN), ``ip`` and ``tc`` and the ``veth``, ``bridge`` and ``sch_tbf`` modules
(:func:`check_emulation_available` says what is missing). A rank enters its namespace with
:func:`enter_namespace` before it opens any socket (:func:`repro.launch.local.launch_local` does this when
given ``emulate_bandwidth``). Layout, ``tbf`` parameters and clean-up: docs/design/launch.md."""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from repro.core import ranges

__all__ = ["DEFAULT_PREFIX", "EmulatedNetwork", "EmulationError", "EmulationUnavailableError",
           "check_emulation_available", "cleanup_stale", "default_burst_bytes", "default_limit_bytes",
           "enter_namespace", "format_bandwidth", "parse_bandwidth"]

DEFAULT_PREFIX = "rpn"
NAMESPACE_INTERFACE = "eth0"
# Where live runs are recorded (a tmpfs, cleared at boot like the namespaces themselves).
STATE_DIR_ENV = "REPRO_NETEM_STATE_DIR"
_DEFAULT_STATE_DIRS = ("/run/repro-netem", "/tmp/repro-netem")
_NETNS_DIR = "/var/run/netns"
_CLONE_NEWNET = 0x40000000
_IFNAMSIZ = 15  # usable characters of a Linux interface name
_CMD_TIMEOUT_S = 20.0
_MIN_BURST = 64 * 1024
#: The fastest rate ``tbf`` can shape: tc's bucket (rate x 1 ms) is an unsigned 32-bit byte count.
MAX_EMULATED_BPS = 8 * (2 ** 32 - 1) / 1e-3
_MIN_LIMIT = 1 << 20
_MAX_LIMIT = 256 << 20
_NO_EMULATION_HINT = ("To run without network emulation, leave out the bandwidth option "
                      "(--emulate-bandwidth on the command line, emulate_bandwidth=None in Python and the notebooks).")


class EmulationError(RuntimeError):
    """Setting up or tearing down an emulated network failed (the message says which command and why)."""


class EmulationUnavailableError(EmulationError):
    """Network emulation cannot work here (not root, no ``ip``/``tc``, namespaces not permitted, ...)."""


# tc's rate units (tc(8), "RATES"): a bare number and "bit" are bits per second; SI prefixes are
# powers of 1000, IEC prefixes (kibit, mibit, ...) powers of 1024.
_BIT_UNITS = {
    "": 1.0, "bit": 1.0,
    "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "kibit": 2.0 ** 10, "mibit": 2.0 ** 20, "gibit": 2.0 ** 30, "tibit": 2.0 ** 40,
}
_BYTE_UNITS = ("bps", "kbps", "mbps", "gbps", "tbps", "kibps", "mibps", "gibps", "tibps")
_BANDWIDTH_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z/]*)\s*$")


def parse_bandwidth(text: str | float | int, flag: str | None = None, *, emulated: bool = False) -> float:
    """Bits per second from a tc-style rate (``"1gbit"``, ``"512kibit"``: IEC prefixes are powers of 1024;
    a bare number is bits per second) or a positive number. Case-insensitive.

    Byte spellings (``"mbps"``, ``"gbps"``) are refused: tc reads them as bytes, most people as bits. The
    rate must lie in :data:`repro.core.ranges.BITS_PER_S` and, with ``emulated``, at most
    :data:`MAX_EMULATED_BPS`; ``flag`` names the value in the one-line ValueError."""
    try:
        return _parse_bandwidth(text, emulated)
    except ValueError as e:
        if flag is None:
            raise
        raise ValueError(f"{flag}: {e}") from None


def _parse_bandwidth(text: str | float | int, emulated: bool) -> float:
    if isinstance(text, bool):
        raise ValueError(f"bandwidth must be a rate such as '1gbit' or a number of bits per second, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
        unit = ""
    else:
        if not isinstance(text, str):
            raise ValueError(f"bandwidth must be a string such as '1gbit' or a number, got {type(text).__name__}")
        m = _BANDWIDTH_RE.match(text)
        if not m:
            raise ValueError(
                f"cannot read bandwidth {text!r}: write a number with a tc rate unit, e.g. '1gbit', '200mbit', "
                "'500kbit', '10gbit', or a plain number of bits per second such as '1e9'")
        value = float(m.group(1))
        unit = m.group(2).lower()
        if unit in _BYTE_UNITS or unit.endswith("/s") or unit in ("b", "kb", "mb", "gb", "k", "m", "g", "t"):
            raise ValueError(
                f"ambiguous bandwidth unit in {text!r}: use bits per second with tc's units 'bit', 'kbit', "
                "'mbit', 'gbit', 'tbit' (e.g. '1gbit' for 1 Gb/s Ethernet); tc itself reads 'bps'/'mbps'/'gbps' "
                "as bytes per second")
        if unit not in _BIT_UNITS:
            raise ValueError(
                f"unknown bandwidth unit {m.group(2)!r} in {text!r}: use one of bit, kbit, mbit, gbit, tbit "
                "(powers of 1000) or kibit, mibit, gibit, tibit (powers of 1024)")
    bps = value * _BIT_UNITS[unit]
    if not math.isfinite(bps) or bps <= 0:
        raise ValueError(f"bandwidth must be positive and finite, got {text!r}")
    if bps < 8000:
        raise ValueError(f"bandwidth {text!r} is below 8 kbit/s, which tc cannot shape usefully")
    if not ranges.BITS_PER_S.contains(bps):
        raise ValueError(f"bandwidth {text!r} = {bps:g} bit/s is outside the plausible range of link rates "
                         f"{ranges.BITS_PER_S.range_text()}")
    if emulated and bps > MAX_EMULATED_BPS:
        raise ValueError(f"bandwidth {text!r} = {bps:g} bit/s is above the {MAX_EMULATED_BPS:.3g} bit/s tc can "
                         "shape (its 1 ms bucket must fit 2**32 - 1 bytes)")
    return bps


def format_bandwidth(bps: float) -> str:
    """A tc-style rate for ``bps`` bits per second (``1.5e9 -> "1.5gbit"``); ``parse_bandwidth`` of it gives
    back ``bps`` to 6 significant digits."""
    bps = float(bps)
    if not math.isfinite(bps) or bps <= 0:
        raise ValueError(f"bandwidth must be positive and finite, got {bps!r}")
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.6g}{unit}"
    return f"{bps:.6g}bit"


def default_burst_bytes(bandwidth_bps: float) -> int:
    """The ``tbf`` bucket: ``max(rate x 1 ms, 64 KiB)`` bytes."""
    return int(max(bandwidth_bps / 8.0 * 1e-3, _MIN_BURST))


def default_limit_bytes(bandwidth_bps: float, burst_bytes: int) -> int:
    """The ``tbf`` queue: ``burst + rate x 100 ms`` bytes, clamped to [1 MiB, 256 MiB]."""
    return int(min(max(burst_bytes + bandwidth_bps / 8.0 * 0.1, _MIN_LIMIT), _MAX_LIMIT))


def _which(tool: str) -> str | None:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(("/usr/sbin", "/sbin", "/usr/bin", "/bin"))
    return shutil.which(tool, path=path)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``argv`` (its tool found by :func:`_which`); EmulationError unless it succeeds (with ``check``)."""
    argv = [_which(argv[0]) or argv[0], *argv[1:]]
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise EmulationUnavailableError(f"cannot run {argv[0]!r}: {e}. {_NO_EMULATION_HINT}") from None
    except subprocess.TimeoutExpired:
        raise EmulationError(f"command timed out after {_CMD_TIMEOUT_S:g} s: {' '.join(argv)}") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
        raise EmulationError(f"command failed (exit {proc.returncode}): {' '.join(argv)}: {msg}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["tc", *args], check=check)


def _list_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _list_links() -> list[str]:
    names = []
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


_probe_lock = threading.Lock()
_probe_ok = False


def check_emulation_available() -> None:
    """Raise :class:`EmulationUnavailableError` unless emulated networks can be built here: Linux, root,
    ``ip`` and ``tc`` found, and a probe in a throw-away namespace (veth, bridge, ``tbf``) succeeds; a
    success is remembered for the process. Every message ends with how to run without emulation."""
    global _probe_ok

    def fail(reason: str) -> None:
        raise EmulationUnavailableError(f"network emulation is not available here: {reason}. {_NO_EMULATION_HINT}")

    if not sys.platform.startswith("linux"):
        fail(f"it needs Linux network namespaces, and this is {sys.platform}")
    if not _is_root():
        fail("it needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN to create network namespaces, veth links, a bridge "
             f"and tc qdiscs), and this process runs as uid {os.geteuid() if hasattr(os, 'geteuid') else '?'}; "
             "run as root (e.g. sudo) or in a container started with --cap-add NET_ADMIN --cap-add SYS_ADMIN")
    missing = [tool for tool in ("ip", "tc") if _which(tool) is None]
    if missing:
        fail(f"{' and '.join(repr(t) for t in missing)} not found; install iproute2 (apt-get install iproute2)")
    with _probe_lock:
        if _probe_ok:
            return
        name = f"{DEFAULT_PREFIX}probe{os.getpid()}"
        steps = [
            ("create a network namespace", ["ip", "netns", "add", name]),
            ("create a veth pair", ["ip", "-n", name, "link", "add", "pa", "type", "veth", "peer", "name", "pb"]),
            ("create a bridge", ["ip", "-n", name, "link", "add", "pbr", "type", "bridge"]),
            ("add a tbf qdisc", ["tc", "-n", name, "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "1gbit",
                                 "burst", "64kb", "limit", "1mb"]),
        ]
        try:
            for what, argv in steps:
                proc = _run(argv, check=False)
                if proc.returncode != 0:
                    detail = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
                    fail(f"could not {what} ({' '.join(argv)}: {detail})")
            if not hasattr(os, "setns"):
                _libc_setns()  # raises when libc has no setns
        finally:
            if name in _list_namespaces():
                _ip("netns", "del", name, check=False)
        _probe_ok = True


def _libc_setns():
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if not hasattr(libc, "setns"):
        raise EmulationUnavailableError(f"this C library has no setns(2). {_NO_EMULATION_HINT}")
    fn = libc.setns
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def enter_namespace(name: str) -> None:
    """Move the calling thread (in a fresh process: the process) into network namespace ``name`` (an
    ``ip netns`` name or a path). Call it before opening any socket; threads started afterwards inherit it."""
    path = name if os.sep in name else os.path.join(_NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise EmulationError(f"cannot open network namespace {name!r} ({path}): {e.strerror}") from None
    try:
        if hasattr(os, "setns"):  # Python >= 3.12
            try:
                os.setns(fd, _CLONE_NEWNET)
            except OSError as e:
                raise EmulationError(f"setns into network namespace {name!r} failed: {e.strerror}") from None
        else:
            import ctypes

            if _libc_setns()(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise EmulationError(f"setns into network namespace {name!r} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def _state_dir() -> Path:
    override = os.environ.get(STATE_DIR_ENV, "").strip()
    candidates = (override,) if override else _DEFAULT_STATE_DIRS
    last: OSError | None = None
    for d in candidates:
        p = Path(d)
        try:
            p.mkdir(mode=0o755, parents=True, exist_ok=True)
            if os.access(p, os.W_OK):
                return p
        except OSError as e:
            last = e
    raise EmulationError(f"no writable directory for the emulated-network registry (tried {', '.join(candidates)}): "
                         f"{last}")


@contextlib.contextmanager
def _registry_lock() -> Iterator[Path]:
    import fcntl

    d = _state_dir()
    with open(d / ".lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield d
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _process_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks since boot


def _owner_alive(record: dict) -> bool:
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    start = _process_start_time(pid)
    return start is not None and start == record.get("start_time")


def _read_records(d: Path) -> list[tuple[Path, dict]]:
    records = []
    for f in sorted(d.glob("*.json")):
        try:
            records.append((f, json.loads(f.read_text())))
        except (OSError, ValueError):
            records.append((f, {}))
    return records


def _remove_objects(namespaces: Sequence[str], links: Sequence[str], bridge: str | None) -> list[str]:
    """Delete host-side links (which takes their peers along), namespaces and the bridge; return problems."""
    problems = []
    for kind, names, obj, listing in (("link", links, "link", _list_links),
                                      ("namespace", namespaces, "netns", _list_namespaces),
                                      ("bridge", [bridge] if bridge else [], "link", _list_links)):
        present = set(listing())
        for name in names:
            if name in present:
                proc = _ip(obj, "del", name, check=False)
                if proc.returncode != 0 and name in listing():
                    problems.append(f"{kind} {name}: {proc.stderr.strip()}")
    return problems


def cleanup_stale(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove what dead runs left behind (a run is dead when its registered process has exited); return the
    names removed. Namespaces and links named like ours that no live run registered are removed too."""
    if not _is_root():
        return []
    removed: list[str] = []
    pattern = re.compile(rf"^{re.escape(prefix)}([a-z0-9]+)-(b|\d+)$")  # <prefix><run id>-<rank or b>
    with _registry_lock() as d:
        live_ids = set()
        for f, rec in _read_records(d):
            if rec and _owner_alive(rec):
                live_ids.add(rec.get("run_id"))
                continue
            ns, links, br = rec.get("namespaces", []), rec.get("links", []), rec.get("bridge")
            present = set(_list_namespaces()) | set(_list_links())
            _remove_objects(ns, links, br)
            removed += [n for n in [*links, *ns, *([br] if br else [])] if n in present]
            with contextlib.suppress(OSError):
                f.unlink()
        orphan_links = [n for n in _list_links() if (m := pattern.match(n)) and m.group(1) not in live_ids]
        orphan_ns = [n for n in _list_namespaces() if (m := pattern.match(n)) and m.group(1) not in live_ids]
        if orphan_links or orphan_ns:
            veths = [n for n in orphan_links if not n.endswith("-b")]
            bridges = [n for n in orphan_links if n.endswith("-b")]
            _remove_objects(orphan_ns, veths, None)
            for br in bridges:
                _ip("link", "del", br, check=False)
            removed += [n for n in [*veths, *orphan_ns, *bridges] if n not in removed]
    return removed


_ROUTE_TYPES = {"unicast", "local", "broadcast", "multicast", "throw", "unreachable", "prohibit", "blackhole",
                "nat", "anycast"}


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in _ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"\binet\s+(\d+\.\d+\.\d+\.\d+/\d+)", line)
        if m:
            nets.append(ipaddress.ip_interface(m.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        dest = tokens[1] if tokens[0] in _ROUTE_TYPES and len(tokens) > 1 else tokens[0]
        if dest == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.ip_network(dest, strict=False))
    return nets


def _pick_subnet(taken: Sequence[ipaddress.IPv4Network], rng: random.Random) -> ipaddress.IPv4Network:
    for _ in range(2000):
        cand = ipaddress.ip_network(f"10.{rng.randint(16, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(cand.overlaps(n) for n in taken):
            return cand
    raise EmulationError("found no free 10.x.y.0/24 subnet for the emulated network (all candidates overlap "
                         "addresses or routes of this machine); pass subnet='A.B.C.0/24' explicitly")


_active_lock = threading.RLock()
_active: dict[int, "EmulatedNetwork"] = {}
_atexit_registered = False
_sigterm_installed = False


def _teardown_all_active() -> None:
    with _active_lock:  # only this process's own networks (a forked child inherits the table, not the networks)
        nets = [net for net in _active.values() if net._owner_pid == os.getpid()]
    for net in nets:
        with contextlib.suppress(Exception):
            net.close()


def _on_sigterm(signum, frame) -> None:  # pragma: no cover - exercised in a subprocess by the tests
    _teardown_all_active()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _activate(net: "EmulatedNetwork") -> None:
    global _atexit_registered, _sigterm_installed
    with _active_lock:
        _active[id(net)] = net
        if not _atexit_registered:
            atexit.register(_teardown_all_active)
            _atexit_registered = True
        if not _sigterm_installed and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                    signal.signal(signal.SIGTERM, _on_sigterm)
                    _sigterm_installed = True


def _deactivate(net: "EmulatedNetwork") -> None:
    global _sigterm_installed
    with _active_lock:
        _active.pop(id(net), None)
        if not _active and _sigterm_installed and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _sigterm_installed = False


class EmulatedNetwork:
    """``world_size`` network namespaces joined by a bridge, each rank's link shaped to ``bandwidth``.

    ``with EmulatedNetwork(3, bandwidth="1gbit") as net:`` creates the bridge ``net.bridge`` at
    ``net.master_address``, the namespaces ``net.namespaces[r]`` with interface ``net.interface`` at
    ``net.rank_addresses[r]``, and ``tbf`` qdiscs on both directions of every link; checks TCP reachability
    (``verify``) and removes everything on exit. ``burst_bytes``/``limit_bytes`` default to
    :func:`default_burst_bytes`/:func:`default_limit_bytes`; ``run_id``: 1-8 lowercase letters/digits
    (random by default); ``subnet``: IPv4 with room for ``world_size + 1`` hosts (a free 10.x.y.0/24 by
    default); ``prefix``: 1-3 letters; ``mtu``: of the veth links (default 1500)."""

    def __init__(self, world_size: int, bandwidth: str | float = "1gbit", burst_bytes: int | None = None,
                 limit_bytes: int | None = None, run_id: str | None = None, *, subnet: str | None = None,
                 prefix: str = DEFAULT_PREFIX, mtu: int | None = None, verify: bool = True):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if not re.fullmatch(r"[a-z]{1,3}", prefix or ""):
            raise ValueError(f"prefix must be 1-3 lowercase letters, got {prefix!r}")
        if run_id is not None and not re.fullmatch(r"[a-z0-9]{1,8}", str(run_id)):
            raise ValueError(f"run_id must be 1-8 lowercase letters or digits, got {run_id!r}")
        self.world_size = world_size
        self.bandwidth_bps = parse_bandwidth(bandwidth, emulated=True)
        for label, value in (("burst_bytes", burst_bytes), ("limit_bytes", limit_bytes), ("mtu", mtu)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if mtu is not None and not 68 <= mtu <= 65535:
            raise ValueError(f"mtu must be in 68..65535, got {mtu}")
        self.mtu = mtu
        self.burst_bytes = int(burst_bytes) if burst_bytes is not None else default_burst_bytes(self.bandwidth_bps)
        if self.burst_bytes < (mtu or 1500) + 14:
            raise ValueError(f"burst_bytes={self.burst_bytes} is smaller than one frame ({(mtu or 1500) + 14} bytes); "
                             "tbf could never send a full-size packet")
        self.limit_bytes = (int(limit_bytes) if limit_bytes is not None
                            else default_limit_bytes(self.bandwidth_bps, self.burst_bytes))
        self.prefix = prefix
        self._requested_run_id = run_id
        self._requested_subnet = None
        if subnet is not None:
            try:
                net = ipaddress.ip_network(subnet, strict=False)
            except ValueError as e:
                raise ValueError(f"invalid subnet {subnet!r}: {e}") from None
            if net.version != 4 or net.num_addresses - 2 < world_size + 1:
                raise ValueError(f"subnet {subnet!r} must be IPv4 with room for {world_size + 1} hosts")
            self._requested_subnet = net
        if world_size + 1 > 254 and subnet is None:
            raise ValueError(f"world_size={world_size} does not fit a /24; pass a larger subnet")
        self.verify = verify
        self.interface = NAMESPACE_INTERFACE
        self.run_id: str | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge: str | None = None
        self.namespaces: list[str] = []
        self.host_links: list[str] = []
        self.rank_addresses: list[str] = []
        self.master_address: str | None = None
        self._record_path: Path | None = None
        self._state = "new"
        self._owner_pid = os.getpid()
        self._close_lock = threading.RLock()

    @property
    def bandwidth(self) -> str:
        """The bandwidth as a tc-style rate (``"1gbit"``)."""
        return format_bandwidth(self.bandwidth_bps)

    def _names(self, run_id: str) -> tuple[str, list[str], list[str]]:
        base = f"{self.prefix}{run_id}"
        bridge = f"{base}-b"
        links = [f"{base}-{r}" for r in range(self.world_size)]
        if max(len(bridge), *(len(n) for n in links)) > _IFNAMSIZ:
            raise ValueError(f"interface names for run id {run_id!r} and {self.world_size} ranks exceed "
                             f"{_IFNAMSIZ} characters; use a shorter run_id or prefix")
        return bridge, links, list(links)  # namespaces share the link names (separate name spaces)

    def __repr__(self) -> str:
        return (f"EmulatedNetwork(world_size={self.world_size}, bandwidth={self.bandwidth!r}, run_id={self.run_id!r}, "
                f"subnet={str(self.subnet) if self.subnet else None!r}, state={self._state!r})")

    def __enter__(self) -> "EmulatedNetwork":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open(self) -> "EmulatedNetwork":
        """Create the network (as ``with`` does); on any failure remove what was made and raise."""
        if self._state != "new":
            raise EmulationError(f"an EmulatedNetwork can be opened once; this one is {self._state}")
        check_emulation_available()
        self._owner_pid = os.getpid()
        cleanup_stale(self.prefix)
        self._claim()
        self._state = "open"
        _activate(self)
        try:
            self._create()
            if self.verify:
                self.check_connectivity()
        except BaseException:
            self.close()
            raise
        return self

    def _claim(self) -> None:
        """Pick and record the run id and subnet under the registry lock, before creating anything."""
        rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        with _registry_lock() as d:
            records = [rec for _f, rec in _read_records(d)]
            live = [rec for rec in records if _owner_alive(rec)]
            existing = set(_list_links()) | set(_list_namespaces())
            taken_ids = {rec.get("run_id") for rec in records}
            if self._requested_run_id is not None:
                run_id = self._requested_run_id
                bridge, links, namespaces = self._names(run_id)
                if run_id in taken_ids or existing & {bridge, *links}:
                    raise EmulationError(f"run id {run_id!r} is in use by another emulated network")
            else:
                for _ in range(100):
                    run_id = "".join(rng.choice("0123456789abcdef") for _ in range(6))
                    bridge, links, namespaces = self._names(run_id)
                    if run_id not in taken_ids and not existing & {bridge, *links}:
                        break
                else:  # pragma: no cover
                    raise EmulationError("could not find an unused run id")
            taken = _used_networks()
            for rec in live:
                with contextlib.suppress(ValueError, TypeError):
                    taken.append(ipaddress.ip_network(rec.get("subnet"), strict=False))
            if self._requested_subnet is not None:
                subnet = self._requested_subnet
                clash = [str(n) for n in taken if subnet.overlaps(n)]
                if clash:
                    raise EmulationError(f"subnet {subnet} overlaps networks in use here: {', '.join(clash)}")
            else:
                subnet = _pick_subnet(taken, rng)
            record = {"run_id": run_id, "prefix": self.prefix, "pid": os.getpid(),
                      "start_time": _process_start_time(os.getpid()), "subnet": str(subnet), "bridge": bridge,
                      "links": links, "namespaces": namespaces, "created": time.time()}
            path = d / f"{self.prefix}{run_id}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        hosts = list(subnet.hosts())
        self.run_id, self.subnet, self.bridge = run_id, subnet, bridge
        self.host_links, self.namespaces = links, namespaces
        self.master_address = str(hosts[0])
        self.rank_addresses = [str(h) for h in hosts[1:1 + self.world_size]]
        self._record_path = path

    def _tbf(self) -> list[str]:
        return ["root", "tbf", "rate", f"{int(round(self.bandwidth_bps))}bit", "burst", str(self.burst_bytes),
                "limit", str(self.limit_bytes)]

    def _create(self) -> None:
        plen = str(self.subnet.prefixlen)
        mtu = ["mtu", str(self.mtu)] if self.mtu else []
        _ip("link", "add", self.bridge, *mtu, "type", "bridge")
        _ip("addr", "add", f"{self.master_address}/{plen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for rank in range(self.world_size):
            ns, host = self.namespaces[rank], self.host_links[rank]
            _ip("netns", "add", ns)
            _ip("link", "add", host, *mtu, "type", "veth", "peer", "name", self.interface, *mtu, "netns", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.rank_addresses[rank]}/{plen}", "dev", self.interface)
            _ip("-n", ns, "link", "set", self.interface, "up")
            _ip("link", "set", host, "master", self.bridge)
            _ip("link", "set", host, "up")
            _tc("-n", ns, "qdisc", "replace", "dev", self.interface, *self._tbf())  # what the rank sends
            _tc("qdisc", "replace", "dev", host, *self._tbf())  # what the rank receives

    def close(self) -> None:
        """Remove everything this network made (what ``with`` does on exit); safe to call twice."""
        with self._close_lock:
            if self._state in ("new", "closing", "closed"):
                return
            self._state = "closing"
            problems = _remove_objects(self.namespaces, self.host_links, self.bridge)
            if not problems and self._record_path is not None:
                with contextlib.suppress(OSError):
                    self._record_path.unlink()
            self._state = "closed"
            _deactivate(self)
        if problems:
            raise EmulationError("could not remove all of emulated network " + str(self.run_id) + ": "
                                 + "; ".join(problems) + " (cleanup_stale() retries once this process has exited)")

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def rank_env(self, rank: int) -> dict[str, str]:
        """Environment for a rank in namespace ``rank``: gloo's interface and the emulated bandwidth."""
        return {"GLOO_SOCKET_IFNAME": self.interface, "REPRO_EMULATED_BANDWIDTH_BPS": repr(self.bandwidth_bps),
                "REPRO_EMULATED_NETNS": self.namespaces[rank]}

    def run_in(self, rank: int, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside rank ``rank``'s namespace (``ip netns exec``)."""
        return _ip("netns", "exec", self.namespaces[rank], *argv, check=check)

    def check_connectivity(self, timeout_s: float = 5.0) -> None:
        """TCP from every namespace to the bridge address and to the next rank's address, else EmulationError."""
        errors: list[str] = []

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((self.master_address, 0))
        listener.listen(self.world_size * 2)
        port = listener.getsockname()[1]
        accepted = threading.Event()

        def accept_all() -> None:
            listener.settimeout(timeout_s)
            with contextlib.suppress(OSError):
                for _ in range(self.world_size):
                    conn, _ = listener.accept()
                    conn.close()
            accepted.set()

        def in_ns(rank: int, fn) -> None:
            try:
                enter_namespace(self.namespaces[rank])  # affects this thread only
                fn()
            except Exception as e:  # noqa: BLE001
                errors.append(f"rank {rank}: {type(e).__name__}: {e}")
                if ring_ready is not None:
                    ring_ready.abort()

        def to_bridge(rank: int) -> None:
            socket.create_connection((self.master_address, port), timeout=timeout_s).close()

        ring_ports: dict[int, int] = {}
        ring_ready = threading.Barrier(self.world_size, timeout=timeout_s) if self.world_size > 1 else None

        def ring(rank: int) -> None:
            srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                srv.bind((self.rank_addresses[rank], 0))
                srv.listen(1)
                srv.settimeout(timeout_s)
                ring_ports[rank] = srv.getsockname()[1]
                ring_ready.wait()
                nxt = (rank + 1) % self.world_size
                with socket.create_connection((self.rank_addresses[nxt], ring_ports[nxt]), timeout=timeout_s):
                    conn, _ = srv.accept()
                    conn.close()
            finally:
                srv.close()

        try:
            threads = [threading.Thread(target=accept_all, daemon=True)]
            for r in range(self.world_size):
                threads.append(threading.Thread(target=in_ns, args=(r, lambda r=r: to_bridge(r)), daemon=True))
                if ring_ready is not None:
                    threads.append(threading.Thread(target=in_ns, args=(r, lambda r=r: ring(r)), daemon=True))
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout_s * 3)
        finally:
            listener.close()
        if errors:
            raise EmulationError(
                "the emulated network does not carry TCP as expected (a firewall on bridged traffic? check "
                "iptables FORWARD rules / net.bridge.bridge-nf-call-iptables): " + "; ".join(sorted(errors)))
