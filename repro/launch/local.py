"""The local launcher: :func:`launch_local` starts the ranks of a run on this machine and watches them.

The per-rank set-up shared with torchrun (:class:`DistContext`, :func:`init_distributed`, ...) lives in
:mod:`repro.launch.torchrun` and is re-exported here. Torch is imported only inside functions, so a
spawned rank sets its threads and environment (and enters its network namespace) before torch loads."""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from repro.log import get_logger
from repro.launch.torchrun import (
    DEFAULT_ROLE, SUPPORTED_BACKENDS, DistContext, DistributedSetupError, check_timeout_s, distributed,
    init_distributed, shutdown_distributed, torchrun_command, is_comm_error)

log = get_logger(__name__)

__all__ = ["DistContext", "DistributedSetupError", "LaunchTimeoutError", "RankFailedError", "Role",
           "SUPPORTED_BACKENDS", "available_memory_bytes", "distributed", "init_distributed", "launch_local",
           "max_local_ranks", "shutdown_distributed", "torchrun_command"]

# After the first failure, wait this long for the other ranks' reports (so that the root cause, not a
# peer's "connection closed", is reported), then terminate the rest.
_FAILURE_GRACE_S = 0.5
_KILL_GRACE_S = 3.0  # between SIGTERM and SIGKILL
_PARENT_POLL_S = 1.0  # how often a rank checks that its launcher is alive (besides PR_SET_PDEATHSIG)
# What one rank costs at least (max_local_ranks): a spawned CPU rank with torch and a gloo group, in
# private memory and threads.
RANK_MEMORY_BYTES = 320 * 2**20
RANK_TASKS = 16


class RankFailedError(RuntimeError):
    """A rank of :func:`launch_local` raised or died.

    The first line says which rank and how (``rank 1 of 2 failed: ValueError: boom``, ``rank 0 of 2 died
    with exit code -9 (SIGKILL) ...``; with roles: ``rank 2 of 3 (role worker, 1 of 2) failed: ...``); the
    rank's traceback follows. Attributes: ``rank``, ``world_size``, ``role``, ``role_rank``, ``exc_type``
    (None when the rank died without raising), ``exitcode``, ``rank_traceback`` and ``other_failures``
    (first lines of further ranks that failed within the same half second)."""

    def __init__(self, message: str, *, rank: int | None = None, world_size: int | None = None,
                 exc_type: str | None = None, exitcode: int | None = None, rank_traceback: str | None = None,
                 other_failures: Sequence[str] = (), role: str | None = None, role_rank: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.world_size = world_size
        self.role = role
        self.role_rank = role_rank
        self.exc_type = exc_type
        self.exitcode = exitcode
        self.rank_traceback = rank_traceback
        self.other_failures = tuple(other_failures)

    @property
    def traceback(self) -> str | None:
        """Alias of ``rank_traceback``."""
        return self.rank_traceback


class LaunchTimeoutError(TimeoutError):
    """:func:`launch_local` ran past ``timeout_s``; every rank was killed. ``unfinished``: ranks without a
    result; ``not_exited``: ranks that returned but had not exited; ``timeout_s``, ``world_size`` as given."""

    def __init__(self, message: str, *, unfinished: Sequence[int] = (), not_exited: Sequence[int] = (),
                 timeout_s: float | None = None, world_size: int | None = None):
        super().__init__(message)
        self.unfinished = tuple(unfinished)
        self.not_exited = tuple(not_exited)
        self.timeout_s = timeout_s
        self.world_size = world_size


@dataclass(frozen=True)
class Role:
    """``count`` ranks of a :func:`launch_local` run that each call ``fn(ctx, *args, **kwargs)`` (``fn`` at
    module level); ``name`` (non-empty, unique in a launch) is what they see in ``ctx.role``."""

    name: str
    fn: Callable
    count: int = 1
    args: Sequence = ()
    kwargs: Mapping | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip() or self.name != self.name.strip() \
                or "\n" in self.name or "\0" in self.name:
            raise ValueError(f"Role name must be a non-empty string without surrounding spaces, got {self.name!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"Role {self.name!r}: count must be a positive integer, got {self.count!r}")


def available_memory_bytes() -> int | None:
    """Memory this process could still use, bytes: ``MemAvailable``, lowered to the cgroup's limit minus its
    usage; None when neither can be read."""
    avail = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    if avail is None:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hier, controllers, path = line.split(":", 2)
            if hier == "0" and controllers == "":  # cgroup v2
                base = Path("/sys/fs/cgroup") / path.lstrip("/")
                files = ("memory.max", "memory.current")
            elif "memory" in controllers.split(","):  # cgroup v1
                base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
                if not base.is_dir():  # a cgroup namespace shows its own root
                    base = Path("/sys/fs/cgroup/memory")
                files = ("memory.limit_in_bytes", "memory.usage_in_bytes")
            else:
                continue
            with contextlib.suppress(OSError, ValueError):
                limit_text = (base / files[0]).read_text().strip()
                if limit_text != "max" and int(limit_text) < 2**60:
                    room = int(limit_text) - int((base / files[1]).read_text().strip())
                    avail = max(0, room) if avail is None else max(0, min(avail, room))
    return avail


def _free_task_slots() -> int | None:
    """How many more processes/threads the kernel (pid_max, threads-max) and RLIMIT_NPROC allow."""
    caps = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
        for name in ("pid_max", "threads-max"):
            with contextlib.suppress(OSError, ValueError):
                caps.append(int(Path(f"/proc/sys/kernel/{name}").read_text()) - running)
        with contextlib.suppress(ImportError, OSError, ValueError):
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
            if soft != resource.RLIM_INFINITY:
                caps.append(soft - running)
    return max(0, min(caps)) if caps else None


def max_local_ranks() -> tuple[int, str]:
    """How many ranks :func:`launch_local` may start here now, and how that was derived: the smaller of
    available memory / :data:`RANK_MEMORY_BYTES` and free process slots / :data:`RANK_TASKS`; at least 1.
    A ceiling against runaway values, not a promise that a workload fits."""
    limits, reasons = [], []
    avail = available_memory_bytes()
    if avail is not None:
        limits.append(avail // RANK_MEMORY_BYTES)
        reasons.append(f"{avail / 2**30:.1f} GiB available memory / about {RANK_MEMORY_BYTES // 2**20} MiB per rank "
                       f"= {limits[-1]}")
    slots = _free_task_slots()
    if slots is not None:
        limits.append(slots // RANK_TASKS)
        reasons.append(f"{slots} free process slots / {RANK_TASKS} per rank = {limits[-1]}")
    if not limits:
        return sys.maxsize, "no memory or process limit could be read"
    return max(1, min(limits)), "; ".join(reasons)


def _pack_target(fn: Callable, args: Sequence, kwargs: Mapping | None, what: str = "fn") -> tuple[bytes, bytes]:
    """Pickle ``fn`` (by reference) and its arguments, with a clear TypeError when the ranks could not import
    it; ``what`` names the function in messages."""
    if not callable(fn):
        raise TypeError(f"launch_local: {what} must be callable, got {type(fn).__name__}")
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    module, qualname = getattr(inner, "__module__", None), getattr(inner, "__qualname__", None)
    advice = ("launch_local runs fn in freshly spawned processes, which import it by name: define it with "
              "`def` at the top level of an importable .py module and import it from there")
    if qualname and "<lambda>" in qualname:
        raise TypeError(f"launch_local: {what} is a lambda ({qualname}), which cannot be imported by the ranks; "
                        f"{advice}")
    if qualname and "<locals>" in qualname:
        raise TypeError(
            f"launch_local: {what} {qualname} is a nested function or closure, which cannot be imported by the "
            f"ranks; {advice}")
    if module == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None):
        raise TypeError(
            f"launch_local: {what} {qualname} is defined in an interactive session or notebook (module __main__ "
            f"has no file), which the ranks cannot import; {advice}")
    try:
        fn_bytes = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"launch_local: {what} {qualname or fn!r} cannot be sent to the ranks ({e}); {advice}") from e
    where = "" if what == "fn" else f" of {what.rsplit(' ', 1)[0]}"
    try:
        arg_bytes = pickle.dumps((tuple(args), dict(kwargs or {})), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"launch_local: args/kwargs{where} cannot be pickled to send them to the ranks: {e}") from e
    return fn_bytes, arg_bytes


def _start_store(master_addr: str, world_size: int):
    """Host the rendezvous TCPStore in the launcher on ``master_addr`` only; (store, address, port).

    A TCPStore server binds every interface by itself, so the launcher binds a socket on (``master_addr``,
    0) (no free-port race) and hands the store a duplicate of it (``master_listen_fd``; libuv server first,
    then the older one). The ranks join as clients (``TORCHELASTIC_USE_AGENT_STORE``, as under torchrun), so
    the store outlives any rank that finishes early."""
    from torch.distributed import TCPStore

    try:
        family, _type, _proto, _name, sockaddr = socket.getaddrinfo(master_addr, 0, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, IndexError) as e:
        raise DistributedSetupError(f"master_addr {master_addr!r} cannot be resolved: {e}") from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(sockaddr)
            sock.listen(max(128, world_size))
        except OSError as e:
            raise DistributedSetupError(f"cannot listen on {master_addr} for the rendezvous store: {e}") from None
        host, port = sock.getsockname()[:2]
        errors = []
        for use_libuv in (True, False):
            fd = os.dup(sock.fileno())
            try:
                store = TCPStore(host, port, world_size, True, timeout=timedelta(seconds=60), wait_for_workers=False,
                                 master_listen_fd=fd, use_libuv=use_libuv)
            except Exception as e:  # noqa: BLE001 - the other server implementation is tried next
                with contextlib.suppress(OSError):
                    os.close(fd)
                errors.append(f"{type(e).__name__}: {e}")
                continue
            return store, host, int(port)
    raise DistributedSetupError(f"cannot host the rendezvous store on {master_addr}: {'; '.join(errors)}")


def _signal_name(code: int | None) -> str:
    with contextlib.suppress(ValueError):  # a number that names no signal: nothing
        if code is not None and code < 0:
            return f" ({signal.Signals(-code).name})"
    return ""


@dataclass
class _Failure:
    rank: int
    priority: int  # 0: raised, 1: died / vanished, 2: communication error (likely a consequence)
    headline: str
    when: float
    exc_type: str | None = None
    exitcode: int | None = None
    tb: str | None = None


@dataclass
class _Supervisor:
    procs: list
    conns: list
    world_size: int
    labels: list                                 # "rank 2 of 3" or "rank 2 of 3 (role worker, 1 of 2)"
    roles: list                                  # (role, role_rank) per rank
    results: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    awaiting: set = field(default_factory=set)   # ranks whose pipe may still carry a message
    running: set = field(default_factory=set)    # ranks whose process has not been seen to exit
    failed_ranks: set = field(default_factory=set)

    def read(self, rank: int) -> None:
        self.awaiting.discard(rank)  # a rank sends one message at most
        try:
            msg = self.conns[rank].recv()
        except EOFError:
            return
        except Exception as e:  # the result could not be unpickled here
            self._fail(_Failure(rank, 0, f"{self.labels[rank]} failed: its result could not be "
                                f"unpickled in the launcher: {type(e).__name__}: {e}", time.time(),
                                exc_type=type(e).__name__))
            return
        if msg[0] == "ok":
            self.results[rank] = msg[1]
        else:
            info = msg[1]
            first = f"{info['type']}: {info['message']}" if info["message"] else info["type"]
            self._fail(_Failure(rank, 2 if info["comm"] else 0,
                                f"{self.labels[rank]} failed: {first}", info["time"],
                                exc_type=info["type"], tb=info["traceback"]))

    def exited(self, rank: int) -> None:
        self.running.discard(rank)
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        # Everything the rank sent before exiting is in the pipe now.
        if rank in self.awaiting:
            if self.conns[rank].poll(0):
                self.read(rank)
            self.awaiting.discard(rank)
        if rank in self.failed_ranks:
            return
        code = proc.exitcode
        if code != 0:
            after = "after returning its result" if rank in self.results else "without reporting an error"
            self._fail(_Failure(rank, 1, f"{self.labels[rank]} died with exit code {code}"
                                f"{_signal_name(code)} {after}", time.time(), exitcode=code))
        elif rank not in self.results:
            self._fail(_Failure(rank, 1, f"{self.labels[rank]} exited with code 0 without "
                                "returning a result (os._exit?)", time.time(), exitcode=code))

    def _fail(self, failure: _Failure) -> None:
        self.failed_ranks.add(failure.rank)
        self.failures.append(failure)

    def error(self) -> RankFailedError:
        ordered = sorted(self.failures, key=lambda f: (f.priority, f.when, f.rank))
        main, others = ordered[0], ordered[1:]
        lines = [main.headline]
        if main.tb:
            lines.append(f"--- traceback of rank {main.rank} ---")
            lines.append(main.tb.rstrip("\n"))
        if others:
            lines.append("--- other ranks ---")
            lines.extend(f.headline for f in others)
        role, role_rank = self.roles[main.rank]
        return RankFailedError("\n".join(lines), rank=main.rank, world_size=self.world_size,
                               exc_type=main.exc_type, exitcode=main.exitcode, rank_traceback=main.tb,
                               other_failures=[f.headline for f in others], role=role, role_rank=role_rank)


def _terminate(procs: list, grace_s: float = _KILL_GRACE_S) -> None:
    """SIGTERM every live process, SIGKILL what is left after ``grace_s``, and reap them all."""
    from multiprocessing.connection import wait

    alive = [p for p in procs if p.exitcode is None]
    for p in alive:
        with contextlib.suppress(Exception):
            p.terminate()
    deadline = time.monotonic() + grace_s
    while True:
        alive = [p for p in alive if p.exitcode is None]
        left = deadline - time.monotonic()
        if not alive or left <= 0:
            break
        wait([p.sentinel for p in alive], timeout=left)
    for p in alive:
        with contextlib.suppress(Exception):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=5.0)
        if p.exitcode is not None:
            with contextlib.suppress(Exception):
                p.close()


def launch_local(fn: Callable | None = None, world_size: int | None = None, *, roles: Sequence[Role] | None = None,
                 args: Sequence = (), kwargs: Mapping | None = None,
                 backend: str | None = "gloo", timeout_s: float = 600.0, pg_timeout_s: float = 60.0,
                 threads_per_rank: int = 1, env: Mapping[str, Any] | None = None,
                 master_addr: str = "127.0.0.1", quiet: bool = False,
                 emulate_bandwidth: str | float | None = None, emulate_burst_bytes: int | None = None) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` local ranks and return their results in rank order.

    ``roles=[Role("server", serve), Role("worker", work, 4, args=(...))]`` instead of
    ``fn``/``world_size``/ ``args``/``kwargs`` gives the ranks to the roles in order, in one process group;
    each rank sees ``ctx.role``, ``ctx.role_rank`` and ``ctx.role_world_size`` (and ``ROLE_*`` variables, as
    under torchrun).

    Each rank is a ``spawn`` process with torchrun's variables, ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` =
    ``threads_per_rank`` and ``env`` (the launcher's variables win); it calls :func:`init_distributed` with
    ``backend`` (None: automatic) and ``pg_timeout_s`` and sends back its function's picklable result.
    Refused before any rank starts: a function the ranks cannot import (lambda, closure, notebook function:
    TypeError), timeouts that are not finite positive seconds, more ranks than :func:`max_local_ranks`
    (ValueError), nccl without CUDA or a GPU per rank (:class:`DistributedSetupError`).

    Failures end within a bounded time, every rank reaped: a rank raises or dies →
    :class:`RankFailedError`; ``timeout_s`` (seconds, start-up included) passes → :class:`LaunchTimeoutError`;
    KeyboardInterrupt → the ranks are killed and it is re-raised. Remaining ranks get SIGTERM, then SIGKILL
    after 3 s; a rank whose launcher dies is killed too. ``quiet`` discards the ranks' stdout.

    ``emulate_bandwidth`` (a tc rate or bits per second) runs each rank in its own network namespace on
    links shaped to that rate (:class:`repro.launch.netns.EmulatedNetwork`, bucket ``emulate_burst_bytes``);
    the store then listens on the bridge, not ``master_addr``. Needs root, ``ip`` and ``tc``, else
    :class:`repro.launch.netns.EmulationUnavailableError` before anything starts."""
    if roles is None:
        if fn is None or world_size is None:
            raise ValueError("launch_local: give either fn and world_size or roles=[Role(name, fn, count), ...]")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    else:
        if fn is not None or world_size is not None:
            raise ValueError("launch_local: give either fn and world_size or roles=[Role(name, fn, count), ...], "
                             "not both")
        if tuple(args) or kwargs:
            raise ValueError("launch_local: with roles, args and kwargs belong to each Role")
        roles = list(roles)
        if not roles:
            raise ValueError("launch_local: roles needs at least one Role")
        seen = set()
        for role in roles:
            if not isinstance(role, Role):
                raise TypeError(f"launch_local: roles must be Role objects, got {type(role).__name__}")
            if role.name in seen:
                raise ValueError(f"launch_local: duplicate role name {role.name!r}")
            seen.add(role.name)
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be a positive integer, got {threads_per_rank!r}")
    timeout_s = check_timeout_s("timeout_s", timeout_s)
    pg_timeout_s = check_timeout_s("pg_timeout_s", pg_timeout_s)
    if backend is not None and str(backend).lower() not in SUPPORTED_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(SUPPORTED_BACKENDS)} or None")
    named_roles = roles is not None
    if not named_roles:
        roles = [Role(DEFAULT_ROLE, fn, world_size, args, kwargs)]
        payloads = [_pack_target(fn, args, kwargs)]
    else:
        payloads = [_pack_target(role.fn, role.args, role.kwargs, what=f"role {role.name!r} fn") for role in roles]
        world_size = sum(role.count for role in roles)
    limit, why = max_local_ranks()  # before anything per rank is built
    if world_size > limit:
        raise ValueError(f"world_size {world_size} is more than this machine can run: at most {limit} ranks ({why})")
    _check_backend_devices(backend, world_size)
    ranks = [(payload, role.name, i, role.count) for role, payload in zip(roles, payloads) for i in range(role.count)]
    labels = [f"rank {r} of {world_size}" + (f" (role {name}, {i} of {count})" if named_roles else "")
              for r, (_p, name, i, count) in enumerate(ranks)]
    common = dict(backend=backend, pg_timeout_s=pg_timeout_s, threads_per_rank=threads_per_rank, env=env,
                  quiet=quiet, labels=labels, named_roles=named_roles)
    if emulate_bandwidth is None:
        if emulate_burst_bytes is not None:
            raise ValueError("emulate_burst_bytes is only used with emulate_bandwidth")
        return _launch(ranks, timeout_s=timeout_s, master_addr=master_addr, **common)

    from repro.launch import netns as netem

    bandwidth_bps = netem.parse_bandwidth(emulate_bandwidth)  # ValueError before anything is created
    netem.check_emulation_available()
    start = time.monotonic()
    log.info("emulating %s links for %d ranks (network namespaces, tc tbf)", emulate_bandwidth, world_size)
    with netem.EmulatedNetwork(world_size, bandwidth=bandwidth_bps, burst_bytes=emulate_burst_bytes) as net:
        timeout_left = timeout_s - (time.monotonic() - start)
        if timeout_left <= 0:
            raise LaunchTimeoutError(f"launch_local timed out after {timeout_s:g} s while setting up the emulated "
                                     "network", unfinished=range(world_size), timeout_s=timeout_s,
                                     world_size=world_size)
        rank_env = [net.rank_env(r) for r in range(world_size)]
        return _launch(ranks, timeout_s=timeout_left, master_addr=net.master_address,
                       namespaces=list(net.namespaces), rank_env=rank_env, reported_timeout_s=timeout_s, **common)


def _check_backend_devices(backend: str | None, world_size: int) -> None:
    """NCCL (asked for, or automatic with CUDA) needs CUDA and one GPU per rank."""
    if backend is not None and str(backend).lower() != "nccl":
        return
    import torch

    cuda = torch.cuda.is_available()
    if backend is None and not cuda:
        return  # automatic: gloo on the CPU
    if not cuda:
        raise DistributedSetupError(
            "backend 'nccl' needs CUDA, but torch.cuda.is_available() is False on this machine; use backend "
            "'gloo' (or leave the backend to the automatic choice) to run the ranks on the CPU")
    count = torch.cuda.device_count()
    if world_size > count:
        chosen = "backend 'nccl'" if backend is not None else "the automatic backend (nccl, as CUDA is available)"
        raise DistributedSetupError(
            f"{chosen} needs one GPU per rank, but {world_size} ranks were asked for and {count} GPU(s) are "
            "visible; start at most that many ranks or use backend 'gloo'")


def _launch(ranks: Sequence[tuple[tuple[bytes, bytes], str, int, int]], *, backend: str | None, timeout_s: float,
            pg_timeout_s: float, threads_per_rank: int, env: Mapping[str, Any] | None, master_addr: str,
            quiet: bool, labels: Sequence[str], named_roles: bool, namespaces: Sequence[str] | None = None,
            rank_env: Sequence[Mapping[str, str]] | None = None, reported_timeout_s: float | None = None) -> list:
    """:func:`launch_local` once its arguments are checked; ``ranks[r]`` = (pickled function and arguments,
    role, rank within the role, ranks in the role)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    world_size = len(ranks)
    log.info("starting %d rank(s) (backend %s, timeout %g s)", world_size, backend or "auto", timeout_s)
    reported_timeout_s = reported_timeout_s or timeout_s
    start = time.monotonic()
    deadline = start + timeout_s
    store, master_host, port = _start_store(master_addr, world_size)
    base_env = {"OMP_NUM_THREADS": str(threads_per_rank), "MKL_NUM_THREADS": str(threads_per_rank)}
    base_env.update({str(k): str(v) for k, v in (env or {}).items()})
    base_env.update({
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_host,
        "MASTER_PORT": str(port),
        # With the store hosted here every rank is a client, as under torchrun's agent.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    })

    ctx = mp.get_context("spawn")
    procs: list = []
    conns: list = []
    try:
        for rank, (payload, role, role_rank, role_count) in enumerate(ranks):
            reader, writer = ctx.Pipe(duplex=False)
            conns.append(reader)
            this_env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_NAME=role,
                            ROLE_RANK=str(role_rank), ROLE_WORLD_SIZE=str(role_count))
            if rank_env is not None:
                this_env.update(rank_env[rank])
            netns = namespaces[rank] if namespaces is not None else None
            proc = ctx.Process(
                target=_rank_main, name=f"repro-rank-{rank}",
                args=(rank, payload, writer, this_env, os.getpid(), backend, pg_timeout_s, threads_per_rank, quiet,
                      netns),
            )
            proc.start()
            procs.append(proc)
            writer.close()

        sup = _Supervisor(procs, conns, world_size, list(labels), [(r[1], r[2]) for r in ranks],
                          awaiting=set(range(world_size)), running=set(range(world_size)))
        conn_rank = {conns[r]: r for r in range(world_size)}
        sentinel_rank = {procs[r].sentinel: r for r in range(world_size)}
        first_failure = None
        while True:
            now = time.monotonic()
            if sup.failures:
                if first_failure is None:
                    first_failure = now
                if not sup.running or now >= first_failure + _FAILURE_GRACE_S:
                    break
                until = first_failure + _FAILURE_GRACE_S
            else:
                if not sup.running:
                    break
                if now >= deadline:
                    unfinished = sorted(set(range(world_size)) - set(sup.results))
                    not_exited = sorted(r for r in sup.running if r in sup.results)
                    msg = (f"launch_local timed out after {reported_timeout_s:g} s: rank(s) {unfinished} of "
                           f"{world_size} had not finished")
                    if named_roles:
                        msg += " (" + "; ".join(f"rank {r}: role {ranks[r][1]}, {ranks[r][2]} of {ranks[r][3]}"
                                                for r in unfinished) + ")"
                    if not_exited:
                        msg += f"; rank(s) {not_exited} returned but had not exited"
                    msg += "; all ranks were killed"
                    raise LaunchTimeoutError(msg, unfinished=unfinished, not_exited=not_exited,
                                             timeout_s=reported_timeout_s, world_size=world_size)
                until = deadline
            watch = [conns[r] for r in sup.awaiting] + [procs[r].sentinel for r in sup.running]
            ready = wait(watch, timeout=max(0.0, until - now))
            for obj in ready:  # messages first: a rank's report beats its exit code
                if obj in conn_rank and conn_rank[obj] in sup.awaiting:
                    sup.read(conn_rank[obj])
            for obj in ready:
                if not hasattr(obj, "recv") and obj in sentinel_rank:
                    sup.exited(sentinel_rank[obj])
        if sup.failures:
            raise sup.error()
        return [sup.results[r] for r in range(world_size)]
    finally:
        _terminate(procs)
        for c in conns:
            with contextlib.suppress(Exception):
                c.close()
        del store


def _watch_parent(parent_pid: int) -> None:
    """Die with the launcher: PR_SET_PDEATHSIG where available, plus a polling thread everywhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))
    if os.getppid() != parent_pid:  # the launcher died before the line above
        os._exit(70)

    def poll() -> None:
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent_pid:
                os._exit(70)

    threading.Thread(target=poll, name="repro-parent-watch", daemon=True).start()


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _exit_rank(code: int) -> None:
    """Leave the rank without interpreter teardown (a process group's destructors can block or abort with a
    dead peer), but run multiprocessing's exit finalizers first: they unlink the rank's named semaphores,
    which the launcher's resource tracker would otherwise report as leaked."""
    with contextlib.suppress(Exception):
        from multiprocessing import util as mp_util

        mp_util._run_finalizers(0)
    _flush_std()
    os._exit(code)


def _report_failure(conn, exc: BaseException, comm: bool) -> None:
    """Send ``exc`` to the launcher and leave the rank with status 1 (no interpreter teardown)."""
    info = {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            "comm": comm, "time": time.time()}
    with contextlib.suppress(Exception):
        conn.send(("error", info))
        conn.close()
    _exit_rank(1)


def _rank_main(rank: int, payload: tuple[bytes, bytes], conn, env: dict, parent_pid: int, backend: str | None,
               pg_timeout_s: float, threads: int, quiet: bool, netns: str | None = None) -> None:
    if netns is not None:
        # First of all (before torch is imported or any socket opened, and before any thread starts, since
        # setns moves the calling thread only): join this rank's emulated network.
        try:
            from repro.launch.netns import enter_namespace

            enter_namespace(netns)
        except BaseException as exc:  # noqa: BLE001 - reported like any other failure of the rank
            _report_failure(conn, exc, comm=False)
    _watch_parent(parent_pid)
    os.environ.update(env)
    # tqdm gets a thread lock before it makes its own multiprocessing.RLock: a semaphore that a rank killed on a
    # timeout never unregisters, so the launcher's resource tracker would warn of a leak.
    with contextlib.suppress(ImportError):
        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
    if quiet:
        _flush_std()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    try:
        import torch

        torch.set_num_threads(threads)
        fn = pickle.loads(payload[0])
        args, kwargs = pickle.loads(payload[1])
        ctx = init_distributed(backend=backend, timeout_s=pg_timeout_s)
        value = fn(ctx, *args, **kwargs)
        try:
            data = pickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(f"the return value of fn ({type(value).__name__}) cannot be pickled to send it to "
                            f"the launcher: {e}") from e
        conn.send_bytes(data)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the launcher
        _report_failure(conn, exc, comm=is_comm_error(exc))
    conn.close()
    # The result is delivered. Wait for the peers, then leave without interpreter teardown: destroying
    # a gloo group (or its threads at exit) after a peer has gone can abort the process (SIGABRT,
    # "terminate called without an active exception"), which would turn a finished run into a failure.
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
    _exit_rank(0)
