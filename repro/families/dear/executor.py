"""Run a DeAR plan (Zhang et al., ICDCS 2023): reduce-scatter in backward, all-gather in the next
forward, each bucket updated right after its all-gather by an optimizer step on its parameters alone.
Every collective goes through one :class:`~repro.runtime.collectives.CommStream` (one thread, one
order on every rank). See docs/design/families.md.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Plan, PlanError
from repro.runtime.clock import clock_for, waits_for
from repro.runtime.deferred import ApplyBeforeUse, DeferredUpdateOptimizer, hyperparameters, stepping_with
from repro.runtime.executor import (
    Executor, ExecutorOptions, FoundInfReport, ScaledStep, check_scaled_step, timing_row)
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["DeARExecutor", "DeARTiming", "DeAROptimizer", "calibrate", "time_stream_collectives"]


@dataclass
class DeARTiming:
    """One message of the last iteration, ``kind`` ``"reduce_scatter"`` or ``"allgather"``:
    ``perf_counter`` seconds when submitted (``launch_s``) and when it ran on the stream."""

    bucket: int
    kind: str
    layers: tuple[str, ...]
    bytes: int
    launch_s: float = float("nan")
    start_s: float = float("nan")
    end_s: float = float("nan")

    def row(self, origin_s: float) -> dict:
        """This record as a ``buckets.csv`` row (:func:`~repro.runtime.executor.timing_row`)."""
        self.settle()
        return timing_row(self, origin_s)

    def fill(self, handle) -> None:
        """Take the stamps of ``handle`` (a :class:`~repro.runtime.collectives.Handle`); one still running
        on the device is read at :meth:`settle`."""
        self.launch_s = handle.submit_s
        self.start_s = handle.start_s if handle.start_s is not None else float("nan")
        self.end_s = handle.end_s if handle.end_s is not None else float("nan")
        self.__dict__["_handle"] = None if handle.is_completed() else handle

    def settle(self) -> None:
        """Wait for the message's handle if it is still running, and take its final stamps."""
        handle = self.__dict__.pop("_handle", None)
        if handle is not None:
            try:
                handle.wait()
            except Exception:  # noqa: BLE001 - a failed op keeps the stamps it has; its consumer raised
                pass
            self.fill(handle)
            self.__dict__.pop("_handle", None)


@dataclass
class _Slot:
    bucket: int
    param: nn.Parameter
    layer: str
    view: torch.Tensor            # this parameter's slice of the bucket buffer, flat
    written: bool = False
    flag: int = 0                 # index of its "got a gradient" flag in the bucket's flags


@dataclass
class _Bucket:
    index: int
    layers: tuple[str, ...]
    buffer: torch.Tensor          # padded to a multiple of P
    slots: list[_Slot] = field(default_factory=list)
    pending: int = 0              # gradients still to arrive this backward
    rs: Any = None                # Handle of this iteration's reduce-scatter
    ag: Any = None                # Handle of the all-gather feeding the pending update
    update_pending: bool = False  # gathered gradient waiting to be applied
    flags: Any = None             # per parameter: number of ranks that had a gradient (after the exchange)
    local_missing: bool = False   # this rank had no gradient for some parameter of the bucket
    grads: Any = None             # the gradient part of the buffer (no flags, no padding)
    inv_scale: Any = None         # GradScaler's 1/scale for the pending update (None: not scaled)


class DeAROptimizer(DeferredUpdateOptimizer):
    """What the loop steps: ``step()`` finishes the reduce-scatters and starts AG(0); the update happens
    bucket by bucket in the next forward (or at :meth:`DeARExecutor.flush`). ``executor``: anything with
    ``step()`` and ``flush()`` (a :class:`DeARExecutor`, or the tuner owning one). After ``synchronize()``
    ``step()`` applies ``param.grad`` in one optimizer step."""

    family = "DeAR"


class DeARExecutor(Executor):
    """The DeAR family's executor. ``stream``: a :class:`CommStream` shared across executors (the tuner's);
    otherwise it makes its own (collectively) and closes it in :meth:`remove`."""

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None,
                 *, stream=None) -> None:
        super().__init__(model, plan, options)
        if plan is None:
            raise PlanError("the DeAR executor needs a plan")
        if plan.family != "dear":
            raise PlanError(f"DeARExecutor executes 'dear' plans, got a '{plan.family}' plan")
        if any(b.piece is not None for b in plan.buckets):
            raise PlanError("DeARExecutor executes buckets of whole layers; this plan splits layers into pieces")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.launch.local")
        check_plan_fits(plan, model, self.options.view)
        layers = layer_parameters(model, self.options.view)

        from repro.runtime.collectives import CommStream, lower_switch_interval

        # the stream thread needs the GIL between its messages while forward/backward run Python
        self._restore_switch = lower_switch_interval()
        self._own_stream = stream is None
        self.stream = CommStream() if stream is None else stream
        self.world_size = self.stream.world_size
        P = self.world_size
        self._buckets: list[_Bucket] = []
        self._slots: list[_Slot] = []
        for b in plan.buckets:
            # a buffer holds one dtype (and device): a plan bucket whose parameters mix them becomes one
            # bucket here per kind, consecutive, in the order the kinds first appear (as DDP's per-dtype
            # buckets); each is reduce-scattered and all-gathered in its own dtype
            kinds: dict[tuple[torch.dtype, torch.device], list[tuple[str, nn.Parameter]]] = {}
            for name in b.layers:
                for _, p in layers[name]:
                    kinds.setdefault((p.dtype, p.device), []).append((name, p))
            for (dtype, device), members in kinds.items():
                k = len(self._buckets)
                numel = sum(p.numel() for _, p in members) + len(members)  # + one "got a gradient" flag each
                padded = -(-numel // P) * P
                names = tuple(dict.fromkeys(name for name, _ in members))
                bucket = _Bucket(k, names, torch.zeros(padded, dtype=dtype, device=device))
                offset = 0
                for name, p in members:
                    slot = _Slot(k, p, name, bucket.buffer[offset:offset + p.numel()], flag=len(bucket.slots))
                    bucket.slots.append(slot)
                    self._slots.append(slot)
                    offset += p.numel()
                bucket.grads = bucket.buffer[:offset]
                bucket.flags = bucket.buffer[offset:offset + len(bucket.slots)]
                bucket.pending = len(bucket.slots)
                self._buckets.append(bucket)
        K = len(self._buckets)
        self._next_rs = K - 1          # next bucket whose RS is submitted (descending)
        self._next_ag = K              # next bucket whose AG is submitted (ascending); K: none pending
        self._in_backward = False
        self._first_pending = K        # no bucket below this one has a pending update
        self._optimizer: Any = None
        self._wrapper: DeAROptimizer | None = None
        self._found_inf_report: FoundInfReport | None = None
        self._synchronized = False     # synchronize() ran: param.grad holds this step's averaged gradient
        self.timings: list[DeARTiming] = []
        if self.options.record_timeline:
            self.timings = [DeARTiming(b.index, kind, b.layers, b.buffer.numel() * b.buffer.element_size())
                            for kind in ("reduce_scatter", "allgather") for b in self._buckets]
        self.clock = clock_for(model, self.options.clock)
        self.grad_ready_s = self.clock.ready  # layer -> ready time, resolved when read
        self._waits = waits_for(self._buckets[0].buffer.device)

        self._hyper: list[dict[str, Any]] | None = None  # the groups' hyperparameters at the last step()
        self._subsets: dict[int, tuple] = {}  # bucket -> (groups key, its parameters per group): _group_subsets
        # hooks: gradients, and a forward pre-hook on every module directly owning a parameter of a bucket;
        # any other use of a parameter in a forward applies its bucket first (ApplyBeforeUse)
        self._use_guard = ApplyBeforeUse(model, lambda k: self._apply_through(k))
        self._handles = [s.param.register_post_accumulate_grad_hook(self._grad_hook(s)) for s in self._slots]
        self._handles += self._use_guard.handles
        bucket_of = {id(s.param): s.bucket for s in self._slots}
        for module in model.modules():
            owned = sorted({bucket_of[id(p)] for p in module.parameters(recurse=False) if id(p) in bucket_of})
            if owned:
                self._handles.append(module.register_forward_pre_hook(self._pre_hook(max(owned))))

    @property
    def num_buckets(self) -> int:
        return len(self._buckets)

    def wrap_optimizer(self, optimizer: Any, grad_scaler: Any = None) -> DeAROptimizer:
        """The optimizer the loop steps; ``grad_scaler``: the GradScaler stepping it, which learns the
        verdict on the exchanged gradient (:meth:`step`)."""
        self.set_optimizer(optimizer)
        self._wrapper = DeAROptimizer(self, optimizer)
        if grad_scaler is not None:
            self._found_inf_report = FoundInfReport(grad_scaler, self._buckets[0].buffer.device)
        return self._wrapper

    def set_optimizer(self, optimizer: Any) -> None:
        """The optimizer whose per-bucket steps apply the updates (``wrap_optimizer`` sets it)."""
        if self.pending_updates():
            self.flush()
        self._optimizer = optimizer

    def before_forward(self) -> None:
        """Rank 0's buffers on every rank (as DDP), broadcast on the stream (see :meth:`_broadcast_buffers`)."""
        if self.sync_buffers:
            self._broadcast_buffers()

    @torch.no_grad()
    def _broadcast_buffers(self) -> None:
        """Rank 0's buffers, broadcast on the communication stream (behind ``step()``'s AG(0)): every
        collective goes through one thread and one FIFO, in the same order on every rank (two threads
        on two NCCL communicators could interleave differently per rank)."""
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for b in self.model.buffers():
            groups.setdefault((b.dtype, b.device), []).append(b)
        jobs = []
        for bufs in groups.values():
            flat = torch.cat([b.reshape(-1) for b in bufs])
            jobs.append((bufs, flat, self.stream.broadcast(flat, src=0)))
        for bufs, flat, handle in jobs:
            self._waits.wait(handle)
            for b, v in zip(bufs, flat.split([b.numel() for b in bufs])):
                b.copy_(v.view_as(b))

    def after_backward(self) -> None:
        """Every gradient in its bucket (missing ones as zeros), every RS submitted."""
        if self._in_backward:
            self._fill_unwritten()

    def step(self, amp: ScaledStep | None = None) -> None:
        """The wrapped optimizer's ``step()``: finish the reduce-scatters, start AG(0), update nothing.

        Under a GradScaler (``amp``; every rank calls this every step) the skip is decided on the
        reduce-scattered shards plus GradScaler's local check, one all-reduce on the stream giving every rank
        the same verdict, reported to the scaler's ``update()``; a skipped step updates no bucket, else each
        bucket applies ``sum / P * inv_scale`` in the next forward. ``scaler.unscale_`` first is refused
        unless :meth:`synchronize` ran; after it, one optimizer step on ``param.grad``."""
        if self._optimizer is None:
            raise RuntimeError("DeARExecutor: call wrap_optimizer(optimizer) before stepping")
        if self._synchronized:
            self._step_synchronized(amp)
            return
        check_scaled_step(amp, self._found_inf_report, "DeAR")
        self._finish_rs()
        skip = False
        if amp is not None:
            skip = self._found_inf(amp)
            self._found_inf_report.report(skip)
        for bucket in self._buckets:
            bucket.update_pending = not skip
            bucket.inv_scale = None if amp is None else amp.inv_scale
            if skip:
                bucket.local_missing = False
        self._end_backward()
        K = len(self._buckets)
        self._next_ag = K if skip else 0
        self._first_pending = K if skip else 0
        if not skip:
            self._hyper = hyperparameters(self._optimizer)  # the updates apply with the lr etc. of this step
            for bucket in self._buckets:
                self._use_guard.add((slot.param for slot in bucket.slots), bucket.index)
            self._submit_ag(0)

    def _found_inf(self, amp: ScaledStep) -> bool:
        """Whether any rank's exchanged shard or ``param.grad`` has an inf/nan (one all-reduce of per-rank
        counts on the stream, after every RS)."""
        P, rank = self.world_size, self.stream.rank
        device = self._buckets[0].buffer.device
        count = torch.zeros((), dtype=torch.float32, device=device)
        for bucket in self._buckets:
            count += (~torch.isfinite(bucket.buffer.chunk(P)[rank])).sum()
        counts = torch.zeros(P, dtype=torch.float32, device=device)
        counts[rank] = count + amp.found_inf_tensor(device)  # unread: counts.sum() is read once
        self._waits.wait(self.stream.all_reduce(counts))
        return bool(counts.sum().item() > 0)

    def synchronize(self) -> None:
        """Finish this step's exchange now: ``param.grad`` becomes the averaged gradient (a view of the
        bucket; None where no rank had one), which the next :meth:`step` applies in one optimizer step.
        For ``scaler.unscale_(opt)`` or clipping before ``step()``."""
        if self._synchronized:
            return
        if self._optimizer is None:
            raise RuntimeError("DeARExecutor: call wrap_optimizer(optimizer) before synchronize()")
        self._finish_rs()
        handles = [self.stream.all_gather(bucket.buffer) for bucket in self._buckets]
        for bucket, handle in zip(self._buckets, handles):
            self._waits.wait(handle)
            bucket.buffer.div_(self.world_size)
            used = (bucket.flags > 0).tolist() if bucket.local_missing else [True] * len(bucket.slots)
            bucket.local_missing = False
            for slot in bucket.slots:
                slot.param.grad = slot.view.view_as(slot.param) if used[slot.flag] else None
        self._synchronized = True

    def _step_synchronized(self, amp: ScaledStep | None) -> None:
        self._synchronized = False
        try:
            if amp is None or not amp.found_inf:
                if amp is not None and amp.inv_scale is not None:
                    with torch.no_grad():
                        for bucket in self._buckets:
                            bucket.grads.mul_(amp.inv_scale)
                self._optimizer.step()
        finally:
            self._end_backward()

    def _finish_rs(self) -> None:
        """Every gradient in its bucket (missing ones as zeros) and every RS done; with no gradient at all
        this iteration, still every AG before the RS."""
        self._start_backward()
        self._fill_unwritten()
        for bucket in self._buckets:
            self._wait_rs(bucket)

    def _end_backward(self) -> None:
        """Every bucket ready for the next backward's gradients."""
        for bucket in self._buckets:
            for slot in bucket.slots:
                slot.written = False
            bucket.pending = len(bucket.slots)
        self._next_rs = len(self._buckets) - 1
        self._in_backward = False
        self.clock.end_iteration()  # a layer with no gradient in the next backward gets no time

    def flush(self) -> None:
        """Wait for all communication and apply every pending update (in bucket order)."""
        if self._in_backward:
            raise RuntimeError("DeARExecutor.flush() between backward and step(): call step() first")
        self._apply_through(len(self._buckets) - 1)

    def remove(self) -> None:
        """Flush, then remove every hook; close the stream if this executor made it."""
        try:
            if self._optimizer is not None and not self._in_backward:
                self.flush()
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            if self._own_stream:
                self.stream.close()
            self._restore_switch()

    def pending_updates(self) -> list[int]:
        """Buckets whose update is still to be applied."""
        return [b.index for b in self._buckets if b.update_pending]

    def _grad_hook(self, slot: _Slot):
        def hook(param: torch.Tensor) -> None:
            self.clock.mark(slot.layer)
            self._start_backward()
            bucket = self._buckets[slot.bucket]
            if bucket.update_pending:  # its modules did not run in forward: apply before overwriting
                self._apply(bucket)
            self._write(slot)
            self._launch_ready()
        return hook

    def _pre_hook(self, last_bucket: int):
        def hook(module: nn.Module, args) -> None:
            if self._first_pending <= last_bucket:
                self._apply_through(last_bucket)
        return hook

    def _start_backward(self) -> None:
        if not self._in_backward:
            self._in_backward = True
            self._submit_ag(len(self._buckets) - 1)  # every AG precedes this iteration's RS on the stream

    def _write(self, slot: _Slot) -> None:
        if slot.written:
            raise RuntimeError(f"gradient of a parameter in layer '{slot.layer}' arrived twice in one "
                               "iteration; call step() between backward passes")
        grad = slot.param.grad
        flags = self._buckets[slot.bucket].flags
        if grad is None:
            slot.view.zero_()
            flags[slot.flag] = 0
            self._buckets[slot.bucket].local_missing = True
        else:
            slot.view.copy_(grad.reshape(-1))
            flags[slot.flag] = 1
        slot.written = True
        self._buckets[slot.bucket].pending -= 1

    def _fill_unwritten(self) -> None:
        for slot in self._slots:
            if not slot.written:
                bucket = self._buckets[slot.bucket]
                if bucket.update_pending:
                    self._apply(bucket)
                self._write(slot)
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_rs >= 0 and self._buckets[self._next_rs].pending == 0:
            bucket = self._buckets[self._next_rs]
            bucket.rs = self.stream.reduce_scatter(bucket.buffer)
            self._next_rs -= 1

    def _wait_rs(self, bucket: _Bucket) -> None:
        handle, bucket.rs = bucket.rs, None
        self._waits.wait(handle)
        if self.timings:
            self.timings[bucket.index].fill(handle)

    def _submit_ag(self, upto: int) -> None:
        """Submit the all-gathers of buckets ``_next_ag .. upto`` (those with a pending update)."""
        while self._next_ag <= min(upto, len(self._buckets) - 1):
            bucket = self._buckets[self._next_ag]
            if bucket.update_pending and bucket.ag is None:
                bucket.ag = self.stream.all_gather(bucket.buffer)
            self._next_ag += 1

    def _apply_through(self, last: int) -> None:
        """Apply every pending update of buckets ``<= last``, in order."""
        for bucket in self._buckets[self._first_pending:last + 1]:
            if bucket.update_pending:
                self._apply(bucket)
        self._advance_first_pending()

    def _advance_first_pending(self) -> None:
        K = len(self._buckets)
        while self._first_pending < K and not self._buckets[self._first_pending].update_pending:
            self._first_pending += 1

    def _apply(self, bucket: _Bucket) -> None:
        """Wait AG(k), start AG(k+1), average, and step the optimizer on bucket k's parameters only."""
        with self._use_guard.suspended():  # its own reads and writes of the parameters are not uses
            k = bucket.index
            self._submit_ag(k + 1)  # AG(k+1) overlaps bucket k's forward
            handle, bucket.ag = bucket.ag, None
            self._waits.wait(handle)  # CPU: on the host; CUDA: this stream waits for AG(k)'s event, the host does not
            if self.timings:
                self.timings[len(self._buckets) + k].fill(handle)
            bucket.buffer.div_(self.world_size)
            if bucket.inv_scale is not None:  # GradScaler: sum / P * (1 / scale), as DDP + GradScaler
                bucket.grads.mul_(bucket.inv_scale)
                bucket.inv_scale = None
            self._step_bucket(bucket)
            bucket.update_pending = False
            self._use_guard.discard(slot.param for slot in bucket.slots)
            self._advance_first_pending()

    @torch.no_grad()
    def _step_bucket(self, bucket: _Bucket) -> None:
        """One optimizer step on the bucket's parameters only (each group's ``params`` swapped for its
        members in the bucket, so a step costs the bucket's work); groups and gradients restored after."""
        if self._optimizer is None:
            raise RuntimeError("DeARExecutor: an update is pending but no optimizer was given (wrap_optimizer)")
        groups = self._optimizer.param_groups
        subsets = self._group_subsets(bucket, groups)
        # a parameter no rank had a gradient for is one this rank had none for: only then read the flags
        # (a device-to-host copy on GPUs); the common case needs no synchronisation
        used = (bucket.flags > 0).tolist() if bucket.local_missing else None
        bucket.local_missing = False
        held = [(slot.param, slot.param.grad) for slot in bucket.slots]
        originals = [g["params"] for g in groups]
        try:
            for slot in bucket.slots:  # a parameter no rank had a gradient for keeps no gradient (as DDP)
                slot.param.grad = slot.view.view_as(slot.param) if used is None or used[slot.flag] else None
            for g, members in zip(groups, subsets):
                g["params"] = members
            with stepping_with(self._optimizer, self._hyper):
                self._optimizer.step()
        finally:
            for g, params in zip(groups, originals):
                g["params"] = params
            for p, grad in held:
                p.grad = grad

    def _group_subsets(self, bucket: _Bucket, groups: list[dict[str, Any]]) -> list[list[torch.Tensor]]:
        """Per parameter group, its parameters in ``bucket`` (in the group's order); cached until the
        groups change (``add_param_group``, or a group's list replaced or resized)."""
        key = tuple((id(g["params"]), len(g["params"])) for g in groups)
        cached = self._subsets.get(bucket.index)
        if cached is None or cached[0] != key:
            mine = {id(slot.param) for slot in bucket.slots}
            cached = self._subsets[bucket.index] = (key, [[p for p in g["params"] if id(p) in mine] for g in groups])
        return cached[1]


def time_stream_collectives(sizes_bytes, *, repeats: int = 3, warmup: int = 1,
                            device: torch.device | str = "cpu", stream=None) -> dict[str, list[float]]:
    """The slowest rank's median seconds of a :class:`CommStream` reduce-scatter and all-gather per size
    (bytes of the full float32 buffer), the same on every rank; small buffers timed as the mean of up to
    16 back-to-back ops. Every rank calls it at the same point."""
    from repro.runtime.collectives import CommStream

    device = torch.device(device)
    own = stream is None
    stream = CommStream() if own else stream
    P = stream.world_size
    out: dict[str, list[float]] = {"reduce_scatter": [], "allgather": []}
    try:
        for nbytes in sizes_bytes:
            numel = max(P, int(nbytes) // 4 // P * P)
            buf = torch.zeros(numel, dtype=torch.float32, device=device)
            inner = int(min(16, max(1, 2**20 // max(1, int(nbytes)))))
            for kind, op in (("reduce_scatter", stream.reduce_scatter), ("allgather", stream.all_gather)):
                times = []
                for i in range(warmup + repeats):
                    dist.barrier()
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t0 = time.perf_counter()
                    handles = [op(buf) for _ in range(inner)]
                    handles[-1].wait()
                    if i >= warmup:
                        times.append((time.perf_counter() - t0) / inner)
                out[kind].append(statistics.median(times))
    finally:
        if own:
            stream.close()
    flat = torch.tensor(out["reduce_scatter"] + out["allgather"], dtype=torch.float64, device=device)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    vals = flat.cpu().tolist()
    n = len(out["reduce_scatter"])
    return {"reduce_scatter": vals[:n], "allgather": vals[n:]}


def calibrate(trace, device, repeats: int, network_cost=None, **_options):
    """The DeAR family's calibration hook: ``network_cost`` if given (it must have ``reduce_scatter`` and
    ``allgather`` lines, else :class:`repro.core.cost.CostModelError`), else both lines fitted (bytes of the
    full buffer -> seconds) from :class:`CommStream` RS and AG timed on the live group, 4 KiB up to the
    model's gradient bytes (at most 64 MiB). Every rank calls it and gets the same model."""
    from repro.core.cost import CostModel, fit_linear
    from repro.runtime.calibrate import default_sizes_bytes

    if network_cost is not None:
        network_cost.line("reduce_scatter")
        network_cost.line("allgather")
        return network_cost
    sizes = default_sizes_bytes(min(int(trace.total_bytes), 64 * 2**20), count=6)
    seconds = time_stream_collectives(sizes, repeats=max(1, int(repeats)), device=device)
    P = dist.get_world_size()
    lines = {kind: fit_linear(sizes, secs) for kind, secs in seconds.items()}
    meta = {"measurements": {kind: {"bytes": list(map(int, sizes)), "seconds": secs} for kind, secs in seconds.items()}}
    return CostModel(P, lines, source=f"CommStream reduce-scatter / all-gather fitted on the live process group "
                     f"(P={P})", meta=meta)
