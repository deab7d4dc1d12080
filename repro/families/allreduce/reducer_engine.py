"""Run an all-reduce Plan on PyTorch's C++ reducer (``torch.distributed.Reducer``, DDP's engine).

The plan's buckets, in plan order, are handed to the reducer with one exact byte cap each, so the
exchange runs at DDP's speed with the plan's buckets; averaging, unused parameters and ``.grad`` are
DDP's bit for bit. :func:`unfit_reason` names what it cannot run (wire dtypes, cycle times, split
layers, mixed dtypes/devices, sparse gradients, an explicit clock, a non-CPU device); the all-reduce
executor then uses its Python hooks. Details: docs/design/families.md.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Plan, PlanError
from repro.runtime.clock import clock_for
from repro.runtime.executor import BucketTiming
from repro.workload.layers import layer_parameters

__all__ = ["ReducerAllReduce", "unfit_reason"]


def unfit_reason(model: nn.Module, plan: Plan, view: str, clock: Any = None) -> str | None:
    """Why ``plan`` cannot run on the C++ reducer for ``model`` (one phrase), or None when it can."""
    if plan.family != "allreduce":
        return f"a '{plan.family}' plan"
    if plan.wire_dtype is not None:
        return f"a wire dtype ({plan.wire_dtype})"
    if plan.option("cycle_s") is not None:
        return "Horovod's cycle time"
    if any(b.piece is not None for b in plan.buckets):
        return "layers split into pieces"
    if clock is not None:
        return "an explicit clock"
    layers = layer_parameters(model, view)
    planned = [n for b in plan.buckets for n in b.layers]
    if sorted(planned) != sorted(layers) or len(set(planned)) != len(planned):
        return "a plan that does not cover the model's layers once each"
    params = [p for ps in layers.values() for _, p in ps]
    if len({id(p) for p in params}) != len(params):
        return "a parameter in two layers"
    if len({(p.dtype, p.device) for p in params}) != 1:
        return "parameters of several dtypes or devices"
    if params[0].device.type != "cpu":
        return f"a {params[0].device.type} device"
    if any(p.numel() == 0 for p in params):
        return "an empty parameter"
    if any(getattr(m, "sparse", False) is True for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))):
        return "sparse-gradient embeddings"
    return None


def _output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors requiring grad in a forward's output (a tensor, or sequences and mappings of them)."""
    found, todo = [], [output]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            if x.requires_grad:
                found.append(x)
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif hasattr(x, "__dataclass_fields__"):
            todo.extend(getattr(x, f) for f in x.__dataclass_fields__)
    return found


class ReducerAllReduce:
    """Execute all-reduce ``plan`` on ``model``'s gradients with ``torch.distributed.Reducer``; the
    surface of :class:`repro.families.allreduce.executor.BucketedAllReduce`."""

    def __init__(self, model: nn.Module, plan: Plan, *, view: str = "tensor", group: Any = None,
                 record_timeline: bool = False) -> None:
        reason = unfit_reason(model, plan, view)
        if reason is not None:
            raise PlanError(f"the C++ reducer does not run {reason}")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.launch.local")
        self.model, self.plan = model, plan
        self.process_group = group if group is not None else dist.distributed_c10d._get_default_group()
        self.world_size = dist.get_world_size(group)
        layers = layer_parameters(model, view)
        self._params: list[nn.Parameter] = [p for b in plan.buckets for name in b.layers for _, p in layers[name]]
        self._layer_of: list[str] = [name for b in plan.buckets for name in b.layers for _ in layers[name]]
        first = self._params[0]
        # the "had a gradient" flags, one per parameter (plan order)
        self._flags = nn.Parameter(torch.zeros(len(self._params), dtype=first.dtype, device=first.device))
        reducer_params = [*self._params, self._flags]
        bucket_indices, caps, at = [], [], 0
        for b in plan.buckets:
            n = sum(len(layers[name]) for name in b.layers)
            bucket_indices.append(list(range(at, at + n)))
            caps.append(sum(p.numel() * p.element_size() for p in self._params[at:at + n]))
            at += n
        # the flags close the plan's last bucket (the input side, whose gradients come last anyway):
        # a bucket of their own would cost one more all-reduce
        bucket_indices[-1].append(at)
        flag_bytes = self._flags.numel() * self._flags.element_size()
        caps[-1] += flag_bytes
        self._reducer = dist.Reducer(reducer_params, bucket_indices, caps, self.process_group,
                                     [False] * len(reducer_params), caps[0], False, False, {}, caps[0],
                                     bucket_bytes_cap_list=caps)
        # the one rebuild, now, from the plan's order (every rank does it: it broadcasts rank 0's buckets)
        self._reducer._push_all_rebuilt_params()
        self._reducer._rebuild_buckets()
        # the reducer's buckets after its rebuild must be the plan's (membership and order)
        position = {id(p): i for i, p in enumerate(reducer_params)}
        got = [[position.get(id(p), -1) for p in gb.parameters()] for gb in self._reducer._get_zeros_like_grad_buckets()]
        if got != bucket_indices:
            self._reducer._remove_autograd_hooks()
            raise PlanError(f"the C++ reducer formed {len(got)} bucket(s) where the plan has {len(bucket_indices)} "
                            "(or other members); run it on the Python hook engine (engine='hooks')")
        self._reducer._set_ddp_runtime_logging_sample_rate(1)  # a ready stamp per parameter every iteration
        self.timings = [BucketTiming(k, tuple(b.layers), caps[k] - (flag_bytes if k == len(caps) - 1 else 0))
                        for k, b in enumerate(plan.buckets)]
        if record_timeline:
            dist._register_comm_hook(self._reducer, None, self._timed_allreduce)
        self.clock = clock_for(model, None)
        self.grad_ready_s: dict[str, float] = {}
        self._stamp_ready = first.device.type == "cpu"
        self._held = False
        self._prepared = False   # prepare_for_backward ran for the forward in flight
        self._queued = False     # the end-of-backward callback is queued for this backward
        self._missing: list[int] | None = None  # set once this iteration's flags are marked
        self._prepare_s = math.nan
        self._forward_hook = model.register_forward_hook(self._after_forward)

    def hold(self, held: bool) -> None:
        """While held (``no_sync``), forwards prepare no exchange: the backward accumulates locally."""
        self._held = held

    def prepare_for_forward(self) -> None:
        self._reducer.prepare_for_forward()

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._held or not module.training or not torch.is_grad_enabled():
            return
        outputs = _output_tensors(output)
        self._prepare_s = time.perf_counter()
        self._reducer.prepare_for_backward([])
        self._prepared, self._queued, self._missing = True, False, None
        for t in outputs:  # the first to get its gradient: the backward has started
            t.register_hook(self._at_backward_start)

    def _at_backward_start(self, grad: torch.Tensor) -> None:
        if self._prepared and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._at_backward_end)

    def _at_backward_end(self) -> None:
        """At the end of the backward (where the reducer can still queue its finalisation): mark the
        parameters this rank had no gradient for, then the flags, which completes the last bucket."""
        if self._missing is not None:
            return
        missing = [i for i, p in enumerate(self._params) if p.grad is None]
        self._missing = missing
        hook = self._reducer._autograd_hook
        for i in missing:
            hook(i)
        flags = torch.ones_like(self._flags)  # a new one each time: the reducer copies the average back into it
        if missing:
            flags[missing] = 0
        self._flags.grad = flags
        hook(len(self._params))

    def _timed_allreduce(self, state: Any, bucket: Any) -> torch.futures.Future:
        """record_timeline's comm hook: DDP's averaging (``* 1/world_size``), stamped on the host."""
        record = self.timings[bucket.index()]
        buf = bucket.buffer()
        buf.mul_(1.0 / self.world_size)
        record.launch_s, record.end_s = time.perf_counter(), math.nan

        def done(fut: torch.futures.Future) -> torch.Tensor:
            record.end_s = time.perf_counter()
            return fut.value()[0]

        return self.process_group.allreduce([buf]).get_future().then(done)

    def _finalized(self) -> bool:
        try:
            self._reducer._check_reducer_finalized()
        except RuntimeError:
            return False
        return True

    def finish(self) -> None:
        """After ``loss.backward()``: every bucket reduced and every ``param.grad`` the average."""
        if not self._prepared:
            raise RuntimeError("no exchange was prepared for this backward: call the model in train mode with "
                               "autograd on (outside no_sync) before backward, then step")
        self._prepared = False
        if self._missing is None:  # the backward never reached the output tensors: finish in a one-node one
            anchor = torch.zeros((), requires_grad=True)
            with torch.enable_grad():  # finish() may run inside optimizer.step(), under no_grad
                node = anchor.clone()
                node.register_hook(lambda grad: self._at_backward_end())
                node.backward()
        if not self._finalized():
            raise RuntimeError("the gradient exchange did not finish: some parameter got no gradient although its "
                               ".grad is not None (zero_grad(set_to_none=False)?); use zero_grad() (set_to_none=True)")
        missing = self._missing
        if missing:
            reduced = self._flags.grad
            for i in missing:
                if float(reduced[i]) == 0.0:  # no rank had a gradient for it: left untouched, as DDP
                    self._params[i].grad = None
        self._stamp(missing)

    def _stamp(self, missing) -> None:
        """``grad_ready_s`` of this iteration from the reducer's stamps (``missing`` parameters excluded)."""
        if not self._stamp_ready:
            return
        stats = self._reducer.get_backward_stats()
        ready: dict[str, float] = {}
        skip = set(missing)
        for i, layer in enumerate(self._layer_of):
            if i in skip:
                continue
            t = self._prepare_s + stats[i] * 1e-9
            if t > ready.get(layer, -math.inf):
                ready[layer] = t
        self.grad_ready_s.clear()
        self.grad_ready_s.update(ready)

    def remove(self) -> None:
        """Detach the reducer's hooks and the forward hook; gradients stay as they are."""
        self._forward_hook.remove()
        if self._reducer is not None:
            self._reducer._remove_autograd_hooks()
            self._reducer = None
