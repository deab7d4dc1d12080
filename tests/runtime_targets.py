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
    """The fitted cost model as a dict, with ``stream_ops``: the reduce-scatters and all-gathers the
    timing ran on the executors' CommStream (counted by wrapping its methods)."""
    from repro.runtime import collectives
    from repro.runtime.calibrate import MEASURABLE, fit_cost_model

    counts = {"reduce_scatter": 0, "all_gather": 0}
    originals = {name: getattr(collectives.CommStream, name) for name in counts}

    def counting(name):
        def op(self, buffer):
            counts[name] += 1
            return originals[name](self, buffer)
        return op

    for name in counts:
        setattr(collectives.CommStream, name, counting(name))
    try:
        out = fit_cost_model(sizes, MEASURABLE, repeats=2, device=ctx.device).to_dict()
    finally:
        for name, fn in originals.items():
            setattr(collectives.CommStream, name, fn)
    out["stream_ops"] = counts
    return out


def plan_errors(ctx) -> list[str]:
    """Messages of BucketedAllReduce for plans that do not fit a Linear layer (tensor view)."""
    from repro.core.plan import Plan, PlanError
    from repro.families.allreduce.executor import BucketedAllReduce

    out = []
    for buckets in ([["weight", "bias", "extra"]], [["weight"]]):
        try:
            BucketedAllReduce(torch.nn.Linear(2, 2), Plan.from_dict({"buckets": buckets}))
            out.append("accepted")
        except PlanError as e:
            out.append(str(e))
    return out


# ---- sparse family (tests/test_runtime_sparse.py) ----

def _synthetic_trace(model, name: str):
    """A trace of ``model``'s layers (tensor view) with made-up times: planners get real layer sizes."""
    from repro.core.trace import Layer, Trace
    from repro.workload.layers import layer_parameters

    layers = []
    for layer, params in layer_parameters(model).items():
        n = sum(p.numel() for _, p in params)
        layers.append(Layer(layer, n, 4 * n, 1e-4, 1e-4 + 2e-8 * n))
    return Trace(name, 8, "cpu", "float32", layers)


def _reference_sparse_sgd(model_name: str, plan, world: int, steps: int, batch_size: int, density: float,
                          error_feedback: bool = True, splits: list[list[int]] | None = None) -> dict:
    """Single-process reference of top-k SGD with error feedback over ``world`` workers' data, written
    from the math, not from repro.families.sparse.executor: per worker, gradient on its own batch + its residual,
    per bucket of ``plan`` the k = ceil(density n) largest magnitudes sent (``splits[step][bucket]``
    where given: the executor's split under topk_scope "model"), the rest kept as the new residual; the
    sent entries summed over workers (worker 0 first) / P; then the SGD step."""
    import math

    from repro.workload.layers import layer_parameters
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.manual_seed(0)
    model = build_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    layers = layer_parameters(model)
    buckets = [[p for layer in b.layers for _, p in layers[layer]] for b in plan.buckets]
    gens = [torch.Generator().manual_seed(100 + r) for r in range(world)]
    residual = [[None] * len(buckets) for _ in range(world)]
    for step in range(steps):
        total = [torch.zeros(sum(p.numel() for p in ps)) for ps in buckets]
        for r in range(world):
            x, y = make_batch(model_name, batch_size, generator=gens[r])
            model.zero_grad(set_to_none=True)
            compute_loss(model_name, model, x, y).backward()
            for b, ps in enumerate(buckets):
                flat = torch.cat([p.grad.reshape(-1) for p in ps])
                if error_feedback and residual[r][b] is not None:
                    flat = flat + residual[r][b]
                n = flat.numel()
                k = splits[step][b] if splits else max(1, min(n, math.ceil(density * n - 1e-9)))
                idx = torch.topk(flat.abs(), k, sorted=False).indices
                sent = torch.zeros_like(flat)
                sent[idx] = flat[idx]
                keep = flat.clone()
                keep[idx] = 0
                residual[r][b] = keep
                total[b] += sent
        for ps, t in zip(buckets, total):
            avg = t / world
            offset = 0
            for p in ps:
                p.grad = avg[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def sparse_executor_vs_reference(ctx, model_name: str, cases: list[dict], steps: int, batch_size: int) -> list[dict]:
    """Per case (planner, density, pack, optionally topk_scope): ``steps`` SGD steps with SparseExecutor
    executing the plan the planner makes of ``model_name``'s layers; returns the parameters, the plan's
    bucket count, its topk_scope, the executor's split of each step and the largest difference to
    :func:`_reference_sparse_sgd` given those splits (and to the same without error feedback)."""
    from repro.core.cost import CostModel
    from repro.core.planners import make_plan
    from repro.families.sparse.executor import SparseExecutor
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.use_deterministic_algorithms(True)
    world, rank = dist.get_world_size(), dist.get_rank()
    cost = CostModel.linear(world, 1e-4, 1e-9, "sparse_allgather").with_topk(2e-9)
    out = []
    for case in cases:
        torch.manual_seed(0)
        model = build_model(model_name)
        scope = {"topk_scope": case["topk_scope"]} if "topk_scope" in case else {}
        plan = make_plan(case["planner"], _synthetic_trace(model, model_name), cost, density=case["density"],
                         pack=case.get("pack", False), **scope)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        ex = SparseExecutor(model, plan)
        gen = torch.Generator().manual_seed(100 + rank)
        splits = []  # the entries each bucket sent, per step (they move between buckets under topk_scope "model")
        for _ in range(steps):
            splits.append(ex.split)
            x, y = make_batch(model_name, batch_size, generator=gen)
            opt.zero_grad(set_to_none=True)
            ex.before_forward()
            compute_loss(model_name, ex.module, x, y).backward()
            ex.after_backward()
            opt.step()
        ex.remove()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        ref = _reference_sparse_sgd(model_name, plan, world, steps, batch_size, case["density"], splits=splits)
        row = {"params": params, "buckets": plan.num_buckets, "messages": len(plan.buckets[0].messages),
               "diff": max((params[n] - ref[n]).abs().max().item() for n in params), "splits": splits,
               "topk_scope": plan.option("topk_scope", "bucket")}
        if case.get("control"):
            no_ef = _reference_sparse_sgd(model_name, plan, world, steps, batch_size, case["density"],
                                          error_feedback=False)
            row["diff_without_error_feedback"] = max((params[n] - no_ef[n]).abs().max().item() for n in params)
        out.append(row)
    return out


def sparse_suite(ctx, cases: list[dict], runs: list[dict], model_name: str = "tiny_resnet") -> dict:
    """What tests/test_runtime_sparse.py needs from one 2-rank world: the executor cases and train runs."""
    return {"cases": sparse_executor_vs_reference(ctx, model_name, cases, steps=3, batch_size=4),
            "runs": train_params(ctx, runs)}
