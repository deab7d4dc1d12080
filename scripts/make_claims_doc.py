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
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from repro.figures.claims import (  # noqa: E402
    SNAPSHOT_COLUMNS, claims_markdown, claims_table, numbers_provenance, snapshot)

DOC = ROOT / "docs" / "claims.md"
SNAPSHOT = ROOT / "docs" / "claims.csv"
# Columns of the snapshot that come from the claims data alone (the rest are our numbers).
DATA_COLUMNS = ("paper", "claim_id", "claim", "figures", "paper_text", "paper_source", "judged_by", "tables")


def read_snapshot(path: Path = SNAPSHOT) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)[list(SNAPSHOT_COLUMNS)]


NOT_MEASURED = "not measured yet"


def _has_number(cell: str) -> bool:
    """A snapshot cell with one of our numbers in it (not "n/a", empty or "not measured yet")."""
    return bool(cell) and cell != "n/a" and NOT_MEASURED not in cell


def build(results: Path | None, keep_numbers: bool = False, update: bool = False,
          note: str = "") -> tuple[pd.DataFrame, str]:
    """The snapshot and the page: numbers from ``results`` (a folder of result tables), or, with
    ``keep_numbers``, the claims data refreshed and the numbers kept from the current snapshot, or, with
    ``update``, the numbers of the claims whose tables ``results`` holds taken from it and the others
    kept from the snapshot (the provenance line then names both)."""
    table = claims_table(results)
    snap = snapshot(table, numbers_provenance(results)).astype(str).replace({"None": "", "nan": ""})
    if (keep_numbers or update) and SNAPSHOT.is_file():
        old = read_snapshot(SNAPSHOT).set_index("claim_id")
        cells = ("simulated_text", "measured_text")
        # a claim is taken from results only when its row there has a number wherever the snapshot's had
        # one (a verdict is computed from the whole row: half a row would mix two runs' numbers)
        fresh = [update and any(_has_number(r[c]) for c in cells)
                 and all(_has_number(r[c]) for c in cells if i in old.index and _has_number(old.at[i, c]))
                 for i, r in zip(snap["claim_id"], snap.to_dict("records"))]
        for col in [c for c in SNAPSHOT_COLUMNS if c not in DATA_COLUMNS + ("numbers_from",)]:
            snap[col] = [v if new or i not in old.index else old.at[i, col]
                         for i, v, new in zip(snap["claim_id"], snap[col], fresh)]
        before = old["numbers_from"].iloc[0] if len(old) else ""
        if update:
            ids = ", ".join(i for i, new in zip(snap["claim_id"], fresh) if new)
            snap["numbers_from"] = (f"{before} Updated since ({ids}): {snap['numbers_from'].iloc[0]}"
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
