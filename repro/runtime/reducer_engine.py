"""Run an all-reduce Plan on PyTorch's own C++ reducer (``torch.distributed.Reducer``, DDP's engine).

Why: a gradient hook written in Python costs a Python call per parameter inside the backward, and on a
CPU that is what kept :class:`repro.runtime.allreduce.BucketedAllReduce` behind DDP (tiny_resnet on 2
gloo ranks: a minimal Python hook executor measured 1.09-1.12x DDP's step, as slow as ours, while DDP's
reducer marks gradients ready in C++). This engine hands the plan's buckets to that reducer, so the
exchange runs at DDP's speed by construction while the buckets stay the plan's (MG-WFBP's, the optimum's,
...), in the plan's order.

Contract (the same as ``BucketedAllReduce``'s where both apply; :class:`ReducerAllReduce`):

- **Buckets**: the reducer gets the parameters in plan order, bucket by bucket, and one cap per bucket
  equal to its exact bytes (``bucket_bytes_cap_list``); it is rebuilt once at construction from that
  order (the rebuild DDP does after its first backward; done here at once so that it never happens
  later, and so that the reducer does not collect a rebuild list every iteration) and the resulting
  membership is checked against the plan (:class:`~repro.plan.PlanError` when it differs). Buckets
  are all-reduced in plan order; a bucket never overtakes an earlier one (the reducer's rule).
- **Averaging**: one Python comm hook per bucket (not per parameter) multiplies the bucket by
  ``1 / world_size`` (the product DDP's reducer takes while copying gradients in, so the parameters are
  DDP's bit for bit), writes the bucket's flags (below) and starts its all-reduce. Each ``param.grad``
  gets the averaged values copied back, as under DDP's default (bucket views,
  ``gradient_as_bucket_view``, measured 2 ms slower a step on tiny_resnet's backward here).
- **Per iteration**: ``prepare_for_forward`` before the forward and ``prepare_for_backward`` when a
  training forward with autograd on ends (a forward hook); nothing while :meth:`hold` is on (the
  door's ``no_sync``: gradients accumulate locally). The backward's C++ hooks launch each bucket.
- **Unused parameters**: each bucket carries one "had a gradient" flag per parameter (a private
  parameter of the engine, last in its bucket, marked ready when the backward reaches the model's
  output, through a hook on the output tensors; the comm hook writes ``1 / world_size`` there, 0 for a
  parameter this rank had no gradient for). A parameter with no gradient on this rank (``.grad`` None
  after the backward) holds its bucket back; :meth:`finish` then marks it ready inside a one-node
  backward (the reducer only finishes an iteration inside one), which puts zeros in its place and
  clears its flag, so every rank issues the same all-reduces. A parameter no rank had a gradient for
  (averaged flag 0, read on the host only on a rank that missed one itself) keeps ``.grad`` None, as
  under DDP's ``find_unused_parameters=True`` and ``BucketedAllReduce``. A backward that never reaches
  the output tensors (a loss from parameters alone) is finished the same way, late but right.
- **Times**: on a CPU, each layer's gradient-ready time comes from the reducer's own per-parameter
  stamps (``get_backward_stats``: nanoseconds since ``prepare_for_backward``), shifted to the
  ``time.perf_counter()`` base; on other devices none are kept (host stamps would be enqueue times).
  With ``record_timeline`` the comm hook also stamps each bucket's launch and completion on the host.

What it does not run (:func:`unfit_reason` names it, and the all-reduce executor then uses the Python
hook engine): plans with a wire dtype, Horovod's cycle time or split layers; models whose parameters do
not share one dtype and device, with sparse-gradient embeddings, or with an empty parameter; an
explicit clock; a device other than the CPU (not yet run on a GPU).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.plan import Plan, PlanError
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


def _first(fut: torch.futures.Future) -> torch.Tensor:
    """The all-reduced bucket: the first tensor of the work's result (what a comm hook's future holds)."""
    return fut.value()[0]


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
    """Execute all-reduce ``plan`` on ``model``'s gradients with ``torch.distributed.Reducer`` (module
    docstring). Same surface as :class:`repro.runtime.allreduce.BucketedAllReduce`: ``finish()``,
    ``remove()``, ``grad_ready_s``, ``timings``, ``clock``; plus ``prepare_for_forward()`` and
    ``hold(held)``."""

    def __init__(self, model: nn.Module, plan: Plan, *, view: str = "tensor", group: Any = None,
                 record_timeline: bool = False) -> None:
        reason = unfit_reason(model, plan, view)
        if reason is not None:
            raise PlanError(f"the C++ reducer does not run {reason}")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.cluster.local")
        self.model, self.plan = model, plan
        self.process_group = group if group is not None else dist.distributed_c10d._get_default_group()
        self.world_size = dist.get_world_size(group)
        layers = layer_parameters(model, view)
        self._params: list[nn.Parameter] = []   # the model's, in plan order
        self._layer_of: list[str] = []
        self._flags: list[nn.Parameter] = []    # one per bucket: a "had a gradient" flag per parameter
        self._flag_index: list[int] = []        # the flags' indices among the reducer's parameters
        self._slot: list[tuple[int, int]] = []  # per parameter: (bucket, its flag's position)
        self._index: list[int] = []             # per parameter: its index among the reducer's parameters
        reducer_params, bucket_indices, caps = [], [], []
        for k, b in enumerate(plan.buckets):
            members = [(name, p) for name in b.layers for _, p in layers[name]]
            idx = []
            for j, (name, p) in enumerate(members):
                idx.append(len(reducer_params))
                self._index.append(len(reducer_params))
                reducer_params.append(p)
                self._params.append(p)
                self._layer_of.append(name)
                self._slot.append((k, j))
            flag = nn.Parameter(torch.zeros(len(members), dtype=members[0][1].dtype, device=members[0][1].device))
            self._flag_index.append(len(reducer_params))
            idx.append(len(reducer_params))
            reducer_params.append(flag)
            self._flags.append(flag)
            bucket_indices.append(idx)
            caps.append(sum(reducer_params[i].numel() * reducer_params[i].element_size() for i in idx))
        self._reducer = dist.Reducer(reducer_params, bucket_indices, caps, self.process_group,
                                     [False] * len(reducer_params), caps[0], False, False, {}, caps[0],
                                     bucket_bytes_cap_list=caps)
        # the one rebuild, now, from the plan's order (every rank does it: it broadcasts rank 0's buckets)
        self._reducer._push_all_rebuilt_params()
        self._reducer._rebuild_buckets()
        self._check_buckets(reducer_params, bucket_indices)
        self._reducer._set_ddp_runtime_logging_sample_rate(1)  # a ready stamp per parameter every iteration
        self.timings = [BucketTiming(k, tuple(b.layers), caps[k] - self._flags[k].numel() * self._flags[k].element_size())
                        for k, b in enumerate(plan.buckets)]
        self._record = record_timeline
        self._inv_world = 1.0 / self.world_size
        self._flag_offset = [caps[k] // self._flags[k].element_size() - self._flags[k].numel()
                             for k in range(len(self._flags))]  # where each bucket's flags start in its buffer
        self._zero_flags: dict[int, list[int]] = {}  # bucket -> flags to clear (this rank had no gradient)
        dist._register_comm_hook(self._reducer, None, self._allreduce_bucket)
        self.clock = clock_for(model, None)
        self.grad_ready_s: dict[str, float] = {}
        self._stamp_ready = self._params[0].device.type == "cpu"
        self._held = False
        self._prepared = False   # prepare_for_backward ran for the forward in flight
        self._flags_marked = False
        self._prepare_s = math.nan
        self._forward_hook = model.register_forward_hook(self._after_forward)

    def _check_buckets(self, reducer_params: list[torch.Tensor], bucket_indices: list[list[int]]) -> None:
        """The reducer's buckets after its rebuild are the plan's (membership and order), else PlanError."""
        position = {id(p): i for i, p in enumerate(reducer_params)}
        got = [[position.get(id(p), -1) for p in gb.parameters()] for gb in self._reducer._get_zeros_like_grad_buckets()]
        if got != bucket_indices:
            self._reducer._remove_autograd_hooks()
            raise PlanError(f"the C++ reducer formed {len(got)} bucket(s) where the plan has {len(bucket_indices)} "
                            "(or other members); run it on the Python hook engine (engine='hooks')")

    # ---- per iteration ----
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
        self._prepared, self._flags_marked = True, False
        for t in outputs:  # the first to get its gradient marks the flags: the backward has started
            t.register_hook(self._at_backward_start)

    def _at_backward_start(self, grad: torch.Tensor) -> None:
        if self._prepared and not self._flags_marked:
            self._mark_flags()

    def _mark_flags(self) -> None:
        """Mark every bucket's flags ready (their values are written by the comm hook at launch)."""
        self._flags_marked = True
        hook = self._reducer._autograd_hook
        for flag, i in zip(self._flags, self._flag_index):
            flag.grad = None  # the reducer zeroes its slots in the bucket
            hook(i)

    def _allreduce_bucket(self, state: Any, bucket: Any) -> torch.futures.Future:
        """The comm hook, one call per bucket: DDP's averaging (``* 1/world_size``: the reducer copies the
        gradients in as they are when a hook is set, and this is the product DDP takes while copying),
        the flags (``1/world_size`` each, 0 where this rank had no gradient), the all-reduce; with
        ``record_timeline`` its launch and completion stamped on the host."""
        k = bucket.index()
        buf = bucket.buffer()
        buf.mul_(self._inv_world)
        flags = buf[self._flag_offset[k]:]
        flags.fill_(self._inv_world)
        for j in self._zero_flags.get(k, ()):
            flags[j] = 0
        fut = self.process_group.allreduce([buf]).get_future()
        if not self._record:
            return fut.then(_first)
        record = self.timings[k]
        record.launch_s, record.end_s = time.perf_counter(), math.nan

        def done(f: torch.futures.Future) -> torch.Tensor:
            record.end_s = time.perf_counter()
            return f.value()[0]

        return fut.then(done)

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
        if self._finalized() and self._flags_marked:
            self._stamp(())
            return
        missing = [i for i, p in enumerate(self._params) if p.grad is None]
        for i in missing:
            k, j = self._slot[i]
            self._zero_flags.setdefault(k, []).append(j)
        anchor = torch.zeros((), requires_grad=True)  # a one-node backward: the reducer finishes inside one

        def complete(grad: torch.Tensor) -> torch.Tensor:
            if not self._flags_marked:
                self._mark_flags()
            for i in missing:
                self._reducer._autograd_hook(self._index[i])
            return grad

        try:
            with torch.enable_grad():  # finish() may run inside optimizer.step(), under no_grad
                node = anchor.clone()
                node.register_hook(complete)
                node.backward()
        finally:
            self._zero_flags.clear()
        if not self._finalized():
            raise RuntimeError("the gradient exchange did not finish: some parameter got no gradient although its "
                               ".grad is not None (zero_grad(set_to_none=False)?); use zero_grad() (set_to_none=True)")
        for i in missing:
            k, j = self._slot[i]
            if float(self._flags[k].grad[j]) == 0.0:  # no rank had a gradient for it: left untouched, as DDP
                self._params[i].grad = None
        self._stamp(missing)

    def _stamp(self, missing) -> None:
        """``grad_ready_s`` of this iteration from the reducer's stamps (parameters in ``missing`` had no
        gradient: a layer none of whose parameters had one gets no time, as under the hook engine)."""
        if not self._stamp_ready:
            return
        stats = self._reducer.get_backward_stats()
        ready: dict[str, float] = {}
        skip = set(missing)
        for i, layer in enumerate(self._layer_of):
            if i in skip:
                continue
            t = self._prepare_s + stats[self._index[i]] * 1e-9
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
