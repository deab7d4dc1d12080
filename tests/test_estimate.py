"""The roofline estimator and the shipped traces."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from repro.core.paths import shipped_traces, traces_dir
from repro.workload.estimate import (COMPUTE_EFFICIENCY, GPU_SPECS, KERNEL_OVERHEAD_S, MEMORY_EFFICIENCY,
                            count_flops, estimate_trace, get_gpu)
from repro.workload.models import PAPER_MODELS, build_model, compute_loss, count_params, get_spec, make_batch
from repro.workload.profile import profile_model
from repro.core.trace import Trace, load_trace

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def r50():
    return estimate_trace("resnet50", 32, gpu="V100")


def test_gpu_table():
    assert {"K80", "P100", "V100", "A100", "H100"} <= set(GPU_SPECS)
    order = [GPU_SPECS[g] for g in ("K80", "P100", "V100", "A100", "H100")]
    assert all(a.fp32_flops < b.fp32_flops for a, b in zip(order, order[1:]))
    assert all(a.memory_bandwidth < b.memory_bandwidth for a, b in zip(order, order[1:]))
    assert GPU_SPECS["V100"].fp32_flops == 15.7e12 and GPU_SPECS["V100"].memory_bandwidth == 900e9
    assert get_gpu("v100") is GPU_SPECS["V100"]
    assert 0 < COMPUTE_EFFICIENCY <= 1 and 0 < MEMORY_EFFICIENCY <= 1 and KERNEL_OVERHEAD_S >= 0


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'V101'") as e:
        estimate_trace("tiny_vgg", 2, gpu="V101")
    for name in GPU_SPECS:
        assert name in str(e.value)


def test_labelled_as_estimate(r50):
    assert r50.device == "V100 (estimate)"
    assert r50.is_estimate and r50.extra["estimate"] is True
    assert r50.extra["source"] == "estimate" and r50.extra["gpu"] == "V100"
    a = r50.extra["assumptions"]
    assert a["compute_efficiency"] == COMPUTE_EFFICIENCY and a["memory_efficiency"] == MEMORY_EFFICIENCY
    assert a["kernel_overhead_s"] == KERNEL_OVERHEAD_S
    assert Trace.from_json(r50.to_json()) == r50


def test_resnet50_v100_is_plausible(r50):
    total = r50.total_forward_s + r50.total_backward_s
    print(f"V100 ResNet-50 b32 estimate: forward {r50.total_forward_s * 1e3:.1f} ms, "
          f"backward {r50.total_backward_s * 1e3:.1f} ms, {32 / total:.0f} images/s")
    assert 0.02 < total < 0.2                     # tens of milliseconds
    assert 250 < 32 / total < 500                 # published fp32 V100 training: ~360-400 images/s
    assert 1.3 < r50.total_backward_s / r50.total_forward_s < 2.5
    assert r50.num_layers == 107 and r50.total_params == 25_557_032
    assert all(layer.bytes == 4 * layer.params for layer in r50.layers)
    assert r50.names[0] == "conv1" and r50.names[-1] == "fc"


def test_resnet50_flops_convention():
    # ResNet-50 forward is ~4.1 GMACs per image; torch's flop counter counts a multiply-add as 2.
    f = count_flops("resnet50", 1)
    assert f["forward"] == pytest.approx(8.2e9, rel=0.10)
    assert f["backward"] == pytest.approx(2 * f["forward"], rel=0.10)


@pytest.mark.slow
def test_flops_match_flop_counter_totals_and_modules():
    t = estimate_trace("resnet50", 1, gpu="V100")
    f = count_flops("resnet50", 1)
    assert t.extra["forward_flops"] == f["forward"] and t.extra["backward_flops"] == f["backward"]
    # Per module: FlopCounterMode's module tracking agrees with our event attribution, except on the
    # downsample convolutions, where its backward attribution also counts the sibling branch.
    model = build_model("resnet50", device="meta")
    x, y = make_batch("resnet50", 1, device="meta")
    with FlopCounterMode(display=False, depth=None) as counter:
        compute_loss("resnet50", model, x, y).backward()
    counts = counter.get_flop_counts()
    checked = 0
    for layer in t.layers:
        if "downsample" in layer.name:
            continue
        ref = sum(counts.get(f"ResNet.{layer.name}", {}).values())
        assert layer.extra["forward_flops"] + layer.extra["backward_flops"] == ref, layer.name
        checked += ref > 0
    assert checked == 50   # 49 convolutions outside the downsample branches, and fc


@pytest.mark.slow
def test_v100_faster_than_k80_and_forward_convention():
    v100 = estimate_trace("googlenet", 64, gpu="V100")
    k80 = estimate_trace("googlenet", 64, gpu="K80")
    assert k80.device == "K80 (estimate)"
    assert v100.total_backward_s < k80.total_backward_s / 3
    assert v100.total_forward_s < k80.total_forward_s / 3
    assert v100.names == k80.names
    half = estimate_trace("googlenet", 64, gpu="K80", forward_from_backward=0.5)
    assert half.extra["assumptions"]["forward_from_backward"] == 0.5
    assert half.backward_s().tolist() == k80.backward_s().tolist()
    assert half.forward_s().tolist() == pytest.approx((0.5 * k80.backward_s()).tolist())


def test_same_layers_and_order_as_the_profiler():
    for view in ("module", "tensor"):
        est = estimate_trace("tiny_resnet", 8, gpu="H100", view=view)
        meas = profile_model("tiny_resnet", 8, view=view, warmup=0, iters=1)
        assert est.names == meas.names
        assert est.params().tolist() == meas.params().tolist()


@pytest.mark.slow
def test_tensor_view_and_tied_weights():
    t = estimate_trace("tiny_bert", 4, gpu="A100", view="tensor")
    assert t.total_params == count_params(build_model("tiny_bert"))
    assert "bert.embeddings.word_embeddings.weight" in t.names
    assert "cls.predictions.decoder.weight" not in t.names   # tied: counted once


def test_float16_halves_gradient_bytes_and_is_faster():
    t16 = estimate_trace("resnet50", 32, gpu="V100", dtype="float16")
    t32 = estimate_trace("resnet50", 32, gpu="V100")
    assert t16.dtype == "float16" and t16.total_bytes == 2 * t16.total_params
    assert t16.total_backward_s < t32.total_backward_s / 2


@pytest.mark.parametrize("kwargs, match", [
    ({"view": "layer"}, "unknown view"),
    ({"dtype": "int8"}, "unknown dtype"),
    ({"batch_size": 0}, "batch_size"),
    ({"compute_efficiency": 1.5}, "compute_efficiency"),
    ({"model_name": "nope"}, "valid names"),
])
def test_argument_errors(kwargs, match):
    args = {"model_name": "tiny_vgg", "batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        estimate_trace(**args)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["densenet201", "inception_v4", "bert_base", "vgg16"])
def test_paper_models_estimate(name):
    t = estimate_trace(name, 2, gpu="V100")
    assert t.num_layers > 10 and t.total_forward_s > 0 and t.total_backward_s > 0
    assert t.total_params == count_params(build_model(name, device="meta"))


# ---- shipped traces ----

def test_shipped_traces_load():
    stems = shipped_traces()
    assert stems, f"no traces in {traces_dir()}"
    for stem in stems:
        t = Trace.load(traces_dir() / f"{stem}.json")
        if "estimate" in stem:
            assert t.extra["estimate"] is True and t.device.endswith("(estimate)"), stem
        else:
            assert t.extra["source"] == "measured" and not t.is_estimate, stem
        assert stem.startswith(f"{t.model}_b{t.batch_size}_"), stem


def test_expected_traces_are_shipped():
    stems = set(shipped_traces())
    for name in PAPER_MODELS:
        assert f"{name}_b{get_spec(name).paper_batch_size}_v100-estimate" in stems
    assert {"googlenet_b64_k80-estimate", "resnet50_b32_k80-estimate"} <= stems
    for name in ("tiny_resnet", "tiny_vgg", "tiny_bert"):
        assert {f"{name}_b32_cpu", f"{name}_b32_cpu-tensor"} <= stems


def _trace(times, names=None, batch_size=32):
    """A synthetic trace: layer i has forward + backward ``times[i]`` seconds (a quarter forward)."""
    from repro.core.trace import Layer

    names = names or [f"l{i}" for i in range(len(times))]
    return Trace("synthetic", batch_size, "synthetic", "float32",
                 [Layer(n, 1, 4, t / 4, 3 * t / 4) for n, t in zip(names, times)])


def test_layer_errors_match_layers_by_name_and_summarise():
    from repro.workload.estimate import error_summary, layer_errors

    measured = _trace([1.0, 2.0, 0.0])
    estimated = _trace([2.5, 0.5, 0.1], names=["l1", "l0", "l2"])  # another order: matched by name
    rows = layer_errors(measured, estimated)
    assert [r["layer"] for r in rows] == ["l0", "l1", "l2"]
    assert [r["estimated_s"] for r in rows] == pytest.approx([0.5, 2.5, 0.1])
    assert rows[0]["rel_error"] == pytest.approx(-0.5) and rows[1]["rel_error"] == pytest.approx(0.25)
    assert rows[2]["rel_error"] is None  # nothing measured: no relative error
    summary = error_summary(rows)
    assert summary["layers"] == 3 and summary["compared"] == 2
    assert summary["median_abs_rel_error"] == pytest.approx(0.375)  # median of 0.5 and 0.25
    assert summary["measured_total_s"] == pytest.approx(3.0) and summary["estimated_total_s"] == pytest.approx(3.1)
    assert summary["total_ratio"] == pytest.approx(3.1 / 3.0)
    assert error_summary(layer_errors(_trace([0.0]), _trace([1.0])))["median_abs_rel_error"] is None


def test_layer_errors_refuse_traces_of_other_layers_or_runs():
    from repro.workload.estimate import layer_errors

    with pytest.raises(ValueError, match=r"1 only measured, e\.g\. \['l1'\]; 1 only estimated, e\.g\. \['x'\]"):
        layer_errors(_trace([1.0, 2.0]), _trace([1.0, 2.0], names=["l0", "x"]))
    with pytest.raises(ValueError, match="different runs"):
        layer_errors(_trace([1.0]), _trace([1.0], batch_size=64))


# --- half precision (issue 34) -------------------------------------------------------------------

#: NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, one V100 16GB: 367 img/s FP32, 1,200 img/s AMP
PUBLISHED_AMP_OVER_FP32 = 1200 / 367


def test_v100_resnet50_fp16_speedup_is_near_the_published_amp_ratio():
    t32 = estimate_trace("resnet50", 64, gpu="V100")
    t16 = estimate_trace("resnet50", 64, gpu="V100", dtype="float16")
    ratio = (t32.total_forward_s + t32.total_backward_s) / (t16.total_forward_s + t16.total_backward_s)
    # band: within 20% of the published 3.26x (the estimator gives 3.31x)
    assert 0.8 * PUBLISHED_AMP_OVER_FP32 <= ratio <= 1.2 * PUBLISHED_AMP_OVER_FP32
    assert t16.extra["assumptions"]["precision"] == "autocast"


def test_autocast_costs_more_than_pure_fp16_and_bf16_needs_hardware():
    amp = estimate_trace("tiny_bert", 8, gpu="A100", dtype="float16")
    pure = estimate_trace("tiny_bert", 8, gpu="A100", dtype="float16", amp=False)
    assert amp.total_backward_s > pure.total_backward_s   # master-weight casts, fp32 softmax/layer norm
    bf = estimate_trace("tiny_bert", 8, gpu="H200", dtype="bfloat16")
    assert bf.dtype == "bfloat16" and bf.extra["assumptions"]["peak_flops"] == 989.4e12
    with pytest.raises(ValueError, match="no bfloat16"):
        estimate_trace("tiny_bert", 8, gpu="V100", dtype="bfloat16")


def test_fp32_convolutions_use_tf32_where_the_gpu_has_it():
    tf32 = estimate_trace("tiny_resnet", 8, gpu="H200")
    cuda = estimate_trace("tiny_resnet", 8, gpu="H200", tf32_conv=False)
    assert tf32.extra["assumptions"]["tf32_conv"] and not cuda.extra["assumptions"]["tf32_conv"]
    assert tf32.total_backward_s < cuda.total_backward_s
    v100 = estimate_trace("tiny_resnet", 8, gpu="V100")
    assert not v100.extra["assumptions"]["tf32_conv"]


FP16_TRACES = [("resnet152", 128), ("densenet161", 64), ("densenet201", 64), ("inception_v4", 128)]


@pytest.mark.parametrize("model,batch", FP16_TRACES)
def test_shipped_fp16_traces_match_the_estimator(model, batch):
    shipped = load_trace(f"{model}_b{batch}_v100-estimate-fp16")
    fp32 = load_trace(f"{model}_b{batch}_v100-estimate")
    assert shipped.dtype == "float16" and shipped.extra["assumptions"]["precision"] == "autocast"
    assert shipped.names == fp32.names and shipped.total_bytes == 2 * shipped.total_params
    assert shipped.total_forward_s + shipped.total_backward_s < (fp32.total_forward_s + fp32.total_backward_s) / 2
    if model == "densenet201":   # regenerate one (about 2 s) and compare layer by layer
        again = estimate_trace(model, batch, gpu="V100", view="module", dtype="float16")
        assert again.backward_s().tolist() == pytest.approx(shipped.backward_s().tolist(), rel=1e-9)
        assert again.forward_s().tolist() == pytest.approx(shipped.forward_s().tolist(), rel=1e-9)
