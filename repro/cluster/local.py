"""Distributed plumbing shared by ``torchrun`` and the local launcher.

Two ways to start a data-parallel run, one per-rank code path:

* **A cluster or a multi-GPU box** — ``torchrun`` (``python -m torch.distributed.run``) starts one process
  per GPU and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; each
  process calls :func:`init_distributed` (or uses :func:`distributed` as a context manager).
  :func:`torchrun_command` builds such a command line.
* **This machine, from a notebook or a test** — :func:`launch_local` spawns ``world_size`` processes,
  sets the same variables, calls :func:`init_distributed` in each and runs a module-level function
  ``fn(ctx, *args, **kwargs)`` there; it returns the per-rank return values in rank order, or raises
  :class:`RankFailedError` / :class:`LaunchTimeoutError` within a bounded time when a rank raises,
  dies or hangs (the other ranks are killed; none is left behind).

Backend and device are chosen automatically — NCCL with one GPU per rank (``cuda:LOCAL_RANK``) when
CUDA is available, gloo on the CPU otherwise — and either can be forced.

Network interface: gloo picks the interface that the host name resolves to. To choose one, set
``GLOO_SOCKET_IFNAME`` (read by gloo itself) or ``REPRO_GLOO_IFNAME``; the latter is copied to
``GLOO_SOCKET_IFNAME`` by :func:`init_distributed` when that is unset, and is otherwise left to gloo.

Emulated networks: ``launch_local(..., emulate_bandwidth="1gbit")`` puts every rank in its own Linux
network namespace behind a bridge, with each rank's link shaped to that bandwidth in both directions
(:mod:`repro.cluster.netns`; needs root, ``ip`` and ``tc``), so the papers' 1-10 Gb/s regimes can be reproduced
on one machine.

This module imports torch only inside functions, so a spawned rank can set its thread count and
environment before torch is loaded.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shlex
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DistContext",
    "DistributedSetupError",
    "LaunchTimeoutError",
    "RankFailedError",
    "SUPPORTED_BACKENDS",
    "distributed",
    "init_distributed",
    "launch_local",
    "shutdown_distributed",
    "torchrun_command",
]

SUPPORTED_BACKENDS = ("gloo", "nccl")
_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_ENV_HINT = "start with torchrun or repro.cluster.local.launch_local"

# After the first failure, wait this long for the other ranks' reports (so that the root cause, not a
# peer's "connection closed", is the one reported), then terminate the rest.
_FAILURE_GRACE_S = 0.5
# Between SIGTERM and SIGKILL when terminating ranks.
_KILL_GRACE_S = 3.0
# How often a rank checks that its launcher is still alive (fallback to PR_SET_PDEATHSIG).
_PARENT_POLL_S = 1.0


# --------------------------------------------------------------------------------------------------
# Per-rank set-up (torchrun or launch_local)
# --------------------------------------------------------------------------------------------------


class DistributedSetupError(RuntimeError):
    """The process cannot join a process group as asked (missing environment, no CUDA for NCCL, ...)."""


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the default process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: "torch.device"
    is_main: bool


def _read_env() -> tuple[int, int, int, str, int]:
    missing = [name for name in _REQUIRED_ENV if not os.environ.get(name, "").strip()]
    if missing:
        which = ", ".join(missing)
        raise DistributedSetupError(
            f"environment variable{'s' if len(missing) > 1 else ''} {which} not set; {_ENV_HINT} "
            f"(they set {', '.join(_REQUIRED_ENV)})"
        )
    values = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        raw = os.environ[name].strip()
        try:
            values[name] = int(raw)
        except ValueError:
            raise DistributedSetupError(
                f"environment variable {name}={raw!r} is not an integer; {_ENV_HINT}"
            ) from None
    rank, world, local_rank, port = (values[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"))
    if world < 1:
        raise DistributedSetupError(f"WORLD_SIZE must be at least 1, got {world}")
    if not 0 <= rank < world:
        raise DistributedSetupError(f"RANK must be in [0, WORLD_SIZE={world}), got {rank}")
    if local_rank < 0:
        raise DistributedSetupError(f"LOCAL_RANK must be non-negative, got {local_rank}")
    if not 0 < port < 65536:
        raise DistributedSetupError(f"MASTER_PORT must be in 1..65535, got {port}")
    return rank, world, local_rank, os.environ["MASTER_ADDR"].strip(), port


def _choose_backend_device(backend: str | None, device: Any, local_rank: int) -> tuple[str, "torch.device"]:
    import torch
    import torch.distributed as dist

    if backend is not None:
        backend = str(backend).lower()
        if backend not in SUPPORTED_BACKENDS:
            raise ValueError(
                f"unknown backend {backend!r}; use one of {', '.join(SUPPORTED_BACKENDS)} "
                "(or None to choose automatically)"
            )
    cuda = torch.cuda.is_available()
    dev = None
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"invalid device {device!r}: {e}") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        if dev.type == "cuda":
            if not cuda:
                raise DistributedSetupError(
                    f"device {device!r} asked for, but CUDA is not available here "
                    "(torch.cuda.is_available() is False); use device='cpu' or None"
                )
            if dev.index is None:
                dev = torch.device("cuda", local_rank)
    if backend is None:
        backend = ("nccl" if dev.type == "cuda" else "gloo") if dev is not None else ("nccl" if cuda else "gloo")
    if backend == "nccl":
        if not cuda:
            raise DistributedSetupError(
                "backend 'nccl' needs CUDA, but torch.cuda.is_available() is False here; "
                "use backend='gloo' (or None to choose automatically) on a CPU machine"
            )
        if not dist.is_nccl_available():
            raise DistributedSetupError("backend 'nccl' asked for, but this torch build has no NCCL")
        if dev is None:
            dev = torch.device("cuda", local_rank)
        elif dev.type != "cuda":
            raise DistributedSetupError("backend 'nccl' communicates CUDA tensors only; use gloo for device 'cpu'")
    else:
        if not dist.is_gloo_available():
            raise DistributedSetupError("backend 'gloo' asked for, but this torch build has no gloo")
        if dev is None:
            dev = torch.device("cpu")
    if dev.type == "cuda":
        count = torch.cuda.device_count()
        if dev.index >= count:
            raise DistributedSetupError(
                f"device cuda:{dev.index} (LOCAL_RANK={local_rank}) does not exist: {count} GPU(s) visible; "
                "start at most one process per visible GPU on each node"
            )
    return backend, dev


def init_distributed(backend: str | None = None, device: Any = None, timeout_s: float = 300.0) -> DistContext:
    """Join the default process group of a process started by torchrun or :func:`launch_local`.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` from the environment.
    ``backend=None`` picks ``"nccl"`` when CUDA is available (device ``cuda:LOCAL_RANK``, made current with
    ``torch.cuda.set_device``) and ``"gloo"`` on the CPU otherwise; ``device=None`` follows the backend
    (``"cuda"`` without an index means ``cuda:LOCAL_RANK``). ``timeout_s`` bounds every collective and the
    rendezvous, so a rank whose peer crashed fails instead of waiting forever.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed support")
    if dist.is_initialized():
        raise DistributedSetupError(
            "the default process group is already initialised; call repro.cluster.local.shutdown_distributed() first"
        )
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    rank, world, local_rank, _addr, _port = _read_env()
    backend, dev = _choose_backend_device(backend, device, local_rank)

    ifname = os.environ.get("REPRO_GLOO_IFNAME", "").strip()
    if ifname and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = ifname

    kwargs: dict[str, Any] = {}
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend == "nccl":
        kwargs["device_id"] = dev  # binds the communicator to this rank's GPU (eager NCCL init)
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=dev,
                       is_main=rank == 0)


def shutdown_distributed() -> None:
    """Destroy the default process group if there is one; safe to call twice (or without torch)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return
    if dist.is_available() and dist.is_initialized():
        # Leave together: a gloo group torn down while a peer still works can abort at exit.
        with contextlib.suppress(Exception):
            dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(backend: str | None = None, device: Any = None, timeout_s: float = 300.0) -> Iterator[DistContext]:
    """``with distributed() as ctx:`` — :func:`init_distributed` on entry, :func:`shutdown_distributed` on exit."""
    ctx = init_distributed(backend=backend, device=device, timeout_s=timeout_s)
    try:
        yield ctx
    finally:
        shutdown_distributed()


# --------------------------------------------------------------------------------------------------
# Local launcher
# --------------------------------------------------------------------------------------------------


class RankFailedError(RuntimeError):
    """A rank of :func:`launch_local` raised or died.

    The message's first line says which rank and how (``rank 1 of 2 failed: ValueError: boom`` or
    ``rank 0 of 2 died with exit code -9 (SIGKILL) ...``); the rank's traceback follows. Attributes:
    ``rank``, ``world_size``, ``exc_type`` (name of the exception class, or None when the rank died without
    raising), ``exitcode`` (when it died), ``rank_traceback`` (the formatted traceback text, or None) and
    ``other_failures`` (first lines about further ranks that failed within the same half second).
    """

    def __init__(self, message: str, *, rank: int | None = None, world_size: int | None = None,
                 exc_type: str | None = None, exitcode: int | None = None, rank_traceback: str | None = None,
                 other_failures: Sequence[str] = ()):
        super().__init__(message)
        self.rank = rank
        self.world_size = world_size
        self.exc_type = exc_type
        self.exitcode = exitcode
        self.rank_traceback = rank_traceback
        self.other_failures = tuple(other_failures)

    @property
    def traceback(self) -> str | None:
        """Alias of ``rank_traceback``."""
        return self.rank_traceback


class LaunchTimeoutError(TimeoutError):
    """:func:`launch_local` ran past ``timeout_s``; every rank was killed.

    ``unfinished``: ranks that had not returned a result; ``not_exited``: ranks that returned but had
    not exited; ``timeout_s`` and ``world_size`` as given.
    """

    def __init__(self, message: str, *, unfinished: Sequence[int] = (), not_exited: Sequence[int] = (),
                 timeout_s: float | None = None, world_size: int | None = None):
        super().__init__(message)
        self.unfinished = tuple(unfinished)
        self.not_exited = tuple(not_exited)
        self.timeout_s = timeout_s
        self.world_size = world_size


def _callable_name(fn: Any) -> tuple[str | None, str | None]:
    import functools

    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)


def _pack_target(fn: Callable, args: Sequence, kwargs: Mapping | None) -> tuple[bytes, bytes]:
    """Pickle ``fn`` (by reference) and its arguments, with a clear TypeError when that cannot work."""
    if not callable(fn):
        raise TypeError(f"launch_local: fn must be callable, got {type(fn).__name__}")
    module, qualname = _callable_name(fn)
    advice = ("launch_local runs fn in freshly spawned processes, which import it by name: define it with "
              "`def` at the top level of an importable .py module and import it from there")
    if qualname and "<lambda>" in qualname:
        raise TypeError(f"launch_local: fn is a lambda ({qualname}), which cannot be imported by the ranks; {advice}")
    if qualname and "<locals>" in qualname:
        raise TypeError(
            f"launch_local: fn {qualname} is a nested function or closure, which cannot be imported by the ranks; "
            f"{advice}"
        )
    if module == "__main__" and not getattr(sys.modules.get("__main__"), "__file__", None):
        raise TypeError(
            f"launch_local: fn {qualname} is defined in an interactive session or notebook (module __main__ has "
            f"no file), which the ranks cannot import; {advice}"
        )
    try:
        fn_bytes = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"launch_local: fn {qualname or fn!r} cannot be sent to the ranks ({e}); {advice}") from e
    try:
        arg_bytes = pickle.dumps((tuple(args), dict(kwargs or {})), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise TypeError(f"launch_local: args/kwargs cannot be pickled to send them to the ranks: {e}") from e
    return fn_bytes, arg_bytes


def _start_store(master_addr: str, world_size: int):
    """Host the rendezvous TCPStore in the launcher on a port the OS picks (no free-port race).

    The ranks join it as clients (``TORCHELASTIC_USE_AGENT_STORE``, as under torchrun), so the store also
    outlives any rank that finishes early. Falls back to a free port that rank 0 binds itself.
    """
    try:
        from torch.distributed import TCPStore

        store = TCPStore(master_addr, 0, world_size, True, timeout=timedelta(seconds=60), wait_for_workers=False)
        return store, int(store.port)
    except Exception:  # pragma: no cover - fallback when the launcher cannot host a store
        return None, _free_port(master_addr)


def _free_port(master_addr: str) -> int:
    import socket

    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((master_addr, 0))
        return int(s.getsockname()[1])


def _signal_name(code: int) -> str:
    if code is not None and code < 0:
        try:
            return f" ({signal.Signals(-code).name})"
        except ValueError:
            return ""
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
    results: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    awaiting: set = field(default_factory=set)   # ranks whose pipe may still carry a message
    running: set = field(default_factory=set)    # ranks whose process has not been seen to exit
    failed_ranks: set = field(default_factory=set)

    def read(self, rank: int) -> None:
        conn = self.conns[rank]
        try:
            msg = conn.recv()
        except EOFError:
            self.awaiting.discard(rank)
            return
        except Exception as e:  # the result could not be unpickled here
            self.awaiting.discard(rank)
            self._fail(_Failure(rank, 0, f"rank {rank} of {self.world_size} failed: its result could not be "
                                f"unpickled in the launcher: {type(e).__name__}: {e}", time.time(),
                                exc_type=type(e).__name__))
            return
        self.awaiting.discard(rank)
        if msg[0] == "ok":
            self.results[rank] = msg[1]
        else:
            info = msg[1]
            first = f"{info['type']}: {info['message']}" if info["message"] else info["type"]
            self._fail(_Failure(rank, 2 if info["comm"] else 0,
                                f"rank {rank} of {self.world_size} failed: {first}", info["time"],
                                exc_type=info["type"], tb=info["traceback"]))

    def exited(self, rank: int) -> None:
        self.running.discard(rank)
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        # Everything the rank sent before exiting is in the pipe now.
        while rank in self.awaiting:
            if not self.conns[rank].poll(0):
                self.awaiting.discard(rank)
                break
            self.read(rank)
        if rank in self.failed_ranks:
            return
        code = proc.exitcode
        if code != 0:
            after = "after returning its result" if rank in self.results else "without reporting an error"
            self._fail(_Failure(rank, 1, f"rank {rank} of {self.world_size} died with exit code {code}"
                                f"{_signal_name(code)} {after}", time.time(), exitcode=code))
        elif rank not in self.results:
            self._fail(_Failure(rank, 1, f"rank {rank} of {self.world_size} exited with code 0 without "
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
        return RankFailedError("\n".join(lines), rank=main.rank, world_size=self.world_size,
                               exc_type=main.exc_type, exitcode=main.exitcode, rank_traceback=main.tb,
                               other_failures=[f.headline for f in others])


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


def launch_local(fn: Callable, world_size: int, *, args: Sequence = (), kwargs: Mapping | None = None,
                 backend: str | None = "gloo", timeout_s: float = 600.0, pg_timeout_s: float = 60.0,
                 threads_per_rank: int = 1, env: Mapping[str, Any] | None = None,
                 master_addr: str = "127.0.0.1", quiet: bool = False,
                 emulate_bandwidth: str | float | None = None, emulate_burst_bytes: int | None = None) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world_size`` local ranks and return their results in rank order.

    Each rank is a process started with the multiprocessing ``spawn`` method. Before torch is imported
    there it gets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` = ``threads_per_rank`` (and
    ``torch.set_num_threads``), ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT`` and ``env`` (the launcher's variables win over ``env``); it then calls
    :func:`init_distributed` with ``backend`` (None: automatic) and ``pg_timeout_s``, runs ``fn`` and sends
    its return value (which must be picklable) back. ``fn`` must be a module-level function (or a
    ``functools.partial`` of one) that the ranks can import; lambdas, closures and functions defined in
    a notebook are refused up front with a TypeError.

    Failures, all within a bounded time, never a hang, and with every rank process reaped:

    * a rank raises → :class:`RankFailedError` (``rank 1 of 2 failed: ValueError: boom`` and the rank's
      traceback), about half a second after the exception, whatever the other ranks are blocked in;
    * a rank dies without raising (``os._exit``, a signal) → :class:`RankFailedError`
      (``rank 0 of 2 died with exit code -9 (SIGKILL) ...``);
    * ``timeout_s`` (start-up included) passes → :class:`LaunchTimeoutError` naming the unfinished ranks;
    * KeyboardInterrupt in the launcher → the ranks are killed and the interrupt re-raised.

    Remaining ranks get SIGTERM, then SIGKILL after 3 s. A rank whose launcher dies is killed too
    (``PR_SET_PDEATHSIG`` on Linux, plus a thread that polls the parent pid once a second).
    Rank output goes to the launcher's stdout/stderr file descriptors; ``quiet=True`` discards the
    ranks' stdout (errors still come back as :class:`RankFailedError`).

    ``emulate_bandwidth`` (a tc-style rate such as ``"1gbit"`` or ``"200mbit"``, or bits per second) runs
    the ranks on an emulated network (:class:`repro.cluster.netns.EmulatedNetwork`): each rank in its own network
    namespace, joined by a bridge, every rank's link limited to that bandwidth in each direction by a
    ``tbf`` qdisc (bucket ``emulate_burst_bytes``, default ``max(rate x 1 ms, 64 KiB)``). The rendezvous
    store listens on the bridge's address, which becomes ``MASTER_ADDR`` (``master_addr`` is not used);
    each rank enters its namespace before anything else and gets ``GLOO_SOCKET_IFNAME`` (the namespace's
    interface) and ``REPRO_EMULATED_BANDWIDTH_BPS``. The network is removed after the ranks are reaped,
    whatever the outcome. Needs root, ``ip`` and ``tc``; otherwise
    :class:`repro.cluster.netns.EmulationUnavailableError` says so before anything starts (leave
    ``emulate_bandwidth=None`` to run without emulation).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be a positive integer, got {threads_per_rank!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if not pg_timeout_s > 0:
        raise ValueError(f"pg_timeout_s must be positive, got {pg_timeout_s}")
    if backend is not None and str(backend).lower() not in SUPPORTED_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(SUPPORTED_BACKENDS)} or None")
    payload = _pack_target(fn, args, kwargs)
    if emulate_bandwidth is None:
        if emulate_burst_bytes is not None:
            raise ValueError("emulate_burst_bytes is only used with emulate_bandwidth")
        return _launch(payload, world_size, backend=backend, timeout_s=timeout_s, pg_timeout_s=pg_timeout_s,
                       threads_per_rank=threads_per_rank, env=env, master_addr=master_addr, quiet=quiet)

    from repro.cluster import netns as netem

    bandwidth_bps = netem.parse_bandwidth(emulate_bandwidth)  # ValueError before anything is created
    netem.check_emulation_available()
    start = time.monotonic()
    with netem.EmulatedNetwork(world_size, bandwidth=bandwidth_bps, burst_bytes=emulate_burst_bytes) as net:
        timeout_left = timeout_s - (time.monotonic() - start)
        if timeout_left <= 0:
            raise LaunchTimeoutError(f"launch_local timed out after {timeout_s:g} s while setting up the emulated "
                                     "network", unfinished=range(world_size), timeout_s=timeout_s,
                                     world_size=world_size)
        rank_env = [net.rank_env(r) for r in range(world_size)]
        return _launch(payload, world_size, backend=backend, timeout_s=timeout_left, pg_timeout_s=pg_timeout_s,
                       threads_per_rank=threads_per_rank, env=env, master_addr=net.master_address, quiet=quiet,
                       namespaces=list(net.namespaces), rank_env=rank_env, reported_timeout_s=timeout_s)


def _launch(payload: tuple[bytes, bytes], world_size: int, *, backend: str | None, timeout_s: float,
            pg_timeout_s: float, threads_per_rank: int, env: Mapping[str, Any] | None, master_addr: str,
            quiet: bool, namespaces: Sequence[str] | None = None,
            rank_env: Sequence[Mapping[str, str]] | None = None, reported_timeout_s: float | None = None) -> list:
    """The body of :func:`launch_local` once its arguments are checked (and a network emulated, if asked)."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    if reported_timeout_s is None:
        reported_timeout_s = timeout_s
    start = time.monotonic()
    deadline = start + timeout_s
    store, port = _start_store(master_addr, world_size)
    base_env = {"OMP_NUM_THREADS": str(threads_per_rank), "MKL_NUM_THREADS": str(threads_per_rank)}
    base_env.update({str(k): str(v) for k, v in (env or {}).items()})
    base_env.update({
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        # With the store hosted here every rank is a client, as under torchrun's agent.
        "TORCHELASTIC_USE_AGENT_STORE": str(store is not None),
        "TORCHELASTIC_RESTART_COUNT": "0",
    })

    ctx = mp.get_context("spawn")
    procs: list = []
    conns: list = []
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            conns.append(reader)
            this_env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
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

        sup = _Supervisor(procs, conns, world_size, awaiting=set(range(world_size)),
                          running=set(range(world_size)))
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


# --------------------------------------------------------------------------------------------------
# Inside a spawned rank
# --------------------------------------------------------------------------------------------------


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


def _is_comm_error(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a consequence of a peer failing (reported with lower priority)."""
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    if isinstance(exc, (RuntimeError, ConnectionError, TimeoutError)):
        text = str(exc).lower()
        return any(s in text for s in ("gloo", "nccl", "connection closed", "connection reset", "broken pipe",
                                       "timed out", "socket timeout"))
    return False


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _rank_main(rank: int, payload: tuple[bytes, bytes], conn, env: dict, parent_pid: int, backend: str | None,
               pg_timeout_s: float, threads: int, quiet: bool, netns: str | None = None) -> None:
    if netns is not None:
        # First of all (before torch is imported or any socket opened, and before any thread starts, since
        # setns moves the calling thread only): join this rank's emulated network.
        try:
            from repro.cluster.netns import enter_namespace

            enter_namespace(netns)
        except BaseException as exc:  # noqa: BLE001 - reported like any other failure of the rank
            info = {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                    "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                    "comm": False, "time": time.time()}
            with contextlib.suppress(Exception):
                conn.send(("error", info))
                conn.close()
            _flush_std()
            os._exit(1)
    _watch_parent(parent_pid)
    os.environ.update(env)
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
        info = {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                "comm": _is_comm_error(exc), "time": time.time()}
        with contextlib.suppress(Exception):
            conn.send(("error", info))
            conn.close()
        _flush_std()
        # Skip interpreter teardown: a process group with a dead peer may block in its destructor.
        os._exit(1)
    conn.close()
    # The result is delivered. Wait for the peers, then leave without interpreter teardown: destroying
    # a gloo group (or its threads at exit) after a peer has gone can abort the process (SIGABRT,
    # "terminate called without an active exception"), which would turn a finished run into a failure.
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
    _flush_std()
    os._exit(0)


# --------------------------------------------------------------------------------------------------
# torchrun command lines
# --------------------------------------------------------------------------------------------------


def torchrun_command(module_args: Sequence[str] | str, nproc_per_node: int | str, nnodes: int | str = 1,
                     node_rank: int | str = 0, rdzv_endpoint: str | None = None, standalone: bool | None = None,
                     *, python: str | None = None) -> list[str]:
    """The ``python -m torch.distributed.run ...`` command line that starts a run (torchrun).

    ``module_args``: what torchrun runs — ``["repro.train", "--steps", "10"]`` (a module name; ``-m`` is
    added), ``["-m", "repro.train", ...]`` or ``["path/to/script.py", ...]`` (a ``.py`` file or a path);
    a string is split with :func:`shlex.split`. ``nproc_per_node``: processes per node (an int, or
    torchrun's ``"gpu"``/``"cpu"``/``"auto"``). ``standalone=None`` means ``--standalone`` (a private
    rendezvous on this machine) for one node without ``rdzv_endpoint``. Several nodes need
    ``rdzv_endpoint="HEAD:PORT"`` (the host of node 0) and each node's ``node_rank`` (static rendezvous);
    ``nnodes``/``node_rank`` may be shell variables (strings). ``python`` defaults to ``sys.executable``.

    Example::

        >>> torchrun_command(["repro.train", "--steps", "10"], 2, python="python")
        ['python', '-m', 'torch.distributed.run', '--standalone', '--nnodes', '1', '--nproc-per-node', '2', '-m', 'repro.train', '--steps', '10']

    On SLURM, one task per node (``#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4``)::

        HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        srun bash -c "python -m torch.distributed.run --nnodes \\$SLURM_NNODES --node-rank \\$SLURM_NODEID \\
            --rdzv-endpoint $HEAD:29500 --nproc-per-node 4 -m repro.train ..."

    which is ``" ".join(torchrun_command(["repro.train", ...], 4, nnodes="$SLURM_NNODES",
    node_rank="$SLURM_NODEID", rdzv_endpoint=f"{head}:29500", python="python"))``
    (``torchrun --nnodes $SLURM_NNODES --node_rank $SLURM_NODEID --rdzv-endpoint $HEAD:29500 ...`` is the
    same with the ``torchrun`` script).
    """
    parts = shlex.split(module_args) if isinstance(module_args, str) else [str(a) for a in module_args]
    if not parts or parts in (["-m"], ["--module"]):
        raise ValueError("module_args must name a module or a script to run")
    if isinstance(nproc_per_node, int) and not isinstance(nproc_per_node, bool):
        if nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be at least 1, got {nproc_per_node}")
    elif str(nproc_per_node) not in ("gpu", "cpu", "auto") and not str(nproc_per_node).startswith("$"):
        raise ValueError(f"nproc_per_node must be a positive int or one of gpu, cpu, auto; got {nproc_per_node!r}")
    if isinstance(nnodes, int) and nnodes < 1:
        raise ValueError(f"nnodes must be at least 1, got {nnodes}")
    if isinstance(nnodes, int) and isinstance(node_rank, int) and not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be in [0, nnodes={nnodes}), got {node_rank}")
    single = str(nnodes) == "1"
    if standalone is None:
        standalone = single and rdzv_endpoint is None
    if standalone and (not single or rdzv_endpoint is not None):
        raise ValueError("standalone=True is for one node without rdzv_endpoint")
    if not single and rdzv_endpoint is None:
        raise ValueError("several nodes need rdzv_endpoint='HOST:PORT' (the host of node_rank 0)")

    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if standalone:
        cmd.append("--standalone")
    cmd += ["--nnodes", str(nnodes)]
    if rdzv_endpoint is not None:
        cmd += ["--node-rank", str(node_rank), "--rdzv-endpoint", str(rdzv_endpoint)]
    cmd += ["--nproc-per-node", str(nproc_per_node)]
    if parts[0] in ("-m", "--module"):
        cmd += ["-m", *parts[1:]]
    elif parts[0].endswith(".py") or os.sep in parts[0] or "/" in parts[0]:
        cmd += parts
    else:
        cmd += ["-m", *parts]
    return cmd
