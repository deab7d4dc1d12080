"""Measure a model's per-layer forward/backward times on the local device and return a Trace.

* Backward: a post-accumulate-grad hook stamps when each parameter's gradient is ready; ``backward_s``
  is the gap since the previous one (the first: since ``loss.backward()`` began), so parameterless work
  is charged to the preceding parameter-owning layer. Layers are in reverse gradient-ready order.
* Forward: hooks stamp the end of each module that directly owns parameters; ``forward_s`` is the gap
  since the previous stamp (the tail, e.g. the loss, goes to the last module).

Views: ``"tensor"``, one layer per parameter tensor (a module's forward on its first tensor);
``"module"``, one per parameter-owning module. Tied parameters count once. Clock: ``perf_counter`` on
CPU, CUDA events on GPU (one host sync per iteration). :mod:`repro.workload.estimate` shares the
recording (:mod:`repro.workload.recording`).
"""

from __future__ import annotations

import inspect
import itertools
import platform
import statistics
from typing import Any, Callable

import torch
from torch import nn

from repro.core.trace import Layer, Trace
from repro.workload.layers import VIEWS, _check_view, learnable_params, unit_sizes
from repro.workload.models import build_model, compute_loss, get_spec, make_batch
from repro.workload.recording import Clock, CpuClock, CudaClock, IterationTimeline, Recorder, attribute, resolve

__all__ = ["AUTOCAST_DTYPES", "VIEWS", "profile_model"]

#: dtypes ``profile_model(autocast=...)`` accepts (``torch.autocast`` on CPU and CUDA takes both)
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


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


def _check_autocast(autocast: Any) -> torch.dtype | None:
    """The torch dtype of ``autocast`` (None: no autocast); ValueError listing the valid names."""
    if autocast is None:
        return None
    if not isinstance(autocast, str) or autocast not in AUTOCAST_DTYPES:
        raise ValueError(f"unknown autocast dtype {autocast!r}; valid: {', '.join(AUTOCAST_DTYPES)} "
                         "(or None for the parameters' own precision)")
    return AUTOCAST_DTYPES[autocast]


def _autocast_forward(forward: Callable[[], torch.Tensor], dev: torch.device,
                      dtype: torch.dtype | None) -> Callable[[], torch.Tensor]:
    """``forward`` (the loss) run under ``torch.autocast(dev.type, dtype)``; ``forward`` itself without a dtype."""
    if dtype is None:
        return forward

    def under_autocast() -> torch.Tensor:
        with torch.autocast(dev.type, dtype=dtype):
            return forward()
    return under_autocast


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_model(model: str | nn.Module | None = None, batch_size: int | None = None,
                  device: str | torch.device | None = None, view: str = "tensor", warmup: int = 3,
                  iters: int = 10, *, batch: Any = None, loss_fn: Callable[..., torch.Tensor] | None = None,
                  name: str | None = None, seed: int = 0, model_name: str | None = None,
                  autocast: str | None = None, **model_kwargs: Any) -> Trace:
    """Measure one model's per-layer forward/backward seconds on ``device``; per-layer medians as a :class:`Trace`.

    * **A registry name** (or ``model_name=``) with a batch size, ``profile_model("resnet50", 32)``:
      random weights seeded by ``seed``, one synthetic batch; ``model_kwargs`` go to
      :func:`repro.workload.models.build_model` / ``make_batch``. ``device`` defaults to ``"cpu"``.
    * **Any** :class:`torch.nn.Module` with ``batch=(x, y)`` (``x`` a tensor, or a tuple/list/dict of
      them) and ``loss_fn``: ``loss_fn(output, y)`` or ``loss_fn(module, x, y)`` (three required
      positional parameters), returning a scalar; ``None``: cross-entropy on ``module(x)``. Name: the
      class name unless ``name``; batch size: the first dimension of ``x``'s first tensor.
      ``device=None`` measures where the parameters are; another device moves the module there in
      place. Train mode, gradients, buffers and the caller's RNG state are restored.

    ``autocast``: ``"bfloat16"`` or ``"float16"`` runs forward and loss under ``torch.autocast`` (no
    GradScaler), recorded in ``extra["precision"]``. Seconds per layer are medians over ``iters`` timed
    iterations after ``warmup`` (forward, loss and backward; no optimizer step, no data loading);
    gradient bytes are in the parameters' dtype (``"mixed"`` if they differ).
    """
    if model is None:
        model = model_name
    elif model_name is not None:
        raise ValueError("give the model once: as the first argument or as model_name=, not both")
    if isinstance(model, nn.Module):
        if model_kwargs:
            raise ValueError(f"model_kwargs ({', '.join(sorted(model_kwargs))}) are for registry models; a module "
                             "is profiled as it is")
        return _profile_module(model, batch, loss_fn, batch_size=batch_size, device=device, view=view,
                               warmup=warmup, iters=iters, name=name, seed=seed, autocast=autocast)
    if not isinstance(model, str):
        raise ValueError(f"model must be a registry name (str) or a torch.nn.Module, got "
                         f"{type(model).__name__}")
    given = [k for k, v in (("batch", batch), ("loss_fn", loss_fn), ("name", name)) if v is not None]
    if given:
        raise ValueError(f"{', '.join(given)} apply to a torch.nn.Module; registry model {model!r} makes its own "
                         "batch and loss (give batch_size)")
    if batch_size is None:
        raise ValueError(f"batch_size is needed for registry model {model!r}")
    model_name = model
    get_spec(model_name)
    _check_view(view)
    amp_dtype = _check_autocast(autocast)
    dev = _check_device("cpu" if device is None else device)
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    _check_counts(warmup, iters)

    torch.manual_seed(seed)
    module = build_model(model_name, device=dev, **model_kwargs)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    inputs, targets = make_batch(model_name, batch_size, device=dev, generator=gen, **model_kwargs)
    params = learnable_params(module)

    def forward() -> torch.Tensor:
        return compute_loss(model_name, module, inputs, targets, **model_kwargs)

    extra: dict[str, Any] = {"seed": seed}
    if model_kwargs:
        extra["model_kwargs"] = dict(model_kwargs)
    return _measure(module, params, _autocast_forward(forward, dev, amp_dtype), dev, view, warmup, iters,
                    model_name=model_name, batch_size=batch_size, extra=extra, autocast=autocast)


def _module_device(module: nn.Module) -> torch.device:
    """Where ``module`` lives: its first parameter's (or buffer's) device; the CPU if it has neither."""
    t = next(itertools.chain(module.parameters(), module.buffers()), None)
    return t.device if t is not None else torch.device("cpu")


def _to_device(obj: Any, dev: torch.device) -> Any:
    """``obj`` with its tensors (also inside tuples, lists and dicts) on ``dev``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_to_device(v, dev) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to_device(v, dev) for v in obj)
    if isinstance(obj, dict):
        return {k: _to_device(v, dev) for k, v in obj.items()}
    return obj


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    return next((t for t in map(_first_tensor, values) if t is not None), None)


def _batch_size_of(x: Any) -> int:
    t = _first_tensor(x)
    if t is None:
        raise ValueError(f"the batch's inputs hold no tensor (got {type(x).__name__}); the batch size is the "
                         "first dimension of the inputs' (first) tensor")
    if t.dim() == 0 or t.shape[0] < 1:
        raise ValueError(f"the batch's input tensor has shape {tuple(t.shape)}; its first dimension is the batch "
                         "size and must be at least 1")
    return int(t.shape[0])


def _loss_takes_module(loss_fn: Callable[..., Any]) -> bool:
    """True for ``loss_fn(module, x, y)``, False for ``loss_fn(output, y)`` (see :func:`profile_model`)."""
    target = loss_fn.forward if isinstance(loss_fn, nn.Module) else loss_fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):  # e.g. a builtin without a signature: the PyTorch losses' convention
        return False
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(required) == 3:
        return True
    if len(required) <= 2 <= len(positional):
        return False
    raise ValueError(f"loss_fn {getattr(loss_fn, '__name__', type(loss_fn).__name__)} takes {len(required)} "
                     "required positional argument(s); give loss_fn(output, y) or loss_fn(module, x, y)")


def _profile_module(module: nn.Module, batch: Any, loss_fn: Callable[..., torch.Tensor] | None, *,
                    batch_size: int | None, device: str | torch.device | None, view: str, warmup: int,
                    iters: int, name: str | None, seed: int, autocast: str | None = None) -> Trace:
    """:func:`profile_model` of a user's ``nn.Module`` (its second form)."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ValueError("batch must be a pair (x, y): the module's inputs and the loss's targets, got "
                         + (f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (tuple, list))
                            else type(batch).__name__))
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if name is None:
        name = type(module).__name__
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    _check_view(view)
    amp_dtype = _check_autocast(autocast)
    dev = _check_device(_module_device(module) if device is None else device)
    _check_counts(warmup, iters)
    n = _batch_size_of(batch[0])
    if batch_size is not None and batch_size != n:
        raise ValueError(f"batch_size={batch_size!r} contradicts the batch, whose first dimension is {n}; leave "
                         "batch_size out for a module")
    takes_module = False if loss_fn is None else _loss_takes_module(loss_fn)
    params = learnable_params(module)
    if any(p.tensor.device != dev for p in params) or any(b.device != dev for b in module.buffers()):
        module.to(dev)
    x, y = _to_device(batch[0], dev), _to_device(batch[1], dev)

    def forward() -> torch.Tensor:
        if loss_fn is None:
            loss = nn.functional.cross_entropy(module(x), y)
        elif takes_module:
            loss = loss_fn(module, x, y)
        else:
            loss = loss_fn(module(x), y)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            what = (f"a tensor of shape {tuple(loss.shape)}" + ("" if loss.requires_grad else " without grad")
                    if isinstance(loss, torch.Tensor) else f"a {type(loss).__name__}")
            raise ValueError(f"loss_fn must return a scalar tensor that depends on the parameters, got {what}")
        return loss

    was_training = module.training
    saved_grads = [p.tensor.grad for p in params]
    buffers = list(module.buffers())  # e.g. batch-norm running statistics, which train mode updates
    saved_buffers = [b.detach().clone() for b in buffers]
    extra: dict[str, Any] = {"seed": seed, "module": f"{type(module).__module__}.{type(module).__qualname__}"}
    try:
        with torch.random.fork_rng(devices=[dev.index] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            module.train()
            return _measure(module, params, _autocast_forward(forward, dev, amp_dtype), dev, view, warmup,
                            iters, model_name=name, batch_size=n, extra=extra, autocast=autocast)
    finally:
        module.train(was_training)
        for p, g in zip(params, saved_grads):
            p.tensor.grad = g
        with torch.no_grad():
            for b, v in zip(buffers, saved_buffers):
                b.copy_(v)


def _check_counts(warmup: Any, iters: Any) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive integer, got {iters!r}")


def _measure(model: nn.Module, params: list, forward: Callable[[], torch.Tensor], dev: torch.device, view: str,
             warmup: int, iters: int, *, model_name: str, batch_size: int, extra: dict[str, Any],
             autocast: str | None = None) -> Trace:
    """Time ``warmup + iters`` iterations of ``forward()`` (the loss) and backward; the Trace
    (``autocast`` only labels it)."""
    clock: Clock = CudaClock(dev) if dev.type == "cuda" else CpuClock()
    recorder = Recorder(model, params, clock)
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
    extra = {
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
        **extra,
    }
    if dev.type == "cpu":
        extra["cpu"] = _cpu_name()
        extra["num_threads"] = torch.get_num_threads()
        device_name = "cpu"
    else:
        device_name = torch.cuda.get_device_name(dev)
        extra["cuda"] = torch.version.cuda
        extra["tf32"] = {"matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                         "cudnn": bool(torch.backends.cudnn.allow_tf32)}
    dtypes = {p.tensor.dtype for p in params}
    dtype = str(dtypes.pop()).removeprefix("torch.") if len(dtypes) == 1 else "mixed"
    extra["precision"] = dtype if autocast is None else f"autocast-{autocast}"
    return Trace(model=model_name, batch_size=batch_size, device=device_name, dtype=dtype,
                 layers=tuple(layers), extra=extra)
