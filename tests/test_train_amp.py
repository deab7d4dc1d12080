"""``repro train --amp {off,bf16,fp16}``: mixed-precision compute (issue 32, item 8).

The forward and the loss run under ``torch.autocast`` (bf16, or fp16 with a ``torch.amp.GradScaler``);
weights, gradients and optimizer stay float32 and ``--wire-dtype`` alone sets what is sent. Held to
PyTorch DDP: the same ``repro train`` run with ``--scheduler ddp`` (real ``DistributedDataParallel``, the
same autocast and scaler) ends with the same parameters and buffers on 2 gloo ranks (measured 0.0 for
bf16 and fp16, tiny_resnet, 1 warm-up + 3 timed steps; the planner's warm-up is SyncEASGD, exact too),
while the same run without ``--amp`` ends 2e-3 to 3e-3 away (the autocast is really on). What cannot run
is refused in one line before any rank starts.
"""

from __future__ import annotations

import json

import pytest

from repro.grids.jobs import run_refusal
from repro.grids.grid import parse_grid
from repro.training.config import TrainConfig, config_from_argv

TOL = 1e-5
SHORT = ["--model", "tiny_resnet", "--steps", "3", "--warmup-steps", "1", "--compute-steps", "1",
         "--batch-size", "4", "--quiet"]


@pytest.mark.parametrize("argv, message", [
    (["--amp", "fp8"], "argument --amp: invalid choice: 'fp8'"),
    (["--amp", "fp16", "--scheduler", "fsdp"], "--amp fp16 needs a GradScaler, which 'fsdp' cannot take"),
    (["--amp", "fp16", "--scheduler", "ps_bsp"], "'ps_bsp' cannot take: its dedicated server ranks"),
    (["--amp", "fp16", "--scheduler", "osp"], "'osp' cannot take"),
])
def test_what_cannot_run_is_refused_in_one_line(argv, message):
    with pytest.raises(ValueError) as e:
        config_from_argv(argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_fp16_lstm_on_a_cpu_is_refused_where_the_device_is_known():
    cfg, _ = config_from_argv(["--amp", "fp16", "--model", "tiny_lstm"])  # the device is not known yet
    with pytest.raises(ValueError, match="no float16 LSTM kernel") as e:
        cfg.check_world(2, backend="gloo")  # gloo without --device: a CPU
    assert "\n" not in str(e.value)
    cfg.check_world(2, backend="nccl")  # a GPU has one
    config_from_argv(["--amp", "bf16", "--model", "tiny_lstm"])[0].check_world(2, backend="gloo")


def test_accepted_values_and_what_is_recorded():
    assert TrainConfig().amp == "off"
    assert TrainConfig(amp="BF16").amp == "bf16"  # the Python API takes any case, as --optimizer
    for scheduler in ("mgwfbp", "ddp", "omgs", "dear_threshold", "bytescheduler", "local"):
        assert TrainConfig(scheduler=scheduler, amp="fp16").amp == "fp16"
    for scheduler in ("ps_bsp", "fsdp"):  # no scaler needed: bf16 goes everywhere
        assert TrainConfig(scheduler=scheduler, amp="bf16").amp == "bf16"


def test_a_grid_passes_amp_and_the_check_refuses_what_its_ranks_would():
    grid = parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": 2, "train": {"amp": "fp16"},
                       "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 4}}, "world_sizes": [2],
                                        "schedulers": ["mgwfbp", "fsdp"], "precisions": ["float16", "float32"]}]})
    reasons = {(r["scheduler"], r["wire_dtype"]): run_refusal(r, backend="gloo", device="cpu") for r in grid.runs}
    assert reasons[("mgwfbp", "float16")] is None and reasons[("mgwfbp", "float32")] is None
    assert "'fsdp' cannot take" in reasons[("fsdp", "float32")]


@pytest.mark.distributed
@pytest.mark.slow
def test_amp_runs_equal_ddp_with_the_same_autocast_and_scaler(tmp_path):
    from repro.launch.local import launch_local
    from tests import amp_train_targets as t

    fit = {"mgwfbp": ["--fit-repeats", "1"], "ddp": []}  # ddp fits no cost model: the flag is refused there
    runs = [SHORT + ["--scheduler", s, "--amp", a] + fit[s] for a in ("bf16", "fp16") for s in ("mgwfbp", "ddp")]
    runs.append(SHORT + ["--scheduler", "mgwfbp", "--results-dir", str(tmp_path), "--run-id", "off"] + fit["mgwfbp"])
    runs[2] += ["--results-dir", str(tmp_path), "--run-id", "fp16"]
    for rank, (bf16, bf16_ddp, fp16, fp16_ddp, off) in enumerate(launch_local(t.train_runs, 2, args=(runs,),
                                                                              timeout_s=300)):
        assert t.max_diff(bf16["state"], bf16_ddp["state"]) <= TOL, rank
        assert t.max_diff(fp16["state"], fp16_ddp["state"]) <= TOL, rank
        # the scaler did not skip every step (the weights moved), and the autocast changed what was computed
        assert t.max_diff(fp16["params"], fp16["start"]) > 100 * TOL
        assert t.max_diff(bf16["params"], off["params"]) > 100 * TOL
        assert t.max_diff(fp16["params"], off["params"]) > 100 * TOL
        assert (bf16["summary"]["amp"], fp16["summary"]["amp"], off["summary"]["amp"]) == ("bf16", "fp16", "off")
    record = json.loads((tmp_path / "fp16" / "run.json").read_text())
    assert record["config"]["amp"] == "fp16" and record["summary"]["amp"] == "fp16"
    assert record["summary"]["wire_dtype"] == "float32"  # compute precision and wire dtype are apart
    assert json.loads((tmp_path / "off" / "run.json").read_text())["config"]["amp"] == "off"
