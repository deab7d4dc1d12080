"""Fitting the simulator's cluster to published measurements (offline), and how far to trust it.

Fits ``data/paper_numbers/ddl_benchmarks_measured.csv`` (HKBU-HPML ddl-benchmarks, Shi et al., arXiv
2005.13247: ResNet-50, BERT-Base, BERT-Large on 1-32 GPUs of 8 nodes x 4, over 10GbE and 100Gb IB);
live process groups are :mod:`repro.runtime.calibrate`'s. A calibration is a
:class:`~repro.core.topology.Topology` plus a :class:`~repro.core.realism.Realism`; :func:`fit`
minimises ``sum log(sim / measured)^2`` over the all-reduce rows, in log space within
:data:`PARAMETER_BOUNDS`, with the better of the flat and hierarchical all-reduce kept.
:func:`cross_validate` gives each row's error when left out of the fit. The **paper model** uses the
MG-WFBP journal's P=16 fits and perfect overlap. Design notes: docs/design/core.md. Torch-free.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from repro.costs.calibrated import (
    SHIPPED_DIR, Calibration, CalibrationError, calibrated_preset, calibrated_presets)
from repro.core.cost import CostModel
from repro.costs.presets import preset
from repro.core.realism import Realism
from repro.core.topology import TOPOLOGY_ALGORITHMS, Link, Topology
from repro.core.trace import Trace, load_trace
from repro.core.paths import shipped_path

if TYPE_CHECKING:  # pandas is imported where tables are read: the presets load without it
    import pandas as pd

__all__ = [
    "PUBLISHED_CSV", "MODEL_TRACES", "NETWORK_PAPER_PRESETS", "FIT_SCHEDULERS", "PARAMETER_BOUNDS",
    "UPDATE_S_PER_BYTE", "Calibration", "CalibrationError", "load_published", "calibration_rows",
    "model_trace", "predict", "fit", "cross_validate", "calibrated_presets", "calibrated_preset",
    "SHIPPED_DIR", "VALIDATION_SCHEDULERS", "CV_TABLE", "COST_MODES", "check_cost_mode",
    "cost_for_mode", "mode_label", "calibrated_omission", "simulate_modes",
]

PUBLISHED_CSV = shipped_path("paper_numbers", "ddl_benchmarks_measured.csv")
# Every published multi-GPU row with its predictions (scripts/fit_calibration.py writes it).
CV_TABLE = SHIPPED_DIR / "ddl_benchmarks_predictions.csv"
# The shipped trace whose layers stand for each published model (computation scaled to the batch).
MODEL_TRACES = {"resnet50": "resnet50_b64_v100-estimate", "bert_base": "bert_base_b64_v100-estimate",
                "bert_large": "bert_large_b32_v100-estimate"}
# Paper-model preset of each published network: the nearest published fit.
NETWORK_PAPER_PRESETS = {"10gbe": "10gbe-derived", "100gbib": "56gbib-derived"}
FIT_SCHEDULERS = ("syncea", "wfbp", "mgwfbp")   # BSP-A2A, WFBP-A2A, MG-WFBP: the rows fitted and targeted
UPDATE_S_PER_BYTE = 5.0 / 800e9
DEVICES_PER_NODE = 4
NODES = 8
# (low, high) of each fitted parameter, searched in log10.
PARAMETER_BOUNDS: dict[str, tuple[float, float]] = {
    "intra_alpha_s": (1e-7, 1e-3), "intra_beta_s_per_byte": (1e-11, 1e-8),
    "inter_alpha_s": (1e-7, 1e-2), "inter_beta_s_per_byte": (1e-11, 1e-8),
    "message_overhead_s": (1e-7, 1e-2), "contention": (1e-4, 3.0),
}
PARAMETERS = tuple(PARAMETER_BOUNDS)


def load_published(path: str | Path | None = None) -> pd.DataFrame:
    """The published measurements as shipped (one row per model, network, method, GPU count)."""
    import pandas as pd

    p = Path(path) if path is not None else PUBLISHED_CSV
    if not p.is_file():
        raise CalibrationError(f"published measurements not found: {p}")
    return pd.read_csv(p)


def calibration_rows(published: pd.DataFrame | None = None, network: str | None = None,
                     schedulers: Sequence[str] = FIT_SCHEDULERS) -> pd.DataFrame:
    """Multi-GPU rows of ``schedulers`` on ``network`` (all if None), with ``single_s``: the same
    model's measured 1-GPU iteration."""
    d = load_published() if published is None else published
    single = d[d.gpus == 1].groupby("model").iteration_s.first()
    rows = d[(d.gpus > 1) & d.scheduler.isin(list(schedulers))].copy()
    if network is not None:
        if network not in set(d.network):
            raise CalibrationError(f"unknown network '{network}'; the data have {', '.join(sorted(set(d.network)))}")
        rows = rows[rows.network == network]
    rows["single_s"] = rows.model.map(single)
    return rows.reset_index(drop=True)


@lru_cache(maxsize=None)
def model_trace(model: str) -> Trace:
    """The shipped trace standing for published model ``model`` (computation not yet scaled)."""
    try:
        return load_trace(MODEL_TRACES[model])
    except KeyError:
        raise CalibrationError(f"no trace for published model '{model}'; known: {', '.join(MODEL_TRACES)}") from None


@lru_cache(maxsize=None)
def _batch_scaled(model: str, batch: int) -> Trace:
    """The model's trace with computation scaled linearly to ``batch`` samples per device."""
    tr = model_trace(model)
    if batch == tr.batch_size:
        return tr
    scaled = Realism(compute_scale=batch / tr.batch_size).apply_to_trace(tr)
    return scaled.replace_layers(scaled.layers, batch_size=int(batch))


def _calibration(theta: Mapping[str, float], network: str, algorithm: str, name: str = "",
                 fit_info: Mapping[str, Any] | None = None) -> Calibration:
    topo = Topology(NODES, DEVICES_PER_NODE, Link(theta["intra_alpha_s"], theta["intra_beta_s_per_byte"]),
                    Link(theta["inter_alpha_s"], theta["inter_beta_s_per_byte"]))
    realism = Realism(message_overhead_s=theta["message_overhead_s"], contention=theta["contention"],
                      update_s_per_byte=UPDATE_S_PER_BYTE)
    return Calibration(name or f"{network}-calibrated", network, topo, algorithm, realism,
                       source="fitted to HKBU-HPML/ddl-benchmarks 2020-05-29 (Shi et al., arXiv 2005.13247) "
                              "by repro.costs.published_fits.fit", fit=fit_info)


# Validation-only rows (not fitted): the plan options that match the published setup.
VALIDATION_SCHEDULERS = ("bytescheduler", "ps_bsp")


def _simulate_row(trace: Trace, scheduler: str, cost: CostModel) -> float:
    from repro.core.planners import make_plan
    from repro.core.simulate import simulate

    # BytePS (BSP-PS) runs one server per node: ``servers`` = nodes used
    options = {"servers": max(1, -(-cost.workers // DEVICES_PER_NODE))} if scheduler == "ps_bsp" else {}
    plan = make_plan(scheduler, trace, cost, **options)
    return simulate(trace, plan, cost, with_ops=False).iteration_s


def predict(rows: pd.DataFrame, calibration: Calibration | None) -> np.ndarray:
    """Predicted seconds per iteration of each row: calibrated (computation scaled to the row's
    ``single_s``), or with ``calibration=None`` the paper model."""
    out = np.empty(len(rows))
    applied: dict[tuple, tuple[Trace, Realism]] = {}
    for k, r in enumerate(rows.itertuples(index=False)):
        trace = _batch_scaled(r.model, int(r.batch_size))
        if calibration is None:
            try:
                cost = preset(NETWORK_PAPER_PRESETS[r.network], int(r.gpus))
            except KeyError:
                raise CalibrationError(f"no paper-model network for '{r.network}'") from None
        else:
            # Scale the computation once per model, as simulate would on every call.
            key = (r.model, int(r.batch_size), float(r.single_s))
            if key not in applied:
                realism = calibration.for_trace(trace, float(r.single_s))
                applied[key] = (realism.apply_to_trace(trace), replace(realism, compute_scale=1.0))
            trace, realism = applied[key]
            cost = calibration.cost_model(int(r.gpus), realism)
        out[k] = _simulate_row(trace, r.scheduler, cost)
    return out


def _theta(x: np.ndarray) -> dict[str, float]:
    return {k: float(10.0 ** v) for k, v in zip(PARAMETERS, x)}


def _start_points() -> list[np.ndarray]:
    # A PCIe-like intra link, a network-like inter link, small overheads
    return [np.log10([5e-6, 2.5e-10, 5e-5, 1e-9, 5e-5, 0.05])]


def fit(rows: pd.DataFrame, network: str | None = None, *, algorithms: Iterable[str] = TOPOLOGY_ALGORITHMS,
        name: str = "", max_nfev: int = 60) -> Calibration:
    """Least-squares calibration of one network from its all-reduce ``rows`` with ``single_s``
    (:func:`calibration_rows`; module docstring)."""
    from scipy.optimize import least_squares

    if rows.empty:
        raise CalibrationError("no rows to fit")
    nets = sorted(set(rows.network))
    if len(nets) != 1:
        raise CalibrationError(f"fit one network at a time; rows have {', '.join(nets)}")
    network = network or nets[0]
    measured = rows.iteration_s.to_numpy(float)
    lo = np.log10([PARAMETER_BOUNDS[k][0] for k in PARAMETERS])
    hi = np.log10([PARAMETER_BOUNDS[k][1] for k in PARAMETERS])
    best: tuple[float, np.ndarray, str] | None = None
    for algorithm in algorithms:
        def residuals(x: np.ndarray) -> np.ndarray:
            cal = _calibration(_theta(x), network, algorithm)
            return np.log(predict(rows, cal) / measured)

        for x0 in _start_points():
            sol = least_squares(residuals, np.clip(x0, lo, hi), bounds=(lo, hi), diff_step=0.02,
                                max_nfev=max_nfev, x_scale=1.0)
            cost = float(np.sqrt(np.mean(sol.fun ** 2)))
            if best is None or cost < best[0]:
                best = (cost, sol.x, algorithm)
    assert best is not None
    rms, x, algorithm = best
    info = {"rows": int(len(rows)), "rms_log_error": rms, "fitted": list(PARAMETERS),
            "fixed": {"update_s_per_byte": UPDATE_S_PER_BYTE, "copy_s_per_byte": 0.0, "fp16_cast_s_per_byte": 0.0,
                      "compute_scale": "per model, from its 1-GPU row"},
            "models": sorted(set(rows.model)), "gpus": sorted(int(g) for g in set(rows.gpus)),
            "schedulers": sorted(set(rows.scheduler))}
    return _calibration(_theta(x), network, algorithm, name, info)


def cross_validate(rows: pd.DataFrame, *, max_nfev: int = 60) -> pd.DataFrame:
    """``rows`` with each row's prediction when all rows are fitted (``fit_s``), when its model is left
    out (``cv_model_s``) and when its worker count is (``cv_gpus_s``), and the relative errors
    ``*_error``. One network at a time."""
    out = rows.copy()
    full = fit(rows, max_nfev=max_nfev)
    out["fit_s"] = predict(rows, full)
    for column, key in (("cv_model_s", "model"), ("cv_gpus_s", "gpus")):
        pred = np.full(len(rows), np.nan)
        for value in sorted(set(rows[key])):
            held = (rows[key] == value).to_numpy()
            cal = fit(rows[~held], max_nfev=max_nfev)
            pred[held] = predict(rows[held], cal)
        out[column] = pred
    for c in ("fit_s", "cv_model_s", "cv_gpus_s"):
        out[c.replace("_s", "_error")] = out[c] / out.iteration_s - 1.0
    out["cv_worst_error"] = out[["cv_model_error", "cv_gpus_error"]].abs().max(axis=1)
    return out


COST_MODES = ("paper", "calibrated")
# (preset prefix, calibrated cluster, own cluster?): 1GbE has none and borrows 10GbE's realism.
_CALIBRATED_FOR = (("10gbe", "10gbe-calibrated", True), ("56gbib", "100gbib-calibrated", True),
                   ("100gbib", "100gbib-calibrated", True), ("1gbe", "10gbe-calibrated", False))


def check_cost_mode(mode: str) -> str:
    """``mode`` if it is ``"paper"`` or ``"calibrated"``; else one line naming the choices."""
    if mode not in COST_MODES:
        raise CalibrationError(f"cost_mode must be one of {', '.join(COST_MODES)}, got {mode!r}")
    return mode


def cost_for_mode(preset_name: str, workers: int, mode: str = "paper") -> CostModel:
    """The cost model a simulated figure uses for network preset ``preset_name`` and ``workers``.

    ``"paper"``: the preset itself. ``"calibrated"``: the calibrated cluster of the same network
    (``10gbe-*`` -> ``10gbe-calibrated``; ``56gbib-*``, ``100gbib-*`` -> ``100gbib-calibrated``) with
    the preset's top-k cost; for ``1gbe-*`` the published lines with 10GbE's realism. Computation is
    the trace's own in both modes.
    """
    check_cost_mode(mode)
    paper = preset(preset_name, workers)
    if mode == "paper" or preset_name.endswith("-calibrated"):
        return paper
    for prefix, name, own_cluster in _CALIBRATED_FOR:
        if preset_name.startswith(prefix):
            cal = calibrated_preset(name)
            if own_cluster:
                cm = cal.cost_model(workers)
                return replace(cm, topk_gamma_s=paper.topk_gamma_s,
                               source=f"{cm.source} (calibrated mode of preset {preset_name})")
            return replace(paper.with_realism(cal.realism),
                           source=f"preset {preset_name}'s lines + realism of {name} (calibrated mode)")
    raise CalibrationError(f"no calibrated model for network preset '{preset_name}'; calibrated modes exist "
                           f"for presets starting with {', '.join(p for p, _, _ in _CALIBRATED_FOR)}")


def mode_label(mode: str) -> str:
    """How a figure names its cost mode."""
    return {"paper": "paper model", "calibrated": "calibrated on ddl-benchmarks"}[check_cost_mode(mode)]


# Presets of a network kind the fits cover but another cluster: tables leave their calibrated rows out.
_NOT_THE_MEASURED_CLUSTER = {
    "10gbe-k80": "the MG-WFBP conference's K80 cluster (one GPU per node, its simulator's hop constants) is "
                 "not the measured 8 x 4 V100 cluster, and no measurement of it is public to fit",
}


def calibrated_omission(preset_name: str) -> str | None:
    """``None`` when network preset ``preset_name`` has a calibrated cluster of its own, else one line
    saying why not."""
    if preset_name.endswith("-calibrated"):
        return None
    if preset_name in _NOT_THE_MEASURED_CLUSTER:
        return _NOT_THE_MEASURED_CLUSTER[preset_name]
    for prefix, name, own_cluster in _CALIBRATED_FOR:
        if preset_name.startswith(prefix):
            return None if own_cluster else (
                f"no published measurements of a {prefix} cluster to fit (its calibrated mode would keep the "
                f"preset's published lines and borrow the realism of {name})")
    return "no calibrated cluster for this network"


def simulate_modes(run: Callable[[list[str], str], "pd.DataFrame"], presets: Sequence[str], drawn_mode: str = "paper",
                   omission: Callable[[str], str | None] = calibrated_omission
                   ) -> tuple["pd.DataFrame", dict[str, str]]:
    """One table of both cost modes: ``run(presets, mode)`` for ``drawn_mode`` on every preset, then the
    other mode (calibrated: only presets ``omission`` gives no reason for), concatenated. Returns the
    table and ``{preset: reason}`` of the calibrated rows left out."""
    import pandas as pd

    check_cost_mode(drawn_mode)
    frames, omitted = [], {}
    for mode in (drawn_mode, *[m for m in COST_MODES if m != drawn_mode]):
        chosen = list(presets)
        if mode == "calibrated" and mode != drawn_mode:
            omitted = {p: r for p in presets if (r := omission(p)) is not None}
            chosen = [p for p in presets if p not in omitted]
        if chosen:
            frames.append(run(chosen, mode))
    frames = [f for f in frames if len(f)]
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), omitted

