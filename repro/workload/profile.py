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

The event machinery lives in :mod:`repro.workload.recording` and is shared with
:mod:`repro.workload.estimate`, which runs it on the meta device with a virtual clock, so estimates
follow the same convention.
"""

from __future__ import annotations

import platform
import statistics
from typing import Any, Callable

import torch

from repro.trace import Layer, Trace
from repro.workload.layers import VIEWS, learnable_params, unit_sizes
from repro.workload.models import build_model, compute_loss, get_spec, make_batch
from repro.workload.recording import Clock, CpuClock, CudaClock, IterationTimeline, Recorder, attribute, resolve

__all__ = ["VIEWS", "profile_model"]


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------

def _check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"unknown device {device!r}: profile_model measures on 'cpu' or 'cuda[:N]' "
                         "(for a named GPU without the hardware use repro.workload.estimate.estimate_trace)"
                         ) from None
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available here "
                             "(torch.cuda.is_available() is False); use device='cpu', or "
                             "repro.workload.estimate.estimate_trace for a named GPU")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} "
                             "CUDA device(s) are visible")
        return torch.device("cuda", index)
    raise ValueError(f"cannot measure on device {device!r}: profile_model measures on 'cpu' or "
                     "'cuda[:N]' (for shapes only use repro.workload.estimate.estimate_trace)")


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

    ``model_kwargs`` go to :func:`repro.workload.models.build_model` / :func:`~repro.workload.models.make_batch`
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
    params = learnable_params(model)
    clock: Clock = CudaClock(dev) if dev.type == "cuda" else CpuClock()
    recorder = Recorder(model, params, clock)

    def forward() -> torch.Tensor:
        return compute_loss(model_name, model, inputs, targets, **model_kwargs)

    timelines: list[IterationTimeline] = []
    try:
        for i in range(warmup + iters):
            model.zero_grad(set_to_none=True)
            raw = recorder.run(forward)
            clock.sync()
            if i >= warmup:
                timelines.append(resolve(raw, clock.elapsed))
    finally:
        recorder.close()
        model.zero_grad(set_to_none=True)

    runs = [attribute(tl, params, view) for tl in timelines]
    order = runs[0][0]
    order_changes = sum(1 for r in runs[1:] if r[0] != order)
    sizes = unit_sizes(params, view)
    layers = [Layer(name=u, params=sizes[u][0], bytes=sizes[u][1],
                    forward_s=statistics.median(r[1][u] for r in runs),
                    backward_s=statistics.median(r[2][u] for r in runs))
              for u in order]

    def med(f: Callable[[IterationTimeline], float]) -> float:
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
