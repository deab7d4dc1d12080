"""Reduce-scatter and all-gather that cost half an all-reduce each, on a FIFO communication stream.

DeAR splits each all-reduce into a reduce-scatter (RS, in backward) and an all-gather (AG, in the next
forward). On gloo (CPU), torch's ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` are slower than
an all-reduce (gloo emulates RS with one), so here they are built as ring algorithms over point-to-point
messages.

:class:`CommStream` runs collectives asynchronously, one at a time, in submission order, on a background
thread with a process group of its own; each call returns a :class:`Handle`.

Buffers are flat views: a buffer of ``n`` elements on a group of ``P`` ranks is ``P`` shards of
``n/P`` elements; shard ``r`` (elements ``[r*n/P, (r+1)*n/P)``) belongs to rank ``r`` (rank within the
stream's group). ``n`` must be divisible by ``P`` (pad it).

Costs, in the usual alpha-beta model (alpha: seconds per message, beta: seconds per byte, ``n`` the
buffer's size in bytes):

- ring reduce-scatter: ``P-1`` steps, each rank sends one shard (``n/P`` bytes) to rank+1 and receives
  one from rank-1, which it adds into its copy: ``(P-1)*alpha + (P-1)/P * n * beta`` (+ the adds);
- ring all-gather: the same ``P-1`` steps without the adds: ``(P-1)*alpha + (P-1)/P * n * beta``;
- all-reduce = RS + AG: ``2(P-1)*alpha + 2(P-1)/P * n * beta``.

For ``P = 2`` each is a single exchange of halves between the two ranks.

NCCL: native ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` / ``all_reduce`` on a side CUDA
stream (docs/gpu_report.md says where that has run).
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

# torch 2.14 renamed reduce_scatter_tensor / all_gather_into_tensor (the old names warn); same semantics.
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

# Each ring step's shard is sent as chunks of at most this many bytes, so that the receiver can add
# chunk k while chunk k+1 is still on the wire (reduce-scatter); all chunks of a step are in flight at once.
_CHUNK_BYTES = 1 << 20


class Handle:
    """One collective submitted to a :class:`CommStream`.

    ``op`` (``"reduce_scatter"``, ``"all_gather"``, ``"all_reduce"``), ``nbytes`` (the buffer's size in
    bytes), ``submit_s`` / ``start_s`` / ``end_s``: ``time.perf_counter()`` stamps (seconds) of when the op
    was submitted, started on the stream and finished there (None until then). A failed op has
    ``end_s`` set too (when it failed).

    On a CUDA stream (NCCL) the op is asynchronous on the device: ``event`` is a CUDA event recorded on
    the stream's side stream right after the op (None on a CPU stream), set before
    :meth:`wait_enqueued` returns; a consumer on another CUDA stream orders itself after the op with
    ``torch.cuda.current_stream().wait_event(handle.event)`` instead of blocking the host
    (:class:`repro.runtime.clock.StreamWaits`). ``end_s`` is then the host time at which a watcher
    thread saw that event complete.
    """

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
        """Block until the op has finished; then the buffer holds its result.

        A failure on the stream (a peer that died or did not show up within the stream's timeout, a
        gloo error) is re-raised here as a RuntimeError naming the op. ``timeout_s`` (seconds, None: no
        limit beyond the stream's own timeout) raises TimeoutError if the op is still running then.
        """
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
    """The default group's timeout (what init_process_group was given), or None when it cannot be read."""
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
    thread waiting for the GIL gets it back quickly while the main thread runs Python (see
    :class:`CommStream`, "The GIL"). Returns a function (idempotent) that gives the interval found by
    the first user back once every user has called its own."""
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

    ``CommStream(group=None, backend_impl="auto", timeout_s=None)``

    - ``group``: the ranks to communicate among (None: every rank). The stream creates a process group of
      its own over them (``dist.new_group``), so its traffic never mixes with the main thread's
      collectives. ``new_group`` is collective over the default group: every rank must construct its
      CommStreams at the same point of the program, in the same order relative to every other
      ``new_group`` call.
    - ``backend_impl``: ``"ring"`` (ring RS / AG over point-to-point messages; gloo, CPU tensors),
      ``"native"`` (torch's ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` / ``all_reduce``),
      ``"auto"`` (ring for RS/AG on gloo, native otherwise; all_reduce native). Shard ``r`` belongs to the
      rank whose rank in the stream's group is ``r`` (``self.rank``).
    - ``timeout_s``: bound (seconds) on every message of the stream's group: a peer that dies or never
      submits the matching op makes ``wait()`` raise within about this long. None: the default group's
      timeout.

    Every rank must submit the same ops (kind, numel, dtype) in the same order; the stream matches them by
    position. After a failure the stream is broken: the failing op's ``wait()`` raises, ops queued behind
    it fail too, and later submissions raise RuntimeError at once.

    The stream is a Python thread and needs the GIL between its point-to-point calls; while the main thread
    runs Python code it waits up to ``sys.getswitchinterval()`` for each re-acquisition, so an executor that
    overlaps the stream with Python-heavy work should lower the switch interval (process-wide;
    :func:`lower_switch_interval`, which the DeAR executor uses).

    ``close()`` (idempotent; also on leaving ``with CommStream(...) as s:``) lets queued ops finish and joins
    the thread. On NCCL the ops run natively on a side CUDA stream that first waits for the submitting
    thread's current stream; an event recorded after each op (``Handle.event``) is waited for by a watcher
    thread: ``wait()`` returns once the device has finished the op, ``wait_enqueued()`` once it is on the
    side stream.
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
        # CUDA: the stream thread only enqueues (it never waits for the device, so it can enqueue the
        # next op at once); this thread waits for each op's event, in order, and finishes its handle.
        # It issues no collective: the stream thread stays the only user of the group.
        self._watch_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._watcher = None
        if self._cuda_stream is not None:
            self._watcher = threading.Thread(target=self._watch, name=f"CommStream-watch-rank{self.rank}",
                                             daemon=True)
            self._watcher.start()
        self._thread.start()

    # ----------------------------------------------------------------------------------------------
    # public ops
    # ----------------------------------------------------------------------------------------------

    def reduce_scatter(self, buffer: torch.Tensor) -> Handle:
        """Sum-reduce-scatter ``buffer`` in place (async).

        After ``wait()``, shard ``r`` of ``buffer`` on rank ``r`` holds the sum over ranks of that shard;
        the other shards' contents are unspecified (the ring leaves partial sums there). Cost:
        ``(P-1)*alpha + (P-1)/P * n * beta`` for a buffer of ``n`` bytes.
        """
        flat = self._check("reduce_scatter", buffer)
        fn = self._ring_reduce_scatter if self._ring else self._native_reduce_scatter
        return self._submit("reduce_scatter", flat, fn)

    def all_gather(self, buffer: torch.Tensor) -> Handle:
        """All-gather ``buffer`` in place (async).

        Before: shard ``r`` on rank ``r`` holds rank ``r``'s data (other shards are ignored). After
        ``wait()``: every shard holds its owner's data on every rank. Cost:
        ``(P-1)*alpha + (P-1)/P * n * beta`` for a buffer of ``n`` bytes.
        """
        flat = self._check("all_gather", buffer)
        fn = self._ring_all_gather if self._ring else self._native_all_gather
        return self._submit("all_gather", flat, fn)

    def all_reduce(self, buffer: torch.Tensor) -> Handle:
        """Sum-all-reduce ``buffer`` in place (async), for baselines on the same stream.

        ``backend_impl="ring"``: ring RS then ring AG (``numel`` divisible by P). Otherwise native
        ``all_reduce`` on the stream's group (any numel): gloo's own ring all-reduce is at least as fast as
        RS+AG (``benchmarks/bench_primitives.py`` measures both).
        """
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
        """Overwrite ``buffer`` on every rank with rank ``src``'s (``src``: rank in the stream's group),
        async, native ``broadcast`` on the stream's group: so that a family issuing everything else on
        this stream keeps every collective of a step on one thread and in one order on every rank
        (e.g. DeAR's buffer broadcast before the forward, behind the all-gather in flight)."""
        flat = self._check("broadcast", buffer, divisible=False)
        if not 0 <= int(src) < self.world_size:
            raise ValueError(f"CommStream.broadcast: src must be a rank of the stream's group (0..{self.world_size - 1}), "
                             f"got {src}")
        group_src = int(src)

        def fn(buf):
            dist.broadcast(buf, group=self.group, group_src=group_src)
        return self._submit("broadcast", flat, fn)

    def close(self) -> None:
        """Let queued ops finish, then join the stream's thread (and the CUDA watcher). Idempotent;
        returns at once when idle."""
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

    # ----------------------------------------------------------------------------------------------
    # machinery
    # ----------------------------------------------------------------------------------------------

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
            if self._failure is not None:
                handle.start_s = time.perf_counter()
                handle._finish(RuntimeError(f"not run: an earlier op failed: {self._failure}"))
                continue
            handle.start_s = time.perf_counter()
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

    # -- ring (gloo, point-to-point) -----------------------------------------------------------------

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor, on_chunk=None) -> None:
        """Send ``send`` to rank+1 while receiving ``recv`` (same numel) from rank-1, in chunks.

        ``on_chunk(lo, hi)`` is called as soon as elements ``[lo, hi)`` of ``recv`` have arrived.
        """
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

    # -- native ----------------------------------------------------------------------------------------

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
