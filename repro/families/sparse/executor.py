"""Run a ``sparse`` Plan: top-k sparsified gradients with error feedback (OMGS-SGD, TopK-SGD). Buckets
are compressed in plan order on the calling thread and all-gathered; ``after_backward`` sums the ``P``
contributions in worker order (:func:`deterministic_index_add_`), so every worker applies the same
average bit for bit. See docs/design/families.md.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Plan, PlanError
from repro.families.allreduce.executor import BucketTiming
from repro.runtime.buffers import broadcast_buffers
from repro.runtime.clock import CollectiveEnds, clock_for, model_device
from repro.runtime.deferred import DeferredUpdateOptimizer
from repro.runtime.executor import Executor, ExecutorOptions, FoundInfReport, ScaledStep, check_scaled_step
from repro.families.sparse.planners import _check_density
from repro.families.sparse.topk import topk_indices
from repro.families.sparse.simulate import INDEX_BYTES, TOPK_SCOPES, topk_count, value_bytes
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["deterministic_index_add_", "Compressor", "TopKCompressor", "Memory", "ResidualMemory",
           "AllGatherCommunicator", "Exchange", "SparseBucketTiming", "SparseExecutor",
           "SparseScaledOptimizer", "calibrate", "budget_counts", "allocate_budget", "TOPK_SCOPES"]

INDEX_DTYPE = torch.int32  # indices on the wire (INDEX_BYTES bytes each)
assert torch.tensor([], dtype=INDEX_DTYPE).element_size() == INDEX_BYTES

# the single-tensor all-gather under its current name (older torch: all_gather_into_tensor)
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def deterministic_index_add_(out: torch.Tensor, indices: torch.Tensor, values: torch.Tensor,
                             blocks: int | None = None) -> torch.Tensor:
    """``out[indices[i]] += values[i]`` in place, each element's additions in the order its pairs are given,
    on every device (CUDA's ``index_add_`` adds repeated indices in any order; the CPU's result is the same
    bit for bit). ``blocks=B``: the pairs are ``B`` equal runs with distinct indices each (one
    ``index_add_`` per run, no extra cost); None: any pairs (two stable sorts and a host sync)."""
    if indices.dim() != 1 or values.dim() != 1 or indices.numel() != values.numel():
        raise ValueError("deterministic_index_add_ takes 1-D indices and values of one length")
    n = indices.numel()
    if n == 0:
        return out
    if blocks is not None:
        if blocks < 1 or n % blocks:
            raise ValueError(f"{n} pairs do not split into {blocks} equal blocks")
        for idx, vals in zip(indices.view(blocks, -1), values.view(blocks, -1)):
            out.index_add_(0, idx, vals)
        return out
    sorted_idx, perm = torch.sort(indices.long(), stable=True)
    _, counts = torch.unique_consecutive(sorted_idx, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    occurrence = torch.arange(n, device=sorted_idx.device) - torch.repeat_interleave(starts, counts, output_size=n)
    rounds, order = torch.sort(occurrence, stable=True)  # round j: the j-th pair of every index
    sizes = torch.unique_consecutive(rounds, return_counts=True)[1].tolist()
    perm = perm[order]
    for idx, pos in zip(sorted_idx[order].split(sizes), perm.split(sizes)):
        out.index_add_(0, idx, values[pos])
    return out


class Compressor(ABC):
    """Flat gradient -> ``(values, indices)`` (indices int32, 1-D, each at most once) and back."""

    @abstractmethod
    def count(self, numel: int) -> int:
        """How many entries :meth:`compress` keeps of a tensor of ``numel`` elements."""

    @abstractmethod
    def compress(self, flat: torch.Tensor, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, indices)`` of the entries sent, ``values[i] == flat[indices[i]]``: ``k`` of them
        (``1 <= k <= flat.numel()``; None: :meth:`count` of the tensor's size)."""

    @staticmethod
    def decompress(values: torch.Tensor, indices: torch.Tensor, out: torch.Tensor,
                   blocks: int | None = None) -> torch.Tensor:
        """Add ``values`` at ``indices`` into the flat tensor ``out`` in place and return it
        (:func:`deterministic_index_add_`; ``blocks``: that many :meth:`compress` outputs in a row)."""
        return deterministic_index_add_(out, indices, values, blocks)


class TopKCompressor(Compressor):
    """Keep the ``k`` entries of largest magnitude; by default ``k = ceil(density * n)`` (at least one)."""

    def __init__(self, density: float) -> None:
        self.density = _check_density(density)

    def count(self, numel: int) -> int:
        return int(topk_count(int(numel), self.density))

    def compress(self, flat: torch.Tensor, k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if flat.dim() != 1:
            raise ValueError(f"compress takes a flat (1-D) tensor, got shape {tuple(flat.shape)}")
        n = flat.numel()
        if n >= 2**31:
            raise ValueError(f"a bucket of {n} elements does not fit int32 indices; split it")
        k = self.count(n) if k is None else int(k)
        if not 1 <= k <= n:
            raise ValueError(f"k must be in 1..{n} for a bucket of {n} elements, got {k}")
        if k == n:  # density 1 (or a tiny tensor): everything, no selection
            return flat.clone(), torch.arange(n, dtype=INDEX_DTYPE, device=flat.device)
        indices = topk_indices(flat.abs(), k)
        return flat[indices], indices.to(INDEX_DTYPE)

    def __repr__(self) -> str:
        return f"TopKCompressor(density={self.density})"


class Memory(ABC):
    """What a worker holds back between iterations, per key (a bucket)."""

    @abstractmethod
    def compensate(self, key: Any, flat: torch.Tensor) -> torch.Tensor:
        """The gradient plus what was held back for ``key``; may work in place on ``flat``."""

    @abstractmethod
    def update(self, key: Any, compensated: torch.Tensor, indices: torch.Tensor) -> None:
        """Record that the entries ``indices`` of ``compensated`` were sent."""

    def reset(self) -> None:
        """Forget everything held back."""

    def keep(self, key: Any) -> None:
        """Remember ``key``'s state for :meth:`undo` (a step a GradScaler skips leaves no trace)."""

    def undo(self) -> None:
        """Put back every state :meth:`keep` remembered since the last :meth:`commit`."""

    def commit(self) -> None:
        """Forget what :meth:`keep` remembered: this step's changes stay."""


class ResidualMemory(Memory):
    """Error feedback as in TopK-SGD: ``compensate`` adds the residual (initially zero) in place;
    ``update`` keeps ``compensated`` with the sent entries zeroed."""

    def __init__(self) -> None:
        self.residuals: dict[Any, torch.Tensor] = {}
        self._kept: dict[Any, torch.Tensor | None] = {}

    def compensate(self, key: Any, flat: torch.Tensor) -> torch.Tensor:
        residual = self.residuals.get(key)
        if residual is not None:
            if residual.shape != flat.shape:
                raise ValueError(f"residual of {key!r} has shape {tuple(residual.shape)}, the gradient "
                                 f"{tuple(flat.shape)}")
            flat.add_(residual)
        return flat

    def update(self, key: Any, compensated: torch.Tensor, indices: torch.Tensor) -> None:
        residual = self.residuals.get(key)
        if residual is None or residual.shape != compensated.shape:
            residual = self.residuals[key] = torch.empty_like(compensated)
        residual.copy_(compensated)
        residual.index_fill_(0, indices.long(), 0)

    def reset(self) -> None:
        self.residuals.clear()
        self._kept.clear()

    def keep(self, key: Any) -> None:
        residual = self.residuals.get(key)
        self._kept[key] = None if residual is None else residual.clone()

    def undo(self) -> None:
        for key, residual in self._kept.items():
            if residual is None:
                self.residuals.pop(key, None)
            else:
                self.residuals[key] = residual
        self._kept.clear()

    def commit(self) -> None:
        self._kept.clear()


@dataclass
class Exchange:
    """One bucket's all-gather(s) in flight: ``futures`` complete when the gathered buffers are filled."""

    k: int
    value_dtype: torch.dtype
    packed: bool
    outputs: list[torch.Tensor]
    futures: list[Any]


class AllGatherCommunicator:
    """All-gathers every worker's ``(values, indices)`` of equal ``k`` on ``group``: ``start`` launches two
    all-gathers, or one ``packed`` (values bit-cast next to the indices); ``finish`` waits and returns the
    ``P * k`` gathered values and int32 indices, worker 0's first. ``on_message_end(m, end_s)`` is called
    (from another thread) when message ``m`` ended, timed by ``ends``."""

    def __init__(self, group: dist.ProcessGroup | None = None, ends: CollectiveEnds | None = None) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.ends = ends

    def start(self, values: torch.Tensor, indices: torch.Tensor, packed: bool,
              on_message_end: Callable[[int, float], None] | None = None) -> Exchange:
        if values.shape != indices.shape or values.dim() != 1 or indices.dtype != INDEX_DTYPE:
            raise ValueError("start takes 1-D values and int32 indices of one length")
        k, P = values.numel(), self.world_size
        if packed:
            if values.element_size() == INDEX_BYTES:
                sends = [torch.cat([values.view(INDEX_DTYPE), indices])]
            else:
                sends = [torch.cat([values.view(torch.uint8), indices.view(torch.uint8)])]
        else:
            sends = [values, indices]
        outputs, futures = [], []
        for m, send in enumerate(sends):
            out = torch.empty(P * send.numel(), dtype=send.dtype, device=send.device)
            work = _ALL_GATHER(out, send, group=self.group, async_op=True)
            if on_message_end is not None:  # not a child future of fut.then: on NCCL it carries no CUDA event
                ends = self.ends or CollectiveEnds(device_events=False)
                ends.end(work, lambda end_s, m=m: on_message_end(m, end_s))
            outputs.append(out)
            futures.append(work.get_future())
        return Exchange(k, values.dtype, packed, outputs, futures)

    def finish(self, ex: Exchange) -> tuple[torch.Tensor, torch.Tensor]:
        for fut in ex.futures:
            fut.wait()
        P, k = self.world_size, ex.k
        if not ex.packed:
            return ex.outputs[0], ex.outputs[1]
        out = ex.outputs[0]
        if out.dtype == INDEX_DTYPE:  # int32 words: [values | indices] per worker
            rows = out.view(P, 2, k)
            return rows[:, 0].view(ex.value_dtype).reshape(-1), rows[:, 1].reshape(-1)
        rows = out.view(P, -1)  # raw bytes
        vb = rows.shape[1] - k * INDEX_BYTES
        # fresh copies start at offset 0: a byte slice cannot be reinterpreted at an unaligned offset
        values = rows[:, :vb].clone(memory_format=torch.contiguous_format).view(ex.value_dtype).reshape(-1)
        return values, rows[:, vb:].clone(memory_format=torch.contiguous_format).view(INDEX_DTYPE).reshape(-1)


BUDGET_SAMPLE = 65536  # magnitudes sampled (about) to estimate the model-wide threshold
_BUDGET_MIN_SAMPLE = 1024  # at least this many from each bucket (all of a smaller one)


def budget_counts(compensated: list[torch.Tensor], sent: list[torch.Tensor], total: int,
                  sample: int = BUDGET_SAMPLE) -> torch.Tensor:
    """Per bucket, how many of this worker's entries lie among the ``total`` largest magnitudes of the model
    (int64 tensor on the buckets' device), counted against one threshold estimated from strided samples of
    the sent values and the unsent entries (about ``sample`` of each). ``compensated[b]``: gradient plus
    residual, ``sent[b]``: the values it sent (``sum k_b == total``). Deterministic across devices."""
    if len(compensated) != len(sent) or not compensated:
        raise ValueError("budget_counts takes one compensated tensor and one sent tensor per bucket")
    numel = sum(c.numel() for c in compensated)
    stride = max(1, numel // max(1, int(sample)))
    sent_stride = max(1, sum(v.numel() for v in sent) // max(1, int(sample)))
    points, weights, floors = [], [], []
    for flat, values in zip(compensated, sent):
        if values.numel() == 0:
            raise ValueError("every bucket sends at least one value")
        mag = values.detach().abs().float()
        floor = mag.min()
        drawn_sent = mag[::min(sent_stride, max(1, mag.numel() // _BUDGET_MIN_SAMPLE))]
        drawn = flat.detach()[::min(stride, max(1, flat.numel() // _BUDGET_MIN_SAMPLE))].abs().float()
        below = drawn[drawn < floor]
        points += [drawn_sent, below]
        weights += [torch.full((drawn_sent.numel(),), mag.numel() / drawn_sent.numel(), dtype=torch.float64,
                               device=mag.device),
                    torch.full((below.numel(),), flat.numel() / drawn.numel(), dtype=torch.float64, device=mag.device)]
        floors.append(floor)
    values_all = torch.cat(points)
    order = torch.sort(values_all, descending=True, stable=True).indices
    cum = torch.cumsum(torch.cat(weights)[order], 0)
    at = int(torch.searchsorted(cum, torch.tensor([float(total)], dtype=torch.float64, device=cum.device)).item())
    tau = float(values_all[order[min(at, order.numel() - 1)]])
    # a threshold at or above the bucket's least sent value is counted among the sent values, else over the bucket
    counts = [((values if tau >= floor else flat).detach().abs().float() >= tau).sum()
              for flat, values, floor in zip(compensated, sent, torch.stack(floors).tolist())]
    return torch.stack(counts).to(torch.int64)


def allocate_budget(counts: list[int], sizes: list[int], total: int) -> list[int]:
    """Split ``total`` entries between buckets of ``sizes`` elements in proportion to ``counts``: each
    bucket gets at least 1 and at most its size, the rest by largest remainder (ties to the lower
    index), a bucket filled to its size handing its excess to the others; what no counted bucket can
    take goes to the others in index order. Integer and order-exact, so every rank given the same
    counts gets the same split. Needs ``len(sizes) <= total <= sum(sizes)``."""
    B = len(sizes)
    if len(counts) != B or not B <= total <= sum(sizes) or min(sizes) < 1:
        raise ValueError(f"cannot split {total} entries between {B} buckets of {sum(sizes)} elements")
    k = [1] * B
    left = total - B
    weight = [max(0, int(c)) for c in counts]
    open_ = [b for b in range(B) if weight[b] > 0 and k[b] < sizes[b]]
    while left > 0 and open_:
        wsum = sum(weight[b] for b in open_)
        share = {b: left * weight[b] / wsum for b in open_}
        full = [b for b in open_ if k[b] + share[b] >= sizes[b]]
        if full:
            for b in full:
                left -= sizes[b] - k[b]
                k[b] = sizes[b]
            open_ = [b for b in open_ if b not in full]
            continue
        whole = {b: min(int(share[b]), sizes[b] - k[b]) for b in open_}
        for b in open_:
            k[b] += whole[b]
        left -= sum(whole.values())
        for b in sorted(open_, key=lambda b: (whole[b] - share[b], b)):
            if left > 0 and k[b] < sizes[b]:
                k[b] += 1
                left -= 1
        open_ = [b for b in open_ if k[b] < sizes[b]]
    for b in range(B):
        if left <= 0:
            break
        extra = min(left, sizes[b] - k[b])
        k[b] += extra
        left -= extra
    return k


@dataclass
class SparseBucketTiming(BucketTiming):
    """One bucket of the last iteration: ``bytes`` each worker sends (values + indices), ``numel``,
    ``k``, ``messages`` all-gathers, and the compression's start and end (``perf_counter`` seconds)."""

    numel: int = 0
    k: int = 0
    messages: int = 0
    compress_start_s: float = float("nan")
    compress_end_s: float = float("nan")


@dataclass
class _Slot:
    bucket: int
    param: nn.Parameter
    layer: str
    view: torch.Tensor
    written: bool = False


@dataclass
class _Bucket:
    layers: tuple[str, ...]
    buffer: torch.Tensor
    packed: bool
    slots: list[_Slot] = field(default_factory=list)
    pending: int = 0
    exchange: Exchange | None = None
    k: int = 1                                # entries this bucket sends this step
    compensated: torch.Tensor | None = None   # topk_scope "model": this step's gradient + residual ...
    sent: torch.Tensor | None = None          # ... and the values sent, until after_backward counts them


class SparseExecutor(Executor):
    """The sparse family's executor; ``compressor`` and ``memory`` default to :class:`TopKCompressor` at the
    plan's density and :class:`ResidualMemory`.

    The plan's ``topk_scope``: ``"bucket"`` sends ``ceil(density * n_b)`` per bucket; ``"model"`` the same
    total, split each step by where the model's largest magnitudes were the step before
    (:func:`budget_counts`, one int64 all-reduce after the all-gathers, :func:`allocate_budget`; the first
    step and a skipped step keep the split)."""

    finishes_in_backward = True  # the exchange is waited for after backward anyway (Executor)

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None, *,
                 group: dist.ProcessGroup | None = None, compressor: Compressor | None = None,
                 memory: Memory | None = None) -> None:
        super().__init__(model, plan, options)
        if plan is None:
            raise PlanError("the sparse executor needs a plan")
        if plan.family != "sparse":
            raise PlanError(f"SparseExecutor executes 'sparse' plans, got a '{plan.family}' plan "
                            f"(solver '{plan.solver}')")
        check_plan_fits(plan, model, self.options.view)
        layers = layer_parameters(model, self.options.view)
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: start ranks with repro.launch.local")
        self.compressor = compressor or TopKCompressor(plan.option("density"))
        self.topk_scope = plan.option("topk_scope", "bucket")
        self.memory = memory if memory is not None else ResidualMemory()
        self.record_timeline = self.options.record_timeline
        # the timeline's stamps: device times on NCCL (its futures complete at enqueue), host times on gloo
        self._ends = CollectiveEnds(model_device(model), dist.get_backend(group)) if self.record_timeline else None
        self.comm = AllGatherCommunicator(group, self._ends)
        self.world_size = self.comm.world_size
        self._buckets: list[_Bucket] = []
        self._slots: list[_Slot] = []
        for i, b in enumerate(plan.buckets):
            members = [(name, p) for name in b.layers for _, p in layers[name]]
            numel = sum(p.numel() for _, p in members)
            first = members[0][1]
            bucket = _Bucket(tuple(b.layers), torch.zeros(numel, dtype=first.dtype, device=first.device),
                             packed=len(b.messages) == 1)
            views = bucket.buffer.split([p.numel() for _, p in members])
            bucket.slots = [_Slot(i, p, name, v) for (name, p), v in zip(members, views)]
            self._slots += bucket.slots
            bucket.pending = len(bucket.slots)
            bucket.k = self.compressor.count(numel)
            self._buckets.append(bucket)
        self._budget = sum(b.k for b in self._buckets)  # K: entries each rank sends per step
        # topk_scope "model" moves entries between buckets: only where there are several and not all are sent
        self._shared_budget = (self.topk_scope == "model" and len(self._buckets) > 1
                               and self._budget < sum(b.buffer.numel() for b in self._buckets))
        self._counts: tuple[torch.Tensor, Any] | None = None  # the all-reduce of this step's counts in flight
        self._keep_split = False  # a skipped step: its counts are waited for, then dropped
        self._next = 0
        self._scaler: Any = None          # the GradScaler (wrap_optimizer), None without one
        self._report: FoundInfReport | None = None
        self._optimizer: Any = None
        self._scale: torch.Tensor | None = None      # this backward's scale S and 1/S (tensors: no sync)
        self._inv_scale: torch.Tensor | None = None
        self._nonfinite: torch.Tensor | None = None  # inf/nan seen in this backward's buckets (0-d bool)
        self._synchronized = False
        self.timings = [SparseBucketTiming(i, b.layers, b.k * (b.buffer.element_size() + INDEX_BYTES),
                                           numel=b.buffer.numel(), k=b.k, messages=1 if b.packed else 2)
                        for i, b in enumerate(self._buckets)]
        self.clock = clock_for(model, self.options.clock)
        self.grad_ready_s = self.clock.ready  # layer -> ready time, resolved when read
        self._handles = [s.param.register_post_accumulate_grad_hook(self._hook(s)) for s in self._slots]

    def _hook(self, slot: _Slot):
        def hook(param: torch.Tensor) -> None:
            self.clock.mark(slot.layer)
            self._write(slot)
            self._launch_ready()
        return hook

    def _write(self, slot: _Slot) -> None:
        if slot.written:
            raise RuntimeError(f"gradient of a parameter in layer '{slot.layer}' arrived twice in one "
                               "iteration; call after_backward() between backward passes")
        grad = slot.param.grad
        if grad is None:
            slot.view.zero_()
        elif grad.data_ptr() != slot.view.data_ptr():
            slot.view.copy_(grad.reshape(-1))
        slot.written = True
        self._buckets[slot.bucket].pending -= 1

    def _launch_ready(self) -> None:
        if self._counts is not None:  # the last step's counts: this step's split (topk_scope "model")
            self._settle_split()
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            i, bucket = self._next, self._buckets[self._next]
            if self._shared_budget:  # what this step sends (the split moves from step to step)
                self.timings[i].k = bucket.k
                self.timings[i].bytes = bucket.k * (bucket.buffer.element_size() + INDEX_BYTES)
            timing = self.timings[i] if self.record_timeline else None
            if timing is not None:
                timing.end_s = float("nan")
                self._ends.launch(lambda t, timing=timing: setattr(timing, "compress_start_s", t))
            flat = bucket.buffer
            if self._scaler is not None:
                self._unscale(flat)
                self.memory.keep(i)
            flat = self.memory.compensate(i, flat)
            values, indices = self.compressor.compress(flat, bucket.k)
            self.memory.update(i, flat, indices)
            if self._shared_budget:
                bucket.compensated, bucket.sent = flat, values
            if timing is not None:
                self._ends.launch(lambda t, timing=timing: _stamp_launch(timing, t))
            on_end = None if timing is None else (lambda _m, end_s, t=timing: _stamp_end(t, end_s))
            bucket.exchange = self.comm.start(values, indices, bucket.packed, on_end)
            self._next += 1

    def _settle_split(self) -> None:
        """Wait for the counts' all-reduce in flight and make the next step's ``k_b`` from them
        (unless the step they came from was skipped)."""
        counts, work = self._counts
        self._counts = None
        work.wait()
        if self._keep_split or not bool(counts.any()):  # a skipped step, or nothing counted (all zero)
            self._keep_split = False
            return
        self._set_split(allocate_budget(counts.tolist(), [b.buffer.numel() for b in self._buckets], self._budget))

    def _set_split(self, ks: list[int]) -> None:
        for b, k in zip(self._buckets, ks):
            b.k = int(k)

    @property
    def split(self) -> list[int]:
        """The entries each bucket sends in the next step (``k_b``, plan order), the counts in flight
        included."""
        if self._counts is not None:
            self._settle_split()
        return [b.k for b in self._buckets]

    def _unscale(self, flat: torch.Tensor) -> None:
        """Bring a bucket the scaler scaled back to the gradient's units (see the module docstring), and
        note whether it holds an inf/nan."""
        if self._inv_scale is None:
            scale = getattr(self._scaler, "_scale", None)  # what scaler.scale(loss) multiplied by (a tensor)
            if scale is None:  # the scaler has not scaled anything yet: the gradients are as computed
                scale = torch.ones((), dtype=torch.float32, device=flat.device)
            self._scale = scale.to(flat.device)
            self._inv_scale = self._scale.double().reciprocal().float()  # as GradScaler.unscale_ computes it
            self._nonfinite = torch.zeros((), dtype=torch.bool, device=flat.device)
        self._nonfinite |= ~torch.isfinite(flat).all()
        flat.mul_(self._inv_scale.to(flat.dtype))

    def wrap_optimizer(self, optimizer: Any, grad_scaler: Any = None) -> Any:
        """The optimizer itself; with an enabled ``grad_scaler`` a :class:`SparseScaledOptimizer` whose
        ``step`` takes the scaler's verdict over every rank."""
        self._optimizer = optimizer
        if grad_scaler is None or not grad_scaler.is_enabled():
            return optimizer
        self._scaler = grad_scaler
        self._report = FoundInfReport(grad_scaler, self._buckets[0].buffer.device)
        return SparseScaledOptimizer(self, optimizer)

    def synchronize(self) -> None:
        """The exchange is finished (``after_backward`` ran): ``param.grad`` is the scaled average,
        ready for ``scaler.unscale_``."""
        self._synchronized = True

    def step(self, amp: ScaledStep | None = None) -> None:
        """The optimizer's step under a GradScaler (``amp``), called on every rank (one all-reduce):
        skipped everywhere if any rank saw an inf/nan (residuals put back), else the unscaled average."""
        if amp is None:  # optimizer.step() without scaler.step: the gradients are this step's, unscaled
            self.memory.commit()
            if self._scale is not None:
                self._grads_mul(self._inv_scale)
            self._optimizer.step()
            self._end_step()
            return
        if self._report is None:
            check_scaled_step(amp, None, "the sparse family")  # a scaler it was not given: refused, one line
        if amp.inv_scale is None and not self._synchronized:
            raise RuntimeError("the sparse family: scaler.unscale_(opt) was called before the exchange finished; "
                               "call opt.synchronize() first (or leave the unscaling to scaler.step(opt))")
        device = self._buckets[0].buffer.device
        seen = amp.found_inf_tensor(device)  # unread: the all-reduced flag is the step's one read
        if self._nonfinite is not None:
            seen += self._nonfinite.float()
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=self.comm.group)  # after every all-gather
        found = bool(seen.item() > 0)
        self._report.report(found)
        if found:
            self.memory.undo()
            self._keep_split = self._counts is not None  # the skipped step's counts are not used
        else:
            self.memory.commit()
            if amp.inv_scale is not None:
                self._grads_mul(amp.inv_scale)
            self._optimizer.step()
        self._end_step()

    def _grads_mul(self, factor: torch.Tensor) -> None:
        with torch.no_grad():
            for g in {id(s.param.grad): s.param.grad for s in self._slots if s.param.grad is not None}.values():
                g.mul_(factor.to(g.device, g.dtype))

    def _end_step(self) -> None:
        self._scale = self._inv_scale = self._nonfinite = None
        self._synchronized = False

    def before_forward(self) -> None:
        if self.sync_buffers:
            broadcast_buffers(self.model)

    def after_backward(self) -> None:
        """Wait for every bucket, average the P sparse contributions into ``param.grad``."""
        for slot in self._slots:  # parameters that got no gradient this iteration count as zeros
            if not slot.written:
                self._write(slot)
        self._launch_ready()
        if self._shared_budget:  # counted while the all-gathers are in flight (the buffers are read only)
            counts = budget_counts([b.compensated for b in self._buckets], [b.sent for b in self._buckets],
                                   self._budget)
            work = dist.all_reduce(counts, group=self.comm.group, async_op=True)
            self._counts = (counts, work)
            for b in self._buckets:
                b.compensated = b.sent = None
        for bucket in self._buckets:
            values, indices = self.comm.finish(bucket.exchange)
            dense = bucket.buffer.zero_()
            self.compressor.decompress(values, indices, dense, blocks=self.world_size)
            dense.div_(self.world_size)
            if self._scale is not None:  # scaled again, as DDP's exchanged gradients are (exact: S = 2**n)
                dense.mul_(self._scale.to(dense.dtype))
            for slot in bucket.slots:
                avg = slot.view.view_as(slot.param)  # a view of the bucket (no copy) ...
                slot.param.grad = avg if avg.dtype == slot.param.dtype else avg.to(slot.param.dtype)  # ... or cast
                slot.written = False
            bucket.pending = len(bucket.slots)
            bucket.exchange = None
        self._next = 0
        self.clock.end_iteration()  # a layer with no gradient in the next backward gets no time

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the same gradients: the residuals by bucket index (of a
        :class:`ResidualMemory`) and, under ``topk_scope`` "model", the next step's split."""
        state: dict[str, Any] = {}
        if self._shared_budget:
            state["split"] = self.split
        residuals = getattr(self.memory, "residuals", None)
        if residuals:
            state["residuals"] = {int(k): v.detach().clone() for k, v in residuals.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        split = state.get("split")
        if split is not None:
            sizes = [b.buffer.numel() for b in self._buckets]
            if (not self._shared_budget or len(split) != len(sizes) or sum(split) != self._budget
                    or any(not 1 <= int(k) <= n for k, n in zip(split, sizes))):
                raise ValueError(f"checkpoint split {list(split)[:8]}... does not fit this plan's {len(sizes)} buckets "
                                 f"sending {self._budget} entries (topk_scope {self.topk_scope!r})")
            if self._counts is not None:
                self._settle_split()
            self._set_split([int(k) for k in split])
        residuals = getattr(self.memory, "residuals", None)
        if residuals is None:
            if state.get("residuals"):
                raise ValueError("this executor's memory keeps no residuals, but the checkpoint holds some")
            return
        residuals.clear()
        for k, v in (state.get("residuals") or {}).items():
            if not 0 <= int(k) < len(self._buckets):
                raise ValueError(f"checkpoint residual of bucket {k}: the plan has {len(self._buckets)} buckets")
            residuals[int(k)] = v.to(self._buckets[int(k)].buffer.device).clone()

    def remove(self) -> None:
        if self._counts is not None:  # no collective left behind
            self._settle_split()
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._ends is not None:
            self._ends.close()

    def settle_timings(self) -> None:
        """Wait until the last iteration's timeline stamps have arrived (:class:`CollectiveEnds`)."""
        if self._ends is not None:
            self._ends.settle()


class SparseScaledOptimizer(DeferredUpdateOptimizer):
    """What the loop steps under a GradScaler: ``step()`` is :meth:`SparseExecutor.step` (``scaler.step``
    always calls it, so every rank joins the verdict); the rest is the wrapped optimizer's."""

    family = "the sparse family"

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()


def _stamp_launch(timing: SparseBucketTiming, t: float) -> None:
    timing.compress_end_s = timing.launch_s = t


def _stamp_end(timing: SparseBucketTiming, end_s: float) -> None:
    """A message of the bucket ended at ``end_s``: the bucket's end is its last message's."""
    if math.isnan(timing.end_s) or end_s > timing.end_s:
        timing.end_s = end_s


def _geometric(lo: float, hi: float, count: int) -> list[int]:
    import numpy as np

    lo, hi = max(1.0, float(lo)), max(1.0, float(hi))
    if hi <= lo:
        return [int(lo)]
    return sorted({int(round(v)) for v in np.geomspace(lo, hi, count)})


def calibrate(trace, device, repeats: int, network_cost=None, *, density: float = 0.001, **_: Any):
    """The cost model the sparse planners need (every rank calls it): the ``sparse_allgather`` line of
    ``network_cost`` (:class:`repro.core.cost.CostModelError` without it), else fitted on the live group over
    the message sizes this model sends; ``topk_gamma_s`` timed on this rank's device up to the whole model
    (at most 2**24 elements), the largest over the ranks."""
    from repro.families.sparse.calibrate import fit_topk
    from repro.runtime.calibrate import fit_cost_model

    density = _check_density(density)
    params = [int(n) for n in trace.params() if n > 0]
    if not params:
        raise ValueError(f"trace '{trace.model}' has no parameters to sparsify")
    total = sum(params)
    if network_cost is not None:
        network_cost.line("sparse_allgather")  # a preset without it fails here, in one line
        cost = network_cost
    else:
        lo_bytes = topk_count(min(params), density) * INDEX_BYTES
        hi_bytes = topk_count(total, density) * (value_bytes(trace) + INDEX_BYTES)
        sizes = sorted({max(4, s // 4 * 4) for s in _geometric(lo_bytes, hi_bytes, 8)})
        cost = fit_cost_model(sizes, ("sparse_allgather",), repeats=repeats, device=device,
                              source=f"sparse all-gather fitted on the live process group (P={dist.get_world_size()})")
    numels = [n for n in _geometric(max(2, min(params)), min(total, 2**24), 6) if n >= 2]
    gamma_s, seconds = fit_topk(numels, density, repeats=repeats, device=device)
    agreed = torch.tensor([gamma_s], dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # the slowest rank decides; every rank plans alike
    meta = {**cost.meta, "topk": {"numel": numels, "seconds_this_rank": seconds, "density": density,
                                  "gamma_s_this_rank": gamma_s, "agreed": "max over ranks"}}
    return replace(cost, meta=meta).with_topk(float(agreed.item()))
