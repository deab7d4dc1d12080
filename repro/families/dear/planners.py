"""Planners of the DeAR family: contiguous buckets of layers in forward order (input side first), each
sending a backward reduce-scatter and a next-forward all-gather. ``meta["iteration_s"]`` is the plan's
steady-state period, equal to ``simulate(trace, plan, cost).iteration_s``.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator, Sequence

import numpy as np

from repro.core.cost import CostModel
from repro.core.budget import DEFAULT_TIME_BUDGET_S, Search
from repro.core.judge import judged_best
from repro.core.plan import Bucket, Message, Plan
from repro.families.dear.simulate import bucket_update_s, dear_period_s
from repro.core.trace import Trace

__all__ = ["FAMILY", "DEAR_MESSAGES", "DEFAULT_THRESHOLD_BYTES", "dear_plan", "threshold_groups",
           "threshold_sweep", "groups_period_s", "dear_nofusion", "dear_threshold", "dear_model", "dear_optimal"]

log = logging.getLogger(__name__)

FAMILY = "dear"
DEAR_MESSAGES = (Message("reduce_scatter", "backward"), Message("allgather", "next_forward"))
DEFAULT_THRESHOLD_BYTES = 25 * 2**20
DIVE_WIDTH = 24  # labels per depth (at most one per end position) in dear_optimal's dives; 0: no dive
DIVE_EVERY = 2000  # the exact pass dives after this many new labels since its last dive (doubled after each)
STALL_LAYERS = 2000  # up to this many layers dear_optimal bounds the forward's stalls exactly (O(L^2) memory)


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


def _sweep_bounds(nbytes: np.ndarray, lo: int, hi: int) -> Iterator[tuple[int, np.ndarray]]:
    """:func:`threshold_sweep` as bucket boundaries ``[0, b_1, ..., L]`` (int arrays): a bucket
    starting at layer s ends before the first layer i > s with ``cum[i + 1] - cum[s] >= t`` (one
    :func:`numpy.searchsorted` for every start at once), and the chain from layer 0 is followed. From
    one threshold to the next, the buckets before the first one that grows are unchanged, so the
    chain is only followed again from there."""
    L = len(nbytes)
    cum = np.concatenate([[0], np.cumsum(nbytes)])
    at_least = np.arange(1, L + 1)
    t = lo
    b: list[int] = [0]
    keep = 0  # the buckets b[:keep + 1] hold for the new threshold too
    while t <= hi:
        b = b[:keep + 1]
        s = b[-1]
        nxt = np.maximum(np.searchsorted(cum, cum[s:L] + t, side="left") - 1, at_least[s:]).tolist()
        while s < L:
            s = nxt[s - b[keep]]
            b.append(s)
        bounds = np.array(b)
        yield t, bounds
        if len(bounds) == 2:
            return
        v = cum[bounds[1:-1] + 1] - cum[bounds[:-2]]  # bucket k's bytes with the next layer
        t = int(np.min(v)) + 1
        keep = int(np.argmax(v < t))  # the first bucket that absorbs its next layer at the new threshold


def threshold_sweep(trace: Trace, min_threshold_bytes: int = 0,
                    max_threshold_bytes: int | None = None) -> Iterator[tuple[int, list[list[int]]]]:
    """Every distinct bucketing :func:`threshold_groups` makes for thresholds in ``[min_threshold_bytes,
    max_threshold_bytes]``, each with the smallest threshold giving it (the next bucketing starts at
    ``min_k (bytes(bucket k) + bytes(first layer of bucket k+1)) + 1``)."""
    nbytes = _layer_bytes(trace)
    top = int(nbytes.sum()) + 1 if max_threshold_bytes is None else int(max_threshold_bytes)
    for t, b in _sweep_bounds(nbytes, int(min_threshold_bytes), top):
        yield t, _groups(b)


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
    found = _best_threshold(trace, cost, _Model(trace, cost), lo, hi)
    if found is None:
        raise ValueError(f"no threshold in [{lo}, {hi}] bytes")
    t, bounds, n, _ = found
    return dear_plan(trace, _groups(bounds), cost, "dear_model", threshold_bytes=t, candidates=n)


def _groups(bounds: Sequence[int]) -> list[list[int]]:
    b = [int(x) for x in bounds]
    return [list(range(x, y)) for x, y in zip(b[:-1], b[1:])]


def _best_threshold(trace: Trace, cost: CostModel, model: "_Model", lo: int, hi: int | None,
                    deadline: float | None = None, chunk: int = 256):
    """``(threshold, bounds, candidates, complete)`` of :func:`dear_model`'s choice (None: no threshold in
    range): the first strict minimum in threshold order, as a one-by-one sweep. Past ``deadline``
    (``perf_counter`` seconds) the best so far, ``complete`` False."""
    nbytes = _layer_bytes(trace)
    top = int(nbytes.sum()) + 1 if hi is None else hi
    best = None  # (exact period, threshold, bounds)
    n = 0
    complete = True
    batch: list[tuple[int, np.ndarray]] = []

    def flush():
        nonlocal best
        p = model.periods([b for _, b in batch])
        floor = float(np.min(p))
        if best is not None and floor > best[0] * (1 + 1e-9) + 1e-15:
            return
        for k in np.flatnonzero(p <= floor * (1 + 1e-9) + 1e-15).tolist():
            t, b = batch[k]
            exact = groups_period_s(trace, _groups(b), cost)
            if best is None or exact < best[0]:
                best = (exact, t, b)

    for t, b in _sweep_bounds(nbytes, lo, top):
        batch.append((t, b))
        n += 1
        if len(batch) >= chunk:
            flush()
            batch = []
            if deadline is not None and time.perf_counter() >= deadline:
                complete = False
                break
    if batch:
        flush()
    if best is None:
        return None
    return best[1], best[2], n, complete


class _Model:
    """The DeAR period of bucketings given as boundaries ``[0, b_1, ..., L]``, vectorised:
    ``phi_K + c_K + M + straggler``, ``phi_1 = max(pre, a_1)``, ``phi_{k+1} = phi_k + max(c_k, a_{k+1})``,
    ``M = max_k (r_k + S_k)``. Equal to :func:`groups_period_s`."""

    def __init__(self, trace: Trace, cost: CostModel) -> None:
        o = trace.overheads
        L = trace.num_layers
        upd = np.asarray(bucket_update_s(trace.params(), [[i] for i in range(L)], o.update_s))
        self.L = L
        self.cum_c = np.concatenate([[0.0], np.cumsum(trace.forward_s() + upd)])
        self.cum_n = np.concatenate([[0.0], np.cumsum(trace.bytes())])
        self.ready = np.concatenate([np.cumsum(trace.backward_s()[::-1])[::-1], [0.0]])
        self.rs, self.ag = cost.line("reduce_scatter"), cost.line("allgather")
        self.pre, self.straggler = o.pre_forward_s, o.straggler_s

    def periods(self, many: Sequence[Sequence[int]]) -> np.ndarray:
        """:meth:`period` of many bucketings at once (equal up to rounding)."""
        lens = np.array([len(b) - 1 for b in many])
        starts = np.concatenate([np.asarray(b[:-1]) for b in many])
        ends = np.concatenate([np.asarray(b[1:]) for b in many])
        last = np.cumsum(lens) - 1
        first = last - lens + 1
        n = self.cum_n[ends] - self.cum_n[starts]
        c = self.cum_c[ends] - self.cum_c[starts]
        a = np.atleast_1d(self.ag(n))
        r = np.atleast_1d(self.rs(n))
        pair = np.zeros(len(n))
        pair[:-1] = np.maximum(c[:-1], a[1:])
        pair[last] = 0.0
        cs = np.concatenate([[0.0], np.cumsum(pair)])
        phi = np.maximum(self.pre, a[first]) + (cs[last] - cs[first])
        cr = np.cumsum(r)
        S = cr - np.repeat(cr[first] - r[first], lens)
        M = np.maximum.reduceat(self.ready[starts] + S, first)
        return phi + c[last] + M + self.straggler

    def period(self, bounds: Sequence[int]) -> float:
        b = np.asarray(bounds)
        n = self.cum_n[b[1:]] - self.cum_n[b[:-1]]
        c = self.cum_c[b[1:]] - self.cum_c[b[:-1]]
        a = np.atleast_1d(self.ag(n))
        phi = max(self.pre, float(a[0])) + float(np.sum(np.maximum(c[:-1], a[1:])))
        M = float(np.max(self.ready[b[:-1]] + np.cumsum(np.atleast_1d(self.rs(n)))))
        return phi + float(c[-1]) + M + self.straggler


def dear_optimal(trace: Trace, cost: CostModel, *, time_budget_s: float = DEFAULT_TIME_BUDGET_S) -> Plan:
    """Exact minimum of the DeAR period over every contiguous bucketing (a label-setting dynamic program
    with dominance and bound pruning; docs/design/families.md), exact under the contention-free model.

    Under a realism with contention the search's plan and those of ``dear_model``, ``dear_threshold`` and
    ``dear_nofusion`` are simulated and the fastest is returned (:func:`repro.core.judge.judged_best`:
    ``meta["plan_from"]``, ``meta["iteration_s"]``, ``meta["exact_plan_iteration_s"]``). When
    ``time_budget_s`` (wall-clock seconds) runs out, the best bucketing so far (never worse than
    :func:`dear_threshold`) is returned with ``meta["optimal"] = False``, ``gap_pct`` and ``lower_bound_s``,
    and one WARNING is logged (:mod:`repro.core.budget`)."""
    search = Search("dear_optimal", time_budget_s, trace.num_layers, log)
    model = _Model(trace, cost)
    L = model.L
    # the incumbent: the released code's 25 MiB threshold rule (improved below)
    best_bounds = [0, *np.cumsum([len(g) for g in threshold_groups(_layer_bytes(trace),
                                                                   DEFAULT_THRESHOLD_BYTES)]).tolist()]
    best = model.period(best_bounds) - model.straggler
    cum_c, cum_n, ready = model.cum_c, model.cum_n, model.ready
    # the smallest next bucket starting at layer j (layer j alone): its all-gather and reduce-scatter
    head_ag = np.append(np.atleast_1d(model.ag(np.diff(cum_n))), 0.0)
    head_rs = np.append(np.atleast_1d(model.rs(np.diff(cum_n))), 0.0)
    # the most the reduce-scatters from layer j on can add past S (every layer its own bucket)
    most_rs = ready + np.append(np.cumsum(head_rs[:L][::-1])[::-1], 0.0)
    W = _least_rs_end(model)

    stalls = _Stalls(model)

    def lower_bound(phi, c, S, M, j):
        """A lower bound on the period (without straggler) of any completion of a partial bucketing whose last
        bucket (compute ``c``, start ``phi``) ends before layer ``j``: the forward with its least stalls
        (:class:`_Stalls`) against the least end of the remaining reduce-scatters (:func:`_least_rs_end`)."""
        if np.isscalar(j) and j == L:
            return phi + c + M
        jj = np.minimum(j, L)  # at L: no compute, no stall left, and S + W[L] = -inf
        return phi + c + ((cum_c[L] - cum_c[jj]) + stalls.least(jj, c)) + np.maximum(M, S + W[jj])

    def child_bound(phi, c, S, M, i, j):
        """:func:`lower_bound` of labels whose last bucket is ``[i, j)`` itself (``c`` its compute, not
        raised): the stall read from the table, no search."""
        return phi + c + ((cum_c[L] - cum_c[j]) + stalls.after(i, j)) + np.maximum(M, S + W[j])

    def dive(I, P, Cc, S, M, best: float, width: int):
        """A beam search by depth (finds bucketings, never prunes): keeps ``width`` labels of least
        bound under ``best`` per depth, one per end position. Returns None or ``(total, q, ends)``."""
        found = None
        levels: list[tuple[np.ndarray, np.ndarray]] = []  # per depth: (end positions, index of the parent)
        parent = np.full(len(I), -1)
        v = lower_bound(P, Cc, S, M, I)
        while len(I):
            done = I >= L
            if done.any():
                tot = P[done] + Cc[done] + M[done]
                k = int(np.argmin(tot))
                if tot[k] < best - 1e-15:
                    best = float(tot[k])
                    found = (len(levels), int(np.flatnonzero(done)[k]))
            levels.append((I, parent))
            if search.expired():
                break
            idx = np.flatnonzero(~done & (v < best - 1e-15))
            if not len(idx):
                break
            idx = idx[np.lexsort((-I[idx], v[idx]))]
            _, first_of = np.unique(I[idx], return_index=True)  # the least bound per end position
            idx = idx[np.sort(first_of)[:width]]
            i0 = I[idx]
            cnt = L - i0
            rows = np.repeat(np.arange(len(idx)), cnt)
            js = np.arange(len(rows)) - np.repeat(np.cumsum(cnt) - cnt, cnt) + i0[rows] + 1
            n = cum_n[js] - cum_n[i0[rows]]
            a, r = np.atleast_1d(model.ag(n)), np.atleast_1d(model.rs(n))
            src = idx[rows]
            P = P[src] + np.maximum(Cc[src], a)
            Cc = cum_c[js] - cum_c[i0[rows]]
            S = S[src] + r
            M = np.maximum(M[src], ready[i0[rows]] + S)
            I, parent = js, src
            v = child_bound(P, Cc, S, M, i0[rows], js)
        if found is None:
            return None
        d, k = found
        ends = []
        while d > 0:
            ends.append(int(levels[d][0][k]))
            k = int(levels[d][1][k])
            d -= 1
        ends.append(int(levels[0][0][k]))
        return best, k, ends[::-1]

    def run(best: float, best_bounds: list[int]):
        """The label-setting search under the incumbent ``best`` (``best_bounds``); after every
        :data:`DIVE_EVERY` new labels (doubled after each) it dives (:func:`dive`) from the labels at hand
        for a better incumbent. Returns ``(best, best_bounds, labels, stopped, cand)``: ``stopped``
        is the position where the budget ran out (None: finished)."""
        # candidate labels per end position: rows (phi, c, S, M, start, parent id, lower bound); the bound
        # is the label's own (of its last bucket as made: :func:`child_bound`), checked again against
        # the incumbent when the label's position comes
        cand: list[list[np.ndarray]] = [[] for _ in range(L + 1)]
        nodes: list[tuple[int, int, int]] = []  # kept labels: (start, end, parent id)
        first = np.stack([phi0, c0, S0, M0, np.zeros(L), np.full(L, -1.0), child_bound(phi0, c0, S0, M0, 0, j)],
                         axis=1)
        for k in range(L):
            cand[k + 1].append(first[k:k + 1])
        stopped = None
        made, dive_after = 0, DIVE_EVERY  # labels made since the last dive, and the next dive's threshold
        for i in range(1, L + 1):
            if search.expired():
                stopped = i
                break
            search.progress(i - 1, best + model.straggler,
                            lambda: _pending_bound(cand, i, best, lower_bound) + model.straggler)
            if not cand[i]:
                continue
            C = np.concatenate(cand[i])
            cand[i] = []
            C = C[C[:, 6] < best - 1e-15]
            if not len(C):
                continue
            if i == L:
                totals = C[:, 0] + C[:, 1] + C[:, 3]
                t = int(np.argmin(totals))
                if totals[t] < best - 1e-15:
                    best = float(totals[t])
                    nodes.append((int(C[t, 4]), L, int(C[t, 5])))
                    best_bounds = _bounds_from(nodes, len(nodes) - 1)
                continue
            # exact normalisations (docs/design): every next bucket's all-gather is at least layer i's,
            # the remaining reduce-scatters end after S + W[i], and S cannot matter any more
            # once M is past all that the remaining reduce-scatters can add
            C[:, 1] = np.maximum(C[:, 1], head_ag[i])
            C[:, 3] = np.maximum(C[:, 3], C[:, 2] + W[i])
            C[:, 2] = np.where(C[:, 3] >= C[:, 2] + most_rs[i], 0.0, C[:, 2])
            C = _pareto(C)
            phi, c, S, M = C[:, 0], C[:, 1], C[:, 2], C[:, 3]
            js = np.arange(i + 1, L + 1)
            n = cum_n[js] - cum_n[i]
            a = np.atleast_1d(model.ag(n))
            r = np.atleast_1d(model.rs(n))
            ids = np.arange(len(nodes), len(nodes) + len(C))
            nodes.extend((int(row[4]), i, int(row[5])) for row in C)
            if DIVE_WIDTH and made >= dive_after:  # many labels under the incumbent: look for a better one
                made, dive_after = 0, 2 * dive_after
                got = dive(np.full(len(C), i), phi, c, S, M, best, DIVE_WIDTH)
                if got is not None:  # its value recomputed in closed form: a real bucketing's period
                    best_bounds = sorted(set(_bounds_from(nodes, int(ids[got[1]])) + got[2]))
                    best = min(best, model.period(best_bounds) - model.straggler)
            # each label's next bucket [i, j) can only be useful up to the last j whose bound
            # phi + forward(i..L) + max(c, T_ag) + sg + max(M, ready(i) + S + T_rs, S + rw), non-decreasing
            # in j, is below the incumbent; found by bisection, then only those buckets are made
            base = phi + (cum_c[L] - cum_c[i])
            # the reduce-scatters' least end after a bucket [i, j) or any longer one, and the forward's
            # least stall after one: both non-decreasing in j
            rw = np.minimum.accumulate((r + W[js])[::-1])[::-1]
            sg = stalls.suffix(i)
            lo, hi = np.zeros(len(C), dtype=np.int64), np.full(len(C), len(js), dtype=np.int64)  # count in [lo, hi]
            while np.any(lo < hi):
                mid = (lo + hi + 1) // 2
                k = np.maximum(mid - 1, 0)
                mb = base + np.maximum(c, a[k]) + sg[k] + np.maximum(np.maximum(M, ready[i] + S + r[k]), S + rw[k])
                ok = mb < best - 1e-15
                lo = np.where(ok & (lo < hi), mid, lo)
                hi = np.where(ok | (lo >= hi), hi, mid - 1)
            counts = lo
            total = int(counts.sum())
            if not total:
                continue
            rows = np.repeat(np.arange(len(C)), counts)
            cols = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
            phi_n = phi[rows] + np.maximum(c[rows], a[cols])
            cn = cum_c[js[cols]] - cum_c[i]
            S_n = S[rows] + r[cols]
            M_n = np.maximum(M[rows], ready[i] + S_n)
            lb_n = child_bound(phi_n, cn, S_n, M_n, i, js[cols])
            keep = lb_n < best - 1e-15
            made += int(np.count_nonzero(keep))
            if not keep.any():
                continue
            rows, cols = rows[keep], cols[keep]
            block = np.stack([phi_n[keep], cn[keep], S_n[keep], M_n[keep],
                              np.full(len(rows), float(i)), ids[rows].astype(float), lb_n[keep]], axis=1)
            order = np.argsort(cols, kind="stable")
            block, cols = block[order], cols[order]
            cuts = np.flatnonzero(np.diff(cols)) + 1
            for part, col in zip(np.split(block, cuts), cols[np.concatenate([[0], cuts])]):
                cand[int(js[col])].append(part)
        return best, best_bounds, len(nodes), stopped, cand

    # the labels of every first bucket [0, j)
    j = np.arange(1, L + 1)
    S0 = np.atleast_1d(model.rs(cum_n[j]))
    phi0, c0, M0 = np.maximum(model.pre, np.atleast_1d(model.ag(cum_n[j]))), cum_c[j], ready[0] + S0
    root = float(np.min(lower_bound(phi0, c0, S0, M0, j)))
    log.debug("dear_optimal: root bound %.9g s, incumbent %.9g s", root + model.straggler, best + model.straggler)
    # the exact pass's incumbent: a dive from every first bucket (a heuristic)
    stopped = None
    if DIVE_WIDTH:
        got = dive(j, phi0, c0, S0, M0, best, DIVE_WIDTH)
        if got is not None and model.period([0, *got[2]]) - model.straggler < best:
            best_bounds = [0, *got[2]]
            best = model.period(best_bounds) - model.straggler
        if search.expired():
            stopped = 1
        log.debug("dear_optimal: after the dive %.9g s (%.2f s)", best + model.straggler, search.elapsed_s())
    labels = 0
    if stopped is not None:  # the budget ran out in the dive, which bounds nothing: only the root's bound is proven
        proven = min(best, root)
    else:
        best, best_bounds, labels, stopped, cand = run(best, best_bounds)
        proven = None if stopped is None else _pending_bound(cand, stopped, best, lower_bound)
    plan = dear_plan(trace, _groups(best_bounds), cost, "dear_optimal", labels=labels)
    bound = None if proven is None else proven + model.straggler
    search.record(plan.meta, plan.meta["iteration_s"], bound, 0 if stopped is None else stopped - 1)
    rivals = [("dear_model", lambda: dear_model(trace, cost)), ("dear_threshold", lambda: dear_threshold(trace, cost)),
              ("dear_nofusion", lambda: dear_nofusion(trace, cost))]
    return judged_best(trace, cost, plan, rivals, search, "dear_optimal")


def _pending_bound(cand: list[list[np.ndarray]], i: int, best: float, lower_bound) -> float:
    """The least lower bound (without the straggler) over the incumbent ``best`` and every label not
    yet expanded (those ending at ``i`` or later): every bucketing not dominated or pruned so far
    passes through one of them."""
    lb = best
    for j in range(i, len(cand)):
        for C in cand[j]:
            if len(C):
                lb = min(lb, float(np.min(lower_bound(C[:, 0], C[:, 1], C[:, 2], C[:, 3], np.full(len(C), j)))))
    return lb


class _Stalls:
    """The least the all-gathers can stall the forward after a bucket of compute ``t`` ending before layer
    ``j``, over every bucketing of ``j..L-1``: ``least(j, t) = min_w [(T_ag(j..w-1) - t)^+ + G(j, w)]``.
    O(L^2 log L) time, O(L^2) memory; beyond :data:`STALL_LAYERS` layers only the next all-gather's stall."""

    def __init__(self, model: _Model) -> None:
        L = self.L = model.L
        cum_n, cum_c = model.cum_n, model.cum_c
        self.head = np.append(np.atleast_1d(model.ag(np.diff(cum_n))), 0.0)
        self.cum_c = cum_c
        self.exact = L <= STALL_LAYERS
        if not self.exact:
            return
        # every table is kept as one flat array: row z (a bucket starting at layer z) holds its ends
        # w = z+1..L at row_start[z] + (w - z - 1), so that a batch of queries is one search
        K = L + 1
        self.lens = np.zeros(K, dtype=np.int64)
        self.lens[:L] = L - np.arange(L)
        self.row_start = np.cumsum(self.lens) - self.lens
        size = int(self.lens.sum())
        A, self.PG, self.SAG, self.SG = np.empty(size), np.empty(size), np.empty(size), np.empty(size)
        G = np.zeros(size)  # G(y, w); G(y, L) = 0, the others written (a column) when w's row is made
        below = self.row_start[:L] - np.arange(L) - 1  # G(y, z) is at below[y] + z
        for z in range(L - 1, -1, -1):
            s0, n = int(self.row_start[z]), L - z
            a = np.atleast_1d(model.ag(cum_n[z + 1:] - cum_n[z]))
            g = G[s0:s0 + n]  # G(z, w), w = z+1..L: made by the rows after z
            A[s0:s0 + n] = a
            self.PG[s0:s0 + n] = np.minimum.accumulate(g)
            self.SAG[s0:s0 + n] = np.minimum.accumulate((a + g)[::-1])[::-1]
            # SG: the least stall after a bucket [z, w') with w' >= w (non-decreasing in w)
            self.SG[s0:s0 + n] = np.minimum.accumulate(g[::-1])[::-1]
            if z:
                t = cum_c[z] - cum_c[:z]  # buckets [y, z) for every y < z: one sorted row, one search
                k = np.searchsorted(a, t, side="right")
                G[below[:z] + z] = np.minimum(np.where(k > 0, self.PG[s0 + np.maximum(k - 1, 0)], np.inf),
                                              np.where(k < n, self.SAG[s0 + np.minimum(k, n - 1)] - t, np.inf))
        self.G = G
        # the all-gathers shifted by z * offset (rounding there can only miscount k at a tie, which
        # lowers the bound)
        top = float(np.max(A, initial=0.0)) + 1.0
        self.top, self.offset = top, 2.0 * top
        self.flat = np.repeat(np.arange(K), self.lens) * self.offset + A

    def _query(self, z: np.ndarray, t: np.ndarray) -> np.ndarray:
        """:meth:`least` from the tables (``z`` = L, an empty row: 0)."""
        start = self.row_start[z]
        k = np.searchsorted(self.flat, z * self.offset + np.minimum(t, self.top), side="right") - start
        n = self.lens[z]
        lo = np.clip(k, 0, n)
        last = len(self.SAG) - 1
        v1 = np.where(lo > 0, self.PG[np.clip(start + lo - 1, 0, last)], np.inf)
        v2 = np.where(lo < n, self.SAG[np.minimum(start + lo, last)] - t, np.inf)
        return np.where(n > 0, np.minimum(v1, v2), 0.0)

    def suffix(self, i: int) -> np.ndarray:
        """For ends ``j = i+1..L``: the least stall after a bucket ``[i, j')`` with ``j' >= j``."""
        if not self.exact:
            return np.zeros(self.L - i)
        return self.SG[self.row_start[i]:self.row_start[i] + self.lens[i]]

    def after(self, i, j) -> np.ndarray:
        """The least stall after the bucket ``[i, j)`` itself (``j <= L``; at L: 0), i.e. ``least(j,
        compute(i..j-1))`` read from the table (``G(i, j)``), broadcast over ``i`` and ``j``."""
        i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
        if not self.exact:
            return np.maximum(self.head[j] - (self.cum_c[j] - self.cum_c[i]), 0.0)
        return self.G[self.row_start[i] + (j - i - 1)]

    def least(self, j, t) -> np.ndarray:
        """The least stall after a bucket of compute ``t`` (seconds) ending before layer ``j`` (<= L; at
        L: 0), broadcast over ``j`` and ``t``."""
        j, t = np.asarray(j, dtype=np.int64), np.asarray(t, dtype=float)
        if not self.exact:
            return np.maximum(self.head[j] - t, 0.0)
        return self._query(j, t)


def _least_rs_end(model: _Model) -> np.ndarray:
    """``W[j]``: the least, over bucketings of layers ``j..L-1`` alone, of the end of their
    reduce-scatters after the stream's start ``S`` (``max_k (ready(start_k) + sum of T_rs of those
    buckets up to k)``, served from the output side): ``W[j] = min_x max(ready(j), W[x]) + T_rs(j..x-1)``,
    ``W[L] = -inf``. One vectorised pass per layer, O(L^2)."""
    L = model.L
    W = np.full(L + 1, -np.inf)
    for j in range(L - 1, -1, -1):
        x = np.arange(j + 1, L + 1)
        W[j] = float(np.min(np.maximum(model.ready[j], W[x]) + np.atleast_1d(model.rs(model.cum_n[x] - model.cum_n[j]))))
    return W


def _pareto(C: np.ndarray, block: int = 64) -> np.ndarray:
    """Rows of ``C`` (phi, c, S, M) not dominated by another (one of equal rows kept): ``x`` dominates ``y``
    when ``phi_x <= phi_y``, ``phi_x + c_x <= phi_y + c_y`` and ``S_x``, ``M_x`` exceed ``S_y``, ``M_y`` by
    at most the forward lead ``d``. Reduced block by block over the lexicographically sorted rows."""
    keys = np.stack([C[:, 0], C[:, 0] + C[:, 1], C[:, 2], C[:, 3]], axis=1)
    if len(keys) <= 1:
        return C
    order = np.lexsort(keys.T[::-1])
    keys, C = keys[order], C[order]

    def dominated(by: np.ndarray, rows: np.ndarray) -> np.ndarray:  # [row, by]
        d0 = rows[:, None, 0] - by[None, :, 0]
        d1 = rows[:, None, 1] - by[None, :, 1]
        d = np.minimum(d0, d1)
        return ((d0 >= 0) & (d1 >= 0) & (by[None, :, 2] <= rows[:, None, 2] + d)
                & (by[None, :, 3] <= rows[:, None, 3] + d))

    kept: list[np.ndarray] = []
    while len(keys):
        blk, rows = keys[:block], C[:block]
        earlier = np.arange(len(blk))[None, :] < np.arange(len(blk))[:, None]
        alive = ~np.any(dominated(blk, blk) & earlier, axis=1)
        new = blk[alive]
        kept.append(rows[alive])
        keys, C = keys[block:], C[block:]
        if len(keys):  # every later row against the block's survivors, once
            alive = ~np.any(dominated(new, keys), axis=1)
            keys, C = keys[alive], C[alive]
    return np.concatenate(kept)


def _bounds_from(nodes: list[tuple[int, int, int]], nid: int) -> list[int]:
    out = []
    while nid >= 0:
        s, e, parent = nodes[nid]
        out.append(e)
        nid = parent
        if nid < 0:
            out.append(s)
    return sorted(set(out))
