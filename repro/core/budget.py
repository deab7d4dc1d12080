"""Time budgets of the exact planners: a search runs until its best plan is proven optimal or
``time_budget_s`` wall-clock seconds are spent, and ``plan.meta`` records ``optimal``, ``lower_bound_s``
and ``gap_pct`` (how far above the optimum the plan can be, in percent).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import numpy as np

__all__ = ["DEFAULT_TIME_BUDGET_S", "PROGRESS_EVERY_S", "check_time_budget", "Search"]

DEFAULT_TIME_BUDGET_S = 10.0
PROGRESS_EVERY_S = 2.0


def check_time_budget(value) -> float:
    """``value`` as float seconds, or a one-line ValueError unless it is a finite positive number."""
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"time_budget_s must be a finite positive number of seconds, got {value!r}")
    return float(value)


class Search:
    """The clock of one exact search: ``expired()``, ``progress()`` lines, ``record()`` of ``meta``."""

    def __init__(self, planner: str, time_budget_s: float, total: int, log: logging.Logger,
                 unit: str = "layers") -> None:
        self.planner, self.total, self.log, self.unit = planner, total, log, unit
        self.budget_s = check_time_budget(time_budget_s)
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + self.budget_s
        self._next_line = self.t0 + PROGRESS_EVERY_S

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def expired(self) -> bool:
        return time.perf_counter() >= self.deadline

    def progress(self, done: int, best_s: float, bound: Callable[[], float]) -> None:
        """Log ``done/total``, the incumbent and ``bound()`` (called only when a line is due)."""
        now = time.perf_counter()
        if now < self._next_line:
            return
        self._next_line = now + PROGRESS_EVERY_S
        if self.log.isEnabledFor(logging.INFO):
            self.log.info("%s: %d/%d %s, best %.6g s, bound %.6g s (%.1f s of %.3g s budget)", self.planner, done,
                          self.total, self.unit, best_s, bound(), now - self.t0, self.budget_s)

    def record(self, meta: dict, best_s: float, bound_s: float | None, done: int) -> dict:
        """Add ``optimal``, ``lower_bound_s`` and ``gap_pct`` to ``meta``: a proven optimum when
        ``bound_s`` is None, else the budget ran out at ``done`` with ``bound_s`` proven (a WARNING)."""
        if bound_s is None:
            meta.update(optimal=True, lower_bound_s=float(best_s), gap_pct=0.0)
            return meta
        lb = float(min(bound_s, best_s))
        gap = 100.0 * (best_s - lb) / lb if lb > 0 else (0.0 if best_s <= lb else math.inf)
        meta.update(optimal=False, lower_bound_s=lb, gap_pct=float(gap))
        self.log.warning("%s: time budget of %.3g s spent at %d/%d %s; returning the best plan found (%.6g s), "
                         "at most %.2f%% above the optimum (lower bound %.6g s)", self.planner, self.budget_s, done,
                         self.total, self.unit, best_s, gap, lb)
        return meta
