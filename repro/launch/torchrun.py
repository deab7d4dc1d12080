"""Per-rank set-up shared by ``torchrun`` and the local launcher (:mod:`repro.launch.local`).

Each process started by torchrun or :func:`repro.launch.local.launch_local` calls
:func:`init_distributed` (or runs in :func:`distributed`). Backend and device are automatic (NCCL on
``cuda:LOCAL_RANK`` with CUDA, else gloo on the CPU) unless forced. ``ROLE_NAME``/``ROLE_RANK``/
``ROLE_WORLD_SIZE`` become :class:`DistContext`'s role fields. ``REPRO_GLOO_IFNAME`` is copied to
``GLOO_SOCKET_IFNAME`` when that is unset.

Failures end fast: a rank that raises posts one line on the job's store and aborts its group, so its
peers fail their collective at once, read that line (at most :data:`REPORT_WAIT_S`) and stop with
:class:`PeerFailedError` naming it. Before joining, a roll call on the store ends at once when a peer
failed, or at ``join_timeout_s`` with :class:`JoinTimeoutError`. Exit statuses (``repro.train.main``):
2 for a refused configuration (:func:`is_config_error`), also on its peers; 1 for a failure while running.
Torch is imported only inside functions."""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DEFAULT_ROLE", "DistContext", "DistributedSetupError", "JoinTimeoutError", "PeerFailedError",
           "REPORT_WAIT_S", "SEEN_WAIT_S", "SUPPORTED_BACKENDS", "is_comm_error", "is_config_error",
           "report_failure", "check_timeout_s", "distributed", "init_distributed", "shutdown_distributed",
           "torchrun_command"]

SUPPORTED_BACKENDS = ("gloo", "nccl")
DEFAULT_ROLE = "worker"
_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_ENV_HINT = "start with torchrun or repro.launch.local.launch_local"


def check_timeout_s(name: str, value: Any) -> float:
    """``value`` as seconds if it is a finite positive number; ValueError naming ``name`` otherwise."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a finite positive number of seconds, got {value!r}")
    return float(value)


class DistributedSetupError(RuntimeError):
    """The process cannot join a process group as asked (missing environment, no CUDA for NCCL, ...)."""


class JoinTimeoutError(DistributedSetupError):
    """Some ranks did not answer the roll call within ``join_timeout_s``; ``missing``: their global ranks.
    One line."""

    def __init__(self, message: str, *, missing: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class PeerFailedError(RuntimeError):
    """This rank stops because a peer failed: one line, ``rank R: peer rank Q failed ...; stopping``.
    ``peer``: the rank that failed (None without a report); ``config``: it refused the configuration (the
    job exits 2); ``line``: its one-line message (None without a report)."""

    def __init__(self, message: str, *, peer: int | None = None, config: bool = False,
                 line: str | None = None) -> None:
        super().__init__(message)
        self.peer = peer
        self.config = config
        self.line = line


#: seconds a rank whose collective broke waits for the failed peer's report on the store
REPORT_WAIT_S = 3.0
#: seconds a rank that posted its failure waits, at most, for every rank to have seen it (a peer's next
#: collective fails at once; the store, hosted by the failed node's torchrun agent, must outlive that)
SEEN_WAIT_S = 5.0
#: seconds between two looks at the store during the roll call
_POLL_S = 0.1
_STORE_CLIENT: Any = None


def is_config_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal of the configuration or set-up (exit status 2), not a failure while running."""
    if isinstance(exc, PeerFailedError):
        return exc.config
    return isinstance(exc, (ValueError, FileNotFoundError, DistributedSetupError))


def is_comm_error(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a consequence of a peer failing (a broken or timed-out collective)."""
    if isinstance(exc, PeerFailedError):
        return True
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    if isinstance(exc, (RuntimeError, ConnectionError, TimeoutError)):
        text = str(exc).lower()
        return any(s in text for s in ("gloo", "nccl", "connection closed", "connection reset", "broken pipe",
                                       "timed out", "socket timeout"))
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _key(name: str) -> str:
    """A store key of this attempt of the job (torchrun restarts a job with a new restart count)."""
    return f"repro/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0').strip() or '0'}/{name}"


def _job_store(connect_timeout_s: float = 10.0) -> Any:
    """The job's store, or None: a client of the agent's store (torchrun, ``launch_local``: it outlives the
    ranks), else the default process group's store once joined."""
    global _STORE_CLIENT
    if _STORE_CLIENT is not None:
        return _STORE_CLIENT
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        with contextlib.suppress(Exception):
            from torch.distributed import TCPStore

            _STORE_CLIENT = TCPStore(os.environ["MASTER_ADDR"].strip(), int(os.environ["MASTER_PORT"]), None, False,
                                     timeout=timedelta(seconds=connect_timeout_s), wait_for_workers=False)
            return _STORE_CLIENT
    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            return dist.distributed_c10d._get_default_store()
    return None


def report_failure(exc: BaseException, rank: int | None = None) -> bool:
    """Post ``exc`` on the job's store as this rank's failure (the first posted stays); a peer's failure seen
    here (:func:`is_comm_error`) is not posted. True if posted."""
    if is_comm_error(exc) or isinstance(exc, (JoinTimeoutError, KeyboardInterrupt)):
        return False
    if getattr(exc, "_repro_posted", False):  # posted already (inside distributed(), then again by its caller)
        return False
    if rank is None:
        try:
            rank = int(os.environ.get("RANK", ""))
        except ValueError:
            return False
    store = _job_store(connect_timeout_s=2.0)
    if store is None:
        return False
    value = json.dumps({"rank": rank, "type": type(exc).__name__, "line": _first_line(exc),
                        "config": is_config_error(exc)})
    try:
        store.compare_set(_key("failure"), "", value)
    except Exception:  # noqa: BLE001 - a store without compare_set, or gone: best effort
        try:
            store.set(_key("failure"), value)
        except Exception:  # noqa: BLE001
            return False
    _mark_seen(store)
    with contextlib.suppress(Exception):
        exc._repro_posted = True  # type: ignore[attr-defined]
    return True


def _mark_seen(store: Any) -> None:
    """Count this rank among those that know of the failure (its own, or a peer's it read)."""
    with contextlib.suppress(Exception):
        store.add(_key("failure/seen"), 1)


def await_peers(world_size: int | None = None, wait_s: float = SEEN_WAIT_S) -> None:
    """After posting a failure: wait until all ``world_size`` ranks (default ``$WORLD_SIZE``) have seen it, at
    most ``wait_s`` seconds, so that the store (hosted by the failed node's agent) outlives their reading it.
    """
    store = _STORE_CLIENT
    if store is None:
        return
    try:
        world = int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", "1"))
        deadline = time.monotonic() + wait_s
        while store.add(_key("failure/seen"), 0) < world and time.monotonic() < deadline:
            time.sleep(_POLL_S)
    except Exception:  # noqa: BLE001 - the store is gone: nobody can read it any more
        return


def _read_failure(store: Any, wait_s: float = 0.0) -> dict | None:
    """The failure posted on ``store`` (waiting up to ``wait_s`` for one), or None."""
    key = _key("failure")
    try:
        if wait_s > 0:
            store.wait([key], timedelta(seconds=wait_s))
        elif not store.check([key]):
            return None
        return json.loads(store.get(key))
    except Exception:  # noqa: BLE001 - no report in time, or the store is gone
        return None


def _peer_failed(rank: int, report: dict | None, exc: BaseException | None = None) -> PeerFailedError:
    if report is None or report.get("rank") == rank:
        text = str(exc or "").lower()
        if "timed out" in text or "timeout" in text:
            what = "a collective timed out (a peer hung, or died without a report"
        elif exc is None or "closed" in text or "reset" in text or "broken pipe" in text:
            what = "lost the connection to a peer (it died or was stopped without a report"
        else:
            what = f"a collective failed ({type(exc).__name__}; no peer reported a failure"
        return PeerFailedError(f"rank {rank}: {what}: see the other ranks' logs); stopping")
    what = "refused the configuration" if report.get("config") else "failed"
    return PeerFailedError(f"rank {rank}: peer rank {report.get('rank')} {what} (see its log: "
                           f"{report.get('type')}: {report.get('line')}); stopping",
                           peer=report.get("rank"), config=bool(report.get("config")), line=report.get("line"))


def peer_failure(exc: BaseException, rank: int) -> PeerFailedError | None:
    """The :class:`PeerFailedError` to stop with when ``exc`` (raised on ``rank``) is a broken or timed-out
    collective, naming the peer that posted its failure (waited for up to :data:`REPORT_WAIT_S`); None for
    this rank's own failure."""
    if isinstance(exc, PeerFailedError):
        return exc
    if not is_comm_error(exc):
        return None
    store = _job_store(connect_timeout_s=2.0)
    report = _read_failure(store, REPORT_WAIT_S) if store is not None else None
    if report is not None:
        _mark_seen(store)
    return _peer_failed(rank, report, exc)


def _roll_call(rank: int, world: int, timeout_s: float) -> None:
    """Wait until every rank has arrived on the agent's store; a failure posted meanwhile raises
    :class:`PeerFailedError` at once, ``timeout_s`` :class:`JoinTimeoutError`. Without an agent's store
    (plain ``env://``) there is no roll call."""
    if world == 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    store = _job_store(connect_timeout_s=timeout_s)
    if store is None:
        return
    try:
        store.set(_key(f"joined/{rank}"), "1")
        count = store.add(_key("joined"), 1)
    except Exception:  # noqa: BLE001 - the store cannot be used: init_process_group reports it
        return
    deadline = time.monotonic() + timeout_s
    while count < world:
        report = _read_failure(store)
        if report is not None:
            _mark_seen(store)
            raise _peer_failed(rank, report)
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([_key(f"joined/{r}")])]
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            raise JoinTimeoutError(f"rank {rank}: rank(s) {shown} of {world} did not join within {timeout_s:g} s "
                                   "(not started, hung, or died before joining: see their logs); stopping",
                                   missing=missing)
        time.sleep(_POLL_S)
        count = store.add(_key("joined"), 0)


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the default process group. ``role`` (``"worker"`` by default),
    ``role_rank`` and ``role_world_size`` default to one role holding every rank."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: "torch.device"
    is_main: bool
    role: str = DEFAULT_ROLE
    role_rank: int | None = field(default=None)
    role_world_size: int | None = field(default=None)

    def __post_init__(self) -> None:
        if self.role_rank is None:
            object.__setattr__(self, "role_rank", self.rank)
        if self.role_world_size is None:
            object.__setattr__(self, "role_world_size", self.world_size)


def _int_env(name: str, default: int | None = None) -> int:
    """Integer environment variable ``name`` (``default`` when unset or blank, if given)."""
    raw = os.environ.get(name, "").strip()
    if not raw and default is not None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DistributedSetupError(f"environment variable {name}={raw!r} is not an integer; {_ENV_HINT}") from None


def _read_env() -> tuple[int, int, int, str, int]:
    missing = [name for name in _REQUIRED_ENV if not os.environ.get(name, "").strip()]
    if missing:
        raise DistributedSetupError(
            f"environment variable{'s' if len(missing) > 1 else ''} {', '.join(missing)} not set; {_ENV_HINT} "
            f"(they set {', '.join(_REQUIRED_ENV)})")
    rank, world, local_rank, port = (_int_env(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"))
    if world < 1:
        raise DistributedSetupError(f"WORLD_SIZE must be at least 1, got {world}")
    if not 0 <= rank < world:
        raise DistributedSetupError(f"RANK must be in [0, WORLD_SIZE={world}), got {rank}")
    if local_rank < 0:
        raise DistributedSetupError(f"LOCAL_RANK must be non-negative, got {local_rank}")
    if not 0 < port < 65536:
        raise DistributedSetupError(f"MASTER_PORT must be in 1..65535, got {port}")
    addr = os.environ["MASTER_ADDR"].strip()
    _check_master_addr(addr, port)
    return rank, world, local_rank, addr, port


def _check_master_addr(addr: str, port: int, tries: int = 3) -> None:
    """Refuse an unresolvable ``MASTER_ADDR`` in one line: c10d would retry it until the timeout and then fail
    with a page of C++ frames."""
    for attempt in range(tries):
        try:
            socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
            return
        except socket.gaierror as e:
            if e.errno == socket.EAI_AGAIN and attempt + 1 < tries:  # the resolver is busy: try again
                time.sleep(1.0)
                continue
            raise DistributedSetupError(
                f"MASTER_ADDR={addr!r} cannot be resolved ({e.strerror or e}); set it to an address or host name "
                "of rank 0's machine that every rank can reach") from None
        except (UnicodeError, ValueError) as e:  # e.g. an empty label or a NUL byte
            raise DistributedSetupError(f"MASTER_ADDR={addr!r} is not a host name or address ({e})") from None


def _read_role(rank: int, world: int) -> tuple[str, int, int]:
    """(role, role_rank, role_world_size) from ``ROLE_NAME``/``ROLE_RANK``/``ROLE_WORLD_SIZE``."""
    name = os.environ.get("ROLE_NAME", "").strip() or DEFAULT_ROLE
    role_rank, role_world = _int_env("ROLE_RANK", rank), _int_env("ROLE_WORLD_SIZE", world)
    if not 1 <= role_world <= world:
        raise DistributedSetupError(f"ROLE_WORLD_SIZE must be in [1, WORLD_SIZE={world}], got {role_world}")
    if not 0 <= role_rank < role_world:
        raise DistributedSetupError(f"ROLE_RANK must be in [0, ROLE_WORLD_SIZE={role_world}), got {role_rank}")
    return name, role_rank, role_world


def _choose_backend_device(backend: str | None, device: Any, local_rank: int) -> tuple[str, "torch.device"]:
    import torch
    import torch.distributed as dist

    if backend is not None:
        backend = str(backend).lower()
        if backend not in SUPPORTED_BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(SUPPORTED_BACKENDS)} "
                             "(or None to choose automatically)")
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
                raise DistributedSetupError(f"device {device!r} asked for, but CUDA is not available here "
                                            "(torch.cuda.is_available() is False); use device='cpu' or None")
            if dev.index is None:
                dev = torch.device("cuda", local_rank)
    if backend is None:
        backend = ("nccl" if dev.type == "cuda" else "gloo") if dev is not None else ("nccl" if cuda else "gloo")
    if backend == "nccl":
        if not cuda:
            raise DistributedSetupError(
                "backend 'nccl' needs CUDA, but torch.cuda.is_available() is False here; "
                "use backend='gloo' (or None to choose automatically) on a CPU machine")
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
                "start at most one process per visible GPU on each node")
    return backend, dev


def init_distributed(backend: str | None = None, device: Any = None, timeout_s: float = 300.0,
                     join_timeout_s: float | None = None) -> DistContext:
    """Join the default process group of a process started by torchrun or ``launch_local``.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and the role
    variables. ``backend=None``: nccl with CUDA (device ``cuda:LOCAL_RANK``, made current), else gloo;
    ``device=None`` follows the backend (``"cuda"`` means ``cuda:LOCAL_RANK``). ``timeout_s`` bounds every
    collective and the rendezvous; ``join_timeout_s`` (default ``timeout_s``) the roll call. Bad environment
    or devices: :class:`DistributedSetupError`; bad arguments: ValueError."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed support")
    if dist.is_initialized():
        raise DistributedSetupError(
            "the default process group is already initialised; call repro.launch.torchrun.shutdown_distributed() first"
        )
    timeout_s = check_timeout_s("timeout_s", timeout_s)
    join_timeout_s = timeout_s if join_timeout_s is None else check_timeout_s("join_timeout_s", join_timeout_s)
    rank, world, local_rank, _addr, _port = _read_env()
    role, role_rank, role_world = _read_role(rank, world)
    backend, dev = _choose_backend_device(backend, device, local_rank)

    ifname = os.environ.get("REPRO_GLOO_IFNAME", "").strip()
    if ifname and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = ifname

    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # nccl: device_id binds the communicator to this rank's GPU (eager NCCL init)
    kwargs = {"device_id": dev} if backend == "nccl" else {}
    _roll_call(rank, world, join_timeout_s)
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=backend, device=dev,
                       is_main=rank == 0, role=role, role_rank=role_rank, role_world_size=role_world)


def shutdown_distributed(failed: bool = False) -> None:
    """Leave the default process group if there is one; safe to call twice (or without torch).

    After a success the ranks leave together (a barrier: rank 0 may still be writing the run folder). After
    a failure the group is aborted at once, so a peer blocked in a collective with this rank fails within a
    second instead of at the process-group timeout."""
    global _STORE_CLIENT
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return
    if dist.is_available() and dist.is_initialized():
        if failed:
            try:
                dist.distributed_c10d._abort_process_group()
            except Exception:  # noqa: BLE001 - no abort for this backend or torch: destroy instead
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()
        else:
            # Leave together: a gloo group torn down while a peer still works can abort at exit.
            with contextlib.suppress(Exception):
                dist.barrier()
            dist.destroy_process_group()
    _STORE_CLIENT = None


@contextlib.contextmanager
def distributed(backend: str | None = None, device: Any = None, timeout_s: float = 300.0,
                join_timeout_s: float | None = None) -> Iterator[DistContext]:
    """``with distributed() as ctx:``: :func:`init_distributed`, then :func:`shutdown_distributed`.

    An exception in the block posts this rank's own failure (:func:`report_failure`) and aborts the group;
    a broken collective becomes a :class:`PeerFailedError` naming the peer. The exception is raised on."""
    global _STORE_CLIENT
    try:
        ctx = init_distributed(backend=backend, device=device, timeout_s=timeout_s, join_timeout_s=join_timeout_s)
    except BaseException as exc:
        report_failure(exc)
        raise
    try:
        yield ctx
    except BaseException as exc:
        peer = peer_failure(exc, ctx.rank)
        posted = peer is None and report_failure(exc, ctx.rank)
        store = _STORE_CLIENT
        shutdown_distributed(failed=True)  # the peers' collectives with this rank fail now
        if posted:
            _STORE_CLIENT = store  # kept past shutdown, so that the peers can read the failure
            await_peers(ctx.world_size)
        if peer is not None and peer is not exc:
            raise peer from None
        raise
    shutdown_distributed()


def torchrun_command(module_args: Sequence[str] | str, nproc_per_node: int | str, nnodes: int | str = 1,
                     node_rank: int | str = 0, rdzv_endpoint: str | None = None, standalone: bool | None = None,
                     *, python: str | None = None) -> list[str]:
    """The ``python -m torch.distributed.run ...`` command line that starts a run.

    ``module_args``: a module name (``["repro.train", "--steps", "10"]``; ``-m`` is added), ``["-m", ...]``
    or a script path; a string is :func:`shlex.split`. ``nproc_per_node``: an int or torchrun's
    ``"gpu"``/``"cpu"``/``"auto"``. ``standalone=None``: ``--standalone`` for one node without
    ``rdzv_endpoint``. Several nodes need ``rdzv_endpoint="HEAD:PORT"`` and each node's ``node_rank``;
    ``nnodes``/``node_rank`` may be shell variables. ``python`` defaults to ``sys.executable``. Bad
    arguments: ValueError. Example::

        >>> torchrun_command(["repro.train", "--steps", "10"], 2, python="python")[:6]
        ['python', '-m', 'torch.distributed.run', '--standalone', '--nnodes', '1']
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
