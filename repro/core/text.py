"""Text of every command: ``--help`` showing each option's default only where there is one, and aligned
tables for a person."""

from __future__ import annotations

import argparse
from typing import Sequence

__all__ = ["DefaultsHelpFormatter", "text_table"]


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """:class:`argparse.ArgumentDefaultsHelpFormatter` without ``(default: None)`` or ``(default: False)``:
    an option that is off or unset unless given says nothing about its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def text_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Aligned columns for a person, ``None`` shown as ``-``; the last column (often prose) is not padded."""
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    return "\n".join("  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in cells)
