"""Our bucketed all-reduce runtime vs PyTorch DDP with identical buckets (prints figures; not a test).

    python benchmarks/bench_runtime.py [--world-size 2] [--rounds 5] [--steps 20] [--models tiny_resnet tiny_vgg]

For each model, one local world runs ``threshold`` (our runtime) and ``ddp_threshold`` (DDP given the same
plan's bucket sizes through ``bucket_cap_mb_list``) in pairs, ``rounds`` pairs in ABBA order (so that
drift of the machine cancels), and prints the median of the per-pair ratios of their median iteration
times with the range over pairs (target: ours <= 1.03x DDP), and the ratio of the medians. Then WFBP,
SyncEASGD, MG-WFBP, optimal and DDP's defaults side by side, also interleaved.
"""

from __future__ import annotations

import argparse
import statistics

import pandas as pd

from repro.cluster.local import launch_local
from repro.studies.mgwfbp_train import run_configs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threshold-bytes", type=int, default=65536)
    ap.add_argument("--models", nargs="+", default=["tiny_resnet", "tiny_vgg", "tiny_bert"])
    args = ap.parse_args()
    common = {"steps": args.steps, "batch_size": args.batch_size, "warmup_steps": 3, "compute_steps": 0,
              "quiet": True, "threshold_bytes": args.threshold_bytes}

    rows, pair_ratios = [], {}
    for model in args.models:
        pair = [{"model": model, "scheduler": s, **common} for s in ("threshold", "ddp_threshold")]
        others = [{"model": model, "scheduler": s, **common} for s in ("wfbp", "syncea", "mgwfbp", "optimal", "ddp")]
        configs = []
        for r in range(args.rounds):
            configs += (pair if r % 2 == 0 else pair[::-1]) + others
        summaries = launch_local(run_configs, args.world_size, args=(configs,), timeout_s=3600, quiet=True)[0]
        for s in summaries:
            rows.append({"model": model, "scheduler": s["scheduler"], "iteration_s": s["iteration_s"],
                         "buckets": s["buckets"]})
        ours = [s["iteration_s"] for s in summaries if s["scheduler"] == "threshold"]
        ddp = [s["iteration_s"] for s in summaries if s["scheduler"] == "ddp_threshold"]
        pair_ratios[model] = [a / b for a, b in zip(ours, ddp)]
    df = pd.DataFrame(rows)
    med = df.groupby(["model", "scheduler"]).agg(median_ms=("iteration_s", lambda x: 1e3 * statistics.median(x)),
                                                  runs=("iteration_s", "size"), buckets=("buckets", "first"))
    print(f"World size {args.world_size} (gloo, 1 thread per rank), {args.rounds} interleaved runs of "
          f"{args.steps} steps each; median of per-run medians.\n")
    print("Ours vs DDP with identical buckets (threshold plan, "
          f"{args.threshold_bytes} bytes):")
    for model in args.models:
        ours = med.loc[(model, "threshold"), "median_ms"]
        ddp = med.loc[(model, "ddp_threshold"), "median_ms"]
        pr = pair_ratios[model]
        print(f"  {model:12s} ours {ours:8.2f} ms   DDP {ddp:8.2f} ms   ratio of medians {ours / ddp:5.3f}   "
              f"paired ratio median {statistics.median(pr):5.3f} (range {min(pr):5.3f}-{max(pr):5.3f}, "
              f"{len(pr)} pairs)   buckets {int(med.loc[(model, 'threshold'), 'buckets'])}")
    print("\nAll schedulers (ms per iteration):")
    table = med["median_ms"].unstack("scheduler")[["wfbp", "syncea", "threshold", "mgwfbp", "optimal", "ddp", "ddp_threshold"]]
    print(table.round(2).to_string())


if __name__ == "__main__":
    main()
