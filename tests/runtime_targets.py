"""Functions the distributed tests run on every rank (must be importable by spawned processes)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from repro.train import TrainConfig, run_training


def train_params(ctx, runs: list[dict]) -> list[dict]:
    """Run each config in turn; return per run the final parameters and the summary."""
    torch.use_deterministic_algorithms(True)
    out = []
    for kw in runs:
        cfg = TrainConfig(**{"quiet": True, "compute_steps": 0, "fit_repeats": 1, **kw})
        model, summary = run_training(ctx, cfg)
        out.append({"params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
                    "buffers": {n: b.detach().cpu().clone().double() for n, b in model.named_buffers()},
                    "summary": summary})
    return out


def allreduce_sum(ctx, value: float) -> float:
    t = torch.tensor([value])
    dist.all_reduce(t)
    return float(t)


def fit_all_collectives(ctx, sizes: list[int]) -> dict:
    from repro.runtime.calibrate import MEASURABLE, fit_cost_model

    return fit_cost_model(sizes, MEASURABLE, repeats=2, device=ctx.device).to_dict()


def plan_errors(ctx) -> list[str]:
    """Messages of BucketedAllReduce for plans that do not fit a Linear layer (tensor view)."""
    from repro.plan import Plan, PlanError
    from repro.runtime.allreduce import BucketedAllReduce

    out = []
    for buckets in ([["weight", "bias", "extra"]], [["weight"]]):
        try:
            BucketedAllReduce(torch.nn.Linear(2, 2), Plan.from_dict({"buckets": buckets}))
            out.append("accepted")
        except PlanError as e:
            out.append(str(e))
    return out
