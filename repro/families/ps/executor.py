"""A parameter server on torch.distributed (BSP / ASP / SSP(s) / OSP, docs/interpretations.md): ranks
``0..S-1`` serve (:func:`serve`, one thread per worker), the others train with :class:`PSExecutor`,
point to point; with ``ExecutorOptions.group`` None it is the co-located
:class:`~repro.families.ps.colocated.ColocatedPSExecutor`. Protocol and math: docs/design/families.md.
"""

from __future__ import annotations

import io
import pickle
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Plan
from repro.runtime.executor import Executor, ExecutorOptions, scaled_step
from repro.families.ps.layout import (
    GradChangeWatch, HandOverOptimizer, PSTiming, _Bucket, _flatten_into, _unflatten_from, _views,
    average_into_grads, begin_step, check_whole, fill_push, grad_changed_error, hyperparameters, merge_shards,
    param_indices, param_lrs, ps_layout, push_numel, set_grads_from, set_hyperparameters)

__all__ = ["PSExecutor", "PSOptimizer", "PSPeerSilentError", "PSTiming", "serve", "calibrate", "ps_layout", "STEP",
           "FETCH", "STOP", "STATE", "LOAD"]

STEP, FETCH, STOP, STATE, LOAD = 0, 1, 2, 3, 4
_HEADER_TAG = 0
_BLOB_TAG = 1 << 20          # a header's byte payload (settings, state); bucket tags are 1 + b below it
_REPLY_TAG = (1 << 20) + 1   # a byte answer's length (then the bytes on _REPLY_TAG + 1)


def _header(kind: int, step: int, device: torch.device | str = "cpu", nbytes: int = 0) -> torch.Tensor:
    """A ``[kind, step, nbytes]`` int64 header on the data's ``device``; ``nbytes`` > 0: a payload follows
    on ``_BLOB_TAG``."""
    return torch.tensor([kind, step, nbytes], dtype=torch.int64, device=device)


def _to_bytes(obj: Any, device: torch.device | str) -> torch.Tensor:
    """``obj`` serialised (``torch.save``: tensors kept, moved to the CPU) as a uint8 tensor on ``device``."""
    out = io.BytesIO()
    torch.save(obj, out)
    return torch.frombuffer(bytearray(out.getvalue()), dtype=torch.uint8).to(device)


def _from_bytes(buf: torch.Tensor) -> Any:
    return torch.load(io.BytesIO(buf.cpu().numpy().tobytes()), weights_only=False)


def _send_blob(buf: torch.Tensor, dst: int) -> None:
    """Send a byte tensor of a length the receiver does not know: the length, then the bytes."""
    dist.isend(torch.tensor([buf.numel()], dtype=torch.int64, device=buf.device), dst=dst, tag=_REPLY_TAG).wait()
    dist.isend(buf, dst=dst, tag=_REPLY_TAG + 1).wait()


def _recv_blob(src: int, device: torch.device | str) -> torch.Tensor:
    n = torch.zeros(1, dtype=torch.int64, device=device)
    dist.irecv(n, src=src, tag=_REPLY_TAG).wait()
    buf = torch.zeros(int(n.item()), dtype=torch.uint8, device=device)
    dist.irecv(buf, src=src, tag=_REPLY_TAG + 1).wait()
    return buf


def _refuse_nccl(who: str) -> None:
    if dist.get_backend() == "nccl":
        raise ValueError(f"{who}: dedicated parameter servers serve each worker from its own thread, point to point on "
                         "one communicator, which NCCL does not support; use co-located servers (repro.distribute) "
                         "or the gloo backend")


class PSPeerSilentError(RuntimeError):
    """A peer sent nothing within the process-group timeout (names the silent rank; the launcher reports
    it ahead of the errors it causes elsewhere)."""


def _silent(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("timed out" in text or "timeout" in text)


def _wait(handle: Any, who: str, peer: str) -> None:
    """``handle.wait()``; a timeout becomes a :class:`PSPeerSilentError` naming the silent peer."""
    try:
        handle.wait()
    except RuntimeError as e:
        if _silent(e):
            raise PSPeerSilentError(f"{who}: no message from {peer} within the process-group limit "
                                    "(--pg-timeout-s): that rank died, hung, was stopped or is itself stuck") from None
        raise


class PSOptimizer(HandOverOptimizer):
    """What the loop steps on a PS worker: ``step()`` pushes and installs the stage-1 pulls;
    ``synchronize()`` is :meth:`PSExecutor.synchronize`. A GradScaler's step is refused in one line."""

    _step_supports_amp_scaling = True

    def __init__(self, executor: "PSExecutor", optimizer: Any) -> None:
        super().__init__(executor, optimizer, lambda: executor._step(scaled_step(self)))

    def synchronize(self) -> None:
        self.executor.synchronize()


class PSExecutor(Executor):
    """A PS worker on ranks ``servers..world-1`` with a ``"ps"`` plan and the workers' group; with no group
    it is a :class:`~repro.families.ps.colocated.ColocatedPSExecutor` instead."""

    def __new__(cls, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None,
                *args: Any, **kwargs: Any):
        if cls is PSExecutor and (options is None or options.group is None):
            from repro.families.ps.colocated import ColocatedPSExecutor

            return ColocatedPSExecutor(model, plan, options, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None) -> None:
        super().__init__(model, plan, options)
        _refuse_nccl("PSExecutor")
        self.buckets = ps_layout(model, plan, self.options.view)
        self.servers = int(plan.option("servers"))
        self.mode = plan.option("mode")
        self.lgp = bool(plan.option("lgp", True)) and self.mode == "osp"
        self.rank = dist.get_rank()
        self.workers = dist.get_world_size() - self.servers
        if self.rank < self.servers:
            raise ValueError(f"rank {self.rank} serves ({self.servers} server ranks); it cannot be a worker")
        self.group = self.options.group
        if self.group is None:  # a collective on the default group would wait for the servers forever
            raise ValueError("a PS worker needs ExecutorOptions.group, the process group of the workers only "
                             f"(ranks {self.servers}..{dist.get_world_size() - 1}: dist.new_group on every rank)")
        self.step_index = 0
        dev = self.buckets[0].params[0].device if self.buckets and self.buckets[0].params else torch.device("cpu")
        self.device = dev
        self._push = [torch.zeros(push_numel(b), device=dev) for b in self.buckets]
        self._pull = [[torch.zeros(b.numel, device=dev) for b in self.buckets] for _ in range(2)]  # by step parity
        self._sends: list[Any] = []
        self._stage1: list[tuple[_Bucket, Any, torch.Tensor]] = []
        self._stage2: dict[int, list[tuple[_Bucket, Any, torch.Tensor]]] = {}   # step -> pending pulls
        self._local2: list[tuple[_Bucket, torch.Tensor, list[float]]] = []     # LGP: last stage-2 gradients, lrs
        self._stopped = False
        self._push_due = False
        self._synced = False
        self._flushed = False                     # nothing happened since the last flush()
        self._sent_settings = b""                 # the parameter groups' settings the servers have from us
        self._opt_hooks: list[Any] = []
        self._watch = GradChangeWatch([p for b in self.buckets for p in b.params])
        self._load_hook = model.register_load_state_dict_post_hook(lambda *_: self._send_params())
        self._loaded: dict | None = None          # the state dict the optimizer is loading
        self.bytes_pushed = 0
        self.bytes_pulled = 0

    def wrap_optimizer(self, optimizer: Any) -> PSOptimizer:
        """What the loop steps; ``optimizer``'s ``state_dict()`` / ``load_state_dict()`` now fetch from /
        send to the servers."""
        for h in self._opt_hooks:
            h.remove()
        self._optimizer = optimizer
        self._opt_hooks = [optimizer.register_state_dict_post_hook(self._fetch_state),
                           optimizer.register_load_state_dict_pre_hook(self._check_loaded),
                           optimizer.register_load_state_dict_post_hook(lambda _opt: self._send_state())]
        return PSOptimizer(self, optimizer)

    def before_forward(self) -> None:
        self._flushed = False
        t = self.step_index
        pending = self._stage2.pop(t - 2, None)       # stage 2 of step t-2: the freshest aggregated values
        if pending:
            self._install(pending)
        if self.lgp and self._local2:
            with torch.no_grad():
                for bucket, grad, lrs in self._local2:
                    for p, g, lr in zip(bucket.params, _views(grad, bucket.params), lrs):
                        p.add_(g, alpha=-lr)
            self._local2 = []

    def after_backward(self) -> None:
        self._push_due = True   # the pushes go at the step: after synchronize() and clipping

    def synchronize(self) -> None:
        """A collective of the workers between backward and step: under BSP/OSP ``param.grad`` becomes the
        average over the workers (None where none had a gradient), which the step pushes as it is; under
        ASP/SSP it stays this worker's own."""
        if not self._push_due or self._synced:
            return
        self._synced = True
        self._watch.clear()
        if self.mode in ("asp", "ssp"):
            return
        self._drain_sends()
        average_into_grads(self.buckets, self._push, self.group, self.workers)

    def _step(self, amp: Any) -> None:
        """The optimizer's step: push (refused if a gradient changed since backward without
        :meth:`synchronize`), then install the stage-1 pulls."""
        synced, changed = begin_step(self)
        if amp is not None:
            raise ValueError("parameter server: dedicated servers apply the pushed gradients without a GradScaler's "
                             "verdict; use the co-located servers (dedicated_servers=0) with grad_scaler")
        if changed:
            raise grad_changed_error(changed)
        self._flushed = False
        self._push_all(synced)
        self._install(self._stage1)
        self._stage1 = []
        self.step_index += 1

    def _check_loaded(self, optimizer: Any, state_dict: dict) -> dict:
        self._loaded = check_whole(state_dict)
        return self._loaded

    def _settings(self) -> bytes:
        """The parameter groups' settings, serialised, when they differ from what the servers have (else
        empty): sent with the step's header."""
        if self._optimizer is None:
            return b""
        now = pickle.dumps(hyperparameters(self._optimizer))
        if now == self._sent_settings:
            return b""
        self._sent_settings = now
        return now

    def _push_all(self, synced: bool) -> None:
        t = self.step_index
        self._drain_sends()
        settings = self._settings()
        blob = (torch.frombuffer(bytearray(settings), dtype=torch.uint8).to(self.device) if settings else None)
        for s in range(self.servers):
            self._sends.append(dist.isend(_header(STEP, t, self.device, len(settings)), dst=s, tag=_HEADER_TAG))
            if blob is not None:
                self._sends.append(dist.isend(blob, dst=s, tag=_BLOB_TAG))
        parity = t % 2
        self._stage1 = []
        local2 = []
        timings = []
        averaged = synced and self.mode not in ("asp", "ssp")
        for b in self.buckets:
            buf = self._push[b.index]
            if self.options.record_timeline:
                timings.append(PSTiming(b.index, b.stage, b.server, buf.numel() * buf.element_size(),
                                        time.perf_counter()))
            if averaged:   # every worker pushes the same average; the flags: 1 where any worker had a gradient
                flags = buf[b.numel:]
                flags.copy_((flags > 0).to(flags.dtype))
                _flatten_into(buf[:b.numel], [p.grad if p.grad is not None else torch.zeros_like(p)
                                              for p in b.params])
            else:
                fill_push(buf, b)
            self._sends.append(dist.isend(buf, dst=b.server, tag=1 + b.index))
            recv = self._pull[parity][b.index]
            handle = dist.irecv(recv, src=b.server, tag=1 + b.index)
            self.bytes_pushed += buf.numel() * buf.element_size()
            self.bytes_pulled += recv.numel() * recv.element_size()
            if b.stage == 1:
                self._stage1.append((b, handle, recv))
            else:
                self._stage2.setdefault(t, []).append((b, handle, recv))
                if self.lgp:   # read (not written) while it is sent
                    local2.append((b, buf[:b.numel], param_lrs(self._optimizer, b.params)))
        self._local2 = local2
        if self.options.record_timeline:
            self.timings = timings

    def _drain_sends(self) -> None:
        """Wait for this worker's sends (the push buffers are reused)."""
        for w in self._sends:
            _wait(w, f"worker rank {self.rank}", "a server")
        self._sends = []

    def _install(self, pending) -> None:
        for bucket, handle, buf in pending:
            _wait(handle, f"worker rank {self.rank}", f"server rank {bucket.server} (bucket {bucket.index})")
            _unflatten_from(buf, bucket.params)
            for t in self.timings:
                if t.bucket == bucket.index and t.end_s is None and bucket.stage == 1:
                    t.end_s = time.perf_counter()

    def flush(self) -> None:
        """Install every pull (ASP/SSP: the servers' current values), then the first worker's buffers. A
        collective of the workers, unless nothing happened since the last flush (then a no-op)."""
        if self._stopped or self._flushed:
            return
        self._install(self._stage1)
        self._stage1 = []
        for t in sorted(self._stage2):
            self._install(self._stage2.pop(t))
        self._local2 = []
        self._drain_sends()
        if self.mode in ("asp", "ssp"):
            dist.barrier(group=self.group)
            self._fetch()
        self._broadcast_buffers()
        self._flushed = True

    def _tell_servers(self, kind: int) -> None:
        """Send every server a ``kind`` header (waited for at the next :meth:`_drain_sends`)."""
        self._sends += [dist.isend(_header(kind, self.step_index, self.device), dst=s, tag=_HEADER_TAG)
                        for s in range(self.servers)]

    def _fetch(self) -> None:
        self._tell_servers(FETCH)
        pending = [(b, dist.irecv(self._pull[0][b.index], src=b.server, tag=1 + b.index), self._pull[0][b.index])
                   for b in self.buckets]
        self._install(pending)
        self._drain_sends()

    def _broadcast_buffers(self) -> None:
        buffers = [b for b in self.model.buffers() if b.is_floating_point() or b.dtype == torch.int64]
        for buf in buffers:
            dist.broadcast(buf, src=self.servers, group=self.group)

    def _ask(self, server: int, kind: int, payload: Any = None) -> Any:
        """One request to ``server`` (``STATE``, or ``LOAD`` with ``payload``) and its answer."""
        blob = None if payload is None else _to_bytes(payload, self.device)
        _wait(dist.isend(_header(kind, self.step_index, self.device, 0 if blob is None else blob.numel()),
                         dst=server, tag=_HEADER_TAG), f"worker rank {self.rank}", f"server rank {server}")
        if blob is not None:
            _wait(dist.isend(blob, dst=server, tag=_BLOB_TAG), f"worker rank {self.rank}", f"server rank {server}")
        return _from_bytes(_recv_blob(server, self.device))

    def _quiet(self) -> None:
        """Nothing of this worker in flight (its pulls installed, its sends done)."""
        if self._push_due or self._stage1:
            raise RuntimeError("the optimizer's state between backward and step(): call step() first")
        self._drain_sends()

    def _fetch_state(self, optimizer: Any, state_dict: dict) -> dict:
        """The whole optimizer state, merged from every server's shard; then a barrier, so that no push
        reaches a server before every worker has its copy. Every worker calls it, after a flush."""
        self._quiet()
        index = param_indices(optimizer)
        owned = {index[id(p)]: b.server for b in self.buckets for p in b.params if id(p) in index}
        shards = {s: self._ask(s, STATE) for s in range(self.servers)}
        dist.barrier(group=self.group)
        return merge_shards(state_dict, shards, owned)

    def _send_state(self) -> None:
        """After the optimizer loaded a state dict (every worker): the first worker sends it to every
        server, which loads it; then a barrier of the workers."""
        self._quiet()
        if self.rank == self.servers:
            for s in range(self.servers):
                self._ask(s, LOAD, {"optimizer": self._loaded})
        self._loaded = None
        self._sent_settings = b""   # the loaded dict set the groups' settings: send them again with the next step
        dist.barrier(group=self.group)

    def _send_params(self) -> None:
        """After the model loaded a state dict (every worker): the first worker sends every server its
        buckets' values, which it installs; then a barrier of the workers."""
        self._quiet()
        if self.rank == self.servers:
            for s in range(self.servers):
                self._ask(s, LOAD, {"params": {b.index: torch.cat([p.detach().reshape(-1) for p in b.params])
                                               for b in self.buckets if b.server == s}})
        dist.barrier(group=self.group)

    def remove(self) -> None:
        if self._stopped:
            return
        self.flush()
        self._tell_servers(STOP)
        self._drain_sends()
        self._stopped = True
        self._watch.remove()
        self._load_hook.remove()
        for h in self._opt_hooks:
            h.remove()
        self._opt_hooks = []


class _PeerFailed(RuntimeError):
    """Raised in a server thread that stops because another one failed (that one's error is reported)."""


class _Aggregate:
    """The N gradients of one (bucket, step), summed in worker order once all have arrived; the
    parameter groups' settings of that step (the first worker's)."""

    def __init__(self, workers: int) -> None:
        self.slots: list[torch.Tensor | None] = [None] * workers
        self.count = 0
        self.result: torch.Tensor | None = None
        self.settings: list[dict] | None = None


class _Server:
    def __init__(self, model: nn.Module, optimizer: Any, plan: Plan, view: str, index: int, workers: int,
                 servers: int) -> None:
        self.index, self.workers, self.servers = index, workers, servers
        self.mode = plan.option("mode")
        self.staleness = int(plan.option("staleness", 0) or 0)
        self.buckets = [b for b in ps_layout(model, plan, view) if b.server == index]
        self.optimizer = optimizer
        self.device = next(iter(model.parameters())).device
        self.update_lock = threading.Lock()
        self.cond = threading.Condition()
        self.aggregates: dict[tuple[int, int], _Aggregate] = {}
        self.clock = [0] * workers                # SSP: steps of each worker applied on this server
        self.clock_rows: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self.t0 = time.perf_counter()
        # Buffers allocated once: the sum of a bucket's N gradients; its aggregated values by step parity
        # (step t's pulls are sent while step t+1 aggregates); one snapshot per (worker, bucket).
        def zeros(b: _Bucket) -> torch.Tensor:
            return torch.zeros(b.numel, device=b.params[0].device)

        self._sum = {b.index: torch.zeros(push_numel(b), device=b.params[0].device) for b in self.buckets}
        self.settings: list[list[dict] | None] = [None] * workers   # each worker's latest parameter-group settings
        self._result = {b.index: [zeros(b), zeros(b)] for b in self.buckets}
        self._own = [{b.index: zeros(b) for b in self.buckets} for _ in range(workers)]

    def _apply(self, bucket: _Bucket, grad: torch.Tensor, out: torch.Tensor | None = None,
               settings: list[dict] | None = None) -> torch.Tensor | None:
        """One optimizer step on ``bucket`` with the push ``grad`` (gradients then flags) under the
        groups' ``settings`` of its step (None: the server's own); with ``out``, the new values copied
        into it."""
        with self.update_lock:
            set_grads_from(grad, bucket)
            now = None
            if settings is not None:
                now = hyperparameters(self.optimizer)
                set_hyperparameters(self.optimizer, settings)
            try:
                self.optimizer.step()
            finally:
                if now is not None:
                    set_hyperparameters(self.optimizer, now)
            for p in bucket.params:
                p.grad = None
            if out is not None:
                with torch.no_grad():
                    _flatten_into(out, bucket.params)
        return out

    def _snapshot(self, bucket: _Bucket, out: torch.Tensor) -> torch.Tensor:
        with self.update_lock:
            with torch.no_grad():
                _flatten_into(out, bucket.params)
        return out

    def _sync_contribute(self, bucket: _Bucket, step: int, worker: int, grad: torch.Tensor,
                         settings: list[dict] | None = None) -> None:
        key = (bucket.index, step)
        last = False
        with self.cond:
            agg = self.aggregates.setdefault(key, _Aggregate(self.workers))
            agg.slots[worker] = grad
            if worker == 0:
                agg.settings = settings
            agg.count += 1
            last = agg.count == self.workers
        if last:
            total = self._sum[bucket.index]
            total.copy_(agg.slots[0])
            for g in agg.slots[1:]:
                total.add_(g)
            total[:bucket.numel].div_(self.workers)   # the flags stay counts
            result = self._apply(bucket, total, self._result[bucket.index][step % 2], agg.settings)
            with self.cond:
                agg.result = result
                agg.slots = []
                self.cond.notify_all()

    def _sync_result(self, bucket: _Bucket, step: int) -> torch.Tensor:
        key = (bucket.index, step)
        with self.cond:
            while self.aggregates[key].result is None:
                if self.errors:
                    raise _PeerFailed("another server thread failed")
                self.cond.wait(timeout=1.0)
            agg = self.aggregates[key]
            agg.count -= 1            # each worker's thread collects once; the last one drops the entry
            if agg.count == 0:
                del self.aggregates[key]
            return agg.result

    def run_worker(self, worker: int) -> None:
        try:
            self._loop(worker)
        except _PeerFailed:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by serve()
            rank = self.servers + worker
            if _silent(e):
                err = PSPeerSilentError(f"server {self.index}: no message from worker rank {rank} within the "
                                        "process-group limit (--pg-timeout-s): that worker died, hung, was "
                                        "stopped or is itself stuck")
            else:
                err = RuntimeError(f"server {self.index}: serving worker rank {rank} failed: {type(e).__name__}: {e}")
            err.__cause__ = e
            with self.cond:
                self.errors.append(err)
                self.cond.notify_all()

    def _state_shard(self) -> dict[int, dict]:
        """This server's parameters' optimizer state, by their index in the optimizer's state dict."""
        with self.update_lock:
            index = param_indices(self.optimizer)
            mine = {index[id(p)] for b in self.buckets for p in b.params if id(p) in index}
            return {i: s for i, s in self.optimizer.state_dict()["state"].items() if i in mine}

    def _load(self, payload: dict) -> None:
        """A worker's ``LOAD``: the whole optimizer state (each server keeps using its parameters'
        part), or this server's buckets' values."""
        with self.update_lock:
            if payload.get("optimizer") is not None:
                self.optimizer.load_state_dict(payload["optimizer"])
            for b in self.buckets:
                if b.index in payload.get("params", {}):
                    _unflatten_from(payload["params"][b.index].to(self.device), b.params)

    def _loop(self, worker: int) -> None:
        src = self.servers + worker
        header = torch.zeros(3, dtype=torch.int64, device=self.device)
        recv = {b.index: torch.zeros(push_numel(b), device=b.params[0].device) for b in self.buckets}
        own = self._own[worker]
        while True:
            dist.irecv(header, src=src, tag=_HEADER_TAG).wait()
            kind, step, nbytes = (int(v) for v in header.tolist())
            blob = None
            if nbytes:
                blob = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
                dist.irecv(blob, src=src, tag=_BLOB_TAG).wait()
            if kind == STOP:
                return
            if kind == STATE:
                _send_blob(_to_bytes(self._state_shard(), self.device), src)
                continue
            if kind == LOAD:
                self._load(_from_bytes(blob))
                _send_blob(_to_bytes(None, self.device), src)
                continue
            if kind == STEP and blob is not None:
                self.settings[worker] = pickle.loads(blob.cpu().numpy().tobytes())
            settings = self.settings[worker]
            if kind == FETCH:
                sends = [dist.isend(self._snapshot(b, own[b.index]), dst=src, tag=1 + b.index) for b in self.buckets]
                for w in sends:
                    w.wait()
                continue
            if kind != STEP:
                raise RuntimeError(f"server {self.index}: unknown header {kind} from worker {worker}")
            handles = [(b, dist.irecv(recv[b.index], src=src, tag=1 + b.index)) for b in self.buckets]
            replies = []
            if self.mode in ("bsp", "osp"):
                # stage 1 is answered before stage 2's pushes are awaited: the blocking pulls must not
                # wait for the background traffic (the plan orders the stage-1 buckets first)
                for stage in (1, 2):
                    mine = [(b, h) for b, h in handles if b.stage == stage]
                    for b, h in mine:
                        h.wait()
                        self._sync_contribute(b, step, worker, recv[b.index], settings)  # re-posted next step
                    for b, _ in mine:
                        out = self._sync_result(b, step)
                        replies.append(dist.isend(out, dst=src, tag=1 + b.index))
            elif self.mode == "asp":
                for b, h in handles:
                    h.wait()
                    recv[b.index][:b.numel].div_(self.workers)
                    out = self._apply(b, recv[b.index], own[b.index], settings)
                    replies.append(dist.isend(out, dst=src, tag=1 + b.index))
            else:  # ssp
                for b, h in handles:
                    h.wait()
                    recv[b.index][:b.numel].div_(self.workers)
                    self._apply(b, recv[b.index], settings=settings)
                with self.cond:
                    self.clock[worker] = step + 1
                    self.cond.notify_all()
                    while min(self.clock) < step + 1 - self.staleness:
                        if self.errors:
                            raise _PeerFailed("another server thread failed")
                        self.cond.wait(timeout=1.0)
                    self.clock_rows.append({"server": self.index, "worker": worker, "iteration": step + 1,
                                            "slowest_clock": min(self.clock), "staleness": self.staleness,
                                            "time_s": time.perf_counter() - self.t0})
                for b in self.buckets:
                    replies.append(dist.isend(self._snapshot(b, own[b.index]), dst=src, tag=1 + b.index))
            for w in replies:
                w.wait()


def serve(ctx: Any, cfg: Any, model: nn.Module, optimizer: Any, plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Serve the plan's buckets of this rank (``dist.get_rank()`` < servers) until every worker stops;
    returns the tables it recorded (``server_clocks`` under SSP)."""
    _refuse_nccl("serve")
    servers = int(plan.option("servers"))
    rank = dist.get_rank()
    workers = dist.get_world_size() - servers
    server = _Server(model, optimizer, plan, getattr(cfg, "view", "tensor"), rank, workers, servers)
    threads = [threading.Thread(target=server.run_worker, args=(w,), name=f"ps{rank}-worker{w}", daemon=True)
               for w in range(workers)]
    for t in threads:
        t.start()
    # the first failure ends the rank at once (the other threads may be blocked in a receive from a
    # worker that waits for this server: the launcher, or the job's teardown, ends them)
    while any(t.is_alive() for t in threads):
        if server.errors:
            break
        for t in threads:
            t.join(timeout=0.2)
    if server.errors:
        raise server.errors[0]
    return {"server_clocks": server.clock_rows} if server.clock_rows else {}


def calibrate(trace, device, repeats: int, network_cost=None, servers: int = 1, **_options):
    """The PS family's calibration hook: the ``push``/``pull`` lines of ``network_cost``, else push = pull =
    half the median round trip of ping-pongs (4 KiB up to the model's bytes, at most 64 MiB) between rank 0
    and a worker: rank ``servers`` with N = world - servers for dedicated servers, rank 1 (or ``servers``)
    with N = world when co-located (``servers`` >= world, or fewer than 2 ranks left to train). Every rank
    calls it and gets the same model."""
    from repro.core.cost import CostModel, fit_linear
    from repro.runtime.calibrate import default_sizes_bytes
    from repro.runtime.online import sync_device

    if network_cost is not None:
        network_cost.line("push")
        network_cost.line("pull")
        return network_cost
    rank, world = dist.get_rank(), dist.get_world_size()
    colocated = world - int(servers) < 2
    first = int(servers) if int(servers) < world else 1
    workers = world if colocated else world - first
    if world < 2:
        raise ValueError("fitting the parameter server's push/pull needs at least 2 ranks; give a network preset "
                         "or a cost model")
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    sizes = default_sizes_bytes(min(int(trace.total_bytes), 64 * 2**20), count=6)
    halves = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), device=dev)
        times = []
        for i in range(max(1, int(repeats)) + 1):
            if rank == first:
                sync_device(dev)
                t0 = time.perf_counter()
                dist.send(buf, dst=0, tag=7)
                dist.recv(buf, src=0, tag=7)
                sync_device(dev)   # NCCL's recv returns at enqueue: the round trip ends on the device
                if i:
                    times.append((time.perf_counter() - t0) / 2)
            elif rank == 0:
                dist.recv(buf, src=first, tag=7)
                dist.send(buf, dst=first, tag=7)
        times.sort()
        halves.append(times[len(times) // 2] if times else 0.0)
    payload = [halves]
    dist.broadcast_object_list(payload, src=first)
    halves = payload[0]
    line = fit_linear(sizes, halves)
    meta = {"measurements": {"push": {"bytes": list(map(int, sizes)), "seconds": halves}}}
    where = (f"{world} ranks, {servers} server(s) co-located" if colocated else f"{workers} workers, {first} servers")
    return CostModel(workers, {"push": line, "pull": line},
                     source=f"point-to-point ping-pong between a server and a worker on the live job ({where})",
                     meta=meta)
