"""The all-reduce executor's C++ reducer engine (:mod:`repro.families.allreduce.reducer_engine`): what it runs and
what it refuses, unused parameters (used on some ranks, on none, or reached by the loss but not the
output), a forward without backward, no_sync, its timeline and ready stamps, and remove(), against the
Python hook engine (the same math: 2 ranks, so ``x / 2`` and ``x * 0.5`` are the same bits)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from repro.launch.local import launch_local
from repro.core.plan import Plan, PlanError
from repro.families.allreduce.reducer_engine import unfit_reason
from repro.workload.layers import layer_parameters


class Branchy(nn.Module):
    """``b`` runs only when asked (rank 0 in the tests), ``never`` never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.never, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if use_b:
            h = torch.relu(self.b(h))
        return self.c(h)


PARAM_NAMES = [n for n, _ in Branchy().named_parameters()]


def _plan(model: nn.Module, per_bucket: int = 3, **options) -> Plan:
    names = list(layer_parameters(model, "tensor"))[::-1]  # output side first
    return Plan.from_dict({"solver": "test", "buckets": [names[i:i + per_bucket] for i in range(0, len(names), per_bucket)],
                           "options": options})


# ---------------------------------------------------------------- what runs on the reducer (no ranks)

def test_unfit_reason_names_what_the_reducer_cannot_run():
    torch.manual_seed(0)
    model = Branchy()
    assert unfit_reason(model, _plan(model), "tensor") is None
    assert "wire dtype" in unfit_reason(model, _plan(model, wire_dtype="float16"), "tensor")
    assert "cycle time" in unfit_reason(model, _plan(model, cycle_s=0.01), "tensor")
    assert "clock" in unfit_reason(model, _plan(model), "tensor", clock=object())
    short = Plan.from_dict({"solver": "test", "buckets": [list(layer_parameters(model, "tensor"))[:2]]})
    assert "cover" in unfit_reason(model, short, "tensor")
    model.c.half()
    assert "dtypes" in unfit_reason(model, _plan(model), "tensor")
    emb = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 2))
    assert "sparse" in unfit_reason(emb, _plan(emb), "tensor")


# ---------------------------------------------------------------- on 2 gloo ranks

def _step(model, opt, ex, x, use_b, extra=None, output_in_loss=True) -> None:
    opt.zero_grad()
    ex.before_forward()
    loss = model(x, use_b).square().mean()
    if not output_in_loss:  # the output is computed but the loss comes from the parameters alone
        loss = extra(model)
    elif extra is not None:
        loss = loss + extra(model)
    loss.backward()
    ex.after_backward()
    opt.step()


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def engines_agree(ctx) -> dict:
    """The same loop on both engines: branch ``b`` used on rank 0 only, ``never`` on no rank, a step whose
    loss also reaches ``a.weight`` directly (a penalty), and a forward without backward in between."""
    import torch.distributed as dist

    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions

    rank = dist.get_rank()
    out: dict = {}
    finals = {}
    for name, engine, record in (("reducer", "reducer", True), ("reducer_untimed", "reducer", False),
                                 ("hooks", "hooks", True)):  # the reducer with and without its comm hook
        torch.manual_seed(0)
        model = Branchy()
        ex = AllReduceExecutor(model, _plan(model), ExecutorOptions(record_timeline=record), engine=engine)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        g = torch.Generator().manual_seed(10 + rank)
        grads_none = []
        for step in range(5):
            x = torch.randn(5, 4, generator=g)
            if step == 2:  # a forward without backward (e.g. a look at the outputs) before the step
                model(x)
            penalty = (lambda m: 0.1 * m.a.weight.square().sum()) if step in (1, 4) else None
            _step(model, opt, ex, x, use_b=rank == 0, extra=penalty, output_in_loss=step != 4)
            grads_none.append(sorted(n for n, p in model.named_parameters() if p.grad is None))
            if step == 3:  # an ordinary step's stamps
                timeline = [(t.bucket, t.launch_s, t.end_s) for t in ex.timings]
                ready = dict(ex.grad_ready_s)
        out[name] = {"engine": ex.engine, "grads_none": grads_none, "timeline": timeline, "ready": ready}
        finals[name] = _params(model)
        ex.remove()
    out["diff"] = max(float((a - b).abs().max()) for a, b in zip(finals["reducer"], finals["hooks"]))
    out["diff_untimed"] = max(float((a - b).abs().max()) for a, b in zip(finals["reducer_untimed"], finals["hooks"]))
    return out


@pytest.mark.distributed
def test_reducer_engine_equals_the_hook_engine_with_unused_parameters():
    r0, r1 = launch_local(engines_agree, 2, timeout_s=300)
    assert r0["reducer"]["engine"] == "reducer" and r0["hooks"]["engine"] == "hooks"
    for r in (r0, r1):
        assert r["diff"] == 0.0 and r["diff_untimed"] == 0.0, (r["diff"], r["diff_untimed"])
    for r in (r0, r1):  # no rank ran `never`: its gradient stays None (DDP's find_unused_parameters); `b` ran
        for engine in ("reducer", "reducer_untimed", "hooks"):  # on rank 0: every rank has its averaged gradient
            assert r[engine]["grads_none"][:4] == [["never.bias", "never.weight"]] * 4, (engine, r[engine]["grads_none"])
            # a loss from a.weight alone (step 4): every other parameter had no gradient on any rank
            assert r[engine]["grads_none"][4] == sorted(n for n in PARAM_NAMES if n != "a.weight"), r[engine]



@pytest.mark.distributed
def test_reducer_engine_stamps_its_buckets_and_gradients():
    r0, _ = launch_local(engines_agree, 2, timeout_s=300)
    rec = r0["reducer"]
    timeline = rec["timeline"]
    assert [b for b, _, _ in timeline] == list(range(len(timeline)))
    assert all(math.isfinite(s) and math.isfinite(e) and s <= e for _, s, e in timeline), timeline
    launches = [s for _, s, _ in timeline]
    assert launches == sorted(launches)  # plan order: a bucket never overtakes an earlier one
    ready = rec["ready"]
    assert set(ready) == set(r0["hooks"]["ready"])  # every layer, as the hook engine stamps them
    assert ready["c.weight"] <= ready["a.weight"]  # the output side is ready first
    assert max(ready.values()) <= timeline[-1][2]   # the last bucket ends after its gradients


def no_sync_and_remove(ctx) -> dict:
    """Gradient accumulation with the exchange held for the first micro-batch (the door's no_sync), against
    DDP's no_sync; then remove(): a backward afterwards exchanges nothing."""
    import torch.distributed as dist

    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions

    rank = dist.get_rank()
    torch.manual_seed(0)
    model, ref = Branchy(), Branchy()
    ref.load_state_dict(model.state_dict())
    ex = AllReduceExecutor(model, _plan(model, per_bucket=2), ExecutorOptions(), engine="reducer")
    ddp = nn.parallel.DistributedDataParallel(ref, find_unused_parameters=True)  # `never`
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, ref)]
    g = torch.Generator().manual_seed(20 + rank)
    for _ in range(3):
        first, last = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
        for opt in opts:
            opt.zero_grad()
        ex.hold_exchange(True)
        ex.before_forward()
        model(first).square().mean().backward()
        ex.hold_exchange(False)
        ex.before_forward()
        model(last).square().mean().backward()
        ex.after_backward()
        with ddp.no_sync():
            ddp(first).square().mean().backward()
        ddp(last).square().mean().backward()
        for opt in opts:
            opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    ex.remove()
    model.zero_grad()
    model(torch.full((5, 4), float(rank))).sum().backward()  # after remove: local gradients only
    return {"diff": diff, "after_remove": model.a.weight.grad.tolist()}


@pytest.mark.distributed
def test_reducer_engine_holds_for_no_sync_and_lets_go_on_remove():
    r0, r1 = launch_local(no_sync_and_remove, 2, timeout_s=300)
    assert r0["diff"] == 0.0 and r1["diff"] == 0.0, (r0["diff"], r1["diff"])
    assert r0["after_remove"] != r1["after_remove"]  # not averaged any more


def refuses_an_unfit_plan(ctx) -> str:
    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions

    model = Branchy()
    try:
        AllReduceExecutor(model, _plan(model, wire_dtype="float16"), ExecutorOptions(), engine="reducer")
    except PlanError as e:
        auto = AllReduceExecutor(model, _plan(model, wire_dtype="float16"), ExecutorOptions())
        engine = auto.engine
        auto.remove()
        return f"{e} | auto: {engine}"
    return "accepted"


@pytest.mark.distributed
def test_engine_reducer_refuses_an_unfit_plan_and_auto_falls_back_to_hooks():
    msg = launch_local(refuses_an_unfit_plan, 2, timeout_s=120)[0]
    assert "wire dtype" in msg and "use engine 'hooks'" in msg and msg.endswith("auto: hooks"), msg


# ---------------------------------------------------------------- engine as a run option (issue 23)

BAD_ENGINE = [({"scheduler": "threshold", "engine": "cuda"}, "unknown engine 'cuda'; choose one of auto, reducer, hooks"),
              ({"scheduler": "dear_threshold", "engine": "hooks"}, "engine do not apply to scheduler dear_threshold"),
              ({"scheduler": "ddp_threshold", "engine": "reducer"}, "engine do not apply to scheduler ddp_threshold"),
              ({"scheduler": "threshold", "engine": "reducer", "wire_dtype": "float16"},
               "engine 'reducer' cannot send a wire dtype (float16)")]


def engine_choices(ctx, results_dir: str) -> dict:
    """Per rank: the engine that ran for each ``engine`` given to repro.distribute (by name, after the warm-up;
    with a plan given on its own), the one-line refusals, and repro train's runs with --engine."""
    import repro
    from repro.train import TrainConfig, train_worker

    out: dict = {"by_name": {}, "refused": []}
    for engine in ("reducer", "hooks", "auto", None):
        torch.manual_seed(0)
        model = Branchy()
        kw = {} if engine is None else {"engine": engine}
        net, opt = repro.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), "threshold",
                                    warmup_steps=1, **kw)
        while opt._door.warming_up:  # the warm-up measures on the hook engine, then the plan runs
            opt.zero_grad()
            net(torch.randn(5, 4)).sum().backward()
            opt.step()
        out["by_name"][str(engine)] = opt._door.ex.engine
        opt.remove()
    model = Branchy()  # a plan given on its own runs on its family's executor, which takes the option
    _, opt = repro.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), _plan(model), engine="hooks")
    out["plan"] = opt._door.ex.engine
    opt.remove()
    for kwargs, _ in BAD_ENGINE:
        model = Branchy()
        try:
            repro.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)
            out["refused"].append("accepted")
        except (ValueError, PlanError) as e:
            out["refused"].append(str(e))
    out["train"] = []
    for engine in ("hooks", "reducer"):
        cfg = TrainConfig(model="tiny_vgg", scheduler="threshold", engine=engine, steps=2, warmup_steps=1,
                          compute_steps=0, quiet=True, results_dir=results_dir, run_id=engine)
        out["train"].append(train_worker(ctx, cfg)["engine"])
    return out


@pytest.mark.distributed
def test_engine_is_chosen_through_distribute_and_repro_train(tmp_path):
    import json

    r0, r1 = launch_local(engine_choices, 2, args=(str(tmp_path),), timeout_s=300)
    for r in (r0, r1):
        assert r["by_name"] == {"reducer": "reducer", "hooks": "hooks", "auto": "reducer", "None": "reducer"}
        assert r["plan"] == "hooks"
        for (kwargs, words), message in zip(BAD_ENGINE, r["refused"]):
            assert words in message and "\n" not in message, (kwargs, message)
        assert r["train"] == ["hooks", "reducer"]
    for engine in ("hooks", "reducer"):
        assert json.loads((tmp_path / engine / "run.json").read_text())["summary"]["engine"] == engine


def test_engine_flag_of_repro_train_is_checked_for_the_scheduler():
    from repro.core.schedulers import get_scheduler
    from repro.training.config import TrainConfig, config_from_argv

    cfg, _ = config_from_argv(["--model", "tiny_vgg", "--scheduler", "mgwfbp", "--engine", "hooks"])
    assert cfg.engine == "hooks"
    assert TrainConfig(model="tiny_vgg", scheduler="threshold").engine is None  # auto: the executor's default
    with pytest.raises(ValueError, match="unknown engine 'fast'"):
        TrainConfig(model="tiny_vgg", scheduler="threshold", engine="fast")
    with pytest.raises(ValueError, match="--engine does not apply to --scheduler omgs"):
        TrainConfig(model="tiny_vgg", scheduler="omgs", engine="hooks")
    with pytest.raises(ValueError, match="engine 'reducer' cannot send a wire dtype .bfloat16."):  # before launch
        TrainConfig(model="tiny_vgg", scheduler="mgwfbp", engine="reducer", wire_dtype="bfloat16")
    with pytest.raises(ValueError, match="engine 'reducer' runs on the CPU only so far"):
        TrainConfig(model="tiny_vgg", scheduler="mgwfbp", engine="reducer", device="cuda")
    assert TrainConfig(model="tiny_vgg", scheduler="mgwfbp", engine="hooks", wire_dtype="bfloat16").engine == "hooks"
    assert "engine" in get_scheduler("mgwfbp").to_dict()["executor_options"]
    assert "engine" not in get_scheduler("ddp_threshold").to_dict()["executor_options"]


def test_a_plan_file_fixes_the_wire_dtype_and_the_engine_check_reads_it(tmp_path):
    from repro.training.config import TrainConfig

    model = Branchy()
    names = list(layer_parameters(model, "tensor"))[::-1]
    half = tmp_path / "half.json"
    Plan.from_dict({"solver": "threshold", "buckets": [names], "options": {"wire_dtype": "float16"}}).save(half)
    with pytest.raises(ValueError, match="engine 'reducer' cannot send a wire dtype .float16."):
        TrainConfig(model="tiny_vgg", plan=str(half), engine="reducer")
    plain = tmp_path / "plain.json"
    Plan.from_dict({"solver": "threshold", "buckets": [names]}).save(plain)
    with pytest.raises(ValueError, match="--wire-dtype float16 does not apply with --plan .*plain.json: a plan fixes"):
        TrainConfig(model="tiny_vgg", plan=str(plain), wire_dtype="float16")
    assert TrainConfig(model="tiny_vgg", plan=str(plain), engine="reducer").engine == "reducer"
