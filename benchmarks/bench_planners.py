"""Planner and simulator speed on this machine (prints figures; not a test).

    python benchmarks/bench_planners.py [--layers 1000] [--repeats 5] [--exact-layers 100 400 1000]
        [--exact-real resnet50 densenet201] [--time-budget 10] [--exact-repeats 5] [--exact-only]

Prints: the exact planners (``optimal``, ``omgs_optimal``, ``dear_optimal``) on random traces of
100, 400 and 1000 layers and on two shipped traces (ResNet-50, DenseNet-201), ``--exact-repeats``
runs each: median wall seconds with the least and the most, median CPU seconds, whether every plan
is a proven optimum, the largest proven gap, and the machine's load average (target, issue 23:
< 0.5 s at 1000 layers, exact; on a shared machine compare with ``taskset -c 0`` and the load);
each planner's wall time on a random L-layer
trace (exact planners excepted); simulated iterations per second (event
engine with timeline, and the closed-form recursion the planners use); wall time of the full
``mgwfbp.sim_speedup`` sweep (all shipped V100-estimate models, two networks, 4..2048 GPUs, all
planners, plus the K80 paper check); the import time of the torch-free core in a fresh interpreter
(and that it loads no torch). Targets (issue 2): optimal on 1000 layers < 1 s; sweep < 10 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd

from repro.costs.presets import preset
from repro.core.planners import make_plan, planner_names
from repro.core.simulate import simulate
from repro.studies import mgwfbp_sim as study
from repro.core.trace import Layer, Trace

MODELS = ["resnet50", "resnet152", "densenet161", "densenet201", "inception_v4", "googlenet", "vgg16",
          "bert_base", "bert_large"]
WORKERS = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]


def random_trace(layers: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    nbytes = (4 * np.exp(rng.uniform(np.log(10), np.log(5e6), layers))).astype(int)
    bwd = rng.uniform(0, 3e-3, layers)
    return Trace("random", 32, "synthetic", "float32",
                 [Layer(f"l{i}", int(n) // 4, int(n), float(b / 2), float(b)) for i, (n, b) in enumerate(zip(nbytes, bwd))])


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


EXACT = ["optimal", "omgs_optimal", "dear_optimal"]


def planner_case(name: str, workers: int | None = None) -> tuple[object, dict]:
    """The cost model and options a planner is timed with: the 10GbE fit at P = 64, except the sparse
    planners, which need the top-k cost: the 1GbE all-gather fit (P = 16 unless given), density 0.001."""
    from repro.core.planners import PLANNER_FAMILY

    if PLANNER_FAMILY[name] == "sparse":
        return preset("1gbe-allgather", workers or 16), {"density": 0.001}
    return preset("10gbe-derived", workers or 64), {}


REAL = ["resnet50", "densenet201"]  # shipped traces (V100 estimates): 161 and 402 layers


def exact_table(layers: list[int], budget_s: float, real: list[str] = (), repeats: int = 1) -> pd.DataFrame:
    """``repeats`` runs of each exact planner per trace (random traces of each size in ``layers``, then
    the shipped traces ``real``; P = 2 and 16 for the sparse one, compute- and communication-bound):
    median, least and most wall seconds and median CPU seconds (CPU: this process only, so a machine
    shared with other jobs shows in wall only; the one-minute load average is printed with the table),
    proven optimal or not (every run), the proven gap (the largest)."""
    traces = [(f"random {L}", random_trace(L)) for L in layers]
    traces += list(study.load_traces(list(real)).items()) if real else []
    rows = []
    for label, trace in traces:
        for name in EXACT:
            for workers in ((2, 16) if name == "omgs_optimal" else (None,)):
                cost, options = planner_case(name, workers)
                if name != "optimal":
                    options["time_budget_s"] = budget_s
                walls, cpus, plans = [], [], []
                for _ in range(repeats):
                    t0, c0 = time.perf_counter(), time.process_time()
                    plans.append(make_plan(name, trace, cost, **options))
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
                wall, cpu = statistics.median(walls), statistics.median(cpus)
                rows.append({"planner": name, "trace": label, "layers": trace.num_layers, "workers": cost.workers,
                             "seconds": round(wall, 3), "min_s": round(min(walls), 3), "max_s": round(max(walls), 3),
                             "cpu_s": round(cpu, 3),
                             "optimal": all(p.meta.get("optimal", True) for p in plans),
                             "gap_pct": round(max(p.meta.get("gap_pct", 0.0) for p in plans), 3),
                             "iteration_s": plans[0].meta["iteration_s"]})
                print(f"  {name:13s} {label:12s} L={trace.num_layers:5d} P={cost.workers:3d}: {wall:8.3f} s "
                      f"[{min(walls):.3f}-{max(walls):.3f}] (cpu {cpu:.3f} s), optimal={rows[-1]['optimal']}, "
                      f"gap {rows[-1]['gap_pct']}%", flush=True)
    return pd.DataFrame(rows)


def load_average() -> str:
    """The one-minute load average and the CPUs this process may run on (a shared machine's noise)."""
    try:
        load = f"{os.getloadavg()[0]:.2f}"
    except OSError:
        load = "unknown"
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return f"load average {load} on {os.cpu_count()} CPUs" + ("" if cpus is None else f", this process on CPUs {cpus}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exact-layers", type=int, nargs="+", default=[100, 400, 1000])
    ap.add_argument("--time-budget", type=float, default=10.0,
                    help="time_budget_s of dear_optimal and omgs_optimal (seconds)")
    ap.add_argument("--exact-repeats", type=int, default=5, help="runs of each exact planner per trace")
    ap.add_argument("--exact-only", action="store_true", help="only the exact planners' table")
    ap.add_argument("--exact-real", nargs="*", default=REAL,
                    help="shipped traces the exact planners also plan (default: %(default)s; none: no real trace)")
    args = ap.parse_args()

    print(f"Exact planners, median [least-most] of {args.exact_repeats} runs (budget {args.time_budget:g} s; "
          f"target < 0.5 s at 1000 layers, proven optimal); {load_average()}:")
    table = exact_table(args.exact_layers, args.time_budget, args.exact_real, args.exact_repeats)
    print(table.to_string(index=False))
    print(f"({load_average()})")
    if args.exact_only:
        return

    trace = random_trace(args.layers)
    rows = []
    for name in planner_names():
        if name in EXACT:
            continue
        cost, options = planner_case(name)
        t = timed(lambda: make_plan(name, trace, cost, **options), args.repeats)
        rows.append({"planner": name, "layers": args.layers, "median_s": round(t, 5)})
    print(f"\nPlanner wall time on a {args.layers}-layer trace (median of {args.repeats}; exact ones above):")
    print(pd.DataFrame(rows).to_string(index=False))

    r50 = study.load_traces(["resnet50"])["resnet50"]
    plan = make_plan("mgwfbp", r50, preset("10gbe-v100", 16))
    c16 = preset("10gbe-v100", 16)
    full = timed(lambda: simulate(r50, plan, c16), args.repeats)
    fast = timed(lambda: [simulate(r50, plan, c16, with_ops=False) for _ in range(100)], args.repeats) / 100
    print(f"\nSimulated iterations per second, resnet50 ({r50.num_layers} layers, {plan.num_buckets} buckets):")
    print(f"  event engine with timeline: {1 / full:10.1f} it/s")
    print(f"  closed-form recursion:      {1 / fast:10.1f} it/s")

    solvers = ["wfbp", "syncea", "threshold", "mgwfbp", "optimal"]
    t0 = time.perf_counter()
    traces = study.load_traces(MODELS)
    sweep = study.speedup_sweep(traces, ["10gbe-derived", "56gbib-derived"], WORKERS, solvers, 64 * 2**20)
    k80 = study.load_traces(["googlenet", "resnet50"], "k80-estimate")
    sweep2 = study.speedup_sweep(k80, ["10gbe-k80"], [2] + WORKERS, solvers, 64 * 2**20)
    wall = time.perf_counter() - t0
    print(f"\nFull mgwfbp.sim_speedup sweep: {len(sweep) + len(sweep2)} rows "
          f"({len(MODELS) + 2} traces x networks x P x {len(solvers)} planners + linear) in {wall:.2f} s")

    code = ("import sys, time; t = time.perf_counter(); import repro.core.trace, repro.core.cost, repro.core.plan, repro.core.planners, "
            "repro.core.simulate, repro.core.schedulers, repro.results.runs; print(time.perf_counter() - t, "
            "any(m == 'torch' or m.startswith('torch.') for m in sys.modules))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
            for _ in range(5)]
    print(f"\nImport of the torch-free core (trace, cost, plan, planners, sim, schedulers, runs), fresh interpreter: "
          f"median {1e3 * statistics.median(float(r[0]) for r in runs):.0f} ms; torch loaded: {runs[0][1]}")


if __name__ == "__main__":
    main()
