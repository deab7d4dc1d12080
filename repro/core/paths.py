"""Where files are: the shipped data (the repository's ``data/``, installed as ``repro.shipped``) and
the root of local datasets (:func:`data_dir`: ``REPRO_DATA_DIR``, else ``data/datasets/`` of the
checkout, else ``./data/datasets``).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

__all__ = ["data_dir", "shipped_dir", "shipped_path", "traces_dir", "shipped_trace_path", "shipped_traces",
           "paper_numbers_path"]

_PACKAGE = Path(__file__).resolve().parents[1]  # repro/
_CHECKOUT = _PACKAGE.parent


def shipped_dir() -> Path:
    """The shipped data's folder: ``data/`` of a checkout, else ``repro/shipped`` of an installed wheel.
    A checkout's own ``data/`` comes first: another checkout's editable install maps ``repro.shipped``
    to *its* data."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "data").is_dir():
        return _CHECKOUT / "data"
    try:
        root = resources.files("repro.shipped")
    except ModuleNotFoundError:  # a checkout that is not installed: data/ beside the package
        return _CHECKOUT / "data"
    return Path(str(root))


def shipped_path(*parts: str) -> Path:
    """A path under the shipped data, e.g. ``shipped_path("grids", "dear.yaml")``."""
    return shipped_dir().joinpath(*parts)


def data_dir() -> Path:
    """Root of local datasets (see the module docstring)."""
    env = os.environ.get("REPRO_DATA_DIR")
    if env:
        return Path(env)
    if (_CHECKOUT / "pyproject.toml").is_file():
        return _CHECKOUT / "data" / "datasets"
    return Path.cwd() / "data" / "datasets"


def traces_dir() -> Path:
    return shipped_path("traces")


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
    p = shipped_path("paper_numbers", f"{name}.csv")
    if not p.is_file():
        known = ", ".join(sorted(q.stem for q in p.parent.glob("*.csv"))) or "(none)"
        raise FileNotFoundError(f"no shipped paper numbers named '{name}'; known: {known}")
    return p
