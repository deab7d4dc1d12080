"""Planners of the parameter-server family (OSP: Chen et al., arXiv 2306.16926, as interpreted in
``docs/interpretations.md``).

A plan puts each layer on a server shard (layers largest first, each to the shard with the fewest bytes;
ties: the lower shard) and in a stage: one bucket per (stage, shard) with a ``push`` and a ``pull``;
stage 1 (phase ``backward``) blocks the next iteration, stage 2 (``background``) overlaps it. ``osp``
fills stage 1 greedily in importance order (``position`` or ``magnitude``) up to ``stage1_share`` of the
bytes. ``meta["iteration_s"]`` is the simulated steady-state period.
"""

from __future__ import annotations

import math

import numpy as np

from repro.core.cost import CostModel
from repro.core.plan import Bucket, Message, Plan
from repro.core.trace import Trace

__all__ = ["FAMILY", "IMPORTANCE", "shard_layers", "importance_order", "stage_one_layers", "ps_plan",
           "ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_auto"]

FAMILY = "ps"
IMPORTANCE = ("position", "magnitude")
GRAD_MAGNITUDE_KEY = "grad_abs_mean"   # per-layer extra of a measured trace: mean |gradient| per element


def shard_layers(layer_bytes, servers: int) -> list[int]:
    """The shard of every layer: largest first, each to the least-loaded shard (ties: lowest index)."""
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 1:
        raise ValueError(f"servers must be a positive integer, got {servers!r}")
    sizes = [float(b) for b in layer_bytes]
    load = [0.0] * int(servers)
    out = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        s = min(range(len(load)), key=lambda k: (load[k], k))
        out[i] = s
        load[s] += sizes[i]
    return out


def importance_order(trace: Trace, importance: str) -> list[int]:
    """Layer indices, most important first: ``position`` (input side first) or ``magnitude`` (largest
    measured mean |gradient| first)."""
    if importance == "position":
        return list(range(trace.num_layers))
    if importance == "magnitude":
        mags = []
        for layer in trace.layers:
            v = layer.extra.get(GRAD_MAGNITUDE_KEY)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"importance 'magnitude' needs each layer's measured '{GRAD_MAGNITUDE_KEY}' "
                                 f"(a trace measured in a run); layer '{layer.name}' has {v!r}; use "
                                 "importance 'position' for estimated traces")
            mags.append(float(v))
        return sorted(range(trace.num_layers), key=lambda i: (-mags[i], i))
    raise ValueError(f"unknown importance policy {importance!r}; choose one of {', '.join(IMPORTANCE)}")


def stage_one_layers(trace: Trace, stage1_share: float, importance: str = "position") -> set[int]:
    """Layers in stage 1: in importance order, each layer joins when at least half of its bytes still fit
    within what is left of ``stage1_share`` of the gradient bytes, else it is passed over (a greedy fill;
    a share of 1 takes every layer, 0 none)."""
    if isinstance(stage1_share, bool) or not isinstance(stage1_share, (int, float)) \
            or not 0.0 <= stage1_share <= 1.0:
        raise ValueError(f"stage1_share must be a number in [0, 1], got {stage1_share!r}")
    sizes = trace.bytes().astype(float)
    budget = float(stage1_share) * float(sizes.sum())
    chosen, used = set(), 0.0
    for i in importance_order(trace, importance):
        if used + sizes[i] / 2 <= budget:
            chosen.add(i)
            used += sizes[i]
    return chosen


def ps_plan(trace: Trace, cost: CostModel | None, mode: str, servers: int = 1, *, stage1: set[int] | None = None,
            staleness: int = 0, lgp: bool = True, solver: str | None = None, meta: dict | None = None) -> Plan:
    """The plan of ``mode`` with the layers ``stage1`` in stage 1 (all when None); with a cost model,
    ``meta["iteration_s"]`` holds the simulated period."""
    n = trace.num_layers
    if isinstance(servers, (int, np.integer)) and not isinstance(servers, bool) and servers > n:
        raise ValueError(f"servers ({servers}) exceeds the model's {n} layers: some servers would hold nothing")
    stage1 = set(range(n)) if stage1 is None else set(stage1)
    shard = shard_layers(trace.bytes(), servers)
    buckets, owners = [], []
    for stage, phase in ((1, "backward"), (2, "background")):
        for s in range(servers):
            layers = [trace.names[i] for i in range(n) if shard[i] == s and (i in stage1) == (stage == 1)]
            if layers:
                buckets.append(Bucket(tuple(layers), (Message("push", phase), Message("pull", phase))))
                owners.append(s)
    options = {"mode": mode, "servers": int(servers), "bucket_servers": tuple(owners)}
    if mode == "ssp":
        options["staleness"] = int(staleness)
    if mode == "osp":
        options["lgp"] = bool(lgp)
    sizes = trace.bytes().astype(float)
    info = {"stage1_bytes_share": float(sizes[sorted(stage1)].sum() / sizes.sum()) if n else 1.0,
            **(meta or {})}
    plan = Plan(buckets, solver or f"ps_{mode}", family=FAMILY, options=options, meta=info)
    if cost is None:
        return plan
    from repro.core.simulate import simulate

    period = simulate(trace, plan, cost, with_ops=False).iteration_s
    return plan.replace(meta={**plan.meta, "iteration_s": period})


def ps_bsp(trace: Trace, cost: CostModel, servers: int = 1) -> Plan:
    """BSP: every worker pushes its whole gradient; the server averages all N, updates, and every worker
    pulls the new parameters before its next iteration."""
    return ps_plan(trace, cost, "bsp", servers, solver="ps_bsp")


def ps_asp(trace: Trace, cost: CostModel, servers: int = 1) -> Plan:
    """ASP: the server applies each worker's gradient as soon as it arrives (scaled by 1/N, so one round
    of N gradients is one BSP step in expectation); the worker pulls whatever is current."""
    return ps_plan(trace, cost, "asp", servers, solver="ps_asp")


def ps_ssp(trace: Trace, cost: CostModel, servers: int = 1, staleness: int = 2) -> Plan:
    """SSP(s): ASP, except that a worker may start iteration c only when every worker has completed
    iteration c - s - 1 (it runs at most s iterations ahead of the slowest)."""
    if isinstance(staleness, bool) or not isinstance(staleness, (int, np.integer)) or staleness < 0:
        raise ValueError(f"staleness must be a non-negative integer, got {staleness!r}")
    return ps_plan(trace, cost, "ssp", servers, staleness=int(staleness), solver="ps_ssp")


def osp(trace: Trace, cost: CostModel, servers: int = 1, stage1_share: float = 0.5, importance: str = "position",
        lgp: bool = True) -> Plan:
    """OSP: the important ``stage1_share`` of the gradient bytes is synchronised as BSP (blocking); the
    rest in the background, overlapped with the next iteration, its parameters one step stale and, with
    ``lgp``, corrected locally by ``w - lr * g_local`` until the aggregated values arrive."""
    stage1 = stage_one_layers(trace, stage1_share, importance)
    return ps_plan(trace, cost, "osp", servers, stage1=stage1, lgp=lgp, solver="osp",
                   meta={"stage1_share": float(stage1_share), "importance": importance})


def osp_auto(trace: Trace, cost: CostModel, servers: int = 1, importance: str = "position",
             lgp: bool = True) -> Plan:
    """OSP with this package's automatic split (docs/osp.md): the largest stage-2 share whose push and
    pull traffic (N workers on each shard's link) hides behind one iteration's computation."""
    from repro.families.ps.simulate import auto_stage2_share, trace_compute_s

    share2 = auto_stage2_share(trace_compute_s(trace), float(trace.total_bytes), cost.line("push"),
                               cost.line("pull"), workers=cost.workers, servers=servers)
    stage1 = stage_one_layers(trace, 1.0 - share2, importance)
    return ps_plan(trace, cost, "osp", servers, stage1=stage1, lgp=lgp, solver="osp_auto",
                   meta={"stage1_share": 1.0 - share2, "importance": importance, "auto_stage2_share": share2})
