"""Fault injection for the tests of failure handling: make one rank of a run fail on purpose.

**For tests only.** ``REPRO_INJECT_FAULT=RANK:WHERE:KIND`` in a rank's environment makes the rank whose
global ``RANK`` is ``RANK`` fail at ``WHERE`` in the way ``KIND`` says; every other rank, and every run
without the variable, is untouched (the check is one dictionary look-up). ``repro.train`` honours it at
two points:

- ``join``: before the rank joins the process group (:func:`repro.launch.torchrun.init_distributed`);
- ``stepN``: before timed step ``N`` (0-based) of the training loop.

``KIND``:

- ``config``: raise a :class:`ValueError` (the rank refuses its configuration: exit status 2);
- ``error``: raise a :class:`RuntimeError` (a failure while running: exit status 1);
- ``kill``: SIGKILL this process (no report, as the kernel's OOM killer would);
- ``hang``: sleep for an hour (a rank that never arrives, or stops answering).

Example: ``REPRO_INJECT_FAULT=0:step2:error torchrun ... -m repro.train ...`` makes rank 0 raise
before its third timed step. A malformed value is refused in one line (ValueError) at the first point
checked, so a test cannot silently inject nothing. This module imports nothing heavy.
"""

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
    what = f"fault injected by {ENV} on rank {rank} at {where}"
    if kind == "config":
        raise ValueError(what)
    if kind == "error":
        raise RuntimeError(what)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600.0)  # hang
