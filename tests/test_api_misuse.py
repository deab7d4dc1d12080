"""Misuse of ``repro.distribute`` is refused at the call, in one line, on every rank, before any collective.

The refusals are checked with each rank calling ``distribute`` *alone* in turn while the other waits in
a barrier: a refusal that came after a collective (the buffer broadcast, the warm-up's exchange) would
leave the lone rank blocked in it or crossed with the other's barrier, and the launch would fail or
time out instead of returning the messages. Uses
that must work (sparse gradients under DDP, ``model.module``, the paper's name ``dear``, one rank)
train a few steps. Stepping the optimizer given to distribute instead of the returned one is refused at
that step, on every rank, and the returned one then finishes the iteration.
"""

from __future__ import annotations

import warnings
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn

from repro.launch.local import launch_local
from tests.api_targets import UserNet, _batches, _train


class EmbeddingNet(nn.Module):
    """A model with sparse gradients: ``nn.Embedding(sparse=True)`` under the name ``emb``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(x).mean(1))


def _meta_net() -> nn.Module:
    with torch.device("meta"):
        return UserNet()


def _split_net() -> nn.Module:
    net = UserNet()
    net.head.to("meta")  # two devices that every machine has
    return net


def _one_bucket_plan(net: nn.Module, view: str = "tensor", skip: int = 0):
    """A plan of one bucket holding ``net``'s layers in ``view`` but the first ``skip``."""
    from repro.core.plan import Plan
    from repro.workload.layers import layer_parameters

    return Plan.from_dict({"solver": "syncea", "buckets": [list(layer_parameters(net, view))[skip:]]})


# (case, what the message must name): each case builds a model, an optimizer and distribute's keywords
REFUSALS = {
    "wire_int8": ("unknown wire_dtype 'int8'; choose one of float32, float16, bfloat16",
                  lambda: (UserNet(), None, {"scheduler": "mgwfbp", "wire_dtype": "int8"})),
    "wire_torch_dtype": ("unknown wire_dtype torch.float16",
                         lambda: (UserNet(), None, {"scheduler": "mgwfbp", "wire_dtype": torch.float16})),
    **{f"sparse_{s}": ("module 'emb' (Embedding(50, 8, sparse=True)) makes sparse gradients, which scheduler "
                       f"'{s}' cannot exchange",
                       (lambda s=s: (EmbeddingNet(), None, {"scheduler": s})))
       for s in ("mgwfbp", "dear_threshold", "omgs", "bytescheduler", "ps_bsp", "fsdp")},
    "sparse_dear": ("which scheduler 'dear_threshold' cannot exchange",
                    lambda: (EmbeddingNet(), None, {"scheduler": "dear"})),
    "sparse_plan": ("which the executor of a given allreduce plan cannot exchange",
                    lambda: (EmbeddingNet(), None, {"scheduler": _one_bucket_plan(EmbeddingNet())})),
    "meta": ("the model is on the meta device (e.g. 'features.0.weight' has no values)",
             lambda: (_meta_net(), None, {"scheduler": "mgwfbp"})),
    "meta_ddp": ("the model is on the meta device", lambda: (_meta_net(), None, {"scheduler": "ddp"})),
    "two_devices": ("the model's parameters are on several devices (cpu, meta)",
                    lambda: (_split_net(), None, {"scheduler": "mgwfbp"})),
    "foreign_params": ("the optimizer holds 2 trainable parameter(s) that are not the model's (e.g. one of shape "
                       "(1, 10))",
                       lambda: (UserNet(), nn.Linear(10, 1), {"scheduler": "dear_threshold"})),
    "model_name": ("model_name must be a non-empty string, got ''",
                   lambda: (UserNet(), None, {"scheduler": "mgwfbp", "model_name": ""})),
    "wrap_after_warmup": ("wrap_after_warmup must be True or False, got 'yes'",
                          lambda: (UserNet(), None, {"scheduler": "ddp_threshold", "wrap_after_warmup": "yes"})),
    # the plan-fits-model rule (repro.core.plan.plan_fit_refusal), checked once on the door's path
    "plan_module_view": ("that the model does not have in the 'tensor' view (e.g. 'features.0'); they are its "
                         "layers in the 'module' view",
                         lambda: (UserNet(), None, {"scheduler": _one_bucket_plan(UserNet(), "module")})),
    "plan_left_out": ("the plan leaves 1 layer(s) of the model out (e.g. 'features.0.weight'): every layer's "
                      "gradient must be in a bucket",
                      lambda: (UserNet(), None, {"scheduler": _one_bucket_plan(UserNet(), skip=1)})),
}


def _refusal(case: str) -> str:
    net, extra, kwargs = REFUSALS[case][1]()
    params = list(net.parameters()) + (list(extra.parameters()) if extra is not None else [])
    import repro

    try:
        repro.distribute(net, torch.optim.SGD(params, lr=0.1), **kwargs)
    except ValueError as e:
        assert "no_sync" not in net.__dict__  # nothing was attached
        return str(e)
    return "accepted"


def _step_original(model, dopt, opt, data) -> str:
    """One iteration of the loop with the original optimizer: the refusal's message ("" if none)."""
    x, y = data
    dopt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    try:
        opt.step()
    except ValueError as e:
        return str(e)
    return ""


def _replicas_differ(net: nn.Module) -> float:
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return max(float((e - flat).abs().max()) for e in everyone)


def misuse_ranks(ctx) -> dict:
    """Every case of this file that needs ranks, in one launch (see the module docstring)."""
    import repro

    rank = dist.get_rank()
    out: dict = {"refusals": {}}
    for turn in range(dist.get_world_size()):  # each rank alone, the other waiting
        if turn == rank:
            out["refusals"] = {case: _refusal(case) for case in REFUSALS}
        dist.barrier()

    data = _batches(rank, 6)
    # sparse gradients where DDP exchanges them: trains, replicas equal
    torch.manual_seed(0)
    emb = EmbeddingNet()
    model, dopt = repro.distribute(emb, torch.optim.SGD(emb.parameters(), lr=0.5), scheduler="ddp")
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        dopt.zero_grad()
        model(torch.randint(0, 50, (4, 3), generator=g)).sum().backward()
        dopt.step()
    out["sparse_ddp_differ"] = _replicas_differ(emb)
    out["sparse_ddp_module"] = model.module is emb
    dopt.remove()

    # "dear" is DeAR as released (dear_threshold); model.module is the user's module, state_dict unchanged
    torch.manual_seed(0)
    net = UserNet()
    keys, modules = list(net.state_dict()), list(net.modules())
    model, dopt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.05), scheduler="dear",
                                   warmup_steps=1, fit_repeats=1)
    _train(model, dopt, data[:3])
    dopt.flush()
    fresh = UserNet()
    fresh.load_state_dict(model.module.state_dict())  # DDP code's checkpoint: strict, no "module." prefix
    out["dear"] = {"solver": dopt.plan.solver, "family": dopt.plan.family, "scheduler": dopt._door.scheduler,
                   "module_is_net": model.module is net, "keys_kept": list(net.state_dict()) == keys,
                   "modules_kept": list(net.modules()) == modules, "differ": _replicas_differ(net)}
    dopt.remove()

    # the original optimizer stepped by mistake: refused at that step on every rank; the returned one
    # then finishes the iteration and training goes on (warm-up: mgwfbp's step 0; planned: DeAR's step 2)
    out["original"] = {}
    for sched, bad in (("mgwfbp", 0), ("dear_threshold", 2)):
        torch.manual_seed(0)
        net = UserNet()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        model, dopt = repro.distribute(net, opt, scheduler=sched, warmup_steps=1, fit_repeats=1)
        _train(model, dopt, data[:bad])
        message = _step_original(model, dopt, opt, data[bad])
        dopt.step()
        _train(model, dopt, data[bad + 1:bad + 3])
        dopt.flush()
        out["original"][sched] = {"message": message, "differ": _replicas_differ(net)}
        dopt.remove()
        opt.step()  # after remove(), the original trains alone, as remove()'s message says
    return out


@pytest.fixture(scope="module")
def ranks():
    return launch_local(misuse_ranks, 2, timeout_s=120, pg_timeout_s=30, quiet=True)


def _one_line(message: str) -> bool:
    return message.startswith("repro.distribute: ") and "\n" not in message


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(REFUSALS))
def test_misuse_is_refused_at_the_call_on_every_rank_alone(ranks, case):
    words = REFUSALS[case][0]
    for rank in ranks:
        message = rank["refusals"][case]
        assert _one_line(message) and words in message, (case, message)


@pytest.mark.distributed
def test_sparse_gradients_train_under_ddp(ranks):
    for rank in ranks:
        assert rank["sparse_ddp_differ"] == 0.0 and rank["sparse_ddp_module"]


@pytest.mark.distributed
def test_dear_is_the_released_threshold_fusion_and_model_module_is_the_users_module(ranks):
    for rank in ranks:
        row = rank["dear"]
        assert row["solver"] == row["scheduler"] == "dear_threshold" and row["family"] == "dear", row
        assert row["module_is_net"] and row["keys_kept"] and row["modules_kept"], row
        assert row["differ"] == 0.0, row


@pytest.mark.distributed
@pytest.mark.parametrize("sched", ["mgwfbp", "dear_threshold"])
def test_stepping_the_original_optimizer_is_refused_on_every_rank(ranks, sched):
    for rank in ranks:
        row = rank["original"][sched]
        assert _one_line(row["message"]) and "step the optimizer distribute returned" in row["message"], row
        assert row["differ"] == 0.0, row


# ---------------------------------------------------------------- one rank

ONE_RANK_TRAINS = ["mgwfbp", "dear", "bytescheduler", "ps_bsp", "ddp_threshold", "ddp", "local"]
ONE_RANK_REFUSED = {"omgs": ({"scheduler": "omgs"}, "'omgs' changes SGD's update on purpose"),
                    "network": ({"scheduler": "mgwfbp", "network": "10gbe-v100"}, "this job has 1 rank")}


def one_rank(ctx) -> dict:
    """At world size 1: each scheduler of ONE_RANK_TRAINS trains 4 steps, against plain SGD on the same
    data (the largest parameter difference, the returned module's type, the plan); ONE_RANK_REFUSED's
    messages."""
    import repro

    data = _batches(0, 4)
    torch.manual_seed(0)
    ref = UserNet()
    _train(ref, torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9), data)
    out = {}
    for sched in ONE_RANK_TRAINS:
        torch.manual_seed(0)
        net = UserNet()
        model, dopt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                                       scheduler=sched, warmup_steps=1)
        _train(model, dopt, data)
        dopt.flush()
        diff = max(float((a - b).abs().max()) for a, b in zip(net.parameters(), ref.parameters()))
        out[sched] = {"diff": diff, "module": type(model).__name__, "plan": dopt.plan is not None}
        dopt.remove()
    for case, (kwargs, _) in ONE_RANK_REFUSED.items():
        net = UserNet()
        try:
            repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1), **kwargs)
            out[case] = "accepted"
        except ValueError as e:
            out[case] = str(e)
    return out


@pytest.fixture(scope="module")
def alone():
    return launch_local(one_rank, 1, timeout_s=120, quiet=True)[0]


@pytest.mark.distributed
@pytest.mark.parametrize("sched", ONE_RANK_TRAINS)
def test_one_rank_trains_as_ddp_does(alone, sched):
    """Plain SGD's parameters exactly (an average over one rank is the identity, the update the same
    kernels); the DDP baselines return DDP's wrapper (ddp_threshold too: it runs as ddp), no plan is
    made (nothing to plan for)."""
    row = alone[sched]
    assert row["diff"] == 0.0, row
    ddp = sched in ("ddp", "ddp_threshold")
    assert (row["module"] == "DistributedDataParallel") == ddp and not row["plan"], row


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(ONE_RANK_REFUSED))
def test_one_rank_refuses_what_cannot_run_there(alone, case):
    message, words = alone[case], ONE_RANK_REFUSED[case][1]
    assert _one_line(message) and words in message, message


# ---------------------------------------------------------------- no ranks

def test_dear_is_the_papers_name_for_dear_threshold():
    from repro.core.schedulers import SCHEDULERS, canonical_name, get_scheduler, scheduler_names
    from repro.training.config import TrainConfig

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a paper's name is not deprecated
        assert get_scheduler("dear") is SCHEDULERS["dear_threshold"]
        assert TrainConfig(scheduler="dear").scheduler == "dear_threshold"
    assert canonical_name("dear") == "dear_threshold" and "dear" not in scheduler_names()


def test_only_the_ddp_baselines_exchange_sparse_gradients():
    from repro.core.schedulers import SCHEDULERS

    able = {name for name, s in SCHEDULERS.items() if s.sparse_gradients}
    assert able == {"ddp", "ddp_threshold", "local"}


def test_model_checks_read_the_model_alone():
    from repro.api import _model_refusal, _sparse_gradient_source

    net = UserNet()
    assert _model_refusal(net, torch.optim.SGD(net.parameters(), lr=0.1)) is None
    frozen = nn.Linear(2, 2).requires_grad_(False)  # not the model's, but never updated: no drift
    assert _model_refusal(net, torch.optim.SGD([*net.parameters(), *frozen.parameters()], lr=0.1)) is None
    assert _sparse_gradient_source(net) is None and _sparse_gradient_source(nn.Embedding(3, 2)) is None
    bag = nn.Sequential(nn.EmbeddingBag(5, 2, sparse=True))
    assert _sparse_gradient_source(bag).startswith("module '0' (EmbeddingBag(5, 2")
    lin = nn.Linear(2, 2)
    lin.weight.grad = torch.eye(2).to_sparse()  # a sparse gradient from a functional embedding, say
    assert _sparse_gradient_source(lin) == "parameter 'weight' (a torch.sparse_coo gradient)"


def test_module_is_the_plain_module_without_a_submodule_loop():
    from repro.api import _give_module

    net = UserNet()
    keys, modules, params = list(net.state_dict()), list(net.named_modules()), list(net.parameters())
    _give_module(net)
    assert net.module is net
    assert list(net.state_dict()) == keys and list(net.named_modules()) == modules
    assert list(net.parameters()) == params

    class Wrapper(nn.Module):  # a model with a submodule called "module" keeps it
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    w = Wrapper()
    _give_module(w)
    assert isinstance(w.module, nn.Linear)

    compiled = torch.compile(UserNet())  # compiles lazily: nothing runs here
    _give_module(compiled)
    assert compiled.module is compiled._orig_mod


def test_the_given_optimizer_refuses_steps_from_outside_the_package():
    from repro.api import _refuse_direct_steps

    class Door:  # what the hook reads of distribute's door
        removed = False

    net = nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    door = Door()
    _refuse_direct_steps(opt, door)
    with pytest.raises(ValueError) as e:
        opt.step()
    assert _one_line(str(e.value)) and "step the optimizer distribute returned" in str(e.value)
    with pytest.raises(ValueError, match="stepped directly"):
        torch.amp.GradScaler("cpu", enabled=False).step(opt)  # through torch's own code: still the user's call
    exec("opt.step()", {"__name__": "repro.runtime.fake", "opt": opt})  # this package's executors may
    door.removed = True
    opt.step()  # after remove(): the optimizer trains alone

    other = Door()
    _refuse_direct_steps(opt, other)
    gone = weakref.ref(other)
    del other
    assert gone() is None  # the hook does not keep the door (and its executor's buffers) alive
    opt.step()


def test_a_frozen_or_already_distributed_model_is_refused_in_one_sentence():
    """A model with every parameter frozen has nothing to exchange; a model repro.distribute already
    returned (it carries the package's no_sync) is named as such, not as "wrapped by DDP"."""
    from repro.api import _Door, _model_refusal

    net = UserNet().requires_grad_(False)
    message = _model_refusal(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert message.startswith("every parameter of the model is frozen (requires_grad=False)"), message
    assert "\n" not in message
    net = UserNet()
    door = object.__new__(_Door)  # what distribute attaches: the door's bound no_sync
    net.__dict__["no_sync"] = door.no_sync
    message = _model_refusal(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert message.startswith("the model is already distributed by repro"), message
    assert "DDP" not in message
    partly = UserNet()
    next(partly.parameters()).requires_grad_(False)  # some frozen: fine (fine-tuning)
    assert _model_refusal(partly, torch.optim.SGD(partly.parameters(), lr=0.1)) is None


def wrap_after_warmup_ranks(ctx) -> dict:
    """``ddp_threshold`` with ``wrap_after_warmup=True``: the warm-up runs on the user's model, the plan is
    made from the measured trace, then DDP's wrapper is the module to call (``optimizer.module``); the
    optimizer's public ``trace``, ``cost``, ``last_stamps`` and ``executor`` say what ran."""
    import repro
    from repro.core.planners import make_plan

    torch.manual_seed(0)
    net = UserNet()
    model, dopt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1), "ddp_threshold",
                                   threshold_bytes=4096, warmup_steps=2, wrap_after_warmup=True, model_name="usernet")
    out = {"returned_is_net": model is net, "during": [], "after": []}
    for i, (x, y) in enumerate(_batches(dist.get_rank(), 4)):
        out["during" if dopt.warming_up else "after"].append((dopt.module is net, dopt.trace is None,
                                                               type(dopt.executor).__name__))
        dopt.zero_grad()
        nn.functional.cross_entropy(dopt.module(x), y).backward()
        dopt.step()
        out["stamps"] = sorted(dopt.last_stamps)
    expected = make_plan("threshold", dopt.trace, dopt.cost, threshold_bytes=4096)
    out["plan_is_the_traces"] = dopt.plan.buckets == expected.buckets
    out["trace_model"] = dopt.trace.model
    out["differ"] = _replicas_differ(net)
    dopt.remove()
    return out


@pytest.mark.distributed
def test_wrap_after_warmup_measures_on_the_users_model_then_calls_the_wrapper():
    for r in launch_local(wrap_after_warmup_ranks, 2, timeout_s=180, quiet=True):
        assert r["returned_is_net"]
        assert r["during"] == [(True, True, "AllReduceExecutor")] * 2, r
        assert r["after"] and all(a == (False, False, "TorchDDPExecutor") for a in r["after"]), r
        assert r["plan_is_the_traces"] and r["trace_model"] == "usernet"
        assert r["stamps"] == ["backward_end", "backward_start", "exchange_end", "forward_start", "start"]
        assert r["differ"] == 0.0
