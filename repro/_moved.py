"""Deprecated module paths of repro 0.1, kept importable for one release.

``import repro.launch`` (and the other old names below) still works: it returns the module at its new
place and emits a :class:`DeprecationWarning` naming that place. Removed in repro 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

MOVED = {
    "repro.launch": "repro.cluster.local",
    "repro.netem": "repro.cluster.netns",
    "repro.models": "repro.workload.models",
    "repro.datasets": "repro.workload.datasets",
    "repro.profile": "repro.workload.profile",
    "repro.estimate": "repro.workload.estimate",
    "repro.runtime.layers": "repro.workload.layers",
    "repro.runtime.bucketed": "repro.runtime.allreduce",
    "repro.data": "repro.paths",
    "repro.results": "repro.tables",
    "repro.calibration": "repro.published_fits",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        warnings.warn(f"{spec.name} is deprecated; import {self.new} instead (the old path goes in repro 0.3)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:  # the new module is already executed
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return importlib.util.spec_from_loader(fullname, _Alias(new)) if new else None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
