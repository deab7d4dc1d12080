"""What both parameter-server executors share: the plan's buckets laid out on a model's parameters,
flattening them into one message, and the per-bucket timing record. The dedicated-server protocol
(:mod:`repro.runtime.ps`) and the co-located one (:mod:`repro.runtime.ps_colocated`) import it; it
imports neither, so they do not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from repro.plan import Plan, PlanError
from repro.workload.layers import layer_parameters

__all__ = ["PSTiming", "ps_layout", "HandOverOptimizer"]


@dataclass
class PSTiming:
    """One bucket of the last step (``--record-timeline``): when its push was launched and when its pull
    was installed (``perf_counter`` seconds). A stage-2 pull is installed two steps later, after this
    step's record was taken, so its ``end_s`` stays None."""

    bucket: int
    stage: int
    server: int
    bytes: int
    launch_s: float
    end_s: float | None = None


@dataclass(frozen=True)
class _Bucket:
    index: int
    stage: int              # 1 (blocking) or 2 (background)
    server: int
    params: tuple           # parameters in bucket order
    numel: int


def ps_layout(model: nn.Module, plan: Plan, view: str) -> list[_Bucket]:
    """The plan's buckets with their parameters on ``model`` (PlanError if the plan does not fit)."""
    from repro.sim.ps import plan_layout

    if plan is None or plan.family != "ps":
        raise PlanError(f"a parameter-server run needs a 'ps' plan, got {getattr(plan, 'family', None)!r}")
    layers = layer_parameters(model, view)
    out = []
    for b, (bucket, (stage, server)) in enumerate(zip(plan.buckets, plan_layout(plan))):
        params = []
        for name in bucket.layers:
            if name not in layers:
                raise PlanError(f"plan layer '{name}' is not a layer of this model ({view} view)")
            params += [p for _, p in layers[name]]
        out.append(_Bucket(b, stage, server, tuple(params), sum(p.numel() for p in params)))
    covered = sum(len(b.params) for b in out)
    if covered != sum(len(v) for v in layers.values()):
        raise PlanError(f"the plan covers {covered} of the model's {sum(len(v) for v in layers.values())} "
                        "parameters")
    return out


def _flatten_into(buf: torch.Tensor, tensors) -> None:
    off = 0
    for t in tensors:
        n = t.numel()
        buf[off:off + n].copy_(t.reshape(-1))
        off += n


def _unflatten_from(buf: torch.Tensor, params) -> None:
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(buf[off:off + n].view_as(p))
            off += n


class HandOverOptimizer:
    """What the loop steps on a parameter-server rank: the servers apply the optimizer, so ``step()``
    only hands over to the executor (``finish()``: install what the servers computed); ``zero_grad``,
    ``param_groups``, ``state_dict`` and ``load_state_dict`` are the wrapped optimizer's."""

    def __init__(self, executor: Any, optimizer: Any, finish: Callable[[], None]) -> None:
        self.executor = executor
        self.optimizer = optimizer
        self._finish = finish

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self._finish()

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state) -> None:
        self.optimizer.load_state_dict(state)
