"""Tiny-scale prediction before the run: measured iteration vs the warm-up paper model and the pre-run
model with measured contention (prints figures; not a test).

    python benchmarks/bench_prerun.py [--repeats 3] [--networks loopback 100mbit] [--models tiny_resnet tiny_vgg]

Each repeat is one execution of the validation study (:func:`repro.studies.validation.run_validation`):
per network, first the contention microbenchmark (:mod:`repro.runtime.contention`: the model's forward +
backward alone and while all-reduces are in flight, on the same network and world size), then every
scheduler trains (warm-up trace, fitted cost model, plan, timed steps). Per run, three numbers: the
measured iteration (median of its timed steps), ``simulated_s`` (warm-up trace + fitted cost model,
the papers' model) and ``simulated_prerun_s`` (the same plus ``Realism(contention=c)`` with that
repeat's measured ``c``: everything known before the run starts). Printed per scheduler and network:
the median over repeats of each, and the errors of the medians (``100 * (predicted / measured - 1)``).
The emulated network needs root (otherwise it is skipped with a warning).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from repro.studies import validation
from repro.studies.common import available_cpus, is_oversubscribed

SCHEDULERS = ["wfbp", "syncea", "threshold", "mgwfbp", "optimal", "ddp"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=["tiny_resnet", "tiny_vgg"])
    ap.add_argument("--schedulers", nargs="+", default=SCHEDULERS)
    ap.add_argument("--networks", nargs="+", default=["loopback", "100mbit"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threshold-bytes", type=int, default=65536)
    ap.add_argument("--band-pct", type=float, default=10.0)
    ap.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    args = ap.parse_args()

    cpus = available_cpus()
    over = is_oversubscribed(args.world_size, cpus)
    nets = validation.usable_bandwidths(args.networks)
    print(f"Ran: {args.world_size} gloo ranks (1 compute thread each) on this machine, {cpus} CPU core(s) "
          f"({'OVERSUBSCRIBED: more ranks than cores' if over else 'not oversubscribed'}); load average at "
          f"start {os.getloadavg()[0]:.2f}; networks {', '.join(nets)}; models {', '.join(args.models)}; "
          f"{args.repeats} repeats of the validation study ({args.warmup_steps} warm-up + {args.steps} timed "
          f"steps per run, batch {args.batch_size}); contention measured on each network before its runs.\n")

    configs = [{"model": m, "scheduler": s, "batch_size": args.batch_size, "steps": args.steps,
                "warmup_steps": args.warmup_steps, "threshold_bytes": args.threshold_bytes}
               for m in args.models for s in args.schedulers]
    tmp = None if args.out else tempfile.TemporaryDirectory(prefix="bench_prerun_")
    root = Path(args.out or tmp.name)
    tables, contention = [], []
    t0 = time.perf_counter()
    for rep in range(args.repeats):
        d = root / f"repeat{rep}"
        runs = validation.run_validation(configs, nets, [args.world_size], d, overwrite=True)
        c = validation.load_contention(d)
        tables.append(validation.validation_table(runs, c).assign(repeat=rep))
        contention.append(c.assign(repeat=rep))
    wall_s = time.perf_counter() - t0
    table = pd.concat(tables, ignore_index=True)
    ctab = pd.concat(contention, ignore_index=True)

    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 500)
    print("Contention microbenchmark (per repeat and message size; slowdown = kernel with all-reduces in "
          "flight / alone - 1, median of paired repeats, mean over ranks; contention = mean over sizes weighted by all-reduce seconds):")
    cols = ["repeat", "network", "model", "bytes", "kernel_alone_s", "kernel_with_comm_s", "allreduce_s",
            "queued_allreduces", "covered", "slowdown", "contention"]
    print(ctab[cols].round(4).to_string(index=False))
    fits = ctab.groupby(["network", "model"], sort=False).contention.agg(["median", "min", "max"])
    print("\nFitted contention per network and model over repeats (median, min, max):")
    print(fits.round(3).to_string())

    agg = table.groupby(["model", "network", "scheduler"], sort=False).agg(
        measured_s=("measured_s", "median"), simulated_s=("simulated_s", "median"),
        simulated_prerun_s=("simulated_prerun_s", "median"), contention=("prerun_contention", "median"),
        repeats=("measured_s", "size"),
        measured_min_s=("measured_s", "min"), measured_max_s=("measured_s", "max"),
        trace_backward_s=("trace_backward_s", "median"),
        inrun_backward_s=("inrun_backward_s", lambda x: pd.to_numeric(x, errors="coerce").median())).reset_index()
    agg["error_pct"] = 100 * (agg.simulated_s / agg.measured_s - 1)
    agg["error_prerun_pct"] = 100 * (agg.simulated_prerun_s / agg.measured_s - 1)
    # How much slower the backward pass ran in the timed steps than in the warm-up (in-run trace vs
    # warm-up trace): the contention the run actually saw (plus the warm-up's own noise; SyncEASGD
    # overlaps nothing, so its value is noise alone). DDP keeps no trace of its own.
    agg["backward_inrun_vs_warmup_pct"] = 100 * (agg.inrun_backward_s / agg.trace_backward_s - 1)
    print(f"\nPer scheduler and network: medians over repeats (ms) and errors of the medians (%); "
          f"measured range over repeats in brackets:")
    for _, r in agg.iterrows():
        print(f"  {r.model:12s} {r.network:9s} {r.scheduler:10s} measured {1e3 * r.measured_s:7.2f} "
              f"[{1e3 * r.measured_min_s:6.2f}-{1e3 * r.measured_max_s:6.2f}]  warm-up paper model "
              f"{1e3 * r.simulated_s:7.2f} ({r.error_pct:+6.1f}%)  pre-run c={r.contention:.2f} "
              f"{1e3 * r.simulated_prerun_s:7.2f} ({r.error_prerun_pct:+6.1f}%)  backward in-run vs warm-up "
              f"{r.backward_inrun_vs_warmup_pct:+6.1f}%")
    ok = agg.error_prerun_pct.abs() <= args.band_pct
    ok_paper = agg.error_pct.abs() <= args.band_pct
    print(f"\nTotal wall time {wall_s:.0f} s; load average at end {os.getloadavg()[0]:.2f}.")
    print(f"Within {args.band_pct:g}%: pre-run {int(ok.sum())} of {len(agg)} scheduler x network cases "
          f"(warm-up paper model: {int(ok_paper.sum())} of {len(agg)}); "
          f"{args.world_size} ranks on {cpus} cores{' (oversubscribed)' if over else ''}.")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
