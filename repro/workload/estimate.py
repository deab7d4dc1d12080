"""Estimate per-layer forward/backward times of a model on a named GPU (no hardware needed).

Every trace produced here is an ESTIMATE, labelled as such: ``device`` reads e.g.
``"V100 (estimate)"`` and ``extra`` holds ``{"estimate": True, "source": "estimate", "gpu": ...,
"assumptions": {...}}``. Use it for paper-scale simulation on hardware we do not have; prefer a
measured trace (:func:`repro.workload.profile.profile_model`) whenever the hardware is at hand.

Method:

1. Build the model on the meta device (shapes only) and run one training forward + backward on a
   synthetic batch under a ``TorchDispatchMode`` that sees every ATen operator ("kernel").
2. Per operator: FLOPs from the formulas ``torch.utils.flop_counter`` uses (``flop_registry``:
   matmuls, convolutions and their backward, attention; a multiply-add counts as 2 FLOPs), bytes
   moved = sizes of its tensor inputs and outputs (broadcast dimensions counted once). Views and
   allocations are free. Backward operators are the real backward kernels (e.g.
   ``convolution_backward``), so their FLOPs and bytes (about twice the forward's) come out of the
   same accounting.
3. Roofline per operator::

       seconds = max(flops / (peak_flops * COMPUTE_EFFICIENCY),
                     bytes / (memory_bandwidth * MEMORY_EFFICIENCY)) + KERNEL_OVERHEAD_S

   with the peak of the dtype (fp32 CUDA-core peak for ``"float32"``; fp16 tensor-core peak for
   ``"float16"`` where the GPU has tensor cores).
4. These seconds advance a virtual clock read by the same hooks the profiler uses
   (:mod:`repro.workload.profile`): forward time is the gap between ends of parameter-owning modules (so
   parameterless work, e.g. ReLU or pooling, is charged to the next parameter-owning module in
   forward order, and the loss to the last one); backward time is the gap between gradients
   becoming ready (so parameterless backward work is charged to the preceding parameter-owning
   module in forward order). Layers come in reverse gradient-ready order. A trace from here is
   therefore read exactly like a measured one.

The totals are cross-checked against ``FlopCounterMode`` (:func:`count_flops`) in the tests.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from repro.workload.models import build_model, compute_loss, get_spec, make_batch
from repro.workload.layers import VIEWS, learnable_params, unit_sizes
from repro.workload.recording import Recorder, attribute, resolve
from repro.trace import Layer, Trace

__all__ = ["GpuSpec", "GPU_SPECS", "DTYPES", "COMPUTE_EFFICIENCY", "MEMORY_EFFICIENCY",
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
    # Per-GPU overrides of COMPUTE_EFFICIENCY / MEMORY_EFFICIENCY (None: use the module defaults).
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None


# Numbers from the NVIDIA datasheets (boost clocks, dense i.e. without structured sparsity).
GPU_SPECS: dict[str, GpuSpec] = {g.name: g for g in [
    # Tesla K80 datasheet: 8.73 TFLOPS fp32 with GPU Boost and 480 GB/s for the board, which holds
    # two GK210 dies; the papers count one die as one GPU, so half of each. Kepler has no fast fp16:
    # fp16 runs at the fp32 rate.
    # ASSUMPTION (K80 only): compute efficiency 0.35 and memory efficiency 0.7. Under training load
    # a K80 die rarely holds its boost clock (autoboost under a 150 W per-die power cap) and
    # Kepler-era cuDNN reaches a lower fraction of peak; ECC on GDDR5 costs bandwidth. 0.35 puts
    # ResNet-50 at batch 32 near 50 images/s, the K80 figure of TensorFlow's published benchmarks
    # (tf_cnn_benchmarks 2017, synthetic data, batch 32: 49.5 images/s per die).
    GpuSpec("K80", 8.73e12 / 2, 8.73e12 / 2, 480e9 / 2, "Tesla K80, one GK210 die (half a board)",
            compute_efficiency=0.35, memory_efficiency=0.7),
    # Tesla P100 (SXM2/NVLink) datasheet: 10.6 TFLOPS fp32, 21.2 TFLOPS fp16, 732 GB/s HBM2.
    GpuSpec("P100", 10.6e12, 21.2e12, 732e9, "Tesla P100 SXM2"),
    # Tesla V100 (SXM2) datasheet: 15.7 TFLOPS fp32, 125 TFLOPS tensor, 900 GB/s HBM2.
    # (The PCIe card: 14 / 112 TFLOPS, 900 GB/s. The MG-WFBP journal does not say which.)
    GpuSpec("V100", 15.7e12, 125e12, 900e9, "Tesla V100 SXM2"),
    # A100 (SXM4 80GB) datasheet: 19.5 TFLOPS fp32, 312 TFLOPS fp16 tensor, 2,039 GB/s HBM2e.
    # (fp32 here is the CUDA-core rate; PyTorch may run fp32 convolutions as TF32, 156 TFLOPS.)
    GpuSpec("A100", 19.5e12, 312e12, 2039e9, "A100 SXM4 80GB"),
    # H100 (SXM5) datasheet: 67 TFLOPS fp32, 989 TFLOPS fp16 tensor (1,979 with sparsity), 3.35 TB/s.
    GpuSpec("H100", 67e12, 989e12, 3.35e12, "H100 SXM5"),
    # P102-100, the OMGS-SGD paper's GPU: a GP102 crypto-mining board (no display outputs, PCIe x4)
    # for which NVIDIA publishes no datasheet. Numbers from the TechPowerUp GPU Database entry as
    # reproduced at https://sysrqmts.com/gpus/compare/nvidia-jetson-tk1-gpu-vs-nvidia-p102-100 and
    # https://llmperf.net/categories/gpu/Nvidia-P102-100-GPUs: 3,200 CUDA cores (25 SMs), boost
    # 1,683 MHz, so 2 * 3200 * 1.683e9 = 10.77 TFLOPS fp32; 5 GB GDDR5X on a 320-bit bus at 11 Gbps,
    # 440.3 GB/s. ESTIMATE twice over: the peaks are third-party, and the efficiencies are the module
    # defaults of the datasheet GPUs (no P102-100 training benchmark to tune them against). Pascal
    # GP102 computes fp16 at 1/64 of the fp32 rate; cuDNN then runs fp16 layers with fp32 arithmetic,
    # so fp16 is given the fp32 rate (as for the K80).
    GpuSpec("P102", 2 * 3200 * 1.683e9, 2 * 3200 * 1.683e9, 440.3e9,
            "P102-100 (GP102 mining board, 3200 cores, 5 GB GDDR5X; third-party specs)"),
]}

_GPU_ALIASES = {"p102-100": "p102"}  # full product names of table entries, lower case

DTYPES = {"float32": torch.float32, "float16": torch.float16}

#: ASSUMPTION: fraction of peak FLOP/s that cuDNN/cuBLAS convolutions and matmuls reach in training
#: (large fp32 GEMMs and convolutions reach 80-90% of peak on V100-class GPUs, small and 1x1 ones
#: less). With it the V100 fp32 ResNet-50 estimate at batch 32 is ~360 images/s for forward +
#: backward, next to the 367 images/s NVIDIA publishes for whole training iterations of ResNet-50
#: v1.5 in PyTorch on a V100 16GB (DeepLearningExamples, FP32, 1 GPU).
COMPUTE_EFFICIENCY = 0.8
#: ASSUMPTION: fraction of peak memory bandwidth that elementwise/normalisation kernels reach
#: (STREAM-like kernels reach 80-90% of the HBM2 datasheet bandwidth).
MEMORY_EFFICIENCY = 0.85
#: ASSUMPTION: fixed cost per kernel (launch and tail), seconds, added to every non-view operator.
KERNEL_OVERHEAD_S = 5e-6

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
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


class _RooflineMode(TorchDispatchMode):
    """Charges every ATen operator its roofline time on a virtual clock."""

    def __init__(self, gpu: GpuSpec, dtype: str, compute_efficiency: float,
                 memory_efficiency: float, kernel_overhead_s: float) -> None:
        super().__init__()
        peak = gpu.fp32_flops if dtype == "float32" else gpu.fp16_flops
        self.flop_rate = peak * compute_efficiency
        self.byte_rate = gpu.memory_bandwidth * memory_efficiency
        self.overhead = kernel_overhead_s
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
        self.now += max(flops / self.flop_rate, nbytes / self.byte_rate) + self.overhead
        self.flops += flops
        self.bytes += nbytes
        self.kernels += 1
        return out


class _VirtualClock:
    """Profiler clock whose markers are (seconds, FLOPs, bytes) so far on the roofline mode."""

    def __init__(self, mode: _RooflineMode) -> None:
        self.mode = mode

    def stamp(self) -> tuple[float, int, int]:
        return self.mode.stamp()

    def sync(self) -> None:
        pass

    def elapsed(self, a: tuple[float, int, int], b: tuple[float, int, int]) -> float:
        return b[0] - a[0]


def _component(k: int) -> Callable[[Any, Any], float]:
    return lambda a, b: float(b[k] - a[k])


def _meta_batch(model_name: str, batch_size: int, dtype: torch.dtype, model_kwargs: dict) -> tuple:
    inputs, targets = make_batch(model_name, batch_size, device="meta", **model_kwargs)

    def cast(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    if isinstance(inputs, dict):
        return {k: cast(v) for k, v in inputs.items()}, targets
    return cast(inputs), targets


def estimate_trace(model_name: str, batch_size: int, gpu: str | GpuSpec = "V100", view: str = "module",
                   dtype: str = "float32", *, forward_from_backward: float | None = None,
                   compute_efficiency: float | None = None,
                   memory_efficiency: float | None = None,
                   kernel_overhead_s: float = KERNEL_OVERHEAD_S, **model_kwargs: Any) -> Trace:
    """Roofline estimate of ``model_name`` at ``batch_size`` on ``gpu``, as a labelled :class:`Trace`.

    ``dtype="float16"`` models pure fp16 training on tensor cores (activations and gradients in
    fp16; gradient bytes are 2 per parameter). ``forward_from_backward=0.5`` replaces each layer's
    forward estimate by half its backward estimate (the MG-WFBP conference paper's convention);
    by default forward times are estimated like backward ones. ``model_kwargs`` go to the model
    registry (e.g. ``seq_len`` for BERT). ``compute_efficiency`` / ``memory_efficiency`` default to
    the GPU's override if it has one, else to :data:`COMPUTE_EFFICIENCY` / :data:`MEMORY_EFFICIENCY`.
    """
    get_spec(model_name)
    spec = get_gpu(gpu)
    if compute_efficiency is None:
        compute_efficiency = spec.compute_efficiency or COMPUTE_EFFICIENCY
    if memory_efficiency is None:
        memory_efficiency = spec.memory_efficiency or MEMORY_EFFICIENCY
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; valid views: {', '.join(VIEWS)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    if not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    for label, v in (("compute_efficiency", compute_efficiency), ("memory_efficiency", memory_efficiency)):
        if not 0 < v <= 1:
            raise ValueError(f"{label} must be in (0, 1], got {v!r}")
    if kernel_overhead_s < 0:
        raise ValueError(f"kernel_overhead_s must not be negative, got {kernel_overhead_s!r}")
    if forward_from_backward is not None and forward_from_backward < 0:
        raise ValueError(f"forward_from_backward must not be negative, got {forward_from_backward!r}")

    torch_dtype = DTYPES[dtype]
    model = build_model(model_name, device="meta", **model_kwargs).to(torch_dtype)
    inputs, targets = _meta_batch(model_name, batch_size, torch_dtype, model_kwargs)
    params = learnable_params(model)
    mode = _RooflineMode(spec, dtype, compute_efficiency, memory_efficiency, kernel_overhead_s)
    recorder = Recorder(model, params, _VirtualClock(mode))
    try:
        with mode:
            raw = recorder.run(lambda: compute_loss(model_name, model, inputs, targets, **model_kwargs))
    finally:
        recorder.close()

    order, fwd, bwd = attribute(resolve(raw, _component(0)), params, view)
    _, fwd_flops, bwd_flops = attribute(resolve(raw, _component(1)), params, view)
    _, fwd_bytes, bwd_bytes = attribute(resolve(raw, _component(2)), params, view)
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
        "peak_flops": spec.fp32_flops if dtype == "float32" else spec.fp16_flops,
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
    """Training FLOPs (multiply-add = 2) by ``torch.utils.flop_counter.FlopCounterMode`` on meta.

    Returns ``{"forward": ..., "backward": ..., "total": ...}``; forward includes the loss, backward
    is the difference between forward+backward and forward.
    """
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
            "kernel_overhead_s": KERNEL_OVERHEAD_S, "gpus": {k: asdict(v) for k, v in GPU_SPECS.items()}}


def layer_errors(measured: Trace, estimated: Trace) -> list[dict[str, Any]]:
    """How far ``estimated`` is from ``measured``, layer by layer (in ``measured``'s order).

    Per layer: ``measured_s`` and ``estimated_s``, its forward + backward seconds in each trace, and
    ``rel_error = estimated_s / measured_s - 1`` (a fraction; None where the measured time is 0).
    Layers are matched by name, so both traces must be of the same model at the same batch size with
    the same layer names (the same view); otherwise ValueError, naming what differs."""
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
    """Summary of :func:`layer_errors`' rows: ``layers``; ``compared`` (layers with a measured time);
    ``median_abs_rel_error`` (median over those of ``|rel_error|``, a fraction; None if none);
    ``measured_total_s`` and ``estimated_total_s`` (sums over every layer, seconds); ``total_ratio``
    (estimated / measured total; None if the measured total is 0)."""
    errors = [abs(r["rel_error"]) for r in rows if r["rel_error"] is not None]
    measured = float(sum(r["measured_s"] for r in rows))
    estimated = float(sum(r["estimated_s"] for r in rows))
    return {"layers": len(rows), "compared": len(errors),
            "median_abs_rel_error": statistics.median(errors) if errors else None,
            "measured_total_s": measured, "estimated_total_s": estimated,
            "total_ratio": estimated / measured if measured > 0 else None}
