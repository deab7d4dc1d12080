"""Executors of the baselines that run no plan of ours: PyTorch DDP and no communication at all."""

from __future__ import annotations

from torch import nn

from repro.plan import Plan
from repro.runtime.executor import Executor, ExecutorOptions
from repro.trace import Layer, Trace
from repro.workload.layers import layer_parameters

__all__ = ["TorchDDPExecutor", "LocalExecutor"]


class LocalExecutor(Executor):
    """One worker's computation: no communication (the baseline of speedups)."""


class TorchDDPExecutor(Executor):
    """PyTorch ``DistributedDataParallel`` (its own buckets, hooks and buffer broadcast).

    Without a plan, DDP's defaults; with one, DDP is given the plan's bucket sizes through
    ``bucket_cap_mb_list`` (DDP keeps its own bucket order and membership rules).
    DDP synchronises inside ``loss.backward()``, so every hook of the contract is a no-op.
    """

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None) -> None:
        super().__init__(model, plan, options)
        device = next(model.parameters()).device
        ids = [device.index] if device.type == "cuda" else None
        kwargs = {}
        if plan is not None:
            kwargs["bucket_cap_mb_list"] = [b / 2**20 for b in plan.bucket_bytes(_sizes_trace(model, self.options.view))]
        self._ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids, **kwargs)

    @property
    def module(self) -> nn.Module:
        return self._ddp


def _sizes_trace(model: nn.Module, view: str) -> Trace:
    """The model's layers with their gradient sizes and no timings (enough for Plan.bucket_bytes)."""
    layers = layer_parameters(model, view)
    return Trace("model", 1, "-", "float32",
                 [Layer(n, sum(p.numel() for _, p in ps), sum(p.numel() * p.element_size() for _, p in ps), 0.0, 0.0)
                  for n, ps in layers.items()])
