"""Planners of the sparse family (OMGS-SGD, ``../shared/papers/omgs.md``): which layers share one top-k.

All take a :class:`~repro.trace.Trace`, a :class:`~repro.cost.CostModel` that knows the sparse
all-gather line and the top-k cost (``topk_s``), the ``density`` (k = ceil(density x elements) per
bucket) and ``pack`` (False: values and indices in two all-gathers, as the paper; True: one packed
all-gather). They return a ``sparse`` :class:`~repro.plan.Plan` of contiguous buckets in backward
order whose ``meta["iteration_s"]`` is the simulated iteration (:mod:`repro.sim.sparse`), equal to
``simulate(trace, plan, cost).iteration_s``.

- :func:`topk_layerwise`: one top-k and all-gather per layer, pipelined with backward;
- :func:`topk_single`: TopK-SGD, one global top-k after the whole backward;
- :func:`omgs`: the published OMGS merge rule;
- :func:`omgs_optimal`: the exact optimum over contiguous groupings (this package's addition).

Never imports torch.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from repro.cost import CostModel
from repro.plan import Bucket, Message, Plan
from repro.planners._budget import DEFAULT_TIME_BUDGET_S, Search
from repro.sim.sparse import INDEX_BYTES, sparse_iteration_s, topk_count, value_bytes
from repro.trace import Trace

__all__ = ["FAMILY", "topk_layerwise", "topk_single", "omgs", "omgs_optimal", "groups_time_s", "SparseCosts"]

log = logging.getLogger(__name__)

FAMILY = "sparse"

_TWO = (Message("sparse_allgather"), Message("sparse_allgather"))
_ONE = (Message("sparse_allgather"),)


class SparseCosts:
    """``t_spar(d)`` and ``t_c(d)`` (seconds) for a bucket of ``d`` elements, vectorised over ``d``."""

    def __init__(self, trace: Trace, cost: CostModel, density: float, pack: bool) -> None:
        _check_density(density)
        if not isinstance(pack, bool):
            raise ValueError(f"pack must be True or False, got {pack!r}")
        cost.line("sparse_allgather")  # a clear error now rather than deep in a planner
        cost.topk_s(2)
        self.cost, self.density, self.pack = cost, float(density), pack
        self.value_bytes = value_bytes(trace)

    def spar_s(self, numel):
        return self.cost.topk_s(numel)

    def comm_s(self, numel):
        k = topk_count(numel, self.density)
        if self.pack:
            return self.cost.sparse_allgather_s(k * (self.value_bytes + INDEX_BYTES))
        return self.cost.sparse_allgather_s(k * self.value_bytes) + self.cost.sparse_allgather_s(k * INDEX_BYTES)


def _check_density(density) -> None:
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
        raise ValueError(f"density must be a number in (0, 1], got {density!r}")


def groups_time_s(trace: Trace, groups: Sequence[Sequence[int]], cost: CostModel, density: float,
                  pack: bool = False) -> float:
    """Simulated iteration seconds of sparse ``groups`` (layer indices, communication order)."""
    c = SparseCosts(trace, cost, density, pack)
    params = trace.params()
    numel = np.array([float(sum(int(params[i]) for i in g)) for g in groups])
    spar = np.atleast_1d(c.spar_s(numel)).tolist()
    comm = np.atleast_1d(c.comm_s(numel)).tolist()
    return sparse_iteration_s(trace.total_forward_s, trace.backward_s(), groups, spar, comm,
                              trace.overheads.total_s)


def _plan(trace: Trace, groups: list[list[int]], cost: CostModel, solver: str, density: float, pack: bool,
          **meta) -> Plan:
    meta["iteration_s"] = groups_time_s(trace, groups, cost, density, pack)
    names = trace.names
    buckets = [Bucket(tuple(names[i] for i in g), _ONE if pack else _TWO) for g in groups]
    return Plan(buckets, solver, meta=meta, family="sparse", options={"density": float(density)})


def topk_layerwise(trace: Trace, cost: CostModel, density: float = 0.001, *, pack: bool = False) -> Plan:
    """Layer-wise sparsification: one top-k and all-gather per layer, pipelined with backward."""
    _check_density(density)
    return _plan(trace, [[i] for i in reversed(range(trace.num_layers))], cost, "topk_layerwise", density, pack)


def topk_single(trace: Trace, cost: CostModel, density: float = 0.001, *, pack: bool = False) -> Plan:
    """TopK-SGD: one global top-k over all gradients after backward, one all-gather."""
    _check_density(density)
    return _plan(trace, [list(reversed(range(trace.num_layers)))], cost, "topk_single", density, pack)


def omgs(trace: Trace, cost: CostModel, density: float = 0.001, *, pack: bool = False) -> Plan:
    """The published OMGS-SGD merge rule (Shi et al., INFOCOM 2020), as written in omgs.md.

    Walk l = L down to 2. Layer l holds what was merged into it so far (elements ``p_l``, backward
    ``t_b(l)``, top-k ``t_s(l) = t_spar(p_l)``, all-gather ``t_c(l)``). With the start times of the
    timeline model (``tau_s(l)``: its top-k may start; ``tau_c(l)``: its all-gather starts), merge l
    into l-1 iff the extra waiting is smaller than the communication saved::

        t_w    = t_b(l-1) + t_spar(p_l + p_{l-1}) - t_spar(p_l) - t_spar(p_{l-1}) - (tau_c(l) - tau_s(l) - t_s(l))
        t_save = t_c(p_l) + t_c(p_{l-1}) - t_c(p_l + p_{l-1})
        merge iff t_w < t_save

    After a merge, l's elements and backward time move to l-1 and start times are recomputed (layers
    after l are final, so the start times are carried forward incrementally: O(L)). Not the authors'
    script's fixed 8192-element threshold.
    """
    c = SparseCosts(trace, cost, density, pack)
    p = trace.params().astype(float)
    tb = trace.backward_s()
    L = trace.num_layers
    groups: list[list[int]] = []
    cur = [L - 1]
    p_cur, tb_cur = float(p[L - 1]), float(tb[L - 1])
    tau_b = 0.0       # backward start of the current (merged) layer
    comm_free = 0.0   # end of the previous bucket's all-gather
    for l in range(L - 1, 0, -1):
        ts = float(c.spar_s(p_cur))
        tau_s = tau_b + tb_cur
        tau_c = max(comm_free, tau_s + ts)
        merged = p_cur + float(p[l - 1])
        t_w = (float(tb[l - 1]) + float(c.spar_s(merged)) - ts - float(c.spar_s(p[l - 1]))
               - (tau_c - tau_s - ts))
        t_save = float(c.comm_s(p_cur)) + float(c.comm_s(p[l - 1])) - float(c.comm_s(merged))
        if t_w < t_save:
            cur.append(l - 1)
            p_cur, tb_cur = merged, tb_cur + float(tb[l - 1])
        else:
            comm_free = tau_c + float(c.comm_s(p_cur))
            tau_b = tau_s + ts
            groups.append(cur)
            cur, p_cur, tb_cur = [l - 1], float(p[l - 1]), float(tb[l - 1])
    groups.append(cur)
    return _plan(trace, groups, cost, "omgs", density, pack)


def omgs_optimal(trace: Trace, cost: CostModel, density: float = 0.001, *, pack: bool = False,
                 time_budget_s: float = DEFAULT_TIME_BUDGET_S) -> Plan:
    """Exact minimum iteration time over all contiguous groupings of the sparse timeline.

    The MG-WFBP argument (a bucket's later start never helps) does not carry over: a bigger bucket
    also moves later layers' backward, because its top-k occupies the compute stream. So the state
    after grouping the first ``e`` layers in backward order is a pair (``C``: compute stream free,
    ``M``: communication stream free), both seconds from backward start, and grouping layers
    ``e..f-1`` next gives ``C' = C + t_b(e..f-1) + t_spar(d)``, ``M' = max(M, C') + t_c(d)``. Both are
    non-decreasing in ``C`` and ``M``, so a state dominated in both coordinates by another with the
    same ``e`` can never lead to a better end: keeping each prefix's Pareto front of (C, M) is exact,
    and the optimum is the least ``M`` after all L layers (``t_iter = t_f + M``).

    Three exact reductions keep the fronts small. (1) Every continuation's first group holds at least
    layer ``e``, so its top-k cannot start before ``C + t_b(e) + t_spar(p_e)``: ``M`` is raised to that
    (no future changes). (2) When ``M >= C + t_b(rest) + t_spar(rest merged)`` the communication
    stream can never again wait for the compute stream, so ``C`` no longer matters and is lowered to
    the least value any grouping can have there. (3) States whose lower bound
    ``max(M + t_c(rest merged), C + t_b(rest) + sum of per-layer t_spar(rest) + t_c(one element))``
    exceeds the best simple plan (layer-wise, single, the OMGS rule) are dropped (t_spar is
    superadditive and t_c subadditive, so the bound is valid). Every extension step is one numpy pass
    over the stored states. The fronts still grow large where the top-k's superadditivity and the
    start-ups trade off over hundreds of layers: seconds for Inception-v4's 299 layers at P = 2 (see
    ``benchmarks/bench_omgs.py`` for times).

    ``time_budget_s`` (seconds of wall clock, default 10; finite and positive) bounds the search: when
    it runs out first, the best simple plan (the published OMGS rule, or layer-wise or single top-k
    when better) is returned with ``meta["optimal"] = False``, its proven ``meta["gap_pct"]`` above
    the optimum and ``meta["lower_bound_s"]`` (the least lower bound of the stored states), and one
    WARNING is logged; a finished search records ``optimal: True, gap_pct: 0``
    (:mod:`repro.planners._budget`). A search longer than 2 s logs progress lines (INFO).
    """
    search = Search("omgs_optimal", time_budget_s, trace.num_layers, log)
    c = SparseCosts(trace, cost, density, pack)
    L = trace.num_layers
    pB = trace.params().astype(float)[::-1]           # backward order
    tbB = trace.backward_s()[::-1]
    cumP = np.concatenate([[0.0], np.cumsum(pB)])
    cumT = np.concatenate([[0.0], np.cumsum(tbB)])
    sparB = np.atleast_1d(c.spar_s(pB))
    cumS = np.concatenate([[0.0], np.cumsum(sparB)])
    fixed = trace.total_forward_s + trace.overheads.total_s
    simple = min((omgs(trace, cost, density, pack=pack), topk_layerwise(trace, cost, density, pack=pack),
                  topk_single(trace, cost, density, pack=pack)), key=lambda pl: float(pl.meta["iteration_s"]))
    incumbent = float(simple.meta["iteration_s"])
    upper = (incumbent - fixed) * (1 + 1e-9) + 1e-15
    min_comm = float(c.comm_s(1.0))
    # the store of states: prefix length, C, M, parent state
    cap = 1024
    E = np.zeros(cap, dtype=np.int64)
    Cs = np.zeros(cap)
    Ms = np.zeros(cap)
    parent = np.full(cap, -1, dtype=np.int64)
    n = 1

    def bound() -> float:
        """The least lower bound (iteration seconds) over the incumbent and every stored state: a
        better grouping leaves the stored states through one of them (the rest were dominated or
        could not beat the incumbent)."""
        e = E[:n]
        rest = cumP[L] - cumP[e]
        lb = np.where(e < L, np.maximum(Ms[:n] + np.atleast_1d(c.comm_s(rest)),
                                        Cs[:n] + (cumT[L] - cumT[e]) + (cumS[L] - cumS[e]) + min_comm), Ms[:n])
        return min(incumbent, float(np.min(lb)) + fixed)

    stopped = None
    for f in range(1, L + 1):
        if search.expired():
            stopped = f
            break
        search.progress(f - 1, incumbent, bound)
        e = E[:n]
        d = cumP[f] - cumP[e]
        C2 = Cs[:n] + (cumT[f] - cumT[e]) + np.atleast_1d(c.spar_s(d))
        M2 = np.maximum(Ms[:n], C2) + np.atleast_1d(c.comm_s(d))
        if f < L:
            rest = cumP[L] - cumP[f]
            rest_tb = cumT[L] - cumT[f]
            M2 = np.maximum(M2, C2 + tbB[f] + sparB[f])                                  # (1)
            C2 = np.where(M2 >= C2 + rest_tb + float(c.spar_s(rest)), cumT[f] + cumS[f], C2)  # (2)
            lb = np.maximum(M2 + float(c.comm_s(rest)), C2 + rest_tb + (cumS[L] - cumS[f]) + min_comm)  # (3)
            keep = lb <= upper
        else:
            keep = M2 <= upper
        idx = np.nonzero(keep)[0]
        if idx.size == 0:
            continue
        order = idx[np.lexsort((M2[idx], C2[idx]))]
        Mo = M2[order]
        prev_min = np.concatenate([[np.inf], np.minimum.accumulate(Mo)[:-1]])
        front = order[Mo < prev_min]
        if n + front.size > cap:
            cap = max(2 * cap, n + front.size)
            E, Cs, Ms, parent = (np.resize(a, cap) for a in (E, Cs, Ms, parent))
        sl = slice(n, n + front.size)
        E[sl], Cs[sl], Ms[sl], parent[sl] = f, C2[front], M2[front], front
        n += front.size
    if stopped is not None:
        plan = simple.replace(solver="omgs_optimal", meta=dict(simple.meta))
        search.record(plan.meta, incumbent, bound(), stopped - 1)
        return plan
    finals = np.nonzero(E[:n] == L)[0]
    if finals.size == 0:  # cannot happen: the best simple plan is itself a contiguous grouping
        raise RuntimeError("omgs_optimal found no grouping within the bound (please report this)")
    s = int(finals[np.argmin(Ms[finals])])
    cuts = []
    while s > 0:
        cuts.append(int(E[s]))
        s = int(parent[s])
    cuts = [0] + cuts[::-1]
    groups = [[L - 1 - j for j in range(a, b)] for a, b in zip(cuts[:-1], cuts[1:])]
    plan = _plan(trace, groups, cost, "omgs_optimal", density, pack)
    search.record(plan.meta, float(plan.meta["iteration_s"]), None, L)
    return plan
