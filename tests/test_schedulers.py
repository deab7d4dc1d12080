"""The scheduler registry: one table for every name users type, consistent with planners and families."""

import json
import subprocess
import sys
import warnings

import pytest

from repro.core.families import FAMILIES
from repro.core.planners import PLANNERS
from repro.core.schedulers import ALIASES, SCHEDULERS, canonical_name, get_scheduler


def test_every_entry_points_at_real_things():
    for name, s in SCHEDULERS.items():
        assert s.name == name and s.doc and s.paper
        if s.planner is not None:
            assert s.planner in PLANNERS, name
            assert s.family in FAMILIES, name
        assert s.executor_class().__name__.endswith("Executor"), name
        for option in s.planner_options:
            from repro.train import TrainConfig

            assert option in TrainConfig.__dataclass_fields__, (name, option)
    # every planner is reachable as a scheduler of the same name, meaning the same thing
    assert set(PLANNERS) <= set(SCHEDULERS)
    assert all(SCHEDULERS[p].planner == p for p in PLANNERS)


def test_names_are_unambiguous_and_old_names_still_work():
    assert SCHEDULERS["ddp"].planner is None and "DistributedDataParallel" in SCHEDULERS["ddp"].doc
    assert SCHEDULERS["ddp_buckets"].planner == "ddp_buckets"
    with pytest.warns(DeprecationWarning, match="'ddp_plan' is now called 'ddp_threshold'"):
        assert get_scheduler("ddp_plan").name == "ddp_threshold"
    assert canonical_name("ddp_plan") == "ddp_threshold" and canonical_name("mgwfbp") == "mgwfbp"
    assert set(ALIASES.values()) <= set(SCHEDULERS)
    with pytest.raises(ValueError, match="unknown scheduler 'nope'; choose one of wfbp"):
        get_scheduler("nope")


def test_train_config_reads_capabilities_from_the_registry():
    from repro.train import TrainConfig

    with pytest.raises(ValueError, match="wire_dtype float16 does not apply to scheduler 'ddp'"):
        TrainConfig(scheduler="ddp", wire_dtype="float16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert TrainConfig(scheduler="ddp_plan").scheduler == "ddp_threshold"
    with pytest.raises(ValueError, match="'optimal' exchanges gradients between ranks: it needs at least 2 ranks"):
        TrainConfig(scheduler="optimal").check_world(1)
    with pytest.raises(ValueError, match="exchanges gradients between ranks: it needs at least 2 ranks"):
        TrainConfig(scheduler="optimal", network="10gbe-k80").check_world(1)  # (it used to fail inside the rank)
    TrainConfig(scheduler="optimal", network="10gbe-k80").check_world(2)
    TrainConfig(scheduler="local").check_world(1)
    with pytest.raises(ValueError, match="unknown network preset 'nope'"):
        TrainConfig(network="nope")
    with pytest.raises(ValueError, match="no fit for P=3"):
        TrainConfig(network="10gbe-v100").check_world(3)
    for bad in ({"lr": float("nan")}, {"threshold_bytes": -1}, {"run_id": "../x"}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


def test_repro_schedulers_prints_the_table():
    r = subprocess.run([sys.executable, "-m", "repro", "schedulers", "--format", "json"], capture_output=True, text=True,
                       check=True)
    out = json.loads(r.stdout)
    assert set(out["schedulers"]) == set(SCHEDULERS)
    assert out["schedulers"]["optimal"]["supports"] == {"wire_dtype": True, "online_planning": True,
                                                        "needs_cost_model": True, "sparse_gradients": False}
    assert out["schedulers"]["dear_threshold"]["paper_name"] == "dear"
    assert out["schedulers"]["ddp"]["executor"] == "repro.families.baselines.executors:TorchDDPExecutor"
    assert out["aliases"] == {"ddp_plan": "ddp_threshold"}
    assert "allreduce" in out["families"]


def test_repro_plan_solves_on_the_wire_dtype():
    base = [sys.executable, "-m", "repro", "plan", "--trace", "resnet50_b32_v100-estimate", "--solver", "optimal",
            "--network", "10gbe-v100", "--workers", "16"]
    fp32 = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    fp16 = json.loads(subprocess.run(base + ["--wire-dtype", "float16"], capture_output=True, text=True,
                                     check=True).stdout)
    assert fp16["options"] == {"wire_dtype": "float16"} and fp16["family"] == "allreduce"
    assert len(fp16["buckets"]) > len(fp32["buckets"])
    assert fp16["iteration_s"] == pytest.approx(0.0884448, rel=1e-5)
