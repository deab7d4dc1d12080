"""Fault injection for the tests of failure handling: make one rank of a run fail on purpose.

**For tests only.** ``REPRO_INJECT_FAULT=RANK:WHERE:KIND`` makes the rank with global ``RANK`` fail at
``WHERE`` (``join``: before joining the process group; ``stepN``: before timed step ``N``, 0-based) as
``KIND`` says: ``config`` raises ValueError (exit 2), ``error`` RuntimeError (exit 1), ``kill`` SIGKILLs
the process, ``hang`` sleeps an hour. Other ranks and runs without the variable are untouched; a
malformed value is a one-line ValueError at the first point checked."""

from __future__ import annotations

import os
import re
import signal
import time

__all__ = ["ENV", "KINDS", "maybe_fail"]

#: the environment variable read
ENV = "REPRO_INJECT_FAULT"
#: what a fault can be
KINDS = ("config", "error", "kill", "hang")
_SPEC = re.compile(r"^(\d+):(join|step\d+):(\w+)$")


def _spec() -> tuple[int, str, str] | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    m = _SPEC.match(raw)
    if not m or m.group(3) not in KINDS:
        raise ValueError(f"{ENV}={raw!r} is not RANK:WHERE:KIND with WHERE 'join' or 'stepN' and KIND one of "
                         f"{', '.join(KINDS)} (a test-only fault-injection hook)")
    return int(m.group(1)), m.group(2), m.group(3)


def maybe_fail(where: str, rank: int | None = None) -> None:
    """Fail here if :data:`ENV` names this rank (``rank``, default ``$RANK``) and the point ``where``
    (``"join"`` or ``"step<N>"``); otherwise return at once."""
    spec = _spec()
    if spec is None:
        return
    if rank is None:
        try:
            rank = int(os.environ.get("RANK", "-1"))
        except ValueError:
            return
    target, point, kind = spec
    if rank != target or point != where:
        return
    if kind in ("config", "error"):
        raise {"config": ValueError, "error": RuntimeError}[kind](f"fault injected by {ENV} on rank {rank} at {where}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600.0)  # hang
