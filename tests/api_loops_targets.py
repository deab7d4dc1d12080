"""Rank functions for tests/test_api_loops.py: the loops DDP users write (gradient accumulation through
``no_sync``, unused parameters, mixed-dtype models, autocast, torch.compile, DDP with a plan's buckets),
through ``repro.distribute`` and through PyTorch DDP on the same data (module-level, so spawned ranks
import them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from tests.api_targets import UserNet, _batches, _max_diff, _state


def _sgd(params, **kw):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, **kw)


# ---------------------------------------------------------------- gradient accumulation (no_sync)

def _plain_train(model, opt, data) -> None:
    """The ordinary loop: zero_grad, forward, cross-entropy, backward, step, per batch of ``data``."""
    loss_fn = nn.CrossEntropyLoss()
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()


def _accumulate(model, opt, data, micro: int, set_to_none: bool = True) -> None:
    """The DDP user's accumulation loop: ``micro`` micro-batches per step, the first ``micro - 1``
    backward passes inside ``model.no_sync()``. Buffers are compared as the last training forward
    left them: both broadcast them before every training forward; an evaluation forward differs (DDP's
    first one after training broadcasts again, the door's issues no collective: ranks may evaluate
    different numbers of batches, or rank 0 alone)."""
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
        mine, theirs = _state(net), _state(ref)
        if dist.get_rank() != 0:  # buffers: rank 0's are DDP's; the others' differ until the next forward
            params = {name for name, _ in net.named_parameters()}
            mine, theirs = ({k: v for k, v in d.items() if k in params} for d in (mine, theirs))
        out.append({"case": case, "set_to_none": set_to_none, "diff": _max_diff(mine, theirs),
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
                    "never_moved": float((net.never.weight.detach() - never0).abs().max()),
                    "ddp_never_moved": float((ref.never.weight.detach() - never0).abs().max())})
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
    from repro.core.plan import Plan
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
                    "wire_dtype": plan.wire_dtype,
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


def _rank0_evaluates_alone(cases: list[dict]) -> list[str]:
    """A few steps, then rank 0 alone evaluates (a common pattern): the door's evaluation forward must
    issue no collective, or rank 0 waits for a peer that never joins. Each case a watchdog-bounded
    evaluation on rank 0 ('ok', or what went wrong); every rank then meets at a barrier."""
    import threading

    import repro

    out = []
    data = _batches(dist.get_rank(), 3)
    for case in cases:
        torch.manual_seed(0)
        net = UserNet()
        model, dopt = repro.distribute(net, _sgd(net.parameters()), **case)
        loss_fn = nn.CrossEntropyLoss()
        for x, y in data:
            dopt.zero_grad()
            loss_fn(model(x), y).backward()
            dopt.step()
        dopt.flush()
        result = ["ok"]
        if dist.get_rank() == 0:
            def evaluate():
                try:
                    model.eval()
                    with torch.no_grad():
                        for x, _ in data:
                            model(x)
                    model.train()
                except Exception as e:  # noqa: BLE001 - reported
                    result[0] = f"{type(e).__name__}: {e}"
            t = threading.Thread(target=evaluate, daemon=True)
            t.start()
            t.join(20.0)
            if t.is_alive():
                result[0] = "rank 0's evaluation waited 20 s for a collective"
        out.append(result[0])
        dist.barrier()
        if result[0] == "ok":
            dopt.remove()
        else:  # a collective is pending on rank 0: give up on this rank's state (the launch then ends)
            break
    return out


def loops_vs_ddp(ctx, parts: dict) -> dict:
    """Each part of ``parts`` (name -> the arguments of its rows function): its rows. One launch for all
    (starting two ranks costs more than most parts); an error on a rank fails the launch, naming it."""
    torch.use_deterministic_algorithms(True)
    fns = {"no_sync": _no_sync_rows, "unused": _unused_rows, "mixed": _mixed_rows, "autocast": _autocast_rows}
    out = {name: {"rows": fns[name](*kw)} for name, kw in parts.items() if name in fns}
    if "step_inside_no_sync" in parts:
        out["step_inside_no_sync"] = _step_inside_no_sync(*parts["step_inside_no_sync"])
    if "compiled_dear" in parts:
        out["compiled_dear"] = _compiled_dear_refused()
    if "rank0_eval" in parts:
        out["rank0_eval"] = _rank0_evaluates_alone(*parts["rank0_eval"])
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
    """Per case (``order``: ``"before"`` = ``distribute(torch.compile(net), ...)``, ``"after"`` =
    ``torch.compile(model)`` of the model distribute returned; plus distribute keywords): the largest
    difference of the parameters after ``steps`` steps against eager DDP on the same data."""
    import repro

    data = _branch_batches(dist.get_rank(), steps)

    def train(model, opt):
        _plain_train(model, opt, data)

    torch.manual_seed(0)
    ref = SmallNet()
    ddp = nn.parallel.DistributedDataParallel(ref)
    train(ddp, _sgd(ddp.parameters()))
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
                    "plan": dopt.plan.solver if dopt.plan is not None else None})
        dopt.remove()
    return out


def _compiled_dear_refused() -> list[str]:
    """A DeAR plan with a compiled model: ``distribute(torch.compile(net))`` is refused at once;
    ``torch.compile`` of the returned model at the first step (the door's forward hook saw the trace)."""
    import repro
    from repro.core.plan import Bucket, Plan
    from repro.families.dear.planners import DEAR_MESSAGES, FAMILY
    from repro.workload.layers import layer_parameters

    out = []
    for order in ("before", "after"):
        torch.manual_seed(0)
        net = SmallNet()
        model = torch.compile(net, backend="eager") if order == "before" else net
        plan = Plan([Bucket(tuple(layer_parameters(model, "tensor")), DEAR_MESSAGES)], "dear_threshold",
                    family=FAMILY)
        try:
            model, dopt = repro.distribute(model, _sgd(model.parameters()), scheduler=plan)
            model = torch.compile(model, backend="eager")
            x, y = _branch_batches(dist.get_rank(), 1)[0]
            dopt.zero_grad()
            nn.CrossEntropyLoss()(model(x), y).backward()
            dopt.step()
            out.append("accepted")
        except ValueError as e:
            out.append(str(e))
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
    from repro.core.plan import Plan
    from repro.workload.layers import layer_parameters

    names = list(layer_parameters(model, "tensor"))[::-1]
    buckets, i = [], 0
    for n in sizes:
        buckets.append(names[i:i + n])
        i += n
    assert i == len(names)
    return Plan.from_dict({"solver": "custom", "buckets": buckets})


def _bridge_once(sizes: list[int], wrong_sizes: list[int], find_unused: bool) -> dict:
    import repro

    data = _branch_batches(dist.get_rank(), 3)

    def train(model, opt):
        _plain_train(model, opt, data)

    torch.manual_seed(0)
    net = DeepNet()
    plan = _bridge_plan(net, sizes)
    caps = repro.ddp_bucket_caps(plan, net, find_unused_parameters=find_unused)
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb_list=caps, find_unused_parameters=find_unused)
    train(ddp, _sgd(ddp.parameters()))
    out: dict = {"find_unused": find_unused, "caps": caps, "buckets": len(ddp.reducer._get_zeros_like_grad_buckets())}
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
    plain = nn.parallel.DistributedDataParallel(ref, find_unused_parameters=find_unused)  # DDP's own buckets
    train(plain, _sgd(plain.parameters()))
    try:
        repro.check_ddp_buckets(plain, plan)
        out["default_ddp"] = "accepted"
    except ValueError as e:
        out["default_ddp"] = str(e)
    out["diff"] = _max_diff(_state(net), _state(ref))
    return out


def ddp_bridge(ctx, sizes: list[int], wrong_sizes: list[int]) -> list[dict]:
    """For DDP with and without ``find_unused_parameters``: DDP built with ``ddp_bucket_caps`` of a plan
    (buckets of ``sizes`` tensors) trains 3 steps; its buckets are checked against that plan (``ok``),
    against a plan of ``wrong_sizes`` (``wrong``: the error's line), and default DDP's buckets against the
    plan (``default_ddp``); its parameters are compared with default DDP's (``diff``: bucketing must not
    change the math)."""
    return [_bridge_once(sizes, wrong_sizes, fu) for fu in (False, True)]


def ddp_threshold_buckets(ctx, threshold_bytes: int, steps: int = 3) -> dict:
    """tiny_bert (its prediction head, tied to the word embedding, is not ready in registration order)
    through ``distribute(scheduler="ddp_threshold")`` and through ``scheduler="threshold"`` (planned
    online from the measured order): DDP's buckets after its rebuild, and the threshold plan's, as
    lists of element counts in reduction order."""
    import repro
    from repro.families.allreduce.ddp_bridge import ddp_buckets
    from repro.workload.models import build_model, compute_loss, make_batch

    x, y = make_batch("tiny_bert", 4, generator=torch.Generator().manual_seed(dist.get_rank()))
    out = {}
    for name in ("ddp_threshold", "threshold"):
        torch.manual_seed(0)
        net = build_model("tiny_bert")
        model, opt = repro.distribute(net, _sgd(net.parameters()), scheduler=name, warmup_steps=2,
                                      threshold_bytes=threshold_bytes)
        for _ in range(steps):
            opt.zero_grad()
            compute_loss("tiny_bert", model, x, y).backward()
            opt.step()
        opt.flush()
        if name == "ddp_threshold":
            out[name] = [sum(p.numel() for p in b) for b in ddp_buckets(model)]
        else:
            params = dict(net.named_parameters())
            out[name] = [sum(params[n].numel() for n in b.layers) for b in opt.plan.buckets]
        opt.remove()
    return out
