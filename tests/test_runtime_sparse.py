"""The sparse family's runtime (repro.families.sparse.executor) does OMGS-SGD's math exactly (gloo, 2 and 3 ranks).

- the executor, given each planner's plan, leaves the parameters a single-process reference of top-k
  SGD with error feedback computes over every worker's data (written from the math, not from the
  executor; under topk_scope "model" given the executor's per-step split); without error feedback the
  reference differs, so the comparison can fail;
- the residual memory conserves mass exactly; the compressor keeps the largest magnitudes;
- through ``repro train``: density 1 is dense S-SGD (wfbp's parameters), the online plan is the
  planner's plan of the measured trace and calibrated cost, buckets.csv holds the compression times,
  and a language model is evaluated with perplexity.
"""

import math

import pandas as pd
import pytest
import torch

from repro.launch.local import launch_local
from repro.core.plan import Plan, PlanError
from repro.core.planners import make_plan
from repro.results.runs import load_run
from repro.families.sparse.executor import ResidualMemory, SparseExecutor, TopKCompressor
from tests.runtime_targets import sparse_executor_vs_reference, sparse_suite

PLANNERS = ["topk_layerwise", "topk_single", "omgs", "omgs_optimal"]
# two all-gathers for some plans, one packed message for others
CASES = [{"planner": p, "density": 0.05, "pack": i % 2 == 1, "control": i == 0} for i, p in enumerate(PLANNERS)]
CASES[-1]["topk_scope"] = "model"  # omgs_optimal with one budget for the model (the variant); omgs the paper's rule
COMMON = {"steps": 3, "warmup_steps": 2, "batch_size": 8, "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}


def _max_diff(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in a)


def _fake_ptb(root):
    words = [f"w{i}" for i in range(40)]
    gen = torch.Generator().manual_seed(0)
    for split, lines in (("train", 200), ("valid", 8), ("test", 8)):
        text = "\n".join(" ".join(words[int(j)] for j in torch.randint(0, 40, (9,), generator=gen))
                         for _ in range(lines))
        (root / f"ptb.{split}.txt").write_text(text + "\n")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("sparse_runs")
    data = tmp_path_factory.mktemp("sparse_data")
    (data / "ptb").mkdir()
    _fake_ptb(data / "ptb")
    runs = [{"model": "tiny_resnet", "scheduler": "wfbp", **COMMON},
            {"model": "tiny_resnet", "scheduler": "omgs", "density": 1.0, **COMMON},
            {"model": "tiny_resnet", "scheduler": "omgs", "density": 0.01, **COMMON, "record_timeline": True,
             "results_dir": str(runs_dir), "run_id": "omgs"},
            {"model": "tiny_lstm", "scheduler": "topk_single", "density": 0.01, "dataset": "ptb", "epochs": 1,
             "warmup_steps": 1, "batch_size": 4}]
    out = launch_local(sparse_suite, 2, args=(CASES, runs), timeout_s=300, env={"REPRO_DATA_DIR": str(data)})
    return out, runs_dir


@pytest.mark.distributed
def test_each_planner_matches_the_written_reference(two_ranks):
    (rank0, rank1), _ = two_ranks
    buckets = [c["buckets"] for c in rank0["cases"]]
    assert buckets[0] == 29 and buckets[1] == 1 and 1 < buckets[2] < 29 and 1 < buckets[3] <= 29
    assert [c["messages"] for c in rank0["cases"]] == [2, 1, 2, 1]
    for case, r0, r1 in zip(CASES, rank0["cases"], rank1["cases"]):
        assert r0["diff"] < 1e-6 and r1["diff"] < 1e-6, case["planner"]
        assert _max_diff(r0["params"], r1["params"]) == 0.0, case["planner"]  # ranks agree exactly
    # the comparison can fail: without error feedback the reference ends elsewhere
    assert rank0["cases"][0]["diff_without_error_feedback"] > 1e-4
    # a plan with topk_scope "model" splits one budget between its buckets: the first step sends
    # ceil(density x n) per bucket, later steps move entries between buckets, the total unchanged
    for case, r0, r1 in zip(CASES, rank0["cases"], rank1["cases"]):
        model_scope = case.get("topk_scope") == "model"
        assert r0["topk_scope"] == ("model" if model_scope else "bucket")
        assert r0["splits"] == r1["splits"]  # every rank sends the same k_b
        first, *later = r0["splits"]
        assert all(sum(s) == sum(first) for s in later)
        assert (any(s != first for s in later) if model_scope and len(first) > 1 else all(s == first for s in later))
    # and the plans matter: different groupings, different parameters
    assert _max_diff(rank0["cases"][0]["params"], rank0["cases"][1]["params"]) > 1e-4


@pytest.mark.distributed
def test_three_ranks_match_the_reference():
    cases = [dict(c, pack=not c["pack"], control=False) for c in CASES]  # the other message layout
    out = launch_local(sparse_executor_vs_reference, 3, args=("tiny_vgg", cases, 2, 4), timeout_s=300)
    assert [r["buckets"] for r in out[0]][:2] == [14, 1]
    for case, *ranks in zip(cases, *out):
        assert all(r["diff"] < 1e-6 for r in ranks), case
        assert _max_diff(ranks[0]["params"], ranks[2]["params"]) == 0.0


@pytest.mark.distributed
def test_density_one_is_dense_sgd(two_ranks):
    (rank0, rank1), _ = two_ranks
    wfbp, dense = rank0["runs"][0], rank0["runs"][1]
    assert _max_diff(dense["params"], wfbp["params"]) < 1e-5
    sparse = rank0["runs"][2]
    assert _max_diff(sparse["params"], wfbp["params"]) > 1e-4  # density 0.01 is not dense
    assert _max_diff(rank1["runs"][2]["params"], sparse["params"]) == 0.0


@pytest.mark.distributed
def test_online_plan_cost_and_timeline(two_ranks):
    (rank0, _), runs_dir = two_ranks
    run = load_run(runs_dir / "omgs")
    assert run.plan.family == "sparse" and run.plan.option("density") == 0.01
    assert run.cost.topk_gamma_s > 0 and run.cost.line("sparse_allgather").b_s_per_byte >= 0
    expected = make_plan("omgs", run.trace, run.cost, density=0.01)
    assert run.plan.buckets == expected.buckets  # the runtime executed the planner's plan
    assert rank0["runs"][2]["summary"]["predicted_iteration_s"] == pytest.approx(expected.meta["iteration_s"])
    b = pd.read_csv(runs_dir / "omgs" / "buckets.csv")
    assert len(b) == run.plan.num_buckets
    assert {"compress_start_s", "compress_end_s", "start_s", "end_s", "k", "numel"} <= set(b.columns)
    assert (b.compress_start_s <= b.compress_end_s).all() and (b.compress_end_s <= b.start_s).all()
    assert (b.start_s <= b.end_s).all()
    # omgs's plan keeps the paper's per-bucket rule: each bucket sends its own ceil(density x n)
    assert run.plan.option("topk_scope") is None
    assert b.k.sum() == sum(math.ceil(0.01 * n - 1e-9) for n in b.numel) and ((b.k >= 1) & (b.k <= b.numel)).all()


@pytest.mark.distributed
def test_language_model_reports_perplexity(two_ranks):
    (rank0, _), _ = two_ranks
    ep = rank0["runs"][3]["summary"]["epochs"][-1]
    assert ep["test_perplexity"] == pytest.approx(math.exp(ep["test_loss"]))
    assert 0 <= ep["test_accuracy"] <= 1 and 1 < ep["test_perplexity"] < 2000  # vocabulary of 1000


def test_residual_memory_conserves_mass_exactly():
    gen = torch.Generator().manual_seed(0)
    memory, comp = ResidualMemory(), TopKCompressor(0.1)
    for _ in range(3):
        grad = torch.randn(1000, generator=gen)
        old = memory.residuals.get("b", torch.zeros(1000)).clone()
        compensated = memory.compensate("b", grad.clone())
        assert torch.equal(compensated, grad + old)
        values, indices = comp.compress(compensated)
        memory.update("b", compensated, indices)
        sent = comp.decompress(values, indices, torch.zeros(1000))
        assert torch.equal(sent + memory.residuals["b"], grad + old)  # nothing lost, bit for bit
        assert (memory.residuals["b"][indices.long()] == 0).all()


def test_topk_compressor_keeps_the_largest_magnitudes():
    x = torch.tensor([0.1, -5.0, 2.0, 0.0, -3.0, 1.0])
    values, indices = TopKCompressor(0.5).compress(x)  # k = 3
    assert indices.dtype == torch.int32 and sorted(indices.tolist()) == [1, 2, 4]
    assert torch.equal(values, x[indices.long()])
    assert TopKCompressor(1e-9).count(10) == 1 and TopKCompressor(1.0).count(10) == 10
    out = TopKCompressor.decompress(torch.tensor([1.0, 2.0]), torch.tensor([3, 3], dtype=torch.int32),
                                    torch.zeros(5))
    assert out.tolist() == [0, 0, 0, 3.0, 0]  # repeated indices add up
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\]"):
        TopKCompressor(0)


def test_executor_refuses_plans_it_cannot_run():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(PlanError, match="SparseExecutor executes 'sparse' plans, got a 'allreduce' plan"):
        SparseExecutor(model, Plan.from_dict({"buckets": [["weight", "bias"]]}))
    def sparse(*layers):
        return Plan.from_dict({"family": "sparse", "options": {"density": 0.1},
                               "buckets": [{"layers": list(layers), "messages": ["sparse_allgather"]}]})

    with pytest.raises(PlanError, match="plan leaves 1 layer"):
        SparseExecutor(model, sparse("weight"))
    with pytest.raises(PlanError, match="plan names 1 layer"):
        SparseExecutor(model, sparse("weight", "bias", "nope"))


def test_config_refuses_what_the_sparse_schedulers_cannot_do():
    from repro.train import TrainConfig, config_from_argv

    with pytest.raises(ValueError, match="wire_dtype float16 does not apply to scheduler 'omgs'"):
        TrainConfig(scheduler="omgs", wire_dtype="float16")
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\]"):
            TrainConfig(scheduler="omgs", density=bad)
    with pytest.raises(ValueError, match="preset '10gbe-v100' has no sparse_allgather line"):
        TrainConfig(scheduler="omgs", network="10gbe-v100").check_world(2)
    with pytest.raises(ValueError, match="preset '1gbe-allgather' has no allreduce line"):
        TrainConfig(scheduler="mgwfbp", network="1gbe-allgather").check_world(2)
    TrainConfig(scheduler="omgs_optimal", network="1gbe-allgather").check_world(4)
    TrainConfig(scheduler="omgs", network="10gbe-k80").check_world(3)  # per-hop presets have every line
    cfg, _ = config_from_argv(["--scheduler", "topk_layerwise", "--density", "0.004"])
    assert cfg.density == 0.004


@pytest.mark.distributed
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_communicator_unpacks_what_it_packed(dtype):
    import torch.distributed as dist

    from repro.families.sparse.executor import AllGatherCommunicator

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = AllGatherCommunicator()
        values = torch.tensor([1.5, -2.25, 3.0], dtype=dtype)
        indices = torch.tensor([7, 0, 2], dtype=torch.int32)
        for packed in (False, True):
            ex = comm.start(values, indices, packed)
            assert len(ex.outputs) == (1 if packed else 2)
            v, i = comm.finish(ex)
            assert v.dtype == dtype and torch.equal(v, values) and torch.equal(i, indices)
    finally:
        dist.destroy_process_group()
