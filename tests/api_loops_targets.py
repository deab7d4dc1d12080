"""Rank functions for tests/test_api_loops.py: the loops DDP users write (gradient accumulation through
``no_sync``, unused parameters, mixed-dtype models, autocast, torch.compile, DDP with a plan's buckets),
through ``repro.distribute`` and through PyTorch DDP on the same data (module-level, so spawned ranks
import them)."""

from __future__ import annotations

import contextlib
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn

from tests.api_targets import UserNet, _batches, _max_diff, _state


def _sgd(params, **kw):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, **kw)


def _guarded(fn, *args) -> dict:
    """``fn(*args)``, or the error it raised as a row (so that one part's failure names itself)."""
    try:
        return {"rows": fn(*args)}
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails naming it
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}


# ---------------------------------------------------------------- gradient accumulation (no_sync)

def _accumulate(model, opt, data, micro: int, set_to_none: bool = True) -> None:
    """The DDP user's accumulation loop: ``micro`` micro-batches per step, the first ``micro - 1``
    backward passes inside ``model.no_sync()``; then an evaluation forward (DDP broadcasts the buffers
    before it; so does the door)."""
    loss_fn = nn.CrossEntropyLoss()
    for start in range(0, len(data), micro):
        opt.zero_grad(set_to_none=set_to_none)
        chunk = data[start:start + micro]
        for x, y in chunk[:-1]:
            with model.no_sync():
                (loss_fn(model(x), y) / micro).backward()
        x, y = chunk[-1]
        (loss_fn(model(x), y) / micro).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        model(data[0][0])
    model.train()


def _no_sync_rows(cases: list[dict], steps: int, micro: int) -> list[dict]:
    import repro

    data = _batches(dist.get_rank(), steps * micro)
    out = []
    for case in cases:
        case = dict(case)
        set_to_none = case.pop("set_to_none", True)
        torch.manual_seed(0)
        ref = UserNet()
        ddp = nn.parallel.DistributedDataParallel(ref)
        _accumulate(ddp, _sgd(ddp.parameters()), data, micro, set_to_none)
        torch.manual_seed(0)
        net = UserNet()
        model, dopt = repro.distribute(net, _sgd(net.parameters()), **case)
        _accumulate(model, dopt, data, micro, set_to_none)
        dopt.flush()
        out.append({"case": case, "set_to_none": set_to_none, "diff": _max_diff(_state(net), _state(ref)),
                    "family": dopt.plan.family if dopt.plan is not None else None, "warming_up": dopt.warming_up})
        dopt.remove()
    return out


def _step_inside_no_sync(case: dict) -> str:
    import repro

    torch.manual_seed(0)
    net = UserNet()
    model, dopt = repro.distribute(net, _sgd(net.parameters()), **case)
    x, y = _batches(dist.get_rank(), 1)[0]
    try:
        with model.no_sync():
            nn.CrossEntropyLoss()(model(x), y).backward()
            dopt.step()
    except ValueError as e:
        return str(e)
    finally:
        dopt.remove()
    return "accepted"


# ---------------------------------------------------------------- unused parameters

class BranchNet(nn.Module):
    """A trunk and two heads: ``left`` always used, ``right`` only when asked, ``never`` never."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 16)
        self.left = nn.Linear(16, 4)
        self.right = nn.Linear(16, 4)
        self.never = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, use_right: bool = True) -> torch.Tensor:
        h = torch.tanh(self.trunk(x))
        out = self.left(h)
        return out + self.right(h) if use_right else out


def _uses_right(step: int, rank: int) -> bool:
    """``right`` on every rank (step 0 mod 3), on rank 1 only (1 mod 3), on no rank (2 mod 3)."""
    return step % 3 == 0 or (step % 3 == 1 and rank == 1)


def _branch_train(model, opt, data) -> None:
    loss_fn = nn.CrossEntropyLoss()
    rank = dist.get_rank()
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        loss_fn(model(x, _uses_right(i, rank)), y).backward()
        opt.step()


def _branch_batches(rank: int, steps: int):
    g = torch.Generator().manual_seed(500 + rank)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(steps)]


def _unused_rows(cases: list[dict], steps: int) -> list[dict]:
    import repro

    data = _branch_batches(dist.get_rank(), steps)
    torch.manual_seed(0)
    ref = BranchNet()
    never0 = ref.never.weight.detach().clone()
    ddp = nn.parallel.DistributedDataParallel(ref, find_unused_parameters=True)
    _branch_train(ddp, _sgd(ddp.parameters(), weight_decay=1e-2), data)
    out = []
    for case in cases:
        torch.manual_seed(0)
        net = BranchNet()
        model, dopt = repro.distribute(net, _sgd(net.parameters(), weight_decay=1e-2), **case)
        _branch_train(model, dopt, data)
        dopt.flush()
        out.append({"case": case, "diff": _max_diff(_state(net), _state(ref)),
                    "family": dopt.plan.family if dopt.plan is not None else None,
                    "never_moved": float((net.never.weight - never0).abs().max()),
                    "ddp_never_moved": float((ref.never.weight - never0).abs().max())})
        dopt.remove()
    return out


# ---------------------------------------------------------------- mixed dtypes

class MixedNet(nn.Module):
    """float32, bfloat16 and float16 layers in one model (each layer computes in its own dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 16).to(torch.bfloat16)
        self.c = nn.Linear(16, 16).to(torch.float16)
        self.d = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        h = torch.tanh(self.b(h.to(torch.bfloat16)))
        h = torch.tanh(self.c(h.to(torch.float16)))
        return self.d(h.float())


def _mixed_train(model, opt, data) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def _mixed_rows(cases: list[dict], steps: int) -> list[dict]:
    import repro
    from repro.plan import Plan
    from repro.workload.layers import layer_parameters

    data = _branch_batches(dist.get_rank(), steps)
    torch.manual_seed(0)
    ref = MixedNet()
    ddp = nn.parallel.DistributedDataParallel(ref)
    _mixed_train(ddp, _sgd(ddp.parameters()), data)
    out = []
    for case in cases:
        case = dict(case)
        torch.manual_seed(0)
        net = MixedNet()
        if case.get("scheduler") == "one_bucket":  # every dtype in one bucket, backward order
            names = list(layer_parameters(net, "tensor"))[::-1]
            case["scheduler"] = Plan.from_dict({"solver": "syncea", "buckets": [names],
                                                **({"wire_dtype": case.pop("wire_dtype")} if "wire_dtype" in case
                                                   else {})})
        model, dopt = repro.distribute(net, _sgd(net.parameters()), **case)
        _mixed_train(model, dopt, data)
        dopt.flush()
        flat = torch.cat([p.detach().double().reshape(-1) for p in net.parameters()])
        everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, flat)
        plan = dopt.plan
        out.append({"case": {k: v for k, v in case.items() if k != "scheduler"} | {"plan": plan.solver},
                    "diff": _max_diff(_state(net), _state(ref)), "buckets": plan.num_buckets,
                    "grad_dtypes_ok": all(p.grad is None or p.grad.dtype == p.dtype for p in net.parameters()),
                    "replicas_agree": max(float((e - flat).abs().max()) for e in everyone)})
        dopt.remove()
    return out


# ---------------------------------------------------------------- autocast

def _autocast_train(model, opt, data, dtype, scaler) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for x, y in data:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()


def _autocast_rows(cases: list[dict], steps: int) -> list[dict]:
    import repro

    data = _batches(dist.get_rank(), steps)
    out = []
    for case in cases:
        case = dict(case)
        dtype = getattr(torch, case.pop("dtype"))
        use_scaler = case.pop("grad_scaler", False)

        def scaler():
            return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2) if use_scaler else None

        torch.manual_seed(0)
        ref = UserNet()
        ddp = nn.parallel.DistributedDataParallel(ref)
        _autocast_train(ddp, _sgd(ddp.parameters()), data, dtype, scaler())
        torch.manual_seed(0)
        net = UserNet()
        s = scaler()
        model, dopt = repro.distribute(net, _sgd(net.parameters()), **case, **({"grad_scaler": s} if s else {}))
        _autocast_train(model, dopt, data, dtype, s)
        dopt.flush()
        out.append({"case": case, "dtype": str(dtype), "grad_scaler": use_scaler,
                    "diff": _max_diff(_state(net), _state(ref)),
                    "family": dopt.plan.family if dopt.plan is not None else None})
        dopt.remove()
    return out


def loops_vs_ddp(ctx, parts: dict) -> dict:
    """Each part of ``parts`` (name -> keyword arguments of its rows function), its rows or its error."""
    torch.use_deterministic_algorithms(True)
    fns = {"no_sync": _no_sync_rows, "unused": _unused_rows, "mixed": _mixed_rows, "autocast": _autocast_rows}
    out = {name: _guarded(fns[name], *kw) for name, kw in parts.items() if name in fns}
    if "step_inside_no_sync" in parts:
        out["step_inside_no_sync"] = _step_inside_no_sync(*parts["step_inside_no_sync"])
    return out


# ---------------------------------------------------------------- torch.compile

class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def compile_vs_ddp(ctx, cases: list[dict], steps: int, backend: str) -> list[dict]:
    """Per case (``order``: ``"before"`` = ``distribute(torch.compile(net))``, ``"after"`` =
    ``torch.compile(model)`` of the returned model; plus distribute keywords): parameters after ``steps``
    steps against eager DDP, and against the same model compiled and trained alone on the mean of the
    ranks' batches? No: against eager local training of the compiled model's reference (the compiler's
    own numerical difference, measured here: ``compile_noise``)."""
    import repro

    data = _branch_batches(dist.get_rank(), steps)
    loss_fn = nn.CrossEntropyLoss()

    def train(model, opt):
        for x, y in data:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    torch.manual_seed(0)
    ref = SmallNet()
    ddp = nn.parallel.DistributedDataParallel(ref)
    train(ddp, _sgd(ddp.parameters()))
    # the compiler's own numerical difference: the same DDP loop with the module compiled
    torch.manual_seed(0)
    ref_c = SmallNet()
    ddp_c = nn.parallel.DistributedDataParallel(torch.compile(ref_c, backend=backend))
    train(ddp_c, _sgd(ddp_c.parameters()))
    noise = _max_diff(_state(ref_c), _state(ref))
    out = []
    for case in cases:
        case = dict(case)
        order = case.pop("order")
        torch.manual_seed(0)
        net = SmallNet()
        opt = _sgd(net.parameters())
        if order == "before":
            model, dopt = repro.distribute(torch.compile(net, backend=backend), opt, **case)
        else:
            model, dopt = repro.distribute(net, opt, **case)
            model = torch.compile(model, backend=backend)
        train(model, dopt)
        dopt.flush()
        out.append({"case": case, "order": order, "diff": _max_diff(_state(net), _state(ref)),
                    "compile_noise": noise, "plan": dopt.plan.solver if dopt.plan is not None else None})
        dopt.remove()
    return out


# ---------------------------------------------------------------- the DDP bridge

class DeepNet(nn.Module):
    """Six linear layers of different widths: enough tensors for several buckets."""

    def __init__(self) -> None:
        super().__init__()
        widths = [8, 64, 32, 96, 16, 48, 4]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.tanh(x)
        return x


def _bridge_plan(model: nn.Module, sizes: list[int]):
    """A plan with buckets of ``sizes`` consecutive tensors in backward order."""
    from repro.plan import Plan
    from repro.workload.layers import layer_parameters

    names = list(layer_parameters(model, "tensor"))[::-1]
    buckets, i = [], 0
    for n in sizes:
        buckets.append(names[i:i + n])
        i += n
    assert i == len(names)
    return Plan.from_dict({"solver": "custom", "buckets": buckets})


def ddp_bridge(ctx, sizes: list[int], wrong_sizes: list[int], find_unused: bool) -> dict:
    """DDP built with ``ddp_bucket_caps`` of a plan trains 3 steps; its buckets are checked against
    that plan (``ok``: no error) and against another plan (the error's line); its parameters are
    compared with default DDP's (the bucketing must not change the math)."""
    import repro

    data = _branch_batches(dist.get_rank(), 3)
    loss_fn = nn.CrossEntropyLoss()

    def train(model, opt):
        for x, y in data:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    torch.manual_seed(0)
    net = DeepNet()
    plan = _bridge_plan(net, sizes)
    caps = repro.ddp_bucket_caps(plan, net, find_unused_parameters=find_unused)
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb_list=caps, find_unused_parameters=find_unused)
    train(ddp, _sgd(ddp.parameters()))
    out: dict = {"caps": caps, "buckets": len(ddp.reducer._get_zeros_like_grad_buckets())}
    try:
        repro.check_ddp_buckets(ddp, plan)
        out["ok"] = "ok"
    except ValueError as e:
        out["ok"] = str(e)
    try:
        repro.check_ddp_buckets(ddp, _bridge_plan(net, wrong_sizes))
        out["wrong"] = "accepted"
    except ValueError as e:
        out["wrong"] = str(e)
    torch.manual_seed(0)
    ref = DeepNet()
    ddp_ref = nn.parallel.DistributedDataParallel(ref, find_unused_parameters=find_unused)
    train(ddp_ref, _sgd(ddp_ref.parameters()))
    out["diff"] = _max_diff(_state(net), _state(ref))
    return out


# ---------------------------------------------------------------- measuring what compile does to overlap

def hook_times(ctx, compiled: str, steps: int, width: int, depth: int) -> dict:
    """For ``compiled`` in ``eager``, ``compile`` (torch.compile, inductor) or ``compiled_autograd``:
    per step, when (after the backward's start) the all-reduce executor's gradient hooks fired, when the
    backward call returned, and when the exchange finished (``optimizer.step()`` done), in seconds; the
    median over ``steps`` steps after two warm-up steps."""
    import repro
    from repro.plan import Plan
    from repro.workload.layers import layer_parameters

    torch.manual_seed(0)
    layers = [nn.Linear(width, width) for _ in range(depth)]
    net = nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())])
    names = list(layer_parameters(net, "tensor"))[::-1]
    plan = Plan.from_dict({"solver": "wfbp", "buckets": [[n] for n in names]})  # one message per tensor
    model, dopt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=1e-3), scheduler=plan)
    if compiled in ("compile", "compiled_autograd"):
        model = torch.compile(model)
    ex = dopt._door.ex
    x = torch.randn(64, width)
    rows = []
    ctx_ca = contextlib.nullcontext()
    if compiled == "compiled_autograd":
        import torch._dynamo.config as dcfg

        ctx_ca = dcfg.patch(compiled_autograd=True)
    with ctx_ca:
        for step in range(steps + 2):
            dopt.zero_grad()
            loss = model(x).square().mean()
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            dopt.step()
            t2 = time.perf_counter()
            ready = sorted(ex.grad_ready_s.values())
            if step >= 2:
                rows.append({"first_hook_s": ready[0] - t0, "last_hook_s": ready[-1] - t0, "backward_s": t1 - t0,
                             "step_s": t2 - t0, "hooks": len(ready)})
    dopt.remove()
    import statistics

    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}
