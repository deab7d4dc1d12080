"""The parameter server co-located on the training ranks: every rank trains and serves the plan's shard
with its own index (server ``s`` is rank ``s``), over collectives only, so it runs on NCCL.

Per step, in an order fixed by the plan: ``after_backward`` finishes the lagged buckets of the previous
step; the optimizer's ``step()`` pushes every bucket to its owner (``reduce`` under BSP/OSP, ``gather``
under ASP/SSP), the owners update and broadcast the fresh buckets; ``before_forward`` installs the pulls
due and applies OSP's LGP correction. Same math as the dedicated servers (:mod:`.executor`).
``optimizer.state_dict()`` gathers the whole state on every rank. Details: docs/design/families.md.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Plan, PlanError
from repro.runtime.buffers import broadcast_buffers
from repro.runtime.clock import CollectiveEnds, model_device
from repro.runtime.executor import Executor, ExecutorOptions, FoundInfReport, ScaledStep, scaled_step
from repro.families.ps.layout import (
    GradChangeWatch, HandOverOptimizer, PSTiming, _Bucket, _flatten_into, _unflatten_from, _views,
    average_into_grads, begin_step, check_whole, fill_push, grad_changed_error, hyperparameters, merge_shards,
    param_indices, param_lrs, ps_layout, push_numel, set_grads_from, set_hyperparameters)

__all__ = ["ColocatedPSExecutor", "ColocatedPSOptimizer", "ScaledColocatedPSOptimizer", "colocated_options",
           "bucket_lag"]


def colocated_options(plan: Plan | None, planner_options: Sequence[str], options: dict[str, Any],
                      world: int) -> dict[str, Any]:
    """The PS scheduler's options under :func:`repro.distribute` (servers co-located on its ``world``
    ranks): ``servers`` defaults to ``world`` (one shard per rank) and may not exceed it. Raises
    ValueError with one line naming the problem."""
    if plan is not None:
        servers = int(plan.option("servers"))
        where = "the plan's"
    else:
        options = dict(options)
        if "servers" in planner_options:
            options.setdefault("servers", world)
        servers = options.get("servers", 1)
        where = "servers"
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
            raise ValueError(f"servers must be a positive integer, got {servers!r}")
    if servers > world:
        raise ValueError(f"{where} {servers} server(s) exceed the job's {world} rank(s): under repro.distribute the "
                         "parameter-server family's servers are co-located on the training ranks (server s on rank s)")
    return options


def bucket_lag(mode: str, stage: int, staleness: int) -> int:
    """Iterations between a push and the forward that uses its pulled values, minus one: 0 = fresh
    (installed by the optimizer's step), 1 = OSP's stage 2, ``staleness`` under SSP."""
    if mode == "osp":
        return 1 if stage == 2 else 0
    if mode == "ssp":
        return int(staleness)
    return 0


class ColocatedPSOptimizer(HandOverOptimizer):
    """What the loop steps: ``step()`` is :meth:`ColocatedPSExecutor.scaled_step`, ``synchronize()``
    :meth:`ColocatedPSExecutor.synchronize`; ``scaler.step`` always calls ``step()`` (with its verdict
    attached), so every rank joins the verdict."""

    _step_supports_amp_scaling = True

    def __init__(self, executor: "ColocatedPSExecutor", optimizer: Any) -> None:
        super().__init__(executor, optimizer, lambda: executor.scaled_step(scaled_step(self)))

    def synchronize(self) -> None:
        self.executor.synchronize()

    @property
    def state(self):
        return self.optimizer.state


#: the wrapper under a GradScaler (one class serves both)
ScaledColocatedPSOptimizer = ColocatedPSOptimizer


class ColocatedPSExecutor(Executor):
    """A rank that trains and serves its shard (module docstring)."""

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None) -> None:
        super().__init__(model, plan, options)
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("the co-located parameter server needs an initialised process group")
        self.buckets: list[_Bucket] = ps_layout(model, plan, self.options.view)
        self.group = self.options.group
        self.rank, self.world = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.servers = int(plan.option("servers"))
        # the timeline's stamps: device times on NCCL (its futures complete at enqueue), host times on gloo
        self._ends = (CollectiveEnds(model_device(model), dist.get_backend(self.group))
                      if self.options.record_timeline else None)
        if self.servers > self.world:
            raise PlanError(f"the plan's {self.servers} server(s) exceed the job's {self.world} rank(s): co-located "
                            "servers live on the training ranks (server s on rank s)")
        self.mode = plan.option("mode")
        self.staleness = int(plan.option("staleness", 0) or 0)
        self.lgp = bool(plan.option("lgp", True)) and self.mode == "osp"
        self.per_rank = self.mode in ("asp", "ssp")   # each rank's gradient is its own optimizer step
        self.lag = {b.index: bucket_lag(self.mode, b.stage, self.staleness) for b in self.buckets}
        for b in self.buckets:
            kinds = {(p.dtype, p.device) for p in b.params}
            if len(kinds) > 1:
                raise PlanError(f"bucket {b.index} mixes parameter dtypes/devices {sorted(map(str, kinds))}: the "
                                "parameter server sends one flat buffer per bucket")
        self._owner = {b.index: self._global(b.server) for b in self.buckets}
        self._mine = [b for b in self.buckets if b.server == self.rank]
        self._fresh = [b for b in self.buckets if self.lag[b.index] == 0]
        self._lagged = [b for b in self.buckets if self.lag[b.index] > 0]
        self._push = {b.index: self._zeros(b, push_numel(b)) for b in self.buckets}
        self._gathered = {b.index: [self._zeros(b, push_numel(b)) for _ in range(self.world)]
                          for b in self._mine if self.per_rank}
        self._free: dict[int, list[torch.Tensor]] = {b.index: [] for b in self.buckets}   # spare pull buffers
        # bucket -> (step, push work or None when synchronize() averaged it already, the groups' settings then)
        self._inflight: dict[int, tuple[int, Any, list[dict]]] = {}
        self._pulls: dict[int, list[tuple[_Bucket, Any, torch.Tensor]]] = {}  # iteration -> pulls to install
        self._local2: list[tuple[_Bucket, torch.Tensor, list[float]]] = []  # LGP: last stage-2 gradients, lrs
        self._local_buf = {b.index: self._zeros(b) for b in self._lagged} if self.lgp else {}
        self._scratch = {b.index: self._zeros(b) for b in self._mine if self.lag[b.index]}
        self._optimizer: Any = None
        self._opt_hooks: list[Any] = []
        self._scaler: Any = None                 # a GradScaler: pushes wait for the step's verdict
        self._report: FoundInfReport | None = None
        self._push_due = False
        self._synced = False                     # synchronize() averaged this step's gradients into param.grad
        self.step_index = 0
        self.bytes_pushed = 0
        self.bytes_pulled = 0
        self._buffer_src = self._global(0)
        self._watch = GradChangeWatch([p for b in self.buckets for p in b.params])
        # every rank starts from the owners' values (as DDP broadcasts rank 0's); owners keep masters
        with torch.no_grad():
            for b in self.buckets:
                buf = self._take(b)
                if self._owner[b.index] == dist.get_rank():
                    _flatten_into(buf, b.params)
                dist.broadcast(buf, src=self._owner[b.index], group=self.group)
                _unflatten_from(buf, b.params)
                self._free[b.index].append(buf)
        self._master = {b.index: self._zeros(b) for b in self._mine if self.lag[b.index]}
        self._sync_masters()

    def _sync_masters(self) -> None:
        self._resync = False
        for b in self._mine:
            if b.index in self._master:
                _flatten_into(self._master[b.index], [p.detach() for p in b.params])

    def _install(self, pulls: list[tuple[_Bucket, Any, torch.Tensor]]) -> None:
        for b, work, buf in pulls:
            work.wait()
            _unflatten_from(buf, b.params)
            self._free[b.index].append(buf)

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    @staticmethod
    def _zeros(b: _Bucket, numel: int | None = None) -> torch.Tensor:
        p = b.params[0]
        return torch.zeros(b.numel if numel is None else numel, dtype=p.dtype, device=p.device)

    def _take(self, b: _Bucket) -> torch.Tensor:
        free = self._free[b.index]
        return free.pop() if free else self._zeros(b)

    def _owns(self, b: _Bucket) -> bool:
        return b.server == self.rank

    def wrap_optimizer(self, optimizer: Any, grad_scaler: Any = None) -> HandOverOptimizer:
        """What the loop steps; with an enabled ``grad_scaler`` the pushes wait for its verdict.
        ``optimizer.state_dict()`` now gathers the shards; ``load_state_dict()`` refuses a partial one."""
        for h in self._opt_hooks:
            h.remove()
        self._optimizer = optimizer
        self._opt_hooks = [optimizer.register_state_dict_post_hook(self._gather_state),
                           optimizer.register_load_state_dict_pre_hook(lambda _opt, sd: check_whole(sd))]
        if grad_scaler is not None and grad_scaler.is_enabled():
            self._scaler = grad_scaler
            self._report = FoundInfReport(grad_scaler, self.buckets[0].params[0].device)
        return ColocatedPSOptimizer(self, optimizer)

    def _gather_state(self, optimizer: Any, state_dict: dict) -> dict:
        """The whole optimizer state on every rank: each parameter's from its owner's shard (one
        ``all_gather_object`` of every rank's own shard; a collective)."""
        index = param_indices(optimizer)
        owned = {index[id(p)]: b.server for b in self.buckets for p in b.params if id(p) in index}
        mine = {i: s for i, s in state_dict["state"].items() if owned.get(i) == self.rank}
        shards: list[Any] = [None] * self.world
        dist.all_gather_object(shards, mine, group=self.group)
        return merge_shards(state_dict, dict(enumerate(shards)), owned)

    def synchronize(self) -> None:
        """Finish this step's exchange early (a collective, between backward and step): under BSP/OSP
        ``param.grad`` becomes the average over the ranks (None where no rank had one), applied as it
        is at the step; under ASP/SSP it stays this rank's own gradient."""
        if not self._push_due or self._synced:
            return
        self._synced = True
        self._watch.clear()
        if self.per_rank:
            return
        self.bytes_pushed += average_into_grads(self.buckets, self._push, self.group, self.world)

    def scaled_step(self, amp: ScaledStep | None) -> None:
        """The optimizer's step: push this rank's ``param.grad`` and finish the fresh buckets. Under a
        GradScaler (``amp``) first one all-reduce of the verdict: push unscaled, or skip everywhere."""
        synced, changed = begin_step(self)
        if amp is not None and self._scaler is None:
            raise ValueError("parameter server: a GradScaler stepped this optimizer but was not given to it: pass it "
                             "to repro.distribute(..., grad_scaler=scaler) so that every rank skips (and backs the "
                             "scale off) together")
        if changed:
            raise grad_changed_error(changed)
        if amp is not None:
            p = self.buckets[0].params[0]
            seen = amp.found_inf_tensor(p.device)  # unread: the all-reduced flag is the step's one read
            dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=self.group)
            found = bool(seen.item() > 0)
            self._report.report(found)
            if found:  # nothing pushed, nothing updated; the step counter stays (as if the batch were not run)
                self._local2 = []
                return
        self._push_all(None if amp is None else amp.inv_scale, synced)
        self._finish_fresh()

    def before_forward(self) -> None:
        if self.sync_buffers:  # DDP's rule under no_sync (Executor.sync_buffers)
            broadcast_buffers(self.model, src=self._buffer_src, group=self.group)
        c = self.step_index
        if self._resync:  # after a flush (or a load) the parameters are the servers' model: masters follow
            self._sync_masters()
        self._install(self._pulls.pop(c, []))
        if self.lgp and self._local2:
            with torch.no_grad():
                for b, grad, lrs in self._local2:
                    for p, g, lr in zip(b.params, _views(grad, b.params), lrs):
                        p.add_(g, alpha=-lr)
            self._local2 = []

    def after_backward(self) -> None:
        self._finish_lagged()
        self._push_due = True  # the pushes go at the step: after clipping, and after a GradScaler's verdict

    def _push_all(self, inv_scale: torch.Tensor | None = None, synced: bool = False) -> None:
        """One async push per bucket in plan order; ``inv_scale``: unscale first. ``synced`` (BSP/OSP):
        ``param.grad`` is the average already, nothing is sent."""
        t = self.step_index
        timings = []
        local2 = []
        hyper = hyperparameters(self._optimizer) if self._lagged else []
        averaged = synced and not self.per_rank
        with torch.no_grad():
            for b in self.buckets:  # plan order, the same on every rank
                buf = self._push[b.index]
                if averaged:   # the flags are synchronize()'s counts, left in place
                    _flatten_into(buf[:b.numel], [p.grad if p.grad is not None else torch.zeros_like(p)
                                                  for p in b.params])
                else:
                    fill_push(buf, b)
                if inv_scale is not None:
                    buf[:b.numel].mul_(inv_scale.to(buf.device, buf.dtype))
                if self.lgp and b.stage == 2:   # a reduce may overwrite a non-owner's input (gloo): keep a copy
                    local = self._local_buf[b.index]
                    local.copy_(buf[:b.numel])
                    local2.append((b, local, param_lrs(self._optimizer, b.params)))
                if self.options.record_timeline:
                    timing = PSTiming(b.index, b.stage, b.server, buf.numel() * buf.element_size(), float("nan"))
                    self._ends.launch(lambda s, timing=timing: setattr(timing, "launch_s", s))
                    timings.append(timing)
                owner = self._owner[b.index]
                if averaged:
                    work = None
                elif self.per_rank:
                    gather = self._gathered[b.index] if self._owns(b) else None
                    work = dist.gather(buf, gather_list=gather, dst=owner, group=self.group, async_op=True)
                else:
                    work = dist.reduce(buf, dst=owner, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
                self._inflight[b.index] = (t, work, hyper if self.lag[b.index] else [])
                if work is not None:
                    self.bytes_pushed += buf.numel() * buf.element_size()
        self._local2 = local2
        if self.options.record_timeline:
            self.timings = timings

    def _apply(self, buckets: list[_Bucket], averaged: bool, hyper: list[dict] | None = None) -> None:
        """The owner's update of its ``buckets`` (pushes complete): lagged ones on their masters; BSP/OSP one
        step with the sum / N (``averaged``: already the average), ASP/SSP one step per rank in rank order; a
        flag 0 means no gradient. ``hyper``: the groups' settings of the gradients' step, put back after."""
        if not buckets:
            return
        if self._optimizer is None:
            raise RuntimeError("the co-located parameter server updates with the optimizer: call "
                               "executor.wrap_optimizer(optimizer) first")
        lagged = [b for b in buckets if b.index in self._master]
        with torch.no_grad():
            for b in lagged:   # swap the master in, keep the training values
                _flatten_into(self._scratch[b.index], b.params)
                _unflatten_from(self._master[b.index], b.params)
        rounds = ([[self._gathered[b.index][w] for b in buckets] for w in range(self.world)] if self.per_rank
                  else [[self._push[b.index] for b in buckets]])
        params = [p for g in self._optimizer.param_groups for p in g["params"]]
        saved = [p.grad for p in params]
        now = hyperparameters(self._optimizer) if hyper else None
        try:
            if hyper:
                set_hyperparameters(self._optimizer, hyper)
            for grads in rounds:
                for p in params:
                    p.grad = None
                for b, g in zip(buckets, grads):
                    if not averaged:
                        g[:b.numel].div_(self.world)
                    set_grads_from(g, b)
                self._optimizer.step()
        finally:
            for p, g in zip(params, saved):
                p.grad = g
            if now is not None:
                set_hyperparameters(self._optimizer, now)
        with torch.no_grad():
            for b in lagged:
                _flatten_into(self._master[b.index], b.params)
                _unflatten_from(self._scratch[b.index], b.params)

    def _pull(self, b: _Bucket, source: torch.Tensor | Sequence[torch.Tensor]) -> tuple[Any, torch.Tensor]:
        """Broadcast bucket ``b``'s new values from its owner (``source``: the owner's master buffer or
        parameters) into a pull buffer (asynchronous)."""
        buf = self._take(b)
        if self._owns(b):
            with torch.no_grad():
                if isinstance(source, torch.Tensor):
                    buf.copy_(source)
                else:
                    _flatten_into(buf, [p.detach() for p in source])
        work = dist.broadcast(buf, src=self._owner[b.index], group=self.group, async_op=True)
        self.bytes_pulled += buf.numel() * buf.element_size()
        return work, buf

    def _finish_fresh(self) -> None:
        """The optimizer's step: wait for the fresh pushes, owners update, broadcast, install."""
        t = self.step_index
        averaged = False
        for b in self._fresh:
            if b.index not in self._inflight:
                raise RuntimeError("step() without after_backward(): the parameter server has no gradient to apply")
            _, work, _ = self._inflight.pop(b.index)
            if work is not None:
                work.wait()
            else:
                averaged = True
        self._apply([b for b in self._fresh if self._owns(b)], averaged)
        pulls = [(b, *self._pull(b, b.params)) for b in self._fresh]
        ends = {timing.bucket: timing for timing in self.timings
                if timing.end_s is None and self.lag[timing.bucket] == 0}
        for b, work, buf in pulls:
            if b.index in ends:  # a fresh bucket ends when its pull has (the device's time on NCCL)
                self._ends.end(work, lambda s, timing=ends[b.index]: setattr(timing, "end_s", s))
            work.wait()
            if not self._owns(b):
                _unflatten_from(buf, b.params)
            self._free[b.index].append(buf)
        self.step_index = t + 1

    def _finish_lagged(self) -> None:
        """Wait for the lagged pushes in flight, owners update their masters with the settings of the
        step they belong to, broadcast (to be installed before the forward of iteration ``t + 1 + lag``)."""
        pending = [(b, *self._inflight.pop(b.index)) for b in self._lagged if b.index in self._inflight]
        if not pending:
            return
        for _, _, work, _ in pending:
            if work is not None:
                work.wait()
        averaged = any(work is None for _, _, work, _ in pending)
        self._apply([b for b, _, _, _ in pending if self._owns(b)], averaged, pending[0][3])
        for b, step, _, _ in pending:
            work, buf = self._pull(b, self._master.get(b.index, b.params))
            self._pulls.setdefault(step + 1 + self.lag[b.index], []).append((b, work, buf))

    def flush(self) -> None:
        """Finish the last step's lagged buckets and install every pull: every rank then holds the
        servers' model. A collective when lagged work is pending (call it on every rank)."""
        if self._push_due or any(b.index in self._inflight for b in self._fresh):
            raise RuntimeError("flush() between backward and step(): call step() first")
        self._finish_lagged()
        for c in sorted(self._pulls):
            self._install(self._pulls.pop(c))
        self._local2 = []
        self._resync = True

    def settle_timings(self) -> None:
        """Wait until the last step's timeline stamps have arrived (:class:`CollectiveEnds`)."""
        if self._ends is not None:
            self._ends.settle()

    def remove(self) -> None:
        self.flush()
        if self._ends is not None:
            self._ends.close()
        self._watch.remove()
        for h in self._opt_hooks:
            h.remove()
        self._opt_hooks = []
