"""The DeAR paper's baselines at runtime (gloo, CPU): Horovod's cycle time, ByteScheduler, FSDP2.

- Horovod (all-reduce plan with ``cycle_s``): parameters equal the same plan without the cycle, and
  every bucket is launched at or after the first tick (counted from the backward start) at or after
  it became complete;
- ByteScheduler: chunked, priority-ordered all-reduces under a small credit with layer-wise updates
  in the next forward leave PyTorch DDP's parameters (SGD with momentum and weight decay; AdamW) on 2
  and 3 ranks; before ``flush()`` some updates are still pending, after it the parameters (and an
  evaluation forward) are DDP's;
- FSDP2 (``fully_shard`` on a CPU mesh over gloo): DDP's parameters, and the original model is left
  plain (no DTensor) after ``remove()``;
- each of ``horovod``, ``bytescheduler``, ``fsdp`` runs through ``repro.train.run_training``.

The functions above the tests run on every rank (module level, importable by the spawned ranks).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from repro.launch.local import launch_local

STEPS = 4
BATCH = 4


# ---------------------------------------------------------------------------------------------
# Rank functions
# ---------------------------------------------------------------------------------------------

def _trace(model, name: str, view: str = "tensor"):
    from repro.core.trace import Layer, Trace
    from repro.workload.layers import layer_parameters

    layers = []
    for layer, params in layer_parameters(model, view).items():
        n = sum(p.numel() for _, p in params)
        layers.append(Layer(layer, n, 4 * n, 1e-4, 2e-4 + 2e-8 * n))
    return Trace(name, BATCH, "cpu", "float32", layers)


def _make_opt(kind: str, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=1e-2)
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


def _run(model_name: str, opt_kind: str, make_executor, steps: int = STEPS, flush: bool = True) -> dict:
    """``steps`` steps under the executor contract (before_forward, forward, backward, after_backward, step) on
    this rank's batches."""
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.manual_seed(0)
    model = build_model(model_name)
    opt = _make_opt(opt_kind, model.parameters())
    ex = make_executor(model)
    run_opt = ex.wrap_optimizer(opt)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x, y = make_batch(model_name, BATCH, generator=gen)
        run_opt.zero_grad(set_to_none=True)
        ex.before_forward()
        compute_loss(model_name, ex.module, x, y).backward()
        ex.after_backward()
        run_opt.step()
    out = {"model": model, "ex": ex}
    if flush:
        ex.flush()
    return out


def _ddp_params(model_name: str, opt_kind: str, steps: int = STEPS) -> tuple[dict, torch.nn.Module]:
    from repro.families.baselines.executors import TorchDDPExecutor

    r = _run(model_name, opt_kind, TorchDDPExecutor, steps)
    return _params(r["model"]), r["model"]


def _params(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _diff(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


def _eval_out(model_name: str, model) -> torch.Tensor:
    from repro.workload.models import make_batch

    x, _ = make_batch(model_name, BATCH, generator=torch.Generator().manual_seed(7))
    model.eval()
    with torch.no_grad():
        out = model(x)
    model.train()
    return out


def bytescheduler_cases(ctx, model_name: str, cases: list[dict]) -> list[dict]:
    """Per case (optimizer, partition_params, credit_bytes): ByteScheduler's parameters against DDP's,
    before and after flush, and an evaluation forward after the flush."""
    from repro.core.cost import CostModel
    from repro.core.planners import make_plan
    from repro.families.bytescheduler.executor import ByteSchedulerExecutor
    from repro.runtime.executor import ExecutorOptions
    from repro.workload.models import build_model

    torch.use_deterministic_algorithms(True)
    cost = CostModel.linear(dist.get_world_size(), 1e-4, 1e-9)
    out = []
    for case in cases:
        torch.manual_seed(0)
        view = case.get("view", "tensor")
        trace = _trace(build_model(model_name), model_name, view)
        plan = make_plan("bytescheduler", trace, cost, partition_params=case["partition_params"],
                         credit_bytes=case["credit_bytes"])
        ref, ref_model = _ddp_params(model_name, case["optimizer"])

        def make(model):
            return ByteSchedulerExecutor(model, plan, ExecutorOptions(view=view, record_timeline=True))

        r = _run(model_name, case["optimizer"], make, flush=False)
        before = _diff(_params(r["model"]), ref)
        r["ex"].flush()
        after = _params(r["model"])
        timings = [t.row(0.0) for t in r["ex"].timings]
        eval_diff = (_eval_out(model_name, r["model"]) - _eval_out(model_name, ref_model)).abs().max().item()
        r["ex"].remove()
        out.append({"layers": trace.num_layers, "chunks": len(plan.buckets), "pieces": sum(b.piece is not None for b in plan.buckets),
                    "before_flush": before, "diff": _diff(after, ref), "eval_diff": eval_diff,
                    "params": after, "timings": timings})
    return out


def horovod_case(ctx, model_name: str, cycle_s: float) -> dict:
    """The horovod plan with and without its cycle time; launch times of the cycle run's last step."""
    from repro.core.cost import CostModel
    from repro.core.planners import make_plan
    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions
    from repro.workload.models import build_model

    torch.use_deterministic_algorithms(True)
    cost = CostModel.linear(dist.get_world_size(), 1e-4, 1e-9)
    plan = make_plan("horovod", _trace(build_model(model_name), model_name), cost, threshold_bytes=40_000,
                     cycle_s=cycle_s)
    plain = plan.replace(options={k: v for k, v in plan.options.items() if k != "cycle_s"})
    runs = {}
    for name, p in (("cycle", plan), ("plain", plain)):
        r = _run(model_name, "sgd", lambda m, p=p: AllReduceExecutor(m, p, ExecutorOptions(record_timeline=True),
                                                                  engine="hooks"))  # its ready stamps
        sync = r["ex"].sync
        runs[name] = {"params": _params(r["model"]), "launch_s": [t.launch_s for t in sync.timings],
                      "end_s": [t.end_s for t in sync.timings], "ready_s": list(sync.bucket_ready_s),
                      "origin_s": sync.last_cycle_origin_s}
        r["ex"].remove()
    return {"buckets": plan.num_buckets, "cycle_s": plan.option("cycle_s"), "plain_cycle": plain.option("cycle_s"),
            **runs, "diff": _diff(runs["cycle"]["params"], runs["plain"]["params"])}


def fsdp_case(ctx, model_name: str) -> dict:
    from repro.families.baselines.fsdp import FSDPExecutor

    torch.use_deterministic_algorithms(True)
    out = {}
    for optimizer in ("sgd", "adamw"):  # AdamW: its defaults are not all constructor arguments
        ref, _ = _ddp_params(model_name, optimizer)
        r = _run(model_name, optimizer, FSDPExecutor)
        sharded_types = sorted({type(p).__name__ for p in r["ex"].module.parameters()})
        r["ex"].remove()
        out[optimizer] = _diff(_params(r["model"]), ref)
    return {"diff": out["sgd"], "diff_adamw": out["adamw"], "sharded_types": sharded_types,
            "types_after": sorted({type(p).__name__ for p in r["model"].parameters()}),
            "model_class": type(r["model"]).__name__}


def suite_two_ranks(ctx, bs_cases: list[dict], runs: list[dict]) -> dict:
    from tests.runtime_targets import train_params

    return {"bytescheduler": bytescheduler_cases(ctx, "tiny_resnet", bs_cases),
            "horovod": horovod_case(ctx, "tiny_resnet", 2e-3),
            "fsdp": fsdp_case(ctx, "tiny_resnet"),
            "train": train_params(ctx, runs)}


def bytescheduler_three_ranks(ctx, cases: list[dict]) -> list[dict]:
    return bytescheduler_cases(ctx, "tiny_vgg", cases)


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------

BS_CASES = [{"optimizer": "sgd", "partition_params": 5000, "credit_bytes": 30_000},
            {"optimizer": "adamw", "partition_params": 3000, "credit_bytes": 1,  # credit < a chunk: one at a time
             "view": "module"}]
TRAIN = {"model": "tiny_resnet", "steps": 3, "warmup_steps": 1, "batch_size": 4}
RUNS = [{**TRAIN, "scheduler": "horovod", "record_timeline": True},
        {**TRAIN, "scheduler": "bytescheduler", "record_timeline": True},
        {**TRAIN, "scheduler": "fsdp"},
        {**TRAIN, "scheduler": "ddp"}]
EPOCH = {"model": "tiny_resnet", "dataset": "digits", "epochs": 1, "warmup_steps": 1, "batch_size": 128}
RUNS += [{**EPOCH, "scheduler": s} for s in ("bytescheduler", "fsdp", "ddp")]  # evaluated by the loop


@pytest.fixture(scope="module")
def two_ranks():
    return launch_local(suite_two_ranks, 2, args=(BS_CASES, RUNS), timeout_s=300)


@pytest.mark.distributed
def test_bytescheduler_equals_ddp_on_two_ranks(two_ranks):
    rank0, rank1 = two_ranks
    for case, r0, r1 in zip(BS_CASES, rank0["bytescheduler"], rank1["bytescheduler"]):
        assert r0["pieces"] > 0 and r0["chunks"] > r0["layers"], case  # layers were split
        assert r0["before_flush"] > 1e-4, case  # updates were pending before the flush ...
        assert r0["diff"] < 1e-5 and r1["diff"] < 1e-5, case  # ... and DDP's parameters after it
        assert r0["eval_diff"] < 1e-4, case  # an evaluation sees the flushed parameters
        assert _diff(r0["params"], r1["params"]) == 0.0, case
        rows = r0["timings"]
        assert len(rows) == r0["chunks"]
        assert all(r["ready_s"] <= r["decided_s"] <= r["start_s"] <= r["end_s"] for r in rows)
        assert {"layer", "piece", "pieces", "bytes", "priority", "start_s", "end_s"} <= set(rows[0])


@pytest.mark.distributed
def test_bytescheduler_serves_urgent_chunks_first_within_the_credit(two_ranks):
    rows = two_ranks[0]["bytescheduler"][1]["timings"]  # credit below one chunk: strictly one at a time
    by_start = sorted(rows, key=lambda r: r["start_s"])
    for a, b in zip(by_start, by_start[1:]):
        assert a["end_s"] <= b["start_s"] + 1e-3  # never two in flight (end stamped by a callback)
        if b["ready_s"] <= a["decided_s"]:  # both were ready when a was picked: a is at least as urgent
            assert a["priority"] <= b["priority"]


@pytest.mark.distributed
def test_bytescheduler_equals_ddp_on_three_ranks():
    cases = [{"optimizer": "sgd", "partition_params": 20_000, "credit_bytes": 100_000}]
    out = launch_local(bytescheduler_three_ranks, 3, args=(cases,), timeout_s=300)
    for r in out:
        assert r[0]["pieces"] > 0 and r[0]["diff"] < 1e-5 and r[0]["eval_diff"] < 1e-4
    assert _diff(out[0][0]["params"], out[2][0]["params"]) == 0.0


@pytest.mark.distributed
def test_horovod_cycle_time_keeps_the_parameters_and_launches_at_ticks(two_ranks):
    for r in two_ranks:
        h = r["horovod"]
        assert h["buckets"] > 1 and h["cycle_s"] == 2e-3 and h["plain_cycle"] is None
        assert h["diff"] < 1e-6
        cyc = h["cycle"]
        origin, c = cyc["origin_s"], h["cycle_s"]
        for ready, launch in zip(cyc["ready_s"], cyc["launch_s"]):
            tick = origin + math.ceil((ready - origin) / c - 1e-9) * c
            assert launch >= tick - 1e-6  # on or after the first tick at or after completion
            k = (launch - origin) / c
            assert k >= 1 - 1e-6  # never before the first tick after the backward start
        assert cyc["launch_s"] == sorted(cyc["launch_s"])  # plan order


@pytest.mark.distributed
def test_fsdp2_runs_on_gloo_and_equals_ddp(two_ranks):
    for r in two_ranks:
        f = r["fsdp"]
        assert f["sharded_types"] == ["DTensor"]
        assert f["types_after"] == ["Parameter"] and not f["model_class"].startswith("FSDP")
        assert f["diff"] < 1e-5
        assert f["diff_adamw"] < 1e-4, f["diff_adamw"]


@pytest.mark.distributed
def test_each_baseline_trains_through_run_training(two_ranks):
    rank0, rank1 = two_ranks
    runs = {kw["scheduler"]: (a, b) for kw, a, b in zip(RUNS, rank0["train"], rank1["train"]) if "epochs" not in kw}
    for name, (a, b) in runs.items():
        assert a["summary"]["iteration_s"] > 0, name
        assert _diff(a["params"], b["params"]) == 0.0, name  # ranks agree
        assert all(torch.isfinite(p).all() for p in a["params"].values()), name
        assert all(type(p) is torch.Tensor for p in a["params"].values()), name
    # FSDP and ByteScheduler train the same SGD as DDP (warm-up included; horovod measures and plans first)
    assert _diff(runs["fsdp"][0]["params"], runs["ddp"][0]["params"]) < 1e-5
    assert _diff(runs["bytescheduler"][0]["params"], runs["ddp"][0]["params"]) < 1e-5


@pytest.mark.distributed
def test_the_loop_evaluates_flushed_parameters(two_ranks):
    """One epoch of digits: the loop flushes before its evaluation; ByteScheduler's and FSDP's test loss
    is DDP's (their parameters are)."""
    runs = {kw["scheduler"]: r for kw, r in zip(RUNS, two_ranks[0]["train"]) if "epochs" in kw}
    ddp = runs["ddp"]["summary"]["epochs"][-1]
    for name in ("bytescheduler", "fsdp"):
        ev = runs[name]["summary"]["epochs"][-1]
        assert ev["epoch"] == 1 and math.isfinite(ev["test_loss"]), name
        assert abs(ev["test_loss"] - ddp["test_loss"]) < 1e-4, name
        assert ev["test_accuracy"] == ddp["test_accuracy"], name
        assert _diff(runs[name]["params"], runs["ddp"]["params"]) < 1e-4, name


def test_refusals_before_any_communication():
    from repro.core.plan import Plan, PlanError
    from repro.families.bytescheduler.executor import ByteSchedulerExecutor
    from repro.families.baselines.fsdp import FSDPExecutor

    model = torch.nn.Linear(2, 2)
    with pytest.raises(PlanError, match="needs a plan"):
        ByteSchedulerExecutor(model)
    with pytest.raises(PlanError, match="bytescheduler plans, got a 'allreduce' plan"):
        ByteSchedulerExecutor(model, Plan.from_dict({"buckets": [["weight", "bias"]]}))
    with pytest.raises(ValueError, match="fsdp: torch.distributed is not initialised"):
        FSDPExecutor(model)
