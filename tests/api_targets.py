"""Rank functions for tests/test_api.py: a user's own model (not in the registry), trained through
``repro.distribute`` and through PyTorch DDP on the same data (module-level, so spawned ranks import it)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class UserNet(nn.Module):
    """A small convolutional network of the kind a user writes: conv, batch norm, pooling, two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 16, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _batches(rank: int, steps: int, batch: int = 8):
    g = torch.Generator().manual_seed(1000 + rank)  # every rank its own data, the same in every run
    return [(torch.randn(batch, 3, 12, 12, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def _train(model: nn.Module, opt: torch.optim.Optimizer, data) -> list[float]:
    """The user's loop, unchanged; returns the losses."""
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().double() for k, v in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def distribute_vs_ddp(ctx, cases: list[dict], steps: int) -> list[dict]:
    """Per case (``scheduler`` + distribute keywords): the largest difference of the parameters and
    buffers after ``steps`` steps against DDP on the same data, the plan's bucket count, and whether
    the returned optimizer is a torch Optimizer."""
    import repro

    torch.use_deterministic_algorithms(True)
    data = _batches(dist.get_rank(), steps)
    torch.manual_seed(0)
    ref = UserNet()
    ddp = nn.parallel.DistributedDataParallel(ref)
    _train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), data)
    reference = _state(ref)
    out = []
    for case in cases:
        torch.manual_seed(0)
        net = UserNet()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        model, dopt = repro.distribute(net, opt, **case)
        _train(model, dopt, data)
        dopt.flush()
        plan = dopt.plan
        out.append({"case": case, "diff": _max_diff(_state(net), reference),
                    "buckets": plan.num_buckets if plan is not None else None,
                    "family": plan.family if plan is not None else None,
                    "is_optimizer": isinstance(dopt, torch.optim.Optimizer), "warming_up": dopt.warming_up})
        dopt.remove()
    return out


def distribute_runs(ctx, cases: list[dict], steps: int) -> list[dict]:
    """Per case: trains ``steps`` steps on one repeated batch and reports the loss before and after, the plan's family and
    bucket count, and whether the ranks' parameters agree (for methods that change the math)."""
    import repro

    data = _batches(dist.get_rank(), 1) * steps  # one batch again and again: a loss that must fall
    loss_fn = nn.CrossEntropyLoss()
    out = []
    for case in cases:
        torch.manual_seed(0)
        net = UserNet()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        model, dopt = repro.distribute(net, opt, **case)
        losses = []
        for x, y in data:
            dopt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            dopt.step()
            losses.append(float(loss.detach()))
        dopt.flush()
        flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, flat)
        out.append({"case": case, "first_loss": losses[0], "last_loss": losses[-1],
                    "family": dopt.plan.family if dopt.plan is not None else None,
                    "buckets": dopt.plan.num_buckets if dopt.plan is not None else None,
                    "replicas_agree": max(float((e - flat).abs().max()) for e in everyone)})
        dopt.remove()
    return out


def lr_scheduler_and_state(ctx) -> dict:
    """An LR scheduler steps the returned optimizer; its state_dict is the wrapped optimizer's."""
    import repro

    torch.manual_seed(0)
    net = UserNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, dopt = repro.distribute(net, opt, scheduler="wfbp", warmup_steps=1)
    sched = torch.optim.lr_scheduler.StepLR(dopt, step_size=1, gamma=0.5)
    _train(model, dopt, _batches(dist.get_rank(), 3))
    for _ in range(3):
        sched.step()
    state = dopt.state_dict()
    out = {"lr": dopt.param_groups[0]["lr"], "inner_lr": opt.param_groups[0]["lr"],
           "momentum_buffers": sum("momentum_buffer" in s for s in state["state"].values())}
    dopt.remove()
    return out


def _amp_train(model, opt, scaler, data, inf_steps, clip: bool, synchronize) -> list[float]:
    """The user's GradScaler loop; on ``inf_steps`` rank 1's loss is inf (its gradient inf/nan)."""
    loss_fn = nn.CrossEntropyLoss()
    scales = []
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if i in inf_steps and dist.get_rank() == 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        if clip:
            synchronize()  # DDP: nothing to do; repro: finish the exchange first (Horovod's rule)
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 0.5)
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
    return scales


def amp_vs_ddp(ctx, cases: list[dict], steps: int, inf_steps: list[int]) -> list[dict]:
    """Per case (distribute keywords + ``clip``): parameters and the scale history after ``steps``
    GradScaler steps, against DDP + GradScaler on the same data and the same inf steps."""
    import repro

    torch.use_deterministic_algorithms(True)
    data = _batches(dist.get_rank(), steps)
    out = []
    for case in cases:
        case = dict(case)
        clip = case.pop("clip", False)
        torch.manual_seed(0)
        ref = UserNet()
        ddp = nn.parallel.DistributedDataParallel(ref)
        ref_scales = _amp_train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9),
                                torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2), data,
                                inf_steps, clip, lambda: None)
        torch.manual_seed(0)
        net = UserNet()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
        model, dopt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                                       grad_scaler=scaler, **case)
        scales = _amp_train(model, dopt, scaler, data, inf_steps, clip, dopt.synchronize)
        dopt.flush()
        out.append({"case": case, "clip": clip, "diff": _max_diff(_state(net), _state(ref)),
                    "scales": scales, "ref_scales": ref_scales, "family": dopt.plan.family if dopt.plan else None})
        dopt.remove()
    return out


def resume_bit_exact(ctx, cases: list[dict], steps: int, cut: int) -> list[dict]:
    """Per case: a run of ``steps`` steps that writes a checkpoint (model, then optimizer state_dict,
    copied as torch.save would) after ``cut`` steps and goes on; then a fresh model, optimizer and
    distribute load that checkpoint and do the rest: the largest difference to the run that went on
    (the same run, so the same online plan; an independent run may plan differently). A ``scheduler``
    given as a dict is a plan (``Plan.to_dict()``: a Plan does not pickle)."""
    import copy

    import repro
    from repro.core.plan import Plan

    torch.use_deterministic_algorithms(True)
    data = _batches(dist.get_rank(), steps)
    out = []
    for given in cases:
        case = dict(given)
        if isinstance(case["scheduler"], dict):
            case["scheduler"] = Plan.from_dict(case["scheduler"])
        torch.manual_seed(0)
        first = UserNet()
        model, dopt = repro.distribute(first, torch.optim.SGD(first.parameters(), lr=0.05, momentum=0.9), **case)
        _train(model, dopt, data[:cut])
        checkpoint = {"model": copy.deepcopy(first.state_dict())}  # saved one after the other, model first,
        checkpoint["optimizer"] = copy.deepcopy(dopt.state_dict())  # as two torch.save calls would
        _train(model, dopt, data[cut:])
        dopt.flush()
        went_on = _state(first)
        dopt.remove()

        def resume(optimizer_state: dict) -> float:
            torch.manual_seed(123)  # a fresh process would start from other weights: the checkpoint decides
            second = UserNet()
            second.load_state_dict(checkpoint["model"])
            model, dopt = repro.distribute(second, torch.optim.SGD(second.parameters(), lr=0.05, momentum=0.9),
                                           **case)
            dopt.load_state_dict(optimizer_state)
            _train(model, dopt, data[cut:])
            dopt.flush()
            dopt.remove()
            return _max_diff(_state(second), went_on)

        executor = checkpoint["optimizer"]["repro"]["executor"]
        row = {"case": given, "diff": resume(checkpoint["optimizer"]), "has_residuals": bool(executor.get("residuals")),
               "split": executor.get("split")}
        if row["split"] is not None:  # the sparse split (topk_scope "model"): resuming without it differs
            without = copy.deepcopy(checkpoint["optimizer"])
            del without["repro"]["executor"]["split"]
            row["diff_without_split"] = resume(without)
        out.append(row)
    return out


def step_after_remove(ctx) -> str:
    import repro

    torch.manual_seed(0)
    net = UserNet()
    model, dopt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.05), scheduler="dear_threshold",
                                   warmup_steps=1)
    _train(model, dopt, _batches(dist.get_rank(), 2))
    dopt.remove()
    dopt.remove()  # twice: nothing
    try:
        _train(model, dopt, _batches(dist.get_rank(), 1))
    except ValueError as e:
        return str(e)
    return "accepted"
