"""Clocks for gradient-ready times, and how consumers wait for and time collectives.

Every time is seconds on the host's ``time.perf_counter()`` base. On a CPU a hook's host time is when
the gradient was computed; on a GPU the host only enqueued the kernels, so :class:`DeviceClock` records
CUDA events and resolves them after the step against a reference event recorded on the idle device.
Likewise a ``Work`` that completes at enqueue (NCCL) is not a completion: :func:`waits_for`,
:class:`EventCompletions` and :class:`CollectiveEnds` wait for and stamp device work. Events, streams and
the host clock are injectable so the CPU tests drive the CUDA logic with fakes (docs/design/runtime.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Protocol

import torch
from torch import nn

__all__ = ["Clock", "HostClock", "DeviceClock", "ReadyTimes", "make_clock", "clock_for", "model_device",
           "HostWaits", "StreamWaits", "waits_for", "EventCompletions", "CollectiveEnds"]


class Clock(Protocol):
    """What an executor needs of a clock."""

    ready: "ReadyTimes"

    def mark(self, key: str, host_s: float | None = None) -> None: ...
    def resolve(self) -> dict[str, float]: ...
    def count(self) -> int: ...
    def has(self, key: object) -> bool: ...
    def now(self) -> float: ...
    def reset(self) -> None: ...
    def end_iteration(self) -> None: ...


class ReadyTimes(Mapping):
    """Read-only live view of a clock's marks (key -> seconds, host ``perf_counter`` base), resolved
    when read: ``dict(view)`` is a snapshot. ``len`` and ``in`` do not resolve (no device sync)."""

    def __init__(self, clock: "HostClock | DeviceClock") -> None:
        self._clock = clock

    def __getitem__(self, key: str) -> float:
        return self._clock.resolve()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._clock.resolve()))

    def __len__(self) -> int:
        return self._clock.count()

    def __contains__(self, key: object) -> bool:
        return self._clock.has(key)

    def clear(self) -> None:
        self._clock.reset()

    def __repr__(self) -> str:
        return f"ReadyTimes({dict(self)!r})"


class HostClock:
    """``time.perf_counter()`` at each mark (the CPU's clock)."""

    kind = "host"

    def __init__(self) -> None:
        self._times: dict[str, float] = {}
        self._ended = False  # the marks are the last iteration's: the next mark starts a new one
        self.ready = ReadyTimes(self)

    def mark(self, key: str, host_s: float | None = None) -> None:
        """``key`` is ready now (``host_s``: a ``perf_counter`` value the caller already took)."""
        if self._ended:
            self._ended = False
            self._times.clear()
        self._times[key] = time.perf_counter() if host_s is None else host_s

    def resolve(self) -> dict[str, float]:
        return self._times

    def count(self) -> int:
        return len(self._times)

    def has(self, key: object) -> bool:
        return key in self._times

    def now(self) -> float:
        return time.perf_counter()

    def reset(self) -> None:
        self._times.clear()
        self._ended = False

    def end_iteration(self) -> None:
        """The marks stay readable until the next mark, which starts a new iteration; an iteration
        without a mark leaves none, not the one before's."""
        if self._ended:
            self._times.clear()
        self._ended = True


def _cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


class DeviceClock:
    """CUDA events at each mark, resolved to host ``perf_counter`` seconds once per step when read: one
    device synchronize, then a reference event recorded on the idle device with host time ``h``; a mark
    is at ``h - elapsed(mark, reference)``. Events go on ``device``'s current stream (not the current
    device's). ``event_factory`` (``record(stream)``, ``synchronize()``, ``elapsed_time(other)`` in ms),
    ``current_stream``, ``synchronize`` and ``host_time`` are injectable (CPU tests)."""

    kind = "device"

    def __init__(self, device: torch.device | str | None = None, *, event_factory: Callable[[], Any] | None = None,
                 synchronize: Callable[[], None] | None = None, current_stream: Callable[[], Any] | None = None,
                 host_time: Callable[[], float] = time.perf_counter) -> None:
        self.device = torch.device(device if device is not None else "cuda")
        self._new_event = event_factory or _cuda_event
        self._stream = current_stream or (lambda: torch.cuda.current_stream(self.device))
        self._synchronize = synchronize or (lambda: torch.cuda.synchronize(self.device))
        self._host_time = host_time
        self._events: dict[str, Any] = {}     # key -> its event (one per key, re-recorded every step)
        self._live: dict[str, Any] = {}       # the keys marked in this (or the last ended) iteration
        self._ended = False
        self._reference: Any = None
        self._resolved: dict[str, float] | None = None
        self._lock = threading.Lock()          # marks come from autograd's threads
        self.resolutions = 0                   # how many times the events were read back (tests)
        self.ready = ReadyTimes(self)

    def mark(self, key: str, host_s: float | None = None) -> None:
        """Record ``key``'s event on the current stream (``host_s`` is ignored: the device decides)."""
        with self._lock:
            if self._ended:  # the first mark of a new iteration: the last one's keys are no longer live
                self._ended = False
                self._live.clear()
            ev = self._events.get(key)
            if ev is None:
                ev = self._events[key] = self._new_event()
            ev.record(self._stream())
            self._live[key] = ev
            self._resolved = None

    def resolve(self) -> dict[str, float]:
        """Every mark in host ``perf_counter`` seconds; reads the events back once after the last mark."""
        with self._lock:
            if self._resolved is not None:
                return self._resolved
            events = dict(self._live)
            if not events:
                self._resolved = {}
                return self._resolved
            self._synchronize()
            if self._reference is None:
                self._reference = self._new_event()
            ref = self._reference
            ref.record(self._stream())  # on an idle device: completes at once
            ref.synchronize()
            host = self._host_time()
            self._resolved = {k: host - ev.elapsed_time(ref) / 1e3 for k, ev in events.items()}
            self.resolutions += 1
            return self._resolved

    def count(self) -> int:
        return len(self._live)

    def has(self, key: object) -> bool:
        return key in self._live

    def now(self) -> float:
        """The host time once the device has done what was queued (a phase stamp on this base)."""
        self._synchronize()
        return self._host_time()

    def reset(self) -> None:
        with self._lock:
            self._live.clear()
            self._ended = False
            self._resolved = None

    def end_iteration(self) -> None:
        """As :meth:`HostClock.end_iteration` (the events are kept and re-recorded)."""
        with self._lock:
            if self._ended:
                self._live.clear()
                self._resolved = None
            self._ended = True


def make_clock(device: torch.device | str | None) -> HostClock | DeviceClock:
    """The clock for ``device``: :class:`DeviceClock` on CUDA, :class:`HostClock` otherwise."""
    device = torch.device(device if device is not None else "cpu")
    return DeviceClock(device) if device.type == "cuda" else HostClock()


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (CPU for a model without parameters)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def clock_for(model: nn.Module, clock: Any = None) -> Any:
    """``clock`` when given (an executor's ``options.clock``), else :func:`make_clock` for the model's device."""
    return clock if clock is not None else make_clock(model_device(model))


class HostWaits:
    """CPU: a consumer waits for a collective on the host (``work.wait()``: it has finished then)."""

    on_device = False

    def wait(self, work: Any) -> None:
        """``work``: anything with ``wait()`` (a :class:`~repro.runtime.collectives.Handle`, a chunk)."""
        work.wait()


class StreamWaits:
    """CUDA: a consumer orders its *current stream* after a collective, without blocking the host:
    ``wait(work)`` waits until ``work`` is enqueued (``work.wait_enqueued()``), then makes the current
    stream wait for ``work.event``. ``current_stream`` is injectable (tests)."""

    on_device = True

    def __init__(self, device: torch.device | str | None = None,
                 current_stream: Callable[[], Any] | None = None) -> None:
        self.device = torch.device(device if device is not None else "cuda")
        self._current_stream = current_stream or (lambda: torch.cuda.current_stream(self.device))

    def wait(self, work: Any) -> None:
        work.wait_enqueued()
        self._current_stream().wait_event(work.event)


def waits_for(device: torch.device | str | None) -> HostWaits | StreamWaits:
    """How consumers on ``device`` wait for collectives: :class:`StreamWaits` on CUDA, else :class:`HostWaits`."""
    device = torch.device(device if device is not None else "cpu")
    return StreamWaits(device) if device.type == "cuda" else HostWaits()


class EventCompletions:
    """``watch(event, done)``: a thread waits for the watched CUDA events in order (one communicator's work
    finishes in issue order) and calls ``done(end_s)``, the host-base seconds at which the device reached
    ``event`` (resolved against a reference event on an idle stream of its own, as :class:`DeviceClock`
    does, without synchronising the device). The thread issues no collective. A ``done`` or
    ``synchronize`` that raises is kept in ``error``, handed to ``on_error`` and stops the thread.
    ``event_factory``, ``stream_factory`` and ``host_time`` are injectable (CPU tests)."""

    def __init__(self, device: torch.device | str | None = None, *,
                 event_factory: Callable[[], Any] | None = None,
                 stream_factory: Callable[[], Any] | None = None,
                 host_time: Callable[[], float] = time.perf_counter, name: str = "event-completions",
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        import queue

        self.device = torch.device(device if device is not None else "cuda")
        self._new_event = event_factory or _cuda_event
        self._new_stream = stream_factory or (lambda: torch.cuda.Stream(self.device))
        self._host_time = host_time
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._stream: Any = None
        self._reference: Any = None
        self.error: BaseException | None = None
        self.on_error = on_error
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def watch(self, event: Any, done: Callable[[float], None]) -> None:
        """Call ``done(end_s)`` once ``event`` (and every event watched before it) has completed."""
        if self._closed:
            raise RuntimeError("EventCompletions.watch after close()")
        self._queue.put((event, done))

    def close(self) -> None:
        """Let every watched event complete (and its ``done`` run), then join the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def end_time(self, event: Any) -> float:
        """Host ``perf_counter`` seconds at which the device reached ``event`` (already completed)."""
        if self._reference is None:
            self._stream = self._new_stream()
            self._reference = self._new_event()
        ref = self._reference
        ref.record(self._stream)
        ref.synchronize()
        host = self._host_time()
        return host - event.elapsed_time(ref) / 1e3

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event, done = item
            try:
                event.synchronize()
                done(self.end_time(event))
            except BaseException as e:  # noqa: BLE001 - the owner reads it (or learns it through on_error)
                self.error = e
                if self.on_error is not None:
                    self.on_error(e)
                return


class CollectiveEnds:
    """Timeline stamps (host ``perf_counter`` base) of asynchronous collectives as the device saw them:
    ``launch(done)`` and ``end(work, done)`` each call ``done(seconds)`` once known.

    Host path (CPU, gloo): ``launch`` stamps now, ``end`` from the work's future callback. Device path
    (``device_events``; default: CUDA and nccl, whose ``Work`` completes at enqueue): events on the
    current stream (launch) and on a timing stream that waits for the collective (end), turned into
    times by an :class:`EventCompletions` thread; read a timeline after :meth:`settle`. The factories,
    streams and ``completions`` are injectable (CPU tests)."""

    def __init__(self, device: torch.device | str | None = None, backend: str | None = None, *,
                 device_events: bool | None = None, event_factory: Callable[[], Any] | None = None,
                 side_stream: Any = None, current_stream: Callable[[], Any] | None = None,
                 stream_context: Callable[[Any], Any] | None = None,
                 completions: "EventCompletions | None" = None) -> None:
        self.device = torch.device(device if device is not None else "cpu")
        if device_events is None:
            device_events = self.device.type == "cuda" and backend == "nccl"
        self.on_device = bool(device_events)
        self._new_event = event_factory or _cuda_event
        self._side = side_stream
        self._current_stream = current_stream or (lambda: torch.cuda.current_stream(self.device))
        self._stream_context = stream_context or torch.cuda.stream
        self._completions = completions
        self._pending = 0
        self._cond = threading.Condition()

    def _counted(self, done: Callable[[float], None]) -> Callable[[float], None]:
        with self._cond:
            self._pending += 1

        def once(t: float) -> None:
            try:
                done(t)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
        return once

    def _watch(self, event: Any, done: Callable[[float], None]) -> None:
        if self._completions is None:
            self._completions = EventCompletions(self.device, event_factory=self._new_event,
                                                 name="collective-ends")
        self._completions.watch(event, done)

    def launch(self, done: Callable[[float], None]) -> None:
        """``done(when the device reached this point of the current stream)``; the host time now off a GPU."""
        if not self.on_device:
            done(time.perf_counter())
            return
        event = self._new_event()
        event.record(self._current_stream())
        self._watch(event, self._counted(done))

    def end(self, work: Any, done: Callable[[float], None]) -> None:
        """``done(when the collective of ``work`` finished)``."""
        done = self._counted(done)
        if not self.on_device:
            work.get_future().then(lambda _f: done(time.perf_counter()))
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        with self._stream_context(self._side):
            work.wait()  # NCCL: this timing stream waits for the collective's stream; the host does not
            event = self._new_event()
            event.record(self._side)
        self._watch(event, done)

    def settle(self, timeout_s: float = 60.0) -> None:
        """Wait until every stamp asked for has been delivered (``timeout_s``: at most, seconds)."""
        with self._cond:
            broken = lambda: self._completions is not None and self._completions.error is not None  # noqa: E731
            if not self._cond.wait_for(lambda: self._pending == 0 or broken(), timeout=timeout_s):
                raise TimeoutError(f"{self._pending} collective timeline stamp(s) still missing after {timeout_s:g} s")
        if self._completions is not None and self._completions.error is not None:
            raise RuntimeError(f"timing a collective failed: {self._completions.error}")

    def close(self) -> None:
        """Let the stamps in flight arrive, then stop the thread (if one was started). Idempotent."""
        if self._completions is not None:
            self._completions.close()
