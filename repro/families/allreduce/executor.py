"""Run an all-reduce Plan with Python gradient hooks: per-bucket flat buffers, one async all-reduce per
bucket, launched strictly in plan order (every rank issues the same sequence); averaging and unused
parameters as DDP's. Plan option ``cycle_s``: launches at Horovod-style ticks. See docs/design/families.md.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import WIRE_DTYPE_BYTES, Plan, PlanError
from repro.families.allreduce import reducer_engine_refusal
from repro.runtime.buffers import broadcast_buffers
from repro.runtime.clock import CollectiveEnds, clock_for, model_device
from repro.runtime.executor import BucketTiming, Executor, ExecutorOptions
from repro.families.allreduce.reducer_engine import ReducerAllReduce, unfit_reason
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["AllReduceExecutor", "BucketedAllReduce", "BucketTiming", "calibrate"]

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
assert set(_TORCH_DTYPES) == set(WIRE_DTYPE_BYTES)


@dataclass
class _Slot:
    bucket: int
    param: nn.Parameter
    layer: str
    view: torch.Tensor          # this parameter's slice of the bucket buffer, flat
    written: bool = False
    flag: int = 0               # index of its "had a gradient" flag in the bucket's flags
    grad_view: torch.Tensor | None = None  # ``view`` shaped as the parameter (what ``.grad`` becomes), made once


@dataclass
class _Bucket:
    layers: tuple[str, ...]
    buffers: list[torch.Tensor]  # one flat buffer per dtype (one only with a wire dtype); flags at the end of [0]
    slots: list[_Slot] = field(default_factory=list)
    pending: int = 0
    works: list = field(default_factory=list)
    flags: torch.Tensor | None = None  # per slot: 1 where this rank had a gradient (averaged: > 0 where any had)
    missing: list[int] = field(default_factory=list)  # flags of the parameters this rank had no gradient for
    scaled_in_write: bool = False  # no wire dtype: each gradient is divided by the world size as it is copied in

    @property
    def nbytes(self) -> int:
        """Gradient bytes of the bucket (without the flags)."""
        return sum(s.view.numel() * s.view.element_size() for s in self.slots)


class BucketedAllReduce:
    """Synchronise gradients of ``model`` by executing ``plan`` (all-reduce buckets) on ``group``."""

    def __init__(self, model: nn.Module, plan: Plan, *, view: str = "tensor",
                 group: dist.ProcessGroup | None = None, record_timeline: bool = False, clock=None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.launch.local")
        if plan.family != "allreduce":
            raise PlanError(f"BucketedAllReduce executes all-reduce plans, got a '{plan.family}' plan")
        if any(b.piece is not None for b in plan.buckets):
            raise PlanError("BucketedAllReduce executes buckets of whole layers; this plan splits layers "
                            "into pieces")
        check_plan_fits(plan, model, view)
        layers = layer_parameters(model, view)
        self.plan = plan
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.record_timeline = record_timeline
        self._buckets: list[_Bucket] = []
        self._slots: list[_Slot] = []
        for k, b in enumerate(plan.buckets):
            members = [(name, p) for name in b.layers for _, p in layers[name]]
            wire = _TORCH_DTYPES[plan.wire_dtype] if plan.wire_dtype else None
            dtypes = [wire] if wire is not None else list(dict.fromkeys(p.dtype for _, p in members))
            numel = {d: sum(p.numel() for _, p in members if wire is not None or p.dtype == d) for d in dtypes}
            numel[dtypes[0]] += len(members)  # the "had a gradient" flags, at the end of the first buffer
            device = members[0][1].device
            buffers = {d: torch.zeros(n, dtype=d, device=device) for d, n in numel.items()}
            bucket = _Bucket(tuple(b.layers), list(buffers.values()))
            offset = dict.fromkeys(dtypes, 0)
            for name, p in members:
                d = wire if wire is not None else p.dtype
                slot = _Slot(k, p, name, buffers[d][offset[d]:offset[d] + p.numel()], flag=len(bucket.slots))
                if d == p.dtype:
                    slot.grad_view = slot.view.view_as(p)
                bucket.slots.append(slot)
                self._slots.append(slot)
                offset[d] += p.numel()
            bucket.flags = buffers[dtypes[0]][offset[dtypes[0]]:]
            bucket.scaled_in_write = wire is None
            bucket.pending = len(bucket.slots)
            self._buckets.append(bucket)
        self._next = 0  # next bucket (plan order) to launch
        self._all_reduce = allreduce_launcher(group)
        # the timeline's stamps: device times on NCCL (its futures complete at enqueue), host times on gloo
        self._ends = CollectiveEnds(model_device(model), dist.get_backend(group)) if record_timeline else None
        # a 0-dim tensor: the same quotient as dividing by the int, without wrapping a scalar per call
        self._divisor = torch.tensor(float(self.world_size), dtype=torch.float64)
        cycle_s = plan.option("cycle_s")
        if cycle_s is not None and not (isinstance(cycle_s, (int, float)) and not isinstance(cycle_s, bool)
                                        and math.isfinite(cycle_s) and cycle_s > 0):
            raise PlanError(f"plan option cycle_s must be a positive number of seconds, got {cycle_s!r}")
        self.cycle_s: float | None = float(cycle_s) if cycle_s is not None else None
        self.cycle_origin_s: float | None = None   # backward start of the current iteration (cycle mode)
        self.last_cycle_origin_s: float | None = None  # the same of the last finished iteration
        self.bucket_ready_s: list[float] = [float("nan")] * len(self._buckets)  # last gradient written
        self._lock = threading.Lock()               # one thread launches at a time; guards _next
        self._wake = threading.Condition(threading.Lock())
        self._ticker: threading.Thread | None = None
        self._closed = False
        self.timings = [BucketTiming(k, b.layers, b.nbytes) for k, b in enumerate(self._buckets)]
        self.clock = clock_for(model, clock)
        self.grad_ready_s = self.clock.ready  # layer -> ready time, resolved when read
        self._handles = [slot.param.register_post_accumulate_grad_hook(self._hook(slot)) for slot in self._slots]

    def prepare_for_forward(self) -> None:
        """Nothing: the gradient hooks need no preparation."""

    def hold(self, held: bool) -> None:
        """Nothing: under ``no_sync`` the caller takes these hooks off (``repro.api``'s held hooks)."""

    def _hook(self, slot: _Slot):
        mark, layer, write = self.clock.mark, slot.layer, self._write
        if self.cycle_s is None:
            def hook(param: torch.Tensor) -> None:
                mark(layer, time.perf_counter())
                if write(slot):  # the bucket is complete: launch what the plan order allows
                    with self._lock:
                        self._launch_ready_locked()
            return hook

        def hook(param: torch.Tensor) -> None:  # noqa: F811 - the cycle-time mode's hook
            now = time.perf_counter()  # host time: the cycle ticks are host time
            mark(layer, now)
            with self._wake:
                if self.cycle_origin_s is None:  # first gradient of the iteration: the backward start
                    self.cycle_origin_s = now
                    if self._ticker is None or not self._ticker.is_alive():
                        self._ticker = threading.Thread(target=self._tick_loop, name="horovod-cycle", daemon=True)
                        self._ticker.start()
                self._write(slot)
                self._wake.notify_all()
        return hook

    def _write(self, slot: _Slot) -> bool:
        """Put ``slot``'s gradient into its bucket (divided by the world size there without a wire dtype:
        one pass, the same arithmetic as dividing at launch); True when that completed the bucket."""
        if slot.written:
            raise RuntimeError(f"gradient of a parameter in layer '{slot.layer}' arrived twice in one "
                               "iteration; call step() (finish()) between backward passes")
        grad = slot.param.grad
        bucket = self._buckets[slot.bucket]
        if grad is None:
            slot.view.zero_()
            bucket.missing.append(slot.flag)
        elif grad.data_ptr() == slot.view.data_ptr():  # accumulated in place in the bucket already
            if bucket.scaled_in_write:
                slot.view.div_(self.world_size)
        elif bucket.scaled_in_write:
            torch.div(grad.reshape(-1), self._divisor, out=slot.view)
        else:
            slot.view.copy_(grad.reshape(-1))
        slot.written = True
        bucket.pending -= 1
        if bucket.pending == 0:
            self.bucket_ready_s[slot.bucket] = time.perf_counter()
            return True
        return False

    def _tick_loop(self) -> None:
        """One iteration's cycle loop: at each tick, launch the buckets complete by then (plan order);
        ends when all are launched or the executor is removed."""
        while True:
            with self._wake:
                while (not self._closed and self._next < len(self._buckets)
                       and self._buckets[self._next].pending != 0):
                    self._wake.wait()
                if self._closed or self._next >= len(self._buckets):
                    return
            tick = self._sleep_to_tick()
            with self._wake:
                if self._closed:
                    return
                # what completed by the tick; a bucket completed while this thread overslept the tick
                # waits for the next one, as the model has it
                self._launch_ready(upto_s=tick)

    def _sleep_to_tick(self) -> float:
        """Sleep until the first tick at or after now (ticks every cycle_s from ``cycle_origin_s``); returns it."""
        k = math.ceil((time.perf_counter() - self.cycle_origin_s) / self.cycle_s - 1e-9)
        tick = self.cycle_origin_s + max(k, 0) * self.cycle_s
        delay = tick - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return tick

    def _launch_ready(self, upto_s: float | None = None) -> None:
        """Launch the complete buckets at the head of the plan order (cycle mode: those complete by
        ``upto_s``, the tick being served)."""
        with self._lock:
            self._launch_ready_locked(upto_s)

    def _launch_ready_locked(self, upto_s: float | None = None) -> None:
        while (self._next < len(self._buckets) and self._buckets[self._next].pending == 0
               and (upto_s is None or self.bucket_ready_s[self._next] <= upto_s)):
            bucket = self._buckets[self._next]
            bucket.flags.fill_(1)
            if bucket.missing:
                bucket.flags[bucket.missing] = 0
            timing = self.timings[self._next]
            if self.record_timeline:
                self._ends.launch(lambda t, timing=timing: setattr(timing, "launch_s", t))
            ends = [float("nan")] * len(bucket.buffers)
            for i, buffer in enumerate(bucket.buffers):  # one message per dtype, back to back
                if not bucket.scaled_in_write:  # the flags too (only their sign is read)
                    buffer.div_(self.world_size)
                work = self._all_reduce(buffer)
                if self.record_timeline:
                    self._ends.end(work, lambda end_s, t=timing, ends=ends, i=i: _ended(t, ends, i, end_s))
                bucket.works.append(work)
            self._next += 1

    def finish(self) -> None:
        """Wait for all buckets of this iteration and write averaged gradients into ``.grad``."""
        if self.cycle_s is None:
            for slot in self._slots:  # parameters that got no gradient this iteration
                if not slot.written:
                    self._write(slot)
            self._launch_ready()
        else:
            with self._wake:
                if self.cycle_origin_s is None:  # no gradient at all: the loop starts now
                    self.cycle_origin_s = time.perf_counter()
                for slot in self._slots:
                    if not slot.written:
                        self._write(slot)
                self._wake.notify_all()
            while True:  # what is left goes out at the loop's next tick, as Horovod's would
                with self._wake:
                    if self._next >= len(self._buckets):
                        break
                tick = self._sleep_to_tick()
                with self._wake:
                    self._launch_ready(upto_s=tick)
            if self._ticker is not None:
                self._ticker.join()
                self._ticker = None
            self.last_cycle_origin_s, self.cycle_origin_s = self.cycle_origin_s, None
        for bucket in self._buckets:
            for work in bucket.works:
                work.wait()
            # only a rank that missed a gradient can see a parameter no rank had one for: only there are
            # the flags read (a device sync on GPUs)
            used = (bucket.flags > 0).tolist() if bucket.missing else None
            for slot in bucket.slots:
                slot.written = False
                if used is not None and not used[slot.flag]:
                    slot.param.grad = None
                    continue
                # same dtype: the gradient becomes a view of the bucket (no copy)
                slot.param.grad = slot.grad_view if slot.grad_view is not None else \
                    slot.view.view_as(slot.param).to(slot.param.dtype)
            bucket.pending = len(bucket.slots)
            bucket.works = []
            bucket.missing = []
        self._next = 0
        self.clock.end_iteration()  # a layer with no gradient in the next backward gets no time

    def remove(self) -> None:
        """Remove the gradient hooks (the model is left as it was) and stop the cycle loop."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._ends is not None:
            self._ends.close()

    def settle_timings(self) -> None:
        """Wait until the last iteration's timeline stamps have arrived."""
        if self._ends is not None:
            self._ends.settle()


def allreduce_launcher(group: dist.ProcessGroup | None = None):
    """``launch(tensor) -> Work``: an asynchronous SUM all-reduce on ``group`` through the process group's
    own ``allreduce`` (skipping ``dist.all_reduce``'s per-call checks; the buffers are dense, one dtype).
    Falls back to ``dist.all_reduce`` where the process group lacks it."""
    pg = group if group is not None else dist.group.WORLD
    options_type = getattr(dist, "AllreduceOptions", None)
    if options_type is None or not hasattr(pg, "allreduce"):
        return lambda tensor: dist.all_reduce(tensor, group=group, async_op=True)
    opts = options_type()
    opts.reduceOp = dist.ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = True
    allreduce = pg.allreduce

    def launch(tensor: torch.Tensor):
        if tensor.is_complex():  # dist.all_reduce sums complex tensors as pairs of reals
            return dist.all_reduce(tensor, group=group, async_op=True)
        return allreduce([tensor], opts)
    return launch


def _ended(timing: BucketTiming, ends: list[float], i: int, end_s: float) -> None:
    """A bucket's message ``i`` completed at ``end_s``; the bucket ends with its last message."""
    ends[i] = end_s
    if all(math.isfinite(e) for e in ends):
        timing.end_s = max(ends)


class AllReduceExecutor(Executor):
    """The all-reduce family's executor: buffers broadcast from the group's first rank before every forward,
    averaged gradients handed over in ``after_backward``. ``engine``: ``"reducer"``
    (:class:`~repro.families.allreduce.reducer_engine.ReducerAllReduce`), ``"hooks"``
    (:class:`BucketedAllReduce`) or ``"auto"`` (the reducer wherever
    :func:`~repro.families.allreduce.reducer_engine.unfit_reason` allows); ``self.engine`` says which ran.
    Both give DDP's parameters."""

    finishes_in_backward = True  # the exchange is waited for after backward anyway (Executor)

    ENGINES = ("auto", "reducer", "hooks")

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None,
                 engine: str | None = "auto") -> None:
        super().__init__(model, plan, options)
        if plan is None:
            raise PlanError("the all-reduce executor needs a plan")
        engine = "auto" if engine is None else engine
        if engine not in self.ENGINES:
            raise ValueError(f"engine must be one of {', '.join(self.ENGINES)}; got {engine!r}")
        group = self.options.group
        if engine != "hooks":
            reason = unfit_reason(model, plan, self.options.view, self.options.clock)
            if reason is not None and engine == "reducer":
                raise PlanError(f"engine 'reducer' cannot run {reason}; use engine 'hooks' (or auto)")
            engine = "reducer" if reason is None else "hooks"
        self.engine = engine
        if engine == "reducer":
            self.sync: Any = ReducerAllReduce(model, plan, view=self.options.view, group=group,
                                              record_timeline=self.options.record_timeline)
        else:
            self.sync = BucketedAllReduce(model, plan, view=self.options.view, group=group,
                                          record_timeline=self.options.record_timeline, clock=self.options.clock)
        self.clock = self.sync.clock
        self.grad_ready_s = self.sync.grad_ready_s
        self.timings = self.sync.timings
        self.settle_timings = getattr(self.sync, "settle_timings", self.settle_timings)
        # buffers come from the group's first rank (a global rank; 0 unless some ranks serve)
        self._buffer_src = 0 if group is None else dist.get_global_rank(group, 0)

    @classmethod
    def check_run_options(cls, options: Mapping[str, Any], plan: Plan | None = None,
                          model: nn.Module | None = None) -> None:
        """Refuse before a plan exists (``repro.distribute``'s check) ``engine='reducer'`` with a wire
        dtype, on a GPU (:func:`repro.families.allreduce.reducer_engine_refusal`) or with a cycle time."""
        if options.get("engine") != "reducer":
            return
        params = list(model.parameters()) if model is not None else []
        device = params[0].device.type if params else None
        reason = reducer_engine_refusal({"engine": "reducer", "device": device,
                                         "wire_dtype": options.get("wire_dtype") or (plan.wire_dtype if plan else None)})
        if reason is not None:
            raise PlanError(reason)
        if plan is not None and plan.option("cycle_s") is not None:
            raise PlanError("engine 'reducer' cannot run Horovod's cycle time; use engine 'hooks' (or auto)")

    def before_forward(self) -> None:
        if self.sync_buffers:
            broadcast_buffers(self.model, src=self._buffer_src, group=self.options.group)
        self.sync.prepare_for_forward()

    def after_backward(self) -> None:
        self.sync.finish()

    def hold_exchange(self, held: bool) -> None:
        """``no_sync``: while held, backward passes accumulate locally."""
        self.sync.hold(held)

    def remove(self) -> None:
        self.sync.remove()


def calibrate(trace, device, repeats: int, network_cost=None, **_options):
    """The all-reduce family's calibration hook: ``network_cost`` (with an all-reduce line), else
    ``a + b * bytes`` fitted on the live group, 4 KiB to min(model bytes, 64 MiB); the same on every rank."""
    from repro.runtime.calibrate import default_sizes_bytes, fit_allreduce

    if network_cost is not None:
        network_cost.line("allreduce")
        return network_cost
    cost, _ = fit_allreduce(default_sizes_bytes(min(trace.total_bytes, 64 * 2**20)), repeats=repeats,
                            device=device)
    return cost
