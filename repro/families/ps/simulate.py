"""A parameter-server cluster over several iterations: BSP, ASP, SSP(s) and OSP's two stages (as
interpreted in ``docs/interpretations.md``).

N workers, S shards; each shard has one push and one pull queue (a message at a time, ``line(b)``
seconds) and one optimizer queue; workers' links are not a bottleneck. The steady-state period is the
mean, over workers, of the interval between their compute starts from iteration ``warmup`` on.
Per-mode rules: docs/design/families.md. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from repro.core.engine import Op, Task, run_tasks
from repro.core.sim_result import SimGraph

__all__ = ["MODES", "PSSetting", "PSResult", "ps_tasks", "simulate_ps", "auto_stage2_share", "trace_compute_s",
           "plan_layout", "plan_setting", "check_buckets", "build_graph"]

MODES = ("bsp", "asp", "ssp", "osp")


@dataclass(frozen=True)
class PSSetting:
    """How the cluster synchronises. ``staleness``: SSP's bound s (iterations a worker may run ahead
    of the slowest); ``stage1_share``: OSP's fraction of the gradient bytes synchronised in stage 1."""

    workers: int
    servers: int = 1
    mode: str = "bsp"
    staleness: int = 0
    stage1_share: float = 1.0
    iterations: int = 8
    warmup: int = 2

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown synchronisation mode '{self.mode}'; choose one of {', '.join(MODES)}")
        for name, low in (("workers", 1), ("servers", 1), ("staleness", 0), ("warmup", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if not 0.0 <= self.stage1_share <= 1.0:
            raise ValueError(f"stage1_share must be in [0, 1], got {self.stage1_share!r}")
        if self.iterations < self.warmup + 2:
            raise ValueError(f"iterations must exceed warmup + 1 ({self.warmup + 1}), got {self.iterations}")


@dataclass(frozen=True)
class PSResult:
    """Steady-state seconds per iteration (``period_s``), the timeline, and each compute's task index."""

    period_s: float
    ops: list[Op]
    compute_task: list[list[int]]   # [worker][iteration] -> task index

    def compute_starts_s(self) -> np.ndarray:
        return np.array([[self.ops[t].start_s for t in row] for row in self.compute_task])


def ps_tasks(compute_s: Sequence[float], grad_bytes: float, push: Callable[[float], float],
             pull: Callable[[float], float], setting: PSSetting, update_s: float = 0.0,
             lgp_s: float = 0.0, stage_bytes: Sequence[Sequence[float]] | None = None
             ) -> tuple[list[Task], list[list[int]]]:
    """The task graph of ``setting.iterations`` iterations and the compute task of every worker and
    iteration (seconds: ``compute_s[w]``, ``push``/``pull`` of a message, ``update_s`` of the model).
    ``stage_bytes``: bytes per shard of stage 1 and 2 (default: ``stage1_share`` split evenly)."""
    N, S, M = setting.workers, setting.servers, setting.iterations
    if len(compute_s) != N:
        raise ValueError(f"compute_s has {len(compute_s)} entries for {N} workers")
    mode = setting.mode
    r = setting.stage1_share if mode == "osp" else 1.0
    if stage_bytes is None:
        shares = [r] + ([1.0 - r] if mode == "osp" and r < 1.0 else [])
        stage_bytes = [[grad_bytes * share / S] * S for share in shares]
    if len(stage_bytes) not in (1, 2) or any(len(row) != S for row in stage_bytes):
        raise ValueError(f"stage_bytes must hold 1 or 2 stages of {S} shard sizes")
    if mode != "osp" and len(stage_bytes) == 2 and any(stage_bytes[1]):
        raise ValueError(f"only OSP has a second stage, not '{mode}'")
    stages = list(enumerate(stage_bytes))
    tasks: list[Task] = []
    compute = [[0] * M for _ in range(N)]
    pulls: dict[tuple[int, int, int], list[int]] = {}    # (stage, worker, iteration) -> pull tasks
    applied: dict[tuple[int, int], list[int]] = {}       # (worker, iteration) -> update tasks applying it

    def add(t: Task) -> int:
        tasks.append(t)
        return len(tasks) - 1

    for i in range(M):
        for w in range(N):
            deps: list[int] = []
            if i:
                deps += pulls.get((0, w, i - 1), [])      # (empty for OSP with nothing in stage 1)
                deps += pulls.get((1, w, i - 2), [])      # OSP: stage 2 one step stale
            if mode == "ssp" and i - setting.staleness - 1 >= 0:
                deps += [t for v in range(N) if v != w for t in applied[(v, i - setting.staleness - 1)]]
            if mode == "osp" and lgp_s and i:
                compute_dep = add(Task(f"worker{w}", "lgp", f"w{w} i{i}", lgp_s, deps=tuple(deps)))
                deps = [compute_dep]
            compute[w][i] = add(Task(f"worker{w}", "compute", f"w{w} i{i}", float(compute_s[w]), deps=tuple(deps)))
        for stage, shard_bytes in stages:
            kind = "" if len(stages) == 1 else f"_stage{stage + 1}"
            for s in range(S):
                nbytes = shard_bytes[s]
                if nbytes <= 0.0:
                    continue
                pushed = [add(Task(f"server{s}.in", "push" + kind, f"w{w} i{i}", push(nbytes),
                                   deps=(compute[w][i],), priority=float(stage))) for w in range(N)]
                upd = update_s * nbytes / grad_bytes if grad_bytes > 0 else 0.0
                if mode in ("asp", "ssp"):
                    updates = [add(Task(f"server{s}.cpu", "update", f"w{w} i{i}", upd, deps=(pushed[w],)))
                               for w in range(N)]
                else:
                    u = add(Task(f"server{s}.cpu", "update" + kind, f"i{i}", upd,
                                 deps=tuple(pushed), priority=float(stage)))
                    updates = [u] * N
                for w in range(N):
                    applied.setdefault((w, i), []).append(updates[w])
                    p = add(Task(f"server{s}.out", "pull" + kind, f"w{w} i{i}", pull(nbytes),
                                 deps=(updates[w],), priority=float(stage)))
                    pulls.setdefault((stage, w, i), []).append(p)
    return tasks, compute


def simulate_ps(compute_s: Sequence[float], grad_bytes: float, push: Callable[[float], float],
                pull: Callable[[float], float], setting: PSSetting, update_s: float = 0.0,
                lgp_s: float = 0.0) -> PSResult:
    """Run :func:`ps_tasks` on the event engine; the period is the mean over workers of the interval
    between compute starts, from iteration ``setting.warmup`` to the last."""
    tasks, compute = ps_tasks(compute_s, grad_bytes, push, pull, setting, update_s, lgp_s)
    ops = run_tasks(tasks, frozenset(f"worker{w}" for w in range(setting.workers)))
    return PSResult(_period(ops, compute, setting), ops, compute)


def _period(ops: list[Op], compute: list[list[int]], setting: PSSetting) -> float:
    """The mean over workers of the interval between compute starts, from iteration ``warmup`` to the last."""
    first, last = setting.warmup, setting.iterations - 1
    return float(np.mean([(ops[row[last]].start_s - ops[row[first]].start_s) / (last - first) for row in compute]))


def auto_stage2_share(compute_s: float, grad_bytes: float, push: Callable[[float], float],
                      pull: Callable[[float], float], workers: int, servers: int = 1,
                      resolution: float = 1e-3) -> float:
    """OSP's automatic split (this package's rule, docs/osp.md): the largest stage-2 share ``x`` whose
    traffic hides behind the next computation, ``N * (push(x n / S) + pull(x n / S)) <= compute_s``
    (conservative: the link is full duplex), bisected to ``resolution``; 0 or 1 at the ends."""
    def fits(x: float) -> bool:
        b = x * grad_bytes / servers
        return workers * (push(b) + pull(b)) <= compute_s

    if fits(1.0):
        return 1.0
    if not fits(resolution):
        return 0.0
    lo, hi = resolution, 1.0
    while hi - lo > resolution:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def trace_compute_s(trace) -> float:
    """One worker's computation per iteration: forward, backward and the measured pre-forward and
    straggler overheads (the optimizer runs on the servers)."""
    o = trace.overheads
    return float(trace.total_forward_s + trace.total_backward_s + o.pre_forward_s + o.straggler_s)


def check_buckets(buckets) -> None:
    """Every PS bucket sends one ``push`` then one ``pull``, both in phase ``backward`` (stage 1,
    blocking) or ``background`` (stage 2, overlapped)."""
    for i, b in enumerate(buckets):
        kinds = [m.collective for m in b.messages]
        phases = {m.phase for m in b.messages}
        if kinds != ["push", "pull"] or len(phases) != 1 or not phases <= {"backward", "background"}:
            raise ValueError(f"bucket {i}: a parameter-server bucket sends a push then a pull in one phase "
                             f"(backward: stage 1; background: stage 2), got {kinds} in {sorted(phases)}")
        if b.piece is not None:
            raise ValueError(f"bucket {i}: parameter-server buckets carry whole layers, not pieces")


def plan_layout(plan) -> list[tuple[int, int]]:
    """(stage 1 or 2, server shard) of every bucket of a PS plan, checked against its options."""
    from repro.core.plan import PlanError

    servers = plan.option("servers")
    owners = plan.option("bucket_servers")
    if owners is None or len(owners) != plan.num_buckets:
        raise PlanError(f"a parameter-server plan names the server of each of its {plan.num_buckets} buckets in "
                        f"option 'bucket_servers', got {owners!r}")
    if any(s >= servers for s in owners):
        raise PlanError(f"option 'bucket_servers' names a server >= servers={servers}: {list(owners)}")
    stages = [1 if b.messages[0].phase == "backward" else 2 for b in plan.buckets]
    if plan.option("mode") != "osp" and 2 in stages:
        raise PlanError(f"only OSP plans have stage-2 (background) buckets, not mode '{plan.option('mode')}'")
    seen = set()
    for key in zip(stages, owners):
        if key in seen:
            raise PlanError(f"a parameter-server plan has one bucket per (stage, server), got two for {key}")
        seen.add(key)
    return list(zip(stages, owners))


def plan_setting(plan, workers: int, iterations: int = 8, warmup: int = 2) -> PSSetting:
    """The :class:`PSSetting` of a PS plan for ``workers`` workers."""
    return PSSetting(workers, plan.option("servers"), plan.option("mode"), plan.option("staleness", 0),
                     iterations=iterations, warmup=warmup)


def build_graph(trace, plan, cost, iterations: int = 8, warmup: int = 2) -> SimGraph:
    """The event-engine graph of a PS plan: ``cost.workers`` identical workers, each bucket's push and
    pull on its shard's link, the optimizer (``update_s`` split by bytes) on the shard, LGP the stage-2
    share of one update on the worker. The iteration time is the steady-state period."""
    layout = plan_layout(plan)
    setting = plan_setting(plan, cost.workers, iterations, warmup)
    nbytes = plan.bucket_bytes(trace)
    stage_bytes = [[0.0] * setting.servers for _ in range(2)]
    for (stage, s), b in zip(layout, nbytes):
        stage_bytes[stage - 1][s] += float(b)
    if setting.mode != "osp":
        stage_bytes = stage_bytes[:1]
    total = float(sum(nbytes))
    stage2 = sum(stage_bytes[1]) / total if len(stage_bytes) == 2 and total else 0.0
    update_s = trace.overheads.update_s
    lgp_s = update_s * stage2 if setting.mode == "osp" and plan.option("lgp", True) else 0.0
    compute = trace_compute_s(trace)
    push, pull = cost.line("push"), cost.line("pull")
    tasks, comp = ps_tasks([compute] * setting.workers, total, push, pull, setting, update_s, lgp_s,
                           stage_bytes=stage_bytes)
    comm = sum(push(b) + pull(b) for b in nbytes)
    o = trace.overheads
    return SimGraph(tasks, frozenset(f"worker{w}" for w in range(setting.workers)),
                    forward_s=trace.total_forward_s + o.pre_forward_s,
                    backward_s=trace.total_backward_s + o.straggler_s, comm_s=float(comm),
                    iteration_s=lambda ops: _period(ops, comp, setting))
