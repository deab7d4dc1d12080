"""Planners of the all-reduce family: bucket contiguous layers, send each bucket by all-reduce.

Each takes a :class:`~repro.core.trace.Trace`, a :class:`~repro.core.cost.CostModel` and the ``wire_dtype``
(None: the trace's dtype; planners solve on the bytes sent), and returns an all-reduce
:class:`~repro.core.plan.Plan` with buckets in backward (communication) order and
``meta["iteration_s"] == simulate(trace, plan, cost).iteration_s``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repro.core.cost import CostModel
from repro.core.plan import Plan, layer_wire_bytes
from repro.core.judge import judged_best
from repro.families.allreduce.simulate import fifo_iteration_s, ready_times_s
from repro.core.trace import Trace

__all__ = ["FAMILY", "wfbp", "syncea", "threshold", "ddp_buckets", "horovod", "mgwfbp", "optimal",
           "groups_time_s"]

FAMILY = "allreduce"


def groups_time_s(trace: Trace, groups: Sequence[Sequence[int]], cost: CostModel,
                  wire_dtype: str | None = None, cycle_s: float | None = None) -> float:
    """Simulated iteration seconds of all-reduce ``groups`` (layer indices, communication order);
    ``cycle_s``: launched only at Horovod's cycle ticks."""
    nbytes = layer_wire_bytes(trace, wire_dtype)
    sizes = np.array([float(nbytes[list(g)].sum()) for g in groups])
    comm = np.atleast_1d(cost.allreduce_s(sizes)).tolist()  # one vectorised call, same float arithmetic
    return fifo_iteration_s(trace.total_forward_s, trace.backward_s(), groups, comm, trace.overheads.total_s,
                            cycle_s)


def _plan(trace: Trace, groups: list[list[int]], cost: CostModel, solver: str, wire_dtype: str | None,
          **meta) -> Plan:
    meta["iteration_s"] = groups_time_s(trace, groups, cost, wire_dtype)
    return Plan.from_groups(trace, groups, solver, meta=meta, options={"wire_dtype": wire_dtype})


def wfbp(trace: Trace, cost: CostModel, *, wire_dtype: str | None = None) -> Plan:
    """Wait-free backpropagation: one all-reduce per layer, started as soon as it is ready."""
    return _plan(trace, [[i] for i in reversed(range(trace.num_layers))], cost, "wfbp", wire_dtype)


def syncea(trace: Trace, cost: CostModel, *, wire_dtype: str | None = None) -> Plan:
    """SyncEASGD: one all-reduce of all gradients after backward."""
    return _plan(trace, [list(range(trace.num_layers))], cost, "syncea", wire_dtype)


def _fuse(trace: Trace, first_cap: float, cap: float, wire_dtype: str | None) -> list[list[int]]:
    """Greedy fusion in backward order: a bucket closes once it holds its cap (wire bytes) or more."""
    nbytes = layer_wire_bytes(trace, wire_dtype)
    groups: list[list[int]] = []
    cur: list[int] = []
    size = 0.0
    for i in reversed(range(trace.num_layers)):
        cur.append(i)
        size += nbytes[i]
        if size >= (first_cap if not groups else cap):
            groups.append(cur)
            cur, size = [], 0.0
    if cur:
        groups.append(cur)
    return groups


def _check_bytes(name: str, value) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer number of bytes, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")


def threshold(trace: Trace, cost: CostModel, threshold_bytes: int = 25 * 2**20, *,
              wire_dtype: str | None = None) -> Plan:
    """Greedy fusion (Horovod/DDP style) in backward order: a bucket closes once it holds
    ``threshold_bytes`` (on the wire) or more; ``threshold_bytes == 0`` reproduces WFBP."""
    _check_bytes("threshold_bytes", threshold_bytes)
    groups = _fuse(trace, threshold_bytes, threshold_bytes, wire_dtype)
    return _plan(trace, groups, cost, "threshold", wire_dtype, threshold_bytes=int(threshold_bytes))


def ddp_buckets(trace: Trace, cost: CostModel, first_bucket_bytes: int = 2**20, bucket_bytes: int = 25 * 2**20,
                *, wire_dtype: str | None = None) -> Plan:
    """PyTorch DDP's default bucketing as a plan: a 1 MiB first bucket, then 25 MiB buckets (the
    scheduler ``ddp`` is PyTorch DDP itself; this plan runs on this package's executor or simulator)."""
    _check_bytes("first_bucket_bytes", first_bucket_bytes)
    _check_bytes("bucket_bytes", bucket_bytes)
    groups = _fuse(trace, first_bucket_bytes, bucket_bytes, wire_dtype)
    return _plan(trace, groups, cost, "ddp_buckets", wire_dtype, first_bucket_bytes=int(first_bucket_bytes),
                 bucket_bytes=int(bucket_bytes))


def horovod(trace: Trace, cost: CostModel, threshold_bytes: int = 64 * 2**20, cycle_s: float = 5e-3, *,
            wire_dtype: str | None = None) -> Plan:
    """Horovod-style tensor fusion: a loop ticking every ``cycle_s`` seconds from the backward start fuses
    the gradients ready since its last tick, in readiness order, into buckets of at most
    ``threshold_bytes`` (a larger gradient travels alone). The plan keeps ``cycle_s`` so the simulator
    releases each bucket at its tick."""
    _check_bytes("threshold_bytes", threshold_bytes)
    if isinstance(cycle_s, bool) or not isinstance(cycle_s, (int, float)) or not np.isfinite(cycle_s) or cycle_s <= 0:
        raise ValueError(f"cycle_s must be a positive number of seconds, got {cycle_s!r}")
    ready = ready_times_s(trace.backward_s())
    nbytes = layer_wire_bytes(trace, wire_dtype)
    tick = np.ceil(ready / cycle_s - 1e-12)
    groups: list[list[int]] = []
    size = 0.0
    for i in reversed(range(trace.num_layers)):
        if groups and tick[groups[-1][0]] == tick[i] and size + nbytes[i] <= threshold_bytes:
            groups[-1].append(i)
            size += float(nbytes[i])
        else:
            groups.append([i])
            size = float(nbytes[i])
    t = groups_time_s(trace, groups, cost, wire_dtype, cycle_s)
    return Plan.from_groups(trace, groups, "horovod", options={"wire_dtype": wire_dtype, "cycle_s": float(cycle_s)},
                            meta={"iteration_s": t, "threshold_bytes": int(threshold_bytes)})


def mgwfbp(trace: Trace, cost: CostModel, *, wire_dtype: str | None = None) -> Plan:
    """The published MG-WFBP merge rule: walking from the output side, merge layer l into l-1 iff
    ``ready(l-1) - tau_c(l) < a`` (``tau_c``: earliest start of the open bucket's all-reduce, ``a``: the
    all-reduce start-up seconds)."""
    a = cost.startup_s
    ready = ready_times_s(trace.backward_s())
    nbytes = layer_wire_bytes(trace, wire_dtype)
    L = trace.num_layers
    groups: list[list[int]] = []
    cur = [L - 1]
    cur_bytes = float(nbytes[L - 1])
    prev_end = 0.0  # end of the previous bucket's all-reduce, from backward start
    for l in range(L - 1, 0, -1):
        tau_c = max(prev_end, float(ready[l]))
        if float(ready[l - 1]) - tau_c < a:
            cur.append(l - 1)
            cur_bytes += float(nbytes[l - 1])
        else:
            prev_end = tau_c + float(cost.allreduce_s(cur_bytes))
            groups.append(cur)
            cur, cur_bytes = [l - 1], float(nbytes[l - 1])
    groups.append(cur)
    return _plan(trace, groups, cost, "mgwfbp", wire_dtype, startup_s=a)


def optimal(trace: Trace, cost: CostModel, *, wire_dtype: str | None = None) -> Plan:
    """Exact minimum iteration time over contiguous groupings (an O(L^2) dynamic program on
    ``E[i] = min_j max(E[j+1], ready(i)) + T(bytes(i..j))``), exact under the contention-free model.

    Under a realism with contention the DP's plan and the heuristics' plans are simulated and the fastest
    is returned (:func:`repro.core.judge.judged_best`: ``meta["plan_from"]``, ``meta["iteration_s"]``,
    ``meta["exact_plan_iteration_s"]``)."""
    ready = ready_times_s(trace.backward_s())
    L = trace.num_layers
    cum = np.concatenate([[0.0], np.cumsum(layer_wire_bytes(trace, wire_dtype))])
    E = np.zeros(L + 1)
    choice = np.zeros(L, dtype=np.int64)
    for i in range(L - 1, -1, -1):
        sizes = cum[i + 1:] - cum[i]                   # bucket i..j for j = i..L-1
        finish = np.maximum(E[i + 1:], ready[i]) + cost.allreduce_s(sizes)
        k = int(np.argmin(finish))
        E[i] = finish[k]
        choice[i] = i + k
    groups: list[list[int]] = []
    i = 0
    while i < L:  # reconstruct from the input side, then reverse into communication order
        j = int(choice[i])
        groups.append(list(range(j, i - 1, -1)))
        i = j + 1
    groups.reverse()
    own = _plan(trace, groups, cost, "optimal", wire_dtype)
    rivals = [(name, lambda fn=fn: fn(trace, cost, wire_dtype=wire_dtype))
              for name, fn in (("mgwfbp", mgwfbp), ("wfbp", wfbp), ("syncea", syncea), ("threshold", threshold),
                               ("ddp_buckets", ddp_buckets), ("horovod", horovod))]
    return judged_best(trace, cost, own, rivals, None, "optimal")
