"""The all-reduce executor's gradient paths against PyTorch DDP, parameter by parameter (2 gloo ranks):
gradients copied into the bucket divided by the world size on the way, gradients accumulated in place
in the bucket (``zero_grad(set_to_none=False)``: ``.grad`` is the bucket's view), and a wire dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from repro.cluster.local import launch_local

pytestmark = pytest.mark.distributed


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def executor_vs_ddp(ctx, set_to_none: bool, wire_dtype: str | None, steps: int = 4) -> dict:
    import torch.distributed as dist

    from repro.plan import Plan
    from repro.runtime.allreduce import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions

    rank = dist.get_rank()
    ours, ref = _model(), _model()
    names = [n for n, _ in ours.named_parameters()]
    plan = Plan.from_dict({"solver": "threshold", "buckets": [names[4:], names[:4]],
                           "options": {"wire_dtype": wire_dtype}})
    ex = AllReduceExecutor(ours, plan, ExecutorOptions())
    ddp = nn.parallel.DistributedDataParallel(ref)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ours, ref)]
    grad_is_view = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        for opt in opts:
            opt.zero_grad(set_to_none=set_to_none)
        ex.before_forward()
        nn.functional.mse_loss(ex.module(x), y).backward()
        ex.after_backward()
        nn.functional.mse_loss(ddp(x), y).backward()
        grad_is_view.append(all(p.grad.data_ptr() in {s.view.data_ptr() for s in ex.sync._slots} for p in ours.parameters()))
        for opt in opts:
            opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(ours.parameters(), ref.parameters()))
    gdiff = max(float((a.grad - b.grad).abs().max()) for a, b in zip(ours.parameters(), ref.parameters()))
    ex.remove()
    return {"param_diff": diff, "grad_diff": gdiff, "grad_is_view": grad_is_view}


def test_gradients_match_ddp_fresh_and_accumulated_in_place():
    for set_to_none in (True, False):
        r = launch_local(executor_vs_ddp, 2, args=(set_to_none, None), timeout_s=300)[0]
        assert r["param_diff"] < 1e-6 and r["grad_diff"] < 1e-6, (set_to_none, r)
        assert all(r["grad_is_view"]), r  # no copy back: .grad is the bucket's averaged slice


def test_wire_dtype_float16_close_to_ddp():
    r = launch_local(executor_vs_ddp, 2, args=(True, "float16"), timeout_s=300)[0]
    assert r["grad_diff"] < 1e-2 and r["param_diff"] < 1e-2, r
    assert not any(r["grad_is_view"])  # float32 parameters: the float16 average is cast back
