"""`repro train` / `repro launch`: --optimizer takes any torch.optim class name, --device cpu|cuda (issue 21).

The fast tests build optimizers and configs in this process (no ranks, no process group); the ones that
start ranks are marked distributed and slow."""

import inspect
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from repro.cli.main import main as cli_main
from repro.train import _make_optimizer, _train_device
from repro.train import main as train_main
from repro.training.config import DEVICES, OPTIMIZERS, REFUSED_OPTIMIZERS, TrainConfig, config_from_argv

#: listed names a supported but older torch (>= 2.4) may lack; the rank then says so in one line
NEWER_THAN_2_4 = {"Adafactor"}


def _torch_optimizers() -> dict[str, type]:
    return {name: cls for name, cls in vars(torch.optim).items()
            if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer}


def test_the_torch_free_list_matches_torch_optim():
    found = _torch_optimizers()
    for name in found:  # every optimizer of this torch is offered or refused with a reason
        assert name.lower() in OPTIMIZERS or name.lower() in REFUSED_OPTIMIZERS, f"torch.optim.{name} is not listed"
    for key, name in OPTIMIZERS.items():  # every offered name is a torch.optim optimizer class (or a newer one)
        assert key == name.lower()
        assert name in found or name in NEWER_THAN_2_4, f"torch.optim has no {name}"
    assert set(OPTIMIZERS).isdisjoint(REFUSED_OPTIMIZERS)
    assert {"sgd", "adam", "adamw", "rmsprop", "adagrad"} <= set(OPTIMIZERS)


@pytest.mark.parametrize("given, kept", [("sgd", "sgd"), ("SGD", "sgd"), ("AdamW", "adamw"), ("adam", "adam"),
                                         ("RMSprop", "rmsprop"), ("ADAGRAD", "adagrad"), ("rprop", "rprop")])
def test_names_are_case_insensitive_and_kept_in_lower_case(given, kept):
    assert TrainConfig(optimizer=given).optimizer == kept


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_listed_optimizer_is_built_with_lr_and_weight_decay_where_it_takes_them(name):
    if OPTIMIZERS[name] not in _torch_optimizers():
        pytest.skip(f"torch {torch.__version__} has no torch.optim.{OPTIMIZERS[name]}")
    cfg = TrainConfig(optimizer=name, lr=0.01, momentum=0.5, weight_decay=0.002)
    model = nn.Linear(3, 2)
    opt = _make_optimizer(cfg, model.parameters())
    assert type(opt) is getattr(torch.optim, OPTIMIZERS[name])
    group = opt.param_groups[0]
    assert group["lr"] == 0.01
    takes = inspect.signature(type(opt)).parameters
    if "weight_decay" in takes:
        assert group["weight_decay"] == 0.002
    if name == "sgd":
        assert group["momentum"] == 0.5  # as before: sgd takes --momentum
    elif "momentum" in takes:
        assert group["momentum"] == takes["momentum"].default  # the optimizer's own default, not --momentum
    model(torch.randn(4, 3)).square().mean().backward()
    opt.step()  # one plain step(), as the training loop takes


def test_sgd_and_adamw_are_as_before():
    sgd = _make_optimizer(TrainConfig(), nn.Linear(2, 2).parameters())
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["momentum"] == 0.9
    assert sgd.param_groups[0]["weight_decay"] == 1e-4 and sgd.param_groups[0]["lr"] == 0.05
    adamw = _make_optimizer(TrainConfig(optimizer="adamw"), nn.Linear(2, 2).parameters())
    assert type(adamw) is torch.optim.AdamW and adamw.param_groups[0]["weight_decay"] == 1e-4


@pytest.mark.parametrize("kw, message", [
    ({"optimizer": "nope"}, "unknown optimizer 'nope'; choose one of SGD, AdamW"),
    ({"optimizer": "Optimizer"}, "unknown optimizer 'Optimizer'"),
    ({"optimizer": "lbfgs"}, "LBFGS steps with a closure"),
    ({"optimizer": "SparseAdam"}, "sparse gradients only"),
    ({"optimizer": "muon"}, "2-D weight matrices only"),
    ({"optimizer": 3}, "unknown optimizer 3"),
    ({"device": "tpu"}, "unknown device 'tpu'; choose cpu or cuda"),
    ({"device": "cuda:1"}, "unknown device 'cuda:1'"),
])
def test_config_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kw)


def test_device_option():
    assert DEVICES == ("cpu", "cuda")
    assert TrainConfig().device is None  # the default: cuda when the backend is nccl, else cpu
    assert TrainConfig(device="CUDA").device == "cuda"
    cfg, args = config_from_argv(["--device", "cpu", "--backend", "gloo", "--optimizer", "Adam"])
    assert cfg.device == "cpu" and cfg.optimizer == "adam"
    assert config_from_argv(["--device", "cuda", "--backend", "gloo"])[0].device == "cuda"
    with pytest.raises(ValueError, match="--device cpu does not go with --backend nccl"):
        config_from_argv(["--device", "cpu", "--backend", "nccl"])
    with pytest.raises(ValueError, match="invalid choice"):
        config_from_argv(["--device", "gpu"])


def test_the_rank_trains_where_device_says():
    cpu_ctx = SimpleNamespace(device=torch.device("cpu"), local_rank=0)
    assert _train_device(cpu_ctx, TrainConfig()) == torch.device("cpu")  # default: the group's device
    assert _train_device(SimpleNamespace(device="cpu", local_rank=0), TrainConfig(device="cpu")) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            _train_device(cpu_ctx, TrainConfig(device="cuda"))


@pytest.mark.gpu
def test_cuda_on_a_gloo_rank_is_its_own_gpu():
    ctx = SimpleNamespace(device=torch.device("cpu"), local_rank=0)
    assert _train_device(ctx, TrainConfig(device="cuda")) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="own GPU"):
        _train_device(SimpleNamespace(device=torch.device("cpu"), local_rank=torch.cuda.device_count()),
                      TrainConfig(device="cuda"))


def _cli(capsys, *argv):
    rc = cli_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("train_args, message", [
    (["--optimizer", "lbfgs"], "LBFGS steps with a closure"),
    (["--optimizer", "nope"], "unknown optimizer 'nope'"),
    (["--device", "cpu", "--backend", "nccl"], "--device cpu does not go with --backend nccl"),
    (["--device", "tpu"], "argument --device: invalid choice"),
])
def test_launch_refuses_before_any_rank_starts(capsys, train_args, message):
    rc, out, err = _cli(capsys, "launch", "--nproc", "2", "--", "--model", "tiny_vgg", *train_args)
    assert rc == 2 and message in err, err
    assert err.startswith("repro: error: ") and err.count("\n") == 1 and out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_one_line_before_any_rank(capsys):
    rc, out, err = _cli(capsys, "launch", "--nproc", "2", "--", "--model", "tiny_vgg", "--device", "cuda")
    assert rc == 2 and "--device cuda, but CUDA is not available" in err and err.count("\n") == 1
    assert train_main(["--device", "cuda"]) == 2  # repro train: before joining a process group
    err = capsys.readouterr().err
    assert "--device cuda, but CUDA is not available" in err and err.count("\n") == 1


@pytest.mark.gpu
def test_more_ranks_than_gpus_on_cuda_is_one_line(capsys):
    n = torch.cuda.device_count() + 1
    rc, _, err = _cli(capsys, "launch", "--nproc", str(n), "--", "--model", "tiny_vgg", "--device", "cuda")
    assert rc == 2 and "its own GPU" in err and err.count("\n") == 1


@pytest.mark.slow
def test_help_lists_the_optimizers_without_importing_torch():
    code = ("import sys, contextlib, io\nfrom repro.cli.main import main\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n    try: main(['train', '--help'])\n    except SystemExit: pass\n"
            "print('torch' in sys.modules, 'RMSprop' in buf.getvalue(), '--device' in buf.getvalue())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "True", "True"], r.stderr


def _launch(tmp_path, *train_args, nproc=2):
    cmd = [sys.executable, "-m", "repro", "launch", "--nproc", str(nproc), "--", "--model", "tiny_vgg", "--steps", "2",
           "--warmup-steps", "1", "--compute-steps", "1", "--batch-size", "4", "--quiet", "--results-dir",
           str(tmp_path), "--run-id", "r", *train_args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), json.loads((tmp_path / "r" / "run.json").read_text())


@pytest.mark.distributed
@pytest.mark.slow
def test_launch_trains_with_another_optimizer_on_the_cpu(tmp_path):
    summary, run = _launch(tmp_path, "--scheduler", "mgwfbp", "--optimizer", "RMSprop", "--device", "cpu")
    assert summary["world_size"] == 2 and summary["scheduler"] == "mgwfbp" and summary["backend"] == "gloo"
    assert run["config"]["optimizer"] == "rmsprop" and run["config"]["device"] == "cpu"


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.gpu
def test_launch_trains_on_cuda_with_gloo(tmp_path):
    summary, run = _launch(tmp_path, "--scheduler", "local", "--optimizer", "adam", "--device", "cuda", nproc=1)
    assert summary["backend"] == "gloo" and run["config"]["device"] == "cuda" and summary["iteration_s"] > 0
