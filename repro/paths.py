"""Where data lives: what ships inside the package, and where local datasets are read from.

Shipped with the package (installed by ``pip install .``, no checkout needed): the traces
(``repro/shipped/traces/*.json``) and published paper numbers (``repro/shipped/paper_numbers/*.csv``).

Local datasets (CIFAR-10, ImageNet, PTB; never downloaded) are read from :func:`data_dir`:
``REPRO_DATA_DIR`` if set, else ``data/`` of the repository checkout the package runs from, else
``./data`` in the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_dir", "shipped_dir", "traces_dir", "shipped_trace_path", "shipped_traces", "paper_numbers_path"]

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir() -> Path:
    """The package's own data folder."""
    return _PACKAGE / "shipped"


def data_dir() -> Path:
    """Root of local datasets (see the module docstring)."""
    env = os.environ.get("REPRO_DATA_DIR")
    if env:
        return Path(env)
    checkout = _PACKAGE.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / "data"
    return Path.cwd() / "data"


def traces_dir() -> Path:
    return shipped_dir() / "traces"


def shipped_traces() -> list[str]:
    """Stems of the shipped traces (e.g. ``resnet50_b32_v100-estimate``)."""
    return sorted(p.stem for p in traces_dir().glob("*.json"))


def shipped_trace_path(stem: str) -> Path:
    p = traces_dir() / f"{stem}.json"
    if not p.is_file():
        known = ", ".join(shipped_traces()) or "(none)"
        raise FileNotFoundError(f"no shipped trace named '{stem}'; known: {known}")
    return p


def paper_numbers_path(name: str) -> Path:
    """A shipped table of published numbers (``name`` without ``.csv``)."""
    p = shipped_dir() / "paper_numbers" / f"{name}.csv"
    if not p.is_file():
        known = ", ".join(sorted(q.stem for q in p.parent.glob("*.csv"))) or "(none)"
        raise FileNotFoundError(f"no shipped paper numbers named '{name}'; known: {known}")
    return p
