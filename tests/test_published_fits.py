"""Calibration on published measurements (repro.costs.published_fits), torch-free: the fit recovers a known
model, cross-validation never sees the rows it predicts, the shipped presets reproduce the shipped
prediction table, and the paper/calibrated modes are what they say."""

import json

import numpy as np
import pandas as pd
import pytest

from repro.costs import published_fits as C
from repro.core.cost import CostModelError
from repro.costs.presets import is_calibrated_preset, preset, preset_names
from repro.core.realism import Realism
from repro.core.topology import Link, Topology

THETA = {"intra_alpha_s": 2e-5, "intra_beta_s_per_byte": 2.5e-10, "inter_alpha_s": 3e-5,
         "inter_beta_s_per_byte": 9e-10, "message_overhead_s": 6e-5, "contention": 0.2}


def _synthetic_rows():
    rows = C.calibration_rows(network="10gbe")
    rows = rows[rows.model.isin(["resnet50", "bert_base"]) & rows.scheduler.isin(["syncea", "wfbp"])
                & rows.gpus.isin([4, 8, 16])].reset_index(drop=True)
    truth = C._calibration(THETA, "10gbe", "ring")
    rows["iteration_s"] = C.predict(rows, truth)
    return rows, truth


def test_published_rows_and_their_single_gpu_computation():
    rows = C.calibration_rows()
    assert set(rows.scheduler) == set(C.FIT_SCHEDULERS)
    assert set(rows.gpus) == {4, 8, 16, 32} and set(rows.network) == {"10gbe", "100gbib"}
    assert len(rows) == 3 * 2 * 3 * 4
    d = C.load_published()
    one = d[(d.gpus == 1) & (d.model == "bert_large")].iteration_s.iloc[0]
    assert (rows[rows.model == "bert_large"].single_s == one).all()
    assert one == pytest.approx(8 / 48.99, rel=1e-3)  # batch 8 at the published 1-GPU throughput
    with pytest.raises(C.CalibrationError, match="unknown network"):
        C.calibration_rows(network="carrier-pigeon")


def test_calibrated_prediction_scales_computation_to_the_measured_single_gpu():
    rows = C.calibration_rows(network="10gbe")
    r = rows[(rows.model == "resnet50") & (rows.gpus == 4) & (rows.scheduler == "syncea")]
    cal = C._calibration({**THETA, "contention": 1e-4}, "10gbe", "ring")
    trace = C._batch_scaled("resnet50", 64)
    scaled = cal.for_trace(trace, float(r.single_s.iloc[0])).apply_to_trace(trace)
    one_gpu = scaled.total_forward_s + scaled.total_backward_s + scaled.overheads.update_s
    assert one_gpu == pytest.approx(float(r.single_s.iloc[0]))
    # SyncEASGD on 4 GPUs: the single-GPU iteration plus one whole-model all-reduce on the intra ring.
    line = cal.cost_model(4).line("allreduce")
    expected = one_gpu + line.a_s + line.b_s_per_byte * trace.total_bytes
    assert C.predict(r, cal)[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
def test_the_fit_recovers_a_known_model_from_its_own_predictions():
    rows, truth = _synthetic_rows()
    cal = C.fit(rows, algorithms=("ring",), max_nfev=40)
    assert cal.fit["rms_log_error"] < 0.01
    assert np.allclose(C.predict(rows, cal), rows.iteration_s, rtol=0.02)
    assert cal.network == "10gbe" and cal.algorithm == "ring"
    with pytest.raises(C.CalibrationError, match="one network at a time"):
        C.fit(pd.concat([rows, rows.assign(network="100gbib")]))


def test_cross_validation_never_fits_the_rows_it_predicts(monkeypatch):
    rows, truth = _synthetic_rows()
    seen = []

    def fake_fit(r, **kw):
        seen.append(set(zip(r.model, r.gpus, r.scheduler)))
        return truth

    monkeypatch.setattr(C, "fit", fake_fit)
    out = C.cross_validate(rows)
    keys = list(zip(rows.model, rows.gpus, rows.scheduler))
    # One fit on everything, one per model left out, one per worker count left out.
    assert len(seen) == 1 + rows.model.nunique() + rows.gpus.nunique()
    assert seen[0] == set(keys)
    for fitted in seen[1:]:
        held = set(keys) - fitted
        assert held and (len({m for m, _, _ in held}) == 1 or len({g for _, g, _ in held}) == 1)
    assert np.allclose(out.cv_model_error, 0, atol=1e-12) and np.allclose(out.cv_gpus_error, 0, atol=1e-12)
    assert {"fit_error", "cv_model_error", "cv_gpus_error", "cv_worst_error"} <= set(out.columns)


def test_a_calibration_round_trips_and_bad_files_say_so(tmp_path):
    cal = C._calibration(THETA, "10gbe", "hierarchical", fit_info={"rows": 3})
    p = tmp_path / "c.json"
    cal.save(p)
    back = C.Calibration.load(p)
    assert back == cal and back.cost_model(8) == cal.cost_model(8)
    p.write_text(json.dumps({"name": "x"}))
    with pytest.raises(C.CalibrationError, match="malformed calibration"):
        C.Calibration.load(p)
    with pytest.raises(C.CalibrationError, match="not found"):
        C.Calibration.load(tmp_path / "none.json")


def test_the_calibrated_cluster_grows_by_whole_nodes_beyond_the_measured_one():
    cal = C._calibration(THETA, "10gbe", "ring")
    assert cal.cost_model(64).meta["nodes_used"] == 16
    assert cal.cost_model(2).meta["nodes_used"] == 1
    with pytest.raises(CostModelError, match="whole nodes"):
        cal.cost_model(6)


# ------------------------------------------------------------------------------ shipped presets
def test_shipped_presets_are_presets_and_reproduce_the_shipped_prediction_table():
    table = pd.read_csv(C.CV_TABLE)
    for network in ("10gbe", "100gbib"):
        name = f"{network}-calibrated"
        assert name in preset_names() and is_calibrated_preset(name)
        cm = preset(name, 16)
        assert cm.realism is not None and cm.realism.contention > 0 and "calibrated" in cm.source
        rows = table[table.network == network].reset_index(drop=True)
        # (tests/test_published_study.py re-predicts every row with the shipped presets)
        fitted = rows[rows.fitted]
        assert fitted.cv_model_s.notna().all() and fitted.cv_gpus_s.notna().all()
        assert set(fitted.scheduler) == set(C.FIT_SCHEDULERS) and len(fitted) == 36


def test_cost_modes_paper_is_the_preset_and_calibrated_the_cluster():
    assert C.cost_for_mode("10gbe-derived", 16, "paper") == preset("10gbe-derived", 16)
    cm = C.cost_for_mode("10gbe-derived", 16, "calibrated")
    assert cm.realism is not None and cm.meta["workers_per_node"] == 4
    ib = C.cost_for_mode("56gbib-dear64", 64, "calibrated")
    assert "100gbib-calibrated" in ib.source
    sparse = C.cost_for_mode("1gbe-allgather", 8, "calibrated")
    assert sparse.lines == preset("1gbe-allgather", 8).lines and sparse.topk_gamma_s == 2.19e-10
    assert sparse.realism == C.calibrated_preset("10gbe-calibrated").realism
    with pytest.raises(C.CalibrationError, match="cost_mode must be one of paper, calibrated"):
        C.cost_for_mode("10gbe-derived", 16, "optimistic")
    assert C.mode_label("paper") == "paper model"


def test_tables_of_both_modes_leave_out_the_presets_without_a_calibrated_cluster():
    assert C.calibrated_omission("10gbe-derived") is None and C.calibrated_omission("56gbib-dear64") is None
    assert "K80" in C.calibrated_omission("10gbe-k80") and "1gbe" in C.calibrated_omission("1gbe-allgather")
    calls = []

    def run(presets, mode):
        calls.append((tuple(presets), mode))
        return pd.DataFrame({"network": presets, "cost_mode": mode})

    table, omitted = C.simulate_modes(run, ["10gbe-derived", "1gbe-allgather", "10gbe-k80"])
    assert calls == [(("10gbe-derived", "1gbe-allgather", "10gbe-k80"), "paper"), (("10gbe-derived",), "calibrated")]
    assert set(omitted) == {"1gbe-allgather", "10gbe-k80"} and len(table) == 4
    # drawn calibrated: every preset in that mode (cost_for_mode's), the paper mode for all
    calls.clear()
    table, omitted = C.simulate_modes(run, ["1gbe-allgather"], "calibrated")
    assert calls == [(("1gbe-allgather",), "calibrated"), (("1gbe-allgather",), "paper")] and omitted == {}
    with pytest.raises(C.CalibrationError, match="cost_mode must be one of"):
        C.simulate_modes(run, ["10gbe-derived"], "both")


def test_a_calibration_with_no_effects_is_the_flat_topology():
    topo = Topology(8, 4, Link(1e-5, 2e-10), Link(5e-5, 1e-9))
    cal = C.Calibration("t", "10gbe", topo, "ring", Realism())
    assert cal.cost_model(8).is_paper_model
    assert cal.cost_model(8).line("allreduce") == topo.allreduce_line(8, "ring")
