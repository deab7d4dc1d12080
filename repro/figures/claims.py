"""The papers' claims as data (``data/claims/<paper>.yaml``): the paper's number, ours computed from the
result tables under ``results_dir``, and a verdict. Nothing here holds a result: a verdict changes when
the tables do. The claim format, metrics, bootstrap and verdict rules are described in
``docs/design/figures.md``. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["PAPERS", "VERDICTS", "NOT_RUN", "NO_INTERVAL", "NO_CALIBRATED", "MIN_SAMPLES", "BOOTSTRAP_RESAMPLES",
           "BOOTSTRAP_SEED", "RULES_TEXT", "ClaimsError", "claims_dir", "load_claims", "all_claims",
           "evaluate_metric", "verdict", "thresholds", "judge", "claims_table", "figure_claims",
           "figure_verdicts", "verdict_line", "claim_verdict", "metric_key", "parse_number",
           "format_number", "format_interval", "paper_title", "paper_setting_text", "settings_text", "why_key",
           "SNAPSHOT_COLUMNS", "snapshot",
           "claims_markdown", "numbers_provenance"]

PAPERS: tuple[str, ...] = ("mgwfbp", "omgs", "dear", "osp")
NOT_RUN = "not run yet"
NO_INTERVAL = "inconclusive (no interval)"
NO_CALIBRATED = "n/a (no calibrated preset)"
VERDICTS: tuple[str, ...] = ("reproduced", "direction only", "not reproduced", "inconclusive", NO_INTERVAL,
                             "not testable here")
MIN_SAMPLES = 5            # fewer pairs (runs, seeds) than this: inconclusive
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20260
BOOTSTRAP_LEVEL = 0.95
_AGGS = ("median", "max", "min", "mean", "first")
_AS = ("ratio", "pct", "diff", "pts")
_RULES = ("close", "at_least", "at_most")
_RULE_KEYS = {"kind", "atol", "etol", "rtol", "neutral", "neutral_atol"}
_CLAIM_KEYS = {"id", "claim", "figures", "paper", "rule", "judge_by", "simulated", "measured", "measured_summary",
               "settings", "facts", "why", "testable", "ours_note", "calibrated_na"}
_METRIC_KEYS = {"table", "where", "at_max", "value", "agg", "num", "den", "as", "by", "reduce", "unit", "pair",
                "cells", "exact"}
_SETTINGS_KEYS = {"params", "paper", "seeds", "note"}
_DEFAULT_SETTINGS = ("scale", "workers", "epochs", "density")
_REL_TOL = 1e-9  # numbers read back from CSV may differ in the last digit

RULES_TEXT = f"""One rule set, applied to every claim (`repro.figures.claims`):

- **reproduced**: our number is within the claim's tolerance of the paper's, on both sides ("up to N"
  claims included: far above the paper is not reproduced); for a bound ("at least as fast", "no accuracy
  loss") our number is on the paper's side of it.
- **direction only**: the effect is there, in the paper's direction, but its size is outside the
  tolerance (above or below).
- **not reproduced**: no effect, or the opposite (or a bound broken).
- **inconclusive**: a measured number whose 95% bootstrap interval (seeded, {BOOTSTRAP_RESAMPLES} resamples of
  the side-by-side pairs or seeds) straddles one of the rule's thresholds, or fewer than {MIN_SAMPLES} pairs ran;
  **inconclusive (no interval)**: a measured number from a table without samples. A measured number
  that is *exact* (a deterministic function of the seed, weights and data order, with no timing in it:
  the same run gives the same number) is judged as a point, and says so.
- **not testable here**, and **not run yet** (the notebook that writes the table has not run).

An "up to" number is the maximum over the paper's own models and settings only. Each method is judged
against the best baseline the paper compared it with. Variants this package adds (`optimal`,
`omgs_optimal`, `dear_model`, `dear_optimal`, `osp_auto`) are "ours" and never count as the paper's
method. Simulated claims are judged under the paper presets (the papers' fitted cost lines); the
calibrated presets' number and verdict stand beside them, and a claim where the two verdicts differ
is marked. Measured numbers come from small runs (see each claim's settings), which test the mechanism,
not the paper's scale.
"""


class ClaimsError(ValueError):
    """A malformed claims file; the message (one line) names the file and the claim."""


def claims_dir() -> Path:
    """``data/claims``: the shipped claim definitions (package data)."""
    from repro.core.paths import shipped_path

    return shipped_path("claims")


def _check_keys(x: Any, keys: set[str], what: str, where: str) -> None:
    """``x`` is a mapping whose keys are among ``keys`` (``what`` names it in the one-line error)."""
    if not isinstance(x, dict):
        raise ClaimsError(f"{where}: {what} must be a mapping")
    unknown = sorted(set(x) - keys)
    if unknown:
        raise ClaimsError(f"{where}: unknown {what} key(s) {', '.join(unknown)}")


def _check_metric(m: Any, where: str) -> None:
    if m is None:
        return
    _check_keys(m, _METRIC_KEYS, "metric", where)
    for k in ("table", "value"):
        if not m.get(k):
            raise ClaimsError(f"{where}: a metric needs '{k}'")
    if ("num" in m) != ("den" in m):
        raise ClaimsError(f"{where}: 'num' and 'den' go together")
    if m.get("agg", "median") not in _AGGS:
        raise ClaimsError(f"{where}: agg must be one of {', '.join(_AGGS)}")
    if m.get("as", "ratio") not in _AS:
        raise ClaimsError(f"{where}: 'as' must be one of {', '.join(_AS)}")
    if m.get("reduce", "max") not in ("max", "min", "median"):
        raise ClaimsError(f"{where}: reduce must be max, min or median")
    if "pair" in m and not isinstance(m["pair"], str):
        raise ClaimsError(f"{where}: 'pair' must name one column")
    if "cells" in m and "pair" not in m:
        raise ClaimsError(f"{where}: 'cells' needs 'pair' (it shapes the bootstrap)")


def _check_rule(rule: Any, where: str) -> None:
    if not isinstance(rule, dict) or rule.get("kind") not in _RULES:
        raise ClaimsError(f"{where}: rule.kind must be one of {', '.join(_RULES)}")
    _check_keys(rule, _RULE_KEYS, "rule", where)
    if "etol" in rule and rule.get("neutral") is None:
        raise ClaimsError(f"{where}: 'etol' (a share of the paper's effect) needs 'neutral'")


def _check_settings(s: Any, where: str) -> None:
    if s is None:
        return
    _check_keys(s, _SETTINGS_KEYS, "settings", where)
    for k in ("params", "paper"):
        if not isinstance(s.get(k) or {}, dict):
            raise ClaimsError(f"{where}: settings.{k} must be a mapping (label -> value)")


@lru_cache(maxsize=None)
def _load_file(path: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ClaimsError(f"{p}: cannot read claims: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise ClaimsError(f"{p}: expected a mapping with 'title' and a 'claims' list")
    out = []
    for i, c in enumerate(data["claims"]):
        where = f"{p.name}: claim #{i + 1}" + (f" ({c.get('id')})" if isinstance(c, dict) else "")
        if not isinstance(c, dict):
            raise ClaimsError(f"{where}: expected a mapping")
        unknown = sorted(set(c) - _CLAIM_KEYS)
        if unknown:
            raise ClaimsError(f"{where}: unknown key(s) {', '.join(unknown)}")
        for k in ("id", "claim", "paper"):
            if not c.get(k):
                raise ClaimsError(f"{where}: missing '{k}'")
        if not str(c["id"]).startswith(p.stem + "."):
            raise ClaimsError(f"{where}: id must start with '{p.stem}.'")
        if not isinstance(c["paper"], dict) or "source" not in c["paper"]:
            raise ClaimsError(f"{where}: 'paper' needs value (or null), unit and source")
        if c.get("testable", True):
            _check_rule(c.get("rule"), where)
        if c.get("judge_by", "simulated") not in ("simulated", "measured"):
            raise ClaimsError(f"{where}: judge_by must be simulated or measured")
        for k in ("simulated", "measured", "measured_summary"):
            _check_metric(c.get(k), f"{where}: {k}")
        if c.get("simulated") and "pair" in c["simulated"]:
            raise ClaimsError(f"{where}: simulated: a simulated number has no samples ('pair')")
        if c.get("measured_summary") and "pair" in c["measured_summary"]:
            raise ClaimsError(f"{where}: measured_summary: the summary is the table without samples ('pair')")
        _check_settings(c.get("settings"), f"{where}: settings")
        for name, m in (c.get("facts") or {}).items():
            _check_metric(m, f"{where}: fact {name}")
        out.append(dict(c, paper_key=p.stem, paper_title=str(data.get("title") or p.stem)))
    return str(data.get("title") or p.stem), tuple(out)


def load_claims(paper: str, directory: str | Path | None = None) -> list[dict[str, Any]]:
    """The claims of ``paper`` (``mgwfbp``, ``omgs``, ``dear``, ``osp``), validated; :class:`ClaimsError`
    for an unknown paper or a malformed file."""
    p = _claims_file(paper, directory)
    if not p.is_file():
        raise ClaimsError(f"no claims file for paper {paper!r}: {p} (known: {', '.join(PAPERS)})")
    return [dict(c) for c in _load_file(str(p.resolve()))[1]]


def paper_title(paper: str, directory: str | Path | None = None) -> str:
    return _load_file(str(_claims_file(paper, directory).resolve()))[0]


def _claims_file(paper: str, directory: str | Path | None) -> Path:
    return (Path(directory) if directory is not None else claims_dir()) / f"{paper}.yaml"


def all_claims(directory: str | Path | None = None) -> list[dict[str, Any]]:
    """Every claim of the four papers, in paper order."""
    return [c for p in PAPERS for c in load_claims(p, directory)]



# -- metrics

def _read(results_dir: Path, table: str, cache: dict[str, Any]) -> pd.DataFrame | None:
    if table not in cache:
        p = results_dir / f"{table}.csv"
        try:
            cache[table] = pd.read_csv(p) if p.is_file() else None
        except (OSError, ValueError, pd.errors.EmptyDataError):
            cache[table] = None
    return cache[table]


def _params(results_dir: Path, table: str, cache: dict[str, Any]) -> dict[str, Any] | None:
    """The ``params`` of ``<table>.json`` (the sidecar of :func:`repro.results.tables.write_table`), or None."""
    key = f"{table}.json"
    if key not in cache:
        try:
            meta = json.loads((results_dir / key).read_text(encoding="utf-8"))
            cache[key] = dict(meta.get("params") or {}) if isinstance(meta, dict) else None
        except (OSError, ValueError):
            cache[key] = None
    return cache[key]


def _match(col: pd.Series, want: Any) -> pd.Series:
    wants = want if isinstance(want, list) else [want]
    mask = pd.Series(False, index=col.index)
    for w in wants:
        if isinstance(w, bool):
            mask |= col.astype(str).str.lower() == str(w).lower()
        elif isinstance(w, (int, float)):
            num = pd.to_numeric(col, errors="coerce")
            mask |= (num - float(w)).abs() <= _REL_TOL * max(1.0, abs(float(w)))
        else:
            mask |= col.astype(str) == str(w)
    return mask


def _filter(df: pd.DataFrame, where: Mapping[str, Any] | None) -> pd.DataFrame | None:
    for k, v in (where or {}).items():
        if k not in df.columns:
            return None
        df = df[_match(df[k], v)]
    return df


def _cost_rows(df: pd.DataFrame, cost_mode: str | None) -> pd.DataFrame | None:
    """The rows of ``cost_mode``: ``paper`` = the column's ``paper`` or empty rows (all rows of a table
    without the column); ``calibrated`` = its ``calibrated`` rows (None: the table has no such column)."""
    if cost_mode is None:
        return df
    if "cost_mode" not in df.columns:
        return df if cost_mode == "paper" else None
    col = df["cost_mode"].astype("string").fillna("").str.strip()
    if cost_mode == "paper":
        return df[(col == "paper") | (col == "")]
    return df[col == cost_mode]


def _agg(values: pd.Series, how: str) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return None
    return float(v.iloc[0] if how == "first" else getattr(v, how)())


def _combine(a: Any, b: Any, how: str) -> Any:
    """``as`` on numbers or numpy arrays (the bootstrap's draws)."""
    if how in ("ratio", "pct"):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.divide(a, b)
        return r if how == "ratio" else 100.0 * (r - 1.0)
    return a - b if how == "diff" else 100.0 * (a - b)


def _select(metric: Mapping[str, Any], df: pd.DataFrame) -> pd.DataFrame | None:
    """``where`` and ``at_max`` applied; None when a column or the rows are missing."""
    df = _filter(df, metric.get("where"))
    if df is None or df.empty or metric["value"] not in df.columns:
        return None
    top = metric.get("at_max")
    if top:
        if top not in df.columns:
            return None
        col = pd.to_numeric(df[top], errors="coerce")
        df = df[col == col.max()]
    return df


def _groups(metric: Mapping[str, Any], df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]] | None:
    by = list(metric.get("by") or [])
    if any(b not in df.columns for b in by):
        return None
    if not by:
        return [("", df)]
    return [(", ".join(str(k) for k in (key if isinstance(key, tuple) else (key,))), g)
            for key, g in df.groupby(by, sort=False)]


def _per_group(metric: Mapping[str, Any], df: pd.DataFrame, side: Callable[[pd.DataFrame], Any]) -> list | None:
    """``(combined, at)`` per ``by`` group: ``as`` of ``side`` (a statistic of rows, None for none) on the
    group's ``num`` and ``den`` rows, where both have one; None when a ``by`` column is missing."""
    groups = _groups(metric, df)
    if groups is None:
        return None
    how = str(metric.get("as", "ratio"))
    out = []
    for at, g in groups:
        num, den = _filter(g, metric["num"]), _filter(g, metric["den"])
        if num is None or den is None:
            continue
        a, b = side(num), side(den)
        if a is not None and b is not None:
            out.append((_combine(a, b, how), at))
    return out


def _reduce(found: list[tuple[float, str]], how: str) -> tuple[float, str]:
    if how == "median":
        return float(np.median([v for v, _ in found])), f"median of {len(found)}"
    return (max if how == "max" else min)(found, key=lambda t: t[0])


def evaluate_metric(metric: Mapping[str, Any] | None, results_dir: str | Path,
                    cache: dict[str, Any] | None = None, cost_mode: str | None = None) -> dict[str, Any] | None:
    """Our number for ``metric`` from the tables in ``results_dir``: ``{"value", "at", "table"}``, plus
    ``"low"``, ``"high"`` (95% bootstrap interval) and ``"samples"`` for a ``pair`` metric; None when the
    table, a column or the rows are missing. ``cost_mode`` (``paper``, ``calibrated``, None: all rows)
    selects a simulated table's rows; ``{"value": None, "reason": NO_CALIBRATED}`` where the calibrated
    mode ran, but not for this metric's rows while the paper mode has them."""
    if not metric:
        return None
    cache = {} if cache is None else cache
    df = _read(Path(results_dir), str(metric["table"]), cache)
    if df is None:
        return None
    rows = _cost_rows(df, cost_mode)
    if rows is None or rows.empty:
        omitted = (_params(Path(results_dir), str(metric["table"]), cache) or {}).get("calibrated_omitted")
        if cost_mode == "calibrated" and rows is not None and omitted:
            return {"value": None, "at": "", "table": str(metric["table"]),
                    "reason": f"{NO_CALIBRATED[:-1]}: {', '.join(sorted(omitted))})"}
        return None
    got = _metric_value(metric, rows)
    if got is None and cost_mode == "calibrated" and _metric_value(metric, _cost_rows(df, "paper")) is not None:
        # the calibrated mode ran, but not for this claim's setting: no calibrated preset for it
        return {"value": None, "at": "", "table": str(metric["table"]), "reason": NO_CALIBRATED}
    return got


def _metric_value(metric: Mapping[str, Any], df: pd.DataFrame) -> dict[str, Any] | None:
    """:func:`evaluate_metric` on the rows ``df`` of its table."""
    df = _select(metric, df)
    if df is None:
        return None
    if "pair" in metric:
        return _bootstrap(metric, df)
    agg = str(metric.get("agg", "median"))
    value = str(metric["value"])
    if "num" not in metric:
        v = _agg(df[value], agg)
        return None if v is None else {"value": v, "at": "", "table": str(metric["table"])}
    per_group = _per_group(metric, df, lambda rows: _agg(rows[value], agg))
    found = [(float(v), at) for v, at in per_group or [] if math.isfinite(v)]  # x/0: inf or NaN, dropped
    if not found:
        return None
    v, at = _reduce(found, str(metric.get("reduce", "max")))
    return {"value": v, "at": at, "table": str(metric["table"])}


def _cell_medians(side: pd.DataFrame, cells: list[str], pair: str, value: str, pairs: np.ndarray,
                  draws: np.ndarray) -> list[np.ndarray]:
    """Per cell of ``side``: its median over the pairs of each draw (``draws``: resamples x pairs, indices
    into ``pairs``); an array of one entry per draw (NaN where the cell has no row in the drawn pairs)."""
    out = []
    keys = [c for c in cells if c in side.columns]
    for _, cell in (side.groupby(keys, sort=False, dropna=False) if keys else [((), side)]):
        vals = pd.to_numeric(cell[value], errors="coerce")
        cell = cell[vals.notna()]
        if cell.empty:
            continue
        per_pair = [pd.to_numeric(cell.loc[cell[pair] == p, value]).to_numpy(float) for p in pairs]
        width = max(1, max(len(v) for v in per_pair))
        grid = np.full((len(pairs), width), np.nan)
        for i, v in enumerate(per_pair):
            grid[i, :len(v)] = v
        picked = grid[draws].reshape(draws.shape[0], -1)  # draws x (pairs * width)
        with warnings.catch_warnings():  # a draw without this cell's pairs: NaN, dropped later
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append(np.nanmedian(picked, axis=1))
    return out


_NAN_STATS = {"min": np.nanmin, "max": np.nanmax, "mean": np.nanmean, "median": np.nanmedian}


def _side_stat(cells: list[np.ndarray], agg: str) -> np.ndarray | None:
    if not cells:
        return None
    m = np.vstack(cells)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _NAN_STATS[agg](m, axis=0) if agg in _NAN_STATS else m[0]  # else: first


def _bootstrap(metric: Mapping[str, Any], df: pd.DataFrame) -> dict[str, Any] | None:
    """The statistic of a ``pair`` metric on all pairs, and its seeded percentile interval
    (docs/design/figures.md); draw 0 is all pairs once, the others are resamples with replacement."""
    pair, value = str(metric["pair"]), str(metric["value"])
    if pair not in df.columns:
        return None
    df = df[df[pair].notna()]
    if df.empty:
        return None
    pairs = np.array(sorted(df[pair].unique(), key=lambda x: (str(type(x)), x)), dtype=object)
    n = len(pairs)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = np.vstack([np.arange(n)[None, :], rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))])
    agg = str(metric.get("agg", "median"))
    cells = list(metric.get("cells") or dict.fromkeys([*metric.get("num", {}), *metric.get("den", {})]))

    def side(rows: pd.DataFrame) -> np.ndarray | None:  # per draw; None for no rows
        return _side_stat(_cell_medians(rows, cells, pair, value, pairs, draws), agg)

    if "num" not in metric:
        stat = side(df)
        found = [] if stat is None else [(stat, "")]
    else:
        found = _per_group(metric, df, side) or []
    per_group = [(np.where(np.isfinite(v), v, np.nan), at) for v, at in found if math.isfinite(float(v[0]))]
    if not per_group:
        return None
    red = str(metric.get("reduce", "max"))
    point, at = _reduce([(float(v[0]), at) for v, at in per_group], red)
    m = np.vstack([v for v, _ in per_group])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        stats = _NAN_STATS[red](m, axis=0)[1:]
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return None
    half = 100.0 * (1.0 - BOOTSTRAP_LEVEL) / 2.0
    low, high = (float(x) for x in np.percentile(stats, [half, 100.0 - half]))
    return {"value": point, "at": at, "table": str(metric["table"]), "low": low, "high": high, "samples": n}


def metric_key(metric: Mapping[str, Any] | None) -> str:
    """A short fingerprint of a metric's definition (empty for none): the docs snapshot keeps a number
    only while the metric that computed it is unchanged."""
    if not metric:
        return ""
    text = json.dumps(metric, sort_keys=True, default=str)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:10]


# -- verdicts

def _tolerance(paper: float | None, rule: Mapping[str, Any]) -> tuple[float, float, float | None]:
    """``(ref, tol, neutral)`` of ``rule`` for the paper's number (docs/design/figures.md)."""
    neutral = rule.get("neutral")
    ref = float(paper) if paper is not None else float(neutral if neutral is not None else 0.0)
    if "atol" in rule:
        tol = float(rule["atol"])
    elif "etol" in rule:  # a share of the paper's effect |paper - neutral|: a 2% gain needs 1%, not 10%
        tol = float(rule["etol"]) * abs(ref - float(neutral))
    else:
        tol = float(rule.get("rtol", 0.0)) * abs(ref)
    return ref, tol, None if neutral is None else float(neutral)


def thresholds(paper: float | None, rule: Mapping[str, Any]) -> list[float]:
    """The numbers where ``rule``'s verdict changes (an interval across one is inconclusive)."""
    ref, tol, neutral = _tolerance(paper, rule)
    kind = rule.get("kind")
    if kind == "at_least":
        return [ref - tol]
    if kind == "at_most":
        return [ref + tol]
    out = [ref - tol, ref + tol]
    if neutral is not None:
        band = float(rule.get("neutral_atol", 0.0))
        out += sorted({neutral - band, neutral + band})
    return sorted(out)


def verdict(ours: float | None, paper: float | None, rule: Mapping[str, Any],
            interval: tuple[float, float] | None = None, samples: int | None = None) -> str:
    """The verdict of ``ours`` against ``paper`` under ``rule`` (docs/design/figures.md): :data:`NOT_RUN` when
    ours is missing; with ``interval`` (a measured number's bootstrap interval over ``samples`` pairs)
    *inconclusive* when fewer than :data:`MIN_SAMPLES` pairs ran or the interval straddles a threshold."""
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return NOT_RUN
    kind = rule.get("kind")
    if kind not in _RULES:
        raise ClaimsError(f"unknown rule kind {kind!r}")
    if interval is not None:
        lo, hi = sorted(float(x) for x in interval)
        if samples is not None and samples < MIN_SAMPLES:
            return "inconclusive"
        if any(lo < t < hi for t in thresholds(paper, rule)):
            return "inconclusive"
    ref, tol, neutral = _tolerance(paper, rule)
    if kind == "at_least":
        return "reproduced" if ours >= ref - tol else "not reproduced"
    if kind == "at_most":
        return "reproduced" if ours <= ref + tol else "not reproduced"
    if abs(ours - ref) <= tol:
        return "reproduced"
    band = float(rule.get("neutral_atol", 0.0))
    if neutral is not None and (ref - neutral) * (ours - neutral) > 0 and abs(ours - neutral) > band:
        return "direction only"
    return "not reproduced"


def judge(claim: Mapping[str, Any], simulated: float | None, measured: float | None,
          interval: tuple[float, float] | None = None, samples: int | None = None, exact: bool = False) -> str:
    """A claim's verdict from its judging number: ``simulated`` (a point) or ``measured`` (judged with its
    ``interval`` over ``samples`` pairs; without one, :data:`NO_INTERVAL`, unless the measured metric is
    ``exact``: a deterministic number, judged as a point)."""
    if not claim.get("testable", True):
        return "not testable here"
    paper, rule = claim["paper"].get("value"), claim["rule"]
    if str(claim.get("judge_by", "simulated")) == "simulated":
        return verdict(simulated, paper, rule)
    if measured is None or (isinstance(measured, float) and math.isnan(measured)):
        return NOT_RUN
    if interval is None and exact:
        return verdict(measured, paper, rule)
    if interval is None:
        return NO_INTERVAL
    return verdict(measured, paper, rule, interval, samples)


def claim_verdict(claim_id: str, ours: float | None, directory: str | Path | None = None) -> str:
    """The verdict word of claim ``claim_id`` (``<paper>.<name>``) for a simulated number ``ours`` a figure
    computed itself, under the claim's paper value and rule; :class:`ClaimsError` for an unknown claim."""
    paper = claim_id.split(".", 1)[0]
    for c in load_claims(paper, directory):
        if c["id"] == claim_id:
            return verdict(ours, c["paper"].get("value"), c["rule"])
    raise ClaimsError(f"no claim {claim_id!r} in {paper}.yaml")


def format_number(value: float | None, unit: str = "") -> str:
    """``1.31x``, ``+23.1%``, ``-0.4 pts``, ``12 s``...; ``—`` for None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    fmt = _UNIT_FORMATS.get(unit or "")
    return fmt.format(value) if fmt else f"{value:.3g} {unit}"


def format_interval(low: float, high: float, samples: int, unit: str = "") -> str:
    """``[0.95x, 1.10x], 6 pairs``: a bootstrap interval as the docs show it."""
    return f"[{format_number(low, unit)}, {format_number(high, unit)}], {samples} pair{'s' * (samples != 1)}"


_UNIT_FORMATS = {"x": "{:.2f}x", "%": "{:+.1f}%", "pts": "{:+.1f} pts", "": "{:.3g}"}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)")


def parse_number(text: str) -> float | None:
    """The leading number of a cell :func:`format_number` wrote (``2.17x (googlenet)`` -> 2.17), or None."""
    m = _NUMBER.match(str(text or "").strip())
    return float(m.group(0)) if m else None


def _why(claim: Mapping[str, Any], facts: Mapping[str, Any]) -> str:
    text = " ".join(str(claim.get("why") or "").split())
    try:
        return text.format_map(defaultdict(lambda: "?", facts))
    except (ValueError, IndexError):
        return text


def why_key(claim: Mapping[str, Any]) -> str:
    """The fingerprint of a claim's ``why`` text and the facts it fills in."""
    return metric_key({"why": claim.get("why"), "facts": claim.get("facts")})


def _fact_text(m: Mapping[str, Any], got: dict[str, Any] | None) -> str:
    if got is None or got.get("value") is None:
        return "?"
    unit = str(m.get("unit", ""))
    s = format_number(got["value"], unit) if unit else f"{got['value']:.3g}"
    return s + (f" ({got['at']})" if got.get("at") else "")


def _value(got: dict[str, Any] | None) -> float | None:
    return None if got is None else got.get("value")


def _setting_value(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_setting_value(x) for x in v) + "]"
    return str(v)


def _same_setting(ours: Any, paper: Any) -> bool:
    try:
        return math.isclose(float(ours), float(paper), rel_tol=1e-9)
    except (TypeError, ValueError):
        return _setting_value(ours) == _setting_value(paper)


def paper_setting_text(claim: Mapping[str, Any]) -> str:
    """The paper's setting as the claim's data gives it (``settings.paper``): ``density 0.001, workers 16``."""
    paper = (claim.get("settings") or {}).get("paper") or {}
    return ", ".join(f"{k} {_setting_value(v)}" for k, v in paper.items())


def settings_text(claim: Mapping[str, Any], table: str | None, results_dir: Path, cache: dict[str, Any]) -> str:
    """The settings the verdict depends on, read from ``table``'s params JSON and rows
    (docs/design/figures.md), each beside the paper's value where the claim gives one, then whether that
    is the paper's setting (and the claim's ``note`` when it is not); empty without a table."""
    if not table:
        return ""
    spec = claim.get("settings") or {}
    params = _params(results_dir, table, cache)
    df = _read(results_dir, table, cache)
    if params is None and df is None:
        return ""
    params = params or {}
    # by default the single-valued ones (a list is a sweep the claim's ``where`` picks one value of)
    wanted = dict(spec.get("params") or {k: k for k in _DEFAULT_SETTINGS
                                         if k in params and not isinstance(params[k], (list, dict))})
    paper = dict(spec.get("paper") or {})
    parts, differs = [], []

    def setting(label: str, ours: Any) -> None:  # ours beside the paper's value where the claim gives one
        text = f"{label} {'not recorded' if ours is None else _setting_value(ours)}"
        if label in paper and (ours is None or not _same_setting(ours, paper[label])):
            differs.append(label)
            text += f" (paper {_setting_value(paper[label])})"
        parts.append(text)

    for label, key in wanted.items():
        setting(label, params.get(key))
    col = spec.get("seeds")
    if col and df is not None and col not in df.columns and "seed" in df.columns:
        col = "seed"  # per-seed rows where the claim named a summary's count column
    if col:
        if df is not None and col in df.columns:
            vals = pd.to_numeric(df[col], errors="coerce").dropna()
            n = int(vals.nunique()) if col == "seed" else (int(vals.max()) if not vals.empty else 0)
            parts.append(f"seeds {n}")
        else:
            parts.append("seeds not recorded")
    judged_at = (claim.get("measured") or claim.get("simulated") or {}).get("where") or {}
    for label in paper:
        if label not in wanted:  # the value the verdict's metric selects (e.g. one density of a sweep)
            setting(label, judged_at.get(label))
    out = ", ".join(parts) or "no settings recorded"
    if paper and not differs:
        return out + "; at the paper's setting"
    if differs:
        note = " ".join(str(spec.get("note") or "").split())
        return out + "; not the paper's setting" + (f": {note}" if note else "")
    return out


def _measured(claim: Mapping[str, Any], results_dir: Path, cache: dict[str, Any]) -> tuple[dict | None, Any]:
    """The measured number and the metric that gave it: the ``pair`` metric's (with an interval), else
    ``measured_summary``'s; a measured metric without ``pair`` is itself a summary."""
    m = claim.get("measured")
    got = evaluate_metric(m, results_dir, cache)
    if got is not None or not claim.get("measured_summary"):
        return got, m
    return evaluate_metric(claim["measured_summary"], results_dir, cache), claim["measured_summary"]


def _evaluate(claim: Mapping[str, Any], results_dir: Path, cache: dict[str, Any]) -> dict[str, Any]:
    paper = claim["paper"]
    unit = str(paper.get("unit") or "")
    sim_m = claim.get("simulated")
    sim = evaluate_metric(sim_m, results_dir, cache, cost_mode="paper")
    cal = evaluate_metric(sim_m, results_dir, cache, cost_mode="calibrated")
    meas, meas_m = _measured(claim, results_dir, cache)
    facts = {name: _fact_text(m, evaluate_metric(m, results_dir, cache, cost_mode="paper"))
             for name, m in (claim.get("facts") or {}).items()}
    judge_by = str(claim.get("judge_by", "simulated"))
    interval = None if meas is None or "low" not in meas else (meas["low"], meas["high"])
    samples = None if meas is None else meas.get("samples")
    exact = bool(meas_m and meas_m.get("exact"))
    v = judge(claim, _value(sim), _value(meas), interval, samples, exact)
    if claim.get("calibrated_na"):
        cal = {"value": None, "at": "", "reason": f"n/a ({' '.join(str(claim['calibrated_na']).split())})"}
    if not sim_m or not claim.get("testable", True):
        v_cal = "n/a"
    elif _value(cal) is None:
        v_cal = _cell(sim_m, cal, unit, calibrated=True)
    else:
        v_cal = verdict(_value(cal), paper.get("value"), claim["rule"])
    judged_m = sim_m if judge_by == "simulated" else meas_m
    tables = sorted({str(m["table"]) for m in (sim_m, claim.get("measured"), claim.get("measured_summary")) if m})
    return {
        "paper": claim["paper_key"], "claim_id": claim["id"], "claim": " ".join(str(claim["claim"]).split()),
        "figures": ", ".join(claim.get("figures") or []),
        "paper_value": paper.get("value"), "unit": unit,
        "paper_text": str(paper.get("text") or format_number(paper.get("value"), unit)),
        "paper_source": " ".join(str(paper["source"]).split()), "paper_setting": paper_setting_text(claim),
        "simulated": _value(sim), "simulated_at": "" if sim is None else sim.get("at", ""),
        "calibrated": _value(cal),
        "measured": _value(meas), "measured_at": "" if meas is None else meas.get("at", ""),
        "measured_low": None if interval is None else interval[0],
        "measured_high": None if interval is None else interval[1], "measured_samples": samples,
        "simulated_text": _cell(sim_m, sim, unit), "calibrated_text": _cell(sim_m, cal, unit, calibrated=True),
        "measured_text": _cell(claim.get("measured") or claim.get("measured_summary"), meas, unit)
        + (" (exact)" if exact and meas is not None and interval is None else ""),
        "verdict": v, "verdict_calibrated": v_cal, "judged_by": judge_by, "why": _why(claim, facts),
        "settings_text": settings_text(claim, None if judged_m is None else str(judged_m["table"]), results_dir, cache),
        "tables": ", ".join(tables), "simulated_key": metric_key(sim_m),
        "measured_key": metric_key(meas_m if meas is not None else claim.get("measured")),
        "why_key": why_key(claim),
    }


def _cell(metric: Any, got: dict[str, Any] | None, unit: str, calibrated: bool = False) -> str:
    if not metric:
        return "n/a"
    if got is None:
        return NOT_RUN if calibrated else "not measured yet"
    if got.get("value") is None:
        return str(got.get("reason") or NOT_RUN)
    text = format_number(got["value"], unit) + (f" ({got['at']})" if got.get("at") else "")
    if "low" in got:
        text += " " + format_interval(got["low"], got["high"], int(got["samples"]), unit)
    return text


def claims_table(results_dir: str | Path | None, papers: Sequence[str] = PAPERS,
                 directory: str | Path | None = None) -> pd.DataFrame:
    """One row per claim of ``papers``: the paper's number and setting, ours under the paper presets
    (``simulated``), the calibrated ones and measured (with its bootstrap interval), their ``*_text`` cells
    as the docs show them, both verdicts, ``why``, ``settings_text``, ``tables`` and the definitions'
    fingerprints. ``results_dir`` None (or without the tables): every number "not measured yet"."""
    return pd.DataFrame(_evaluate_all([c for p in papers for c in load_claims(p, directory)], results_dir))


def _evaluate_all(claims: list[dict[str, Any]], results_dir: str | Path | None) -> list[dict[str, Any]]:
    """:func:`_evaluate` of each claim, the tables read once (no folder: none read)."""
    rd = Path(results_dir) if results_dir is not None else Path("/nonexistent-results-dir")
    cache: dict[str, Any] = {}
    return [_evaluate(c, rd, cache) for c in claims]


def figure_claims(figure_id: str, directory: str | Path | None = None) -> list[dict[str, Any]]:
    """The claims whose ``figures`` list ``figure_id``."""
    paper = figure_id.split(".", 1)[0]
    if paper not in PAPERS:
        return []
    return [c for c in load_claims(paper, directory) if figure_id in (c.get("figures") or [])]


def verdict_line(row: Mapping[str, Any]) -> str:
    """One line: ``not reproduced: ours 1.00x (simulated) vs paper 1.31x — <claim>``; a simulated
    claim whose calibrated verdict differs adds ``(calibrated: <verdict>, <number>)``."""
    v = row["verdict"]
    judged = row["judged_by"]
    ours = row["simulated_text"] if judged == "simulated" else row["measured_text"]
    if v == "not testable here":
        return f"{v}: {row['claim']}"
    cal = str(row.get("verdict_calibrated") or "")
    extra = ""
    if judged == "simulated" and cal in VERDICTS and cal != v:
        extra = f" (calibrated: {cal}, {row.get('calibrated_text', '')})"
    return f"{v}: ours {ours} ({judged}){extra} vs paper {row['paper_text']} — {row['claim']}"


def figure_verdicts(figure_id: str, results_dir: str | Path | None,
                    directory: str | Path | None = None) -> list[dict[str, str]]:
    """``[{"claim_id", "verdict", "line"}]`` for the claims shown by ``figure_id`` (empty when its paper
    makes no claim it shows), computed from the tables in ``results_dir``."""
    return [{"claim_id": row["claim_id"], "verdict": row["verdict"], "line": verdict_line(row)}
            for row in _evaluate_all(figure_claims(figure_id, directory), results_dir)]


# -- docs

SNAPSHOT_COLUMNS: tuple[str, ...] = (
    "paper", "claim_id", "claim", "figures", "paper_text", "paper_source", "paper_setting", "judged_by", "tables",
    "simulated", "simulated_text", "calibrated", "calibrated_text", "measured", "measured_low", "measured_high",
    "measured_samples", "measured_text", "verdict", "verdict_calibrated", "settings_text", "why",
    "simulated_key", "measured_key", "why_key", "numbers_from")
_DOC_INTRO = """\
Each paper's claims, our numbers beside the paper's, and a verdict. The claims are data
(`data/claims/<paper>.yaml`); `repro.figures.claims` computes our numbers from the result tables the
notebooks write, never from typed-in values, and each figure's gallery card and run record carry the
verdicts of the claims it shows. This page is generated by `scripts/make_claims_doc.py` from the claims
data and a snapshot of the computed table (`docs/claims.csv`).
"""
_DOC_RELEASED = """\
## Where our rules differ from the authors' released code

Our **MG-WFBP** merge rule, the **fixed-threshold** bucketing and **DeAR**'s threshold bucketing give
the same groups as the authors' released code on every trace tried. **OMGS-SGD** differs in two ways
([OMGS-SGD](omgs.md#differences-from-the-released-code)): the released merge puts the output layer into
the first group without evaluating that merge, and the released scripts switch the adaptive merge off
for a fixed 8192-element threshold; we implement the rule as published. See also
[MG-WFBP](mgwfbp.md#released-code) and [DeAR](dear.md#released-code).

The exact planners (`optimal`, `omgs_optimal`, `dear_optimal`, ours) are exact under their paper's
contention-free model; under the calibrated presets, which add contention, `compare.schedulers` keeps
the better of the exact plan and its family's heuristic plans (`repro.studies.compare.exact_choice`).
"""


def snapshot(table: pd.DataFrame, numbers_from: str) -> pd.DataFrame:
    """The docs' snapshot of :func:`claims_table`: :data:`SNAPSHOT_COLUMNS` (numbers, their display
    cells, verdicts, settings and the definitions' fingerprints), with ``numbers_from`` saying which
    results the numbers come from."""
    out = table.assign(numbers_from=numbers_from)
    return out[list(SNAPSHOT_COLUMNS)].reset_index(drop=True)


def _md(text: Any) -> str:
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return " ".join(s.split()).replace("|", "\\|")


def _disagree(r: Any) -> bool:
    return str(r.judged_by) == "simulated" and str(r.verdict_calibrated) in VERDICTS \
        and str(r.verdict) in VERDICTS and str(r.verdict_calibrated) != str(r.verdict)


def claims_markdown(snap: pd.DataFrame, directory: str | Path | None = None) -> str:
    """The docs page ``docs/claims.md`` from a :func:`snapshot`: the rules, the claims whose paper and
    calibrated verdicts disagree, one table per paper with each claim's "why", and the numbers' source."""
    lines = ["# The papers' claims, reproduced or not", "", _DOC_INTRO, "## Verdict rules", "", RULES_TEXT]
    split = [r for r in snap.itertuples() if _disagree(r)]
    lines += ["## Where the paper and calibrated presets disagree", ""]
    if split:
        lines += [f"- **{_md(r.claim_id)}**: {_md(r.verdict)} under the paper presets ({_md(r.simulated_text)}), "
                  f"{_md(r.verdict_calibrated)} under the calibrated ones ({_md(r.calibrated_text)})." for r in split]
    else:
        lines.append("Nowhere in these numbers (a claim whose calibrated column says \"not run yet\" has no "
                     "calibrated number to compare).")
    lines.append("")
    for paper in PAPERS:
        rows = snap[snap["paper"] == paper]
        if rows.empty:
            continue
        lines += [f"## {_md(paper_title(paper, directory))}", "",
                  "| claim | paper | ours, paper presets | ours, calibrated | measured (95% interval) | verdict "
                  "| settings |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows.itertuples():
            v = f"**{_md(r.verdict)}** (by {_md(r.judged_by)})"
            if _disagree(r):
                v += f"; calibrated: {_md(r.verdict_calibrated)}"
            setting = _md(r.settings_text) or "not in this snapshot"
            if _md(r.paper_setting):
                setting += f" — paper: {_md(r.paper_setting)}"
            lines.append(f"| **{_md(r.claim_id)}**: {_md(r.claim)} | {_md(r.paper_text)} | {_md(r.simulated_text)} | "
                         f"{_md(r.calibrated_text)} | {_md(r.measured_text)} | {v} | {setting} |")
        lines += [""]
        for r in rows.itertuples():
            lines.append(f"- **{_md(r.claim_id)}**: {_md(r.why)} *Paper: {_md(r.paper_source)}.*"
                         + (f" *Figures: {_md(r.figures)}; tables: {_md(r.tables)}.*" if _md(r.tables) else ""))
        lines.append("")
    lines.append(_DOC_RELEASED)
    numbers_from = str(snap["numbers_from"].iloc[0]) if len(snap) else "no results"
    lines += ["## Where the numbers come from", "", f"{_md(numbers_from)}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def numbers_provenance(results_dir: str | Path | None) -> str:
    """Which results a table's numbers come from: the result tables' folder, their write times and git
    revisions (from the tables' JSON sidecars), or ``"not measured yet (no results)"``."""
    if results_dir is None or not Path(results_dir).is_dir():
        return "not measured yet (no results)"
    used = {str(m["table"]) for c in all_claims() for m in
            [c.get("simulated"), c.get("measured"), c.get("measured_summary"), *(c.get("facts") or {}).values()] if m}
    times, revs = [], set()
    for t in sorted(used):
        p = Path(results_dir) / f"{t}.json"
        try:
            env = json.loads(p.read_text(encoding="utf-8")).get("environment") or {}
        except (OSError, ValueError):
            continue
        if env.get("time_utc"):
            times.append(str(env["time_utc"]))
        if env.get("git_revision"):
            revs.add(str(env["git_revision"])[:12])
    if not times:
        return "not measured yet (no results)"
    return (f"result tables written {min(times)[:16]} to {max(times)[:16]} UTC (git "
            f"{', '.join(sorted(revs)) or 'unknown'}); a cell 'not measured yet' is a table those runs did "
            "not write")
