"""repro.distribute: a user's own model and loop, one call (issue 21's door, first slice)."""

from __future__ import annotations

import pytest
import torch

import repro
from repro.launch.local import launch_local
from tests import api_targets


def test_distribute_without_a_process_group_is_one_clear_error():
    net = api_targets.UserNet()
    with pytest.raises(ValueError, match="process group is not initialised"):
        repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1))


def test_import_repro_stays_torch_free():
    import subprocess
    import sys

    code = "import sys, repro; assert 'torch' not in sys.modules; print(repro.__version__)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# Two gloo ranks: every gradient exchange here adds two float32 numbers per element (exact up to the
# order, and a + b == b + a in IEEE arithmetic), then halves them (exact), as DDP does; so the
# exchanged gradients equal DDP's bit for bit and only the optimizer's kernels may differ (a per-bucket
# update vs one foreach update: a few ulps of the parameters, ~1e-7 each, over 6 steps). The bound
# 1e-6 is ten times that; a wrong exchange (a missed or double-counted bucket, a stale parameter, an
# un-averaged gradient) moves the parameters by ~1e-2 after one step at lr 0.05.
TOL = 1e-6
EXACT = [{"scheduler": "mgwfbp", "warmup_steps": 2}, {"scheduler": "optimal", "warmup_steps": 2},
         {"scheduler": "dear_threshold", "warmup_steps": 2, "threshold_bytes": 4096},
         {"scheduler": "bytescheduler", "warmup_steps": 2}, {"scheduler": "wfbp", "warmup_steps": 1, "view": "module"},
         {"scheduler": "ddp"}]


@pytest.fixture(scope="module")
def exact_runs():
    rank0, rank1 = launch_local(api_targets.distribute_vs_ddp, 2, args=(EXACT, 6), timeout_s=600)
    return rank0, rank1


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(EXACT)), ids=[c["scheduler"] for c in EXACT])
def test_user_model_through_distribute_equals_ddp(exact_runs, i):
    for rank in exact_runs:
        row = rank[i]
        assert row["diff"] < TOL, row
        assert row["is_optimizer"] and not row["warming_up"]
    case = EXACT[i]
    if case["scheduler"] != "ddp":  # planned online from the user's own model, then executed
        assert exact_runs[0][i]["buckets"] >= 1
    if case["scheduler"] == "dear_threshold":
        assert exact_runs[0][i]["family"] == "dear" and exact_runs[0][i]["buckets"] > 1


@pytest.mark.distributed
@pytest.mark.slow
def test_omgs_runs_and_replicas_agree():
    """OMGS changes the math on purpose (top-k with error feedback): it must train (the loss falls on
    batch it sees again and again) and every replica must hold the same parameters (the exchange is the same
    everywhere, decompression in one order)."""
    cases = [{"scheduler": "omgs", "warmup_steps": 2, "density": 0.05}]
    rank0, rank1 = launch_local(api_targets.distribute_runs, 2, args=(cases, 12), timeout_s=600)
    for row in (rank0[0], rank1[0]):
        assert row["family"] == "sparse" and row["buckets"] >= 1
        assert row["replicas_agree"] == 0.0
        assert row["last_loss"] < row["first_loss"]


@pytest.mark.distributed
@pytest.mark.slow
def test_lr_scheduler_and_state_dict_work_on_the_returned_optimizer():
    rank0, _ = launch_local(api_targets.lr_scheduler_and_state, 2, timeout_s=300)
    assert rank0["lr"] == rank0["inner_lr"] == pytest.approx(0.1 * 0.5 ** 3)
    assert rank0["momentum_buffers"] > 0


def _refused(ctx, kwargs: dict) -> str:
    net = api_targets.UserNet()
    try:
        repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1), **kwargs)
    except ValueError as e:
        return str(e)
    return "accepted"


BAD = [({"scheduler": "nosuch"}, "unknown scheduler"),
       ({"scheduler": "mgwfbp", "density": 0.1}, "density do not apply"),
       ({"scheduler": "osp", "servers": 3}, "parameter-server family"),
       ({"scheduler": "mgwfbp", "warmup_steps": 0}, "warmup_steps"),
       ({"scheduler": "mgwfbp", "view": "neuron"}, "view must be"),
       ({"scheduler": "dear_threshold", "wire_dtype": "float16"}, "does not apply to scheduler 'dear_threshold'"),
       ({"scheduler": "no/such/plan.json"}, "plan file"),
       ({"scheduler": "mgwfbp", "network": "nosuchnet"}, "nosuchnet")]


@pytest.mark.distributed
@pytest.mark.slow
def test_bad_arguments_are_refused_before_any_collective():
    out = launch_local(_refused_all, 2, args=([k for k, _ in BAD],), timeout_s=300)[0]
    for (kwargs, words), message in zip(BAD, out):
        assert message.startswith("repro.distribute: ") and words in message, (kwargs, message)


def _refused_all(ctx, cases: list[dict]) -> list[str]:
    return [_refused(ctx, kw) for kw in cases]


# ---------------------------------------------------------------- repro plan -> repro launch --plan

def test_train_config_takes_the_plans_scheduler_and_view(tmp_path):
    from repro.costs.presets import preset
    from repro.core.planners import make_plan
    from repro.core.trace import load_trace
    from repro.training.config import TrainConfig

    trace = load_trace("resnet50_b32_v100-estimate")
    plan = make_plan("dear_threshold", trace, preset("10gbe-derived", 4), threshold_bytes=2**20)
    assert plan.meta["provenance"]["trace_model"] == "resnet50" and plan.meta["provenance"]["workers"] == 4
    f = tmp_path / "plan.json"
    plan.save(f)
    cfg = TrainConfig(model="tiny_resnet", plan=str(f))  # the default scheduler runs all-reduce plans
    assert cfg.scheduler == "dear_threshold"
    with pytest.raises(ValueError, match="--plan .*nope.json"):
        TrainConfig(plan=str(tmp_path / "nope.json"))


@pytest.mark.distributed
@pytest.mark.slow
def test_profile_plan_launch_runs_exactly_that_plan(tmp_path, capsys):
    import json

    from repro.cli.main import main

    trace, plan, runs = tmp_path / "trace.json", tmp_path / "plan.json", tmp_path / "runs"
    assert main(["profile", "--model", "tiny_resnet", "--batch-size", "8", "--iters", "2", "-o", str(trace)]) == 0
    assert main(["plan", "--trace", str(trace), "--solver", "threshold", "--threshold-bytes", "20000",
                 "--network", "10gbe-v100", "--workers", "2", "-o", str(plan)]) == 0
    assert main(["launch", "--nproc", "2", "--", "--model", "tiny_resnet", "--plan", str(plan), "--steps", "2",
                 "--batch-size", "8", "--results-dir", str(runs), "--run-id", "r", "--quiet",
                 "--compute-steps", "0"]) == 0
    given, ran = json.loads(plan.read_text()), json.loads((runs / "r" / "plan.json").read_text())
    assert ran["buckets"] == given["buckets"] and len(given["buckets"]) > 1  # the profile's module view
    config = json.loads((runs / "r" / "run.json").read_text())["config"]
    assert config["scheduler"] == "threshold" and config["view"] == "module"


# GradScaler: the scale is a power of two, so scaling and unscaling are exact and the exchange of two
# ranks is exact (see TOL); an inf on one rank reaches both ranks' averages, so both skip, as DDP +
# GradScaler does (it checks the averaged gradient). Inf steps fall in the warm-up (1) and after the
# switch to the planned executor (4).
AMP = [{"scheduler": "mgwfbp", "warmup_steps": 2}, {"scheduler": "dear_threshold", "warmup_steps": 2},
       {"scheduler": "bytescheduler", "warmup_steps": 2},
       {"scheduler": "mgwfbp", "warmup_steps": 2, "clip": True},
       {"scheduler": "dear_threshold", "warmup_steps": 2, "clip": True}]


@pytest.mark.distributed
@pytest.mark.slow
def test_grad_scaler_through_distribute_equals_ddp_with_grad_scaler():
    rank0, rank1 = launch_local(api_targets.amp_vs_ddp, 2, args=(AMP, 7, [1, 4]), timeout_s=600)
    for row in rank0 + rank1:
        assert row["diff"] < TOL, row
        assert row["scales"] == row["ref_scales"], row  # skipped (backed off) on the same steps
    assert rank0[0]["scales"][1] < rank0[0]["scales"][0]  # the inf steps did back the scale off



@pytest.mark.distributed
@pytest.mark.slow
def test_checkpoint_resumes_bit_exactly():
    """Resuming from the returned optimizer's state_dict executes the saved plan with the saved
    residuals: the parameters equal those of the run that wrote the checkpoint and went on, exactly
    (difference 0: the same operations in the same order), OMGS's error feedback included. The
    checkpoint is written model first, so the model's state_dict must flush DeAR's pending update."""
    cases = [{"scheduler": "omgs", "warmup_steps": 2, "density": 0.05},
             {"scheduler": "dear_threshold", "warmup_steps": 2, "threshold_bytes": 4096},
             {"scheduler": "mgwfbp", "warmup_steps": 2},
             {"scheduler": _omgs_per_tensor_plan()}]  # several buckets sharing one budget: the split is saved
    rank0, rank1 = launch_local(api_targets.resume_bit_exact, 2, args=(cases, 7, 4), timeout_s=600)
    for row in rank0 + rank1:
        assert row["diff"] == 0.0, row
    assert rank0[0]["has_residuals"]
    split = rank0[3]["split"]
    assert split is not None and len(split) == 10 and rank1[3]["split"] == split
    assert rank0[3]["diff_without_split"] > 0.0  # the split matters: a resume without it differs


def _omgs_per_tensor_plan():
    """An OMGS plan (as a dict) of UserNet with one bucket per tensor (10) and the model-wide budget
    (topk_scope "model")."""
    from repro.workload.layers import layer_parameters

    names = list(layer_parameters(api_targets.UserNet(), "tensor"))[::-1]
    return {"family": "sparse", "solver": "omgs", "options": {"density": 0.05, "topk_scope": "model"},
            "buckets": [{"layers": [n], "messages": ["sparse_allgather"] * 2} for n in names]}


@pytest.mark.distributed
@pytest.mark.slow
def test_a_removed_optimizer_says_so():
    message = launch_local(api_targets.step_after_remove, 2, timeout_s=300)[0]
    assert "was removed" in message and "optimizer.optimizer" in message
