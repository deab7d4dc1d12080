"""The simulator against published measurements: paper model, calibrated, and cross-validated.

Reads the shipped prediction table (``data/calibration/ddl_benchmarks_predictions.csv``, written by
``scripts/fit_calibration.py``) or recomputes it (``refit=True``, slow), and checks it against the
shipped presets so that a stale table is caught, not drawn. Seconds per iteration; samples per second
over all GPUs. Never imports torch.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from repro.costs import published_fits as C

__all__ = ["PREDICTIONS", "predictions_table", "long_table", "error_summary"]

# Prediction columns of the wide table -> how figures and tables name them.
PREDICTIONS = {
    "paper_s": "paper model",
    "fit_s": "calibrated (all rows fitted)",
    "cv_model_s": "calibrated, model held out",
    "cv_gpus_s": "calibrated, GPU count held out",
}


def predictions_table(*, refit: bool = False, max_nfev: int = 60, rtol: float = 1e-3) -> pd.DataFrame:
    """One row per published multi-GPU measurement with the predictions of :data:`PREDICTIONS` and their
    ``*_error`` columns. ``refit=False`` reads the shipped table and raises
    :class:`~repro.costs.published_fits.CalibrationError` when the shipped presets no longer give its
    ``paper_s`` and ``fit_s`` (within ``rtol``); ``refit=True`` fits and cross-validates afresh
    (not saved)."""
    if refit:
        published = C.load_published()
        parts = []
        for network in sorted(set(published.network)):
            rows = C.calibration_rows(published, network)
            cv = C.cross_validate(rows, max_nfev=max_nfev)
            cal = C.fit(rows, max_nfev=max_nfev)
            other = C.calibration_rows(published, network, schedulers=C.VALIDATION_SCHEDULERS)
            other["fit_s"] = C.predict(other, cal)
            parts += [cv.assign(fitted=True), other.assign(fitted=False)]
        table = pd.concat(parts, ignore_index=True)
        table["paper_s"] = C.predict(table, None)
    else:
        if not C.CV_TABLE.is_file():
            raise C.CalibrationError(f"shipped prediction table not found: {C.CV_TABLE}; "
                                     "run scripts/fit_calibration.py or pass refit=True")
        table = pd.read_csv(C.CV_TABLE)
        for network, rows in table.groupby("network"):
            cal = C.calibrated_preset(f"{network}-calibrated")
            now = C.predict(rows.reset_index(drop=True), cal)
            paper = C.predict(rows.reset_index(drop=True), None)
            bad = ~(np.isclose(now, rows.fit_s, rtol=rtol) & np.isclose(paper, rows.paper_s, rtol=rtol))
            if bad.any():
                raise C.CalibrationError(
                    f"{C.CV_TABLE.name}: {int(bad.sum())} {network} row(s) no longer match what the shipped "
                    "presets predict (the simulator changed since the table was written); rebuild it with "
                    "python scripts/fit_calibration.py")
    for col in PREDICTIONS:
        if col in table:
            table[col.replace("_s", "_error")] = table[col] / table.iteration_s - 1.0
    return table


def long_table(table: pd.DataFrame) -> pd.DataFrame:
    """Tidy: one row per (measurement, prediction kind) with measured and predicted seconds and
    samples/s and the relative error ``predicted / measured - 1`` (of the iteration time)."""
    keep = ["model", "paper_model", "network", "paper_network", "method", "scheduler", "gpus", "batch_size",
            "fitted", "iteration_s", "samples_per_s"]
    out = []
    for col, label in PREDICTIONS.items():
        if col not in table:
            continue
        part = table[keep].assign(prediction=label, predicted_s=table[col])
        part = part[part.predicted_s.notna()]
        out.append(part.assign(predicted_samples_per_s=part.batch_size * part.gpus / part.predicted_s,
                               error=part.predicted_s / part.iteration_s - 1.0))
    return pd.concat(out, ignore_index=True).rename(columns={"iteration_s": "measured_s",
                                                             "samples_per_s": "measured_samples_per_s"})


def error_summary(long: pd.DataFrame) -> pd.DataFrame:
    """Per network, prediction kind and row set (fitted all-reduce rows / validation-only rows):
    rows, median and largest |error|, and how many rows are within 10%."""
    d = long.assign(abs_error=long.error.abs(),
                    rows_kind=np.where(long.fitted, "all-reduce (BSP, WFBP, MG-WFBP)",
                                       "validation only (ByteScheduler, BSP-PS)"))
    g = d.groupby(["network", "rows_kind", "prediction"], sort=False)
    out = g.abs_error.agg(rows="size", median_abs_error="median", max_abs_error="max").reset_index()
    out["within_10pct"] = g.abs_error.apply(lambda e: int((e <= 0.10).sum())).to_numpy()
    return out
