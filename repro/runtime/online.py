"""Online planning, one implementation for ``repro train`` and :func:`repro.distribute`.

A plan scheduler that plans online runs a few warm-up steps with one exact all-reduce after backward
while its executor records when each layer's gradient is ready; then :func:`measured_trace` averages
the ranks' per-step medians into a :class:`~repro.core.trace.Trace` (layer order: reverse of the ready
order) and :func:`plan_online` fits the cost model, solves on the first trainer and broadcasts the Plan.
Times are seconds on the host's ``time.perf_counter()`` base; on a GPU the gaps are device times
(:mod:`repro.runtime.clock`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from repro.core.cost import CostModel
from repro.core.families import get_family
from repro.core.plan import Plan
from repro.core.planners import make_plan
from repro.core.schedulers import get_scheduler
from repro.core.trace import Layer, Overheads, Trace
from repro.runtime.calibrate import sync_device
from repro.workload.layers import layer_parameters

__all__ = ["StepTimes", "sync_device", "gather_rows", "grad_abs_mean", "measured_trace", "plan_online"]


@dataclass
class StepTimes:
    """``time.perf_counter`` stamps of one step (seconds), each taken after :func:`sync_device` during
    the warm-up: the base the executors' clocks resolve gradient-ready times to."""

    start: float          # before before_forward()
    forward_start: float  # after before_forward()
    backward_start: float
    backward_end: float   # loss.backward() returned (CPU: compute done; communication may go on)
    exchange_end: float   # after_backward() returned: gradients exchanged
    end: float            # optimizer step done
    loss: float

    def row(self, step: int, epoch: int) -> dict[str, Any]:
        return {"step": step, "epoch": epoch, "iteration_s": self.end - self.start,
                "forward_s": self.backward_start - self.start, "backward_call_s": self.backward_end - self.backward_start,
                "step_s": self.end - self.backward_end, "pre_forward_s": self.forward_start - self.start,
                "update_s": self.end - self.exchange_end, "loss": self.loss}


def gather_rows(vec: torch.Tensor, group=None) -> torch.Tensor:
    """Every trainer's ``vec`` stacked (trainers x n), identical on all of them."""
    parts = [torch.empty_like(vec) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, vec, group=group)
    return torch.stack(parts)


def grad_abs_mean(model: nn.Module, view: str) -> dict[str, float]:
    """Each layer's mean absolute gradient per element (the exchanged gradients after a step)."""
    out = {}
    for name, params in layer_parameters(model, view).items():
        grads = [p.grad for _, p in params if p.grad is not None]
        n = sum(g.numel() for g in grads)
        out[name] = float(sum(g.detach().abs().sum() for g in grads) / n) if n else 0.0
    return out


def measured_trace(model: nn.Module, steps: Sequence[tuple[StepTimes, Mapping[str, float]]], device: torch.device,
                   *, model_name: str, batch_size: int, view: str, update_s: float | None = None, group=None,
                   grad_abs_mean: Mapping[str, float] | None = None) -> Trace:
    """Per-layer backward gaps (median over ``steps``, mean over ranks) as a Trace, with the forward
    total spread evenly and the measured overheads (``update_s`` overrides the update). ``steps``: each
    step's stamps and layer -> gradient-ready time. Every trainer of ``group`` calls this."""
    layers = layer_parameters(model, view)
    names = list(layers)
    # a layer with no gradient in a step is written (as zeros) when the exchange finishes: ready at the
    # end of that step's backward, its last ready time
    last = [max(ready.values(), default=st.backward_start) for st, ready in steps]
    rel = torch.tensor([[ready.get(n, end) - st.backward_start for n in names] for (st, ready), end in zip(steps, last)],
                       dtype=torch.float64)
    fixed = torch.tensor([[st.backward_start - st.forward_start, st.forward_start - st.start, st.end - st.exchange_end]
                          for st, _ in steps], dtype=torch.float64)
    vec = torch.cat([rel.median(dim=0).values, fixed.median(dim=0).values]).to(device)
    dist.all_reduce(vec, group=group)
    vec = (vec / dist.get_world_size(group)).cpu()
    ready_s = vec[:-3].tolist()
    fwd_total, pre_s, measured_update_s = (float(v) for v in vec[-3:])
    # straggler wait: per step, the slowest rank's computation minus the ranks' mean (median over steps)
    per_step = torch.tensor([(st.backward_start - st.forward_start) + max(ready.values(), default=st.backward_start)
                             - st.backward_start for st, ready in steps], dtype=torch.float64, device=device)
    everyone = gather_rows(per_step, group).cpu()
    straggler_s = float((everyone.max(dim=0).values - everyone.mean(dim=0)).median())
    order = sorted(range(len(names)), key=lambda i: ready_s[i], reverse=True)  # forward order
    out, prev = [], 0.0
    gaps = {}
    for i in reversed(order):  # backward order
        gaps[i] = max(0.0, ready_s[i] - prev)
        prev = max(prev, ready_s[i])
    for i in order:
        params = layers[names[i]]
        numel = sum(p.numel() for _, p in params)
        extra = {"grad_abs_mean": grad_abs_mean[names[i]]} if grad_abs_mean else {}
        out.append(Layer(names[i], numel, numel * params[0][1].element_size(), fwd_total / len(names), gaps[i],
                         extra=extra))
    overheads = Overheads(pre_forward_s=max(0.0, pre_s), straggler_s=max(0.0, straggler_s),
                          update_s=max(0.0, measured_update_s if update_s is None else update_s))
    return Trace(model_name, batch_size, str(device), "float32", out,
                 extra={"source": "measured", "method": "runtime gradient-ready hooks, mean over ranks of "
                        "per-step medians; forward total spread evenly over layers", "view": view},
                 overheads=overheads)


def plan_online(scheduler: str, trace: Trace | None, device: torch.device, *,
                planner_options: Mapping[str, Any] | None = None, network_cost: CostModel | None = None,
                fit_repeats: int = 5, first: int = 0, servers: int = 0) -> tuple[Plan, CostModel, Trace]:
    """The first trainer (global rank ``first``) solves ``scheduler``'s planner on ``trace`` with the cost
    model of its family's calibration hook (every rank takes part; ``network_cost`` for a family without a
    live fit) and broadcasts the plan. Serving ranks (the ``servers`` before ``first``) get the trace
    first. Returns (plan, cost, trace), the same on every rank."""
    sched = get_scheduler(scheduler)
    opts = dict(planner_options or {})
    if servers:
        box: list[Any] = [trace.to_dict() if dist.get_rank() == first else None]
        dist.broadcast_object_list(box, src=first)
        trace = Trace.from_dict(box[0])
    cost = get_family(sched.family).calibrate_cost(trace, device, fit_repeats, network_cost, **opts)
    payload: list[Any] = [make_plan(sched.planner, trace, cost, **opts).to_dict() if dist.get_rank() == first else None]
    dist.broadcast_object_list(payload, src=first)
    return Plan.from_dict(payload[0]), cost, trace
