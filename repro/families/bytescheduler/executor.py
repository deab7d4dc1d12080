"""Run a ByteScheduler plan: chunked all-reduces issued by priority within a credit (``credit_bytes``),
each layer updated just before its next forward. Rank 0's scheduler thread decides and broadcasts the
order on a gloo control group, so every rank issues the same collectives. See docs/design/families.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Plan, PlanError
from repro.runtime.buffers import broadcast_buffers
from repro.runtime.clock import EventCompletions, clock_for
from repro.runtime.deferred import ApplyBeforeUse, DeferredUpdateOptimizer, hyperparameters, stepping_with
from repro.runtime.executor import (
    Executor, ExecutorOptions, FoundInfReport, ScaledStep, check_scaled_step, timing_row)
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["ByteSchedulerExecutor", "ChunkTiming", "LayerwiseOptimizer", "HostComm", "CudaComm", "pick_chunks"]

_IDLE, _READY, _DECIDED, _ISSUED = range(4)


@dataclass
class ChunkTiming:
    """Seconds (perf_counter) of one chunk's all-reduce in the last iteration."""

    chunk: int
    layer: str
    piece: int
    pieces: int
    bytes: int
    priority: float
    ready_s: float = float("nan")
    decided_s: float = float("nan")
    launch_s: float = float("nan")
    end_s: float = float("nan")

    def row(self, origin_s: float) -> dict:
        """One ``buckets.csv`` row: seconds after ``origin_s``, ``launch_s`` as ``start_s`` (CUDA: a ready
        chunk is waited for first, at most 60 s; NaN for what has not completed)."""
        done = self.__dict__.get("_done")
        if done is not None and self.ready_s == self.ready_s:
            done.wait(60.0)
        return timing_row(self, origin_s, {"launch_s": "start_s"})


class _Chunk:
    def __init__(self, cid: int, layer: "_Layer", view: torch.Tensor, priority: float, timing: ChunkTiming):
        self.id = cid
        self.layer = layer
        self.view = view
        self.nbytes = view.numel() * view.element_size()
        self.priority = priority
        self.timing = timing
        self.state = _IDLE
        self.seq = 0          # readiness order (rank-local)
        self.work: Any = None
        self.event: Any = None  # CUDA: event recorded after the all-reduce (what consumers wait for)
        self.done = False
        self.gen = 0          # issue count: a late completion callback of an earlier issue is ignored


class _Layer:
    def __init__(self, name: str, params: list[nn.Parameter]):
        self.name = name
        self.params = params
        dtype = params[0].dtype
        if any(p.dtype != dtype for p in params):
            raise PlanError(f"layer '{name}': parameters of different dtypes cannot share one flat buffer")
        # the gradients, then one "got a gradient" flag per parameter (1 where this rank had one), summed
        # with them: a parameter no rank had a gradient for gets no update (as DDP's unused parameters)
        self.numel = sum(p.numel() for p in params)
        self.buffer = torch.zeros(self.numel + len(params), dtype=dtype, device=params[0].device)
        self.flags = self.buffer[self.numel:]
        self.local_missing = False  # this rank had no gradient for some parameter this iteration
        self.views = list(self.buffer[:self.numel].split([p.numel() for p in params]))
        self.written = [False] * len(params)
        self.pending = len(params)
        self.chunks: list[_Chunk] = []
        self.armed = False    # its update (of the last step) is still to be applied
        self.ready_event: Any = None  # CUDA: recorded after its gradients were copied into the buffer
        self.inv_scale: Any = None  # GradScaler's 1/scale for that update (None: not scaled)


def pick_chunks(ready: list, in_flight_bytes: int, credit_bytes: int) -> list:
    """The prefix of ``ready`` (objects with ``nbytes``, most urgent first) to issue now: while the bytes
    in flight (decided or issued, not completed) stay within ``credit_bytes``, one chunk always allowed
    when nothing is in flight. A chunk that does not fit holds back every less urgent one."""
    pick = []
    for c in ready:
        if in_flight_bytes + c.nbytes <= credit_bytes or (in_flight_bytes == 0 and not pick):
            pick.append(c)
            in_flight_bytes += c.nbytes
        else:
            break
    return pick


class HostComm:
    """How the scheduler thread issues collectives and learns they finished, on a CPU (gloo): an async
    ``all_reduce``, finished when its future completes; consumers wait on the host."""

    on_device = False

    def ready_marker(self) -> Any:
        """Marks "the tensors this thread wrote so far": None on a CPU (nothing to order)."""
        return None

    def issue(self, tensor: torch.Tensor, group: Any, after: Any) -> tuple[Any, Any]:
        """Sum-all-reduce ``tensor`` on ``group`` (async) after ``after`` (a ready marker); returns
        ``(work, event)`` (``event`` None on a CPU)."""
        return dist.all_reduce(tensor, group=group, async_op=True), None

    def on_complete(self, work: Any, event: Any, done) -> None:
        """Call ``done(end_s)`` (host ``perf_counter`` seconds) once ``work`` has finished."""
        work.get_future().then(lambda _f: done(time.perf_counter()))

    def run(self, fn, after: Any) -> Any:
        """Run ``fn()`` after ``after``; returns what a consumer waits for (None on a CPU)."""
        fn()
        return None

    def consume(self, event: Any) -> None:
        """Order the calling thread's work after ``event`` (nothing to do on a CPU)."""

    def close(self) -> None:
        pass


class CudaComm:
    """:class:`HostComm` on CUDA, where an NCCL ``Work`` completes at enqueue: issues on a side stream
    (after the chunk's ready event) and records an event after each all-reduce; an
    :class:`~repro.runtime.clock.EventCompletions` thread waits for those in issue order, so the credit is
    released when the device has finished. ``event_factory``, ``side_stream``, ``current_stream`` and
    ``completions`` are injectable (the CPU tests use fakes)."""

    on_device = True

    def __init__(self, device: torch.device | str | None = None, *, event_factory=None, side_stream: Any = None,
                 current_stream=None, completions: EventCompletions | None = None) -> None:
        self.device = torch.device(device if device is not None else "cuda")
        self._new_event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._side = side_stream if side_stream is not None else torch.cuda.Stream(self.device)
        self._current_stream = current_stream or (lambda: torch.cuda.current_stream(self.device))
        self.completions = completions or EventCompletions(self.device, name="bytescheduler-completions")

    def ready_marker(self) -> Any:
        ev = self._new_event()
        ev.record(self._current_stream())
        return ev

    def _on_side(self):
        import contextlib

        if isinstance(self._side, torch.cuda.Stream):
            return torch.cuda.stream(self._side)
        return contextlib.nullcontext()

    def issue(self, tensor: torch.Tensor, group: Any, after: Any) -> tuple[Any, Any]:
        with self._on_side():
            if after is not None:
                self._side.wait_event(after)
            work = dist.all_reduce(tensor, group=group, async_op=True)
            work.wait()          # NCCL: the side stream waits for the collective (the host does not)
            event = self._new_event()
            event.record(self._side)
        return work, event

    def on_complete(self, work: Any, event: Any, done) -> None:
        self.completions.watch(event, done)

    def run(self, fn, after: Any) -> Any:
        with self._on_side():
            if after is not None:
                self._side.wait_event(after)
            fn()
            event = self._new_event()
            event.record(self._side)
        return event

    def consume(self, event: Any) -> None:
        self._current_stream().wait_event(event)

    def close(self) -> None:
        self.completions.close()


class ByteSchedulerExecutor(Executor):
    """Priority-scheduled chunked all-reduce with layer-wise updates in the next forward (see the module)."""

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None, *,
                 comm: HostComm | CudaComm | None = None) -> None:
        """``comm``: how collectives are issued (None: :class:`CudaComm` on CUDA, else :class:`HostComm`)."""
        super().__init__(model, plan, options)
        if plan is None:
            raise PlanError("the ByteScheduler executor needs a plan (planner 'bytescheduler')")
        if plan.family != "bytescheduler":
            raise PlanError(f"ByteSchedulerExecutor executes bytescheduler plans, got a '{plan.family}' plan")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.launch.local")
        from repro.families.bytescheduler.planners import DEFAULT_CREDIT_BYTES

        self.credit_bytes = int(plan.option("credit_bytes", DEFAULT_CREDIT_BYTES))
        if self.credit_bytes < 1:
            raise PlanError(f"credit_bytes must be positive, got {self.credit_bytes}")
        check_plan_fits(plan, model, self.options.view)
        layers = layer_parameters(model, self.options.view)
        self._layers: dict[str, _Layer] = {}
        if any(len(b.layers) != 1 or len(b.messages) != 1 or b.collective != "allreduce" for b in plan.buckets):
            raise PlanError("a ByteScheduler chunk is one layer (or one piece of it) with one all-reduce")
        self._chunks: list[_Chunk] = []
        for b in plan.buckets:  # chunk ids in plan order
            name = b.layers[0]
            if name not in self._layers:
                self._layers[name] = _Layer(name, [p for _, p in layers[name]])
            layer = self._layers[name]
            index, count = b.piece if b.piece is not None else (0, 1)
            n = layer.numel
            if count > n:
                raise PlanError(f"layer '{name}' ({n} elements) cannot be split into {count} chunks")
            base, extra = divmod(n, count)
            start = index * base + min(index, extra)
            size = base + (1 if index < extra else 0)
            if index == count - 1:  # the last piece carries the layer's flags
                size += len(layer.params)
            view = layer.buffer[start:start + size]
            cid = len(self._chunks)
            timing = ChunkTiming(cid, name, index, count, view.numel() * view.element_size(),
                                 float(b.messages[0].priority))
            chunk = _Chunk(cid, layer, view, float(b.messages[0].priority), timing)
            layer.chunks.append(chunk)
            self._chunks.append(chunk)
        for layer in self._layers.values():
            covered = sum(c.view.numel() for c in layer.chunks)
            if covered != layer.buffer.numel():
                raise PlanError(f"layer '{layer.name}': its chunks cover {covered} of {layer.buffer.numel()} "
                                "elements")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        # every rank creates the groups in the same order (collective calls)
        self._ctrl = dist.new_group(backend="gloo")
        self._data = dist.new_group()
        device = next(iter(self._layers.values())).buffer.device
        self._comm = comm if comm is not None else (CudaComm(device) if device.type == "cuda" else HostComm())
        if isinstance(self._comm, CudaComm):
            self._comm.completions.on_error = self._fail  # a failed device wait surfaces in the main thread
        self._cond = threading.Condition()
        self._in_flight_bytes = 0      # decided or issued, not yet completed (the credit's count)
        self._buffers = any(True for _ in model.buffers())
        self._buf_requested = 0        # buffer broadcasts asked for by before_forward (this rank)
        self._buf_decided = 0          # ... decided by rank 0 (rank 0) / received (other ranks)
        self._buf_done = 0             # ... finished on the scheduler thread
        self._buf_after: Any = None    # CUDA: the request's event (buffers written by the last forward)
        self._buf_event: Any = None    # CUDA: event after the broadcast (what the forward waits for)
        self._seq = 0
        self._backward_seen = False
        self._closed = False
        self._error: BaseException | None = None
        self._optimizer: Any = None
        self._found_inf_report: FoundInfReport | None = None
        self._synchronized = False  # synchronize() ran: param.grad holds this step's averaged gradient
        self.timings = [c.timing for c in self._chunks] if self.options.record_timeline else []
        if self._comm.on_device:  # CUDA: completions come late, from the watcher: ChunkTiming.row waits for them
            for t in self.timings:
                t.__dict__["_done"] = threading.Event()  # set when its end_s is stamped
        self.clock = clock_for(model, self.options.clock)
        self.grad_ready_s = self.clock.ready  # layer -> ready time, resolved when read
        self._hyper: list[dict[str, Any]] | None = None  # the groups' hyperparameters at the last step()
        # a parameter used in a forward outside its owning module's forward is updated before that use
        self._use_guard = ApplyBeforeUse(model, self._apply)
        self._hooks = list(self._use_guard.handles)
        for layer in self._layers.values():
            for k, p in enumerate(layer.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(layer, k)))
        owner: dict[int, _Layer] = {id(p): layer for layer in self._layers.values() for p in layer.params}
        for m in model.modules():
            mine = list(dict.fromkeys(owner[id(p)] for p in m.parameters(recurse=False) if id(p) in owner))
            if mine:
                mine.sort(key=lambda lay: min(c.priority for c in lay.chunks))
                self._hooks.append(m.register_forward_pre_hook(self._pre_forward_hook(mine)))
        self._thread = threading.Thread(target=self._decide_loop if self.rank == 0 else self._follow_loop,
                                        name="bytescheduler", daemon=True)
        self._thread.start()

    def wrap_optimizer(self, optimizer: Any, grad_scaler: Any = None) -> "LayerwiseOptimizer":
        """The optimizer the loop steps; ``grad_scaler``: the GradScaler stepping it, which learns the
        verdict on the exchanged gradient (:meth:`step`)."""
        self._optimizer = optimizer
        if grad_scaler is not None:
            device = next(iter(self._layers.values())).buffer.device
            self._found_inf_report = FoundInfReport(grad_scaler, device)
        return LayerwiseOptimizer(optimizer, self)

    def step(self, amp: ScaledStep | None = None) -> None:
        """The wrapped optimizer's ``step()``: mark every layer's update pending; nothing is waited for.

        Under a GradScaler (``amp``; every rank calls this every step) it waits for every chunk and decides
        the skip on the all-reduced sums (the same verdict on every rank; any rank's inf/nan makes its sum
        non-finite), reports it to the scaler's ``update()``, and the layer-wise updates apply
        ``sum / P * inv_scale``. ``scaler.unscale_`` first is refused unless :meth:`synchronize` ran; after
        it, one optimizer step on ``param.grad``."""
        if self._optimizer is None:
            raise RuntimeError("ByteSchedulerExecutor: call wrap_optimizer(optimizer) before stepping")
        if self._synchronized:
            self._step_synchronized(amp)
            return
        check_scaled_step(amp, self._found_inf_report, "ByteScheduler")
        self._hyper = hyperparameters(self._optimizer)  # the updates apply with the lr etc. of this step
        self._arm()
        if amp is None:
            for layer in self._layers.values():
                layer.inv_scale = None
            return
        armed = [layer for layer in self._layers.values() if layer.armed]
        found = False
        if armed:  # one flag over every layer's sum, read once: one host sync per step, not one per layer
            nonfinite = torch.zeros((), dtype=torch.bool, device=armed[0].buffer.device)
            for layer in armed:
                self._wait(layer)
                nonfinite |= ~torch.isfinite(layer.buffer).all().to(nonfinite.device)
            found = bool(nonfinite.item())
        self._found_inf_report.report(found)
        for layer in armed:
            if found:
                self._reset(layer)
            else:
                layer.inv_scale = amp.inv_scale

    def synchronize(self) -> None:
        """Finish this step's exchange now: ``param.grad`` becomes the averaged gradient (a view of the
        layer's buffer), which the next :meth:`step` applies in one optimizer step. For
        ``scaler.unscale_(opt)`` or clipping before ``step()``."""
        if self._synchronized:
            return
        self._arm()
        for layer in self._layers.values():
            if not layer.armed:
                continue
            self._wait(layer)
            layer.buffer.div_(self.world_size)
            self._set_grads(layer)
            self._reset(layer)
        self._synchronized = True

    def _step_synchronized(self, amp: ScaledStep | None) -> None:
        self._synchronized = False
        if amp is None or not amp.found_inf:
            if amp is not None and amp.inv_scale is not None:
                with torch.no_grad():
                    for layer in self._layers.values():
                        for p in layer.params:
                            if p.grad is not None:
                                p.grad.mul_(amp.inv_scale)
            self._optimizer.step()

    def before_forward(self) -> None:
        """Rank 0's buffers on every rank, broadcast by the scheduler thread where rank 0 decides (at the
        same place among the all-reduces on every rank)."""
        if not self._buffers or not self.sync_buffers:
            return
        with self._cond:
            self._buf_after = self._comm.ready_marker()
            self._buf_requested += 1
            want = self._buf_requested
            self._cond.notify_all()
            while self._buf_done < want:
                if self._error is not None:
                    raise RuntimeError("ByteScheduler's scheduler thread failed") from self._error
                self._cond.wait(timeout=1.0)
            event = self._buf_event
        if event is not None:
            self._comm.consume(event)

    def _broadcast_buffers(self) -> None:
        """On the scheduler thread: broadcast the buffers on the data group."""
        with self._cond:
            after = self._buf_after
        event = self._comm.run(lambda: broadcast_buffers(self.model, src=0, group=self._data), after)
        with self._cond:
            self._buf_event = event
            self._buf_done += 1
            self._cond.notify_all()

    def after_backward(self) -> None:
        self._fill_missing()
        self.clock.end_iteration()

    def flush(self) -> None:
        """Apply every pending update (most urgent layer first); no chunk is in flight afterwards."""
        pending = [lay for lay in self._layers.values() if lay.armed]
        pending.sort(key=lambda lay: min(c.priority for c in lay.chunks))
        for layer in pending:
            self._apply(layer)

    def remove(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)
        self._comm.close()
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _grad_hook(self, layer: _Layer, k: int):
        def hook(param: torch.Tensor) -> None:
            self._backward_seen = True
            self._write(layer, k, param.grad)
        return hook

    def _write(self, layer: _Layer, k: int, grad: torch.Tensor | None) -> None:
        if layer.armed:  # last step's update of this layer not applied yet (it was not in the forward)
            self._apply(layer)
        if layer.written[k]:
            raise RuntimeError(f"gradient of a parameter in layer '{layer.name}' arrived twice in one "
                               "iteration; call step() between backward passes")
        if grad is None:
            layer.views[k].zero_()
            layer.flags[k] = 0
            layer.local_missing = True
        else:
            layer.views[k].copy_(grad.reshape(-1))
            layer.flags[k] = 1
        layer.written[k] = True
        layer.pending -= 1
        if layer.pending == 0:
            self.clock.mark(layer.name)
            layer.ready_event = self._comm.ready_marker()  # CUDA: the issue waits for the copies above
            with self._cond:
                now = time.perf_counter()
                for c in layer.chunks:
                    c.state = _READY
                    c.seq = self._seq
                    self._seq += 1
                    c.done = False
                    c.work = None
                    c.event = None
                    c.timing.ready_s = now
                    if "_done" in c.timing.__dict__:
                        c.timing.__dict__["_done"].clear()
                    c.timing.decided_s = c.timing.launch_s = c.timing.end_s = float("nan")
                self._cond.notify_all()

    def _fill_missing(self) -> None:
        """After a backward: parameters without a gradient contribute zeros; a layer whose last update is
        still pending is updated first."""
        if not self._backward_seen:
            return
        for layer in self._layers.values():
            if layer.armed or layer.pending > 0:
                for k in range(len(layer.params)):
                    if layer.armed or not layer.written[k]:
                        self._write(layer, k, None)

    def _arm(self) -> None:
        """``step()``: every layer whose gradients were exchanged this iteration is to be updated."""
        self._fill_missing()
        self._backward_seen = False
        for layer in self._layers.values():
            if layer.pending == 0:
                layer.armed = True
                self._use_guard.add(layer.params, layer)

    def _pre_forward_hook(self, layers: list[_Layer]):
        def hook(module, args) -> None:
            for layer in layers:
                if layer.armed:
                    self._apply(layer)
        return hook

    def _wait(self, layer: _Layer) -> None:
        """Wait for every chunk of ``layer`` to be issued and completed (CUDA: this thread's stream
        ordered after each chunk's event)."""
        with self._cond:
            while any(c.state != _ISSUED for c in layer.chunks):
                if self._error is not None:
                    raise RuntimeError("ByteScheduler's scheduler thread failed") from self._error
                self._cond.wait(timeout=1.0)
        if self._comm.on_device:  # CUDA: this stream waits for the all-reduces' events; the host does not
            for c in layer.chunks:
                self._comm.consume(c.event)
            return
        for c in layer.chunks:
            c.work.wait()
        with self._cond:  # and for the completion callbacks (they stamp end_s; gloo runs them after wait())
            while not all(c.done for c in layer.chunks):
                self._cond.wait(timeout=1.0)

    def _reset(self, layer: _Layer) -> None:
        """``layer``'s exchange is over: ready for the next backward."""
        with self._cond:
            for c in layer.chunks:
                c.state = _IDLE
                c.work = None
                c.event = None
        layer.written = [False] * len(layer.params)
        layer.pending = len(layer.params)
        layer.armed = False
        layer.inv_scale = None
        layer.local_missing = False
        self._use_guard.discard(layer.params)

    @staticmethod
    def _set_grads(layer: _Layer) -> None:
        """``param.grad`` <- the layer's averaged buffer (a view, cast if its dtype differs), None where no
        rank had a gradient (the flags are read only when this rank lacked one: a device-to-host copy on
        GPUs)."""
        used = (layer.flags > 0).tolist() if layer.local_missing else [True] * len(layer.params)
        for p, v, u in zip(layer.params, layer.views, used):
            avg = v.view_as(p)
            p.grad = None if not u else avg if avg.dtype == p.dtype else avg.to(p.dtype)

    def _apply(self, layer: _Layer) -> None:
        """Wait for ``layer``'s chunks and take the wrapped optimizer's step on its parameters alone."""
        with self._use_guard.suspended():  # its own reads and writes of the parameters are not uses
            self._wait(layer)
            layer.buffer.div_(self.world_size)
            if layer.inv_scale is not None:  # GradScaler: sum / P * (1 / scale), as DDP + GradScaler
                layer.buffer.mul_(layer.inv_scale)
            opt = self._optimizer
            if opt is None:
                raise RuntimeError("ByteSchedulerExecutor applies updates itself: call wrap_optimizer(optimizer) "
                                   "and step() the returned optimizer")
            mine = {id(p) for p in layer.params}
            saved = []
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None and id(p) not in mine:
                        saved.append((p, p.grad))
                        p.grad = None
            own = [(p, p.grad) for p in layer.params]
            self._set_grads(layer)
            with stepping_with(opt, self._hyper):
                opt.step()
            for p, g in own + saved:
                p.grad = g
            self._reset(layer)

    def _decide_loop(self) -> None:
        buf_id = len(self._chunks)  # the control message's id of "broadcast the buffers now"
        msg = torch.zeros(len(self._chunks) + 1, dtype=torch.int64)
        try:
            while True:
                with self._cond:
                    while True:
                        if self._closed:
                            return
                        if self._buf_requested > self._buf_decided:  # the forward waits for it: before any chunk
                            self._buf_decided += 1
                            pick = None
                            break
                        # ready chunks by (priority, readiness) while the credit allows
                        ready = sorted((c for c in self._chunks if c.state == _READY),
                                       key=lambda c: (c.priority, c.seq))
                        pick = pick_chunks(ready, self._in_flight_bytes, self.credit_bytes)
                        if pick:
                            break
                        self._cond.wait()
                    if pick is not None:
                        self._decide(pick)
                ids = [buf_id] if pick is None else [c.id for c in pick]
                msg[0] = len(ids)
                msg[1:1 + len(ids)] = torch.tensor(ids, dtype=torch.int64)
                dist.broadcast(msg, src=0, group=self._ctrl)
                if pick is None:
                    self._broadcast_buffers()
                for c in pick or ():
                    self._issue(c)
        except BaseException as e:  # surfaced in the main thread by _apply
            self._fail(e)

    def _follow_loop(self) -> None:
        buf_id = len(self._chunks)
        msg = torch.zeros(len(self._chunks) + 1, dtype=torch.int64)
        try:
            while True:
                with self._cond:
                    while not self._closed and self._buf_requested <= self._buf_decided \
                            and not any(c.state == _READY for c in self._chunks):
                        self._cond.wait()
                    if self._closed:
                        return
                dist.broadcast(msg, src=0, group=self._ctrl)
                for cid in msg[1:1 + int(msg[0])].tolist():
                    if cid == buf_id:
                        with self._cond:
                            while self._buf_requested <= self._buf_decided:  # not yet asked for here
                                if self._closed:
                                    return
                                self._cond.wait()
                            self._buf_decided += 1
                        self._broadcast_buffers()
                        continue
                    c = self._chunks[cid]
                    with self._cond:
                        while c.state != _READY:
                            if self._closed:
                                return
                            self._cond.wait()
                        self._decide([c])
                    self._issue(c)
        except BaseException as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = e
            self._cond.notify_all()

    def _decide(self, chunks: list[_Chunk]) -> None:
        """Under the lock: ``chunks`` are decided (their bytes enter the credit)."""
        now = time.perf_counter()
        for c in chunks:
            c.state = _DECIDED
            c.timing.decided_s = now
            self._in_flight_bytes += c.nbytes

    def _issue(self, c: _Chunk) -> None:
        c.timing.launch_s = time.perf_counter()
        work, event = self._comm.issue(c.view, self._data, c.layer.ready_event)
        with self._cond:
            c.gen += 1
            gen = c.gen
            c.work = work
            c.event = event
            c.state = _ISSUED
            self._cond.notify_all()
        self._comm.on_complete(work, event, lambda end_s, c=c, gen=gen: self._completed(c, gen, end_s))

    def _completed(self, c: _Chunk, gen: int, end_s: float) -> None:
        """``c``'s all-reduce of issue ``gen`` finished at ``end_s``: its bytes leave the credit; ``done``
        and ``end_s`` are set unless it was issued again since."""
        with self._cond:
            self._in_flight_bytes -= c.nbytes
            if c.gen == gen:
                c.timing.end_s = end_s
                c.done = True
                done = c.timing.__dict__.get("_done")
                if done is not None:
                    done.set()
            self._cond.notify_all()


class LayerwiseOptimizer(DeferredUpdateOptimizer):
    """What the loop steps under ByteScheduler: ``step()`` marks every layer's update pending (applied in
    the next forward or ``flush()``); note the argument order ``(optimizer, executor)``."""

    family = "ByteScheduler"

    def __init__(self, optimizer: Any, executor: "ByteSchedulerExecutor") -> None:
        super().__init__(executor, optimizer)
