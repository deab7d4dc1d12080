"""The DeAR buffer-size tuner (repro.families.dear.tuner): regrouping loses nothing, ranks agree, BO works.

- on 2 ranks the tuner regroups the buckets several times (Bayesian optimisation over the threshold)
  and its parameters after the same steps and a flush still equal PyTorch DDP's (SGD and AdamW): no
  gradient and no update is lost across regroupings; every rank used the same thresholds and tables;
- ``tune_offline`` finds the minimum of simple 1-D functions within a few trials; grid and random search
  are deterministic and give the same columns;
- ``repro train --scheduler dear_bo`` writes the trials table to the run folder.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from repro.launch.local import launch_local
from repro.families.dear.tuner import TUNING_COLUMNS, tune_offline

TUNER = {"trials": 3, "settle_steps": 1, "trial_steps": 2, "bounds": (4096, 512 * 1024), "seed": 0}


def tuner_vs_ddp(ctx, cases: list[dict], runs: list[dict]) -> dict:
    """Per case: ``steps`` steps of DDP and of DeARTunedExecutor (``tuner`` kwargs) from the same weights
    and per-rank data; the difference after a flush, per step the bucket count, the tuning table."""
    from torch.nn.parallel import DistributedDataParallel

    from repro.families.dear.tuner import DeARTunedExecutor
    from repro.runtime.executor import ExecutorOptions
    from tests.runtime_targets import train_params
    from tests.test_runtime_dear import _batches, _diff, _loss, _model, _optimizer, _plan, _state

    torch.use_deterministic_algorithms(True)
    rank = dist.get_rank()
    out = []
    for case in cases:
        name, steps = "tiny_resnet", case["steps"]
        batches = _batches(name, steps, 4, rank)
        ref = _model(name)
        ddp = DistributedDataParallel(ref)
        ref_opt = _optimizer(case["optimizer"], ref.parameters())
        for x, y in batches:
            ref_opt.zero_grad(set_to_none=True)
            _loss(name, ddp, x, y).backward()
            ref_opt.step()
        model = _model(name)
        plan = _plan(model, name, "tensor", "dear_threshold", 64 * 1024)
        tuner = DeARTunedExecutor(model, plan, ExecutorOptions(), **case["tuner"])
        opt = tuner.wrap_optimizer(_optimizer(case["optimizer"], model.parameters()))
        buckets, executors = [], []
        for i, (x, y) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            tuner.before_forward()
            _loss(name, tuner.module, x, y).backward()
            tuner.after_backward()
            opt.step()
            if i == case.get("flush_after"):
                tuner.flush()  # as before an evaluation, in the middle of a trial
            buckets.append(tuner.current_plan.num_buckets)
            executors.append(id(tuner.executor))
        tuner.flush()
        row = {"diff": _diff(_state(model), _state(ref)), "buckets": buckets,
               "regroups": sum(a != b for a, b in zip(executors, executors[1:])),
               "still_tuning": tuner.tuning, "table": tuner.tables()["tuning"]}
        tuner.remove()
        row["hooks_left"] = sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()) + sum(
            len(m._forward_pre_hooks) for m in model.modules())
        out.append(row)
    return {"cases": out, "runs": train_params(ctx, runs)}


CASES = [{"optimizer": "sgd", "steps": 14, "tuner": TUNER, "flush_after": 4},
         {"optimizer": "adamw", "steps": 8, "tuner": dict(TUNER, trials=2, settle_steps=0, seed=1)}]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("dear_bo_runs")
    runs = [{"model": "tiny_resnet", "scheduler": "dear_bo", "steps": 8, "warmup_steps": 1, "batch_size": 4,
             "threshold_bytes": 64 * 1024, "results_dir": str(runs_dir), "run_id": "bo"},
            # the tuner's trials and range as run options (repro train --tuner-trials ... flags)
            {"model": "tiny_resnet", "scheduler": "dear_bo", "steps": 22, "warmup_steps": 1, "batch_size": 4,
             "threshold_bytes": 64 * 1024, "tuner_trials": 2, "tuner_min_bytes": 4096,
             "tuner_max_bytes": 256 * 1024, "results_dir": str(runs_dir), "run_id": "bo_range"}]
    return launch_local(tuner_vs_ddp, 2, args=(CASES, runs), timeout_s=300), runs_dir


@pytest.mark.distributed
def test_regrouping_loses_no_gradient_or_update(two_ranks):
    out, _ = two_ranks
    for case, r0, r1 in zip(CASES, out[0]["cases"], out[1]["cases"]):
        for row in (r0, r1):
            assert row["diff"] < 2e-5, (case["optimizer"], row["diff"])
            assert row["regroups"] == case["tuner"]["trials"] + 1  # one per trial, then the best
            assert not row["still_tuning"] and row["hooks_left"] == 0
        assert len(set(r0["buckets"])) >= 2  # the bucketing really changed
        assert r0["buckets"] == r1["buckets"] and r0["table"] == r1["table"]  # ranks agree on every threshold


@pytest.mark.distributed
def test_tuning_table(two_ranks):
    out, _ = two_ranks
    table = out[0]["cases"][0]["table"]
    assert len(table) == TUNER["trials"] + 1
    for row in table:
        assert tuple(row) == TUNING_COLUMNS
    assert [r["trial"] for r in table] == list(range(len(table)))
    assert [r["source"] for r in table] == ["initial"] + ["bo"] * TUNER["trials"]
    assert table[0]["threshold_bytes"] == 64 * 1024 and table[0]["buckets"] >= 3
    lo, hi = TUNER["bounds"]
    assert all(lo <= r["threshold_bytes"] <= hi for r in table)
    best = [r["best_so_far_s"] for r in table]
    assert best == [min(r["iteration_s"] for r in table[:i + 1]) for i in range(len(table))]
    chosen = [r for r in table if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["iteration_s"] == best[-1]
    # after the trials the run keeps the chosen bucketing
    assert out[0]["cases"][0]["buckets"][-1] == chosen[0]["buckets"]


@pytest.mark.distributed
def test_train_writes_the_trials_table(two_ranks):
    out, runs_dir = two_ranks
    summary = out[0]["runs"][0]["summary"]
    assert summary["scheduler"] == "dear_bo" and summary["steps"] == 8
    table = pd.read_csv(runs_dir / "bo" / "tuning.csv")
    # defaults: settle 2, measure 5 -> the initial trial ends after 7 of the 8 steps
    assert len(table) == 1 and table.source[0] == "initial" and table.threshold_bytes[0] == 64 * 1024
    assert set(TUNING_COLUMNS) <= set(table.columns)


@pytest.mark.distributed
def test_train_passes_the_tuner_options(two_ranks):
    _, runs_dir = two_ranks
    table = pd.read_csv(runs_dir / "bo_range" / "tuning.csv")
    # 7 steps for the initial threshold, then 2 trials of 2 settling + 5 timed steps
    assert list(table.source) == ["initial", "bo", "bo"]
    assert table.threshold_bytes.between(4096, 256 * 1024).all()


def test_bad_tuner_options_are_refused_before_any_rank_starts():
    from repro.train import TrainConfig

    with pytest.raises(ValueError, match="tuner_min_bytes < tuner_max_bytes"):
        TrainConfig(scheduler="dear_bo", tuner_min_bytes=2**20, tuner_max_bytes=2**20)
    with pytest.raises(ValueError, match="tuner_trials"):
        TrainConfig(scheduler="dear_bo", tuner_trials=-1)


@pytest.mark.parametrize("optimum", [21.3, 26.6])
def test_bo_finds_the_minimum_of_a_1d_function(optimum):
    def f(t):
        return 0.1 + 0.02 * (math.log2(t) - optimum) ** 2

    rows = tune_offline(f, "bo", trials=8, seed=0, initial=25 * 2**20)
    best = min(rows, key=lambda r: r["iteration_s"])
    assert abs(math.log2(best["threshold_bytes"]) - optimum) < 0.5
    assert rows[-1]["best_so_far_s"] == best["iteration_s"]
    assert rows[-1]["best_threshold_bytes"] == best["threshold_bytes"]
    assert [r["source"] for r in rows] == ["initial"] + ["bo"] * 8
    assert rows == tune_offline(f, "bo", trials=8, seed=0, initial=25 * 2**20)  # deterministic


def test_grid_and_random_search():
    def f(t):
        return abs(math.log2(t) - 23.0)

    grid = tune_offline(f, "grid", trials=9)
    assert [r["threshold_bytes"] for r in grid] == [2**e for e in range(20, 29)]
    assert grid[-1]["best_threshold_bytes"] == 2**23 and grid[-1]["best_so_far_s"] == 0.0
    rnd = tune_offline(f, "random", trials=6, seed=3)
    assert rnd == tune_offline(f, "random", trials=6, seed=3) and len(rnd) == 6
    assert all(2**20 <= r["threshold_bytes"] <= 2**28 for r in rnd)
    assert set(grid[0]) == set(rnd[0])
    with pytest.raises(ValueError, match="unknown method"):
        tune_offline(f, "anneal")
