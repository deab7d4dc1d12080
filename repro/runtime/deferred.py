"""The optimizer wrapper of the families that apply updates themselves, in the next forward (DeAR,
ByteScheduler): one implementation of ``step`` / ``synchronize`` / ``zero_grad`` / ``state_dict`` for
both (they had two near-identical copies).

``executor``: anything with ``step(amp=None)`` (what to do at the loop's ``optimizer.step()``),
``flush()`` (apply every pending update) and, for :meth:`DeferredUpdateOptimizer.synchronize`,
``synchronize()``: a :class:`~repro.runtime.dear.DeARExecutor`, the DeAR tuner that owns one, or a
:class:`~repro.runtime.bytescheduler.ByteSchedulerExecutor`; also the sparse family's executor under a
GradScaler (:class:`~repro.runtime.sparse.SparseScaledOptimizer`: its step takes the verdict over
every rank, and its updates are not deferred).
"""

from __future__ import annotations

from typing import Any

from repro.runtime.executor import scaled_step

__all__ = ["DeferredUpdateOptimizer"]


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
