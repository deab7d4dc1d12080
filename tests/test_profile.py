"""The CPU profiler: a valid trace, both views, timing convention, order, sizes, argument checks."""

import statistics
import time

import pytest
import torch
from torch import nn

from repro.workload.models import build_model, compute_loss, count_params, make_batch
from repro.workload.layers import Param
from repro.workload.profile import profile_model
from repro.workload.recording import IterationTimeline, attribute
from repro.core.trace import Trace

torch.set_num_threads(1)
BATCH = 32


@pytest.fixture(scope="module")
def traces():
    return {view: profile_model("tiny_resnet", BATCH, view=view, warmup=2, iters=7)
            for view in ("module", "tensor")}


def _grad_ready_order(name):
    """Parameter names in the order their gradients become ready, observed independently."""
    model = build_model(name)
    order = []
    for pname, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda t, pname=pname: order.append(pname))
    inputs, targets = make_batch(name, BATCH)
    compute_loss(name, model, inputs, targets).backward()
    return order


@pytest.mark.slow
@pytest.mark.parametrize("view", ["module", "tensor"])
def test_valid_trace_and_labels(traces, view):
    t = traces[view]
    assert Trace.from_json(t.to_json()) == t
    assert (t.model, t.batch_size, t.device, t.dtype) == ("tiny_resnet", BATCH, "cpu", "float32")
    assert t.extra["source"] == "measured" and t.extra["view"] == view
    assert (t.extra["warmup"], t.extra["iters"]) == (2, 7)
    assert t.extra["torch"] == torch.__version__
    assert not t.is_estimate
    assert t.total_forward_s > 0 and t.total_backward_s > 0
    assert all(layer.forward_s >= 0 and layer.backward_s >= 0 for layer in t.layers)


@pytest.mark.parametrize("view", ["module", "tensor"])
def test_sizes_are_fp32_gradients(traces, view):
    t = traces[view]
    assert all(layer.bytes == 4 * layer.params for layer in t.layers)
    assert t.total_params == count_params(build_model("tiny_resnet"))


def test_views_name_tensors_and_modules(traces):
    model = build_model("tiny_resnet")
    assert set(traces["tensor"].names) == {n for n, _ in model.named_parameters()}
    owners = {n for n, m in model.named_modules() if list(m.parameters(recurse=False))}
    assert set(traces["module"].names) == owners
    # Module view sums its tensors.
    tensor_params = dict(zip(traces["tensor"].names, traces["tensor"].params().tolist()))
    for layer in traces["module"].layers:
        assert layer.params == sum(v for k, v in tensor_params.items() if k.rsplit(".", 1)[0] == layer.name)


def test_layer_order_is_reverse_of_grad_ready_order(traces):
    ready = _grad_ready_order("tiny_resnet")
    assert traces["tensor"].names == ready[::-1]
    # A module is ready with its last tensor.
    last_seen = {}
    for i, pname in enumerate(ready):
        last_seen[pname.rsplit(".", 1)[0]] = i
    assert traces["module"].names == sorted(last_seen, key=last_seen.get)[::-1]
    assert traces["module"].extra["order_changes"] == 0


@pytest.mark.slow
def test_sum_of_layers_matches_separately_timed_iteration(traces):
    model = build_model("tiny_resnet")
    inputs, targets = make_batch("tiny_resnet", BATCH)
    totals = []
    for i in range(10):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = compute_loss("tiny_resnet", model, inputs, targets)
        loss.backward()
        if i >= 3:
            totals.append(time.perf_counter() - t0)
    wall = statistics.median(totals)
    for t in traces.values():
        total = t.total_forward_s + t.total_backward_s
        assert wall / 1.5 < total < wall * 1.5, (total, wall)
        # The per-layer split accounts for the whole measured forward and nearly all of backward.
        assert t.total_forward_s == pytest.approx(t.extra["wall_forward_s"], rel=0.25)
        assert t.total_backward_s == pytest.approx(t.extra["wall_backward_s"], rel=0.25)


def test_tiny_bert_tied_weights_and_views():
    for view in ("module", "tensor"):
        t = profile_model("tiny_bert", 4, view=view, warmup=1, iters=2, seq_len=16)
        assert t.total_params == count_params(build_model("tiny_bert"))
        assert t.extra["model_kwargs"] == {"seq_len": 16}
        assert t.total_forward_s > 0 and t.total_backward_s > 0


def _toy_params():
    def p(*shape):
        return nn.Parameter(torch.zeros(*shape))
    return [Param("a.weight", "a", p(2)), Param("a.bias", "a", p(1)), Param("b.weight", "b", p(3)),
            Param("c.weight", "c", p(4)), Param("d.weight", "d", p(5))]


def test_attribution_convention_on_a_hand_made_timeline():
    params = _toy_params()
    # Forward: a ends at 1, b at 3, c at 6, loss done at 7. d never runs, nor gets a gradient.
    # Backward starts at 10: c.weight ready at 12, b.weight 15, a.bias 16, a.weight 18.
    tl = IterationTimeline(forward_ends=[("a", 1.0), ("b", 3.0), ("c", 6.0)], forward_end=7.0,
                   backward_start=10.0, grad_ready=[(3, 12.0), (2, 15.0), (1, 16.0), (0, 18.0)],
                   backward_end=18.5)
    order, fwd, bwd = attribute(tl, params, "module")
    assert order == ["d", "a", "b", "c"]
    assert fwd == {"d": 0.0, "a": 1.0, "b": 2.0, "c": 4.0}   # tail (loss) goes to c
    assert bwd == {"d": 0.0, "a": 3.0, "b": 3.0, "c": 2.0}   # a completes with a.weight at 18
    order, fwd, bwd = attribute(tl, params, "tensor")
    assert order == ["d.weight", "a.weight", "a.bias", "b.weight", "c.weight"]
    assert bwd == {"d.weight": 0.0, "a.weight": 2.0, "a.bias": 1.0, "b.weight": 3.0, "c.weight": 2.0}
    # A module's forward goes to its first tensor in trace order.
    assert fwd == {"d.weight": 0.0, "a.weight": 1.0, "a.bias": 0.0, "b.weight": 2.0, "c.weight": 4.0}
    # The simulator's reading: layer l's gradient is ready sum(backward_s[l:]) after backward starts.
    b = [bwd[u] for u in order]
    assert sum(b[order.index("b.weight"):]) == 15.0 - 10.0


def test_module_called_twice_gets_both_gaps():
    params = _toy_params()[:3]
    tl = IterationTimeline(forward_ends=[("a", 1.0), ("b", 2.0), ("a", 4.0)], forward_end=4.5,
                   backward_start=5.0, grad_ready=[(2, 6.0), (1, 7.0), (0, 7.5)], backward_end=7.5)
    _, fwd, _ = attribute(tl, params, "module")
    assert fwd == {"a": 1.0 + 2.0 + 0.5, "b": 1.0}


@pytest.mark.parametrize("kwargs, match", [
    ({"view": "layer"}, "unknown view 'layer'"),
    ({"device": "tpu"}, "unknown device 'tpu'"),
    ({"device": "V100"}, "estimate_trace"),
    ({"device": "meta"}, "cannot measure on device 'meta'"),
    ({"warmup": -1}, "warmup"),
    ({"iters": 0}, "iters"),
    ({"batch_size": 0}, "batch_size"),
    ({"autocast": "float8"}, "unknown autocast dtype 'float8'"),
    ({"autocast": "bf16"}, "valid: bfloat16, float16"),
])
def test_argument_errors(kwargs, match):
    args = {"model_name": "tiny_vgg", "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        profile_model(**args)


def test_autocast_bfloat16_runs_each_forward_under_autocast_and_labels_the_trace(monkeypatch):
    import repro.workload.profile as profile

    seen = []
    real = profile.compute_loss

    def spy(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*args, **kwargs)

    monkeypatch.setattr(profile, "compute_loss", spy)
    t = profile_model("tiny_resnet", 8, view="module", warmup=1, iters=2, autocast="bfloat16")
    assert seen == [(True, torch.bfloat16)] * 3  # warm-up and timed iterations alike
    assert torch.is_autocast_enabled("cpu") is False  # nothing left on after the measurement
    assert t.extra["precision"] == "autocast-bfloat16"
    # the gradients stay float32 (autocast casts copies of the weights): dtype and bytes are fp32's
    assert t.dtype == "float32" and all(layer.bytes == 4 * layer.params for layer in t.layers)
    assert set(t.names) == {name for name, m in build_model("tiny_resnet").named_modules()
                            if any(True for _ in m.parameters(recurse=False))}
    assert t.total_forward_s > 0 and t.total_backward_s > 0
    assert Trace.from_json(t.to_json()) == t and Trace.from_json(t.to_json()).extra["precision"] == t.extra["precision"]

    seen.clear()
    plain = profile_model("tiny_resnet", 8, view="module", warmup=0, iters=1)
    assert seen == [(False, torch.get_autocast_dtype("cpu"))] and plain.extra["precision"] == "float32"


def test_autocast_on_a_module_computes_in_that_dtype():
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    dtypes = []

    def loss_fn(module, x, y):
        out = module(x)
        dtypes.append(out.dtype)
        return nn.functional.cross_entropy(out.float(), y)

    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    t = profile_model(net, batch=(x, y), loss_fn=loss_fn, view="module", warmup=0, iters=2, autocast="bfloat16")
    assert dtypes == [torch.bfloat16] * 2 and t.extra["precision"] == "autocast-bfloat16"
    assert all(p.dtype == torch.float32 and p.grad is None for p in net.parameters())  # given back as it was
    dtypes.clear()
    profile_model(net, batch=(x, y), loss_fn=loss_fn, view="module", warmup=0, iters=1)
    assert dtypes == [torch.float32]


def test_unknown_model():
    with pytest.raises(ValueError, match="valid names"):
        profile_model("nope", 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_unavailable_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        profile_model("tiny_vgg", 2, device="cuda")


@pytest.mark.gpu
def test_cuda_profile():
    t = profile_model("tiny_resnet", BATCH, device="cuda", view="module", warmup=2, iters=5)
    assert t.device == torch.cuda.get_device_name()
    assert t.total_forward_s > 0 and t.total_backward_s > 0
    assert t.total_forward_s == pytest.approx(t.extra["wall_forward_s"], rel=0.05)
