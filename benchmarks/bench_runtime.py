"""Our executors vs PyTorch's at equal buckets, in interleaved pairs with honest intervals (prints figures; not a test).

    python benchmarks/bench_runtime.py [--world-size 2] [--rounds 12] [--mode steps|runs] [--block 50] [--steps 12]
                                       [--load quiet busy] [--models tiny_resnet tiny_vgg tiny_bert]
                                       [--pairs allreduce dear sparse] [--aa] [--others]

Pairs:

- ``allreduce``: our all-reduce executor (:class:`repro.families.allreduce.executor.AllReduceExecutor`; the engine that
  ran, ``reducer`` or ``hooks``, is printed) vs PyTorch DDP with the same buckets; target ours <= 1.03x DDP.
  Two designs (``--mode``):

  - ``steps`` (the default): on each rank, ours (through :func:`repro.distribute`, given DDP's own rebuilt
    buckets as the plan, checked equal) and plain ``DistributedDataParallel`` train copies of one model side by
    side in one process, step by step in turn (A B B A ...) on the same batches, each step timed from
    ``zero_grad`` to the end of ``step()`` after a barrier; a pair is a block of ``--block`` steps of each
    (its ratio: the block's median step of ours over DDP's);
  - ``runs``: ABBA pairs of whole training runs (the real loop, :func:`repro.train.train_worker`: ``warmup``
    steps then ``steps`` timed steps, a run's time the median of its steps; ``threshold`` vs ``ddp_threshold``,
    DDP given the plan's bucket sizes through ``bucket_cap_mb_list``).

  Why ``steps`` is the default: this machine's speed drifts between runs a few seconds apart by more than the
  3% the target is about. An A/A test (``--aa``: ours against ours, where nothing differs) in ``runs`` mode gave
  pair ratios from 0.915 to 1.164 (12 pairs, tiny_resnet), so a median of 3 whole-run pairs can land at 1.06
  with no difference at all; ``runs`` at 40 pairs of 20 steps gave 1.008 (95% CI 0.967-1.065) on tiny_resnet.
  Steps taken in turn see the same drift, which cancels in their ratio: blocks of 50 steps ranged 0.95-1.04.
- ``dear``: DeAR vs PyTorch FSDP2 (``fully_shard``, scheduler ``fsdp``) at equal buckets: DeAR runs a plan
  whose buckets are FSDP's units (the parameters of each top-level child module, then the root's own);
- ``sparse``: the sparse exchange (top-k values and int32 indices of the whole gradient at ``--density``, one
  packed all-gather, :class:`repro.families.sparse.executor.AllGatherCommunicator`) vs a dense all-reduce of a buffer of
  the same bytes per rank, timed as collectives (no training), pair by pair.

Statistics: ``rounds`` pairs per model, A and B alternating in ABBA order (so that a drift of the machine
cancels); per pair the ratio A/B; printed: the median of the pair ratios, their range, and a 95% bootstrap
interval of that median (percentile bootstrap over pairs, 4000 resamples, seeded). The verdict against the
target is only given when the interval says it ("<= 1.03 shown" when the interval's upper end is <= 1.03,
"> 1.03 shown" when its lower end is above, "undecided" otherwise: more pairs needed).

``--load busy`` runs the same with another core busy: ``--busy-procs`` pure-Python busy-loop processes (default
1), each pinned to one of the last cores of this machine (with 2 cores and 2 ranks: one rank shares its core),
stopped at the end. The load average of this machine is printed before and after each model (others may be
running on it too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from repro.launch.local import launch_local
from repro.studies.mgwfbp_train import run_configs

TARGET = 1.03


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------

def bootstrap_median_ci(ratios: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``ratios`` (resampled with replacement)."""
    r = np.asarray(ratios, dtype=float)
    if r.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    meds = np.median(r[rng.integers(0, r.size, size=(resamples, r.size))], axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


MIN_PAIRS = 8  # below this the bootstrap interval of a median is not worth printing a verdict on


def verdict(lo: float, hi: float, n: int, target: float = TARGET) -> str:
    if n < MIN_PAIRS:
        return f"no verdict ({n} < {MIN_PAIRS} pairs)"
    if hi <= target:
        return f"<= {target} shown"
    if lo > target:
        return f"> {target} shown"
    return "undecided (interval holds the target: more pairs needed)"


def summary_line(label: str, a_ms: list[float], b_ms: list[float], a_name: str, b_name: str) -> str:
    ratios = [a / b for a, b in zip(a_ms, b_ms)]
    lo, hi = bootstrap_median_ci(ratios)
    return (f"  {label:12s} {a_name} {statistics.median(a_ms):8.2f} ms  {b_name} {statistics.median(b_ms):8.2f} ms  "
            f"paired ratio median {statistics.median(ratios):5.3f}  range {min(ratios):5.3f}-{max(ratios):5.3f}  "
            f"95% CI {lo:5.3f}-{hi:5.3f}  ({len(ratios)} pairs)  {verdict(lo, hi, len(ratios))}")


def abba(a: dict, b: dict, rounds: int) -> list[dict]:
    """``rounds`` pairs in ABBA order: A B, B A, A B, ..."""
    out = []
    for r in range(rounds):
        out += [a, b] if r % 2 == 0 else [b, a]
    return out


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------

# spins; checks every few million iterations that the benchmark (its parent) is alive, so that it never outlives it
_BUSY = ("import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nparent = os.getppid()\n"
         "while os.getppid() == parent:\n    for _ in range(3_000_000):\n        pass\n")


class Busy:
    """``n`` busy-loop processes, each pinned to one of the last ``n`` cores; stopped (by pid) on exit."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Busy":
        cores = sorted(os.sched_getaffinity(0))
        for i in range(self.n):
            core = cores[-1 - (i % len(cores))]
            self.procs.append(subprocess.Popen([sys.executable, "-c", _BUSY, str(core)]))
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait()


def load_avg() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


# ---------------------------------------------------------------------------------------------
# pairs
# ---------------------------------------------------------------------------------------------

def iteration_ms(summaries: list[dict], scheduler: str) -> list[float]:
    return [1e3 * s["iteration_s"] for s in summaries if s["scheduler"] == scheduler]


def allreduce_pair(model: str, common: dict, args) -> str:
    a = {"model": model, "scheduler": "threshold", **common}
    b = {"model": model, "scheduler": "threshold" if args.aa else "ddp_threshold", **common}
    order = abba(a, b, args.rounds)
    s = launch_local(run_configs, args.world_size, args=(order,), timeout_s=3600, quiet=True)[0]
    if args.aa:  # A/A: the same run twice; which is "A" is told by its place in the ABBA order
        first = [k for k, c in enumerate(order) if c is a]
        ours = [1e3 * s[k]["iteration_s"] for k in first]
        ddp = [1e3 * s[k]["iteration_s"] for k in range(len(order)) if k not in first]
        return summary_line(model, ours, ddp, "ours", "ours") + "  (A/A: the noise floor of this mode)"
    ours, ddp = iteration_ms(s, "threshold"), iteration_ms(s, "ddp_threshold")
    buckets = next(x["buckets"] for x in s if x["scheduler"] == "threshold")
    engines = "/".join(sorted({str(x.get("engine")) for x in s if x["scheduler"] == "threshold"}))
    return summary_line(model, ours, ddp, "ours", "DDP") + f"  buckets {buckets}  engine {engines}"


def interleaved_steps(ctx, model_name: str, threshold_bytes: int, steps: int, warmup: int, batch_size: int,
                      aa: bool = False) -> dict:
    """Per rank: ours (``repro.distribute`` given DDP's own buckets as a plan) and plain PyTorch DDP (one cap,
    ``threshold_bytes``: DDP's threshold plan of the order its first backward sees) on copies of one model,
    trained step by step in turn (A B B A ...) on the same batches; each step timed from zero_grad to the end
    of ``step()`` after a barrier. Returns the per-step times (ms) and whether the buckets are equal.
    ``aa``: a second copy of ours takes DDP's place (an A/A test)."""
    import copy

    import torch
    import torch.distributed as dist
    from torch import nn

    import repro
    from repro.core.plan import Plan
    from repro.families.allreduce.ddp_bridge import check_ddp_buckets, ddp_buckets
    from repro.workload.models import build_model, compute_loss, make_batch

    torch.manual_seed(0)
    base = build_model(model_name)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    batches = [make_batch(model_name, batch_size, generator=g) for _ in range(4)]
    ref = copy.deepcopy(base)
    ddp = nn.parallel.DistributedDataParallel(ref, bucket_cap_mb_list=[threshold_bytes / 2**20])
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    for x, y in batches[:2]:  # DDP rebuilds its buckets after the first backward, from the order it saw
        ddp_opt.zero_grad()
        compute_loss(model_name, ddp, x, y).backward()
        ddp_opt.step()
    names = {id(p): n for n, p in ref.named_parameters()}
    plan = Plan.from_dict({"solver": "threshold", "buckets": [[names[id(p)] for p in b] for b in ddp_buckets(ddp)]})
    check_ddp_buckets(ddp, plan)
    ours_model = copy.deepcopy(base)
    ours_model, ours_opt = repro.distribute(ours_model, torch.optim.SGD(ours_model.parameters(), lr=0.01, momentum=0.9),
                                            plan)
    runs = {"ours": (ours_model, ours_opt), "ddp": (ddp, ddp_opt)}
    if aa:  # ours against ours
        twin = copy.deepcopy(base)
        runs["ddp"] = repro.distribute(twin, torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9), plan)
    times: dict[str, list[float]] = {"ours": [], "ddp": []}
    for i in range(warmup + steps):
        x, y = batches[i % len(batches)]
        for name in (("ours", "ddp") if i % 4 in (0, 3) else ("ddp", "ours")):
            model, opt = runs[name]
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            compute_loss(model_name, model, x, y).backward()
            opt.step()
            if i >= warmup:
                times[name].append(1e3 * (time.perf_counter() - t0))
    engine = ours_opt._door.ex.engine
    ours_opt.remove()
    if aa:
        runs["ddp"][1].remove()
    return {"ours": times["ours"], "ddp": times["ddp"], "buckets": plan.num_buckets, "engine": engine}


def allreduce_steps_pair(model: str, args) -> str:
    """``--mode steps``: the pair side by side in one process, step by step; the per-step ratios are
    grouped in blocks of ``--block`` consecutive steps (a block's ratio: its median ours / its median DDP),
    and the blocks are the pairs of the summary (consecutive steps are not independent)."""
    out = launch_local(interleaved_steps, args.world_size,
                       args=(model, args.threshold_bytes, args.rounds * args.block, args.warmup_steps, args.batch_size,
                             args.aa), timeout_s=3600, quiet=True)
    # the slower rank decides each step, as in a run's summary
    ours = [max(r["ours"][i] for r in out) for i in range(len(out[0]["ours"]))]
    ddp = [max(r["ddp"][i] for r in out) for i in range(len(out[0]["ddp"]))]
    a = [statistics.median(ours[k:k + args.block]) for k in range(0, len(ours), args.block)]
    b = [statistics.median(ddp[k:k + args.block]) for k in range(0, len(ddp), args.block)]
    return (summary_line(model, a, b, "ours", "ours" if args.aa else "DDP") + f"  buckets {out[0]['buckets']}  "
            f"engine {out[0]['engine']}  (blocks of {args.block} steps)" + ("  (A/A: the noise floor of this mode)"
                                                                          if args.aa else ""))


def fsdp_units(model_name: str) -> list[list[str]]:
    """DeAR buckets (layer names) equal to FSDP's units in :class:`repro.families.baselines.fsdp.FSDPExecutor`
    (:func:`repro.families.baselines.fsdp.fsdp_units`: the top-level children, tied ones together, in forward order),
    then the root's own parameters."""
    from repro.families.baselines.fsdp import fsdp_units as units_of
    from repro.workload.layers import layer_parameters
    from repro.workload.models import build_model

    model = build_model(model_name)
    layers = layer_parameters(model, "tensor")
    order = list(layers)
    owner = {id(p): name for name, params in layers.items() for _, p in params}
    buckets, taken = [], set()
    for unit in [*units_of(model), [model]]:
        names = []
        for module in unit:
            for p in module.parameters():
                n = owner.get(id(p))
                if n is not None and n not in taken:
                    taken.add(n)
                    names.append(n)
        if names:
            buckets.append(sorted(names, key=order.index))
    return buckets


def dear_pair(model: str, common: dict, args, tmp: Path) -> str:
    from repro.core.plan import Plan

    path = tmp / f"{model}_dear_fsdp_units.json"
    plan = _dear_plan(fsdp_units(model))
    plan.save(path)
    a = {"model": model, "scheduler": "dear_threshold", "plan": str(path), **common}
    b = {"model": model, "scheduler": "fsdp", **common}
    s = launch_local(run_configs, args.world_size, args=(abba(a, b, args.rounds),), timeout_s=3600, quiet=True)[0]
    dear = [1e3 * x["iteration_s"] for x in s if x["scheduler"] != "fsdp"]
    fsdp = iteration_ms(s, "fsdp")
    return summary_line(model, dear, fsdp, "DeAR", "FSDP2") + f"  buckets {len(Plan.load(path).buckets)}"


def bytescheduler_pair(model: str, common: dict, args) -> str:
    """ByteScheduler (its planner's chunks and credit, updates layer by layer in the next forward) against
    PyTorch DDP with the threshold plan's buckets, whole runs in ABBA order: what the deferred updates
    cost or win against DDP's all-reduce at the end of backward on this machine."""
    a = {"model": model, "scheduler": "bytescheduler", **common}
    b = {"model": model, "scheduler": "ddp_threshold", **common}
    s = launch_local(run_configs, args.world_size, args=(abba(a, b, args.rounds),), timeout_s=3600, quiet=True)[0]
    return summary_line(model, iteration_ms(s, "bytescheduler"), iteration_ms(s, "ddp_threshold"), "ByteSched", "DDP")


def _dear_plan(buckets: list[list[str]]):
    """The DeAR plan of ``buckets`` (layer names), built as the dear planners build theirs."""
    from repro.families.dear.planners import DEAR_MESSAGES, FAMILY
    from repro.core.plan import Bucket, Plan

    return Plan([Bucket(tuple(b), DEAR_MESSAGES) for b in buckets], "dear_threshold", meta={}, family=FAMILY)


def sparse_exchange_times(ctx, model_name: str, density: float, rounds: int, repeats: int) -> list[tuple[float, float]]:
    """Per rank: ``rounds`` pairs (ABBA) of (sparse exchange ms, dense all-reduce ms at equal bytes), each the
    median of ``repeats`` operations (a barrier before each); then the median ms of the top-k selection and of
    the scatter-add of the gathered entries (the sparse path's computation, outside the pair)."""
    import torch
    import torch.distributed as dist

    from repro.families.sparse.executor import INDEX_DTYPE, AllGatherCommunicator, TopKCompressor
    from repro.workload.models import build_model

    torch.manual_seed(ctx.rank if hasattr(ctx, "rank") else dist.get_rank())
    n = sum(p.numel() for p in build_model(model_name).parameters())
    flat = torch.randn(n)
    comp = TopKCompressor(density)
    comm = AllGatherCommunicator()
    k = comp.count(n)
    dense = torch.zeros(2 * k, dtype=torch.float32)  # values (4 bytes) + int32 indices (4 bytes) per entry
    out = torch.zeros(n)

    values, indices = comp.compress(flat)
    assert indices.dtype == INDEX_DTYPE and values.numel() == k
    gathered = comm.finish(comm.start(values, indices, packed=True))

    def sparse_op():
        comm.finish(comm.start(values, indices, packed=True))

    def compress_op():
        comp.compress(flat)

    def scatter_op():
        out.zero_()
        out.index_add_(0, gathered[1].long(), gathered[0])

    def dense_op():
        dist.all_reduce(dense)

    def timed(op):
        ts = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            ts.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(ts)

    for op in (sparse_op, dense_op):
        for _ in range(3):
            op()
    pairs = []
    for r in range(rounds):
        if r % 2 == 0:
            s, d = timed(sparse_op), timed(dense_op)
        else:
            d, s = timed(dense_op), timed(sparse_op)
        pairs.append((s, d))
    return pairs, timed(compress_op), timed(scatter_op)


def sparse_pair(model: str, args) -> str:
    pairs, topk_ms, scatter_ms = launch_local(sparse_exchange_times, args.world_size,
                                              args=(model, args.density, args.rounds, args.sparse_repeats),
                                              timeout_s=600, quiet=True)[0]
    from repro.workload.models import build_model

    n = sum(p.numel() for p in build_model(model).parameters())
    k = max(1, int(np.ceil(args.density * n)))
    return (summary_line(model, [p[0] for p in pairs], [p[1] for p in pairs], "sparse", "dense")
            + f"  ({k} entries = {8 * k} bytes per rank, density {args.density}; outside the pair: top-k "
            f"{topk_ms:.2f} ms, scatter-add {scatter_ms:.2f} ms)")


# ---------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=12,
                    help="pairs per model (ABBA order): blocks of --block steps in --mode steps, whole runs in --mode runs")
    ap.add_argument("--steps", type=int, default=12,
                    help="--mode runs (and the dear pair): timed steps per run (a run's time: their median)")
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threshold-bytes", type=int, default=65536)
    ap.add_argument("--models", nargs="+", default=["tiny_resnet", "tiny_vgg", "tiny_bert"])
    ap.add_argument("--pairs", nargs="+", default=["allreduce"], choices=["allreduce", "dear", "bytescheduler", "sparse"])
    ap.add_argument("--mode", choices=["runs", "steps"], default="steps",
                    help="allreduce pair: ABBA pairs of whole training runs (runs), or ours (repro.distribute) and "
                         "plain DDP in one process, step by step in turn, in blocks of --block steps (steps)")
    ap.add_argument("--block", type=int, default=50, help="--mode steps: steps per block (a block is one pair)")
    ap.add_argument("--aa", action="store_true",
                    help="allreduce pair: ours against ours (an A/A test: the spread the mode shows when nothing "
                         "differs)")
    ap.add_argument("--load", nargs="+", default=["quiet"], choices=["quiet", "busy"])
    ap.add_argument("--busy-procs", type=int, default=1, help="busy-loop processes in --load busy")
    ap.add_argument("--density", type=float, default=0.01, help="top-k density of the sparse pair")
    ap.add_argument("--sparse-repeats", type=int, default=20)
    ap.add_argument("--others", action="store_true", help="also WFBP, SyncEASGD, MG-WFBP, optimal, DDP defaults")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.block < 1:
        ap.error("--rounds, --steps and --block must be positive")
    if args.aa and args.pairs != ["allreduce"]:
        ap.error("--aa applies to the allreduce pair only (--pairs allreduce)")
    common = {"steps": args.steps, "batch_size": args.batch_size, "warmup_steps": args.warmup_steps,
              "compute_steps": 0, "quiet": True, "threshold_bytes": args.threshold_bytes}

    design = (f"all-reduce pair: --mode steps, ours and DDP side by side in one process, a pair = a block of {args.block} "
              "steps of each" if args.mode == "steps" else
              f"all-reduce pair: --mode runs, a pair = two whole runs of {args.steps} timed steps (a run: median step)")
    print(f"World size {args.world_size} (gloo, 1 thread per rank), {os.cpu_count()} cores; {args.rounds} pairs per "
          f"model in ABBA order; ratio A/B per pair; {design}.")
    with tempfile.TemporaryDirectory() as tmp:
        for load in args.load:
            with (Busy(args.busy_procs) if load == "busy" else _Nothing()):
                extra = f", {args.busy_procs} busy-loop process(es) pinned to the last core(s)" if load == "busy" else ""
                print(f"\n=== load: {load}{extra}")
                for pair in args.pairs:
                    print({"allreduce": f"Ours vs DDP, identical buckets (threshold plan, {args.threshold_bytes} bytes):",
                           "dear": "DeAR vs FSDP2 (fully_shard), buckets = FSDP's units:",
                           "bytescheduler": f"ByteScheduler vs DDP (threshold plan, {args.threshold_bytes} bytes), "
                                            "whole runs:",
                           "sparse": "Sparse exchange (packed all-gather of top-k values + int32 indices) vs dense "
                                     "all-reduce of the same bytes per rank:"}[pair])
                    for model in args.models:
                        before = load_avg()
                        if pair == "allreduce":
                            line = (allreduce_steps_pair(model, args) if args.mode == "steps"
                                    else allreduce_pair(model, common, args))
                        elif pair == "dear":
                            line = dear_pair(model, common, args, Path(tmp))
                        elif pair == "bytescheduler":
                            line = bytescheduler_pair(model, common, args)
                        else:
                            line = sparse_pair(model, args)
                        print(f"{line}   [{before} -> {load_avg()}]", flush=True)
                if args.others:
                    _others(args, common)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _others(args, common: dict) -> None:
    """WFBP, SyncEASGD, MG-WFBP, optimal and DDP's defaults side by side (interleaved; medians, ms)."""
    import pandas as pd

    names = ["wfbp", "syncea", "threshold", "mgwfbp", "optimal", "ddp", "ddp_threshold"]
    rows = []
    for model in args.models:
        configs = []
        for r in range(args.rounds):
            batch = [{"model": model, "scheduler": s, **common} for s in names]
            configs += batch if r % 2 == 0 else batch[::-1]
        for s in launch_local(run_configs, args.world_size, args=(configs,), timeout_s=3600, quiet=True)[0]:
            rows.append({"model": model, "scheduler": s["scheduler"], "ms": 1e3 * s["iteration_s"]})
    table = pd.DataFrame(rows).groupby(["model", "scheduler"])["ms"].median().unstack("scheduler")[names]
    print("\nAll schedulers (median ms per iteration):")
    print(table.round(2).to_string())


if __name__ == "__main__":
    main()
