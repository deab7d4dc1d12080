"""The figure manifest (``notebooks/figures.yaml``): every figure id, its notebook, stem and status.

Format::

    papers:                      # optional: section titles of the index, keyed by id prefix
      mgwfbp: "MG-WFBP (...)"
    figures:
      - id: mgwfbp.timeline      # <paper>.<name>
        notebook: mgwfbp_simulation.ipynb   # relative to the manifest's folder
        stem: mgwfbp_timeline    # output files <stem>.png/.pdf/.json
        status: done             # done | planned
        kind: simulated (+ measured where a real timeline is recorded)
        title: One iteration, WFBP vs SyncEASGD vs MG-WFBP
        notes: optional free text shown in the index

``done``: a notebook (which must exist) makes the figure; ``planned``: none does yet. Ids and stems
are unique.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

__all__ = ["STATUSES", "PAPER_TITLES", "ManifestError", "FigureEntry", "default_manifest_path",
           "load_manifest", "done_notebooks", "paper_titles"]

STATUSES: tuple[str, ...] = ("done", "planned")
REQUIRED_KEYS: tuple[str, ...] = ("id", "notebook", "stem", "status", "kind", "title")
OPTIONAL_KEYS: tuple[str, ...] = ("notes",)

PAPER_TITLES: dict[str, str] = {"mgwfbp": "MG-WFBP", "omgs": "OMGS-SGD", "dear": "DeAR", "osp": "OSP",
                                "validation": "Across papers"}

_ID_RE = re.compile(r"^[a-z0-9_]+\.[a-z0-9_]+$")
_STEM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")


class ManifestError(ValueError):
    """The manifest is malformed; the message names the file and the offending entry."""


@dataclass(frozen=True)
class FigureEntry:
    """One figure of the manifest."""

    id: str
    notebook: str
    stem: str
    status: str
    kind: str
    title: str
    notes: str = ""
    notebooks_dir: Path = field(default=Path("."), compare=False, repr=False)
    paper_title: str = field(default="", compare=False, repr=False)

    @property
    def paper(self) -> str:
        """The id's prefix: ``"mgwfbp"`` for ``"mgwfbp.timeline"``."""
        return self.id.split(".", 1)[0]

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def notebook_path(self) -> Path:
        return self.notebooks_dir / self.notebook

    def files(self, figures_dir: str | Path) -> dict[str, Path]:
        """The files this figure produces in ``figures_dir``: png, pdf, json."""
        d = Path(figures_dir)
        return {ext: d / f"{self.stem}.{ext}" for ext in ("png", "pdf", "json")}


def default_manifest_path() -> Path:
    """``notebooks/figures.yaml`` of the repository this package lives in."""
    return Path(__file__).resolve().parents[2] / "notebooks" / "figures.yaml"


def _raw(path: str | Path | None) -> tuple[Path, dict[str, Any]]:
    import yaml

    p = Path(path) if path is not None else default_manifest_path()
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"figure manifest not found: {p}") from None
    except yaml.YAMLError as e:
        raise ManifestError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("figures"), list):
        raise ManifestError(f"{p}: expected a mapping with a 'figures' list")
    papers = data.get("papers") or {}
    if not isinstance(papers, dict):
        raise ManifestError(f"{p}: 'papers' must be a mapping of id prefix to section title")
    return p, data


def paper_titles(path: str | Path | None = None) -> dict[str, str]:
    """Section titles by id prefix: the built-in ones updated by the manifest's ``papers`` mapping."""
    _, data = _raw(path)
    return {**PAPER_TITLES, **{str(k): str(v) for k, v in (data.get("papers") or {}).items()}}


def load_manifest(path: str | Path | None = None, *, check_files: bool = True) -> list[FigureEntry]:
    """The manifest's entries in file order (default :func:`default_manifest_path`), validated:
    :class:`ManifestError` on a missing or unknown key, an unknown status or paper prefix, a malformed or
    duplicate id or stem, or (with ``check_files``) a ``done`` entry whose notebook does not exist."""
    p, data = _raw(path)
    titles = paper_titles(p)
    nb_dir = p.resolve().parent
    entries: list[FigureEntry] = []
    ids: dict[str, int] = {}
    stems: dict[str, str] = {}
    for i, raw in enumerate(data["figures"]):
        where = f"{p}: figure #{i + 1}"
        if not isinstance(raw, dict):
            raise ManifestError(f"{where}: expected a mapping, got {raw!r}")
        if "id" in raw:
            where = f"{p}: figure '{raw['id']}'"
        missing = [k for k in REQUIRED_KEYS if k not in raw or raw[k] in (None, "")]
        if missing:
            raise ManifestError(f"{where}: missing key(s) {', '.join(missing)}")
        unknown = sorted(set(raw) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
        if unknown:
            raise ManifestError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                                f"allowed: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
        vals = {k: str(raw[k]) for k in REQUIRED_KEYS}
        vals["notes"] = str(raw.get("notes") or "")
        fid = vals["id"]
        if not _ID_RE.match(fid):
            raise ManifestError(f"{where}: id must look like '<paper>.<name>' (lower case, digits, '_')")
        if fid in ids:
            raise ManifestError(f"{where}: duplicate id (also figure #{ids[fid] + 1})")
        ids[fid] = i
        prefix = fid.split(".", 1)[0]
        if prefix not in titles:
            raise ManifestError(f"{where}: unknown paper prefix '{prefix}'; known: {', '.join(titles)} "
                                "(add it under 'papers:')")
        if vals["status"] not in STATUSES:
            raise ManifestError(f"{where}: unknown status {vals['status']!r}; "
                                f"expected one of {', '.join(STATUSES)}")
        nb = vals["notebook"]
        if not nb.endswith(".ipynb") or Path(nb).is_absolute() or ".." in Path(nb).parts:
            raise ManifestError(f"{where}: notebook must be a .ipynb path inside {nb_dir}, got {nb!r}")
        stem = vals["stem"]
        if not _STEM_RE.match(stem):
            raise ManifestError(f"{where}: stem {stem!r} is not a plain file name")
        if stem in stems:
            raise ManifestError(f"{where}: duplicate stem '{stem}' (also '{stems[stem]}')")
        stems[stem] = fid
        entry = FigureEntry(notebooks_dir=nb_dir, paper_title=titles[prefix], **vals)
        if check_files and entry.done and not entry.notebook_path.is_file():
            raise ManifestError(f"{where}: status is done but its notebook does not exist: "
                                f"{entry.notebook_path}")
        entries.append(entry)
    return entries


def done_notebooks(entries: Iterable[FigureEntry] | None = None) -> list[str]:
    """Notebooks (relative names) with at least one ``done`` figure, each once, in manifest order."""
    if entries is None:
        entries = load_manifest()
    return list(dict.fromkeys(e.notebook for e in entries if e.done))
