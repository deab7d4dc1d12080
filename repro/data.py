"""Where the project's shipped data lives (``data/`` at the repository root).

Set ``REPRO_DATA_DIR`` to use another folder (for a non-editable install or a cluster copy).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir", "traces_dir", "shipped_trace_path", "shipped_traces"]


def data_dir() -> Path:
    env = os.environ.get("REPRO_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "data"


def traces_dir() -> Path:
    return data_dir() / "traces"


def shipped_traces() -> list[str]:
    """Stems of the traces shipped in ``data/traces`` (e.g. ``resnet50_b32_v100-estimate``)."""
    return sorted(p.stem for p in traces_dir().glob("*.json"))


def shipped_trace_path(stem: str) -> Path:
    p = traces_dir() / f"{stem}.json"
    if not p.is_file():
        known = ", ".join(shipped_traces()) or "(none)"
        raise FileNotFoundError(f"no shipped trace named '{stem}' in {traces_dir()}; known: {known}")
    return p
