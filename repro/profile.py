"""Measure a model's per-layer forward/backward times on the local device and return a Trace.

Method (the simulator's model of backward, measured directly):

* Backward: ``Tensor.register_post_accumulate_grad_hook`` stamps the clock when each parameter's
  gradient is ready. A layer's ``backward_s`` is the gap between its gradient becoming ready and
  the previous gradient becoming ready (the first one: from the start of ``loss.backward()``), so
  ``sum(backward_s[l:])`` is when layer ``l``'s gradient is ready. Computation of parameterless
  operations (activations, pooling, the loss) is thereby charged to the next layer whose gradient
  completes, i.e. to the preceding parameter-owning layer in forward order.
* Layer order is the reverse of the observed gradient-ready order: the "forward order" the
  simulator assumes (the true forward order for sequential networks).
* Forward: module forward hooks stamp the clock when each module that directly owns parameters
  finishes. A module's ``forward_s`` is the gap since the previous such stamp (the first one:
  from the start of the forward), so parameterless work before a module is charged to it; the
  tail after the last stamp (e.g. the loss) is added to the last module that finished. A module
  that runs several times gets the sum. ``sum(forward_s)`` is the whole forward including the loss.

Views: ``"tensor"`` has one layer per parameter tensor (name = parameter's qualified name; a module's
forward time goes to its first tensor in trace order, 0 to the others); ``"module"`` has one layer
per module that directly owns parameters (name = module's qualified name, parameters summed; the
module's gradient is ready when its last tensor's is). Tied parameters count once, for the first
module that owns them. Reported times are per-layer medians over ``iters`` timed iterations after
``warmup`` untimed ones.

Timing: ``time.perf_counter`` on CPU. On CUDA the hooks record ``torch.cuda.Event`` s and the host
synchronizes once per iteration, never inside a hook.

The event machinery (:class:`_Recorder`, :func:`_attribute`) is shared with :mod:`repro.estimate`,
which runs it on the meta device with a virtual clock, so estimates follow the same convention.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import nn

from repro.models import build_model, compute_loss, get_spec, make_batch
from repro.trace import Layer, Trace

__all__ = ["VIEWS", "profile_model"]

VIEWS = ("tensor", "module")


# ---------------------------------------------------------------------------------------------
# Parameters and their owners
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Param:
    name: str          # qualified parameter name (first one, for tied parameters)
    owner: str         # qualified name of the first module that directly owns it
    tensor: nn.Parameter


def _learnable_params(model: nn.Module) -> list[_Param]:
    """Distinct parameters requiring grad, in ``model.named_parameters()`` order, with owners."""
    out: list[_Param] = []
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            out.append(_Param(f"{mod_name}.{pname}" if mod_name else pname, mod_name, p))
    if not out:
        raise ValueError("the model has no learnable parameters")
    return out


def _unit_name(fqn: str) -> str:
    return fqn or "<root>"


# ---------------------------------------------------------------------------------------------
# Clocks: stamp() returns a marker; elapsed(a, b) gives seconds from marker a to marker b.
# ---------------------------------------------------------------------------------------------

class _Clock(Protocol):
    def stamp(self) -> Any: ...
    def sync(self) -> None: ...
    def elapsed(self, a: Any, b: Any) -> float: ...


class _CpuClock:
    def stamp(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def elapsed(self, a: float, b: float) -> float:
        return b - a


class _CudaClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def stamp(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3


# ---------------------------------------------------------------------------------------------
# Recording one iteration
# ---------------------------------------------------------------------------------------------

@dataclass
class _Raw:
    """Clock markers of one iteration, in the order the events happened."""

    start: Any
    forward_ends: list[tuple[str, Any]]   # (owner module, marker) per finished forward call
    forward_end: Any                      # after the loss
    backward_start: Any
    grad_ready: list[tuple[int, Any]]     # (parameter index, marker) in firing order
    backward_end: Any


@dataclass
class _Timeline:
    """One iteration in seconds since the start of the forward."""

    forward_ends: list[tuple[str, float]]
    forward_end: float
    backward_start: float
    grad_ready: list[tuple[int, float]]
    backward_end: float


class _Recorder:
    """Hooks on parameter-owning modules (forward end) and on parameters (gradient ready)."""

    def __init__(self, model: nn.Module, params: list[_Param], clock: _Clock) -> None:
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

    def run(self, forward: Callable[[], torch.Tensor]) -> _Raw:
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
        return _Raw(start, self._fwd, forward_end, backward_start, self._ready, backward_end)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _resolve(raw: _Raw, elapsed: Callable[[Any, Any], float]) -> _Timeline:
    def t(m: Any) -> float:
        return elapsed(raw.start, m)

    return _Timeline([(o, t(m)) for o, m in raw.forward_ends], t(raw.forward_end),
                     t(raw.backward_start), [(i, t(m)) for i, m in raw.grad_ready],
                     t(raw.backward_end))


# ---------------------------------------------------------------------------------------------
# Attribution of one timeline to layers
# ---------------------------------------------------------------------------------------------

def _attribute(tl: _Timeline, params: list[_Param], view: str
               ) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """Layer names in trace order (reverse of gradient-ready order), forward and backward seconds."""
    unit_of = [p.name if view == "tensor" else _unit_name(p.owner) for p in params]
    remaining: dict[str, int] = {}
    for u in unit_of:
        remaining[u] = remaining.get(u, 0) + 1

    # Backward: a unit completes when its last parameter's gradient is ready.
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
    # Units whose gradient never arrived (unused parameters) sit at the input side: ready last.
    never = [u for u in remaining if remaining[u] > 0]
    for u in never:
        backward[u] = 0.0
    order = never + completed[::-1]

    # Forward: gaps between consecutive ends of parameter-owning modules; tail to the last one.
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
            forward[_unit_name(owner)] += s
    else:
        position = {u: i for i, u in enumerate(order)}
        first_tensor: dict[str, str] = {}
        for p in params:
            cur = first_tensor.get(p.owner)
            if cur is None or position[p.name] < position[cur]:
                first_tensor[p.owner] = p.name
        for owner, s in per_module.items():
            forward[first_tensor[owner]] += s
    return order, forward, backward


def _unit_sizes(params: list[_Param], view: str, bytes_per_element: int | None = None
                ) -> dict[str, tuple[int, int]]:
    """Layer name -> (parameter count, gradient bytes)."""
    sizes: dict[str, tuple[int, int]] = {}
    for p in params:
        u = p.name if view == "tensor" else _unit_name(p.owner)
        n = p.tensor.numel()
        b = n * (bytes_per_element or p.tensor.element_size())
        old = sizes.get(u, (0, 0))
        sizes[u] = (old[0] + n, old[1] + b)
    return sizes


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------

def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {device!r}: profile_model measures on 'cpu' or 'cuda[:N]' "
                         "(for a named GPU without the hardware use repro.estimate.estimate_trace)"
                         ) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available here "
                             "(torch.cuda.is_available() is False); use device='cpu', or "
                             "repro.estimate.estimate_trace for a named GPU")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} "
                             "CUDA device(s) are visible")
        return torch.device("cuda", index)
    raise ValueError(f"cannot measure on device {device!r}: profile_model measures on 'cpu' or "
                     "'cuda[:N]' (for shapes only use repro.estimate.estimate_trace)")


def _check_view(view: str) -> None:
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; valid views: {', '.join(VIEWS)}")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_model(model_name: str, batch_size: int, device: str | torch.device = "cpu",
                  view: str = "tensor", warmup: int = 3, iters: int = 10, *, seed: int = 0,
                  **model_kwargs: Any) -> Trace:
    """Measure ``model_name`` at ``batch_size`` on ``device``; per-layer medians as a :class:`Trace`.

    ``model_kwargs`` go to :func:`repro.models.build_model` / :func:`~repro.models.make_batch`
    (e.g. ``seq_len`` for BERT). The model has random weights (seeded by ``seed``) and is trained
    on one synthetic batch in train mode; gradients are reset to ``None`` between iterations and no
    optimizer step is taken.
    """
    get_spec(model_name)
    _check_view(view)
    dev = _check_device(device)
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive integer, got {iters!r}")

    torch.manual_seed(seed)
    model = build_model(model_name, device=dev, **model_kwargs)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    inputs, targets = make_batch(model_name, batch_size, device=dev, generator=gen, **model_kwargs)
    params = _learnable_params(model)
    clock: _Clock = _CudaClock(dev) if dev.type == "cuda" else _CpuClock()
    recorder = _Recorder(model, params, clock)

    def forward() -> torch.Tensor:
        return compute_loss(model_name, model, inputs, targets, **model_kwargs)

    timelines: list[_Timeline] = []
    try:
        for i in range(warmup + iters):
            model.zero_grad(set_to_none=True)
            raw = recorder.run(forward)
            clock.sync()
            if i >= warmup:
                timelines.append(_resolve(raw, clock.elapsed))
    finally:
        recorder.close()
        model.zero_grad(set_to_none=True)

    runs = [_attribute(tl, params, view) for tl in timelines]
    order = runs[0][0]
    order_changes = sum(1 for r in runs[1:] if r[0] != order)
    sizes = _unit_sizes(params, view)
    layers = [Layer(name=u, params=sizes[u][0], bytes=sizes[u][1],
                    forward_s=statistics.median(r[1][u] for r in runs),
                    backward_s=statistics.median(r[2][u] for r in runs))
              for u in order]

    def med(f: Callable[[_Timeline], float]) -> float:
        return statistics.median(f(tl) for tl in timelines)

    last_ready = [tl.grad_ready[-1][1] if tl.grad_ready else tl.backward_start for tl in timelines]
    extra: dict[str, Any] = {
        "source": "measured",
        "view": view,
        "warmup": warmup,
        "iters": iters,
        "torch": torch.__version__,
        "method": "forward hooks on parameter-owning modules; post-accumulate-grad hooks; "
                  "per-layer medians",
        "wall_forward_s": med(lambda tl: tl.forward_end),
        "wall_backward_s": med(lambda tl: tl.backward_end - tl.backward_start),
        "backward_tail_s": statistics.median(tl.backward_end - t for tl, t in zip(timelines, last_ready)),
        "order_changes": order_changes,
        "seed": seed,
    }
    if model_kwargs:
        extra["model_kwargs"] = dict(model_kwargs)
    if dev.type == "cpu":
        extra["cpu"] = _cpu_name()
        extra["num_threads"] = torch.get_num_threads()
        device_name = "cpu"
    else:
        device_name = torch.cuda.get_device_name(dev)
        extra["cuda"] = torch.version.cuda
    return Trace(model=model_name, batch_size=batch_size, device=device_name, dtype="float32",
                 layers=tuple(layers), extra=extra)
