"""The registries' shared mechanism: tables filled by the families themselves, loaded on first use.

:func:`load_families` imports every family package once: the folders of :mod:`repro.families`
(:data:`BUILTIN_ORDER` first, then by name) and the modules of entry-point group ``repro.families``.
A :class:`Registry` loads them when first read, so no table here names a family. Torch-free.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib.metadata import entry_points
from typing import Iterator, MutableMapping, TypeVar

__all__ = ["Registry", "load_families", "BUILTIN_ORDER", "ENTRY_POINT_GROUP"]

#: this package's families, in the order their schedulers are listed
BUILTIN_ORDER = ("allreduce", "sparse", "dear", "bytescheduler", "ps", "baselines")
#: the entry-point group under which another package names its family modules
ENTRY_POINT_GROUP = "repro.families"
_state = {"loaded": False, "loading": False}
_REGISTRIES: list["Registry"] = []

V = TypeVar("V")


def load_families() -> None:
    """Import every family package once; one that fails to import is named in an ImportError."""
    if _state["loaded"] or _state["loading"]:
        return
    _state["loading"] = True
    try:
        package = importlib.import_module("repro.families")
        folders = [m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg]
        names = [f"repro.families.{n}" for n in (*[b for b in BUILTIN_ORDER if b in folders],
                                                  *sorted(set(folders) - set(BUILTIN_ORDER)))]
        names += [ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as e:
                raise ImportError(f"family module '{name}' failed to import: {type(e).__name__}: {e}") from e
        for registry in _REGISTRIES:  # the families' order, whatever was imported first
            registry.reorder(names)
        _state["loaded"] = True
    finally:
        _state["loading"] = False


class Registry(MutableMapping[str, V]):
    """A name -> entry table that loads the families before it is read (writes do not load)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.entries: dict[str, V] = {}
        self.origins: dict[str, str] = {}  # name -> the module that registered it
        _REGISTRIES.append(self)

    def add(self, name: str, entry: V, *, replace: bool = False) -> V:
        """Register ``entry`` under ``name`` (``replace=True`` to redefine one); the first module outside
        ``repro.core`` on the call stack is recorded as its origin."""
        if name in self.entries and not replace:
            raise ValueError(f"{self.what} '{name}' is already registered")
        self.entries[name] = entry
        frame = sys._getframe(1)
        while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("repro.core"):
            frame = frame.f_back
        self.origins[name] = str(frame.f_globals.get("__name__", "")) if frame is not None else ""
        return entry

    def reorder(self, families: list[str]) -> None:
        """Entries in the order of the ``families`` (module names) that registered them; others last."""
        def rank(name: str) -> int:
            origin = self.origins.get(name, "")
            return next((i for i, f in enumerate(families) if origin == f or origin.startswith(f + ".")),
                        len(families))

        self.entries = dict(sorted(self.entries.items(), key=lambda item: rank(item[0])))  # stable

    def __getitem__(self, name: str) -> V:
        load_families()
        return self.entries[name]

    def __setitem__(self, name: str, entry: V) -> None:
        self.entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self.entries[name]

    def __iter__(self) -> Iterator[str]:
        load_families()
        return iter(list(self.entries))

    def __len__(self) -> int:
        load_families()
        return len(self.entries)

    def __repr__(self) -> str:
        return f"Registry({self.what}: {', '.join(self)})"
