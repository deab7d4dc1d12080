"""Logging for the package: every module logs to ``logging.getLogger("repro.<module>")``.

As a library, ``repro`` only adds a :class:`logging.NullHandler`; applications decide what is shown.
The ``repro`` command line calls :func:`configure` with its ``-v``/``-q`` flags: warnings by default
(plus what the command prints as its result), ``-v`` for progress (INFO), ``-vv`` for details (DEBUG),
``-q`` for errors only.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["get_logger", "configure", "level_for"]

logging.getLogger("repro").addHandler(logging.NullHandler())


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``), under the ``repro`` hierarchy."""
    return logging.getLogger(name if name.startswith("repro") else f"repro.{name}")


def level_for(verbose: int = 0, quiet: bool = False) -> int:
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


def configure(verbose: int = 0, quiet: bool = False, stream=None) -> None:
    """Show ``repro``'s log records on stderr at the level the flags ask for (idempotent)."""
    root = logging.getLogger("repro")
    root.setLevel(level_for(verbose, quiet))
    for h in list(root.handlers):
        if getattr(h, "_repro_cli", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("repro: %(levelname)s: %(message)s" if verbose > 1 else "repro: %(message)s"))
    handler._repro_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
