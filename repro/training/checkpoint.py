"""In-run checkpoints of ``repro train``: a run that SLURM stops goes on from where it was.

:class:`Checkpointer` checkpoints every ``--checkpoint-every-min`` minutes and on SLURM's pre-timeout
``SIGUSR1``. The signal reaches ranks at different moments, so at every step boundary the trainers
all-reduce (max) "due" and "stop" flags on a gloo group: all checkpoint after the same step, and after a
signal leave with :data:`RESUME_EXIT`. The first trainer writes
``<results_dir>/<run_id>.incomplete/checkpoint.pt`` atomically (model, optimizer, plan, trace, cost, the
rows so far, every rank's RNG and data position). A rerun with the same configuration, ``--run-id`` and
``--results-dir`` resumes after that step; a finished run is never resumed. Dedicated server ranks and
executors that refuse a checkpoint are refused. Details: docs/design/runtime.md.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from repro.log import get_logger
from repro.results.runs import INCOMPLETE

log = get_logger(__name__)

__all__ = ["CHECKPOINT_FILE", "RESUME_EXIT", "Preempted", "checkpoint_path", "same_run", "Checkpointer"]

#: the checkpoint's file name, inside ``<results_dir>/<run_id>.incomplete/``
CHECKPOINT_FILE = "checkpoint.pt"
#: exit status of ``repro train`` after a checkpoint on SLURM's signal (EX_TEMPFAIL: run it again to go on)
RESUME_EXIT = 75
#: fields of the run's configuration that do not change what is trained (a resume may differ in them)
_FREE_FIELDS = frozenset({"quiet", "overwrite", "results_dir", "num_workers", "checkpoint_every_min",
                          "checkpoint_stop_at_step", "emulated_bandwidth_bps"})
_FORMAT = 1


class Preempted(Exception):
    """The ranks checkpointed on SLURM's signal (or ``checkpoint_stop_at_step``) and stop here."""

    def __init__(self, step: int, path: Path | str) -> None:
        super().__init__(f"checkpointed after step {step} to {path}; run it again (same run id) to go on")
        self.step, self.path = step, path


def checkpoint_path(results_dir: str | Path, run_id: str) -> Path:
    """``<results_dir>/<run_id>.incomplete/checkpoint.pt``."""
    return Path(results_dir) / f"{run_id}{INCOMPLETE}" / CHECKPOINT_FILE


def same_run(saved: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether a checkpoint's configuration (``asdict`` of its TrainConfig) trains what ``config`` does."""
    keys = (set(saved) | set(config)) - _FREE_FIELDS
    return all(saved.get(k) == config.get(k) for k in keys)


_SIGNALLED = threading.Event()


def _on_signal(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    _SIGNALLED.set()


def install_signal_handler() -> bool:
    """Catch ``SIGUSR1`` (the ranks act on it together at the next step boundary); False off the main
    thread, where it cannot be installed."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        return False
    signal.signal(signal.SIGUSR1, _on_signal)
    return True


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random generators: torch's CPU one, the device's CUDA one, ``random``, numpy."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": np.random.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        np.random.set_state(state["numpy"])


class Checkpointer:
    """The checkpoints of one run, made collectively on every training rank: every ``every_min`` minutes
    (0: only on the signal), and as if SIGUSR1 came after step ``stop_at_step``; ``group``: the training
    ranks' (None: the world); ``first``: the global rank that writes."""

    def __init__(self, results_dir: str | Path, run_id: str, *, every_min: float, stop_at_step: int | None,
                 group: Any, first: int, rank: int, size: int) -> None:
        self.path = checkpoint_path(results_dir, run_id)
        self.every_s = float(every_min) * 60.0
        self.stop_at_step = stop_at_step
        self.first, self.rank, self.size = first, rank, size
        if dist.get_backend(group) == "gloo":
            self.group = group
        else:  # the flags and the gathered states on the CPU, apart from the gradients' NCCL streams
            ranks = list(range(first, first + size)) if group is not None else None
            self.group = dist.new_group(ranks=ranks, backend="gloo")
        self.since = time.monotonic()
        self.signal_handled = install_signal_handler()
        _SIGNALLED.clear()

    def due(self, step: int) -> tuple[bool, bool]:
        """After ``step`` steps: (checkpoint now, then stop), the same on every training rank (a collective)."""
        stop = _SIGNALLED.is_set() or (self.stop_at_step is not None and step == self.stop_at_step
                                       and dist.get_rank() == self.first)
        timed = self.every_s > 0 and time.monotonic() - self.since >= self.every_s
        flags = torch.tensor([int(timed or stop), int(stop)], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flags[0]), bool(flags[1])

    def save(self, *, model: torch.nn.Module, dopt: Any, device: torch.device, data: Any, run: dict[str, Any]) -> None:
        """Write the checkpoint (every training rank calls it; the first one writes, then all meet)."""
        t0 = time.perf_counter()
        dopt.flush()
        optimizer = dopt.state_dict()  # every rank: a collective for the parameter-server families
        model_state = model.state_dict()
        mine = {"rng": rng_state(device), "data": data.state()}
        everyone: list[Any] = [None] * self.size
        dist.all_gather_object(everyone, mine, group=self.group)
        if dist.get_rank() == self.first:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.parent / f".{CHECKPOINT_FILE}.{uuid.uuid4().hex[:8]}"
            torch.save({"format": _FORMAT, "model": model_state, "optimizer": optimizer, "ranks": everyone,
                        **run}, tmp)
            os.replace(tmp, self.path)
            log.info("%s: checkpoint after step %d (%.2f s)", self.path, run["step"], time.perf_counter() - t0)
        dist.barrier(group=self.group)
        self.since = time.monotonic()

    def load(self, config: dict[str, Any], finished: bool, device: torch.device) -> dict[str, Any] | None:
        """The checkpoint to resume from (a collective), or None: none, another configuration's, or a
        finished run's. The first trainer decides for every rank."""
        verdict = [self._verdict(config, finished) if dist.get_rank() == self.first else None]
        dist.broadcast_object_list(verdict, src=self.first, group=self.group)
        if verdict[0] != "resume":
            if verdict[0]:
                log.warning("%s", verdict[0])
            return None
        state = torch.load(self.path, map_location=device, weights_only=False)
        state["mine"] = state["ranks"][self.rank]
        return state

    def _verdict(self, config: dict[str, Any], finished: bool) -> str | None:
        if not self.path.is_file():
            return None
        if finished:
            return f"{self.path}: the run is finished; its checkpoint is not resumed"
        try:
            head = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - a damaged file: start over, saying why
            return f"{self.path}: unreadable ({type(e).__name__}), starting over"
        if head.get("format") != _FORMAT or not same_run(head.get("config", {}), config):
            return f"{self.path}: another configuration's checkpoint, starting over"
        if int(head.get("size", -1)) != self.size:
            return f"{self.path}: written by {head.get('size')} training ranks, not {self.size}; starting over"
        return "resume"
