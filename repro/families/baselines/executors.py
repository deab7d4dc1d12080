"""Executors of the baselines that run no plan of ours: PyTorch DDP and no communication at all."""

from __future__ import annotations

from torch import nn

from repro.core.plan import Plan
from repro.runtime.executor import Executor, ExecutorOptions
from repro.core.trace import Layer, Trace
from repro.workload.layers import layer_parameters

__all__ = ["TorchDDPExecutor", "LocalExecutor", "ddp_caps_mb"]


class LocalExecutor(Executor):
    """One worker's computation: no communication (the baseline of speedups)."""


class TorchDDPExecutor(Executor):
    """PyTorch ``DistributedDataParallel``: its defaults, or with a plan the plan's bucket sizes
    (:func:`ddp_caps_mb`). DDP synchronises inside ``loss.backward()``, so the contract's hooks do nothing."""

    finishes_in_backward = True  # DDP itself: param.grad is averaged when backward() returns

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None) -> None:
        super().__init__(model, plan, options)
        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        kwargs = {}
        if plan is not None:
            kwargs["bucket_cap_mb_list"] = ddp_caps_mb(plan, model, self.options.view)
        self._ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, **kwargs)

    @property
    def module(self) -> nn.Module:
        return self._ddp


def ddp_caps_mb(plan: Plan, model: nn.Module, view: str) -> list[float]:
    """DDP's ``bucket_cap_mb_list`` for ``plan`` (MiB): one cap, the threshold, for a ``threshold`` plan of
    single-dtype parameters in the tensor view sent in their own dtype (DDP then applies the rule to the
    gradient order it observes, which a plan made before training cannot know); else each bucket's exact
    bytes (:func:`repro.ddp_bucket_caps`' rule)."""
    threshold = plan.meta.get("threshold_bytes")  # the threshold planner records it there
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if (plan.solver == "threshold" and isinstance(threshold, int) and threshold > 0 and plan.wire_dtype is None
            and view == "tensor" and len(dtypes) == 1):
        return [threshold / 2**20]
    return [b / 2**20 for b in plan.bucket_bytes(_sizes_trace(model, view))]


def _sizes_trace(model: nn.Module, view: str) -> Trace:
    """The model's layers with their gradient sizes and no timings (enough for Plan.bucket_bytes)."""
    layers = layer_parameters(model, view)
    return Trace("model", 1, "-", "float32",
                 [Layer(n, sum(p.numel() for _, p in ps), sum(p.numel() * p.element_size() for _, p in ps), 0.0, 0.0)
                  for n, ps in layers.items()])
