"""Write docs/claims.md (and its snapshot docs/claims.csv) from the shipped claims and a results folder.

    python scripts/make_claims_doc.py                      # numbers from results/data when it exists
    python scripts/make_claims_doc.py --results out/data   # numbers from another results folder
    python scripts/make_claims_doc.py --keep-numbers       # claims data changed, numbers kept from the snapshot
    python scripts/make_claims_doc.py --update --results d # the claims whose tables d holds from d, the rest kept
    python scripts/make_claims_doc.py --check              # exit 1 if the page or snapshot is out of date

Our numbers are computed by repro.figures.claims from the tidy result tables the notebooks write (never
typed in); without results every cell says "not measured yet". The page is rendered from the snapshot
(docs/claims.csv), so tests can check the page against it and the snapshot against the claims data.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from repro.figures.claims import (  # noqa: E402
    SNAPSHOT_COLUMNS, all_claims, claims_markdown, claims_table, judge, metric_key, numbers_provenance,
    parse_number, snapshot, verdict, why_key)

DOC = ROOT / "docs" / "claims.md"
SNAPSHOT = ROOT / "docs" / "claims.csv"
# Columns of the snapshot that come from the claims data alone (the rest are our numbers).
DATA_COLUMNS = ("paper", "claim_id", "claim", "figures", "paper_text", "paper_source", "paper_setting", "judged_by",
                "tables")
# Cells kept together from the snapshot, each while the definition its fingerprint names is unchanged.
GROUPS = {"simulated_key": ("simulated", "simulated_text", "calibrated", "calibrated_text"),
          "measured_key": ("measured", "measured_low", "measured_high", "measured_samples", "measured_text"),
          "why_key": ("why",)}
NOT_MEASURED = "not measured yet"


def read_snapshot(path: Path = SNAPSHOT) -> pd.DataFrame:
    """The snapshot as strings; columns an older snapshot lacks are empty."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return df.reindex(columns=list(SNAPSHOT_COLUMNS), fill_value="")


def _has_number(cell: str) -> bool:
    """A snapshot cell with one of our numbers in it (not "n/a", empty or "not measured yet")."""
    return bool(cell) and cell != "n/a" and NOT_MEASURED not in cell


def _number(row: dict, col: str) -> float | None:
    """A number of the snapshot row: its numeric column, else the leading number of its display cell."""
    raw = str(row.get(col, "") or "")
    if raw:
        try:
            v = float(raw)
        except ValueError:
            v = math.nan
        if math.isfinite(v):
            return v
    text = str(row.get(f"{col}_text", "") or "")
    return parse_number(text) if _has_number(text) else None


def rejudge(row: dict, claim: dict) -> dict:
    """The row's verdicts recomputed under the current rules from the numbers it holds."""
    low, high = _number(row, "measured_low"), _number(row, "measured_high")
    n = _number(row, "measured_samples")
    interval = None if low is None or high is None else (low, high)
    meas_m = claim.get("measured") if interval is not None else (claim.get("measured_summary") or claim.get("measured"))
    exact = bool(meas_m and meas_m.get("exact"))
    row["verdict"] = judge(claim, _number(row, "simulated"), _number(row, "measured"), interval,
                           None if n is None else int(n), exact)
    cal = _number(row, "calibrated")
    if not claim.get("simulated") or not claim.get("testable", True):
        row["verdict_calibrated"] = "n/a"
    elif cal is None:
        row["verdict_calibrated"] = row.get("calibrated_text") or "not run yet"
    else:
        row["verdict_calibrated"] = verdict(cal, claim["paper"].get("value"), claim["rule"])
    return row


def build(results: Path | None, keep_numbers: bool = False, update: bool = False,
          note: str = "") -> tuple[pd.DataFrame, str]:
    """The snapshot and the page: numbers from ``results`` (a folder of result tables), or, with
    ``keep_numbers``, the claims data refreshed and the numbers kept from the current snapshot, or, with
    ``update``, the numbers of the claims whose tables ``results`` holds taken from it and the others
    kept from the snapshot (the provenance line then names both). A kept number stays only while the
    metric that computed it is unchanged (its fingerprint in the snapshot; a measured number from the
    claim's samples metric or its ``measured_summary``), and every kept row is judged again under the
    current rules."""
    table = claims_table(results)
    snap = snapshot(table, numbers_provenance(results)).astype(str).replace({"None": "", "nan": "", "<NA>": ""})
    if (keep_numbers or update) and SNAPSHOT.is_file():
        had = set(pd.read_csv(SNAPSHOT, dtype=str, keep_default_na=False, nrows=0).columns)
        old = read_snapshot(SNAPSHOT).set_index("claim_id")
        claims = {c["id"]: c for c in all_claims()}
        cells = ("simulated_text", "measured_text")
        rows = []
        for r in snap.to_dict("records"):
            i = r["claim_id"]
            # a claim is taken from results only when its row there has a number wherever the snapshot's had
            # one (a verdict is computed from the whole row: half a row would mix two runs' numbers)
            fresh = update and any(_has_number(r[c]) for c in cells) and all(
                _has_number(r[c]) for c in cells if i in old.index and _has_number(old.at[i, c]))
            if not fresh and i in old.index:
                c = claims[i]
                accept = {"simulated_key": {metric_key(c.get("simulated"))},
                          "measured_key": {metric_key(c.get("measured")), metric_key(c.get("measured_summary"))},
                          "why_key": {why_key(c)}}
                for key, group in GROUPS.items():
                    if old.at[i, key] and old.at[i, key] in accept[key] - {""}:
                        r[key] = old.at[i, key]
                        r.update({col: old.at[i, col] for col in group if col in had})
                if "settings_text" in had and old.at[i, "settings_text"]:
                    r["settings_text"] = old.at[i, "settings_text"]
                r = rejudge(r, c)
            r["_fresh"] = fresh
            rows.append(r)
        snap = pd.DataFrame(rows)
        fresh_ids = [r["claim_id"] for r in rows if r["_fresh"]]
        snap = snap.drop(columns="_fresh")[list(SNAPSHOT_COLUMNS)]
        before = old["numbers_from"].iloc[0] if len(old) else ""
        if update:
            snap["numbers_from"] = (f"{before} Updated since ({', '.join(fresh_ids)}): {snap['numbers_from'].iloc[0]}"
                                    + (f"; {' '.join(note.split())}" if note else ""))
        else:
            snap["numbers_from"] = before
    elif note:
        snap["numbers_from"] = snap["numbers_from"] + "; " + " ".join(note.split())
    return snap, claims_markdown(snap)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None,
                   help="folder of result tables (default: results/data when it exists)")
    p.add_argument("--keep-numbers", action="store_true", help="keep our numbers from the current snapshot")
    p.add_argument("--update", action="store_true",
                   help="take the numbers of the claims whose tables --results holds, keep the others' from the snapshot")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if out of date")
    p.add_argument("--note", default="", help="how the results were made (appended to the provenance line)")
    a = p.parse_args(argv)
    if a.check:
        snap = read_snapshot()
        data = build(None)[0]
        stale = [c for c in DATA_COLUMNS if list(snap[c]) != list(data[c])]
        if stale or DOC.read_text(encoding="utf-8") != claims_markdown(snap):
            print(f"docs/claims.md is out of date ({', '.join(stale) or 'page'}): run "
                  "python scripts/make_claims_doc.py --keep-numbers (or --results <dir>)", file=sys.stderr)
            return 1
        return 0
    results = a.results
    if results is None and not a.keep_numbers and (ROOT / "results" / "data").is_dir():
        results = ROOT / "results" / "data"
    if results is not None and not results.is_dir():
        print(f"make_claims_doc: --results {results} is not a folder", file=sys.stderr)
        return 1
    if a.update and results is None:
        print("make_claims_doc: --update needs --results <dir>", file=sys.stderr)
        return 1
    snap, page = build(results, a.keep_numbers, a.update, "" if a.keep_numbers else a.note)
    snap.to_csv(SNAPSHOT, index=False)
    DOC.write_text(page, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)} and {SNAPSHOT.relative_to(ROOT)} ({len(snap)} claims; "
          f"numbers: {snap['numbers_from'].iloc[0] if len(snap) else '-'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
