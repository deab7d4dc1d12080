"""Profiling any nn.Module (issue 21): ``profile_model(module, batch=(x, y), loss_fn=...)`` and
``repro profile --model package.module:factory --input-shape C,H,W``. Fast: no processes, tiny models."""

import json
import textwrap

import pytest
import torch
from torch import nn

from repro.cli.main import main
from repro.core.trace import Trace
from repro.workload.profile import profile_model

torch.set_num_threads(1)
FAST = {"warmup": 0, "iters": 2}


class SmallNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, classes)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _batch(n=4, classes=5):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize("loss_fn", [nn.CrossEntropyLoss(), nn.functional.cross_entropy,
                                     lambda out, y: nn.functional.cross_entropy(out, y),
                                     lambda model, x, y: nn.functional.cross_entropy(model(x), y), None],
                         ids=["loss-module", "functional", "output-y", "model-x-y", "default"])
def test_any_module_with_each_loss_form(loss_fn):
    model = SmallNet()
    t = profile_model(model, batch=_batch(6), loss_fn=loss_fn, view="module", **FAST)
    assert isinstance(t, Trace)
    assert t.model == "SmallNet" and t.batch_size == 6 and t.device == "cpu" and t.dtype == "float32"
    assert [layer.name for layer in t.layers] == ["conv", "bn", "fc"]  # forward order of a sequential net
    assert t.total_params == sum(p.numel() for p in model.parameters())
    assert t.total_bytes == 4 * t.total_params
    assert t.total_forward_s > 0 and t.total_backward_s > 0
    assert t.extra["source"] == "measured" and t.extra["module"].endswith("SmallNet")


def test_tensor_view_name_override_and_batch_size_from_first_dimension():
    t = profile_model(SmallNet(), batch=_batch(3), loss_fn=nn.CrossEntropyLoss(), view="tensor", name="mine", **FAST)
    assert t.model == "mine" and t.batch_size == 3
    names = [layer.name for layer in t.layers]  # reverse gradient-ready order: a module's tensors in either order
    assert sorted(names[:2]) == ["conv.bias", "conv.weight"] and sorted(names[2:4]) == ["bn.bias", "bn.weight"]
    assert sorted(names[4:]) == ["fc.bias", "fc.weight"]
    assert t.batch_size == profile_model(SmallNet(), 3, batch=_batch(3), **FAST).batch_size  # agreeing: fine


def test_the_module_is_given_back_as_it_was():
    model = SmallNet().eval()
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    profile_model(model, batch=_batch(), **FAST)
    assert not model.training  # its mode
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # weights and BN statistics
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in model.parameters())  # its gradients
    assert torch.equal(rng, torch.get_rng_state())  # the caller's random state


def test_inputs_in_a_dict_with_the_model_x_y_loss():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(2, 3)

        def forward(self, left, right):
            return self.a(left) + self.b(right)

    x = {"left": torch.randn(5, 4), "right": torch.randn(5, 2)}
    t = profile_model(TwoInputs(), batch=(x, torch.randint(0, 3, (5,))),
                      loss_fn=lambda m, x, y: nn.functional.cross_entropy(m(**x), y), view="module", **FAST)
    assert t.batch_size == 5 and sorted(layer.name for layer in t.layers) == ["a", "b"]


def test_frozen_parameters_are_not_layers_and_unused_ones_come_first():
    model = SmallNet()
    model.conv.requires_grad_(False)
    model.spare = nn.Linear(2, 2)  # never called: no gradient
    t = profile_model(model, batch=_batch(), view="module", **FAST)
    names = [layer.name for layer in t.layers]
    assert "conv" not in names and names[0] == "spare" and t.layers[0].backward_s == 0.0


def test_parameter_dtype_is_the_trace_dtype():
    model = SmallNet().double()
    x, y = _batch()
    t = profile_model(model, batch=(x.double(), y), **FAST)
    assert t.dtype == "float64" and t.total_bytes == 8 * t.total_params


@pytest.mark.parametrize("kwargs, match", [
    ({"batch": None}, "batch must be a pair"),
    ({"batch": "xy"}, "batch must be a pair"),
    ({"batch": (torch.randn(4, 3, 8, 8),)}, "batch must be a pair"),
    ({"batch": (torch.tensor(1.0), torch.tensor(1))}, "first dimension is the batch size"),
    ({"batch": (["no tensor"], torch.tensor([1]))}, "hold no tensor"),
    ({"batch_size": 3}, "contradicts the batch, whose first dimension is 4"),
    ({"loss_fn": "mse"}, "loss_fn must be callable"),
    ({"loss_fn": lambda out: out.sum()}, "1 required positional argument"),
    ({"loss_fn": lambda a, b, c, d: a}, "4 required positional argument"),
    ({"loss_fn": lambda out, y: out}, "must return a scalar tensor"),
    ({"loss_fn": lambda out, y: 1.0}, "must return a scalar tensor"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"view": "layer"}, "unknown view 'layer'"),
    ({"device": "meta"}, "cannot measure on device 'meta'"),
    ({"iters": 0}, "iters"),
    ({"warmup": -1}, "warmup"),
    ({"seq_len": 8}, "model_kwargs"),
])
def test_module_argument_errors(kwargs, match):
    args = {"batch": _batch(), **FAST, **kwargs}
    with pytest.raises(ValueError, match=match):
        profile_model(SmallNet(), **args)


def test_a_module_without_learnable_parameters_is_refused():
    with pytest.raises(ValueError, match="no learnable parameters"):
        profile_model(nn.ReLU(), batch=(torch.randn(2, 3), torch.tensor([0, 1])), **FAST)


def test_registry_calls_and_their_errors_are_unchanged():
    t = profile_model("tiny_vgg", 2, "cpu", "module", 0, 1)  # the old positional call
    assert t.model == "tiny_vgg" and t.batch_size == 2 and t.dtype == "float32"
    assert profile_model(model_name="tiny_vgg", batch_size=2, **FAST).model == "tiny_vgg"
    with pytest.raises(ValueError, match="batch_size is needed"):
        profile_model("tiny_vgg")
    with pytest.raises(ValueError, match="apply to a torch.nn.Module"):
        profile_model("tiny_vgg", 2, batch=_batch())
    with pytest.raises(ValueError, match="registry name .* or a torch.nn.Module"):
        profile_model(42, 2)
    with pytest.raises(ValueError, match="not both"):
        profile_model(SmallNet(), batch=_batch(), model_name="tiny_vgg")


@pytest.mark.gpu
def test_module_on_cuda_is_moved_there_and_timed():
    model = SmallNet()
    t = profile_model(model, batch=_batch(8), device="cuda", view="module", warmup=1, iters=3)
    assert t.device == torch.cuda.get_device_name() and next(model.parameters()).is_cuda
    assert t.total_forward_s > 0 and t.total_backward_s > 0
    t2 = profile_model(model, batch=_batch(8), view="module", warmup=1, iters=3)  # device=None: where it is
    assert t2.device == t.device


# ---------------------------------------------------------------------------------------------
# repro profile --model package.module:factory
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def factories(tmp_path, monkeypatch):
    """A module ``userzoo_issue21`` in a temporary folder, importable as the current folder."""
    (tmp_path / "userzoo_issue21.py").write_text(textwrap.dedent("""
        from torch import nn

        def build():
            return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))

        class Mlp(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 3)

            def forward(self, x):
                return self.fc(x)

            @classmethod
            def small(cls):
                return cls()

        def returns_int():
            return 3

        def raises():
            raise RuntimeError("no weights here\\nsecond line")

        def needs_arg(width):
            return nn.Linear(width, 2)

        def vector_output():
            return nn.Sequential(nn.Flatten(), nn.Linear(8, 1), nn.Flatten(0))

        constant = 5
        instance = build()
    """))
    (tmp_path / "userzoo_broken_issue21.py").write_text("import not_a_module_anywhere_issue21\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    import sys

    for name in ("userzoo_issue21", "userzoo_broken_issue21"):
        sys.modules.pop(name, None)


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_profiles_a_factory_model(capsys, factories):
    out = factories / "t.json"
    rc, stdout, err = _run(capsys, "profile", "--model", "userzoo_issue21:build", "--batch-size", "4",
                           "--input-shape", "3,8,8", "--warmup", "0", "--iters", "2", "-o", str(out))
    assert rc == 0, err
    t = Trace.load(out)
    assert t.model == "Sequential" and t.batch_size == 4 and t.device == "cpu" and t.num_layers == 2
    assert t.extra["factory"] == "userzoo_issue21:build" and t.extra["input_shape"] == [3, 8, 8]
    assert t.extra["num_classes"] == 5  # the model's outputs per sample
    assert json.loads(stdout)["layers"] == 2
    rc, _, err = _run(capsys, "profile", "--model", "userzoo_issue21:Mlp.small", "--batch-size", "3",
                      "--input-shape", "8", "--num-classes", "2", "--view", "tensor", "--warmup", "0", "--iters", "1",
                      "-o", str(out))
    assert rc == 0, err
    t = Trace.load(out)
    assert t.model == "Mlp" and t.batch_size == 3 and t.extra["num_classes"] == 2
    assert sorted(layer.name for layer in t.layers) == ["fc.bias", "fc.weight"]


@pytest.mark.parametrize("model, extra, message", [
    ("userzoo_issue21.build", [], "with a colon"),
    ("userzoo_issue21:", [], "package.module:factory"),
    ("userzoo-issue21:build", [], "package.module:factory"),
    ("userzoo_issue21:build:x", [], "package.module:factory"),
    ("no_such_module_issue21:build", [], "no module named 'no_such_module_issue21'"),
    ("userzoo_broken_issue21:build", [], "importing 'userzoo_broken_issue21' failed: ModuleNotFoundError"),
    ("userzoo_issue21:missing", [], "has no attribute 'missing'"),
    ("userzoo_issue21:constant", [], "constant is not callable"),
    ("userzoo_issue21:instance", [], "a model instance, not a factory"),
    ("userzoo_issue21:returns_int", [], "returned type int, not a torch.nn.Module"),
    ("userzoo_issue21:raises", [], "calling raises() failed: RuntimeError: no weights here"),
    ("userzoo_issue21:needs_arg", [], "calling needs_arg() failed: TypeError"),
    ("userzoo_issue21:build", ["--input-shape", "3,9"], "a forward pass on inputs of shape (4, 3, 9)"),
    ("userzoo_issue21:vector_output", ["--input-shape", "8"], "(batch, classes) logits"),
    ("userzoo_issue21:build", ["--input-shape", "3,8,8", "--num-classes", "6"], "more than the model's 5 outputs"),
    ("userzoo_issue21:build", ["--input-shape", "3,8,8", "--num-classes", "0"], "--num-classes must be positive"),
    ("userzoo_issue21:build", ["--input-shape", "3,x"], "--input-shape must be positive integers"),
    ("userzoo_issue21:build", ["--input-shape", "3,0,8"], "--input-shape must be positive integers"),
    ("userzoo_issue21:build", None, "needs --input-shape"),
    ("userzoo_issue21:build", ["--input-shape", "3,8,8", "--estimate-gpu", "V100"], "registry models only"),
    ("tiny_vgg", ["--input-shape", "3,8,8"], "--input-shape is for a model of your own"),
    ("tiny_vgg", ["--num-classes", "3"], "--num-classes is for a model of your own"),
    ("resnet5", [], "unknown model 'resnet5'"),
])
def test_cli_bad_factory_reference_is_one_line_before_any_work(capsys, factories, model, extra, message):
    out = factories / "t.json"
    flags = ["--input-shape", "3,8,8"] if extra == [] else (extra or [])
    rc, stdout, err = _run(capsys, "profile", "--model", model, "--batch-size", "4", *flags, "-o", str(out))
    assert rc == 2 and message in err, err
    assert err.startswith("repro: error: ") and err.count("\n") == 1 and stdout == ""
    assert not out.exists()  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cli_factory_model_on_missing_cuda_is_one_line(capsys, factories):
    rc, _, err = _run(capsys, "profile", "--model", "userzoo_issue21:build", "--batch-size", "4", "--input-shape",
                      "3,8,8", "--device", "cuda", "-o", str(factories / "t.json"))
    assert rc == 2 and "CUDA is not available" in err and err.count("\n") == 1
