"""DeAR and its baselines, simulated at the paper's scale and measured on this machine (prints tables;
not a test).

    python benchmarks/bench_dear.py [--models tiny_resnet] [--bandwidth 100mbit] [--steps 10]
        [--world-size 2] [--bo-trials 8] [--no-measure]

1. **Simulated, paper setting**: 64 workers on the DeAR authors' 10GbE and InfiniBand all-reduce fits
   (presets ``10gbe-dear64`` / ``56gbib-dear64``; reduce-scatter and all-gather are their ring halves),
   V100 roofline-estimate traces of the paper's five models at its batch sizes. Seconds per iteration
   of every scheduler and DeAR's speedup over the best baseline, beside the paper's claim (up to 83% on
   10GbE and 15% on 100Gb IB, measured on its testbed).
2. **Measured on an emulated network**: ``--world-size`` gloo ranks, each in its own network namespace
   behind a link of ``--bandwidth`` (needs root; loopback otherwise, say so), tiny models, every
   scheduler as ``repro train`` runs it, the simulator's prediction beside each measurement
   (:func:`repro.studies.dear_train.throughput_table`).
3. **Buffer-size tuning**: a measured sweep of DeAR's fusion threshold, then one ``dear_bo`` run;
   the number of trials BO needed to come within 5% of the sweep's best, and where the model-based
   planner (``dear_model``) lands.

The primitives (ring reduce-scatter / all-gather vs all-reduce) are ``benchmarks/bench_primitives.py``.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import numpy as np
import pandas as pd

from repro.costs.presets import preset
from repro.core.planners import make_plan
from repro.core.trace import load_trace

PAPER_MODELS = [("resnet50", 64), ("densenet201", 32), ("inception_v4", 64), ("bert_base", 64), ("bert_large", 32)]
BASELINES_NOFUSION = ["wfbp", "bytescheduler"]
BASELINES_FUSION = ["horovod", "ddp_buckets", "mgwfbp", "optimal"]   # optimal: the all-reduce family's exact optimum
DEAR = ["dear_nofusion", "dear_threshold", "dear_model", "dear_optimal"]
PAPER_CLAIM = {"10gbe-dear64": 0.83, "56gbib-dear64": 0.15}


def simulated_paper_table(models: list[str] | None = None) -> pd.DataFrame:
    rows = []
    for model, batch in PAPER_MODELS:
        if models is not None and model not in models:
            continue
        trace = load_trace(f"{model}_b{batch}_v100-estimate")
        for net in PAPER_CLAIM:
            cost = preset(net, 64)
            row = {"model": model, "batch": batch, "network": net}
            for s in BASELINES_NOFUSION + BASELINES_FUSION + DEAR:
                row[s] = make_plan(s, trace, cost).meta["iteration_s"] * 1e3
            best_base = min(row[s] for s in BASELINES_NOFUSION + BASELINES_FUSION)
            best_dear = min(row[s] for s in DEAR)
            row["dear_speedup_vs_best_baseline"] = best_base / best_dear - 1
            row["paper_claim_up_to"] = PAPER_CLAIM[net]
            rows.append(row)
    return pd.DataFrame(rows)


def measured_tables(models, world_size, bandwidth, steps, bo_trials, thresholds) -> tuple[pd.DataFrame, ...]:
    from repro.studies import dear_train

    with tempfile.TemporaryDirectory() as tmp:
        configs = dear_train.throughput_configs(models, dear_train.ALL_SCHEDULERS, world_size, bandwidth, steps=steps)
        sweep = dear_train.buffer_sweep_configs(models[0], thresholds, world_size, bandwidth, steps=steps)
        # the tuner searches the sweep's range: 7 steps for the initial threshold, 7 per trial
        tune = dear_train.tuning_configs(models[0], world_size, bandwidth, steps=7 * (bo_trials + 1) + 1,
                                         trials=bo_trials, bounds_bytes=(min(thresholds), max(thresholds)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dear_train.run_grid(configs + sweep + tune, [world_size], tmp, emulate_bandwidth=bandwidth)
        return (dear_train.throughput_table(tmp), dear_train.buffer_sweep_table(tmp), dear_train.tuning_table(tmp))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny_resnet"])
    ap.add_argument("--bandwidth", default="100mbit", help="emulated link rate (tc style); 'none' for loopback "
                    "(at 100 Mbit/s a tiny model's exchange rivals its computation; at 1 Gbit/s only start-ups show)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bo-trials", type=int, default=8, help="Bayesian-optimisation trials of the dear_bo run")
    ap.add_argument("--thresholds-bytes", nargs="+", type=int,
                    default=[8192, 32768, 131072, 524288],
                    help="measured buffer sweep, bytes (tiny_resnet has 0.3 MB of gradients); the tuner searches its range")
    ap.add_argument("--paper-models", nargs="+", default=[m for m, _ in PAPER_MODELS],
                    help="models of the simulated paper-scale table")
    ap.add_argument("--no-measure", action="store_true")
    args = ap.parse_args()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)

    print("== 1. Simulated at the paper's setting: 64 workers, the DeAR authors' fits, V100 roofline-estimate "
          "traces; milliseconds per iteration ==")
    print(simulated_paper_table(args.paper_models).round(3).to_string(index=False))
    if args.no_measure:
        return
    bandwidth = None if args.bandwidth == "none" else args.bandwidth
    if bandwidth:
        from repro.launch.netns import EmulationUnavailableError, check_emulation_available

        try:
            check_emulation_available()
        except EmulationUnavailableError as e:
            print(f"(no emulated network: {e}; measuring on loopback)")
            bandwidth = None
    where = f"emulated {bandwidth} links" if bandwidth else "loopback"
    thr, sweep, tuning = measured_tables(args.models, args.world_size, bandwidth, args.steps, args.bo_trials,
                                         args.thresholds_bytes)
    print(f"\n== 2. Measured: {args.world_size} gloo ranks on {where}, 1 thread each; seconds per iteration "
          "(median of the timed steps, slowest rank) and the simulator's predictions ==")
    cols = ["model", "scheduler", "buckets", "iteration_s", "compute_s", "predicted_s", "prediction_error",
            "simulated_inrun_s", "prediction_from"]
    print(thr[cols].round(4).to_string(index=False))
    print(f"\n== 3. Buffer size ({args.models[0]}): measured sweep of dear_threshold, simulated beside ==")
    print(sweep.pivot_table(index="threshold_bytes", columns="source", values="iteration_s").round(4).to_string())
    if tuning.empty:
        print("(no tuning trials recorded)")
        return
    best = sweep[sweep.source == "measured"].iteration_s.min()
    print(tuning.round(4).to_string(index=False))
    from repro.studies.dear_train import trials_to_within

    n = trials_to_within(tuning, best) if best == best else np.nan
    marks = []
    for planner in ("dear_model", "dear_optimal"):
        row = thr[(thr.model == args.models[0]) & (thr.scheduler == planner)]
        marks.append(f"{planner} measured {float(row.iteration_s.iloc[0]) if len(row) else float('nan'):.4f} s")
    print(f"BO trials to come within 5% of the sweep's best ({best:.4f} s): {n}; " + "; ".join(marks))


if __name__ == "__main__":
    main()
