"""The executor contract: how one training loop drives every scheduler, ours and the baselines.

An executor owns the gradient exchange of one model on one rank. The loop (:mod:`repro.train`) calls,
every step, with ``opt = ex.wrap_optimizer(optimizer)`` made once::

    opt.zero_grad(); ex.before_forward(); loss = loss_fn(ex.module, x, y); loss.backward()
    ex.after_backward(); opt.step()

and ``ex.flush()`` at the end of training and before an evaluation or a checkpoint, then
``ex.remove()``. Contract:

- ``module``: what to call for the forward (the model itself, or a wrapper such as PyTorch DDP);
- ``before_forward()``: whatever must happen before the forward (broadcast buffers as DDP does; a
  family that gathers parameters in the next forward waits for them here or in forward pre-hooks);
- ``after_backward()``: when it returns, every ``param.grad`` holds the exchanged (averaged) gradient
  the optimizer should apply — unless ``wrap_optimizer`` took the update over;
- ``wrap_optimizer(optimizer)``: what the loop calls ``zero_grad()`` and ``step()`` on (default: the
  optimizer itself). A family that applies updates elsewhere (DeAR: bucket by bucket in the next
  forward) returns a wrapper whose ``step()`` only starts that; ``flush()`` then applies what is
  pending;
- ``flush()``: no communication of this executor is outstanding afterwards, and the model's
  parameters are the ones every rank agrees on (families that overlap iterations finish them here);
- ``remove()``: detach hooks; the model is left usable without the executor;
- ``tables()``: extra tidy tables the executor recorded (name -> list of row dicts, e.g. a tuner's
  trials), written by rank 0 as ``<name>.csv`` in the run folder; empty by default;
- ``grad_ready_s`` (layer -> ``time.perf_counter()`` when its gradient was ready in the last backward)
  and ``timings`` (per-message launch/end times when recording) may be empty where not observed.

Executors are built by ``Class(model, plan, options)`` with :class:`ExecutorOptions`; the scheduler
registry (:mod:`repro.schedulers`) names each scheduler's executor class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from torch import nn

from repro.plan import Plan

__all__ = ["Executor", "ExecutorOptions", "timing_row"]


def timing_row(record: Any, origin_s: float, rename: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``buckets.csv`` row of a timing record (a dataclass, or any object's attributes): sequences
    (e.g. ``layers``) as their length, float time stamps (names ending in ``_s``) in seconds after
    ``origin_s``; ``rename`` maps field names to column names."""
    items = ((f.name, getattr(record, f.name)) for f in fields(record)) if is_dataclass(record) \
        else vars(record).items()
    rename = rename or {}
    return {rename.get(k, k): (len(v) if isinstance(v, (tuple, list)) else
                               v - origin_s if k.endswith("_s") and isinstance(v, float) else v) for k, v in items}


@dataclass(frozen=True)
class ExecutorOptions:
    """Run options an executor may use: the layer ``view`` of the plan, whether to record the
    per-message timeline of the last step, and the process ``group`` of the training ranks (None: the
    whole job; a family with serving ranks trains on the others)."""

    view: str = "tensor"
    record_timeline: bool = False
    group: Any = None


class Executor:
    """Base class: no communication (every hook does nothing). Subclasses override what they need."""

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None) -> None:
        self.model = model
        self.plan = plan
        self.options = options or ExecutorOptions()
        self.grad_ready_s: dict[str, float] = {}
        self.timings: list[Any] = []

    @property
    def module(self) -> nn.Module:
        return self.model

    def wrap_optimizer(self, optimizer: Any) -> Any:
        return optimizer

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def before_forward(self) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def remove(self) -> None:
        pass
