"""What every measured study shares: the CPU cores the ranks have, and saying when they share them.

With more ranks than cores an iteration time measures CPU sharing as much as communication: studies
warn (:class:`OversubscriptionWarning`) before launching such a world, and their tables carry an
``oversubscribed`` column that the figures mark.
"""

from __future__ import annotations

import pandas as pd

from repro.launch.cpus import OversubscriptionWarning, available_cpus, is_oversubscribed, warn_if_oversubscribed

__all__ = ["OversubscriptionWarning", "available_cpus", "is_oversubscribed", "warn_if_oversubscribed",
           "with_oversubscription"]


def with_oversubscription(df: pd.DataFrame, *, workers: str = "world_size") -> pd.DataFrame:
    """``df`` with a boolean ``oversubscribed`` column from its ``workers`` (or, for ``world_size``, the
    filled ``ranks``: servers included), ``cpu_count`` and optional ``threads_per_rank`` columns (False
    where the CPU count is unknown)."""
    if df.empty:
        return df.assign(oversubscribed=pd.Series(dtype=bool))
    cpus = df["cpu_count"] if "cpu_count" in df else pd.Series([None] * len(df), index=df.index)
    threads = df["threads_per_rank"] if "threads_per_rank" in df else pd.Series([1] * len(df), index=df.index)
    counts = df[workers]
    if "ranks" in df and workers == "world_size":
        counts = df["ranks"].where(df["ranks"].notna(), df[workers])
    flags = [is_oversubscribed(p, c, t) for p, c, t in zip(counts, cpus, threads)]
    return df.assign(oversubscribed=pd.Series(flags, index=df.index, dtype=bool))
