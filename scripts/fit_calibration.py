"""Fit the calibrated network presets and cross-validate them (issue 12); writes, under
``data/calibration/``:

- ``<network>-calibrated.json`` for each published network (10gbe, 100gbib): the least-squares fit of
  :func:`repro.costs.published_fits.fit` on every all-reduce row (BSP, WFBP, MG-WFBP; 4-32 GPUs; three models);
- ``ddl_benchmarks_predictions.csv``: every multi-GPU published row with ``paper_s`` (the paper model),
  ``fit_s`` (the shipped calibration), and for the fitted rows ``cv_model_s`` (fitted without the row's
  model) and ``cv_gpus_s`` (fitted without the row's GPU count), with relative errors
  (``predicted / measured - 1``). Validation-only rows (ByteScheduler, BSP-PS) get ``paper_s`` and
  ``fit_s``; rows no scheduler of this package runs (WFBP-PS, ByteScheduler-PS) are left out.

    python scripts/fit_calibration.py [--max-nfev 60]

Takes about 10 minutes on 2 cores (8 fits per network, each re-planning and simulating every row
a few hundred times). Deterministic: the same data give the same presets.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from repro.costs import published_fits as C


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-nfev", type=int, default=60, help="function evaluations per least-squares start")
    args = ap.parse_args()
    C.SHIPPED_DIR.mkdir(parents=True, exist_ok=True)
    published = C.load_published()
    tables = []
    for network in sorted(set(published.network)):
        t0 = time.perf_counter()
        rows = C.calibration_rows(published, network)
        cv = C.cross_validate(rows, max_nfev=args.max_nfev)
        cal = C.fit(rows, max_nfev=args.max_nfev)
        cal.save(C.SHIPPED_DIR / f"{cal.name}.json")
        other = C.calibration_rows(published, network, schedulers=C.VALIDATION_SCHEDULERS)
        other["fit_s"] = C.predict(other, cal)
        other["fit_error"] = other.fit_s / other.iteration_s - 1
        both = pd.concat([cv.assign(fitted=True), other.assign(fitted=False)], ignore_index=True)
        both["paper_s"] = C.predict(both, None)
        both["paper_error"] = both.paper_s / both.iteration_s - 1
        tables.append(both)
        worst = cv.cv_worst_error
        print(f"{network}: {cal.algorithm} all-reduce, rms log error {cal.fit['rms_log_error']:.4f}; "
              f"cross-validated |error| median {np.median(worst):.3f}, max {worst.max():.3f}, "
              f"{int((worst > 0.10).sum())} of {len(worst)} rows over 10% [{time.perf_counter() - t0:.0f} s]")
    out = pd.concat(tables, ignore_index=True)
    tmp = C.CV_TABLE.with_suffix(".tmp")
    out.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(C.CV_TABLE)
    print(f"wrote {C.CV_TABLE} ({len(out)} rows) and {len(tables)} presets")


if __name__ == "__main__":
    main()
