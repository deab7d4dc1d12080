"""Reduce-scatter and all-gather costing half an all-reduce each, on a FIFO communication stream.

:class:`CommStream` runs collectives one at a time, in submission order, on a background thread with a
process group of its own; each call returns a :class:`Handle`. A buffer of ``n`` elements on ``P``
ranks is ``P`` shards of ``n/P`` (``n`` divisible by ``P``); shard ``r`` belongs to group rank ``r``.
On gloo, RS and AG are rings over point-to-point messages (gloo's native ones are slower than an
all-reduce), each ``(P-1)*alpha + (P-1)/P * n * beta``; on NCCL the native collectives run on a side
CUDA stream.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

__all__ = ["CommStream", "Handle", "BACKEND_IMPLS"]

BACKEND_IMPLS = ("auto", "ring", "native")

# torch 2.14 renamed these (the old names warn); same semantics.
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

# Each ring step's shard is sent as chunks of at most this many bytes, so that the receiver can add
# chunk k while chunk k+1 is still on the wire (reduce-scatter); all chunks of a step are in flight at once.
_CHUNK_BYTES = 1 << 20


class Handle:
    """One collective submitted to a :class:`CommStream`: ``op``, ``nbytes`` (the buffer's bytes) and
    ``perf_counter`` seconds ``submit_s`` / ``start_s`` / ``end_s`` (None until then; a failed op has
    ``end_s`` too). On NCCL ``event`` is a CUDA event recorded after the op on the side stream, set before
    :meth:`wait_enqueued` returns (:class:`repro.runtime.clock.StreamWaits` waits on it); ``end_s`` is
    when a watcher thread saw it complete."""

    def __init__(self, op: str, nbytes: int):
        self.op = op
        self.nbytes = nbytes
        self.submit_s: float = time.perf_counter()
        self.start_s: float | None = None
        self.end_s: float | None = None
        self._done = threading.Event()
        self._enqueued = threading.Event()  # set once the op is on the device stream (or finished)
        self.event = None                   # CUDA: event recorded on the side stream after the op
        self._error: BaseException | None = None

    def is_completed(self) -> bool:
        """True once the op has finished (successfully or not); never blocks."""
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the op has finished (the buffer then holds its result). A failure on the stream
        is re-raised as a RuntimeError naming the op; TimeoutError after ``timeout_s`` seconds."""
        if not self._done.wait(timeout_s):
            raise TimeoutError(f"CommStream {self.op} of {self.nbytes} bytes not finished after {timeout_s} s")
        if self._error is not None:
            raise RuntimeError(f"CommStream {self.op} of {self.nbytes} bytes failed: "
                               f"{type(self._error).__name__}: {self._error}") from self._error

    def wait_enqueued(self, timeout_s: float | None = None) -> None:
        """Block until the op is enqueued on the device (CUDA: ``event`` is set) or has finished (CPU);
        a failure is re-raised as in :meth:`wait`. Returns at once after :meth:`wait`."""
        if not self._enqueued.wait(timeout_s):
            raise TimeoutError(f"CommStream {self.op} of {self.nbytes} bytes not enqueued after {timeout_s} s")
        if self._error is not None:
            self.wait(0)

    def _finish(self, error: BaseException | None = None) -> None:
        self.end_s = time.perf_counter()
        self._error = error
        self._done.set()
        self._enqueued.set()

    def __repr__(self) -> str:
        state = "failed" if self._error else ("done" if self.is_completed() else "pending")
        return f"Handle({self.op}, {self.nbytes} bytes, {state})"


def _default_timeout() -> timedelta | None:
    """The default group's timeout, or None when it cannot be read."""
    try:
        pg = dist.distributed_c10d._get_default_group()
        backend = pg._get_backend(torch.device("cpu") if dist.get_backend(pg) != "nccl" else torch.device("cuda"))
        timeout = backend.options._timeout
        return timeout if isinstance(timeout, timedelta) else None
    except Exception:  # private API; fall back to torch's default for new groups
        return None


_SWITCH_LOCK = threading.Lock()
_SWITCH = {"users": 0, "saved_s": 0.0}


def lower_switch_interval(interval_s: float = 1e-4) -> Callable[[], None]:
    """Lower the interpreter's thread switch interval to at most ``interval_s`` seconds, so a stream
    thread gets the GIL back quickly while the main thread runs Python. Returns an idempotent function
    that restores the first user's interval once every user has called its own."""
    with _SWITCH_LOCK:
        if _SWITCH["users"] == 0:
            _SWITCH["saved_s"] = sys.getswitchinterval()
        _SWITCH["users"] += 1
        sys.setswitchinterval(min(sys.getswitchinterval(), interval_s))
    done = False

    def restore() -> None:
        nonlocal done
        with _SWITCH_LOCK:
            if done:
                return
            done = True
            _SWITCH["users"] -= 1
            if _SWITCH["users"] == 0:
                sys.setswitchinterval(_SWITCH["saved_s"])

    return restore


class CommStream:
    """A FIFO communication stream: collectives run one at a time, in submission order, off the main thread.

    - ``group``: the ranks to communicate among (None: every rank). The stream makes a process group of
      its own (``dist.new_group``, collective over the default group: every rank constructs its streams
      at the same point, in the same order relative to other ``new_group`` calls).
    - ``backend_impl``: ``"ring"`` (gloo, CPU tensors), ``"native"`` (torch's collectives) or ``"auto"``
      (ring for RS/AG on gloo, native otherwise; all_reduce native).
    - ``timeout_s``: bound in seconds on every message (None: the default group's timeout).

    Every rank must submit the same ops (kind, numel, dtype) in the same order. After a failure the
    stream is broken: the op's ``wait()`` raises, queued ops fail too, later submissions raise
    RuntimeError. The thread needs the GIL between point-to-point calls, so an executor overlapping it
    with Python-heavy work lowers the switch interval (:func:`lower_switch_interval`). ``close()``
    (idempotent; also on leaving ``with``) lets queued ops finish and joins the thread.
    """

    def __init__(self, group=None, backend_impl: str = "auto", timeout_s: float | None = None):
        if backend_impl not in BACKEND_IMPLS:
            raise ValueError(f"backend_impl must be one of {BACKEND_IMPLS}, got {backend_impl!r}")
        if not dist.is_initialized():
            raise RuntimeError("CommStream needs torch.distributed to be initialized (init_process_group)")
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else _default_timeout()
        self.group = dist.new_group(ranks, timeout=timeout)
        self.backend = dist.get_backend(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        if backend_impl == "ring" and self.backend != "gloo":
            raise ValueError(f"backend_impl='ring' needs the gloo backend, the stream's group uses {self.backend!r}")
        self.backend_impl = backend_impl
        self._ring = backend_impl == "ring" or (backend_impl == "auto" and self.backend == "gloo")
        self._cuda_stream = torch.cuda.Stream() if self.backend == "nccl" else None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._failure: str | None = None
        self._scratch: dict[torch.dtype, torch.Tensor] = {}  # the stream thread's receive buffers (ring RS)
        self._thread = threading.Thread(target=self._run, name=f"CommStream-rank{self.rank}", daemon=True)
        # CUDA: the stream thread only enqueues; this one waits for each op's event, in order, and
        # finishes its handle. It issues no collective: the stream thread stays the group's only user.
        self._watch_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._watcher = None
        if self._cuda_stream is not None:
            self._watcher = threading.Thread(target=self._watch, name=f"CommStream-watch-rank{self.rank}",
                                             daemon=True)
            self._watcher.start()
        self._thread.start()

    def reduce_scatter(self, buffer: torch.Tensor) -> Handle:
        """Sum-reduce-scatter ``buffer`` in place (async): after ``wait()`` shard ``r`` on rank ``r`` holds
        the sum over ranks; the other shards are unspecified."""
        flat = self._check("reduce_scatter", buffer)
        fn = self._ring_reduce_scatter if self._ring else self._native_reduce_scatter
        return self._submit("reduce_scatter", flat, fn)

    def all_gather(self, buffer: torch.Tensor) -> Handle:
        """All-gather ``buffer`` in place (async): shard ``r`` of rank ``r`` reaches every rank."""
        flat = self._check("all_gather", buffer)
        fn = self._ring_all_gather if self._ring else self._native_all_gather
        return self._submit("all_gather", flat, fn)

    def all_reduce(self, buffer: torch.Tensor) -> Handle:
        """Sum-all-reduce ``buffer`` in place (async): ring RS then AG with ``backend_impl="ring"`` (numel
        divisible by P), else the native all-reduce (any numel; gloo's is at least as fast as RS+AG)."""
        if self.backend_impl == "ring":
            flat = self._check("all_reduce", buffer)

            def fn(buf):
                self._ring_reduce_scatter(buf)
                self._ring_all_gather(buf)
        else:
            flat = self._check("all_reduce", buffer, divisible=False)
            fn = self._native_all_reduce
        return self._submit("all_reduce", flat, fn)

    def broadcast(self, buffer: torch.Tensor, src: int = 0) -> Handle:
        """Overwrite ``buffer`` with group rank ``src``'s (async), on this stream so that a family keeps
        every collective of a step on one thread and in one order on every rank."""
        flat = self._check("broadcast", buffer, divisible=False)
        if not 0 <= int(src) < self.world_size:
            raise ValueError(f"CommStream.broadcast: src must be a rank of the stream's group (0..{self.world_size - 1}), "
                             f"got {src}")
        group_src = int(src)

        def fn(buf):
            dist.broadcast(buf, group=self.group, group_src=group_src)
        return self._submit("broadcast", flat, fn)

    def close(self) -> None:
        """Let queued ops finish, then join the threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()
        if self._watcher is not None:
            self._watch_queue.put(None)
            self._watcher.join()
        self._scratch.clear()

    def __enter__(self) -> "CommStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        impl = "ring" if self._ring else "native"
        return f"CommStream(rank {self.rank} of {self.world_size}, {self.backend}, {impl})"

    def _check(self, op: str, buffer, divisible: bool = True) -> torch.Tensor:
        if not isinstance(buffer, torch.Tensor):
            raise TypeError(f"CommStream.{op}: buffer must be a torch.Tensor, got {type(buffer).__name__}")
        if not buffer.is_contiguous():
            raise ValueError(f"CommStream.{op}: buffer must be contiguous (got shape {tuple(buffer.shape)}, "
                             f"strides {buffer.stride()}); pass a flat contiguous tensor")
        if divisible and buffer.numel() % self.world_size:
            raise ValueError(f"CommStream.{op}: buffer numel {buffer.numel()} is not divisible by the world "
                             f"size {self.world_size}; pad it to a multiple of {self.world_size}")
        if self._ring and buffer.device.type != "cpu":
            raise ValueError(f"CommStream.{op}: the ring implementation (gloo) needs a CPU tensor, "
                             f"got one on {buffer.device}")
        return buffer.view(-1)

    def _submit(self, op: str, flat: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> Handle:
        handle = Handle(op, flat.numel() * flat.element_size())
        ready = None
        if self._cuda_stream is not None:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(flat.device))
            flat.record_stream(self._cuda_stream)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"CommStream.{op}: the stream is closed")
            if self._failure is not None:
                raise RuntimeError(f"CommStream.{op}: the stream is broken by an earlier failure: {self._failure}")
            self._queue.put((handle, flat, fn, ready))
        return handle

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, flat, fn, ready = item
            handle.start_s = time.perf_counter()
            if self._failure is not None:
                handle._finish(RuntimeError(f"not run: an earlier op failed: {self._failure}"))
                continue
            try:
                if self._cuda_stream is not None:
                    with torch.cuda.device(flat.device), torch.cuda.stream(self._cuda_stream):
                        self._cuda_stream.wait_event(ready)
                        fn(flat)
                        done = torch.cuda.Event()
                        done.record(self._cuda_stream)
                    handle.event = done
                    handle._enqueued.set()
                    self._watch_queue.put((handle, done))
                    continue
                if flat.numel():
                    fn(flat)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                self._settle(handle, e)
            else:
                self._settle(handle, None)

    def _settle(self, handle: Handle, error: BaseException | None) -> None:
        """Finish ``handle``; a failure also breaks the stream (later ops are not run, their waiters told)."""
        if error is not None:
            with self._lock:
                self._failure = f"{handle.op} of {handle.nbytes} bytes: {type(error).__name__}: {error}"
        handle._finish(error)

    def _watch(self) -> None:
        """CUDA: finish each handle when the device has run its op (events in submission order)."""
        while True:
            item = self._watch_queue.get()
            if item is None:
                return
            handle, done = item
            try:
                done.synchronize()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                self._settle(handle, e)
            else:
                self._settle(handle, None)

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor, on_chunk=None) -> None:
        """Send ``send`` to rank+1 while receiving ``recv`` from rank-1, in chunks; ``on_chunk(lo, hi)``
        runs as soon as ``recv[lo:hi]`` has arrived."""
        P, r = self.world_size, self.rank
        n = send.numel()
        step = max(1, _CHUNK_BYTES // send.element_size())
        bounds = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
        recvs = [dist.irecv(recv[lo:hi], group=self.group, group_src=(r - 1) % P, tag=i)
                 for i, (lo, hi) in enumerate(bounds)]
        sends = [dist.isend(send[lo:hi], group=self.group, group_dst=(r + 1) % P, tag=i)
                 for i, (lo, hi) in enumerate(bounds)]
        for work, (lo, hi) in zip(recvs, bounds):
            work.wait()
            if on_chunk is not None:
                on_chunk(lo, hi)
        for work in sends:
            work.wait()

    def _ring_reduce_scatter(self, flat: torch.Tensor) -> None:
        # At step s rank r sends shard (r-s-1) and receives shard (r-s-2), adding it into its copy; the
        # shard it receives at step s is the one it sends at step s+1, so after P-1 steps shard r holds
        # the contributions of all P ranks.
        P, r = self.world_size, self.rank
        shards = flat.chunk(P)
        tmp = self._scratch_like(shards[0])
        for s in range(P - 1):
            dst = shards[(r - s - 2) % P]
            self._exchange(shards[(r - s - 1) % P], tmp,
                           on_chunk=lambda lo, hi, dst=dst: dst[lo:hi].add_(tmp[lo:hi]))

    def _scratch_like(self, shard: torch.Tensor) -> torch.Tensor:
        """A receive buffer for one shard, reused across ops (a fresh 32 MB one costs ms of page faults)."""
        have = self._scratch.get(shard.dtype)
        if have is None or have.numel() < shard.numel():
            have = self._scratch[shard.dtype] = torch.empty_like(shard)
        return have[:shard.numel()]

    def _ring_all_gather(self, flat: torch.Tensor) -> None:
        # At step s rank r sends shard (r-s) (its own at s=0, then the one it just received) and
        # receives shard (r-s-1) straight into place.
        P, r = self.world_size, self.rank
        shards = flat.chunk(P)
        for s in range(P - 1):
            self._exchange(shards[(r - s) % P], shards[(r - s - 1) % P])

    def _native_reduce_scatter(self, flat: torch.Tensor) -> None:
        shard = flat.chunk(self.world_size)[self.rank]
        out = torch.empty_like(shard)  # output must not alias the input
        _reduce_scatter_tensor(out, flat, group=self.group)
        shard.copy_(out)

    def _native_all_gather(self, flat: torch.Tensor) -> None:
        shard = flat.chunk(self.world_size)[self.rank].clone()  # input must not alias the output
        _all_gather_into_tensor(flat, shard, group=self.group)

    def _native_all_reduce(self, flat: torch.Tensor) -> None:
        dist.all_reduce(flat, group=self.group)
