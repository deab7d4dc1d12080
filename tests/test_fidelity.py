"""The per-message terms (issue 34): off by default, charged as specified, fitted and cross-validated,
and docs/fidelity.md's generated section current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import pandas as pd

from repro.costs import fidelity as F
from repro.costs import published_fits as C
from repro.costs.presets import preset
from repro.core.realism import Realism
from repro.core.contention import run_tasks_with_contention
from repro.core.engine import Task, run_tasks

ROOT = Path(__file__).resolve().parents[1]


def test_terms_default_to_zero_and_leave_lines_unchanged():
    r = Realism()
    assert r.per_message_s(32, 10) == 0.0 and r.overlap_slowdown == 0.0 and r.is_paper_model
    cm = preset("10gbe-derived", 16)
    with_a0 = cm.with_realism(Realism(message_overhead_s=1e-4))
    with_zero = cm.with_realism(Realism(message_overhead_s=1e-4, message_overhead_per_peer_s=0.0))
    assert with_a0.line("allreduce") == with_zero.line("allreduce")


def test_per_message_cost_formula_and_lines():
    r = Realism(message_overhead_s=1e-5, message_overhead_per_peer_s=2e-6, message_overhead_per_in_flight_s=3e-6)
    assert np.isclose(r.per_message_s(8, 4), 1e-5 + 7 * 2e-6 + 4 * 3e-6)
    cm = preset("10gbe-derived", 8)
    assert np.isclose(cm.with_realism(r).line("allreduce").a_s, cm.line("allreduce").a_s + 1e-5 + 7 * 2e-6)
    assert Realism.from_dict(r.to_dict()) == r


def test_in_flight_charge_is_per_waiting_message_and_zero_is_plain():
    tasks = [Task("compute", "backward", "b", 1.0)] + [Task("comm", "allreduce", f"m{i}", 1.0, deps=(0,))
                                                        for i in range(3)]
    plain = run_tasks(tasks, {"compute"})
    assert run_tasks_with_contention(tasks, {"compute"}, 0.0, in_flight_s=0.0) == plain
    ops = run_tasks_with_contention(tasks, {"compute"}, 0.0, in_flight_s=0.1)
    # released together at 1.0: the first starts with 2 waiting, the second with 1, the last with 0
    assert [round(o.end_s - o.start_s, 9) for o in ops[1:]] == [1.2, 1.1, 1.0]


def _small_rows() -> pd.DataFrame:
    rows = C.calibration_rows()
    return rows[rows.model.isin(["resnet50", "bert_base"]) & rows.gpus.isin([8, 32]) & (rows.scheduler != "syncea")].reset_index(drop=True)


SMALL_GRID = {"a0_factors": (0.0, 1.0), "contention_factors": (0.5, 1.0), "a1_grid": (0.0, 1e-5),
              "a2_grid": (0.0, 1e-6)}


def test_joint_fit_recovers_known_parameters_from_synthetic_measurements():
    rows = _small_rows()
    g = F.grid_predictions(rows, F.base_calibrations(), **SMALL_GRID)
    assert set(g) == {"10gbe", "100gbib"} and all(len(v) == 16 for v in g.values())
    truth = {"10gbe": (0.0, 0.5, 1e-5, 1e-6), "100gbib": (1.0, 0.5, 1e-5, 1e-6)}
    synthetic = rows.assign(iteration_s=F.predict_fitted(rows, g, truth))
    points, rms = F.fit_terms(synthetic, g)
    assert points == truth and rms < 1e-12
    cv = F.cross_validate(synthetic, g)
    table = F.split_table(cv)
    assert set(table.split) == set(F.SPLITS)
    assert set(table[table.split == "network"].held_out) == {"10gbe", "100gbib"}
    # every split that keeps rows of both networks recovers the truth; a network held out keeps its link
    # fit's a0 and contention (factors 1), so only the shared terms carry over to it
    assert np.allclose(cv[cv.split != "network"].after_error, 0.0, atol=1e-9)
    held = cv[(cv.split == "network") & (cv.held_out == "10gbe")]
    assert (held.a0_factor_10gbe == 1.0).all() and (held.contention_factor_10gbe == 1.0).all()
    assert (held.a0_factor_100gbib == 1.0).all() and (held.contention_factor_100gbib == 0.5).all()
    assert np.isclose(table[table.split == "fit"].contention_10gbe.iloc[0],
                      0.5 * F.base_calibrations()["10gbe"].realism.contention)
    verdict = F.earns_keep(cv)
    assert verdict["earns"] and verdict["after_median"] < verdict["before_median"]


def test_terms_that_do_not_help_do_not_earn_their_keep():
    rows = _small_rows()
    g = F.grid_predictions(rows, F.base_calibrations(), **SMALL_GRID)
    base_pred = F.predict_fitted(rows, g, {n: (1.0, 1.0, 0.0, 0.0) for n in g})
    points, rms = F.fit_terms(rows.assign(iteration_s=base_pred), g)
    assert points == {n: (1.0, 1.0, 0.0, 0.0) for n in g} and rms < 1e-12   # the link fit itself: nothing added
    assert not F.earns_keep(F.cross_validate(rows.assign(iteration_s=base_pred), g))["earns"]
    with pytest.raises(ValueError, match="link fit's point"):
        F.grid_predictions(rows, F.base_calibrations(), a0_factors=(0.0, 0.5))


def test_shipped_presets_are_the_verdict_of_the_cross_validation():
    """The presets hold the joint fit only where it beat the link fit in cross-validation; refitting
    starts from the link fit whatever was shipped."""
    for n, base in F.base_calibrations().items():
        cal = C.calibrated_preset(f"{n}-calibrated")
        info = cal.fit["per_message_terms"]
        assert base.realism.message_overhead_s == info[F.BASE_KEY]["message_overhead_s"]
        assert base.realism.contention == info[F.BASE_KEY]["contention"]
        want = info["joint_fit_on_every_row"][n] if info["cross_validation"]["earns"] else \
            {"message_overhead_s": base.realism.message_overhead_s, "contention": base.realism.contention,
             F.TERMS[0]: 0.0, F.TERMS[1]: 0.0}
        got = F.point_values(cal, (1.0, 1.0, cal.realism.message_overhead_per_peer_s,
                                   cal.realism.message_overhead_per_in_flight_s))
        assert got == pytest.approx(want, rel=1e-12), n


def test_shipped_fidelity_tables_and_doc_are_current():
    splits = pd.read_csv(F.FIDELITY_CV)
    assert set(splits.split) == set(F.SPLITS) and (splits.rows > 0).all()
    rows = pd.read_csv(F.FIDELITY_ROWS)
    assert set(rows.quantity) == {"iteration_s", "speedup"} and len(rows[rows.quantity == "iteration_s"]) == 72
    cal = C.calibrated_preset("10gbe-calibrated")
    assert "per_message_terms" in cal.fit
    spec = importlib.util.spec_from_file_location("fidelity_table", ROOT / "scripts" / "fidelity_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "docs" / "fidelity.md").read_text()
    assert module.updated(text) == text, "docs/fidelity.md is stale: run python scripts/fidelity_table.py"


@pytest.mark.notebook
@pytest.mark.slow
def test_the_fidelity_notebook_runs_and_writes_its_figure_and_tables(tmp_path):
    """notebooks/fidelity.ipynb under papermill (the shipped tables; the figure inventory of the papers,
    notebooks/figures.yaml, does not list this report, so the figure runner does not run it): its
    figure and both tables are written."""
    import papermill as pm
    from jupyter_client.kernelspec import KernelSpecManager

    root = Path(__file__).resolve().parents[1]
    kernel = "repro" if "repro" in KernelSpecManager().find_kernel_specs() else "python3"
    figures, data = tmp_path / "figures", tmp_path / "data"
    pm.execute_notebook(str(root / "notebooks" / "fidelity.ipynb"), str(tmp_path / "out.ipynb"),
                        parameters={"output_dir": str(figures), "results_dir": str(data)}, kernel_name=kernel,
                        progress_bar=False, cwd=str(root))
    assert sorted(p.name for p in figures.glob("validation_fidelity*.png")), list(figures.iterdir())
    assert {p.stem for p in data.glob("*.csv")} >= {"fidelity_cv", "fidelity_rows"}, list(data.iterdir())
