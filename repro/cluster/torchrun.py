"""Per-rank set-up shared by ``torchrun`` and the local launcher (:mod:`repro.cluster.local`).

* **A cluster or a multi-GPU box** — ``torchrun`` (``python -m torch.distributed.run``) starts one process
  per GPU and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; each
  process calls :func:`init_distributed` (or uses :func:`distributed` as a context manager).
  :func:`torchrun_command` builds such a command line.
* **This machine** — :func:`repro.cluster.local.launch_local` spawns the ranks, sets the same variables
  and calls :func:`init_distributed` in each.

Backend and device are chosen automatically — NCCL with one GPU per rank (``cuda:LOCAL_RANK``) when
CUDA is available, gloo on the CPU otherwise — and either can be forced.

Roles: ``ROLE_NAME``, ``ROLE_RANK`` and ``ROLE_WORLD_SIZE`` (set by torchrun's agent — role ``"default"``
unless ``--role`` says otherwise — and by ``launch_local``, whose plain launches use ``"worker"``) become
:attr:`DistContext.role`, ``role_rank`` and ``role_world_size``; without them a process is rank ``RANK``
of ``WORLD_SIZE`` in role ``"worker"``.

Network interface: gloo picks the interface that the host name resolves to. To choose one, set
``GLOO_SOCKET_IFNAME`` (read by gloo itself) or ``REPRO_GLOO_IFNAME``; the latter is copied to
``GLOO_SOCKET_IFNAME`` by :func:`init_distributed` when that is unset, and is otherwise left to gloo.

This module imports torch only inside functions, so a spawned rank can set its thread count and
environment before torch is loaded.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import shlex
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterator, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DEFAULT_ROLE",
    "DistContext",
    "DistributedSetupError",
    "SUPPORTED_BACKENDS",
    "check_timeout_s",
    "distributed",
    "init_distributed",
    "shutdown_distributed",
    "torchrun_command",
]

SUPPORTED_BACKENDS = ("gloo", "nccl")
DEFAULT_ROLE = "worker"
_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_ENV_HINT = "start with torchrun or repro.cluster.local.launch_local"


def check_timeout_s(name: str, value: Any) -> float:
    """``value`` as seconds if it is a finite positive number; ValueError naming ``name`` otherwise."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a finite positive number of seconds, got {value!r}")
    return float(value)


class DistributedSetupError(RuntimeError):
    """The process cannot join a process group as asked (missing environment, no CUDA for NCCL, ...)."""


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the default process group.

    ``role`` is the name of this rank's role (``"worker"`` in a plain ``launch_local`` run, the role of a
    ``Role`` otherwise, torchrun's ``--role`` under torchrun), ``role_rank`` its index among the ranks of
    that role and ``role_world_size`` their number; left out, they default to ``"worker"``, ``rank`` and
    ``world_size`` (one role holding every rank).
    """

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
    addr = os.environ["MASTER_ADDR"].strip()
    _check_master_addr(addr, port)
    return rank, world, local_rank, addr, port


def _check_master_addr(addr: str, port: int, tries: int = 3) -> None:
    """Refuse a ``MASTER_ADDR`` that does not resolve, in one line, before the rendezvous: c10d would
    retry it until the timeout, printing a warning per try, and then fail with a page of C++ frames."""
    import socket
    import time

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
                "of rank 0's machine that every rank can reach"
            ) from None
        except (UnicodeError, ValueError) as e:  # e.g. an empty label or a NUL byte
            raise DistributedSetupError(f"MASTER_ADDR={addr!r} is not a host name or address ({e})") from None


def _read_role(rank: int, world: int) -> tuple[str, int, int]:
    """(role, role_rank, role_world_size) from ``ROLE_NAME``/``ROLE_RANK``/``ROLE_WORLD_SIZE``."""
    name = os.environ.get("ROLE_NAME", "").strip() or DEFAULT_ROLE
    values = {}
    for var, default in (("ROLE_RANK", rank), ("ROLE_WORLD_SIZE", world)):
        raw = os.environ.get(var, "").strip()
        try:
            values[var] = int(raw) if raw else default
        except ValueError:
            raise DistributedSetupError(f"environment variable {var}={raw!r} is not an integer; {_ENV_HINT}") from None
    role_rank, role_world = values["ROLE_RANK"], values["ROLE_WORLD_SIZE"]
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
    """Join the default process group of a process started by torchrun or ``launch_local``.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` from the environment
    (and the role variables, see the module docstring).
    ``backend=None`` picks ``"nccl"`` when CUDA is available (device ``cuda:LOCAL_RANK``, made current with
    ``torch.cuda.set_device``) and ``"gloo"`` on the CPU otherwise; ``device=None`` follows the backend
    (``"cuda"`` without an index means ``cuda:LOCAL_RANK``). ``timeout_s`` (finite, positive) bounds every
    collective and the rendezvous, so a rank whose peer crashed fails instead of waiting forever.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed support")
    if dist.is_initialized():
        raise DistributedSetupError(
            "the default process group is already initialised; call repro.cluster.torchrun.shutdown_distributed() first"
        )
    timeout_s = check_timeout_s("timeout_s", timeout_s)
    rank, world, local_rank, _addr, _port = _read_env()
    role, role_rank, role_world = _read_role(rank, world)
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
                       is_main=rank == 0, role=role, role_rank=role_rank, role_world_size=role_world)


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
