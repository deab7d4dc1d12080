"""Results are data: tidy tables plus a JSON of parameters and environment, under a results dir.

``write_table(df, results_dir, "mgwfbp_sim_speedup", params)`` writes
``mgwfbp_sim_speedup.csv`` and ``mgwfbp_sim_speedup.json`` (parameters, environment, columns).
Figures are drawn from what these files hold.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

import repro
from repro.core.outputs import output_file, write_output

__all__ = ["git_revision", "environment", "write_table", "read_table"]


def git_revision(cwd: str | Path | None = None) -> str | None:
    """The repository's HEAD commit (with ``-dirty`` if tracked files changed), or None. Read-only (no
    optional locks), so recording a result never races with the user's own git commands."""
    cwd = Path(cwd) if cwd else Path(repro.__file__).resolve().parent
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    git = ["git", "--no-optional-locks"]
    try:
        rev = subprocess.run([*git, "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True, env=env).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10, check=True,
                               env=env).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """Versions and machine facts worth keeping next to every result."""
    env: dict[str, Any] = {"repro": repro.__version__, "python": sys.version.split()[0],
                           "platform": platform.platform(), "machine": platform.machine(),
                           "git_revision": git_revision(), "pandas": pd.__version__,
                           "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if "torch" in sys.modules:  # only report torch if the run used it
        torch = sys.modules["torch"]
        env["torch"] = torch.__version__
        env["cuda"] = torch.cuda.is_available() and torch.cuda.get_device_name(0)
    return env


def write_table(df: pd.DataFrame, results_dir: str | Path, name: str,
                params: Mapping[str, Any] | None = None) -> Path:
    """Write ``df`` as ``<results_dir>/<name>.csv`` with a ``<name>.json`` sidecar; returns the CSV path."""
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / f"{name}.csv"
    meta = {"table": name, "rows": int(len(df)), "columns": list(map(str, df.columns)),
            "params": dict(params or {}), "environment": environment()}
    text = json.dumps(meta, indent=1, default=str) + "\n"  # fails (unserialisable) before anything is written
    with output_file(csv) as tmp:  # renamed into place whole: a reader never sees half a table
        df.to_csv(tmp, index=False)
    write_output(out / f"{name}.json", text)
    return csv


def read_table(results_dir: str | Path, name: str) -> pd.DataFrame:
    """``<results_dir>/<name>.csv``; FileNotFoundError if it was not written."""
    p = Path(results_dir) / f"{name}.csv"
    if not p.is_file():
        raise FileNotFoundError(f"result table not found: {p} (run the notebook or job that writes it)")
    return pd.read_csv(p)
