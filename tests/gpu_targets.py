"""Bodies of the extra checks of ``scripts/gpu_check.py`` (its part 4), one process each there.

Like the bodies in tests/test_gpu.py they are functions of ``(device, backend)``, so the same code runs
on a CPU with gloo (tests/test_gpu_check.py does, for the cheap ones); the script runs them on
``cuda:0``. Module-level, so that the ranks :func:`repro.launch.local.launch_local` spawns can import
them. Every function returns a JSON-able dict of numbers and verdicts; none asserts: the script reports.

- :func:`sparse_timeline_matches_sgd`: the sparse executor (TopK-SGD's one bucket, an OMGS-style merge)
  at density 1 with ``record_timeline=True`` at world size 1 against plain SGD;
- :func:`two_ranks_per_family`: two ranks sharing one device over gloo, one short run per scheduler
  through ``repro.distribute`` (planned online on the live group);
- :func:`fp16_scaler_vs_ddp`: float16 autocast with a GradScaler through ``repro.distribute`` against
  PyTorch DDP at world size 1.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from tests.test_clock import LAYERS, MLP
from tests.test_gpu import _batches, _max_diff, _plan_for, _sgd, one_rank

#: the schedulers of check (b): one per family (all-reduce, sparse, DeAR, ByteScheduler, parameter server)
FAMILY_SCHEDULERS = ("mgwfbp", "topk_single", "dear_threshold", "bytescheduler", "ps_bsp")


def _one_line(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# (a) the sparse executor with its timeline recorded, at world size 1
# ---------------------------------------------------------------------------------------------

def _sparse_plans() -> dict:
    """Density-1 sparse plans of MLP (module view): TopK-SGD's single bucket and an OMGS-style merge."""
    from repro.core.plan import Plan

    backward = LAYERS[::-1]
    buckets = {"topk_single": [backward], "omgs": [backward[:1], backward[1:]]}
    return {name: Plan.from_dict({"family": "sparse", "solver": name, "options": {"density": 1.0},
                                  "buckets": [{"layers": b, "messages": ["sparse_allgather"]} for b in bs]})
            for name, bs in buckets.items()}


def _timeline_ok(row: dict) -> bool:
    """A sparse bucket's timeline row is complete and in order: compression start <= its end <= launch
    <= end of the exchange (seconds; NaN anywhere is not)."""
    keys = ("compress_start_s", "compress_end_s", "start_s", "end_s")
    values = [row.get(k, float("nan")) for k in keys]
    return all(isinstance(v, float) and math.isfinite(v) for v in values) and values == sorted(values)


def sparse_timeline_matches_sgd(device: str = "cuda", backend: str = "nccl", steps: int = 4) -> dict:
    """Per plan (``topk_single``, ``omgs``): the largest parameter difference (absolute) against plain SGD
    after ``steps`` steps at density 1 with ``record_timeline=True``, the last step's timeline rows
    (seconds after the first bucket's compression started) and whether each is complete and ordered."""
    from repro.runtime.executor import ExecutorOptions
    from repro.families.sparse.executor import SparseExecutor

    dev = torch.device(device, 0) if device == "cuda" else torch.device(device)
    out = {}
    with tempfile.TemporaryDirectory() as tmp, one_rank(backend, dev, Path(tmp) / "store"):
        for name, plan in _sparse_plans().items():
            torch.manual_seed(0)
            model = MLP().to(dev)
            ref = copy.deepcopy(model)
            ex = SparseExecutor(model, plan, ExecutorOptions(view="module", record_timeline=True))
            try:
                opt = ex.wrap_optimizer(_sgd(model.parameters()))
                ref_opt = _sgd(ref.parameters())
                rows = []
                for x, y in _batches(dev, steps):
                    opt.zero_grad()
                    ex.before_forward()
                    nn.functional.cross_entropy(ex.module(x), y).backward()
                    ex.after_backward()
                    opt.step()
                    origin = min(t.compress_start_s for t in ex.timings)
                    rows = [t.row(origin) for t in ex.timings]
                    ref_opt.zero_grad()
                    nn.functional.cross_entropy(ref(x), y).backward()
                    ref_opt.step()
                ex.flush()
            finally:
                ex.remove()
            out[name] = {"diff": _max_diff(model, ref), "buckets": plan.num_buckets,
                         "timeline_ok": all(_timeline_ok(r) for r in rows),
                         "rows": [{k: r[k] for k in ("bucket", "layers", "compress_start_s", "compress_end_s",
                                                     "start_s", "end_s") if k in r} for r in rows]}
    return out


# ---------------------------------------------------------------------------------------------
# (b) two ranks sharing one device over gloo, one run per family
# ---------------------------------------------------------------------------------------------

def _rank_run(ctx, scheduler: str, device: str, steps: int, warmup_steps: int) -> dict:
    """One rank of :func:`two_ranks_per_family`: MLP on ``device`` (every rank on the same one), its own
    data, ``steps`` steps through ``repro.distribute(scheduler)``; the losses and the final parameters."""
    import repro

    dev = torch.device(device, 0) if device == "cuda" else torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    net = MLP().to(dev)
    start = [p.detach().clone() for p in net.parameters()]
    model, opt = repro.distribute(net, _sgd(net.parameters()), scheduler=scheduler, view="module",
                                  warmup_steps=warmup_steps, fit_repeats=2)
    losses = []
    try:
        g = torch.Generator().manual_seed(100 + ctx.rank)
        for _ in range(steps):
            x, y = torch.randn(8, 6, generator=g).to(dev), torch.randint(0, 3, (8,), generator=g).to(dev)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        opt.flush()
        moved = max(float((p.detach() - s).abs().max()) for p, s in zip(net.parameters(), start))
        return {"losses": losses, "moved": moved, "finite": _finite(net),
                "params": [p.detach().cpu() for p in net.parameters()],
                "plan": None if opt.plan is None else opt.plan.family}
    finally:
        opt.remove()


def two_ranks_per_family(device: str = "cuda", schedulers=FAMILY_SCHEDULERS, steps: int = 5,
                         warmup_steps: int = 2, timeout_s: float = 40.0, budget_s: float | None = None) -> dict:
    """Per scheduler: two gloo ranks on ``device`` (one GPU shared), ``steps`` steps through
    ``repro.distribute`` (the first ``warmup_steps`` the warm-up, then the plan made online); whether it
    trains (every loss and parameter finite, parameters moved, the two replicas equal within 1e-5) or is
    refused in one line (``refused``: a family that cannot hand CUDA tensors to gloo, ``Family.gloo_cpu_only``),
    the largest parameter difference between the ranks, the plan's family, seconds, or the one-line
    error. A launch is given ``timeout_s`` seconds, and no more than what is left of ``budget_s`` (all
    launches together; None: no bound), so that the function returns every family's outcome before a
    caller's limit; a family with under 5 s left is reported as not run."""
    from repro.launch.local import launch_local

    start = time.perf_counter()
    out = {}
    for scheduler in schedulers:
        t0 = time.perf_counter()
        limit = timeout_s if budget_s is None else min(timeout_s, budget_s - (t0 - start))
        if limit < 5:
            out[scheduler] = {"trains": False, "error": "not run: out of time", "seconds": 0.0}
            continue
        try:
            ranks = launch_local(_rank_run, 2, args=(scheduler, device, steps, warmup_steps), backend="gloo",
                                 timeout_s=limit, pg_timeout_s=min(30.0, limit), quiet=True)
        except Exception as e:  # noqa: BLE001 - whatever a family raises is reported, the others still run
            error = _one_line(e)  # a family that cannot hand CUDA tensors to gloo is refused in one line: expected
            out[scheduler] = {"trains": False, "refused": "cannot train a CUDA model over gloo" in error,
                              "error": error, "seconds": time.perf_counter() - t0}
            continue
        spread = max(float((a - b).abs().max()) for a, b in zip(ranks[0]["params"], ranks[1]["params"]))
        finite = all(r["finite"] and all(math.isfinite(v) for v in r["losses"]) for r in ranks)
        trains = finite and min(r["moved"] for r in ranks) > 0 and spread < 1e-5
        out[scheduler] = {"trains": trains, "rank_spread": spread, "finite": finite,
                          "moved": min(r["moved"] for r in ranks), "plan": ranks[0]["plan"],
                          "losses": ranks[0]["losses"], "seconds": time.perf_counter() - t0,
                          "error": None if trains else "did not train: " + (
                              "non-finite loss or parameter" if not finite else
                              "parameters did not move" if min(r["moved"] for r in ranks) == 0 else
                              f"replicas differ by {spread:.3g}")}
    return out


# ---------------------------------------------------------------------------------------------
# (c) float16 + GradScaler through repro.distribute against DDP, world size 1
# ---------------------------------------------------------------------------------------------

def _scaled_loop(model: nn.Module, opt, scaler, data, device: torch.device, inf_step: int | None) -> list[float]:
    """float16 autocast forward, scaled backward, ``scaler.step``; an inf loss at ``inf_step``. The scales."""
    scales = []
    for i, (x, y) in enumerate(data):
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        if i == inf_step:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
    return scales


def fp16_scaler_vs_ddp(device: str = "cuda", backend: str = "nccl", schedulers=("mgwfbp", "dear_threshold",
                       "bytescheduler"), steps: int = 6, inf_step: int | None = 2) -> dict:
    """Per scheduler (its plan for the model's trace measured here): float16 autocast + GradScaler through
    ``repro.distribute`` and through ``DistributedDataParallel`` on the same data, world size 1; the
    largest parameter difference (absolute), whether the scales agreed step by step (an inf loss at
    ``inf_step`` is skipped by both), and whether every parameter is finite."""
    import repro
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device(device, 0) if device == "cuda" else torch.device(device)
    out = {}
    with tempfile.TemporaryDirectory() as tmp, one_rank(backend, dev, Path(tmp) / "store"):
        data = _batches(dev, steps)
        for scheduler in schedulers:
            torch.manual_seed(0)
            net = MLP().to(dev)
            ref = copy.deepcopy(net)
            plan = _plan_for(scheduler, net, *data[0])

            def new_scaler():
                return torch.amp.GradScaler(dev.type, init_scale=2.0 ** 12, growth_interval=2)

            scaler = new_scaler()
            model, dopt = repro.distribute(net, _sgd(net.parameters()), scheduler=plan, grad_scaler=scaler)
            try:
                scales = _scaled_loop(model, dopt, scaler, data, dev, inf_step)
                dopt.flush()
            finally:
                dopt.remove()
            ddp = DDP(ref, device_ids=[dev.index] if dev.type == "cuda" else None)
            ref_scales = _scaled_loop(ddp, _sgd(ddp.parameters()), new_scaler(), data, dev, inf_step)
            out[scheduler] = {"diff": _max_diff(net, ref), "scales_equal": scales == ref_scales,
                              "scales": scales, "finite": _finite(net) and _finite(ref),
                              "family": plan.family}
    return out
