"""The optimizer wrapper of the families that apply updates themselves, in the next forward (DeAR,
ByteScheduler; also the sparse family under a GradScaler).

``executor``: anything with ``step(amp=None)``, ``flush()`` (apply every pending update) and, for
:meth:`DeferredUpdateOptimizer.synchronize`, ``synchronize()``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from repro.runtime.executor import scaled_step

__all__ = ["ApplyBeforeUse", "DeferredUpdateOptimizer", "hyperparameters", "stepping_with"]


def hyperparameters(optimizer: Any) -> list[dict[str, Any]]:
    """Every param group's hyperparameters now (all keys but ``params``; tensors copied): what a deferred
    update is applied with, whatever is set between ``step()`` and the forward that applies it."""
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups]


@contextlib.contextmanager
def stepping_with(optimizer: Any, snapshot: list[dict[str, Any]] | None) -> Iterator[None]:
    """Inside the block the optimizer's groups hold ``snapshot``'s hyperparameters (groups added since keep
    theirs); the old values come back after it. ``None``: nothing changes."""
    if snapshot is None:
        yield
        return
    saved = []
    for group, snap in zip(optimizer.param_groups, snapshot):
        saved.append((group, {k: group[k] for k in snap if k in group}))
        group.update(snap)
    try:
        yield
    finally:
        for group, values in saved:
            group.update(values)


class _ApplyMode(TorchFunctionMode):
    """Applies the pending update of every parameter (or view of one) among a torch call's arguments."""

    def __init__(self, guard: "ApplyBeforeUse") -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.guard.pending and not self.guard._suspended:
            self.guard.apply_used(args)
            if kwargs:
                self.guard.apply_used(kwargs.values())
        return func(*args, **kwargs)


class ApplyBeforeUse:
    """Applies a deferred update before any use of its parameter in a forward.

    Module pre-hooks apply updates in order, but a parameter used outside its owner's forward
    (``MultiheadAttention.out_proj``, tied embeddings, a parent's parameter) would be read stale. While
    updates are pending, a forward of ``model`` runs under a torch function mode: a tensor argument (or
    one in a list, tuple or keyword value) that is in ``pending`` (id -> key), or a view of one, gets
    ``apply(key)`` first. Outside a forward nothing is watched: call ``flush()`` first."""

    def __init__(self, model: nn.Module, apply: Callable[[Any], None]) -> None:
        self.pending: dict[int, Any] = {}
        self._apply = apply
        self._modes: list[_ApplyMode | None] = []
        self._suspended = 0
        self.handles = [model.register_forward_pre_hook(self._enter),
                        model.register_forward_hook(self._exit, always_call=True)]

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Nothing is watched inside (the executor's own optimizer step); when this guard's mode is the
        innermost one it is off the stack for the block, so the step's ops pay no Python call."""
        from torch.overrides import _get_current_function_mode, _pop_mode_temporarily

        mode = _get_current_function_mode()
        ours = isinstance(mode, _ApplyMode) and mode.guard is self
        self._suspended += 1
        try:
            with _pop_mode_temporarily() if ours else contextlib.nullcontext():
                yield
        finally:
            self._suspended -= 1

    def add(self, params, key: Any) -> None:
        for p in params:
            self.pending[id(p)] = key

    def discard(self, params) -> None:
        for p in params:
            self.pending.pop(id(p), None)

    def apply_used(self, values) -> None:
        pending = self.pending
        for a in values:
            if isinstance(a, torch.Tensor):
                key = pending.get(id(a))
                if key is None and a._base is not None:
                    key = pending.get(id(a._base))
                if key is not None:
                    self._apply(key)
                    if not pending:
                        return
            elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                self.apply_used(a)

    def _enter(self, module: nn.Module, args: Any) -> None:
        mode = _ApplyMode(self) if self.pending else None  # nothing pending: the forward runs unwatched
        if mode is not None:
            mode.__enter__()
        self._modes.append(mode)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        mode = self._modes.pop() if self._modes else None
        if mode is not None:
            mode.__exit__(None, None, None)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.pending.clear()


class DeferredUpdateOptimizer:
    """The optimizer the loop steps when the executor applies the updates itself: ``step()`` hands over
    to ``executor.step()`` (updates left pending); ``state_dict()`` flushes first; everything else is
    the wrapped optimizer's. Under a GradScaler (``_step_supports_amp_scaling``) every rank's
    ``scaler.step(opt)`` reaches :meth:`step`, with the scale attached. ``synchronize()`` (as Horovod's)
    finishes the exchange now, so ``param.grad`` holds the averaged gradient before ``step()``."""

    _step_supports_amp_scaling = True
    family = "this family"  # named in refusals

    def __init__(self, executor: Any, optimizer: Any) -> None:
        self.executor = executor
        self.optimizer = optimizer

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError(f"{self.family}: step() takes no closure here (the optimizer repro.distribute returns "
                             "evaluates one)")
        self.executor.step(amp=scaled_step(self))

    def synchronize(self) -> None:
        """Finish this step's exchange now: ``param.grad`` is the averaged gradient."""
        self.executor.synchronize()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def state_dict(self) -> dict:
        """The wrapped optimizer's state after every pending update is applied."""
        self.executor.flush()
        return self.optimizer.state_dict()

    def __getattr__(self, name: str) -> Any:  # anything else (defaults, add_param_group, ...): the optimizer's
        if name in ("optimizer", "executor"):  # not set yet (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)
