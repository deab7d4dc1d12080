"""``--help`` text of every command: each option's default is shown only where there is one."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsHelpFormatter"]


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """:class:`argparse.ArgumentDefaultsHelpFormatter` without ``(default: None)`` or ``(default: False)``:
    an option that is off or unset unless given says nothing about its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)
