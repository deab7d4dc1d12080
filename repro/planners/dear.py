"""Planners of the DeAR family (``../shared/papers/dear.md``): contiguous buckets in forward order.

Every plan's buckets are runs of consecutive layers, input side first; each sends a backward
reduce-scatter and a next-forward all-gather (:mod:`repro.sim.dear`). ``meta["iteration_s"]`` is the
plan's steady-state period under the model, equal to ``simulate(trace, plan, cost).iteration_s``.

- :func:`dear_nofusion`: one layer per bucket ("DeAR without tensor fusion");
- :func:`dear_threshold`: the released code's fixed-threshold fusion (25 MB by default);
- :func:`dear_model`: beyond the paper, the threshold the simulator predicts best, exact over every
  bucketing the threshold rule can produce (:func:`threshold_sweep` enumerates them all), i.e. over
  the very search space the Bayesian-optimisation tuner explores with live measurements.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from repro.cost import CostModel
from repro.plan import Bucket, Message, Plan
from repro.sim.dear import bucket_update_s, dear_period_s
from repro.trace import Trace

__all__ = ["FAMILY", "DEAR_MESSAGES", "DEFAULT_THRESHOLD_BYTES", "dear_plan", "threshold_groups",
           "threshold_sweep", "groups_period_s", "dear_nofusion", "dear_threshold", "dear_model"]

FAMILY = "dear"
DEAR_MESSAGES = (Message("reduce_scatter", "backward"), Message("allgather", "next_forward"))
DEFAULT_THRESHOLD_BYTES = 25 * 2**20


def _layer_bytes(trace: Trace) -> np.ndarray:
    return np.rint(trace.bytes()).astype(np.int64)


def threshold_groups(nbytes: Sequence[int], threshold_bytes: int) -> list[list[int]]:
    """The released code's rule, in forward order: a bucket closes when adding the next layer would
    make it reach ``threshold_bytes`` (so a bucket stays below the threshold unless it is one layer
    that alone reaches it); ``threshold_bytes = 0`` gives one layer per bucket."""
    groups: list[list[int]] = [[0]]
    size = int(nbytes[0])
    for i in range(1, len(nbytes)):
        if size + int(nbytes[i]) >= threshold_bytes:
            groups.append([i])
            size = int(nbytes[i])
        else:
            groups[-1].append(i)
            size += int(nbytes[i])
    return groups


def threshold_sweep(trace: Trace, min_threshold_bytes: int = 0,
                    max_threshold_bytes: int | None = None) -> Iterator[tuple[int, list[list[int]]]]:
    """Every distinct bucketing :func:`threshold_groups` makes for thresholds in
    ``[min_threshold_bytes, max_threshold_bytes]``, with the smallest threshold giving it.

    The bucketing only changes when the threshold passes ``bytes(bucket k) + bytes(next layer)`` for
    some bucket k (then bucket k absorbs that layer); so from each bucketing the next one starts at
    ``min_k (bytes(bucket k) + bytes(first layer of bucket k+1)) + 1`` bytes. No bucketing is missed
    and none is repeated.
    """
    nbytes = _layer_bytes(trace)
    t = int(min_threshold_bytes)
    top = int(nbytes.sum()) + 1 if max_threshold_bytes is None else int(max_threshold_bytes)
    while t <= top:
        groups = threshold_groups(nbytes, t)
        yield t, groups
        if len(groups) == 1:
            return
        sizes = [int(nbytes[g].sum()) for g in groups]
        t = min(sizes[k] + int(nbytes[groups[k + 1][0]]) for k in range(len(groups) - 1)) + 1


def groups_period_s(trace: Trace, groups: Sequence[Sequence[int]], cost: CostModel) -> float:
    """The model's steady-state period of DeAR buckets ``groups`` (forward order)."""
    nbytes = trace.bytes()
    sizes = np.array([float(nbytes[list(g)].sum()) for g in groups])
    rs = np.atleast_1d(cost.reduce_scatter_s(sizes)).tolist()
    ag = np.atleast_1d(cost.allgather_s(sizes)).tolist()
    fwd = trace.forward_s()
    o = trace.overheads
    return dear_period_s([float(fwd[list(g)].sum()) for g in groups], trace.backward_s(), groups, rs, ag,
                         bucket_update_s(trace.params(), groups, o.update_s), o.pre_forward_s, o.straggler_s)


def dear_plan(trace: Trace, groups: Sequence[Sequence[int]], cost: CostModel, solver: str, **meta) -> Plan:
    """A DeAR plan of ``groups`` (layer indices, forward order) with its predicted period."""
    meta["iteration_s"] = groups_period_s(trace, groups, cost)
    names = trace.names
    buckets = [Bucket(tuple(names[i] for i in g), DEAR_MESSAGES) for g in groups]
    return Plan(buckets, solver, meta=meta, family=FAMILY)


def _check_bytes(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer number of bytes, got {value!r}")
    return int(value)


def dear_nofusion(trace: Trace, cost: CostModel) -> Plan:
    """DeAR without tensor fusion: one layer per bucket."""
    return dear_plan(trace, [[i] for i in range(trace.num_layers)], cost, "dear_nofusion")


def dear_threshold(trace: Trace, cost: CostModel, threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> Plan:
    """DeAR with fixed-threshold fusion (:func:`threshold_groups`; 25 MiB by default)."""
    t = _check_bytes("threshold_bytes", threshold_bytes)
    return dear_plan(trace, threshold_groups(_layer_bytes(trace), t), cost, "dear_threshold", threshold_bytes=t)


def dear_model(trace: Trace, cost: CostModel, min_threshold_bytes: int = 0,
               max_threshold_bytes: int | None = None) -> Plan:
    """The threshold whose bucketing the model predicts fastest, searched exactly: every distinct
    bucketing of the threshold rule in ``[min_threshold_bytes, max_threshold_bytes]`` (default: all)
    is simulated in closed form (:func:`threshold_sweep`); ties go to the smaller threshold."""
    lo = _check_bytes("min_threshold_bytes", min_threshold_bytes)
    hi = None if max_threshold_bytes is None else _check_bytes("max_threshold_bytes", max_threshold_bytes)
    if hi is not None and hi < lo:
        raise ValueError(f"max_threshold_bytes ({hi}) is below min_threshold_bytes ({lo})")
    best = None
    n = 0
    for t, groups in threshold_sweep(trace, lo, hi):
        n += 1
        p = groups_period_s(trace, groups, cost)
        if best is None or p < best[0]:
            best = (p, t, groups)
    if best is None:
        raise ValueError(f"no threshold in [{lo}, {hi}] bytes")
    _, t, groups = best
    return dear_plan(trace, groups, cost, "dear_model", threshold_bytes=t, candidates=n)
