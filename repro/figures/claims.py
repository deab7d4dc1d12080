"""The papers' claims as data: what each paper says, our number beside it, and a verdict.

The claims live in package data, one YAML file per paper (``data/claims/<paper>.yaml``); each
claim names the paper's number and where it comes from, the figures that show it, and *how* to compute
our simulated and measured numbers from the tidy result tables the notebooks write under
``results_dir`` (:func:`repro.tables.write_table`). Nothing here holds a result: every "our number" is
read from a table, so a verdict changes when the tables do.

A claim (YAML)::

    - id: omgs.speedup_resnet50
      claim: OMGS-SGD is 1.31x faster than TopK-SGD on ResNet-50 (16 workers, 1GbE)
      figures: [omgs.breakdown]            # manifest figure ids whose cards carry the verdict
      paper: {value: 1.31, unit: x, source: "omgs.md: 0.666 s / 0.507 s per iteration"}
      rule: {kind: close, etol: 0.5, neutral: 1.0}
      judge_by: simulated                  # simulated (default) | measured
      simulated:                           # a metric (below), or null
        table: omgs_paper_setting
        where: {model: resnet50}
        value: iteration_s
        num: {planner: topk_single}
        den: {planner: omgs}
        as: ratio
      measured: null
      facts: {buckets: {table: omgs_paper_setting, where: {model: resnet50, planner: omgs}, value: buckets, agg: max}}
      why: "the published rule puts every layer in {buckets} bucket(s) ..."   # {fact} placeholders

**Metric.** ``table`` (a CSV under ``results_dir``), ``where`` (column -> value or list of values; numbers
compared with a relative tolerance of 1e-9, because CSV round trips may change the last digit),
``at_max`` (keep the rows where this column is largest, e.g. the last epoch or the largest P), ``value``
(the column). Without ``num``/``den``: ``agg`` (median by default; max, min, mean, first) of the value.
With ``num`` and ``den`` (more filters each): the aggregate of each side, combined ``as`` ``ratio``
(num / den), ``pct`` (100 (num / den - 1)), ``diff`` (num - den) or ``pts`` (100 (num - den)); with
``by`` (columns) that is done per group and reduced with ``reduce`` (max by default, min, median); the
group that gave the number is kept as ``at``. The median is the default aggregate so repeated runs
(several seeds) give their median, never one lucky run.

**Verdict** from the number named by ``judge_by`` and ``rule``:

- ``close``: *reproduced* if ``|ours - paper| <= tol``; *partly* if ours lies on the same side of
  ``neutral`` as the paper's (the effect exists, its size differs); else *not reproduced*;
- ``at_least`` (the paper says "up to X" or "at least"): *reproduced* if ``ours >= paper - tol``;
  *partly* if ``ours > neutral`` (a gain, smaller); else *not reproduced*;
- ``at_most``: *reproduced* if ``ours <= paper + tol``; *partly* if ``ours <= partly_max`` (when given);
  else *not reproduced*;

with ``tol = atol``, ``etol * |paper - neutral|`` (a share of the paper's effect, so a claimed 2% gain
is not "reproduced" by no gain) or ``rtol * |paper|``. ``testable: false`` gives *not testable here* (with
``why``); a claim whose judging number is missing (its notebook has not run) is *not run yet*.

Torch-free; reads CSVs with pandas only.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

__all__ = ["PAPERS", "VERDICTS", "NOT_RUN", "ClaimsError", "claims_dir", "load_claims", "all_claims",
           "evaluate_metric", "verdict", "claims_table", "figure_claims", "figure_verdicts", "verdict_line",
           "claim_verdict",
           "format_number", "paper_title", "SNAPSHOT_COLUMNS", "snapshot", "claims_markdown",
           "numbers_provenance"]

PAPERS: tuple[str, ...] = ("mgwfbp", "omgs", "dear", "osp")
VERDICTS: tuple[str, ...] = ("reproduced", "partly", "not reproduced", "not testable here")
NOT_RUN = "not run yet"
_AGGS = ("median", "max", "min", "mean", "first")
_AS = ("ratio", "pct", "diff", "pts")
_RULES = ("close", "at_least", "at_most")
_CLAIM_KEYS = {"id", "claim", "figures", "paper", "rule", "judge_by", "simulated", "measured", "facts", "why",
               "testable", "ours_note"}
_METRIC_KEYS = {"table", "where", "at_max", "value", "agg", "num", "den", "as", "by", "reduce", "unit"}
_REL_TOL = 1e-9  # numbers read back from CSV may differ in the last digit


class ClaimsError(ValueError):
    """A malformed claims file; the message (one line) names the file and the claim."""


def claims_dir() -> Path:
    """``data/claims``: the shipped claim definitions (package data)."""
    from repro.paths import shipped_path

    return shipped_path("claims")


def _check_metric(m: Any, where: str) -> None:
    if m is None:
        return
    if not isinstance(m, dict):
        raise ClaimsError(f"{where}: a metric must be a mapping or null")
    unknown = sorted(set(m) - _METRIC_KEYS)
    if unknown:
        raise ClaimsError(f"{where}: unknown metric key(s) {', '.join(unknown)}")
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
        testable = c.get("testable", True)
        rule = c.get("rule") or {}
        if testable and rule.get("kind") not in _RULES:
            raise ClaimsError(f"{where}: rule.kind must be one of {', '.join(_RULES)}")
        if c.get("judge_by", "simulated") not in ("simulated", "measured"):
            raise ClaimsError(f"{where}: judge_by must be simulated or measured")
        for k in ("simulated", "measured"):
            _check_metric(c.get(k), f"{where}: {k}")
        for name, m in (c.get("facts") or {}).items():
            _check_metric(m, f"{where}: fact {name}")
        out.append(dict(c, paper_key=p.stem, paper_title=str(data.get("title") or p.stem)))
    return str(data.get("title") or p.stem), tuple(out)


def load_claims(paper: str, directory: str | Path | None = None) -> list[dict[str, Any]]:
    """The claims of ``paper`` (``mgwfbp``, ``omgs``, ``dear``, ``osp``), validated; :class:`ClaimsError`
    for an unknown paper or a malformed file."""
    d = Path(directory) if directory is not None else claims_dir()
    p = d / f"{paper}.yaml"
    if not p.is_file():
        raise ClaimsError(f"no claims file for paper {paper!r}: {p} (known: {', '.join(PAPERS)})")
    return [dict(c) for c in _load_file(str(p.resolve()))[1]]


def paper_title(paper: str, directory: str | Path | None = None) -> str:
    d = Path(directory) if directory is not None else claims_dir()
    return _load_file(str((d / f"{paper}.yaml").resolve()))[0]


def all_claims(directory: str | Path | None = None) -> list[dict[str, Any]]:
    """Every claim of the four papers, in paper order."""
    return [c for p in PAPERS for c in load_claims(p, directory)]


# --------------------------------------------------------------------------------------- metrics

def _read(results_dir: Path, table: str, cache: dict[str, pd.DataFrame | None]) -> pd.DataFrame | None:
    if table not in cache:
        p = results_dir / f"{table}.csv"
        try:
            cache[table] = pd.read_csv(p) if p.is_file() else None
        except (OSError, ValueError, pd.errors.EmptyDataError):
            cache[table] = None
    return cache[table]


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


def _agg(values: pd.Series, how: str) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return None
    return float(v.iloc[0] if how == "first" else getattr(v, how)())


def _combine(a: float | None, b: float | None, how: str) -> float | None:
    if a is None or b is None:
        return None
    if how in ("ratio", "pct"):
        if b == 0:
            return None
        return a / b if how == "ratio" else 100.0 * (a / b - 1.0)
    return a - b if how == "diff" else 100.0 * (a - b)


def evaluate_metric(metric: Mapping[str, Any] | None, results_dir: str | Path,
                    cache: dict[str, pd.DataFrame | None] | None = None) -> dict[str, Any] | None:
    """Our number for ``metric`` from the tables in ``results_dir``: ``{"value", "at", "table"}``, or None
    when the table, a column or the rows are missing (see the module docstring)."""
    if not metric:
        return None
    cache = {} if cache is None else cache
    df = _read(Path(results_dir), str(metric["table"]), cache)
    if df is None:
        return None
    df = _filter(df, metric.get("where"))
    if df is None or df.empty or metric["value"] not in df.columns:
        return None
    top = metric.get("at_max")
    if top:
        if top not in df.columns:
            return None
        col = pd.to_numeric(df[top], errors="coerce")
        df = df[col == col.max()]
    agg = str(metric.get("agg", "median"))
    value = str(metric["value"])
    if "num" not in metric:
        v = _agg(df[value], agg)
        return None if v is None else {"value": v, "at": "", "table": str(metric["table"])}
    how = str(metric.get("as", "ratio"))
    by = list(metric.get("by") or [])
    if any(b not in df.columns for b in by):
        return None
    groups = df.groupby(by, sort=False) if by else [((), df)]
    found: list[tuple[float, str]] = []
    for key, g in groups:
        num, den = _filter(g, metric["num"]), _filter(g, metric["den"])
        if num is None or den is None:
            continue
        v = _combine(_agg(num[value], agg), _agg(den[value], agg), how)
        if v is not None and math.isfinite(v):
            key = key if isinstance(key, tuple) else (key,)
            found.append((v, ", ".join(str(k) for k in key)))
    if not found:
        return None
    red = str(metric.get("reduce", "max"))
    if red == "median":
        vals = sorted(v for v, _ in found)
        return {"value": float(pd.Series(vals).median()), "at": f"median of {len(vals)}",
                "table": str(metric["table"])}
    v, at = (max if red == "max" else min)(found, key=lambda t: t[0])
    return {"value": v, "at": at, "table": str(metric["table"])}


# --------------------------------------------------------------------------------------- verdicts

def verdict(ours: float | None, paper: float | None, rule: Mapping[str, Any]) -> str:
    """The verdict of ``ours`` against ``paper`` under ``rule`` (module docstring); :data:`NOT_RUN` when
    ours is missing."""
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return NOT_RUN
    kind = rule.get("kind")
    neutral = rule.get("neutral")
    ref = float(paper) if paper is not None else float(neutral if neutral is not None else 0.0)
    if "atol" in rule:
        tol = float(rule["atol"])
    elif "etol" in rule:  # a share of the paper's effect |paper - neutral|: a 2% gain needs 1%, not 10%
        tol = float(rule["etol"]) * abs(ref - float(neutral if neutral is not None else 0.0))
    else:
        tol = float(rule.get("rtol", 0.0)) * abs(ref)
    if kind == "close":
        if abs(ours - ref) <= tol:
            return "reproduced"
        if neutral is not None and (ours - neutral) * (ref - neutral) > 0:
            return "partly"
        return "not reproduced"
    if kind == "at_least":
        if ours >= ref - tol:
            return "reproduced"
        if neutral is not None and ours > float(neutral) + float(rule.get("neutral_atol", 0.0)):
            return "partly"
        return "not reproduced"
    if kind == "at_most":
        if ours <= ref + tol:
            return "reproduced"
        if "partly_max" in rule and ours <= float(rule["partly_max"]):
            return "partly"
        return "not reproduced"
    raise ClaimsError(f"unknown rule kind {kind!r}")


def claim_verdict(claim_id: str, ours: float | None, directory: str | Path | None = None) -> str:
    """The verdict word of claim ``claim_id`` (``<paper>.<name>``) for the number ``ours``, under the
    claim's own paper value and rule: what a figure says beside a number it computed itself (e.g. from
    a paper-scale panel), judged exactly as the gallery card judges the claim's table."""
    paper = claim_id.split(".", 1)[0]
    for c in load_claims(paper, directory):
        if c["id"] == claim_id:
            return verdict(ours, c["paper"].get("value"), c["rule"])
    raise ClaimsError(f"no claim {claim_id!r} in {paper}.yaml")


def format_number(value: float | None, unit: str = "") -> str:
    """``1.31x``, ``+23.1%``, ``-0.4 pts``, ``12 s``...; ``—`` for None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:+.1f}%"
    if unit == "pts":
        return f"{value:+.1f} pts"
    if unit in ("", None):
        return f"{value:.3g}"
    return f"{value:.3g} {unit}"


class _Facts(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _why(claim: Mapping[str, Any], facts: Mapping[str, Any]) -> str:
    text = " ".join(str(claim.get("why") or "").split())
    try:
        return text.format_map(_Facts(facts))
    except (ValueError, IndexError):
        return text


def _fact_text(m: Mapping[str, Any], got: dict[str, Any] | None) -> str:
    if got is None:
        return "?"
    unit = str(m.get("unit", ""))
    s = format_number(got["value"], unit) if unit else f"{got['value']:.3g}"
    return s + (f" ({got['at']})" if got.get("at") else "")


def _evaluate(claim: Mapping[str, Any], results_dir: Path, cache: dict[str, Any]) -> dict[str, Any]:
    paper = claim["paper"]
    unit = str(paper.get("unit") or "")
    sim = evaluate_metric(claim.get("simulated"), results_dir, cache)
    meas = evaluate_metric(claim.get("measured"), results_dir, cache)
    facts = {name: _fact_text(m, evaluate_metric(m, results_dir, cache))
             for name, m in (claim.get("facts") or {}).items()}
    judge_by = str(claim.get("judge_by", "simulated"))
    if not claim.get("testable", True):
        v = "not testable here"
    else:
        judged = sim if judge_by == "simulated" else meas
        v = verdict(None if judged is None else judged["value"], paper.get("value"), claim["rule"])
    tables = sorted({str(m["table"]) for m in (claim.get("simulated"), claim.get("measured")) if m})
    return {
        "paper": claim["paper_key"], "claim_id": claim["id"], "claim": " ".join(str(claim["claim"]).split()),
        "figures": ", ".join(claim.get("figures") or []),
        "paper_value": paper.get("value"), "unit": unit, "paper_text": str(paper.get("text") or format_number(paper.get("value"), unit)),
        "paper_source": " ".join(str(paper["source"]).split()),
        "simulated": None if sim is None else sim["value"], "simulated_at": "" if sim is None else sim["at"],
        "measured": None if meas is None else meas["value"], "measured_at": "" if meas is None else meas["at"],
        "simulated_text": _cell(claim.get("simulated"), sim, unit),
        "measured_text": _cell(claim.get("measured"), meas, unit),
        "verdict": v, "judged_by": judge_by, "why": _why(claim, facts), "tables": ", ".join(tables),
    }


def _cell(metric: Any, got: dict[str, Any] | None, unit: str) -> str:
    if not metric:
        return "n/a"
    if got is None:
        return "not measured yet"
    return format_number(got["value"], unit) + (f" ({got['at']})" if got.get("at") else "")


def claims_table(results_dir: str | Path | None, papers: Sequence[str] = PAPERS,
                 directory: str | Path | None = None) -> pd.DataFrame:
    """One row per claim of ``papers``: paper, claim_id, claim, figures, paper_value, unit, paper_text,
    paper_source, simulated (+ simulated_at, the group that gave it), measured (+ measured_at), the
    ``*_text`` cells as the docs show them, verdict, judged_by, why (with our facts filled in), tables.
    ``results_dir`` None (or a folder without the tables): every number "not measured yet"."""
    rd = Path(results_dir) if results_dir is not None else Path("/nonexistent-results-dir")
    cache: dict[str, Any] = {}
    rows = [_evaluate(c, rd, cache) for p in papers for c in load_claims(p, directory)]
    return pd.DataFrame(rows)


def figure_claims(figure_id: str, directory: str | Path | None = None) -> list[dict[str, Any]]:
    """The claims whose ``figures`` list ``figure_id``."""
    paper = figure_id.split(".", 1)[0]
    if paper not in PAPERS:
        return []
    return [c for c in load_claims(paper, directory) if figure_id in (c.get("figures") or [])]


def verdict_line(row: Mapping[str, Any]) -> str:
    """One line: ``not reproduced: ours 1.00x (simulated) vs paper 1.31x — <claim>``."""
    v = row["verdict"]
    judged = row["judged_by"]
    ours = row["simulated_text"] if judged == "simulated" else row["measured_text"]
    if v == "not testable here":
        return f"{v}: {row['claim']}"
    return f"{v}: ours {ours} ({judged}) vs paper {row['paper_text']} — {row['claim']}"


def figure_verdicts(figure_id: str, results_dir: str | Path | None,
                    directory: str | Path | None = None) -> list[dict[str, str]]:
    """``[{"claim_id", "verdict", "line"}]`` for the claims shown by ``figure_id`` (empty when its paper
    makes no claim it shows), computed from the tables in ``results_dir``."""
    claims = figure_claims(figure_id, directory)
    if not claims:
        return []
    rd = Path(results_dir) if results_dir is not None else Path("/nonexistent-results-dir")
    cache: dict[str, Any] = {}
    out = []
    for c in claims:
        row = _evaluate(c, rd, cache)
        out.append({"claim_id": row["claim_id"], "verdict": row["verdict"], "line": verdict_line(row)})
    return out


# ------------------------------------------------------------------------------------------ docs

SNAPSHOT_COLUMNS: tuple[str, ...] = ("paper", "claim_id", "claim", "figures", "paper_text", "paper_source",
                                     "simulated_text", "measured_text", "verdict", "judged_by", "why", "tables",
                                     "numbers_from")
_DOC_INTRO = """\
Each paper's claims, our number beside the paper's, and a verdict. The claims are data
(`data/claims/<paper>.yaml`: the claim, the paper's number and where it comes from, and how our
number is computed from the result tables the notebooks write); `repro.figures.claims` computes our numbers
from those tables, never from typed-in values, and each figure's gallery card and run record carry the
verdicts of the claims it shows. This page is generated by `scripts/make_claims_doc.py` from the claims
data and a snapshot of the computed table (`docs/claims.csv`); a test checks that both agree with the
data.

Verdicts: **reproduced** (our number within the claim's tolerance of the paper's), **partly** (the effect
is there, its size differs), **not reproduced** (no effect, or the opposite), **not testable here**, and
**not run yet** (the notebook that writes the table has not run). *Simulated* numbers come from the
trace-based simulator at the paper's setting (roofline-estimate traces, the papers' fitted cost lines);
*measured* numbers from tiny CPU runs on this machine (gloo, 2 ranks), which test the mechanism, not the
paper's scale. Variants this package adds (`optimal`, `omgs_optimal`, `dear_model`, `dear_optimal`,
`osp_auto`) are named "ours" and never count as the paper's method.
"""
_DOC_RELEASED = """\
## Where our rules differ from the authors' released code

An independent check compared this package's plans with the authors' released code on every trace
tried: our **MG-WFBP** merge rule, the **fixed-threshold** bucketing and **DeAR**'s threshold bucketing
give the same groups as the released code. **OMGS-SGD** differs in two ways, both documented in
[OMGS-SGD](omgs.md#differences-from-the-released-code): the released merge puts the output layer into the
first group without evaluating that merge (12.7% slower on the LSTM at 16 workers than the rule as
published), and the released scripts switch the adaptive merge off in favour of a fixed 8192-element
threshold. We implement the rule as published. See also [MG-WFBP](mgwfbp.md#released-code) and
[DeAR](dear.md#released-code).

## Exact planners under contention

`optimal`, `omgs_optimal` and `dear_optimal` (ours) are exact under their paper's contention-free model.
The calibrated cost models of `compare.schedulers` add contention the planners do not see, so there an
exact plan can lose to a heuristic's. In that figure's table each exact planner's row is the best of its
exact plan and the plans of the heuristics of its plan family, each simulated under the cost model that
judges them (`repro.studies.compare.exact_choice`; columns `plan_from`, `exact_plan_iteration_s`,
`exact_plan_loss_pct`), and the note under the figure says where and by how much the exact plan lost.
"""


def snapshot(table: pd.DataFrame, numbers_from: str) -> pd.DataFrame:
    """The docs' snapshot of :func:`claims_table`: the display columns (:data:`SNAPSHOT_COLUMNS`) with
    ``numbers_from`` saying which results the numbers come from."""
    out = table.assign(numbers_from=numbers_from)
    return out[list(SNAPSHOT_COLUMNS)].reset_index(drop=True)


def _md(text: Any) -> str:
    s = "" if text is None or (isinstance(text, float) and math.isnan(text)) else str(text)
    return " ".join(s.split()).replace("|", "\\|")


def claims_markdown(snap: pd.DataFrame, directory: str | Path | None = None) -> str:
    """The docs page (``docs/claims.md``) from a :func:`snapshot`: one table per paper, then each claim's
    "why" and the paper's source."""
    lines = ["# The papers' claims, reproduced or not", "", _DOC_INTRO]
    numbers_from = str(snap["numbers_from"].iloc[0]) if len(snap) else "no results"
    lines += [f"Our numbers: {_md(numbers_from)}.", ""]
    for paper in PAPERS:
        rows = snap[snap["paper"] == paper]
        if rows.empty:
            continue
        lines += [f"## {_md(paper_title(paper, directory))}", "",
                  "| claim | paper | ours, simulated | ours, measured (tiny) | verdict | figures |",
                  "|---|---|---|---|---|---|"]
        for r in rows.itertuples():
            lines.append(f"| **{_md(r.claim_id)}**: {_md(r.claim)} | {_md(r.paper_text)} | {_md(r.simulated_text)} | "
                         f"{_md(r.measured_text)} | **{_md(r.verdict)}** (by {_md(r.judged_by)}) | "
                         f"{_md(r.figures)} |")
        lines += ["", "Why ours differs, and where the paper's number comes from:", ""]
        for r in rows.itertuples():
            lines.append(f"- **{_md(r.claim_id)}**: {_md(r.why)} *Paper: {_md(r.paper_source)}.*"
                         + (f" *Tables: {_md(r.tables)}.*" if _md(r.tables) else ""))
        lines.append("")
    lines.append(_DOC_RELEASED)
    return "\n".join(lines).rstrip() + "\n"


def numbers_provenance(results_dir: str | Path | None) -> str:
    """Which results a table's numbers come from: the result tables' folder, their write times and git
    revisions (from the tables' JSON sidecars), or ``"not measured yet (no results)"``."""
    import json

    if results_dir is None or not Path(results_dir).is_dir():
        return "not measured yet (no results)"
    used = {str(m["table"]) for c in all_claims() for m in
            [c.get("simulated"), c.get("measured"), *(c.get("facts") or {}).values()] if m}
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
