"""A parameter server on torch.distributed: S server ranks, N workers, BSP / ASP / SSP(s) / OSP.

This package's reading of OSP (``../shared/papers/osp.md``; only the abstract is published, so the
interpretation written there is what runs here). Ranks ``0..S-1`` serve (:func:`serve`), ranks
``S..S+N-1`` train with :class:`PSExecutor`. A ``"ps"`` plan (:mod:`repro.planners.ps`) gives each
bucket (the layers of one stage held by one server) its server; everything travels point to point on
the default process group (gloo: ``isend``/``irecv``; the workers' own collectives, evaluation and
summaries, use a process group of the workers only).

**Wire protocol**, per worker step ``t`` and server ``s`` (tags: 0 for headers, ``1 + b`` for bucket
``b``): the worker sends a header ``[STEP, t]``, then, for each of the server's buckets in plan order,
the flat gradient (push); the server answers each bucket with its flat parameters (pull). A header
``[FETCH, t]`` asks for every bucket's current parameters (no push); ``[STOP, t]`` ends the server's
thread for that worker. Each server runs one thread per worker; updates are serialised by one lock.
Under BSP/OSP a step's stage-1 buckets are answered before its stage-2 pushes are awaited, so the
blocking pulls never wait for the background traffic. A server thread that fails (e.g. its worker died)
ends :func:`serve` at once with an error naming that worker's rank.

**Server.** It holds a full copy of the model and the run's optimizer, with the trainers' state at the
end of the warm-up (the generic loop hands both over), and updates only its shard's parameters: for a
bucket it sets those parameters' ``.grad``, calls ``optimizer.step()`` and clears them (torch's
optimizers skip parameters without a gradient and keep per-parameter state, so per-bucket steps equal
one whole-model step; see :mod:`repro.runtime.dear`, which relies on the same property).

- **BSP** and OSP's stages: a bucket's update waits for all N gradients of the step; they are summed in
  worker order (deterministic) and divided by N, then every worker gets the same updated values.
- **ASP**: each worker's gradient is applied on its own as soon as it arrives, scaled by 1/N (one round
  of N gradients is one BSP step in expectation); the worker gets the values right after.
- **SSP(s)**: ASP, except that the answer to worker w's step ``t`` waits until every worker's gradients
  of step ``t - s`` are applied (so w starts iteration ``t + 1`` at most ``s`` iterations ahead of the
  slowest). Every answer is recorded (``server_clocks`` table: iteration, the slowest worker's clock).

**Worker** (:class:`PSExecutor`; ``ExecutorOptions.group`` must be the workers' own process group).
``after_backward`` pushes every bucket (asynchronously: ``isend``)
and posts its pulls (``irecv``); the wrapped optimizer's ``step()`` waits for the stage-1 pulls and
copies them into the parameters. Stage-2 (OSP) pulls of step ``t`` are waited for only in
``before_forward`` of step ``t + 2``, so their traffic overlaps iteration ``t + 1``, whose stage-2
parameters are therefore one step stale. **LGP**: with ``lgp`` on, ``before_forward`` of step ``t + 1``
first installs the freshest aggregated stage-2 values (those of step ``t - 1``, if any) and then
corrects them with this worker's own stage-2 gradient of step ``t``: ``w <- w - lr * g_local`` (``lr``
of the wrapped optimizer's first group), an estimate of the update still in flight; stage-1
parameters are never touched. ``flush()`` waits for everything, installs the last aggregated values
(no correction); under ASP/SSP the workers then meet at a barrier and fetch the servers' values, so
that every worker holds the servers' model; then the first worker's buffers (e.g. BatchNorm statistics,
which a PS does not synchronise) are broadcast to the workers. ``remove()`` flushes and stops the
worker's server threads.

**Co-located servers.** Built with ``ExecutorOptions.group`` None (the whole job trains, which is
what :func:`repro.distribute` does), ``PSExecutor(...)`` is a
:class:`repro.runtime.ps_colocated.ColocatedPSExecutor`: every rank trains and serves the plan's
shard with its index, over collectives issued from the training thread in plan order (the same math;
that module's docstring). That path is the one for NCCL.

**Devices.** Headers, gradients, parameters and the calibration's ping-pong buffers all live on the
parameters' device (headers: int64 there). The dedicated servers still serve each worker from a
thread of its own, point to point on one communicator, which NCCL does not support (several threads
issuing point-to-point on one communicator, in an order that depends on arrival): on the nccl
backend they refuse to start, in one line; use the co-located servers, or gloo.

:func:`calibrate` (the family's calibration hook) times ping-pongs of n bytes between server 0 and the
first worker on the live job and fits ``push`` = ``pull`` = half the round trip (a symmetric link).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from repro.plan import Plan, PlanError
from repro.runtime.executor import Executor, ExecutorOptions
from repro.runtime.ps_layout import (HandOverOptimizer, PSTiming, _Bucket, _flatten_into, _unflatten_from,
                                     ps_layout)

__all__ = ["PSExecutor", "PSOptimizer", "PSPeerSilentError", "PSTiming", "serve", "calibrate", "ps_layout", "STEP", "FETCH",
           "STOP"]

STEP, FETCH, STOP = 0, 1, 2
_HEADER_TAG = 0


def _header(kind: int, step: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A ``[kind, step]`` header, int64 on ``device`` (the data's device, so a backend that moves
    device tensors only can carry it)."""
    return torch.tensor([kind, step], dtype=torch.int64, device=device)


def _refuse_nccl(who: str) -> None:
    if dist.get_backend() == "nccl":
        raise ValueError(f"{who}: dedicated parameter servers serve each worker from its own thread, point to point on "
                         "one communicator, which NCCL does not support; use co-located servers (repro.distribute) "
                         "or the gloo backend")


class PSPeerSilentError(RuntimeError):
    """A peer sent nothing within the process-group timeout. Worded so that the launcher reports it
    first (it names the silent rank), ahead of the communication errors it causes elsewhere."""


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


# ---------------------------------------------------------------------------------------------
# Worker
# ---------------------------------------------------------------------------------------------

class PSOptimizer(HandOverOptimizer):
    """What the training loop steps on a PS worker: ``step()`` installs the stage-1 values pulled from
    the servers (the servers applied the optimizer); ``zero_grad`` passes through."""

    def __init__(self, executor: "PSExecutor", optimizer: Any) -> None:
        super().__init__(executor, optimizer, executor._install_stage_one)


class PSExecutor(Executor):
    """A PS worker (module docstring). Built on ranks ``servers..world-1`` with a ``"ps"`` plan and the
    workers' group; with no group (the whole job trains) it is a
    :class:`~repro.runtime.ps_colocated.ColocatedPSExecutor` instead (servers co-located)."""

    def __new__(cls, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None,
                *args: Any, **kwargs: Any):
        if cls is PSExecutor and (options is None or options.group is None):
            from repro.runtime.ps_colocated import ColocatedPSExecutor

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
        self._push = [torch.zeros(b.numel, device=dev) for b in self.buckets]
        self._pull = [[torch.zeros(b.numel, device=dev) for b in self.buckets] for _ in range(2)]  # by step parity
        self._sends: list[Any] = []
        self._stage1: list[tuple[_Bucket, Any, torch.Tensor]] = []
        self._stage2: dict[int, list[tuple[_Bucket, Any, torch.Tensor]]] = {}   # step -> pending pulls
        self._local2: list[tuple[_Bucket, torch.Tensor]] = []                  # LGP: last stage-2 gradients
        self._stopped = False
        self.bytes_pushed = 0
        self.bytes_pulled = 0

    # ---- the executor contract ----
    def wrap_optimizer(self, optimizer: Any) -> PSOptimizer:
        self._optimizer = optimizer
        return PSOptimizer(self, optimizer)

    def before_forward(self) -> None:
        t = self.step_index
        pending = self._stage2.pop(t - 2, None)       # stage 2 of step t-2: the freshest aggregated values
        if pending:
            self._install(pending)
        if self.lgp and self._local2:
            lr = float(self._optimizer.param_groups[0]["lr"])
            with torch.no_grad():
                for bucket, grad in self._local2:
                    off = 0
                    for p in bucket.params:
                        n = p.numel()
                        p.add_(grad[off:off + n].view_as(p), alpha=-lr)
                        off += n
            self._local2 = []

    def after_backward(self) -> None:
        t = self.step_index
        for w in self._sends:            # the push buffers are reused: last step's sends must be done
            _wait(w, f"worker rank {self.rank}", "a server")
        self._sends = []
        for s in range(self.servers):
            self._sends.append(dist.isend(_header(STEP, t, self.device), dst=s, tag=_HEADER_TAG))
        parity = t % 2
        self._stage1 = []
        local2 = []
        timings = []
        for b in self.buckets:
            buf = self._push[b.index]
            if self.options.record_timeline:
                timings.append(PSTiming(b.index, b.stage, b.server, buf.numel() * buf.element_size(),
                                        time.perf_counter()))
            _flatten_into(buf, [p.grad if p.grad is not None else torch.zeros_like(p) for p in b.params])
            self._sends.append(dist.isend(buf, dst=b.server, tag=1 + b.index))
            recv = self._pull[parity][b.index]
            handle = dist.irecv(recv, src=b.server, tag=1 + b.index)
            self.bytes_pushed += buf.numel() * buf.element_size()
            self.bytes_pulled += recv.numel() * recv.element_size()
            if b.stage == 1:
                self._stage1.append((b, handle, recv))
            else:
                self._stage2.setdefault(t, []).append((b, handle, recv))
                if self.lgp:
                    local2.append((b, buf))   # read (not written) while it is sent
        self._local2 = local2
        if self.options.record_timeline:
            self.timings = timings

    def _install(self, pending) -> None:
        for bucket, handle, buf in pending:
            _wait(handle, f"worker rank {self.rank}", f"server rank {bucket.server} (bucket {bucket.index})")
            _unflatten_from(buf, bucket.params)
            for t in self.timings:
                if t.bucket == bucket.index and t.end_s is None and bucket.stage == 1:
                    t.end_s = time.perf_counter()

    def _install_stage_one(self) -> None:
        self._install(self._stage1)
        self._stage1 = []
        self.step_index += 1

    def flush(self) -> None:
        """Wait for every pull, install the last aggregated values; ASP/SSP: barrier, then fetch."""
        if self._stopped:
            return
        self._install(self._stage1)
        self._stage1 = []
        for t in sorted(self._stage2):
            self._install(self._stage2.pop(t))
        self._local2 = []
        for w in self._sends:
            _wait(w, f"worker rank {self.rank}", "a server")
        self._sends = []
        if self.mode in ("asp", "ssp"):
            dist.barrier(group=self.group)
            self._fetch()
        self._broadcast_buffers()

    def _fetch(self) -> None:
        sends = [dist.isend(_header(FETCH, self.step_index, self.device), dst=s, tag=_HEADER_TAG)
                 for s in range(self.servers)]
        pending = [(b, dist.irecv(self._pull[0][b.index], src=b.server, tag=1 + b.index), self._pull[0][b.index])
                   for b in self.buckets]
        self._install(pending)
        for w in sends:
            _wait(w, f"worker rank {self.rank}", "a server")

    def _broadcast_buffers(self) -> None:
        buffers = [b for b in self.model.buffers() if b.is_floating_point() or b.dtype == torch.int64]
        first = self.servers
        for buf in buffers:
            dist.broadcast(buf, src=first, group=self.group)

    def remove(self) -> None:
        if self._stopped:
            return
        self.flush()
        sends = [dist.isend(_header(STOP, self.step_index, self.device), dst=s, tag=_HEADER_TAG)
                 for s in range(self.servers)]
        for w in sends:
            _wait(w, f"worker rank {self.rank}", "a server")
        self._stopped = True


# ---------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------

class _PeerFailed(RuntimeError):
    """Raised in a server thread that stops because another one failed (that one's error is reported)."""


class _Aggregate:
    """The N gradients of one (bucket, step), summed in worker order once all have arrived."""

    def __init__(self, workers: int) -> None:
        self.slots: list[torch.Tensor | None] = [None] * workers
        self.count = 0
        self.result: torch.Tensor | None = None


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
        # Buffers allocated once (fresh large allocations page-fault on every step): the sum of a
        # bucket's N gradients; its aggregated values by step parity (the pulls of step t are sent
        # while step t+1 aggregates; step t+2 starts only once every thread has seen them out); and
        # one snapshot per (worker thread, bucket) for ASP/SSP/FETCH answers, reused once sent.
        def zeros(b: _Bucket) -> torch.Tensor:
            return torch.zeros(b.numel, device=b.params[0].device)

        self._sum = {b.index: zeros(b) for b in self.buckets}
        self._result = {b.index: [zeros(b), zeros(b)] for b in self.buckets}
        self._own = [{b.index: zeros(b) for b in self.buckets} for _ in range(workers)]

    # ---- optimizer on one bucket ----
    def _apply(self, bucket: _Bucket, grad: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """Set the bucket's gradients to views of ``grad`` (which the optimizer may change: it is not
        used afterwards), step, clear; with ``out``, copy the bucket's new values into it."""
        with self.update_lock:
            off = 0
            for p in bucket.params:
                n = p.numel()
                p.grad = grad[off:off + n].view_as(p)
                off += n
            self.optimizer.step()
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

    def _sync_contribute(self, bucket: _Bucket, step: int, worker: int, grad: torch.Tensor) -> None:
        key = (bucket.index, step)
        last = False
        with self.cond:
            agg = self.aggregates.setdefault(key, _Aggregate(self.workers))
            agg.slots[worker] = grad
            agg.count += 1
            last = agg.count == self.workers
        if last:
            total = self._sum[bucket.index]
            total.copy_(agg.slots[0])
            for g in agg.slots[1:]:
                total.add_(g)
            total.div_(self.workers)
            result = self._apply(bucket, total, self._result[bucket.index][step % 2])
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

    # ---- one thread per worker ----
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

    def _loop(self, worker: int) -> None:
        src = self.servers + worker
        header = torch.zeros(2, dtype=torch.int64, device=self.device)
        recv = {b.index: torch.zeros(b.numel, device=b.params[0].device) for b in self.buckets}
        own = self._own[worker]
        while True:
            dist.irecv(header, src=src, tag=_HEADER_TAG).wait()
            kind, step = int(header[0]), int(header[1])
            if kind == STOP:
                return
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
                        self._sync_contribute(b, step, worker, recv[b.index])  # re-posted only next step
                    for b, _ in mine:
                        out = self._sync_result(b, step)
                        replies.append(dist.isend(out, dst=src, tag=1 + b.index))
            elif self.mode == "asp":
                for b, h in handles:
                    h.wait()
                    out = self._apply(b, recv[b.index].div_(self.workers), own[b.index])
                    replies.append(dist.isend(out, dst=src, tag=1 + b.index))
            else:  # ssp
                for b, h in handles:
                    h.wait()
                    self._apply(b, recv[b.index].div_(self.workers))
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


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------

def calibrate(trace, device, repeats: int, network_cost=None, servers: int = 1, **_options):
    """The PS family's calibration hook: the ``push``/``pull`` lines of a ``--network`` preset, else
    fitted from ping-pongs of n bytes (a buffer on ``device``) between rank 0 (a server) and a worker,
    4 KiB up to the model's bytes (at most 64 MiB): push = pull = half the median round trip. Every rank
    of the job calls it and gets the same model. Dedicated servers (``servers`` < world size, as
    ``repro train`` runs them): the worker is rank ``servers``, for N = world - servers workers.
    Co-located servers (:func:`repro.distribute`), recognised by ``servers`` >= world size (its
    default) or by fewer than 2 ranks left to be dedicated workers (a dedicated job has at least 2):
    the worker is rank 1 (or ``servers``), for N = world workers. (Co-located with fewer servers than
    ranks and at least 2 ranks besides them is fitted as the dedicated case: the same link, but
    N = world - servers.)"""
    from repro.cost import CostModel, fit_linear
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
