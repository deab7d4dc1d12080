"""Write docs/claims.md (and its snapshot docs/claims.csv) from the shipped claims and a results folder.

    python scripts/make_claims_doc.py                      # numbers from results/data when it exists
    python scripts/make_claims_doc.py --results out/data   # numbers from another results folder
    python scripts/make_claims_doc.py --keep-numbers       # claims data changed, numbers kept from the snapshot
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


def build(results: Path | None, keep_numbers: bool = False) -> tuple[pd.DataFrame, str]:
    """The snapshot and the page: numbers from ``results`` (a folder of result tables), or, with
    ``keep_numbers``, the claims data refreshed and the numbers kept from the current snapshot."""
    table = claims_table(results)
    snap = snapshot(table, numbers_provenance(results)).astype(str).replace({"None": "", "nan": ""})
    if keep_numbers and SNAPSHOT.is_file():
        old = read_snapshot().set_index("claim_id")
        for col in [c for c in SNAPSHOT_COLUMNS if c not in DATA_COLUMNS]:
            snap[col] = [old.at[i, col] if i in old.index else v for i, v in zip(snap["claim_id"], snap[col])]
    return snap, claims_markdown(snap)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None,
                   help="folder of result tables (default: results/data when it exists)")
    p.add_argument("--keep-numbers", action="store_true", help="keep our numbers from the current snapshot")
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
    snap, page = build(results, a.keep_numbers)
    if a.note and not a.keep_numbers:
        snap["numbers_from"] = snap["numbers_from"] + "; " + " ".join(a.note.split())
        page = claims_markdown(snap)
    snap.to_csv(SNAPSHOT, index=False)
    DOC.write_text(page, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)} and {SNAPSHOT.relative_to(ROOT)} ({len(snap)} claims; "
          f"numbers: {snap['numbers_from'].iloc[0] if len(snap) else '-'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
