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
- mixed precision (``torch.amp.GradScaler``): the loop is the ordinary one,
  ``scaler.scale(loss).backward(); ex.after_backward(); scaler.step(opt); scaler.update()``. Families
  whose ``after_backward`` leaves the exchanged gradients in ``param.grad`` need nothing more. A family
  that updates parameters itself (DeAR, ByteScheduler) returns a wrapper with
  ``_step_supports_amp_scaling``: ``GradScaler.step`` then calls its ``step()`` every time (never skips
  it, so every rank issues the same collectives) with the scale and its inf check attached
  (:func:`scaled_step`), and the family unscales what it applies, decides the skip from the exchanged
  gradient (the same on every rank) and reports that verdict to the scaler's ``update()``
  (:class:`FoundInfReport`; such families take ``wrap_optimizer(optimizer, grad_scaler=scaler)``);
- ``flush()``: no communication of this executor is outstanding afterwards, and the model's
  parameters are the ones every rank agrees on (families that overlap iterations finish them here);
- ``remove()``: detach hooks; the model is left usable without the executor;
- ``tables()``: extra tidy tables the executor recorded (name -> list of row dicts, e.g. a tuner's
  trials), written by rank 0 as ``<name>.csv`` in the run folder; empty by default;
- ``grad_ready_s`` (layer -> when its gradient was ready in the last backward, seconds on the host's
  ``time.perf_counter()`` base, on a GPU when the device computed it: :mod:`repro.runtime.clock`) and
  ``timings`` (per-message launch/end times when recording; read after ``settle_timings()``) may be
  empty where not observed.

Executors are built by ``Class(model, plan, options)`` with :class:`ExecutorOptions`; the scheduler
registry (:mod:`repro.core.schedulers`) names each scheduler's executor class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch
from torch import nn

from repro.core.plan import Plan

__all__ = ["BucketTiming", "Executor", "ExecutorOptions", "FoundInfReport", "ScaledStep", "check_scaled_step", "nonfinite_and_unscale", "scaled_step", "timing_row"]


class ScaledStep:
    """What ``torch.amp.GradScaler.step`` hands an optimizer that sets ``_step_supports_amp_scaling``:
    ``inv_scale`` (float32 ``1 / scale``, computed as ``GradScaler.unscale_`` does; None when
    ``scaler.unscale_(opt)`` already ran this step) and the verdict of its inf/nan check of the
    ``param.grad`` of ``opt.param_groups`` on this rank.

    The verdict is a tensor (GradScaler's own, on the scaler's device): :meth:`found_inf_tensor` hands it
    on without reading it, so a family that folds it into its own check (one all-reduce, one read)
    makes no extra host sync; :attr:`found_inf` reads it (one host sync, the first time only)."""

    __slots__ = ("inv_scale", "_found", "_found_bool")

    def __init__(self, inv_scale: torch.Tensor | None, found_inf: torch.Tensor | bool | float) -> None:
        self.inv_scale = inv_scale
        self._found = found_inf
        self._found_bool: bool | None = None if isinstance(found_inf, torch.Tensor) else bool(found_inf)

    @property
    def found_inf(self) -> bool:
        """Whether GradScaler's check found an inf/nan on this rank (reads the tensor: a host sync)."""
        if self._found_bool is None:
            self._found_bool = bool(self._found.item())
        return self._found_bool

    def found_inf_tensor(self, device: torch.device | str) -> torch.Tensor:
        """The verdict as a fresh float32 0-d tensor on ``device`` (1.0: found, 0.0: not), unread."""
        if isinstance(self._found, torch.Tensor):
            return self._found.detach().to(device=device, dtype=torch.float32).reshape(()).clone()
        return torch.full((), float(self._found), dtype=torch.float32, device=device)

    def __repr__(self) -> str:
        return f"ScaledStep(inv_scale={self.inv_scale!r}, found_inf={self._found!r})"


def scaled_step(optimizer: Any) -> ScaledStep | None:
    """The :class:`ScaledStep` ``GradScaler.step`` attached to ``optimizer`` (its ``grad_scale`` and
    ``found_inf`` attributes, set for the duration of the call to ``optimizer.step()``), or None when
    ``step()`` was called without an enabled GradScaler. Reads no tensor (no host sync)."""
    d = vars(optimizer)
    if "found_inf" not in d:
        return None
    grad_scale = d.get("grad_scale")
    inv = None if grad_scale is None else grad_scale.double().reciprocal().float()
    return ScaledStep(inv, d["found_inf"])


def nonfinite_and_unscale(grads: Any, inv_scale: torch.Tensor, device: torch.device | str) -> bool:
    """Multiply every tensor of ``grads`` by ``inv_scale`` (GradScaler's float32 ``1 / scale``) in place
    and say whether any of them held an inf or nan: GradScaler.unscale_'s own fused kernel
    (``torch._amp_foreach_non_finite_check_and_unscale_``), once per (device, dtype) group, into one
    float32 flag on ``device``, read once: one host sync per step however many gradients there are. As
    ``GradScaler.unscale_``,
    the gradients are unscaled even when one is not finite; the caller then skips the step and they are
    not applied. Dense floating-point gradients (what the executors hand the optimizer)."""
    found = torch.zeros((), dtype=torch.float32, device=device)
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    with torch.no_grad():
        for (dev, _), group in groups.items():
            flag = found if dev == found.device else torch.zeros((), dtype=torch.float32, device=dev)
            torch._amp_foreach_non_finite_check_and_unscale_(group, flag, inv_scale.to(dev))
            if flag is not found:
                found += flag.to(found.device)
    return bool(found.item())


def check_scaled_step(amp: ScaledStep | None, report: "FoundInfReport | None", family: str) -> None:
    """Refuse a GradScaler step a family that applies its own updates cannot do right: gradients
    unscaled by ``scaler.unscale_(opt)`` before the exchange finished (they are the local ones), or a
    scaler the family was not given (its ``update()`` would not learn the verdict on every rank)."""
    if amp is None:
        return
    if amp.inv_scale is None:
        raise RuntimeError(f"{family}: scaler.unscale_(opt) was called before the exchange finished; call "
                           "opt.synchronize() first (or leave the unscaling to scaler.step(opt))")
    if report is None:
        raise RuntimeError(f"{family} under a GradScaler: pass it to wrap_optimizer(optimizer, grad_scaler=scaler) "
                           "(its update() must learn whether this step was skipped on every rank)")


class FoundInfReport:
    """Tells a ``GradScaler``'s ``update()`` that this step's gradient had an inf/nan (or not).

    ``update()`` backs the scale off when any found_inf recorded since the last update is nonzero, and
    those are recorded only by ``scaler.unscale_(x)`` (or its check inside ``step``) for whatever ``x``
    holds the gradients. ``report(found)`` calls ``scaler.unscale_`` on a one-parameter holder whose
    gradient is ``inf`` (found) or 0: only public GradScaler API, and the verdict ``update()`` sees is
    the holder's OR the scaler's own check of ``param.grad`` (so a family must report a verdict that
    covers that check: every rank then backs off together)."""

    def __init__(self, grad_scaler: Any, device: torch.device | str = "cpu") -> None:
        self.grad_scaler = grad_scaler
        self._param = nn.Parameter(torch.zeros(1, device=device), requires_grad=False)
        self.param_groups = [{"params": [self._param]}]

    def report(self, found: bool) -> None:
        self._param.grad = torch.full_like(self._param, float("inf") if found else 0.0)
        self.grad_scaler.unscale_(self)


def timing_row(record: Any, origin_s: float, rename: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``buckets.csv`` row of a timing record (a dataclass, or any object's attributes): sequences
    (e.g. ``layers``) as their length, float time stamps (names ending in ``_s``) in seconds after
    ``origin_s``; ``rename`` maps field names to column names."""
    items = ((f.name, getattr(record, f.name)) for f in fields(record)) if is_dataclass(record) \
        else vars(record).items()
    rename = rename or {}
    return {rename.get(k, k): (len(v) if isinstance(v, (tuple, list)) else
                               v - origin_s if k.endswith("_s") and isinstance(v, float) else v) for k, v in items}


@dataclass
class BucketTiming:
    """Wall-clock seconds (perf_counter) of one bucket's all-reduce in the last iteration."""

    bucket: int
    layers: tuple[str, ...]
    bytes: int
    launch_s: float = float("nan")
    end_s: float = float("nan")

    def row(self, origin_s: float) -> dict:
        """This record as one ``buckets.csv`` row (:func:`~repro.runtime.executor.timing_row`);
        ``launch_s`` is written as ``start_s`` (the communication's start)."""
        return timing_row(self, origin_s, {"launch_s": "start_s"})


@dataclass(frozen=True)
class ExecutorOptions:
    """Run options an executor may use: the layer ``view`` of the plan, whether to record the
    per-message timeline of the last step, the process ``group`` of the training ranks (None: the
    whole job; a family with serving ranks trains on the others), and the ``clock`` its gradient-ready
    marks go through (None: :func:`repro.runtime.clock.make_clock` for the model's device, CUDA events
    on a GPU)."""

    view: str = "tensor"
    record_timeline: bool = False
    group: Any = None
    clock: Any = None


class Executor:
    """Base class: no communication (every hook does nothing). Subclasses override what they need.

    ``finishes_in_backward``: :meth:`after_backward` can run at the end of the backward pass without
    giving up any overlap the method is for (the exchange is over by then anyway); ``repro.distribute``
    then runs it there, so that ``param.grad`` holds the exchanged gradient when ``backward()`` returns,
    as under DDP."""

    finishes_in_backward = False
    # whether :meth:`before_forward` broadcasts the buffers (DDP: not before a forward that follows one
    # under no_sync; repro.distribute sets it before each training forward)
    sync_buffers = True
    # why DistributedOptimizer.state_dict() cannot checkpoint this executor's optimizer (None: it can)
    checkpoint_refusal: str | None = None

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

    def settle_timings(self) -> None:
        """Return once ``timings`` holds every stamp of the last iteration (an executor whose device
        stamps arrive from a thread waits for them here); nothing to wait for by default."""

    def before_forward(self) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def remove(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """What the executor keeps across steps besides the model and the optimizer (e.g. error-feedback
        residuals), as tensors and plain values, taken after :meth:`flush`; empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (on an executor built with the same plan)."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, but the checkpoint holds {sorted(state)}")
