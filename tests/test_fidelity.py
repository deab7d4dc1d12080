"""The per-message terms (issue 34): off by default, charged as specified, fitted and cross-validated,
and docs/fidelity.md's generated section current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import pandas as pd

from repro import fidelity as F
from repro import published_fits as C
from repro.presets import preset
from repro.realism import Realism
from repro.sim.contention import run_tasks_with_contention
from repro.sim.engine import Task, run_tasks

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


def test_fit_recovers_known_terms_from_synthetic_measurements():
    rows = _small_rows()
    grid = (0.0, 1e-5, 1e-4)
    g = F.grid_predictions(rows, F.base_calibrations(), grid)
    truth = (1e-4, 1e-5)
    synthetic = rows.assign(iteration_s=g[truth])
    (a1, a2), rms = F.fit_terms(g, synthetic.iteration_s.to_numpy())
    assert (a1, a2) == truth and rms < 1e-12
    cv = F.cross_validate(synthetic, g)
    table = F.split_table(cv)
    assert set(table.split) == set(F.SPLITS)
    assert set(table[table.split == "network"].held_out) == {"10gbe", "100gbib"}
    assert np.allclose(cv.after_error, 0.0, atol=1e-9)   # every split recovers the truth
    assert (table.after_median <= table.before_median + 1e-12).all()


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
