"""Launch targets of tests/test_runtime_ps.py (module level: the spawned ranks import them by name).

One "case" is a dict: ``mode`` (bsp/asp/ssp/osp), ``share`` (OSP's stage-1 share), ``lgp``, ``staleness``,
``optimizer`` (sgd/adamw), ``steps``, ``sleep`` ({worker index: seconds slept after each step}),
``servers`` and ``die`` ({"rank": r, "after": steps}: that rank leaves with ``os._exit`` after that many
steps). Every rank of a case builds the same model, optimizer and plan from seed 0 (no broadcast), so
the servers start from the workers' weights and a fresh optimizer, as after ``_share_state``.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

LR = {"sgd": 0.05, "adamw": 0.01}
BATCH = 8


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def make_optimizer(kind: str, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=LR["adamw"], weight_decay=0.05)
    return torch.optim.SGD(params, lr=LR["sgd"], momentum=0.9, weight_decay=1e-4)


def batches(worker: int, steps: int) -> list:
    """Worker ``worker``'s fixed batches (different data on every worker)."""
    gen = torch.Generator().manual_seed(100 + worker)
    return [(torch.randn(BATCH, 6, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen))
            for _ in range(steps)]


def loss_of(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def make_trace(model):
    from repro.core.trace import Layer, Trace
    from repro.workload.layers import layer_parameters

    layers = []
    for name, params in layer_parameters(model, "tensor").items():
        n = sum(p.numel() for _, p in params)
        layers.append(Layer(name, n, 4 * n, 1e-4, 1e-4 + 2e-8 * n))
    return Trace("mlp", BATCH, "cpu", "float32", layers)


def make_case_plan(model, case: dict, workers: int = 2):
    from repro.core.cost import CostModel, Linear
    from repro.core.planners import make_plan

    cost = CostModel(workers, {"push": Linear(1e-4, 1e-9), "pull": Linear(1e-4, 1e-9)})
    mode, servers = case["mode"], case.get("servers", 1)
    trace = make_trace(model)
    if mode == "osp":
        return make_plan("osp", trace, cost, servers=servers, stage1_share=case["share"], importance="position",
                         lgp=case.get("lgp", True))
    if mode == "ssp":
        return make_plan("ps_ssp", trace, cost, servers=servers, staleness=case["staleness"])
    return make_plan(f"ps_{mode}", trace, cost, servers=servers)


def _params(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _die(die: dict) -> None:
    """Leave at once (no exception, no clean-up), after writing the time to ``die["stamp"]``."""
    with open(die["stamp"], "w") as f:
        f.write(repr(time.time()))
    os._exit(3)


def _maybe_die(case: dict, step: int) -> None:
    die = case.get("die")
    if die and dist.get_rank() == die["rank"] and step >= die["after"]:
        if die.get("hang"):   # alive but silent (as a stopped or stuck process)
            time.sleep(3600)
        _die(die)


# ---------------------------------------------------------------------------------------------
# worker with records
# ---------------------------------------------------------------------------------------------

def _recording_executor():
    from repro.families.ps.executor import PSExecutor

    class RecordingPS(PSExecutor):
        """PSExecutor recording, per step, the parameters before and after ``before_forward``, the
        aggregated stage-2 values it installs and the local gradients LGP uses."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.names = {id(p): n for n, p in self.model.named_parameters()}
            self.records: list[dict] = []

        def _by_name(self, items) -> dict:
            out = {}
            for bucket, buf, *_ in items:
                off = 0
                for p in bucket.params:
                    out[self.names[id(p)]] = buf[off:off + p.numel()].view_as(p).clone()
                    off += p.numel()
            return out

        def before_forward(self) -> None:
            t = self.step_index
            pending = self._stage2.get(t - 2)
            local = self._by_name(self._local2)
            lr = float(self._optimizer.param_groups[0]["lr"])
            before = _params(self.model)
            super().before_forward()
            installed = self._by_name([(b, buf) for b, _, buf in pending]) if pending else {}
            self.records.append({"step": t, "before": before, "after": _params(self.model),
                                 "installed": installed, "local": local, "lr": lr})

        def after_backward(self) -> None:
            self.records[-1]["grads"] = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}
            super().after_backward()

    return RecordingPS


def _worker_group(servers: int):
    return dist.new_group(list(range(servers, dist.get_world_size())))


def ps_worker(ctx, cases: list[dict]) -> list[dict]:
    """Run every case as a worker; per case the final (flushed) parameters, those before the flush,
    the stage of every parameter and the executor's records."""
    from repro.runtime.executor import ExecutorOptions

    torch.use_deterministic_algorithms(True)
    out = []
    for case in cases:
        servers = case.get("servers", 1)
        group = _worker_group(servers)
        worker = dist.get_rank() - servers
        model = make_model()
        plan = make_case_plan(model, case)
        ex = _recording_executor()(model, plan, ExecutorOptions(group=group))
        opt = ex.wrap_optimizer(make_optimizer(case.get("optimizer", "sgd"), model.parameters()))
        nap = case.get("sleep", {}).get(worker, 0.0)
        for step, (x, y) in enumerate(batches(worker, case["steps"])):
            _maybe_die(case, step)
            opt.zero_grad(set_to_none=True)
            ex.before_forward()
            loss_of(ex.module, x, y).backward()
            ex.after_backward()
            opt.step()
            if nap:
                time.sleep(nap)
        unflushed = _params(model)
        ex.flush()
        final = _params(model)
        stages = {ex.names[id(p)]: b.stage for b in ex.buckets for p in b.params}
        ex.remove()
        out.append({"params": final, "unflushed": unflushed, "stages": stages, "records": ex.records,
                    "plan": plan.to_dict(), "bytes_pushed": ex.bytes_pushed})
    return out


def ps_server(ctx, cases: list[dict]) -> list[dict]:
    """Serve every case; per case the server's tables and its final parameters (its shard's are the
    servers' model)."""
    from repro.families.ps.executor import serve

    torch.use_deterministic_algorithms(True)
    out = []
    for case in cases:
        servers = case.get("servers", 1)
        _worker_group(servers)  # every rank takes part in making the workers' group
        model = make_model()
        plan = make_case_plan(model, case)
        opt = make_optimizer(case.get("optimizer", "sgd"), model.parameters())
        die = case.get("die")
        if die and die["rank"] == dist.get_rank():
            import threading

            threading.Timer(die["after_s"], _die, args=(die,)).start()
        tables = serve(ctx, SimpleNamespace(view="tensor"), model, opt, plan)
        owned = {n for n, p in model.named_parameters()
                 if any(p is q for b in _server_buckets(model, plan) for q in b.params)}
        out.append({"tables": tables, "params": _params(model), "owned": sorted(owned)})
    return out


def _server_buckets(model, plan):
    from repro.families.ps.executor import ps_layout

    return [b for b in ps_layout(model, plan, "tensor") if b.server == dist.get_rank()]


# ---------------------------------------------------------------------------------------------
# reference: PyTorch DDP on the workers alone
# ---------------------------------------------------------------------------------------------

def ddp_worker(ctx, optimizers: list[str], steps: int, servers: int = 1) -> dict | None:
    """Per optimizer: DDP's parameters after every step, on the workers' own process group (ranks
    ``servers..``; the serving ranks only take part in making the group and return None), each worker
    with the PS workers' data."""
    from torch.nn.parallel import DistributedDataParallel

    torch.use_deterministic_algorithms(True)
    group = _worker_group(servers)
    if dist.get_rank() < servers:
        return None
    out = {}
    for kind in optimizers:
        model = make_model()
        ddp = DistributedDataParallel(model, process_group=group)
        opt = make_optimizer(kind, model.parameters())
        states = []
        for x, y in batches(dist.get_rank() - servers, steps):
            opt.zero_grad(set_to_none=True)
            loss_of(ddp, x, y).backward()
            opt.step()
            states.append(_params(model))
        out[kind] = states
    return out


# ---------------------------------------------------------------------------------------------
# the real loop
# ---------------------------------------------------------------------------------------------

def train_runs(ctx, argvs: list[list[str]]) -> list[dict]:
    """``repro train`` arguments run in turn through the generic loop (every rank); per run the summary
    and this rank's final parameters (a server's: its model copy, current on its shard only)."""
    from repro.train import config_from_argv, run_training

    out = []
    for argv in argvs:
        cfg, _ = config_from_argv(argv)
        model, summary = run_training(ctx, cfg)
        out.append({"summary": summary, "params": _params(model)})
    return out


def ps_suite(ctx, cases: list[dict], argvs: list[list[str]]) -> dict:
    """Everything tests/test_runtime_ps.py needs from one 3-rank world (role server: rank 0; role
    worker: ranks 1-2): the executor cases, DDP on the workers' group, the generic loop's runs."""
    steps = max(c["steps"] for c in cases if c["mode"] == "bsp")
    serving = ctx.role == "server"
    return {"cases": (ps_server if serving else ps_worker)(ctx, cases),
            "ddp": ddp_worker(ctx, ["sgd", "adamw"], steps),
            "runs": train_runs(ctx, argvs)}


# ---------------------------------------------------------------------------------------------
# co-located servers through repro.distribute (tests/test_api_ps.py)
# ---------------------------------------------------------------------------------------------

#: the torch.distributed calls a co-located run is watched for (any of them would be recorded)
RECORDED_CALLS = ("reduce", "gather", "broadcast", "all_reduce", "all_gather", "scatter", "reduce_scatter",
                  "reduce_scatter_tensor", "all_gather_into_tensor", "isend", "irecv", "send", "recv", "barrier",
                  "batch_isend_irecv", "all_to_all", "all_to_all_single")


def _tensors_of(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_of(v)]
    return []


class RecordingDist:
    """While entered, every call of :data:`RECORDED_CALLS` through ``torch.distributed`` is recorded
    (op, root, and shape/dtype/device of every tensor it is handed) before it runs; and
    ``_broadcast_coalesced`` as one broadcast per dtype of its tensors."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._saved: dict = {}

    def __enter__(self) -> "RecordingDist":
        for name in RECORDED_CALLS:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._saved[name] = fn

            def wrapper(*args, _fn=fn, _name=name, **kwargs):
                tensors = _tensors_of(list(args) + list(kwargs.values()))
                root = kwargs.get("dst", kwargs.get("src"))
                self.calls.append({"op": _name, "root": root,
                                   "tensors": [(tuple(t.shape), str(t.dtype), str(t.device)) for t in tensors]})
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapper)
        coalesced = getattr(dist, "_broadcast_coalesced", None)  # DDP's C++ buffer sync (repro.runtime.buffers)
        if coalesced is not None:
            self._saved["_broadcast_coalesced"] = coalesced

            def broadcast_coalesced(group, tensors, buffer_size, src, _fn=coalesced):
                by_dtype: dict = {}  # recorded as what it sends: one flattened broadcast per dtype
                for t in tensors:
                    by_dtype.setdefault(t.dtype, []).append(t)
                for ts in by_dtype.values():
                    self.calls.append({"op": "broadcast", "root": src,
                                       "tensors": [(tuple(t.shape), str(t.dtype), str(t.device)) for t in ts]})
                return _fn(group, tensors, buffer_size, src)

            dist._broadcast_coalesced = broadcast_coalesced
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def colocated_runs(ctx, cases: list[dict]) -> list[dict]:
    """Per case, on every rank (each rank trains and serves): ``repro.distribute`` with ``case["plan"]``
    (a plan made here from the case, as :func:`make_case_plan`, with ``servers`` ranks serving) or
    ``case["scheduler"]`` (planned online) and ``case["kwargs"]``; this rank's data is
    :func:`batches` (rank). Returns the final (flushed) parameters, those before the flush, the
    parameters each iteration's forward used, every recorded torch.distributed call from distribute
    on (the online warm-up's included), the plan and the parameters' device."""
    import repro

    torch.use_deterministic_algorithms(True)
    out = []
    for case in cases:
        model = make_model()
        opt = make_optimizer(case.get("optimizer", "sgd"), model.parameters())
        scheduler = case.get("scheduler") or make_case_plan(model, case, workers=dist.get_world_size())
        used: list[dict] = []
        with RecordingDist() as rec:
            net, dopt = repro.distribute(model, opt, scheduler=scheduler, **case.get("kwargs", {}))
            hook = net.register_forward_pre_hook(lambda m, a: used.append(_params(m)))  # after the door's hook
            for x, y in batches(dist.get_rank(), case["steps"]):
                dopt.zero_grad()
                loss_of(net, x, y).backward()
                dopt.step()
            unflushed = _params(model)
            dopt.flush()
            hook.remove()
            plan = dopt.plan
            dopt.remove()
        out.append({"params": _params(model), "unflushed": unflushed, "used": used, "calls": rec.calls,
                    "plan": plan.to_dict(), "device": str(next(model.parameters()).device),
                    "is_optimizer": isinstance(dopt, torch.optim.Optimizer)})
    return out


def colocated_suite(ctx, cases: list[dict], steps: int) -> dict:
    """Everything tests/test_api_ps.py needs from one 2-rank world: the co-located cases and DDP on
    every rank with the same data (SGD and AdamW)."""
    return {"cases": colocated_runs(ctx, cases), "ddp": ddp_worker(ctx, ["sgd", "adamw"], steps, servers=0)}
