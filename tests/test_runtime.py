"""The runtime executes plans exactly: every scheduler ends with DDP's parameters (2 gloo ranks)."""

import json

import pytest
import torch

from repro.launch.local import launch_local
from repro.core.plan import Plan
from repro.core.planners import make_plan
from repro.results.runs import load_run
from tests.runtime_targets import plan_errors, train_params

SCHEDULERS = ["wfbp", "syncea", "threshold", "mgwfbp", "optimal", "ddp_threshold", "local"]
COMMON = {"steps": 4, "warmup_steps": 2, "batch_size": 8, "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4,
          "threshold_bytes": 40_000}


def _max_diff(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runtime_runs")


@pytest.fixture(scope="module")
def resnet_runs(runs_dir):
    runs = [{"model": "tiny_resnet", "scheduler": "ddp", **COMMON}]
    runs += [{"model": "tiny_resnet", "scheduler": s, **COMMON} for s in SCHEDULERS]
    runs += [{"model": "tiny_resnet", "scheduler": "mgwfbp", "view": "module", **COMMON},
             {"model": "tiny_resnet", "scheduler": "optimal", "wire_dtype": "float16", **COMMON},
             {"model": "tiny_resnet", "scheduler": "ddp_buckets", **COMMON}]
    for i, r in enumerate(runs):
        r.update(results_dir=str(runs_dir), run_id=f"{i}_{r['scheduler']}")
    return launch_local(train_params, 2, args=(runs,), timeout_s=300)


@pytest.mark.distributed
def test_every_scheduler_matches_ddp(resnet_runs):
    rank0, rank1 = resnet_runs
    ddp = rank0[0]["params"]
    for i, s in enumerate(SCHEDULERS, start=1):
        if s == "local":
            continue
        assert _max_diff(rank0[i]["params"], ddp) < 1e-5, s
        assert _max_diff(rank1[i]["params"], rank0[i]["params"]) == 0.0, s  # ranks agree
        # BatchNorm statistics follow DDP's broadcast_buffers, on every rank
        assert _max_diff(rank0[i]["buffers"], rank0[0]["buffers"]) < 1e-5, s
        assert _max_diff(rank1[i]["buffers"], rank1[0]["buffers"]) < 1e-5, s
    assert _max_diff(rank0[8]["params"], ddp) < 1e-5  # module view
    assert _max_diff(rank0[10]["params"], ddp) < 1e-5  # DDP's bucketing on our executor


@pytest.mark.distributed
def test_the_comparison_can_fail(resnet_runs):
    # without communication the ranks drift apart (different data) and away from DDP
    rank0, rank1 = resnet_runs
    local = SCHEDULERS.index("local") + 1
    assert _max_diff(rank0[local]["params"], rank0[0]["params"]) > 1e-3
    assert _max_diff(rank0[local]["params"], rank1[local]["params"]) > 1e-3


@pytest.mark.distributed
def test_fp16_wire_is_close_but_not_identical(resnet_runs):
    rank0, rank1 = resnet_runs
    fp16 = rank0[9]
    assert fp16["summary"]["wire_dtype"] == "float16"
    d = _max_diff(fp16["params"], rank0[0]["params"])
    assert 0 < d < 5e-3
    assert _max_diff(rank1[9]["params"], fp16["params"]) == 0.0


@pytest.mark.distributed
def test_plans_are_what_the_planners_make_of_the_measured_trace(resnet_runs, runs_dir):
    s = {SCHEDULERS[i - 1]: r["summary"] for i, r in enumerate(resnet_runs[0][1:8], start=1)}
    assert s["syncea"]["buckets"] == 1
    assert s["wfbp"]["buckets"] == 29  # tiny_resnet has 29 parameter tensors
    assert s["ddp_threshold"]["buckets"] == s["threshold"]["buckets"] > 1
    for i, name in enumerate(SCHEDULERS, start=1):
        if name == "local":
            continue
        run = load_run(runs_dir / f"{i}_{name}")
        trace, plan, cost = run.trace, run.plan, run.cost
        options = {"threshold_bytes": COMMON["threshold_bytes"]} if "threshold" in name else {}
        expected = make_plan("threshold" if name == "ddp_threshold" else name, trace, cost, **options)
        assert plan.buckets == expected.buckets, name  # the runtime executed the planner's plan
        assert s[name]["predicted_iteration_s"] == pytest.approx(expected.meta["iteration_s"], rel=1e-9)
        # a partition of the 29 tensors into contiguous groups, in backward order
        groups = plan.groups(trace)
        assert sorted(i for g in groups for i in g) == list(range(29))
        assert all(sorted(g) == list(range(min(g), max(g) + 1)) for g in groups)
        assert [max(g) for g in groups] == sorted((max(g) for g in groups), reverse=True)
    run = load_run(runs_dir / f"{SCHEDULERS.index('optimal') + 1}_optimal")
    best = run.plan.meta["iteration_s"]
    for other in ("mgwfbp", "wfbp", "syncea"):
        assert best <= make_plan(other, run.trace, run.cost).meta["iteration_s"] * (1 + 1e-12), other
    fp16 = load_run(runs_dir / "9_optimal")
    assert fp16.plan.wire_dtype == "float16"
    assert fp16.plan.buckets == make_plan("optimal", fp16.trace, fp16.cost, wire_dtype="float16").buckets


@pytest.mark.distributed
def test_bert_and_vgg_match_ddp():
    runs = [{"model": m, "scheduler": s, **COMMON, "steps": 3} for m in ("tiny_bert", "tiny_vgg")
            for s in ("ddp", "mgwfbp")]
    rank0, _ = launch_local(train_params, 2, args=(runs,), timeout_s=300)
    assert _max_diff(rank0[1]["params"], rank0[0]["params"]) < 1e-5
    assert _max_diff(rank0[3]["params"], rank0[2]["params"]) < 1e-5


@pytest.mark.distributed
def test_results_are_written(tmp_path):
    runs = [{"model": "tiny_vgg", "scheduler": "mgwfbp", "steps": 3, "warmup_steps": 1, "batch_size": 4,
             "results_dir": str(tmp_path), "run_id": "r1", "record_timeline": True, "compute_steps": 2}]
    launch_local(train_params, 2, args=(runs,), timeout_s=300)
    out = tmp_path / "r1"
    for f in ("iterations.csv", "buckets.csv", "trace.json", "trace_inrun.json", "plan.json", "cost.json", "run.json"):
        assert (out / f).is_file(), f
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1"]  # no temporary folder left
    run = json.loads((out / "run.json").read_text())
    assert run["summary"]["world_size"] == 2 and run["summary"]["backend"] == "gloo"
    assert run["environment"]["torch"] == torch.__version__
    assert run["environment"]["threads_per_rank"] == 1 and run["environment"]["cpu_count"] >= 1
    assert load_run(out).trace.overheads.update_s > 0  # measured, typed
    assert run["summary"]["compute_s"] > 0
    import pandas as pd

    buckets = pd.read_csv(out / "buckets.csv")
    assert (buckets.end_s >= buckets.start_s).all() and len(buckets) == Plan.load(out / "plan.json").num_buckets
    assert len(pd.read_csv(out / "iterations.csv")) == 3


@pytest.mark.distributed
def test_plan_must_cover_the_model():
    from repro.families.allreduce.executor import BucketedAllReduce

    with pytest.raises(RuntimeError, match="not initialised"):
        BucketedAllReduce(torch.nn.Linear(2, 2), Plan.from_dict({"buckets": [["weight", "bias"]]}))
    unknown, missing = launch_local(plan_errors, 1, timeout_s=120)[0]
    assert "plan names 1 layer(s) that the model does not have" in unknown and "'extra'" in unknown
    assert "plan leaves 1 layer(s) of the model out" in missing and "'bias'" in missing


@pytest.mark.distributed
def test_a_taken_run_id_is_refused_before_training(tmp_path):
    from repro.launch.local import RankFailedError

    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "run.json").write_text("{}")
    runs = [{"model": "tiny_vgg", "scheduler": "local", "steps": 1, "warmup_steps": 1, "batch_size": 4,
             "results_dir": str(tmp_path), "run_id": "r1"}]
    with pytest.raises(RankFailedError, match="run 'r1' already exists"):
        launch_local(train_params, 1, args=(runs,), timeout_s=120)
    assert (tmp_path / "r1" / "run.json").read_text() == "{}"
