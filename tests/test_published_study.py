"""The published-measurement validation (repro.studies.published): the shipped table is re-checked
against the shipped presets, a stale one is refused, and the tidy tables count what they say."""

import numpy as np
import pandas as pd
import pytest

from repro.costs import published_fits as C
from repro.studies import published


@pytest.fixture(scope="module")
def wide():
    return published.predictions_table()   # re-checks every shipped row against the shipped presets


@pytest.mark.slow
def test_the_shipped_table_matches_the_presets_and_long_table_has_every_prediction(wide):
    assert len(wide) == len(C.calibration_rows(schedulers=C.FIT_SCHEDULERS + C.VALIDATION_SCHEDULERS))
    long = published.long_table(wide)
    fitted, other = wide.fitted.sum(), (~wide.fitted).sum()
    # Fitted rows carry four predictions, validation-only rows two (paper model and calibrated).
    assert len(long) == 4 * fitted + 2 * other
    row = long[(long.prediction == "paper model")].iloc[0]
    assert row.predicted_samples_per_s == pytest.approx(row.batch_size * row.gpus / row.predicted_s)
    assert np.allclose(long.error, long.predicted_s / long.measured_s - 1)


@pytest.mark.slow
def test_error_summary_counts_rows_within_ten_percent(wide):
    long = published.long_table(wide)
    summary = published.error_summary(long)
    for r in summary.itertuples(index=False):
        d = long[(long.network == r.network) & (long.prediction == r.prediction)
                 & (long.fitted == r.rows_kind.startswith("all-reduce"))]
        assert r.rows == len(d)
        assert r.within_10pct == int((d.error.abs() <= 0.10).sum())
        assert r.max_abs_error == pytest.approx(d.error.abs().max())


def test_a_stale_table_is_refused_with_how_to_rebuild(tmp_path, monkeypatch):
    table = pd.read_csv(C.CV_TABLE)
    table = table[table.scheduler == "syncea"].head(3).reset_index(drop=True)   # small: fast
    ok = tmp_path / "ok.csv"
    table.to_csv(ok, index=False)
    monkeypatch.setattr(C, "CV_TABLE", ok)
    assert len(published.predictions_table()) == 3
    table.loc[0, "fit_s"] *= 1.2
    stale = tmp_path / "stale.csv"
    table.to_csv(stale, index=False)
    monkeypatch.setattr(C, "CV_TABLE", stale)
    with pytest.raises(C.CalibrationError, match="fit_calibration.py"):
        published.predictions_table()
    monkeypatch.setattr(C, "CV_TABLE", tmp_path / "missing.csv")
    with pytest.raises(C.CalibrationError, match="not found"):
        published.predictions_table()
