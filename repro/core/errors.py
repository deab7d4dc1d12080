"""Errors shared by the torch-free core, kept in a module that imports nothing of this package, so that
the value types and registries that raise them (:mod:`repro.core.plan`, :mod:`repro.core.families`) need not
import each other for them."""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(ValueError):
    """A plan is malformed or does not fit the trace it is used with (re-exported by :mod:`repro.core.plan`)."""
