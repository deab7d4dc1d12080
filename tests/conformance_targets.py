"""Rank functions of the DDP conformance matrix (tests/test_conformance.py): models a user writes (not
this package's), loops a DDP user writes, and per (model, loop) the parameters and buffers after the run
through ``repro.distribute`` against ``DistributedDataParallel`` from the same seed on the same data.

Module-level so that spawned ranks import it. Nothing here imports the package's models or training
loop: the point of the matrix is code the package has never seen.

Models
    ``cnn``: conv + BatchNorm + pooling + linears (buffers that DDP broadcasts);
    ``gpt``: token and position embeddings, a pre-norm block with ``nn.MultiheadAttention`` (whose
    ``out_proj`` forward is never called) and an MLP, the output projection tied to the token embedding
    through ``F.linear(h, self.tok.weight)``;
    ``branch``: two heads, the second used on some steps only, and on some of them by one rank only;
    ``functional``: a parameter used in the parent's forward (``x @ self.scale``), a Linear called twice.

Loops (``loop`` names; every one also steps plain SGD unless it says otherwise)
    ``plain``, ``lr_schedule`` (a per-step LambdaLR, ``sched.step()`` after ``opt.step()``),
    ``hyper`` (weight decay and momentum changed by hand mid-run), ``clip`` (``clip_grad_norm_`` of the
    model's parameters between backward and step), ``clip_opt`` (``optimizer.clip_grad_norm_``),
    ``adamw``, ``groups_frozen`` (two param groups with their own lr, a frozen parameter), ``eval``
    (evaluation mid-training), ``no_grad_forward`` (a forward under ``torch.no_grad()`` in train mode), ``no_sync`` (accumulation of 2 micro-batches), ``bf16`` (autocast),
    ``fp16_scaler`` (autocast + GradScaler), ``checkpoint`` (rank 0 saves model and optimizer state after
    half the steps, every rank loads it into a fresh model and optimizer and goes on).
"""

from __future__ import annotations

import os
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STEPS = 6
BATCH = 4


# ------------------------------------------------------------------------------------------ models

class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                                  nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.fc1 = nn.Linear(32, 16)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(self.body(x).flatten(1))))


class GPT(nn.Module):
    def __init__(self, vocab: int = 17, dim: int = 16, ctx: int = 6) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.lnf = nn.LayerNorm(dim)
        self.register_buffer("mask", torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        a = self.ln1(h)
        h = h + self.attn(a, a, a, attn_mask=self.mask[:t, :t], need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return F.linear(self.lnf(h), self.tok.weight)  # tied: the embedding's weight used outside its forward


class Branch(nn.Module):
    """``forward(x, use)``: ``use`` in {"both", "left"}; the caller decides per step and rank."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(10, 12)
        self.left = nn.Linear(12, 5)
        self.right = nn.Linear(12, 5)

    def forward(self, x, use: str = "both"):
        h = F.relu(self.trunk(x))
        out = self.left(h)
        if use == "both":
            out = out + self.right(h)
        return out


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(10, 12)
        self.shared = nn.Linear(12, 12)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 12))
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        h = torch.tanh(self.shared(F.relu(self.inp(x))))
        h = torch.tanh(self.shared(h)) * self.scale  # the Linear called twice; a parameter of the parent
        return self.head(h)


MODELS = {"cnn": CNN, "gpt": GPT, "branch": Branch, "functional": Functional}


def batches(model: str, rank: int, n: int):
    """``n`` (input, target) pairs of rank ``rank``'s own data, the same in every run."""
    g = torch.Generator().manual_seed(1000 + 17 * rank)
    out = []
    for _ in range(n):
        if model == "cnn":
            out.append((torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 5, (BATCH,), generator=g)))
        elif model == "gpt":
            idx = torch.randint(0, 17, (BATCH, 6), generator=g)
            out.append((idx, torch.roll(idx, -1, 1)))
        else:
            out.append((torch.randn(BATCH, 10, generator=g), torch.randint(0, 5, (BATCH,), generator=g)))
    return out


def branch_use(step: int, rank: int) -> str:
    """Step 0-1: both heads everywhere; 2: right head on rank 1 only; 3: on no rank; then both."""
    if step == 2:
        return "both" if rank == 1 else "left"
    if step == 3:
        return "left"
    return "both"


def loss_of(name: str, model, x, y, step: int, rank: int):
    if name == "branch":
        out = model(x, branch_use(step, rank))
    else:
        out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


# ------------------------------------------------------------------------------------------ loops

LOOPS = ("plain", "lr_schedule", "hyper", "clip", "clip_opt", "adamw", "groups_frozen", "eval", "no_grad_forward",
         "no_sync", "bf16", "fp16_scaler", "checkpoint")


def make_optimizer(loop: str, model: nn.Module):
    if loop == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    if loop == "groups_frozen":
        params = list(model.parameters())
        params[0].requires_grad_(False)  # frozen: no gradient, never updated
        first, rest = params[1:len(params) // 2], params[len(params) // 2:]
        return torch.optim.SGD([{"params": first, "lr": 0.02}, {"params": rest}], lr=0.05, momentum=0.9,
                               weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=loop == "hyper")


def _schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def train(loop: str, name: str, model, opt, data, rank: int, *, start: int = 0, stop: int | None = None,
          distributed_opt: bool = False, scaler=None, sched=None) -> None:
    """The user's loop for ``loop``, steps ``start`` to ``stop`` of ``data``."""
    stop = len(data) if stop is None else stop
    amp = {"bf16": torch.bfloat16, "fp16_scaler": torch.float16}.get(loop)
    for step in range(start, stop):
        x, y = data[step]
        opt.zero_grad()
        if loop == "no_sync":
            half = x.shape[0] // 2
            with model.no_sync():
                (loss_of(name, model, x[:half], y[:half], step, rank) / 2).backward()
            (loss_of(name, model, x[half:], y[half:], step, rank) / 2).backward()
            opt.step()
            continue
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            loss = loss_of(name, model, x, y, step, rank)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            continue
        loss.backward()
        if loop == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        elif loop == "clip_opt":
            if distributed_opt:
                opt.clip_grad_norm_(0.5)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        if sched is not None:
            sched.step()
        if loop == "hyper" and step == 2:
            for g in opt.param_groups:
                g["weight_decay"] = 0.05
                g["momentum"] = 0.5
        if loop == "eval" and step in (1, 3):
            model.eval()
            with torch.no_grad():
                loss_of(name, model, data[0][0], data[0][1], 0, rank)
            model.train()
        if loop == "no_grad_forward" and step in (1, len(data) - 2):  # a validation loss in train mode, no gradients
            with torch.no_grad():
                loss_of(name, model, data[0][0], data[0][1], 0, rank)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().double() for k, v in model.state_dict().items()}


def max_diff(a: dict, b: dict) -> float:
    return max((float((a[k] - b[k]).abs().max()) for k in a if a[k].numel()), default=0.0)


def _scaler(loop: str):
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 8) if loop == "fp16_scaler" else None


def ddp_reference(name: str, loop: str) -> dict:
    rank = dist.get_rank()
    data = batches(name, rank, STEPS)
    torch.manual_seed(0)
    net = MODELS[name]()
    opt = make_optimizer(loop, net)
    ddp = nn.parallel.DistributedDataParallel(net, find_unused_parameters=name == "branch")
    ddp_opt = opt
    sched = _schedule(opt) if loop == "lr_schedule" else None
    train(loop, name, ddp, ddp_opt, data, rank, scaler=_scaler(loop), sched=sched)
    return state(net)


def ours(name: str, loop: str, case: dict) -> dict:
    """The same run through ``repro.distribute`` (``case``: scheduler and distribute keywords)."""
    import repro

    rank = dist.get_rank()
    data = batches(name, rank, STEPS)
    torch.manual_seed(0)
    net = MODELS[name]()
    opt = make_optimizer(loop, net)
    scaler = _scaler(loop)
    kw = dict(case)
    if scaler is not None:
        kw["grad_scaler"] = scaler
    model, dopt = repro.distribute(net, opt, **kw)
    sched = _schedule(dopt) if loop == "lr_schedule" else None
    if loop != "checkpoint":
        train(loop, name, model, dopt, data, rank, distributed_opt=True, scaler=scaler, sched=sched)
        dopt.flush()
        out = state(net)
        dopt.remove()
        return out
    half = STEPS // 2
    train(loop, name, model, dopt, data, rank, stop=half, distributed_opt=True)
    path = os.path.join(tempfile.gettempdir(), f"repro-conformance-{os.getppid()}-{name}.pt")
    if rank == 0:  # the DDP way: rank 0 saves, every rank loads
        # DDP-ported code saves model.module (a baseline returns DDP itself)
        torch.save({"model": getattr(model, "module", model).state_dict(), "opt": dopt.state_dict()}, path)
    else:
        dopt.state_dict()  # a family that gathers its state needs every rank in the call
    dist.barrier()
    dopt.remove()
    ckpt = torch.load(path, weights_only=False)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    torch.manual_seed(1)  # a fresh model: what it holds must come from the checkpoint
    net = MODELS[name]()
    opt = make_optimizer(loop, net)
    net.load_state_dict(ckpt["model"])
    model, dopt = repro.distribute(net, opt, **case)
    dopt.load_state_dict(ckpt["opt"])
    train(loop, name, model, dopt, data, rank, start=half, distributed_opt=True)
    dopt.flush()
    out = state(net)
    dopt.remove()
    return out


def matrix(ctx, cases: list[dict], models: list[str], loops: list[str]) -> list[dict]:
    """Per scheduler case, model and loop: ``diff`` (largest parameter or buffer difference from DDP), or
    ``refused`` (the one-line ValueError), or ``error`` (anything else: a failure of the contract)."""
    torch.use_deterministic_algorithms(True)
    rows = []
    for name in models:
        for loop in loops:
            ref = ddp_reference(name, loop)
            for case in cases:
                row = {"case": case, "model": name, "loop": loop}
                if expectation(case["scheduler"], name, loop) == "not run":
                    row["not_run"] = True
                    rows.append(row)
                    continue
                try:
                    row["diff"] = max_diff(ours(name, loop, case), ref)
                except ValueError as e:
                    row["refused"] = str(e)
                except Exception as e:  # noqa: BLE001 - reported as a failure of the row
                    row["error"] = f"{type(e).__name__}: {e}"
                    row["where"] = traceback.format_exc().splitlines()[-30:]
                finally:
                    if os.environ.get("REPRO_CONFORMANCE_VERBOSE"):
                        print(dist.get_rank(), {k: v for k, v in row.items() if k != "where"}, flush=True)
                    dist.barrier()
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------ expectations

#: the schedulers the matrix holds to DDP's parameters, with the options a tiny run needs (one warm-up
#: step, one fit repeat; thresholds and tuner ranges that give several buckets on these models)
EXCHANGE_PRESERVING = {
    "wfbp": {"warmup_steps": 1, "fit_repeats": 1},
    "syncea": {"warmup_steps": 1, "fit_repeats": 1},
    "threshold": {"warmup_steps": 1, "threshold_bytes": 2048},
    "ddp_buckets": {"warmup_steps": 1},
    "mgwfbp": {"warmup_steps": 1, "fit_repeats": 1},
    "optimal": {"warmup_steps": 1, "fit_repeats": 1},
    "horovod": {"warmup_steps": 1, "fit_repeats": 1},
    "ddp_threshold": {"threshold_bytes": 2048},
    "ddp": {},
    "dear_threshold": {"warmup_steps": 1, "fit_repeats": 1, "threshold_bytes": 2048},
    "dear_nofusion": {"warmup_steps": 1, "fit_repeats": 1},
    "dear_model": {"warmup_steps": 1, "fit_repeats": 1},
    "dear_optimal": {"warmup_steps": 1, "fit_repeats": 1},
    "dear_bo": {"warmup_steps": 1, "fit_repeats": 1, "tuner_trials": 1, "tuner_min_bytes": 1024,
                "tuner_max_bytes": 65536},
    "bytescheduler": {"warmup_steps": 1, "fit_repeats": 1},
    "ps_bsp": {"warmup_steps": 1, "fit_repeats": 1},
}

#: families whose step applies gradients exchanged after backward() returns: a local clip between
#: backward and step cannot reach them, and is refused (optimizer.clip_grad_norm_ is the way)
FINISH_AFTER_BACKWARD = {"dear_threshold", "dear_nofusion", "dear_model", "dear_optimal", "dear_bo", "bytescheduler",
                         "ps_bsp"}

#: cells that are refused in one line, and why (the docs' support table says the same)
REFUSED = {(s, "clip"): "local clip of unexchanged gradients (optimizer.clip_grad_norm_)"
           for s in FINISH_AFTER_BACKWARD}

#: cells not run, and why
NOT_RUN = {(s, "branch"): "real DDP with its defaults (find_unused_parameters=False), which itself raises on "
                          "a parameter unused in a step" for s in ("ddp", "ddp_threshold")}


def expectation(scheduler: str, model: str, loop: str) -> str:
    """``"equal"`` (DDP's parameters and buffers within the tolerance), ``"refused"`` (one ValueError
    line) or ``"not run"``."""
    if (scheduler, model) in NOT_RUN:
        return "not run"
    if (scheduler, loop) in REFUSED:
        return "refused"
    return "equal"
