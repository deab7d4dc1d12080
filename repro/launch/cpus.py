"""CPU cores this machine gives local ranks, and a warning when ranks would share them (an iteration time
would then measure CPU sharing as much as communication). Torch-free."""

from __future__ import annotations

import os
import warnings
from typing import Any

__all__ = ["OversubscriptionWarning", "available_cpus", "is_oversubscribed", "warn_if_oversubscribed"]


class OversubscriptionWarning(UserWarning):
    """More ranks (times threads per rank) than CPU cores: the timings include CPU contention."""


def available_cpus() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def is_oversubscribed(world_size: Any, cpu_count: Any, threads_per_rank: Any = 1) -> bool:
    """True when ``world_size * threads_per_rank > cpu_count``; False when the CPU count is unknown."""
    def num(v: Any, default: float | None) -> float | None:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return default
        return default if f != f else f  # NaN -> default

    p, cpus, threads = num(world_size, None), num(cpu_count, None), num(threads_per_rank, 1.0)
    if p is None or cpus is None or cpus <= 0:
        return False
    return p * max(threads or 1.0, 1.0) > cpus


def warn_if_oversubscribed(world_size: int, what: str = "run", *, cpus: int | None = None,
                           threads_per_rank: int = 1, stacklevel: int = 3) -> bool:
    """Warn (:class:`OversubscriptionWarning`) when ``world_size`` ranks would share this machine's cores."""
    cpus = available_cpus() if cpus is None else cpus
    if not is_oversubscribed(world_size, cpus, threads_per_rank):
        return False
    warnings.warn(f"{what}: {world_size} ranks x {threads_per_rank} thread(s) on {cpus} CPU core(s); ranks share "
                  f"cores, so timings at P={world_size} include CPU contention (figures mark them as "
                  "oversubscribed)", OversubscriptionWarning, stacklevel=stacklevel)
    return True
