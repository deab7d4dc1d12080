"""Errors shared by the torch-free core, in a module that imports nothing of this package."""

from __future__ import annotations

__all__ = ["PlanError"]


class PlanError(ValueError):
    """A plan is malformed or does not fit the trace it is used with."""
