"""Fidelity against published measurements (issue 12): per calibration row, published vs paper-model vs
calibrated predictions and the cross-validated error (prints tables; not a test).

    python benchmarks/bench_fidelity.py [--shipped] [--max-nfev 60]

Data: HKBU-HPML/ddl-benchmarks 2020-05-29 (Shi et al., arXiv 2005.13247), measured samples/s of
ResNet-50 (batch 64/GPU), BERT-Base (64) and BERT-Large (8) on 4-32 GPUs of 8 nodes x 4 GPUs over
10GbE and 100Gb InfiniBand (``data/paper_numbers/ddl_benchmarks_measured.csv``).

By default every fit is redone (``repro.costs.published_fits.fit`` and ``cross_validate`` per network: one
fit on all rows, one per model left out, one per GPU count left out; about 15 minutes on 2 cores);
``--shipped`` reads the shipped table instead (after checking that the shipped presets still give
its paper-model and calibrated columns). Per row: measured seconds per iteration, the paper model,
the calibrated fit, the two cross-validated predictions, their errors (predicted / measured - 1).
The target of issue 12: every all-reduce row (BSP, WFBP, MG-WFBP) within 10% in cross-validation on
both networks. ByteScheduler and BSP-PS rows are predicted with the calibration but never fitted.
The tiny-scale pre-run predictions on this machine are ``benchmarks/bench_prerun.py``.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from repro.costs import published_fits as C
from repro.studies import published


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shipped", action="store_true", help="read the shipped prediction table instead of refitting")
    ap.add_argument("--max-nfev", type=int, default=60, help="least-squares evaluations per start (refit only)")
    args = ap.parse_args()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 500)
    t0 = time.perf_counter()
    wide = published.predictions_table(refit=not args.shipped, max_nfev=args.max_nfev)
    how = "shipped table (presets re-checked)" if args.shipped else "refitted now"
    print(f"== Published vs predicted seconds per iteration, {how} [{time.perf_counter() - t0:.0f} s] ==")
    for name, cal in C.calibrated_presets().items():
        p = {k: f"{v:.3g}" for k, v in cal.params().items()}
        print(f"{name}: {cal.algorithm} all-reduce, {p}, fit rms log error {cal.fit.get('rms_log_error', float('nan')):.4f}")
    cols = ["network", "model", "method", "gpus", "iteration_s", "paper_s", "fit_s", "cv_model_s", "cv_gpus_s",
            "paper_error", "fit_error", "cv_model_error", "cv_gpus_error"]
    for fitted, title in ((True, "fitted all-reduce rows"), (False, "validation-only rows (never fitted)")):
        d = wide[wide.fitted == fitted].sort_values(["network", "model", "method", "gpus"])
        print(f"\n-- {title} --")
        print(d[[c for c in cols if c in d and d[c].notna().any()]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    long = published.long_table(wide)
    print("\n== Error summary (|predicted / measured - 1| of the iteration time) ==")
    print(published.error_summary(long).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    fit = wide[wide.fitted]
    worst = fit[["cv_model_error", "cv_gpus_error"]].abs().max(axis=1)
    print(f"\nCross-validated (worst of the two schemes): {int((worst <= 0.10).sum())} of {len(fit)} all-reduce rows "
          f"within 10%; paper model: {int((fit.paper_error.abs() <= 0.10).sum())} of {len(fit)}.")
    for net in sorted(set(fit.network)):
        w = worst[fit.network == net]
        print(f"  {net}: {int((w <= 0.10).sum())}/{len(w)} within 10%, median {w.median():.3f}, max {w.max():.3f}")


if __name__ == "__main__":
    main()
