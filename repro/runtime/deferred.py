"""The optimizer wrapper of the families that apply updates themselves, in the next forward (DeAR,
ByteScheduler): one implementation of ``step`` / ``synchronize`` / ``zero_grad`` / ``state_dict`` for
both (they had two near-identical copies).

``executor``: anything with ``step(amp=None)`` (what to do at the loop's ``optimizer.step()``),
``flush()`` (apply every pending update) and, for :meth:`DeferredUpdateOptimizer.synchronize`,
``synchronize()``: a :class:`~repro.families.dear.executor.DeARExecutor`, the DeAR tuner that owns one, or a
:class:`~repro.families.bytescheduler.executor.ByteSchedulerExecutor`; also the sparse family's executor under a
GradScaler (:class:`~repro.families.sparse.executor.SparseScaledOptimizer`: its step takes the verdict over
every rank, and its updates are not deferred).
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
    update must be applied with, whatever an LR scheduler or the user sets between ``step()`` and the
    forward that applies it."""
    return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in g.items() if k != "params"}
            for g in optimizer.param_groups]


@contextlib.contextmanager
def stepping_with(optimizer: Any, snapshot: list[dict[str, Any]] | None) -> Iterator[None]:
    """Inside the block the optimizer's groups hold ``snapshot``'s hyperparameters (from
    :func:`hyperparameters`); the values they held come back after it. Groups added since the snapshot
    keep theirs. ``None``: nothing changes."""
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
    """During a training forward: before any torch function runs, the pending update of every parameter
    among its arguments (or whose view is) is applied (:class:`ApplyBeforeUse`)."""

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

    The families that apply the last step's updates in the next forward (DeAR, ByteScheduler) do it in
    forward pre-hooks of the modules that own the parameters; a parameter used outside its owner's
    forward (``nn.MultiheadAttention``'s ``out_proj``, tied embeddings through ``F.linear(h,
    emb.weight)``, a parameter of a parent module) would be read before its update. While updates are
    pending, a training or evaluation forward of ``model`` runs under a torch function mode that looks
    at every torch call's tensor arguments (and one level of lists, tuples and keyword values): a
    parameter in ``pending`` (id -> key), or a view of one, has ``apply(key)`` called first. The module
    pre-hooks still apply in order (and start the next all-gathers early); the mode catches the rest.
    Outside a forward nothing is watched: code that reads parameters between ``step()`` and the next
    forward calls ``flush()`` first (``model.state_dict()`` does it itself)."""

    def __init__(self, model: nn.Module, apply: Callable[[Any], None]) -> None:
        self.pending: dict[int, Any] = {}
        self._apply = apply
        self._modes: list[_ApplyMode | None] = []
        self._suspended = 0
        self.handles = [model.register_forward_pre_hook(self._enter),
                        model.register_forward_hook(self._exit, always_call=True)]

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Nothing is watched inside (the executor's own optimizer step, which reads and writes the very
        parameters being updated). When this guard's mode is the innermost torch function mode it is
        taken off the stack for the block, so the step's many small ops do not each pay a Python call."""
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
    """What the loop calls ``zero_grad()`` and ``step()`` on when the executor applies the updates
    itself: ``step()`` hands over to ``executor.step()`` (which starts or finishes the exchange and
    leaves the updates pending); ``state_dict()`` flushes first (the state must include the pending
    updates); ``zero_grad``, ``param_groups``, ``state`` and every other attribute are the wrapped
    optimizer's.

    **GradScaler** (``_step_supports_amp_scaling``): ``scaler.step(opt)`` always calls :meth:`step`
    (with the scale and its own inf check attached, :func:`~repro.runtime.executor.scaled_step`), so
    every rank takes part in the exchange; the executor's ``step(amp=...)`` decides what to do with
    them. ``synchronize()`` is the Horovod-style escape hatch: the executor finishes the whole exchange
    now, so that ``param.grad`` holds the averaged gradient (the same on every rank) for
    ``scaler.unscale_(opt)``, clipping or inspection before ``step()``."""

    _step_supports_amp_scaling = True
    family = "this family"  # named in refusals

    def __init__(self, executor: Any, optimizer: Any) -> None:
        self.executor = executor
        self.optimizer = optimizer

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError(f"{self.family}: step() takes no closure here (the optimizer repro.distribute returns "
                             "evaluates one)")
        amp = scaled_step(self)
        if amp is None:
            self.executor.step()
        else:
            self.executor.step(amp=amp)

    def synchronize(self) -> None:
        """Finish this step's exchange now: ``param.grad`` is the averaged gradient (see the class)."""
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
