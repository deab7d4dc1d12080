"""Run a ByteScheduler plan: chunked all-reduces served by priority under a credit, each layer updated as
its chunks complete (dear.md "Baselines"; Peng et al., SOSP 2019; the model is :mod:`repro.sim.bytescheduler`).

A plan of the ``bytescheduler`` family lists **chunks**: a whole layer, or piece ``(index, count)`` of
one layer (near-equal chunks by elements, the first ``numel % count`` one element longer, as
:func:`repro.plan._piece_fraction`), each with one all-reduce message whose ``priority`` is the layer's
forward index (lower = more urgent: the next forward needs it first). Option ``credit_bytes``: the
bytes of chunks in flight at most (the paper's runs: 16,000,000 with 4,000,000-parameter partitions;
the planner's defaults).

How :class:`ByteSchedulerExecutor` runs it, per rank:

- **backward**: ``register_post_accumulate_grad_hook`` copies each parameter's gradient into its
  layer's flat buffer; when a layer's last gradient has arrived, its chunks become *ready*;
- **scheduler** (a background thread per executor; only it issues collectives on the executor's two
  process groups): issues ready chunks' asynchronous ``all_reduce`` (sums) in priority order (lowest
  ``priority`` first, ties by readiness order) while the bytes in flight stay within the credit (one
  chunk is always allowed when none is in flight). Priority order is strict: a chunk that does not fit
  the credit holds back every less urgent one;
- **update**: :meth:`wrap_optimizer`'s ``step()`` does not wait for anything; it only marks every
  layer's update as pending. Forward pre-hooks apply them: before a module holding parameters of
  layer ``l`` runs in the next forward, the hook waits for ``l``'s chunks, divides the buffer by the
  world size ``P``, sets ``p.grad`` of ``l``'s parameters (every other parameter's gradient is set to
  ``None`` for the call and restored after it) and calls the wrapped optimizer's ``step()``; torch's
  optimizers skip parameters whose ``grad`` is None (no state, momentum or weight decay touched: SGD,
  AdamW and the others of ``torch.optim`` keep their state per parameter), so one layer is updated
  exactly as a whole-model step would update it. So the next forward starts as soon as the input-side
  layers are updated, while output-side chunks are still in flight. :meth:`flush` applies everything
  pending (the loop calls it before an evaluation or a checkpoint and at the end);
- buffers are broadcast from rank 0 before every forward (as DDP does);
- mixed precision: with ``torch.amp.GradScaler`` the loop stays ``scaler.scale(loss).backward();
  ex.after_backward(); scaler.step(opt); scaler.update()`` with ``opt = ex.wrap_optimizer(optimizer,
  grad_scaler=scaler)``; ``step()`` then waits for every chunk, decides the skip on the all-reduced
  sums (the same on every rank), tells the scaler's ``update()``, and the layer-wise updates apply
  ``sum / P / scale``; ``opt.synchronize()`` finishes the exchange early for ``scaler.unscale_(opt)``
  and clipping (:meth:`ByteSchedulerExecutor.step`).

**Same collectives on every rank.** Which chunks are ready, and which completed, at a given moment
differs between ranks, and so would a priority order decided locally. So rank 0 decides: its
scheduler thread picks the chunks to issue (its own readiness, its own completions for the credit)
and broadcasts their ids on a control group (one small broadcast per decision, which may name several
chunks); every other rank's scheduler thread receives each decision, waits until those chunks are
ready locally (they will be: every rank runs the same backward) and issues them in the decided order.
Every rank thus issues the same all-reduces in the same order on the data group. A rank enters the
broadcast only when it holds a ready chunk not yet issued, and a chunk not yet issued on that rank
is one rank 0 has still to decide or has decided in a broadcast that rank has not yet received, so
every broadcast is matched. The decision stream also never waits on a later iteration: rank 0 decides
a chunk of iteration ``i + 1`` only after its forward ``i + 1`` applied every used layer, i.e. after
deciding all of iteration ``i``'s chunks that the other ranks' forwards wait for.
Only the scheduler thread issues collectives on the control and data groups; the main thread issues
the buffer broadcast on the default group (before the forward) and nothing else. The control group is
gloo (a CPU tensor); with NCCL the data group is NCCL (untested: no GPU where this was written).

With ``record_timeline`` ``timings`` holds per chunk of the last iteration a :class:`ChunkTiming`
(layer, piece, bytes, priority, and ``time.perf_counter()`` seconds: ready, decided (picked by rank 0;
received elsewhere), launched, completed).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.plan import Plan, PlanError
from repro.runtime.buffers import broadcast_buffers
from repro.runtime.clock import clock_for
from repro.runtime.executor import (Executor, ExecutorOptions, FoundInfReport, ScaledStep, check_scaled_step,
                                    scaled_step)
from repro.workload.layers import layer_parameters

__all__ = ["ByteSchedulerExecutor", "ChunkTiming", "LayerwiseOptimizer"]

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
        """One ``buckets.csv`` row: time stamps in seconds after ``origin_s``, ``launch_s`` as ``start_s``."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("_s"):
                v = v - origin_s
            out["start_s" if f.name == "launch_s" else f.name] = v
        return out


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
        self.done = False
        self.gen = 0          # issue count: a late completion callback of an earlier issue is ignored


class _Layer:
    def __init__(self, name: str, params: list[nn.Parameter]):
        self.name = name
        self.params = params
        dtype = params[0].dtype
        if any(p.dtype != dtype for p in params):
            raise PlanError(f"layer '{name}': parameters of different dtypes cannot share one flat buffer")
        self.buffer = torch.zeros(sum(p.numel() for p in params), dtype=dtype, device=params[0].device)
        self.views = []
        offset = 0
        for p in params:
            self.views.append(self.buffer[offset:offset + p.numel()])
            offset += p.numel()
        self.written = [False] * len(params)
        self.pending = len(params)
        self.chunks: list[_Chunk] = []
        self.armed = False    # its update (of the last step) is still to be applied
        self.inv_scale: Any = None  # GradScaler's 1/scale for that update (None: not scaled)


class ByteSchedulerExecutor(Executor):
    """Priority-scheduled chunked all-reduce with layer-wise updates in the next forward (see the module)."""

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None) -> None:
        super().__init__(model, plan, options)
        if plan is None:
            raise PlanError("the ByteScheduler executor needs a plan (planner 'bytescheduler')")
        if plan.family != "bytescheduler":
            raise PlanError(f"ByteSchedulerExecutor executes bytescheduler plans, got a '{plan.family}' plan")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.cluster.local")
        from repro.planners.bytescheduler import DEFAULT_CREDIT_BYTES

        self.credit_bytes = int(plan.option("credit_bytes", DEFAULT_CREDIT_BYTES))
        if self.credit_bytes < 1:
            raise PlanError(f"credit_bytes must be positive, got {self.credit_bytes}")
        layers = layer_parameters(model, self.options.view)
        self._layers: dict[str, _Layer] = {}
        pieces: dict[str, list] = {}
        for b in plan.buckets:
            if len(b.layers) != 1 or len(b.messages) != 1 or b.collective != "allreduce":
                raise PlanError("a ByteScheduler chunk is one layer (or one piece of it) with one all-reduce")
            name = b.layers[0]
            if name not in layers:
                raise PlanError(f"plan names layer '{name}', which the model does not have in view "
                                f"'{self.options.view}'")
            pieces.setdefault(name, []).append(b)
        missing = [n for n in layers if n not in pieces]
        if missing:
            raise PlanError(f"plan leaves {len(missing)} layer(s) of the model out, e.g. {missing[:3]}")
        self._chunks: list[_Chunk] = []
        for b in plan.buckets:  # chunk ids in plan order
            name = b.layers[0]
            if name not in self._layers:
                self._layers[name] = _Layer(name, [p for _, p in layers[name]])
            layer = self._layers[name]
            index, count = b.piece if b.piece is not None else (0, 1)
            n = layer.buffer.numel()
            if count > n:
                raise PlanError(f"layer '{name}' ({n} elements) cannot be split into {count} chunks")
            base, extra = divmod(n, count)
            start = index * base + min(index, extra)
            size = base + (1 if index < extra else 0)
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
        self._cond = threading.Condition()
        self._seq = 0
        self._backward_seen = False
        self._closed = False
        self._error: BaseException | None = None
        self._optimizer: Any = None
        self._found_inf_report: FoundInfReport | None = None
        self._synchronized = False  # synchronize() ran: param.grad holds this step's averaged gradient
        self.timings = [c.timing for c in self._chunks] if self.options.record_timeline else []
        self.clock = clock_for(model, self.options.clock)
        self.grad_ready_s = self.clock.ready  # layer -> ready time, resolved when read
        self._hooks = []
        for layer in self._layers.values():
            for k, p in enumerate(layer.params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(layer, k)))
        owner: dict[int, _Layer] = {id(p): layer for layer in self._layers.values() for p in layer.params}
        for m in model.modules():
            mine = []
            for p in m.parameters(recurse=False):
                layer = owner.get(id(p))
                if layer is not None and layer not in mine:
                    mine.append(layer)
            if mine:
                mine.sort(key=lambda lay: min(c.priority for c in lay.chunks))
                self._hooks.append(m.register_forward_pre_hook(self._pre_forward_hook(mine)))
        self._thread = threading.Thread(target=self._decide_loop if self.rank == 0 else self._follow_loop,
                                        name="bytescheduler", daemon=True)
        self._thread.start()

    # ---- executor contract ----
    def wrap_optimizer(self, optimizer: Any, grad_scaler: Any = None) -> "LayerwiseOptimizer":
        """The optimizer the loop steps. ``grad_scaler``: the ``torch.amp.GradScaler`` the loop steps it
        with (needed for ``scaler.step(opt)`` without ``synchronize()``: its ``update()`` must learn the
        verdict on the exchanged gradient, see :meth:`step`)."""
        self._optimizer = optimizer
        if grad_scaler is not None:
            device = next(iter(self._layers.values())).buffer.device
            self._found_inf_report = FoundInfReport(grad_scaler, device)
        return LayerwiseOptimizer(optimizer, self)

    def step(self, amp: ScaledStep | None = None) -> None:
        """The wrapped optimizer's ``step()``: mark every layer's update pending (applied in the next
        forward); nothing is waited for.

        Under ``torch.amp.GradScaler`` (``amp``: what ``scaler.step(opt)`` attached; every rank calls
        this every step, skipped or not):

        - the skip needs the whole exchanged gradient, so this waits for every chunk's all-reduce (the
          chunks still in flight no longer overlap the next forward) and checks the sums for inf/nan.
          The all-reduced sums are the same on every rank, so is the verdict; and an inf/nan in any
          rank's own gradient makes its sum inf/nan (IEEE: inf + finite = inf, inf - inf = nan, nan + x
          = nan), so the verdict covers GradScaler's check of this rank's ``param.grad``;
        - found: no layer is updated (optimizer state untouched), as ``GradScaler.step`` skips
          ``optimizer.step()``; else each layer's averaged gradient is multiplied by GradScaler's
          ``1 / scale`` just before its update (``sum / P * inv_scale``, the order DDP + GradScaler use);
        - the verdict goes to the scaler's ``update()`` (:class:`~repro.runtime.executor.FoundInfReport`,
          hence ``wrap_optimizer(opt, grad_scaler=scaler)``), so it backs off on every rank or on none;
        - ``scaler.unscale_(opt)`` before ``scaler.step(opt)`` is refused unless :meth:`synchronize` ran.

        After :meth:`synchronize`: one optimizer step on ``param.grad`` (unscaled first when GradScaler
        has not yet; skipped when it found an inf/nan, a verdict the same on every rank).
        """
        if self._optimizer is None:
            raise RuntimeError("ByteSchedulerExecutor: call wrap_optimizer(optimizer) before stepping")
        if self._synchronized:
            self._step_synchronized(amp)
            return
        check_scaled_step(amp, self._found_inf_report, "ByteScheduler")
        self._arm()
        if amp is None:
            for layer in self._layers.values():
                layer.inv_scale = None
            return
        armed = [layer for layer in self._layers.values() if layer.armed]
        found = False
        for layer in armed:
            self._wait(layer)
            found = found or not bool(torch.isfinite(layer.buffer).all())
        self._found_inf_report.report(found)
        for layer in armed:
            if found:
                self._reset(layer)
            else:
                layer.inv_scale = amp.inv_scale

    def synchronize(self) -> None:
        """Finish this step's exchange now (every chunk's all-reduce waited): ``param.grad`` of every
        parameter is its averaged gradient (a view of the layer's buffer, the same on every rank). The
        next :meth:`step` applies ``param.grad`` in one optimizer step instead of layer by layer in the
        next forward. For ``scaler.unscale_(opt)``, gradient clipping or inspection before ``step()``."""
        if self._synchronized:
            return
        self._arm()
        for layer in self._layers.values():
            if not layer.armed:
                continue
            self._wait(layer)
            layer.buffer.div_(self.world_size)
            for p, v in zip(layer.params, layer.views):
                avg = v.view_as(p)
                p.grad = avg if avg.dtype == p.dtype else avg.to(p.dtype)
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
        broadcast_buffers(self.model)

    def after_backward(self) -> None:
        self._fill_missing()

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
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ---- backward ----
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
        else:
            layer.views[k].copy_(grad.reshape(-1))
        layer.written[k] = True
        layer.pending -= 1
        if layer.pending == 0:
            self.clock.mark(layer.name)
            with self._cond:
                now = time.perf_counter()
                for c in layer.chunks:
                    c.state = _READY
                    c.seq = self._seq
                    self._seq += 1
                    c.done = False
                    c.work = None
                    c.timing.ready_s = now
                    c.timing.decided_s = c.timing.launch_s = c.timing.end_s = float("nan")
                self._cond.notify_all()

    def _fill_missing(self) -> None:
        """After a backward: parameters that got no gradient contribute zeros (as DDP's unused
        parameters); a layer whose last update is still pending (it was in neither pass) is updated
        first."""
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

    # ---- next forward ----
    def _pre_forward_hook(self, layers: list[_Layer]):
        def hook(module, args) -> None:
            for layer in layers:
                if layer.armed:
                    self._apply(layer)
        return hook

    def _wait(self, layer: _Layer) -> None:
        """Wait for every chunk of ``layer``: issued, completed, and its completion callback run."""
        with self._cond:
            while any(c.state != _ISSUED for c in layer.chunks):
                if self._error is not None:
                    raise RuntimeError("ByteScheduler's scheduler thread failed") from self._error
                self._cond.wait(timeout=1.0)
        for c in layer.chunks:
            c.work.wait()
        with self._cond:  # and for the completion callbacks (they stamp end_s; gloo runs them after wait())
            while not all(c.done for c in layer.chunks):
                self._cond.wait(timeout=1.0)

    def _reset(self, layer: _Layer) -> None:
        """``layer``'s exchange is over (applied, skipped or handed to ``param.grad``): ready for the next
        backward."""
        with self._cond:
            for c in layer.chunks:
                c.state = _IDLE
                c.work = None
        layer.written = [False] * len(layer.params)
        layer.pending = len(layer.params)
        layer.armed = False
        layer.inv_scale = None

    def _apply(self, layer: _Layer) -> None:
        """Wait for ``layer``'s chunks and take the wrapped optimizer's step on its parameters alone."""
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
        for p, v in zip(layer.params, layer.views):
            avg = v.view_as(p)
            p.grad = avg if avg.dtype == p.dtype else avg.to(p.dtype)
        opt.step()
        for p, g in own + saved:
            p.grad = g
        self._reset(layer)

    # ---- scheduler thread ----
    def _pick(self) -> list[_Chunk]:
        """Rank 0, under the lock: ready chunks by (priority, readiness) while the credit allows."""
        ready = sorted((c for c in self._chunks if c.state == _READY), key=lambda c: (c.priority, c.seq))
        if not ready:
            return []
        in_flight = sum(c.nbytes for c in self._chunks if c.state in (_DECIDED, _ISSUED) and not c.done)
        pick = []
        for c in ready:
            if in_flight + c.nbytes <= self.credit_bytes or (in_flight == 0 and not pick):
                pick.append(c)
                in_flight += c.nbytes
            else:
                break  # strict priority: a less urgent chunk never passes one waiting for credit
        return pick

    def _decide_loop(self) -> None:
        msg = torch.zeros(len(self._chunks) + 1, dtype=torch.int64)
        try:
            while True:
                with self._cond:
                    while True:
                        if self._closed:
                            return
                        pick = self._pick()
                        if pick:
                            break
                        self._cond.wait()
                    now = time.perf_counter()
                    for c in pick:
                        c.state = _DECIDED
                        c.timing.decided_s = now
                msg[0] = len(pick)
                msg[1:1 + len(pick)] = torch.tensor([c.id for c in pick], dtype=torch.int64)
                dist.broadcast(msg, src=0, group=self._ctrl)
                for c in pick:
                    self._issue(c)
        except BaseException as e:  # surfaced in the main thread by _apply
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _follow_loop(self) -> None:
        msg = torch.zeros(len(self._chunks) + 1, dtype=torch.int64)
        try:
            while True:
                with self._cond:
                    while not self._closed and not any(c.state == _READY for c in self._chunks):
                        self._cond.wait()
                    if self._closed:
                        return
                dist.broadcast(msg, src=0, group=self._ctrl)
                for cid in msg[1:1 + int(msg[0])].tolist():
                    c = self._chunks[cid]
                    with self._cond:
                        while c.state != _READY:
                            if self._closed:
                                return
                            self._cond.wait()
                        c.state = _DECIDED
                        c.timing.decided_s = time.perf_counter()
                    self._issue(c)
        except BaseException as e:
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _issue(self, c: _Chunk) -> None:
        c.timing.launch_s = time.perf_counter()
        work = dist.all_reduce(c.view, group=self._data, async_op=True)
        with self._cond:
            c.gen += 1
            gen = c.gen
            c.work = work
            c.state = _ISSUED
            self._cond.notify_all()
        work.get_future().then(lambda _f, c=c, gen=gen: self._completed(c, gen))

    def _completed(self, c: _Chunk, gen: int) -> None:
        now = time.perf_counter()
        with self._cond:
            if c.gen == gen:
                c.timing.end_s = now
                c.done = True
                self._cond.notify_all()


class LayerwiseOptimizer:
    """What the loop steps under ByteScheduler: ``step()`` only marks every layer's update as pending
    (the executor applies each in the next forward, or in ``flush()``); ``state_dict()`` flushes first;
    ``zero_grad`` and the rest are the wrapped optimizer's.

    **GradScaler** (``_step_supports_amp_scaling``): ``scaler.step(opt)`` always calls :meth:`step` with
    the scale and its own inf check attached (:func:`~repro.runtime.executor.scaled_step`); see
    :meth:`ByteSchedulerExecutor.step`. ``synchronize()`` (Horovod-style) finishes the exchange now so
    that ``param.grad`` holds the averaged gradient for ``scaler.unscale_(opt)`` or clipping before
    ``step()``, which then applies it in one optimizer step."""

    _step_supports_amp_scaling = True

    def __init__(self, optimizer: Any, executor: ByteSchedulerExecutor) -> None:
        self.optimizer = optimizer
        self.executor = executor

    def step(self) -> None:
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

    def state_dict(self) -> dict:
        """The wrapped optimizer's state after every pending update is applied."""
        self.executor.flush()
        return self.optimizer.state_dict()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)
