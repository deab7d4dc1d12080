"""In-run checkpoints of ``repro train`` (repro.training.checkpoint): a run stopped by SLURM's pre-timeout
signal after step k and run again with the same run id ends where the uninterrupted run ends, bit for
bit on the CPU (parameters, buffers, the loss of every step)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from repro.launch.local import launch_local
from repro.training.checkpoint import CHECKPOINT_FILE, checkpoint_path, same_run
from repro.training.config import config_from_argv
from tests.checkpoint_targets import train_and_report

STEPS, STOP = 6, 3


def _config(results_dir, run_id: str, scheduler: str, **kw) -> dict:
    return {"model": "tiny_resnet", "scheduler": scheduler, "steps": STEPS, "warmup_steps": 2, "compute_steps": 0,
            "batch_size": 4, "fit_repeats": 1, "quiet": True, "results_dir": str(results_dir), "run_id": run_id,
            "overwrite": True, **kw}


def _train(config: dict) -> list[dict]:
    return launch_local(train_and_report, 2, args=(config,), timeout_s=120)


def _losses(results_dir, run_id: str) -> list[float]:
    return pd.read_csv(results_dir / run_id / "iterations.csv")["loss"].tolist()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["mgwfbp", "dear"])
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, scheduler):
    whole = _train(_config(tmp_path, "whole", scheduler))
    stopped = _train(_config(tmp_path, "cut", scheduler, checkpoint_every_min=60.0, checkpoint_stop_at_step=STOP))
    assert [r.get("preempted") for r in stopped] == [STOP, STOP]  # rank 1 stopped on rank 0's flag
    assert checkpoint_path(tmp_path, "cut").is_file() and not (tmp_path / "cut").exists()
    resumed = _train(_config(tmp_path, "cut", scheduler, checkpoint_every_min=60.0))
    assert [r["summary"]["resumed_after_steps"] for r in resumed] == [[STOP], [STOP]]  # not started over
    for a, b in zip(whole, resumed):
        assert torch.equal(a["params"], b["params"])
        assert all(torch.equal(x, y) for x, y in zip(a["buffers"], b["buffers"]))
    assert _losses(tmp_path, "cut") == _losses(tmp_path, "whole")
    assert len(_losses(tmp_path, "cut")) == STEPS
    assert not (tmp_path / f"cut.incomplete").exists()  # the finished run has no checkpoint left


def test_checkpoint_options_are_checked_in_one_line(tmp_path):
    ok, _ = config_from_argv(["--checkpoint-every-min", "30", "--results-dir", str(tmp_path), "--run-id", "r"])
    assert ok.checkpointing and ok.checkpoint_every_min == 30.0
    for argv, message in [(["--checkpoint-every-min", "-1"], "checkpoint_every_min must be"),
                          (["--checkpoint-every-min", "nan"], "checkpoint_every_min must be"),
                          (["--checkpoint-every-min", "5"], "need --results-dir and --run-id"),
                          (["--checkpoint-stop-at-step", "0"], "checkpoint_stop_at_step must be"),
                          (["--checkpoint-every-min", "5", "--results-dir", str(tmp_path), "--run-id", "r",
                            "--scheduler", "ps_bsp"], "dedicated server ranks")]:
        with pytest.raises(ValueError, match=message) as e:
            config_from_argv(argv)
        assert "\n" not in str(e.value)


def test_same_run_ignores_only_what_does_not_change_training():
    a = {"model": "m", "steps": 5, "quiet": False, "results_dir": "/a", "checkpoint_stop_at_step": 3}
    assert same_run(a, {**a, "quiet": True, "results_dir": "/b", "checkpoint_stop_at_step": None})
    assert not same_run(a, {**a, "steps": 6})
    assert CHECKPOINT_FILE == "checkpoint.pt"
