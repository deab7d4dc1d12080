"""OMGS-SGD with one budget for the model (topk_scope "model", this package's variant) selects as TopK-SGD
does, the paper's per-bucket rule (the default) does not on per-tensor buckets, and a run can be
repeated from its plan.

Why: with each bucket sending its own ceil(density x n) largest entries (topk_scope "bucket", the
paper's per-bucket rule), the budget goes where the elements are, not where the large gradients are.
On a CPU the online OMGS plans are nearly one bucket per tensor, so the small layers with large
gradients (the stem convolution, the classifier) sent a few entries per step while the large late
convolutions sent thousands: ResNet-18 at density 0.001 sent 146 classifier entries in 21 steps against
TopK-SGD's 8720, and ended at 3.7x TopK-SGD's loss (docs/omgs.md, "Selection"). topk_scope "model"
splits the same total between the buckets by where the model's largest entries were the step before.

- the split's two parts, :func:`budget_counts` and :func:`allocate_budget`, against brute force;
- the planners' defaults (every sparse planner: "bucket", the paper's rule; "model" when asked);
- on a memorisable task (2 ranks, tiny_resnet, 4 fixed batches per rank, 48 steps, density 0.01, one
  bucket per tensor as the online plans on a CPU), omgs's plan with topk_scope "model" ends within 15% of
  TopK-SGD's loss, while the same plan with the paper's per-bucket rule ends far above it (so the
  comparison can fail);
- repeatability: two runs given the plan an online run made (saved as a file) execute that plan and end
  with the same parameters, bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from repro.launch.local import launch_local
from repro.core.cost import CostModel
from repro.core.plan import Plan, PlanError
from repro.core.planners import make_plan
from repro.families.sparse.executor import TopKCompressor, allocate_budget, budget_counts
from repro.core.trace import Layer, Trace

DENSITY = 0.01
STEPS = 48
BATCHES = 4   # per rank, repeated: the loss must fall
MARGIN = 1.15  # omgs's last-pass loss at most this times TopK-SGD's (measured: 1.04-1.06, see test_omgs_trains_as_topk_sgd)


# ---- the split, piece by piece ----

def test_allocate_budget_splits_in_proportion_within_bounds():
    assert allocate_budget([0, 10, 30], [100, 100, 100], 43) == [1, 11, 31]  # 1 each, then 40 in proportion
    assert allocate_budget([10, 0, 30], [5, 100, 100], 40) == [5, 1, 34]  # a full bucket hands its excess on
    assert allocate_budget([1, 1], [10, 10], 5) == [3, 2]  # a tie goes to the lower index
    assert allocate_budget([0, 0, 7], [3, 3, 3], 9) == [3, 3, 3]  # everything: every bucket full
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        B = int(torch.randint(1, 12, (1,), generator=gen))
        sizes = torch.randint(1, 60, (B,), generator=gen).tolist()
        counts = (torch.randint(0, 50, (B,), generator=gen) * (torch.rand(B, generator=gen) < 0.7)).tolist()
        total = int(torch.randint(B, sum(sizes) + 1, (1,), generator=gen))
        k = allocate_budget(counts, sizes, total)
        assert sum(k) == total and all(1 <= a <= n for a, n in zip(k, sizes))
    with pytest.raises(ValueError, match="cannot split"):
        allocate_budget([1, 1], [2, 2], 5)
    with pytest.raises(ValueError, match="cannot split"):
        allocate_budget([1, 1], [2, 2], 1)


def _sent(flat: torch.Tensor, k: int) -> torch.Tensor:
    return flat[flat.abs().topk(k).indices]


def test_budget_counts_are_the_model_wide_top_k_per_bucket():
    gen = torch.Generator().manual_seed(1)
    # small buckets (every entry sampled): exactly the model-wide top-K, bucket by bucket
    buckets = [torch.randn(n, generator=gen) * s for n, s in ((300, 10.0), (1000, 1.0), (64, 3.0), (900, 0.1))]
    K = 60
    split = allocate_budget([1] * 4, [b.numel() for b in buckets], K)  # a wrong split: the counts say where
    counts = budget_counts(buckets, [_sent(b, k) for b, k in zip(buckets, split)], K)
    tau = torch.cat(buckets).abs().topk(K).values.min()
    assert counts.dtype == torch.int64
    assert counts.tolist() == [int((b.abs() >= tau).sum()) for b in buckets]
    assert counts.sum() == K and counts[0] > split[0] and counts[3] < split[3]
    # large buckets (sampled below what each sent): close to the model-wide counts
    big = [torch.randn(200_000, generator=gen) * 5.0, torch.randn(1_000_000, generator=gen),
           torch.randn(5000, generator=gen) * 20.0]
    K = 2000
    split = [math.ceil(K * b.numel() / sum(x.numel() for x in big)) for b in big]
    split[1] -= sum(split) - K
    counts = budget_counts(big, [_sent(b, k) for b, k in zip(big, split)], K)
    tau = torch.cat(big).abs().topk(K).values.min()
    exact = [int((b.abs() >= tau).sum()) for b in big]
    assert abs(int(counts.sum()) - K) <= 0.15 * K
    assert all(abs(c - e) <= 0.2 * e + 5 for c, e in zip(counts.tolist(), exact))


def test_compressor_sends_the_k_it_is_given():
    x = torch.tensor([0.1, -5.0, 2.0, 0.0, -3.0, 1.0])
    values, indices = TopKCompressor(0.5).compress(x, 2)
    assert sorted(indices.tolist()) == [1, 4] and torch.equal(values, x[indices.long()])
    with pytest.raises(ValueError, match="k must be in 1..6"):
        TopKCompressor(0.5).compress(x, 7)


def _trace(names_sizes) -> Trace:
    return Trace("m", 8, "cpu", "float32", [Layer(n, s, 4 * s, 1e-3, 1e-3) for n, s in names_sizes])


def test_every_sparse_planner_keeps_the_papers_rule_unless_asked():
    trace = _trace([(f"l{i}", 100 * (i + 1)) for i in range(6)])
    cost = CostModel.linear(2, 1e-6, 1e-10, "sparse_allgather").with_topk(1e-10)
    for solver, scope in (("omgs", None), ("omgs_optimal", None), ("topk_layerwise", None), ("topk_single", None)):
        plan = make_plan(solver, trace, cost, density=0.05)
        assert plan.option("topk_scope") == scope, solver
        assert Plan.from_dict(plan.to_dict()) == plan
        assert make_plan(solver, trace, cost, density=0.05, topk_scope="bucket").option("topk_scope") is None
        assert make_plan(solver, trace, cost, density=0.05, topk_scope="model").option("topk_scope") == "model"
        with pytest.raises(ValueError, match="topk_scope must be one of bucket, model"):
            make_plan(solver, trace, cost, density=0.05, topk_scope="layer")
    with pytest.raises(PlanError, match="topk_scope"):
        Plan.from_dict({"family": "sparse", "buckets": [["l0"]], "options": {"density": 0.1, "topk_scope": "x"}})


# ---- training: 2 ranks ----

def _per_tensor_plan(model, solver: str):
    """``solver``'s plan of ``model`` with one bucket per tensor, as the online OMGS plans on a busy CPU are:
    planned from a trace whose backward gaps (1 ms per tensor) dwarf the all-gather start-up (1 us)."""
    from repro.workload.layers import layer_parameters

    trace = _trace([(n, sum(p.numel() for _, p in ps)) for n, ps in layer_parameters(model).items()])
    cost = CostModel.linear(2, 1e-6, 1e-10, "sparse_allgather").with_topk(1e-10)
    return make_plan(solver, trace, cost, density=DENSITY)


def _train(model, plan, data, steps: int) -> tuple[list[float], dict]:
    import torch.distributed as dist

    import repro

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = repro.distribute(model, opt, scheduler=plan)
    losses = []
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / dist.get_world_size())
    executed = opt.plan
    opt.remove()
    return losses, {"plan": executed, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def selection_and_repeatability(ctx, plan_path: str) -> dict:
    """Per rank: the last pass's mean loss (over ranks) of TopK-SGD, omgs's plan, and omgs's plan with the
    per-bucket rule; then an online omgs run whose plan is saved to ``plan_path`` and two runs given it."""
    import torch.distributed as dist

    import repro
    from repro.workload.models import build_model, make_batch

    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    data = [make_batch("tiny_resnet", 8, generator=gen) for _ in range(BATCHES)]
    out: dict = {}
    for name in ("topk_single", "omgs", "omgs_bucket"):
        torch.manual_seed(0)
        model = build_model("tiny_resnet")
        plan = _per_tensor_plan(model, name.removesuffix("_bucket"))
        if name == "omgs":  # one budget for the model (the variant), same buckets as the paper's rule below
            plan = plan.replace(options={"density": DENSITY, "topk_scope": "model"})
        losses, _ = _train(model, plan, data, STEPS)
        out[name] = {"last_pass": sum(losses[-BATCHES:]) / BATCHES, "buckets": plan.num_buckets,
                     "topk_scope": plan.option("topk_scope")}
    # repeatability: an online plan (measured timings), saved, then given to two runs
    torch.manual_seed(0)
    model = build_model("tiny_resnet")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = repro.distribute(model, opt, scheduler="omgs", density=DENSITY, warmup_steps=2, fit_repeats=1)
    for step in range(3):
        x, y = data[step % BATCHES]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    online = opt.plan
    opt.remove()
    if dist.get_rank() == 0:
        online.save(plan_path)
    dist.barrier()
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        runs.append(_train(build_model("tiny_resnet"), plan_path, data, 12)[1])
    out["online"] = online.to_dict()
    out["given"] = [r["plan"].to_dict() for r in runs]
    out["params_diff"] = max((runs[0]["params"][n] - runs[1]["params"][n]).abs().max().item() for n in runs[0]["params"])
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    path = tmp_path_factory.mktemp("omgs_plan") / "plan.json"
    return launch_local(selection_and_repeatability, 2, args=(str(path),), timeout_s=300)


@pytest.mark.distributed
@pytest.mark.slow
def test_omgs_trains_as_topk_sgd(ranks):
    """omgs's plan, one bucket per tensor (29), ends within MARGIN of TopK-SGD's loss; the same buckets
    under the per-bucket rule end far above (measured here 0.28 against TopK-SGD's 0.27, and 1.00 with the
    per-bucket rule; over 2 data seeds x densities 0.01 and 0.05 omgs was 1.04-1.06x TopK-SGD and the
    per-bucket rule 2.1-3.7x). The margin is what one step's lag of the split costs, with room: the runs are
    deterministic, so it only absorbs other platforms' float differences."""
    r = ranks[0]
    assert r["topk_single"]["buckets"] == 1 and r["omgs"]["buckets"] == r["omgs_bucket"]["buckets"] == 29
    assert r["omgs"]["topk_scope"] == "model" and r["omgs_bucket"]["topk_scope"] is None
    topk = r["topk_single"]["last_pass"]
    assert topk < 0.5 * math.log(10)  # TopK-SGD memorises (the loss starts at ln 10)
    assert r["omgs"]["last_pass"] <= MARGIN * topk, r
    assert r["omgs_bucket"]["last_pass"] > 1.5 * topk, r  # the comparison can fail: the paper's rule does not
    assert ranks[1]["omgs"] == r["omgs"]


@pytest.mark.distributed
@pytest.mark.slow
def test_a_run_given_the_saved_online_plan_repeats_bit_for_bit(ranks):
    """The online plan comes from timings measured on the live machine, so two online runs may plan
    differently (docs/omgs.md, "Repeatable runs"); given the plan file, runs execute exactly that plan and
    end with the same parameters."""
    for r in ranks:
        assert r["online"]["family"] == "sparse" and "topk_scope" not in r["online"]["options"]  # the paper's rule
        assert r["given"][0] == r["given"][1] == r["online"]
        assert r["params_diff"] == 0.0
    assert ranks[0]["online"] == ranks[1]["online"]
