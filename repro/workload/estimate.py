"""Estimate per-layer forward/backward times of a model on a named GPU (no hardware needed).

Every trace here is an ESTIMATE, labelled as such (``device`` e.g. ``"V100 (estimate)"``,
``extra["estimate"]``, ``extra["assumptions"]``); prefer :func:`repro.workload.profile.profile_model`
when the hardware is at hand. The model runs one training step on the meta device under a dispatch
mode that charges every ATen operator (FLOPs from ``torch.utils.flop_counter``, bytes its tensors')::

    seconds = max(flops / (peak_flops * COMPUTE_EFFICIENCY),
                  bytes / (memory_bandwidth * MEMORY_EFFICIENCY)) + KERNEL_OVERHEAD_S

with the peak of the operator's kind and dtype (16-bit convolutions and matmuls on tensor cores,
float32 convolutions on TF32 where the GPU has it, the rest memory-bound). The seconds advance a
virtual clock read by the profiler's hooks (:mod:`repro.workload.recording`), so time is charged to
layers as in a measured trace.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from repro.workload.models import build_model, compute_loss, get_spec, make_batch
from repro.workload.layers import _check_view, learnable_params, unit_name, unit_sizes
from repro.workload.recording import Recorder, attribute, resolve
from repro.core.trace import Layer, Trace

__all__ = ["GpuSpec", "GPU_SPECS", "DTYPES", "COMPUTE_EFFICIENCY", "MEMORY_EFFICIENCY", "TENSOR_CORE_EFFICIENCY",
           "KERNEL_OVERHEAD_S", "get_gpu", "estimate_trace", "count_flops", "describe_assumptions",
           "layer_errors", "error_summary"]


@dataclass(frozen=True)
class GpuSpec:
    """Vendor datasheet peaks of one GPU (one die for dual-die boards)."""

    name: str
    fp32_flops: float        # peak fp32 FLOP/s (CUDA cores)
    fp16_flops: float        # peak fp16 FLOP/s for matmul/conv (tensor cores where present, dense)
    memory_bandwidth: float  # peak memory bandwidth, bytes/s
    variant: str             # which product/variant the numbers are for
    compute_efficiency: float | None = None  # overrides COMPUTE_EFFICIENCY (None: the default)
    memory_efficiency: float | None = None   # overrides MEMORY_EFFICIENCY
    tf32_flops: float | None = None          # dense TF32 tensor-core peak, FLOP/s (None: no TF32)
    bf16_flops: float | None = None          # dense bf16 tensor-core peak, FLOP/s (None: no bfloat16)


# NVIDIA datasheet peaks (boost clocks, dense); sources and the K80 / P102 assumptions in
# docs/design/runtime.md.
GPU_SPECS: dict[str, GpuSpec] = {g.name: g for g in [
    # half a board (one GK210 die per GPU, as the papers count); fp16 at the fp32 rate.
    # ASSUMPTION: efficiencies 0.35 / 0.7 (ResNet-50 batch 32 near tf_cnn_benchmarks' 49.5 images/s)
    GpuSpec("K80", 8.73e12 / 2, 8.73e12 / 2, 480e9 / 2, "Tesla K80, one GK210 die (half a board)",
            compute_efficiency=0.35, memory_efficiency=0.7),
    GpuSpec("P100", 10.6e12, 21.2e12, 732e9, "Tesla P100 SXM2"),
    GpuSpec("V100", 15.7e12, 125e12, 900e9, "Tesla V100 SXM2"),  # MG-WFBP's journal: SXM2 or PCIe?
    GpuSpec("A100", 19.5e12, 312e12, 2039e9, "A100 SXM4 80GB", tf32_flops=156e12, bf16_flops=312e12),
    GpuSpec("H100", 67e12, 989e12, 3.35e12, "H100 SXM5", tf32_flops=494.7e12, bf16_flops=989e12),
    # H100's GH100 compute (Hopper whitepaper's dense peaks) with 4.8 TB/s HBM3e
    GpuSpec("H200", 66.9e12, 989.4e12, 4.8e12, "H200 SXM 141GB", tf32_flops=494.7e12, bf16_flops=989.4e12),
    # OMGS-SGD's mining board, no datasheet: third-party peaks (3,200 cores at 1,683 MHz, 440.3 GB/s),
    # default efficiencies; fp16 at the fp32 rate (cuDNN computes GP102's fp16 layers in fp32)
    GpuSpec("P102", 2 * 3200 * 1.683e9, 2 * 3200 * 1.683e9, 440.3e9,
            "P102-100 (GP102 mining board, 3200 cores, 5 GB GDDR5X; third-party specs)"),
]}

_GPU_ALIASES = {"p102-100": "p102"}  # full product names of table entries, lower case

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: ASSUMPTION: fraction of peak FLOP/s cuDNN/cuBLAS convolutions and matmuls reach in training (V100 fp32
#: ResNet-50 at batch 32: ~360 images/s, next to NVIDIA's published 367)
COMPUTE_EFFICIENCY = 0.8
#: ASSUMPTION: fraction of peak memory bandwidth elementwise/normalisation kernels reach (STREAM-like)
MEMORY_EFFICIENCY = 0.85
#: ASSUMPTION: fixed cost per kernel (launch and tail), seconds, added to every non-view operator
KERNEL_OVERHEAD_S = 5e-6
#: ASSUMPTION: fraction of the dense tensor-core peak reached in training, per operator kind: matmul 0.66
#: (Markidis et al. 2018: cuBLAS GEMM at 83 of a V100's 125 TFLOPS), conv 0.5 (checked against NVIDIA's
#: ResNet-50 mixed-precision speed-up on a V100; docs/design/runtime.md)
TENSOR_CORE_EFFICIENCY = {"matmul": 0.66, "conv": 0.5}

#: ATen operators (and their backward kernels) torch.autocast runs in float32 whatever their inputs
#: (PyTorch's amp docs): charged 4 bytes per element under amp.
_AUTOCAST_FP32_NAMES = (
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
    "mse_loss", "mse_loss_backward", "binary_cross_entropy_with_logits", "exp", "log", "pow", "rsqrt",
    "reciprocal", "sum", "prod", "cumsum", "cumprod", "norm", "linalg_vector_norm",
)
_AUTOCAST_FP32_OPS = {getattr(torch.ops.aten, n) for n in _AUTOCAST_FP32_NAMES if hasattr(torch.ops.aten, n)}
_CONV_OPS = {torch.ops.aten.convolution, torch.ops.aten._convolution, torch.ops.aten.convolution_backward,
             torch.ops.aten.cudnn_convolution, torch.ops.aten._slow_conv2d_forward,
             torch.ops.aten.convolution_overrideable}

# Operators that move no data on a GPU (allocations, metadata changes); views are detected by schema.
_FREE_OPS = {
    torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided, torch.ops.aten._unsafe_view,
    torch.ops.aten.lift_fresh, torch.ops.aten.set_, torch.ops.aten.resize_,
    torch.ops.aten.t_, torch.ops.aten.transpose_, torch.ops.aten.squeeze_,
    torch.ops.aten.unsqueeze_, torch.ops.aten.as_strided_, torch.ops.aten.detach_,
}


def get_gpu(gpu: str | GpuSpec) -> GpuSpec:
    """The :class:`GpuSpec` named ``gpu`` (case-insensitive; ``"P102-100"`` is ``"P102"``);
    ``ValueError`` listing known ones."""
    if isinstance(gpu, GpuSpec):
        return gpu
    key = gpu.strip().lower() if isinstance(gpu, str) else None
    key = _GPU_ALIASES.get(key, key)
    for name, spec in GPU_SPECS.items():
        if key == name.lower():
            return spec
    raise ValueError(f"unknown GPU {gpu!r}; known GPUs: {', '.join(GPU_SPECS)}")


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches for ``t``: broadcast (stride-0) dimensions count once."""
    return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0) * t.element_size()


class _RooflineMode(TorchDispatchMode):
    """Charges every ATen operator its roofline time on a virtual clock; :meth:`stamp` (seconds, FLOPs,
    bytes so far) is the recorder's clock, read back per component."""

    def __init__(self, gpu: GpuSpec, dtype: str, compute_efficiency: float,
                 memory_efficiency: float, kernel_overhead_s: float, amp: bool = False,
                 tf32_conv: bool = False, tensor_core_efficiency: dict[str, float] | None = None) -> None:
        super().__init__()
        self.rates = _flop_rates(gpu, dtype, compute_efficiency, tf32_conv,
                                 tensor_core_efficiency or TENSOR_CORE_EFFICIENCY)
        self.byte_rate = gpu.memory_bandwidth * memory_efficiency
        self.overhead = kernel_overhead_s
        self.amp = amp and dtype != "float32"
        self.now = 0.0
        self.flops = 0
        self.bytes = 0
        self.kernels = 0

    def stamp(self) -> tuple[float, int, int]:
        return (self.now, self.flops, self.bytes)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in flop_registry:
            # Same as FlopCounterMode: count a composite operator through its decomposition.
            with self:
                r = func.decompose(*args, **kwargs)
            if r is not NotImplemented:
                return r
        out = func(*args, **kwargs)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if func.is_view or packet in _FREE_OPS or not outputs:   # no data moved, or a metadata query
            return out
        flops = int(flop_registry[packet](*args, **kwargs, out_val=out)) if packet in flop_registry else 0
        nbytes = sum(_tensor_bytes(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        nbytes += sum(_tensor_bytes(t) for t in outputs)
        if self.amp and packet in _AUTOCAST_FP32_OPS:
            nbytes *= 2   # autocast runs it in float32: 4-byte elements where the meta run has 2
        rate = self.rates["conv" if packet in _CONV_OPS else "matmul"]
        self.now += max(flops / rate, nbytes / self.byte_rate) + self.overhead
        self.flops += flops
        self.bytes += nbytes
        self.kernels += 1
        return out


def _half_peak(gpu: GpuSpec, dtype: str) -> float:
    """Peak FLOP/s of ``gpu``'s matmul/conv units in 16-bit ``dtype``."""
    if dtype == "bfloat16":
        if gpu.bf16_flops is None:
            raise ValueError(f"{gpu.name} has no bfloat16 support ({gpu.variant}); "
                             f"GPUs with it: {', '.join(n for n, g in GPU_SPECS.items() if g.bf16_flops)}")
        return gpu.bf16_flops
    return gpu.fp16_flops


def _flop_rates(gpu: GpuSpec, dtype: str, compute_efficiency: float, tf32_conv: bool,
                tensor_core_efficiency: dict[str, float]) -> dict[str, float]:
    """Achieved FLOP/s of ``{"conv": ..., "matmul": ...}`` operators in ``dtype`` on ``gpu``."""
    if dtype == "float32":
        cuda = gpu.fp32_flops * compute_efficiency
        conv = gpu.tf32_flops * tensor_core_efficiency["conv"] if tf32_conv and gpu.tf32_flops else cuda
        return {"conv": conv, "matmul": cuda}
    peak = _half_peak(gpu, dtype)
    # a tensor-core peak is more than 4x fp32 (V100 and later); P100's 2x fp16, or fp16 at the fp32 rate:
    # CUDA-core efficiency
    if gpu.fp16_flops <= 4 * gpu.fp32_flops:
        return {"conv": peak * compute_efficiency, "matmul": peak * compute_efficiency}
    return {k: peak * tensor_core_efficiency[k] for k in ("conv", "matmul")}


def estimate_trace(model_name: str, batch_size: int, gpu: str | GpuSpec = "V100", view: str = "module",
                   dtype: str = "float32", *, forward_from_backward: float | None = None,
                   compute_efficiency: float | None = None,
                   memory_efficiency: float | None = None,
                   kernel_overhead_s: float = KERNEL_OVERHEAD_S, amp: bool = True,
                   tf32_conv: bool = True, tensor_core_efficiency: dict[str, float] | None = None,
                   **model_kwargs: Any) -> Trace:
    """Roofline estimate of ``model_name`` at ``batch_size`` on ``gpu``, as a labelled :class:`Trace`.

    ``dtype="float16"`` / ``"bfloat16"``: 16-bit training on tensor cores, autocast with float32 master
    weights (``amp=True``) or pure 16-bit; gradient bytes are 2 per parameter either way. ``tf32_conv``
    runs float32 convolutions on TF32 tensor cores where the GPU has them (PyTorch's default).
    ``tensor_core_efficiency`` overrides :data:`TENSOR_CORE_EFFICIENCY`; ``compute_efficiency`` /
    ``memory_efficiency`` default to the GPU's override, else the module's. ``forward_from_backward=0.5``
    makes each forward half its backward (the MG-WFBP conference paper's convention). ``model_kwargs`` go
    to the model registry (e.g. ``seq_len``).
    """
    get_spec(model_name)
    spec = get_gpu(gpu)
    if compute_efficiency is None:
        compute_efficiency = spec.compute_efficiency or COMPUTE_EFFICIENCY
    if memory_efficiency is None:
        memory_efficiency = spec.memory_efficiency or MEMORY_EFFICIENCY
    _check_view(view)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    for label, v in (("compute_efficiency", compute_efficiency), ("memory_efficiency", memory_efficiency)):
        if not 0 < v <= 1:
            raise ValueError(f"{label} must be in (0, 1], got {v!r}")
    if kernel_overhead_s < 0:
        raise ValueError(f"kernel_overhead_s must not be negative, got {kernel_overhead_s!r}")
    tce = dict(TENSOR_CORE_EFFICIENCY if tensor_core_efficiency is None else tensor_core_efficiency)
    if set(tce) != {"conv", "matmul"} or not all(0 < v <= 1 for v in tce.values()):
        raise ValueError(f"tensor_core_efficiency must map 'conv' and 'matmul' to (0, 1], got {tce!r}")
    if dtype != "float32":
        _half_peak(spec, dtype)   # refuses bfloat16 on a GPU without it
    if forward_from_backward is not None and forward_from_backward < 0:
        raise ValueError(f"forward_from_backward must not be negative, got {forward_from_backward!r}")

    torch_dtype = DTYPES[dtype]
    model = build_model(model_name, device="meta", **model_kwargs).to(torch_dtype)
    inputs, targets = make_batch(model_name, batch_size, device="meta", **model_kwargs)
    inputs = tree_map(lambda t: t.to(torch_dtype) if t.is_floating_point() else t, inputs)   # a tensor or a dict
    params = learnable_params(model)
    amp = amp and dtype != "float32"
    mode = _RooflineMode(spec, dtype, compute_efficiency, memory_efficiency, kernel_overhead_s, amp=amp,
                         tf32_conv=tf32_conv, tensor_core_efficiency=tce)
    recorder = Recorder(model, params, mode)
    try:
        with mode:
            raw = recorder.run(lambda: compute_loss(model_name, model, inputs, targets, **model_kwargs))
    finally:
        recorder.close()

    # per component of the stamps: seconds, FLOPs, bytes
    (order, fwd, bwd), (_, fwd_flops, bwd_flops), (_, fwd_bytes, bwd_bytes) = (
        attribute(resolve(raw, lambda a, b, k=k: float(b[k] - a[k])), params, view) for k in range(3))
    if amp:
        # master-weight casts (forward, and the gradient back in backward): one memory-bound kernel per
        # cast tensor and pass, 2 + 4 bytes per element, in its layer. Autocast casts the parameters of
        # convolutions and linear layers (normalisation and embedding layers run with their float32 weights).
        cast_units = {u: 0.0 for u in order}
        for p in params:
            if isinstance(model.get_submodule(p.owner), (torch.nn.modules.conv._ConvNd, torch.nn.Linear)):
                u = p.name if view == "tensor" else unit_name(p.owner)
                cast_units[u] += p.tensor.numel() * 6 / mode.byte_rate + kernel_overhead_s
        fwd = {u: fwd[u] + cast_units[u] for u in order}
        bwd = {u: bwd[u] + cast_units[u] for u in order}
    if forward_from_backward is not None:
        fwd = {u: forward_from_backward * bwd[u] for u in order}
    sizes = unit_sizes(params, view, bytes_per_element=torch.tensor([], dtype=torch_dtype).element_size())
    layers = [Layer(name=u, params=sizes[u][0], bytes=sizes[u][1], forward_s=fwd[u], backward_s=bwd[u],
                    extra={"forward_flops": int(fwd_flops[u]), "backward_flops": int(bwd_flops[u])})
              for u in order]

    assumptions: dict[str, Any] = {
        "method": "per-operator roofline on the meta device: max(flops/(peak*compute_efficiency), "
                  "bytes/(bandwidth*memory_efficiency)) + kernel_overhead_s",
        "compute_efficiency": compute_efficiency,
        "memory_efficiency": memory_efficiency,
        "kernel_overhead_s": kernel_overhead_s,
        "peak_flops": spec.fp32_flops if dtype == "float32" else _half_peak(spec, dtype),
        "precision": "float32" if dtype == "float32" else ("autocast" if amp else "pure"),
        "tensor_core_efficiency": tce,
        "flop_rates": dict(mode.rates),
        "tf32_conv": bool(tf32_conv and dtype == "float32" and spec.tf32_flops),
        "memory_bandwidth": spec.memory_bandwidth,
        "gpu_variant": spec.variant,
        "forward_from_backward": forward_from_backward,
    }
    extra: dict[str, Any] = {
        "estimate": True,
        "source": "estimate",
        "gpu": spec.name,
        "view": view,
        "assumptions": assumptions,
        "forward_flops": int(sum(fwd_flops.values())),
        "backward_flops": int(sum(bwd_flops.values())),
        "forward_bytes_moved": int(sum(fwd_bytes.values())),
        "backward_bytes_moved": int(sum(bwd_bytes.values())),
        "kernels": mode.kernels,
        "torch": torch.__version__,
    }
    if model_kwargs:
        extra["model_kwargs"] = dict(model_kwargs)
    return Trace(model=model_name, batch_size=batch_size, device=f"{spec.name} (estimate)", dtype=dtype,
                 layers=tuple(layers), extra=extra)


def count_flops(model_name: str, batch_size: int, **model_kwargs: Any) -> dict[str, int]:
    """Training FLOPs (multiply-add = 2) by ``FlopCounterMode`` on the meta device:
    ``{"forward": ..., "backward": ..., "total": ...}`` (forward includes the loss)."""
    get_spec(model_name)
    model = build_model(model_name, device="meta", **model_kwargs)
    inputs, targets = make_batch(model_name, batch_size, device="meta", **model_kwargs)
    with FlopCounterMode(display=False) as counter:
        loss = compute_loss(model_name, model, inputs, targets, **model_kwargs)
        forward = counter.get_total_flops()
        loss.backward()
        total = counter.get_total_flops()
    return {"forward": int(forward), "backward": int(total - forward), "total": int(total)}


def describe_assumptions() -> dict[str, Any]:
    """The estimator's assumptions and GPU table, for reports."""
    return {"compute_efficiency": COMPUTE_EFFICIENCY, "memory_efficiency": MEMORY_EFFICIENCY,
            "tensor_core_efficiency": dict(TENSOR_CORE_EFFICIENCY),
            "kernel_overhead_s": KERNEL_OVERHEAD_S, "gpus": {k: asdict(v) for k, v in GPU_SPECS.items()}}


def layer_errors(measured: Trace, estimated: Trace) -> list[dict[str, Any]]:
    """Per layer of ``measured`` (by name): forward + backward seconds ``measured_s`` and ``estimated_s``
    and ``rel_error = estimated_s / measured_s - 1`` (None where measured is 0). ValueError unless both
    are of the same model, batch size and layer names."""
    if (measured.model, measured.batch_size) != (estimated.model, estimated.batch_size):
        raise ValueError(f"the traces are of different runs: measured {measured.model} at batch "
                         f"{measured.batch_size}, estimated {estimated.model} at batch {estimated.batch_size}")
    only_m = [n for n in measured.names if n not in estimated.index()]
    only_e = [n for n in estimated.names if n not in measured.index()]
    if only_m or only_e:
        raise ValueError(f"the traces' layers differ ({len(only_m)} only measured, e.g. {only_m[:3]}; "
                         f"{len(only_e)} only estimated, e.g. {only_e[:3]}): compare traces of the same view")
    by_name = {layer.name: layer for layer in estimated.layers}
    rows = []
    for layer in measured.layers:
        m = layer.forward_s + layer.backward_s
        e = by_name[layer.name].forward_s + by_name[layer.name].backward_s
        rows.append({"layer": layer.name, "measured_s": m, "estimated_s": e,
                     "rel_error": e / m - 1 if m > 0 else None})
    return rows


def error_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Summary of :func:`layer_errors`' rows: ``layers``, ``compared`` (with a measured time), the median
    ``|rel_error|``, both totals in seconds and their ratio (None where undefined)."""
    errors = [abs(r["rel_error"]) for r in rows if r["rel_error"] is not None]
    measured = float(sum(r["measured_s"] for r in rows))
    estimated = float(sum(r["estimated_s"] for r in rows))
    return {"layers": len(rows), "compared": len(errors),
            "median_abs_rel_error": statistics.median(errors) if errors else None,
            "measured_total_s": measured, "estimated_total_s": estimated,
            "total_ratio": estimated / measured if measured > 0 else None}
