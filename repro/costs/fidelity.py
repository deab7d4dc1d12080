"""Fidelity: the per-message costs the measured clusters paid, fitted and cross-validated.

Each collective costs ``a0 + a1·(P-1) + a2·in_flight`` beyond its line (:mod:`repro.core.realism`).
:func:`fit_terms` fits ``(a1, a2)`` shared by both networks and ``a0``/``contention`` factors per network
over a grid; :func:`cross_validate` leaves one network, model or GPU count out; :func:`earns_keep` says
whether the terms beat refitting ``a0`` and contention alone. Guide: docs/fidelity.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from repro.costs import published_fits as pf
from repro.costs.calibrated import Calibration, CalibrationError, calibrated_preset

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TERMS", "A0_FACTORS", "CONTENTION_FACTORS", "A1_GRID_S", "A2_GRID_S", "Point", "with_terms",
           "with_point", "point_values", "grid_predictions", "fit_terms", "predict_fitted", "cross_validate", "split_table",
           "earns_keep", "fidelity_rows", "fidelity_summary", "SPLITS", "rms_log_error", "base_calibrations",
           "compute"]

TERMS = ("message_overhead_per_peer_s", "message_overhead_per_in_flight_s")
# Per network: multiples of the link fit's a0 and contention tried.
A0_FACTORS = (0.0, 0.5, 1.0)
CONTENTION_FACTORS = (0.75, 1.0, 1.25)
# Shared by both networks: a1 and a2, seconds.
A1_GRID_S = (0.0, 1e-6, 3e-6, 1e-5)
A2_GRID_S = (0.0, 3e-7, 1e-6, 3e-6)
SPLITS = ("fit", "network", "model", "gpus")   # all rows in; leave one network / model / GPU count out
NETWORKS = ("10gbe", "100gbib")
# One grid point of one network: (a0 factor, contention factor, a1 s, a2 s).
Point = tuple[float, float, float, float]
BASE_POINT_FACTORS = (1.0, 1.0)


def with_terms(cal: Calibration, terms: Mapping[str, float], fit_info: Mapping[str, Any] | None = None) -> Calibration:
    """``cal`` with the per-message terms set (``terms`` keyed by :data:`TERMS`)."""
    realism = replace(cal.realism, **{k: float(terms[k]) for k in TERMS})
    out = replace(cal, realism=realism)
    if fit_info is not None:
        out = replace(out, fit={**(cal.fit or {}), "per_message_terms": dict(fit_info)})
    return out


def with_point(base: Calibration, point: Point, fit_info: Mapping[str, Any] | None = None) -> Calibration:
    """``base`` with ``a0`` and ``contention`` scaled by the point's factors and ``(a1, a2)`` set."""
    f0, fc, a1, a2 = point
    cal = replace(base, realism=replace(base.realism, message_overhead_s=f0 * base.realism.message_overhead_s,
                                        contention=fc * base.realism.contention))
    return with_terms(cal, dict(zip(TERMS, (a1, a2))), fit_info)


def point_values(base: Calibration, point: Point) -> dict[str, float]:
    """A grid point's values on ``base``: ``message_overhead_s``, ``contention`` and the two terms."""
    r = with_point(base, point).realism
    return {"message_overhead_s": r.message_overhead_s, "contention": r.contention,
            TERMS[0]: r.message_overhead_per_peer_s, TERMS[1]: r.message_overhead_per_in_flight_s}


def rms_log_error(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.log(np.asarray(pred) / np.asarray(measured)) ** 2)))


def _grid_points(a0_factors: Sequence[float], contention_factors: Sequence[float], a1_grid: Sequence[float],
                 a2_grid: Sequence[float]) -> list[Point]:
    if 1.0 not in a0_factors or 1.0 not in contention_factors or 0.0 not in a1_grid or 0.0 not in a2_grid:
        raise CalibrationError("the grid must hold the link fit's point: a0 and contention factor 1, a1 and a2 0")
    return [(float(f0), float(fc), float(a1), float(a2)) for f0 in a0_factors for fc in contention_factors
            for a1 in a1_grid for a2 in a2_grid]


def grid_predictions(rows: pd.DataFrame, base: Mapping[str, Calibration] | None = None,
                     a0_factors: Sequence[float] = A0_FACTORS, contention_factors: Sequence[float] = CONTENTION_FACTORS,
                     a1_grid: Sequence[float] = A1_GRID_S, a2_grid: Sequence[float] = A2_GRID_S,
                     ) -> dict[str, dict[Point, np.ndarray]]:
    """``{network: {point: predicted seconds of its rows}}`` on each network's ``base`` calibration."""
    base = dict(base or base_calibrations())
    points = _grid_points(a0_factors, contention_factors, a1_grid, a2_grid)
    out: dict[str, dict[Point, np.ndarray]] = {}
    for net in sorted(set(rows.network)):
        if net not in base:
            raise CalibrationError(f"no base calibration for network '{net}'")
        sub = rows[(rows.network == net).to_numpy()].reset_index(drop=True)
        out[net] = {pt: pf.predict(sub, with_point(base[net], pt)) for pt in points}
    return out


def _network_masks(rows: pd.DataFrame, grid_pred: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {net: (rows.network == net).to_numpy() for net in grid_pred}


def fit_terms(rows: pd.DataFrame, grid_pred: Mapping[str, Mapping[Point, np.ndarray]],
              train: np.ndarray | None = None, terms: bool = True) -> tuple[dict[str, Point], float]:
    """``({network: point}, rms log error)`` of the joint fit on the ``train`` rows (default all):
    ``(a1, a2)`` shared, ``(a0, contention)`` factors per network (``(1, 1)`` without training rows);
    ``terms=False`` keeps ``a1 = a2 = 0``. Ties go to smaller terms, then factors nearer 1."""
    measured = rows.iteration_s.to_numpy(float)
    train = np.ones(len(rows), bool) if train is None else np.asarray(train, bool)
    masks = _network_masks(rows, grid_pred)
    terms = sorted({pt[2:] for g in grid_pred.values() for pt in g}) if terms else [(0.0, 0.0)]
    best: tuple[float, dict[str, Point]] | None = None
    for a1, a2 in terms:
        sse, n, choice = 0.0, 0, {}
        for net, g in grid_pred.items():
            tr = train[masks[net]]
            if not tr.any():
                choice[net] = (*BASE_POINT_FACTORS, a1, a2)
                continue
            m = measured[masks[net]][tr]
            cands = [pt for pt in g if pt[2:] == (a1, a2)]
            errs = {pt: float(np.sum(np.log(g[pt][tr] / m) ** 2)) for pt in cands}
            pt = min(cands, key=lambda p: (round(errs[p], 12), abs(p[0] - 1) + abs(p[1] - 1)))
            sse, n, choice[net] = sse + errs[pt], n + int(tr.sum()), pt
        rms = float(np.sqrt(sse / max(n, 1)))
        if best is None or round(rms, 12) < round(best[0], 12):
            best = (rms, choice)
    assert best is not None
    return best[1], best[0]


def predict_fitted(rows: pd.DataFrame, grid_pred: Mapping[str, Mapping[Point, np.ndarray]],
                   points: Mapping[str, Point]) -> np.ndarray:
    """Every row's prediction at its network's grid point."""
    out = np.full(len(rows), np.nan)
    for net, m in _network_masks(rows, grid_pred).items():
        out[m] = grid_pred[net][points[net]]
    return out


def _base_points(grid_pred: Mapping[str, Any]) -> dict[str, Point]:
    return {net: (*BASE_POINT_FACTORS, 0.0, 0.0) for net in grid_pred}


def cross_validate(rows: pd.DataFrame, grid_pred: Mapping[str, Mapping[Point, np.ndarray]]) -> pd.DataFrame:
    """One row per (split, held-out value, published row): predictions ``before`` (the link fit),
    ``no_terms`` (``a0`` and contention refitted without the held-out rows) and ``after`` (all four
    refitted), their relative errors and every network's fitted values."""
    import pandas as pd

    before = predict_fitted(rows, grid_pred, _base_points(grid_pred))
    parts = []
    for split in SPLITS:
        values = ["all"] if split == "fit" else sorted(set(rows[split]))
        for v in values:
            held = np.ones(len(rows), bool) if split == "fit" else (rows[split] == v).to_numpy()
            train = np.ones(len(rows), bool) if split == "fit" else ~held
            points, _ = fit_terms(rows, grid_pred, train)
            after = predict_fitted(rows, grid_pred, points)
            no_terms = predict_fitted(rows, grid_pred, fit_terms(rows, grid_pred, train, terms=False)[0])
            d = rows[held][["network", "model", "scheduler", "gpus", "iteration_s"]].copy()
            d.insert(0, "held_out", str(v))
            d.insert(0, "split", split)
            for k, pred in (("before", before), ("no_terms", no_terms), ("after", after)):
                d[f"{k}_s"] = pred[held]
            for k in ("before", "no_terms", "after"):
                d[f"{k}_error"] = d[f"{k}_s"] / d.iteration_s - 1
            pt = d.network.map(points)
            d[TERMS[0]] = [p[2] for p in pt]
            d[TERMS[1]] = [p[3] for p in pt]
            for net, (f0, fc, _, _) in points.items():   # every network's fitted factors, on every row
                d[f"a0_factor_{net}"], d[f"contention_factor_{net}"] = f0, fc
            parts.append(d)
    return pd.concat(parts, ignore_index=True)


def _stats(err: pd.Series) -> dict[str, Any]:
    a = err.abs()
    return {"rows": int(len(a)), "median_abs_error": float(a.median()), "max_abs_error": float(a.max()),
            "within_10pct": int((a <= 0.10).sum()), "within_15pct": int((a <= 0.15).sum())}


def split_table(cv: pd.DataFrame, base: Mapping[str, Calibration] | None = None) -> pd.DataFrame:
    """Error per split and held-out value, with the values fitted on its training rows (``a1_s``,
    ``a2_s``, ``a0_s_<net>``, ``contention_<net>``)."""
    import pandas as pd

    base = dict(base or base_calibrations())
    out = []
    for (split, v), d in cv.groupby(["split", "held_out"], sort=False):
        row = {"split": split, "held_out": v, "rows": len(d),
               "a1_s": float(d[TERMS[0]].iloc[0]), "a2_s": float(d[TERMS[1]].iloc[0])}
        for net in sorted(base):
            if f"a0_factor_{net}" in d:
                row[f"a0_s_{net}"] = float(d[f"a0_factor_{net}"].iloc[0]) * base[net].realism.message_overhead_s
                row[f"contention_{net}"] = float(d[f"contention_factor_{net}"].iloc[0]) * base[net].realism.contention
        for k in ("before", "no_terms", "after"):
            s = _stats(d[f"{k}_error"])
            row.update({f"{k}_median": s["median_abs_error"], f"{k}_max": s["max_abs_error"],
                        f"{k}_within_10pct": s["within_10pct"]})
        out.append(row)
    return pd.DataFrame(out)


def earns_keep(cv: pd.DataFrame) -> dict[str, Any]:
    """Whether the terms earn their keep: over the held-out rows, ``after`` has no fewer rows within
    ±10% and no larger median |error| than ``no_terms``, one strictly better.
    ``{"earns": bool, "rows", "<before|no_terms|after>_within_10pct", "<...>_median"}``."""
    d = cv[cv.split != "fit"]
    st = {k: _stats(d[f"{k}_error"]) for k in ("before", "no_terms", "after")}
    nt, a = st["no_terms"], st["after"]
    better = (a["within_10pct"] >= nt["within_10pct"] and a["median_abs_error"] <= nt["median_abs_error"]
              and (a["within_10pct"] > nt["within_10pct"] or a["median_abs_error"] < nt["median_abs_error"]))
    out: dict[str, Any] = {"earns": bool(better), "rows": nt["rows"]}
    for k, v in st.items():
        out[f"{k}_within_10pct"], out[f"{k}_median"] = v["within_10pct"], v["median_abs_error"]
    return out


KINDS = ("paper", "before", "after", "shipped")


def fidelity_rows(rows: pd.DataFrame, before_s: np.ndarray, after_s: np.ndarray,
                  paper_s: np.ndarray, shipped_s: np.ndarray | None = None) -> pd.DataFrame:
    """Every published number the simulator predicts (iteration times; MG-WFBP's speedups over WFBP
    and BSP) with the paper, before, after and shipped (default: before) predictions and errors."""
    import pandas as pd

    t = rows[["network", "model", "scheduler", "gpus", "iteration_s"]]
    t = t.rename(columns={"iteration_s": "published"})
    t["paper"], t["before"], t["after"] = paper_s, before_s, after_s
    t["shipped"] = before_s if shipped_s is None else shipped_s
    t["precision"] = "fp32"   # ddl-benchmarks runs FP32 only
    out = [t.assign(quantity="iteration_s", what=t.scheduler)[
        ["quantity", "what", "network", "model", "precision", "gpus", "published", *KINDS]]]
    for base in ("wfbp", "syncea"):
        rows_s = []
        for (net, model, g), d in t.groupby(["network", "model", "gpus"]):
            s = d.set_index("scheduler")
            if "mgwfbp" in s.index and base in s.index:
                rows_s.append({"quantity": "speedup", "what": f"mgwfbp/{base}", "network": net,
                               "model": model, "precision": "fp32", "gpus": int(g),
                               **{k: float(s.loc[base, k] / s.loc["mgwfbp", k])
                                  for k in ("published", *KINDS)}})
        out.append(pd.DataFrame(rows_s))
    f = pd.concat(out, ignore_index=True)
    for k in KINDS:
        f[f"{k}_error"] = f[k] / f.published - 1
    f["source"] = "HKBU-HPML/ddl-benchmarks 2020-05-29 (Shi et al., arXiv 2005.13247), measured"
    return f


def fidelity_summary(f: pd.DataFrame, by: Sequence[str] = ("quantity",)) -> pd.DataFrame:
    """Per group: rows, median and max |error|, rows within 10% and 15%, for each prediction kind."""
    import pandas as pd

    out = []
    for key, d in f.groupby(list(by)):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        for k in ("paper", "before", "after"):
            s = _stats(d[f"{k}_error"])
            row["rows"] = s["rows"]
            row.update({f"{k}_median": s["median_abs_error"], f"{k}_within_10pct": s["within_10pct"],
                        f"{k}_within_15pct": s["within_15pct"]})
        out.append(row)
    return pd.DataFrame(out)


FIDELITY_ROWS = pf.SHIPPED_DIR / "fidelity_rows.csv"    # every published number, paper/before/after
FIDELITY_CV = pf.SHIPPED_DIR / "fidelity_cv.csv"        # the cross-validation table (per split)
BASE_KEY = "link_fit_realism"   # under fit.per_message_terms: a0 and contention of the link fit


def base_calibrations() -> dict[str, Calibration]:
    """Each network's shipped calibration with the terms off and the link fit's ``a0``/``contention``
    (kept under ``fit.per_message_terms``), so that refitting is idempotent."""
    out = {}
    for n in NETWORKS:
        cal = calibrated_preset(f"{n}-calibrated")
        kept = ((cal.fit or {}).get("per_message_terms") or {}).get(BASE_KEY)
        if kept:
            cal = replace(cal, realism=replace(cal.realism, message_overhead_s=float(kept["message_overhead_s"]),
                                               contention=float(kept["contention"])))
        out[n] = with_terms(cal, dict.fromkeys(TERMS, 0.0))
    return out


def compute(a0_factors: Sequence[float] = A0_FACTORS, contention_factors: Sequence[float] = CONTENTION_FACTORS,
            a1_grid: Sequence[float] = A1_GRID_S, a2_grid: Sequence[float] = A2_GRID_S) -> dict[str, Any]:
    """Fit, cross-validate and build the report's tables: ``{"points", "rms", "rms_before", "cv",
    "splits", "verdict", "rows", "grid", "base"}``."""
    import pandas as pd

    rows = pf.calibration_rows()
    base = base_calibrations()
    g = grid_predictions(rows, base, a0_factors, contention_factors, a1_grid, a2_grid)
    measured = rows.iteration_s.to_numpy(float)
    points, rms = fit_terms(rows, g)
    cv = cross_validate(rows, g)
    table = pd.read_csv(pf.CV_TABLE)
    paper = table[table.fitted.astype(bool)].set_index(["network", "model", "scheduler", "gpus"]).paper_s
    paper_s = paper.reindex(pd.MultiIndex.from_frame(rows[["network", "model", "scheduler", "gpus"]])).to_numpy()
    if np.isnan(paper_s).any():
        paper_s = pf.predict(rows, None)
    before, after = predict_fitted(rows, g, _base_points(g)), predict_fitted(rows, g, points)
    verdict = earns_keep(cv)
    f = fidelity_rows(rows, before, after, paper_s, after if verdict["earns"] else before)
    return {"points": points, "rms": rms, "rms_before": rms_log_error(before, measured), "cv": cv,
            "splits": split_table(cv, base), "verdict": verdict, "rows": f, "base": base,
            "grid": {"a0_factors": list(a0_factors), "contention_factors": list(contention_factors),
                     "a1_s": list(a1_grid), "a2_s": list(a2_grid)}}
