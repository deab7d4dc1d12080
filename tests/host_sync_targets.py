"""Rank functions of tests/test_host_syncs.py: count the host syncs one GradScaler step makes.

A *host sync* is a read of a tensor's value by the host: ``.item()``, ``bool(t)``, ``float(t)``,
``int(t)``, ``if t:``... On a GPU each waits for the device to finish everything queued before it. All
of them reach the dispatcher as ``aten._local_scalar_dense`` (``bool(t)`` through ``is_nonzero``, which
calls ``item()``), so a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that counts that op
counts them on a CPU as well, where they cost nothing and ``torch.cuda.set_sync_debug_mode`` does not
apply. ``.tolist()``, ``.numpy()`` and ``.cpu()`` are counted by patching :class:`torch.Tensor` (a
CPU tensor's ``.tolist()`` does not go through that op; on a GPU it copies to the host, a sync too).
Only the calling thread's reads count: a family's helper threads (ByteScheduler's control loop reads
the CPU tensors of its control messages) do not hold up the training loop's stream of work.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

LAYERS = 6  # Linear layers of the model: 12 gradients (weights and biases)
STEPS = 3   # steps before the counted one (the planners' warm-up is 1 of them)


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and threading.get_ident() == self.thread:
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_host_syncs():
    """Count the host syncs made inside the block (this thread); yields a dict whose ``"count"`` is
    filled in when the block ends."""
    box = {"count": 0}
    patched = {}
    counter = _Counter()

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            if threading.get_ident() == counter.thread:
                box["count"] += 1
            return original(self, *a, **k)

        patched[name] = original
        return wrapper

    for name in ("tolist", "numpy", "cpu"):
        setattr(torch.Tensor, name, counting(name))
    try:
        with counter:
            yield box
    finally:
        for name, original in patched.items():
            setattr(torch.Tensor, name, original)
        box["count"] += counter.count


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(16, 4))


def syncs_per_step(ctx, cases: dict[str, dict]) -> dict[str, dict]:
    """Per scheduler of ``cases`` (name -> distribute keywords): :func:`one_scheduler`'s counts."""
    return {name: one_scheduler(name, options) for name, options in cases.items()}


def one_scheduler(scheduler: str, options: dict) -> dict:
    """Host syncs of one fp16-autocast + GradScaler step (forward, ``scaler.scale(loss).backward()``,
    ``scaler.step(opt)``, ``scaler.update()``) after ``STEPS`` steps, through :func:`repro.distribute`
    (``fp16_scaler``; every step's in ``fp16_scaler_all``, the first one holding the warm-up's
    planning); and of the same step without a scaler (``bf16``: bf16 autocast), the family's own."""
    import torch.distributed as dist

    import repro

    rank = dist.get_rank()
    out = {}
    for mode in ("fp16_scaler", "bf16"):
        net = _model()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if mode == "fp16_scaler" else None
        model, dopt = repro.distribute(net, opt, scheduler, grad_scaler=scaler, **options)
        dtype = torch.float16 if scaler is not None else torch.bfloat16
        g = torch.Generator().manual_seed(rank)
        counts = []
        for step in range(STEPS + 1):
            x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
            with count_host_syncs() as box:
                dopt.zero_grad()
                with torch.autocast("cpu", dtype=dtype):
                    loss = nn.functional.cross_entropy(model(x), y)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(dopt)
                    scaler.update()
                else:
                    loss.backward()
                    dopt.step()
            counts.append(box["count"])
        dopt.flush()
        dopt.remove()
        out[mode] = counts[-1]
        out[f"{mode}_all"] = counts
    return out
