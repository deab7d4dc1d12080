"""Rank functions for tests/test_ps_conformance.py: the parameter-server family through
``repro.distribute`` in the loops DDP users write, against PyTorch DDP (BSP) or a written reference
(ASP/SSP/OSP) on the same data (module level, so spawned ranks import them by name).

A case is a dict:

- ``model``: ``user`` (tests/api_targets.UserNet: conv, batch norm, linears), ``branch`` (a trunk and
  two heads, ``right`` used on some steps and ranks only, ``never`` never: :func:`uses_right`), ``attn``
  (an embedding, ``nn.MultiheadAttention`` and an output layer tied to the embedding);
- ``optimizer``: ``sgd`` (momentum 0.9, weight decay 1e-2), ``nesterov``, ``adamw``, ``plain`` (SGD
  without momentum or weight decay), ``groups`` (two parameter groups with their own lr and weight
  decay); ``frozen``: the first layer's bias does not require a gradient;
- ``loop``: ``plain``, ``lambda_lr`` (a LambdaLR stepped after every step), ``manual_hp`` (lr and
  weight decay of every group set by hand before steps 2 and 4), ``clip`` (``synchronize()`` then
  ``clip_grad_norm_`` before the step; DDP: the clip alone), ``clip_unsync`` (the clip without
  ``synchronize()``: expected refused), ``bf16`` (autocast), ``fp16_scaler`` (autocast float16 and a
  GradScaler given to distribute; with ``scaler_given`` False, or dedicated servers, not given:
  expected refused), ``fp16_scaler_clip`` (``synchronize()``, ``scaler.unscale_``, then the clip);
- ``mode``: the plan's ``bsp``/``asp``/``ssp``/``osp``, with ``staleness``, ``share`` (OSP's stage-1
  share), ``lgp``; ``servers`` (co-located: one per rank by default); ``dedicated``: that many serving
  ranks (3-rank world).

Plans are made here from the model's sizes (no warm-up, so every step runs on the parameter server);
:func:`checkpoint_rows` also plans online (``ps_bsp`` with a one-step warm-up).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from tests.api_loops_targets import BranchNet  # a trunk and three heads: left always, right when asked, never never
from tests.api_targets import UserNet

STEPS = 6


# ---------------------------------------------------------------------------------------------
# models, data, optimizers
# ---------------------------------------------------------------------------------------------

class AttnNet(nn.Module):
    """Tokens -> embedding -> self-attention -> mean over the sequence -> logits, the output layer's
    weight tied to the embedding's (one parameter used twice)."""

    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.out = nn.Linear(dim, vocab)
        self.out.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.out(h.mean(dim=1))


def uses_right(step: int, rank: int) -> bool:
    """``right`` on every rank (step 0 mod 3), on rank 1 only (1 mod 3), on no rank (2 mod 3)."""
    return step % 3 == 0 or (step % 3 == 1 and rank == 1)


def make_model(case: dict) -> nn.Module:
    torch.manual_seed(0)
    kind = case.get("model", "user")
    model = {"user": UserNet, "branch": BranchNet, "attn": AttnNet}[kind]()
    if case.get("frozen"):
        first = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d)))
        first.bias.requires_grad_(False)
    return model


def batches(case: dict, worker: int, steps: int = STEPS) -> list:
    """Worker ``worker``'s batches (every worker its own data, the same in every run)."""
    g = torch.Generator().manual_seed(700 + worker)
    kind = case.get("model", "user")
    if kind == "branch":
        return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(steps)]
    if kind == "attn":
        return [(torch.randint(0, 11, (4, 5), generator=g), torch.randint(0, 11, (4,), generator=g))
                for _ in range(steps)]
    return [(torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(steps)]


def make_optimizer(case: dict, model: nn.Module) -> torch.optim.Optimizer:
    kind = case.get("optimizer", "sgd")
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05)
    if kind == "nesterov":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if kind == "plain":
        return torch.optim.SGD(params, lr=0.05)
    if kind == "groups":
        half = len(params) // 2
        return torch.optim.SGD([{"params": params[:half], "lr": 0.1, "weight_decay": 1e-2},
                                {"params": params[half:], "lr": 0.02}], lr=0.05, momentum=0.9)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-2)


def loss_of(case: dict, model: nn.Module, x, y, step: int, worker: int) -> torch.Tensor:
    if case.get("model") == "branch":
        return nn.functional.cross_entropy(model(x, uses_right(step, worker)), y)
    return nn.functional.cross_entropy(model(x), y)


def ps_plan(model: nn.Module, case: dict, workers: int):
    """A plan of the case's mode for ``model`` from its sizes (fixed costs: the same plan everywhere)."""
    from repro.core.cost import CostModel, Linear
    from repro.core.planners import make_plan
    from repro.core.trace import Layer, Trace
    from repro.workload.layers import layer_parameters

    layers = []
    for name, params in layer_parameters(model, "tensor").items():
        n = sum(p.numel() for _, p in params)
        layers.append(Layer(name, n, 4 * n, 1e-4, 1e-4 + 2e-8 * n))
    trace = Trace(type(model).__name__, 8, "cpu", "float32", layers)
    cost = CostModel(workers, {"push": Linear(1e-4, 1e-9), "pull": Linear(1e-4, 1e-9)})
    mode, servers = case.get("mode", "bsp"), case.get("servers", case.get("dedicated") or workers)
    if mode == "osp":
        return make_plan("osp", trace, cost, servers=servers, stage1_share=case.get("share", 0.5),
                         importance="position", lgp=case.get("lgp", True))
    if mode == "ssp":
        return make_plan("ps_ssp", trace, cost, servers=servers, staleness=case.get("staleness", 1))
    return make_plan(f"ps_{mode}", trace, cost, servers=servers)


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().double() for n, p in model.named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------

def train(case: dict, model: nn.Module, opt, data, worker: int, *, synchronize=None, scaler=None) -> list[float]:
    """The user's loop for ``case["loop"]``; ``synchronize``: the distributed optimizer's (None under
    DDP, where the gradients are averaged when backward returns). Returns the learning rates used."""
    loop = case.get("loop", "plain")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s)) if loop == "lambda_lr" else None
    lrs = []
    for step, (x, y) in enumerate(data):
        if loop == "manual_hp" and step in (2, 4):
            for k, group in enumerate(opt.param_groups):
                group["lr"] = 0.03 * (k + 1) * step
                group["weight_decay"] = 0.1 / step
        opt.zero_grad()
        lrs.append(opt.param_groups[0]["lr"])
        if loop in ("bf16", "fp16_scaler", "fp16_scaler_clip"):
            with torch.autocast("cpu", dtype=torch.bfloat16 if loop == "bf16" else torch.float16):
                loss = loss_of(case, model, x, y, step, worker)
        else:
            loss = loss_of(case, model, x, y, step, worker)
        if scaler is not None:
            scaler.scale(loss).backward()
            if loop == "fp16_scaler_clip":
                if synchronize is not None:
                    synchronize()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            scaler.step(opt)
            scaler.update()
            continue
        loss.backward()
        if loop in ("clip", "clip_unsync"):
            if synchronize is not None and loop == "clip":
                synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        if sched is not None:
            sched.step()
    return lrs


def _scaler(case: dict):
    if not case.get("loop", "").startswith("fp16_scaler"):
        return None
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)


def ddp_run(case: dict, group=None, worker: int | None = None) -> dict[str, torch.Tensor]:
    """The case under PyTorch DDP (``find_unused_parameters`` for the branch model) on ``group``."""
    worker = dist.get_rank(group) if worker is None else worker
    model = make_model(case)
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group,
                                              find_unused_parameters=case.get("model") == "branch")
    opt = make_optimizer(case, model)
    train(case, ddp, opt, batches(case, worker), worker, scaler=_scaler(case))
    return params_of(model)


def repro_run(case: dict, workers: int, worker: int) -> dict:
    """The case through ``repro.distribute``: final (flushed) parameters, or the refusal's text."""
    import repro

    model = make_model(case)
    start = params_of(model)
    opt = make_optimizer(case, model)
    kwargs = {"dedicated_servers": case["dedicated"]} if case.get("dedicated") else {}
    scaler = _scaler(case)
    if scaler is not None and not case.get("dedicated") and case.get("scaler_given", True):
        kwargs["grad_scaler"] = scaler   # dedicated servers take none: a scaler stepping them is refused
    net, dopt = repro.distribute(model, opt, scheduler=ps_plan(model, case, workers), **kwargs)
    if dopt.serving:
        return {"serving": True}
    out: dict = {"serving": False, "start": start}
    try:
        train(case, net, dopt, batches(case, worker), worker, synchronize=dopt.synchronize, scaler=scaler)
    except ValueError as e:
        out["refused"] = str(e)
        dopt.remove()
        return out
    dopt.flush()
    out["params"] = params_of(model)
    out["grads_none"] = sorted(n for n, p in model.named_parameters() if p.grad is None)
    dopt.remove()
    return out


# ---------------------------------------------------------------------------------------------
# written references (one process, every worker's gradient computed in turn)
# ---------------------------------------------------------------------------------------------

def lockstep_reference(case: dict, workers: int) -> dict[str, torch.Tensor]:
    """Co-located ASP / SSP(s) / OSP (no LGP) from the math, for plain SGD or any optimizer:

    - ASP / SSP(s): iteration ``c`` computes every worker's gradient at ``W_{max(c - s, 0)}`` (s = 0 for
      ASP); then for worker i = 0..N-1 in turn one optimizer step with ``g_i(c) / N`` on the
      parameters worker i had a gradient for (the others get none: no update, no momentum);
    - OSP: stage-1 parameters at ``W_c``, stage-2 ones at ``W_{max(c - 1, 0)}``; one step with the
      average over the workers (zeros for a worker without a gradient; no gradient where none had one),
      with the hyperparameters of iteration ``c``.
    """
    from repro.families.ps.layout import ps_layout

    model = make_model(case)
    opt = make_optimizer(case, model)
    plan = ps_plan(model, case, workers)
    stage2 = {id(p) for b in ps_layout(model, plan, "tensor") if b.stage == 2 for p in b.params}
    mode = case["mode"]
    lag = case.get("staleness", 1) if mode == "ssp" else 0
    data = [batches(case, w) for w in range(workers)]
    probe = make_model(case)
    W = [params_of(model)]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s)) if case.get("loop") == "lambda_lr" \
        else None
    for c in range(STEPS):
        grads = []
        for w in range(workers):
            with torch.no_grad():
                for (n, p), q in zip(model.named_parameters(), probe.parameters()):
                    src = W[max(c - lag, 0)] if mode in ("asp", "ssp") else \
                        (W[max(c - 1, 0)] if id(p) in stage2 else W[c])
                    q.copy_(src[n].to(q.dtype))
            probe.zero_grad(set_to_none=True)
            x, y = data[w][c]
            loss_of(case, probe, x, y, c, w).backward()
            grads.append([None if q.grad is None else q.grad.detach().clone() for q in probe.parameters()])
        params = list(model.parameters())
        if mode in ("asp", "ssp"):
            for w in range(workers):
                for p, g in zip(params, grads[w]):
                    p.grad = None if g is None else g / workers
                opt.step()
        else:
            for i, p in enumerate(params):
                had = [g[i] for g in grads if g[i] is not None]
                p.grad = None if not had else sum(had) / workers
            opt.step()
        if sched is not None:
            sched.step()
        W.append(params_of(model))
    return W[-1]


# ---------------------------------------------------------------------------------------------
# suites (one launch each)
# ---------------------------------------------------------------------------------------------

def conformance_rows(ctx, cases: list[dict]) -> list[dict]:
    """Every case on every rank: the distributed run against DDP (``mode`` bsp, or ``ref`` ``ddp``) or
    the written reference (``ref`` ``lockstep``); per case the largest parameter difference, how far
    the ``never`` head moved (branch model), the refusal's text if refused."""
    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for case in cases:
        servers = case.get("dedicated", 0)
        group = dist.new_group(list(range(servers, world))) if servers else None  # every rank makes it
        mine = repro_run(case, world - servers, rank - servers)
        if mine["serving"]:
            out.append({"case": case, "serving": True})
            continue
        row = {"case": case, "refused": mine.get("refused"), "serving": False}
        if "params" in mine:
            ref_kind = case.get("ref", "ddp" if case.get("mode", "bsp") == "bsp" else None)
            if ref_kind == "ddp":
                row["diff"] = max_diff(mine["params"], ddp_run(case, group))
            elif ref_kind == "lockstep":
                row["diff"] = max_diff(mine["params"], lockstep_reference(case, world))
            row["moved"] = max_diff(mine["params"], mine["start"])
            if case.get("model") == "branch":
                row["never_moved"] = max(float((mine["params"][n] - mine["start"][n]).abs().max())
                                         for n in mine["params"] if n.startswith("never."))
                row["never_grad_none"] = all(n in mine["grads_none"] for n in mine["params"] if n.startswith("never."))
        out.append(row)
    return out


def checkpoint_rows(ctx, cases: list[dict], path: str) -> list[dict]:
    """Per case: a run of STEPS steps in which every rank calls ``optimizer.state_dict()`` after ``cut``
    steps and rank 0 saves it with the model's state (``torch.save``); then a fresh model (other
    weights), optimizer and distribute in which every rank loads both files (``load`` ``after``: into
    the returned optimizer; ``before``: into the wrapped optimizer before distribute) and trains the
    remaining steps (a dedicated server serves both runs). The largest difference to the uninterrupted
    run, how many parameters the saved dict holds state for, and ``partial``: the refusal of a state
    dict missing one server's part (the saved dict with the last server's entries removed)."""
    import repro
    from repro.families.ps.layout import ps_layout

    torch.use_deterministic_algorithms(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for case in cases:
        cut, online = case.get("cut", 3), case.get("online", False)
        kwargs = {"dedicated_servers": case["dedicated"]} if case.get("dedicated") else {}
        workers = world - case.get("dedicated", 0)
        worker = rank - case.get("dedicated", 0)

        def start(model):
            if online:
                return "ps_bsp", {"warmup_steps": 1}
            return ps_plan(model, case, workers), {}

        model = make_model(case)
        opt = make_optimizer(case, model)
        scheduler, extra = start(model)
        net, dopt = repro.distribute(model, opt, scheduler=scheduler, **extra, **kwargs)
        if dopt.serving:  # a dedicated server: served the first run; now the resumed one
            dist.barrier()
            model = make_model(case)
            opt = make_optimizer(case, model)
            if case.get("load") == "before":   # every rank loads, as the user's script does everywhere
                ckpt = torch.load(path, weights_only=False)
                model.load_state_dict(ckpt["model"])
                opt.load_state_dict(ckpt["optimizer"])
            scheduler, extra = start(model)
            repro.distribute(model, opt, scheduler=scheduler, **extra, **kwargs)
            out.append({"case": case, "serving": True})
            continue
        data = batches(case, worker)
        train(case, net, dopt, data[:cut], worker, synchronize=dopt.synchronize)
        opt_state = dopt.state_dict()          # every rank: a collective when the state is sharded
        if worker == 0:                        # then the first alone (the flush is done: no collective)
            torch.save({"model": model.state_dict(), "optimizer": opt_state}, path)
        train(case, net, dopt, data[cut:], worker, synchronize=dopt.synchronize)
        dopt.flush()
        went_on = params_of(model)
        plan = dopt.plan
        dopt.remove()
        dist.barrier()                         # every rank, servers too: the file is written

        ckpt = torch.load(path, weights_only=False)
        torch.manual_seed(123)
        model = make_model(case)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))   # other weights: the checkpoint decides
        opt = make_optimizer(case, model)
        if case.get("load") == "before":
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
        scheduler, extra = start(model)
        net, dopt = repro.distribute(model, opt, scheduler=scheduler, **extra, **kwargs)
        if case.get("load", "after") == "after":
            model.load_state_dict(ckpt["model"])
            dopt.load_state_dict(ckpt["optimizer"])
        train(case, net, dopt, data[cut:], worker, synchronize=dopt.synchronize)
        dopt.flush()
        row = {"case": case, "serving": False, "diff": max_diff(params_of(model), went_on),
               "saved_states": len(ckpt["optimizer"]["state"])}
        if case.get("partial"):
            last = max(b.server for b in ps_layout(model, plan, "tensor"))   # one server's shard removed
            owned = {id(p) for b in ps_layout(model, plan, "tensor") if b.server == last for p in b.params}
            index = {id(p): i for i, p in enumerate(p for g in dopt.param_groups for p in g["params"])}
            partial = copy.deepcopy(ckpt["optimizer"])
            for pid in owned:
                partial["state"].pop(index[pid], None)
            try:
                dopt.load_state_dict(partial)
                row["partial"] = "accepted"
            except ValueError as e:
                row["partial"] = str(e)
        dopt.remove()
        out.append(row)
    return out


def suite(ctx, parts: dict) -> dict:
    """Everything one launch runs: ``parts`` maps ``rows`` / ``checkpoint`` to their arguments."""
    out = {}
    if "rows" in parts:
        out["rows"] = conformance_rows(ctx, parts["rows"])
    if "checkpoint" in parts:
        out["checkpoint"] = checkpoint_rows(ctx, *parts["checkpoint"])
    return out
