"""`repro train` / `python -m repro.train`: bad input, torchrun, failing ranks."""

import json
import re
import subprocess
import sys

import pytest

from repro.launch.local import RankFailedError, launch_local
from repro.studies.mgwfbp_train import run_configs
from repro.train import TrainConfig


@pytest.mark.parametrize("kw, message", [
    ({"scheduler": "nope"}, "unknown scheduler 'nope'"),
    ({"model": "resnet5"}, "unknown model 'resnet5'"),
    ({"dataset": "mnist"}, "unknown dataset 'mnist'"),
    ({"wire_dtype": "int8"}, "unknown wire dtype"),
    ({"scheduler": "ddp", "wire_dtype": "float16"}, "does not apply to scheduler 'ddp'"),
    ({"batch_size": 0}, "batch_size must be positive"),
    ({"epochs": 2}, "epochs need a real dataset"),
    ({"scheduler": "mgwfbp", "warmup_steps": 0}, "warmup_steps >= 1"),
])
def test_config_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kw)


@pytest.mark.slow
def test_cli_bad_input_is_one_line():
    r = subprocess.run([sys.executable, "-m", "repro", "train", "--scheduler", "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().startswith("repro: error: unknown scheduler")
    assert len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([sys.executable, "-m", "repro.train"], capture_output=True, text=True)
    assert r.returncode == 2 and "start with torchrun" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.distributed
@pytest.mark.slow
def test_torchrun_two_ranks_writes_a_run(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "repro.train", "--model", "tiny_vgg", "--scheduler", "mgwfbp", "--steps", "2",
           "--warmup-steps", "1", "--compute-steps", "1", "--batch-size", "4", "--quiet",
           "--results-dir", str(tmp_path), "--run-id", "tr", "--backend", "gloo"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**__import__("os").environ,
                                                                             "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["scheduler"] == "mgwfbp"
    assert (tmp_path / "tr" / "run.json").is_file()


@pytest.mark.distributed
def test_missing_dataset_fails_every_rank_fast_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_DATA_DIR", str(tmp_path))
    cfg = {"model": "tiny_vgg", "scheduler": "syncea", "dataset": "cifar10", "epochs": 1, "quiet": True}
    with pytest.raises(RankFailedError, match=r"rank \d of 2 failed: DatasetNotFoundError: CIFAR-10 not found"):
        launch_local(run_configs, 2, args=([cfg],), timeout_s=120, env={"REPRO_DATA_DIR": str(tmp_path)})


@pytest.mark.parametrize("argv, message", [
    (["--scheduler", "mgwfbp", "--servers", "2"], "--servers does not apply to --scheduler mgwfbp"),
    (["--scheduler", "ps_bsp", "--no-lgp"], "--lgp/--no-lgp does not apply to --scheduler ps_bsp"),
    (["--scheduler", "ps_asp", "--staleness", "3"], "--staleness does not apply to --scheduler ps_asp"),
    (["--scheduler", "osp", "--stage1-share", "1.5"], "stage1_share must be a number in"),
])
def test_parameter_server_options_are_refused_where_they_do_not_apply(argv, message):
    from repro.train import config_from_argv

    with pytest.raises(ValueError, match=re.escape(message)):
        config_from_argv(argv)
    cfg, _ = config_from_argv(["--scheduler", "osp", "--no-lgp", "--stage1-share", "0.25"])
    assert (cfg.lgp, cfg.stage1_share, cfg.servers, cfg.serving_ranks()) == (False, 0.25, None, 1)


def test_an_unresolvable_master_addr_is_refused_in_one_line(monkeypatch):
    from repro.launch.torchrun import DistributedSetupError, _read_env

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "no.such.host.invalid",
                 "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DistributedSetupError, match=r"MASTER_ADDR='no.such.host.invalid' cannot be resolved"):
        _read_env()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert _read_env()[3] == "127.0.0.1"


@pytest.mark.distributed
@pytest.mark.slow
def test_repro_train_with_an_unresolvable_master_addr_exits_2_with_one_line():
    import os

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "no.such.host.invalid",
           "MASTER_PORT": "29555", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "repro", "train", "--model", "tiny_vgg", "--scheduler", "local",
                        "--steps", "1", "--quiet", "--pg-timeout-s", "20"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("repro: error: MASTER_ADDR='no.such.host.invalid'")
