"""The registries' shared mechanism: tables filled by the families themselves, loaded on first use.

Every family is a package that registers its :class:`~repro.core.families.Family`, planners, schedulers and
run options when imported. :func:`load_families` imports them once: the folders of :mod:`repro.families`
(this package's, in :data:`BUILTIN_ORDER`, then any other folder by name) and every module named by an
entry point of group ``repro.families`` (another installed package's families). A :class:`Registry` loads
them the first time it is read, so ``SCHEDULERS``, ``PLANNERS``, ``FAMILIES`` and ``RUN_OPTIONS`` are
complete whenever they are looked at, and no table here names a family. Torch-free.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from importlib.metadata import entry_points
from typing import Any, Iterator, MutableMapping, TypeVar

__all__ = ["Registry", "load_families", "BUILTIN_ORDER", "ENTRY_POINT_GROUP"]

#: this package's families, in the order their schedulers are listed
BUILTIN_ORDER = ("allreduce", "sparse", "dear", "bytescheduler", "ps", "baselines")
#: the entry-point group under which another package names its family modules
ENTRY_POINT_GROUP = "repro.families"
_state = {"loaded": False, "loading": False}
_REGISTRIES: list["Registry"] = []

V = TypeVar("V")


def load_families() -> None:
    """Import every family package once (see the module docstring); a family that fails to import is named
    in one line."""
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
        for registry in _REGISTRIES:  # one order whatever was imported first: the families' order
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
        """Register ``entry`` under ``name`` (``replace=True`` to redefine an existing name); the first
        module outside ``repro.core`` on the call stack is recorded as its origin."""
        if name in self.entries and not replace:
            raise ValueError(f"{self.what} '{name}' is already registered")
        self.entries[name] = entry
        frame = sys._getframe(1)
        while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("repro.core"):
            frame = frame.f_back
        self.origins[name] = str(frame.f_globals.get("__name__", "")) if frame is not None else ""
        return entry

    def reorder(self, families: list[str]) -> None:
        """Entries in the order of ``families`` (module names) that registered them, registration order
        within one; entries of other origins last."""
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

    def __contains__(self, name: Any) -> bool:
        load_families()
        return name in self.entries

    def __repr__(self) -> str:
        return f"Registry({self.what}: {', '.join(self)})"
