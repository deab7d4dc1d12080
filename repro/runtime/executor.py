"""The executor contract: how one training loop drives every scheduler, ours and the baselines.

An executor, built as ``Class(model, plan, options)``, owns the gradient exchange of one model on one
rank. Every step, with ``opt = ex.wrap_optimizer(optimizer)`` made once::

    opt.zero_grad(); ex.before_forward(); loss = loss_fn(ex.module, x, y); loss.backward()
    ex.after_backward(); opt.step()

- ``module``: what to call for the forward (the model, or a wrapper such as DDP);
- ``before_forward()``: e.g. broadcast buffers as DDP does, or wait for gathered parameters;
- ``after_backward()``: every ``param.grad`` then holds the averaged gradient, unless
  ``wrap_optimizer`` took the update over (DeAR, ByteScheduler: ``step()`` starts it, ``flush()``
  applies what is pending);
- ``GradScaler``: ``scaler.step(opt)`` works as usual; a wrapper with ``_step_supports_amp_scaling``
  gets :func:`scaled_step`, decides the skip from the exchanged gradient and reports it
  (:class:`FoundInfReport`);
- ``flush()``: nothing outstanding, every rank holds the same parameters; ``remove()``: detach hooks;
- ``tables()``: extra tidy tables (name -> rows) written as ``<name>.csv``;
- ``grad_ready_s`` (layer -> seconds, :mod:`repro.runtime.clock`) and ``timings`` (read after
  ``settle_timings()``) may be empty where not observed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch
from torch import nn

from repro.core.plan import Plan

__all__ = ["BucketTiming", "Executor", "ExecutorOptions", "FoundInfReport", "ScaledStep", "check_scaled_step",
           "nonfinite_and_unscale", "scaled_step", "timing_row"]


class ScaledStep:
    """What ``GradScaler.step`` hands an optimizer with ``_step_supports_amp_scaling``: ``inv_scale``
    (float32 ``1 / scale``; None when ``scaler.unscale_(opt)`` already ran this step) and this rank's
    inf/nan verdict, a tensor that :meth:`found_inf_tensor` passes on unread (no host sync)."""

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
    """The :class:`ScaledStep` ``GradScaler.step`` attached to ``optimizer`` for this ``step()`` call, or
    None without an enabled GradScaler. Reads no tensor."""
    d = vars(optimizer)
    if "found_inf" not in d:
        return None
    grad_scale = d.get("grad_scale")
    inv = None if grad_scale is None else grad_scale.double().reciprocal().float()
    return ScaledStep(inv, d["found_inf"])


def nonfinite_and_unscale(grads: Any, inv_scale: torch.Tensor, device: torch.device | str) -> bool:
    """Multiply the dense gradients ``grads`` by ``inv_scale`` in place, as ``GradScaler.unscale_`` does
    (its fused kernel per device and dtype, even when one is not finite), and say whether any held an
    inf or nan: one host sync however many gradients there are."""
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
    """RuntimeError for a GradScaler step a self-updating family cannot do right: gradients unscaled
    before the exchange finished, or a scaler it was not given."""
    if amp is None:
        return
    if amp.inv_scale is None:
        raise RuntimeError(f"{family}: scaler.unscale_(opt) was called before the exchange finished; call "
                           "opt.synchronize() first (or leave the unscaling to scaler.step(opt))")
    if report is None:
        raise RuntimeError(f"{family} under a GradScaler: pass it to wrap_optimizer(optimizer, grad_scaler=scaler) "
                           "(its update() must learn whether this step was skipped on every rank)")


class FoundInfReport:
    """Tells a ``GradScaler``'s ``update()`` whether this step's gradient had an inf/nan: ``report(found)``
    unscales a one-parameter holder whose gradient is ``inf`` or 0 (public API only). ``update()`` sees
    this OR the scaler's own check, so the reported verdict must cover that check."""

    def __init__(self, grad_scaler: Any, device: torch.device | str = "cpu") -> None:
        self.grad_scaler = grad_scaler
        self._param = nn.Parameter(torch.zeros(1, device=device), requires_grad=False)
        self.param_groups = [{"params": [self._param]}]

    def report(self, found: bool) -> None:
        self._param.grad = torch.full_like(self._param, float("inf") if found else 0.0)
        self.grad_scaler.unscale_(self)


def timing_row(record: Any, origin_s: float, rename: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``buckets.csv`` row of a timing record (a dataclass, or any object's attributes): sequences as
    their length, float ``*_s`` stamps in seconds after ``origin_s``; ``rename``: field -> column."""
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
        """This record as one ``buckets.csv`` row, ``launch_s`` as ``start_s``."""
        return timing_row(self, origin_s, {"launch_s": "start_s"})


@dataclass(frozen=True)
class ExecutorOptions:
    """Run options an executor may use: the plan's layer ``view``, whether to record the last step's
    per-message timeline, the training ranks' ``group`` (None: the whole job) and the gradient-ready
    ``clock`` (None: :func:`repro.runtime.clock.make_clock` for the model's device)."""

    view: str = "tensor"
    record_timeline: bool = False
    group: Any = None
    clock: Any = None


class Executor:
    """Base class: no communication. ``finishes_in_backward``: :meth:`after_backward` loses no overlap
    at the end of the backward, so ``repro.distribute`` runs it there (as DDP)."""

    finishes_in_backward = False
    # whether before_forward broadcasts the buffers (repro.distribute sets it before each forward)
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
        """Return once ``timings`` holds every stamp of the last iteration."""

    def before_forward(self) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def remove(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """State kept across steps besides model and optimizer (e.g. error-feedback residuals), after
        :meth:`flush`; empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (on an executor built with the same plan)."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state, but the checkpoint holds {sorted(state)}")
