"""A griffe extension for the API reference: the docstrings of repro are written with reStructuredText
roles (``:class:`~repro.core.trace.Trace```) and ``::`` before literal blocks, which Markdown would show as
written. This rewrites them, for the generated pages only, into Markdown: a role becomes a code span of
its target (the last dotted part after ``~``, as Sphinx shows it), and a trailing ``::`` becomes ``:``
(the indented block after it is already a Markdown code block). Loaded by mkdocs.yml; the sources are
left alone.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const|ref|term):`([^`]+)`")
_TRAILING_LITERAL = re.compile(r"(?<=\S)::[ \t]*$", re.M)
_LONE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", re.M)


def _role(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    explicit = re.fullmatch(r"(.+?)\s*<([^>]+)>", target)
    if explicit:
        return f"`{explicit.group(1).strip()}`"
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def to_markdown(text: str) -> str:
    """The docstring ``text`` with reStructuredText roles and literal markers turned into Markdown."""
    text = _ROLE.sub(_role, text)
    text = _LONE_LITERAL.sub("", text)
    return _TRAILING_LITERAL.sub(":", text)


class RstRoles(Extension):
    """Rewrite every docstring as it is loaded (see the module docstring)."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
