"""Record one training iteration's events (forward ends, gradient-ready times) and attribute them to layers.

Shared by the profiler (CPU timers or CUDA events) and the roofline estimator (a virtual clock on the meta
device), so measured and estimated traces follow one convention (:mod:`repro.workload.profile`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import nn

from repro.workload.layers import Param, unit_name

__all__ = ["Clock", "CpuClock", "CudaClock", "RawIteration", "IterationTimeline", "Recorder", "resolve",
           "attribute"]


class Clock(Protocol):
    """``stamp()`` returns a marker; ``elapsed(a, b)`` gives seconds from marker ``a`` to ``b``."""

    def stamp(self) -> Any: ...
    def sync(self) -> None: ...
    def elapsed(self, a: Any, b: Any) -> float: ...


class CpuClock:
    def stamp(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def elapsed(self, a: float, b: float) -> float:
        return b - a


class CudaClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def stamp(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))  # the model's device, whatever the current one is
        return ev

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3


@dataclass
class RawIteration:
    """Clock markers of one iteration, in the order the events happened."""

    start: Any
    forward_ends: list[tuple[str, Any]]   # (owner module, marker) per finished forward call
    forward_end: Any                      # after the loss
    backward_start: Any
    grad_ready: list[tuple[int, Any]]     # (parameter index, marker) in firing order
    backward_end: Any


@dataclass
class IterationTimeline:
    """One iteration in seconds since the start of the forward."""

    forward_ends: list[tuple[str, float]]
    forward_end: float
    backward_start: float
    grad_ready: list[tuple[int, float]]
    backward_end: float


class Recorder:
    """Hooks on parameter-owning modules (forward end) and on parameters (gradient ready)."""

    def __init__(self, model: nn.Module, params: list[Param], clock: Clock) -> None:
        self.clock = clock
        self.active = False
        self._fwd: list[tuple[str, Any]] = []
        self._ready: list[tuple[int, Any]] = []
        self._handles: list[Any] = []
        modules = dict(model.named_modules())
        for owner in dict.fromkeys(p.owner for p in params):
            self._handles.append(modules[owner].register_forward_hook(self._forward_hook(owner)))
        for i, p in enumerate(params):
            self._handles.append(p.tensor.register_post_accumulate_grad_hook(self._grad_hook(i)))

    def _forward_hook(self, owner: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.active:
                self._fwd.append((owner, self.clock.stamp()))
        return hook

    def _grad_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(tensor: torch.Tensor) -> None:
            if self.active:
                self._ready.append((index, self.clock.stamp()))
        return hook

    def run(self, forward: Callable[[], torch.Tensor]) -> RawIteration:
        """One forward (returning the loss) and backward with the hooks active."""
        self._fwd, self._ready = [], []
        self.active = True
        try:
            start = self.clock.stamp()
            loss = forward()
            forward_end = self.clock.stamp()
            backward_start = self.clock.stamp()
            loss.backward()
            backward_end = self.clock.stamp()
        finally:
            self.active = False
        return RawIteration(start, self._fwd, forward_end, backward_start, self._ready, backward_end)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def resolve(raw: RawIteration, elapsed: Callable[[Any, Any], float]) -> IterationTimeline:
    def t(m: Any) -> float:
        return elapsed(raw.start, m)

    return IterationTimeline([(o, t(m)) for o, m in raw.forward_ends], t(raw.forward_end),
                             t(raw.backward_start), [(i, t(m)) for i, m in raw.grad_ready],
                             t(raw.backward_end))


def attribute(tl: IterationTimeline, params: list[Param], view: str
               ) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """Layer names in trace order (reverse of gradient-ready order), forward and backward seconds.
    A layer is ready with its last parameter's gradient; layers that never got one sit first."""
    unit_of = [p.name if view == "tensor" else unit_name(p.owner) for p in params]
    remaining = Counter(unit_of)

    backward: dict[str, float] = {}
    completed: list[str] = []
    prev = tl.backward_start
    for index, t in tl.grad_ready:
        u = unit_of[index]
        remaining[u] -= 1
        if remaining[u] == 0:
            backward[u] = max(0.0, t - prev)
            completed.append(u)
            prev = t
    never = [u for u in remaining if remaining[u] > 0]
    backward.update(dict.fromkeys(never, 0.0))
    order = never + completed[::-1]

    # forward: gaps between consecutive ends of parameter-owning modules; the tail to the last one
    per_module: dict[str, float] = {}
    prev, last = 0.0, None
    for owner, t in tl.forward_ends:
        per_module[owner] = per_module.get(owner, 0.0) + max(0.0, t - prev)
        prev, last = t, owner
    if last is None:   # no module ran a hook: charge the whole forward to the first layer
        last = params[0].owner
    per_module[last] = per_module.get(last, 0.0) + max(0.0, tl.forward_end - prev)

    forward = dict.fromkeys(order, 0.0)
    if view == "module":
        for owner, s in per_module.items():
            forward[unit_name(owner)] += s
    else:
        position = {u: i for i, u in enumerate(order)}
        first_tensor: dict[str, str] = {}
        for p in sorted(params, key=lambda q: position[q.name]):
            first_tensor.setdefault(p.owner, p.name)
        for owner, s in per_module.items():
            forward[first_tensor[owner]] += s
    return order, forward, backward
