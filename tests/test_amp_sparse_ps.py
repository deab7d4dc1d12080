"""GradScaler with the two families that could not take one: the sparse family (error feedback) and
the co-located parameter server, through :func:`repro.distribute` on 2 gloo ranks (issue 21).

The written reference of the math: a GradScaler step is the same step without a scaler (the scale
is a power of two, so scaling and unscaling are exact), and a step with an inf/nan on any rank is as
if that batch had not been run, on every rank (DDP + GradScaler's rule). So each case runs twice with
the same plan, weights and data:

- with a ``torch.amp.GradScaler`` (init 2**10, growth every 2 steps, so the scale changes during the
  run), rank 1's loss made infinite on step ``INF_STEP``;
- without a scaler, both ranks leaving batch ``INF_STEP`` out.

They must end at the same parameters **bit for bit**: the top-k selection, error-feedback residuals,
the sparse average and the owners' updates see the same floats in the same order. What fails it:
residuals kept in scaled units (the scale doubles every 2 steps here, so old residuals would be
added at the wrong scale), a skipped step that left its residuals, pushes or (sparse topk_scope
"model") its counts for the next split behind, a step skipped on
one rank only (the replicas then disagree), still-scaled gradients applied (off by 2**10).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from repro.launch.local import launch_local

STEPS = 7
INF_STEP = 3
INIT_SCALE = 2.0 ** 10
GROWTH_INTERVAL = 2
MAX_NORM = 0.5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _batches(rank: int) -> list:
    g = torch.Generator().manual_seed(200 + rank)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(STEPS)]


def _plan(case: dict, model: nn.Module):
    from repro.core.cost import CostModel, Linear
    from repro.core.plan import Plan
    from repro.core.planners import make_plan
    from repro.core.trace import Layer, Trace
    from repro.workload.layers import layer_parameters

    names = list(layer_parameters(model, "tensor"))
    if case["family"] == "sparse":  # three buckets, layers merged as OMGS does
        groups = [names[:2], names[2:5], names[5:]]
        scope = {"topk_scope": case["topk_scope"]} if "topk_scope" in case else {}
        return Plan.from_dict({"solver": "omgs", "family": "sparse", "options": {"density": 0.25, **scope},
                               "buckets": [{"layers": g, "messages": ["sparse_allgather"]} for g in groups]})
    layers = []
    for name, params in layer_parameters(model, "tensor").items():
        n = sum(p.numel() for _, p in params)
        layers.append(Layer(name, n, 4 * n, 1e-4, 1e-4 + 2e-8 * n))
    trace = Trace("mlp", 16, "cpu", "float32", layers)
    cost = CostModel(2, {"push": Linear(1e-4, 1e-9), "pull": Linear(1e-4, 1e-9)})
    mode = case["mode"]
    if mode == "osp":
        return make_plan("osp", trace, cost, servers=2, stage1_share=0.5, importance="position")
    if mode == "ssp":
        return make_plan("ps_ssp", trace, cost, servers=2, staleness=1)
    return make_plan(f"ps_{mode}", trace, cost, servers=2)


def _run(case: dict, scaled: bool, inject: bool) -> dict:
    import repro

    rank = dist.get_rank()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL) if scaled else None
    model, opt = repro.distribute(model, optimizer, scheduler=_plan(case, model), grad_scaler=scaler)
    clip = case.get("clip", False)
    scales = []
    for i, (x, y) in enumerate(_batches(rank)):
        if i == INF_STEP and not scaled and inject:
            continue  # the reference leaves the batch out on every rank
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        if scaled:
            if inject and i == INF_STEP and rank == 1:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            if clip:
                opt.synchronize()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        else:
            loss.backward()
            if clip:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
    opt.flush()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    opt.remove()
    return {"params": params, "scales": scales}


def amp_families(ctx, cases: list[dict]) -> list[dict]:
    torch.use_deterministic_algorithms(True)
    out = []
    for case in cases:
        scaled = _run(case, scaled=True, inject=True)
        dropped = _run(case, scaled=False, inject=True)
        row = {"case": case, "diff": (scaled["params"] - dropped["params"]).abs().max().item(),
               "scales": scaled["scales"], "params": scaled["params"]}
        if case.get("control"):
            full = _run(case, scaled=False, inject=False)   # the batch kept: the skip is visible
            clean = _run(case, scaled=True, inject=False)   # no inf: the scaler changes nothing
            row["skip_matters"] = (full["params"] - dropped["params"]).abs().max().item()
            row["clean_diff"] = (full["params"] - clean["params"]).abs().max().item()
            row["clean_scales"] = clean["scales"]
        out.append(row)
    return out


CASES = [
    {"family": "sparse", "control": True},
    {"family": "sparse", "clip": True},
    {"family": "sparse", "topk_scope": "model", "control": True},  # a skipped step leaves the split as it was
    {"family": "ps", "mode": "bsp", "control": True},
    {"family": "ps", "mode": "osp"},
    {"family": "ps", "mode": "ssp"},
    {"family": "ps", "mode": "asp", "clip": True},
]


@pytest.fixture(scope="module")
def two_ranks():
    return launch_local(amp_families, 2, args=(CASES,), timeout_s=300)


@pytest.mark.distributed
@pytest.mark.slow
def test_gradscaler_step_equals_the_run_without_that_batch(two_ranks):
    for case, r0, r1 in zip(CASES, *two_ranks):
        for row in (r0, r1):
            assert row["diff"] == 0.0, (case, row["diff"])
            s = row["scales"]   # backed off at the inf step on every rank, then grew again
            assert s[INF_STEP] == s[INF_STEP - 1] / 2 and max(s) > INIT_SCALE, (case, s)
        assert r0["scales"] == r1["scales"], case
        assert torch.equal(r0["params"], r1["params"]), case  # replicas agree bit for bit


@pytest.mark.distributed
@pytest.mark.slow
def test_without_an_inf_the_scaler_changes_nothing_and_the_skip_is_visible(two_ranks):
    for case, row in zip(CASES, two_ranks[0]):
        if not case.get("control"):
            continue
        # the scale doubled every 2 steps: residuals in scaled units would be added at the wrong scale
        assert max(row["clean_scales"]) >= 4 * INIT_SCALE, case
        assert row["clean_diff"] == 0.0, case
        assert row["skip_matters"] > 1e-4, case
