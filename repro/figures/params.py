"""Notebook parameters as papermill users give them.

``papermill nb.ipynb out.ipynb -p workers "[4, 16]"`` hands the notebook the *string* ``"[4, 16]"``
(``-p`` never parses lists; ``-y``/``-f`` YAML does). Every notebook therefore passes its list
parameters through :func:`parse_list`, which accepts a list, a JSON/YAML flow list
(``"[4, 16]"``, ``"[resnet50, vgg16]"``) or a comma-separated string (``"4,16"``), and rejects
anything else with a one-line :class:`ParameterError` naming the parameter and an example.

Paths (``output_dir``, ``results_dir``) go through :func:`resolve_path`: a relative path is taken
relative to the repository root (the folder holding ``notebooks/``), wherever papermill or Jupyter
was started from, so ``results/figures`` means ``<repo>/results/figures`` in every case.

:func:`default_world_sizes` gives the real rank counts a tiny-scale notebook uses by default: no more
ranks than this process may use CPU cores (``os.sched_getaffinity``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from repro.studies.common import available_cpus

__all__ = ["ParameterError", "parse_list", "parse_choice", "resolve_path", "repo_root", "available_cpus",
           "default_world_sizes"]


class ParameterError(ValueError):
    """A notebook parameter that cannot be used; the message is one line naming the parameter."""


_TYPE_NAMES = {int: "integers", float: "numbers", str: "strings"}


def _convert(item: Any, item_type: type, name: str, raw: Any) -> Any:
    what = _TYPE_NAMES.get(item_type, item_type.__name__)
    if item_type is int:
        if isinstance(item, bool):
            raise ParameterError(f"{name}: {item!r} is not an integer (in {raw!r}); expected a list of {what}")
        if isinstance(item, int):
            return item
        if isinstance(item, float) and item.is_integer():
            return int(item)
        if isinstance(item, str):
            try:
                return int(item.strip().replace("_", ""))
            except ValueError:
                pass
        raise ParameterError(f"{name}: {item!r} is not an integer (in {raw!r}); expected a list of {what}")
    if item_type is float:
        if isinstance(item, bool):
            raise ParameterError(f"{name}: {item!r} is not a number (in {raw!r}); expected a list of {what}")
        if isinstance(item, (int, float)):
            return float(item)
        if isinstance(item, str):
            try:
                return float(item.strip())
            except ValueError:
                pass
        raise ParameterError(f"{name}: {item!r} is not a number (in {raw!r}); expected a list of {what}")
    if item_type is str:
        if isinstance(item, str) and item.strip():
            return item.strip()
        raise ParameterError(f"{name}: {item!r} is not a non-empty string (in {raw!r}); expected a list of {what}")
    try:
        return item_type(item)
    except Exception as e:  # noqa: BLE001 - any conversion failure is the user's input
        raise ParameterError(f"{name}: cannot read {item!r} as {item_type.__name__} ({e})") from None


def _load_flow_list(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        import yaml

        return yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - yaml.YAMLError and friends
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ParameterError(f"{name}: cannot parse {text!r} as a list ({first}); "
                             f"give e.g. -p {name} '[4, 16]' or -y '{name}: [4, 16]'") from None


def parse_list(value: Any, item_type: type = str, *, name: str = "parameter", allow_empty: bool = False,
               choices: Sequence[Any] | None = None, check: Callable[[Any], bool] | None = None,
               check_msg: str = "") -> list:
    """``value`` as a list of ``item_type`` (``int``, ``float`` or ``str``).

    Accepted: a list or tuple; a JSON/YAML flow list given as a string (``"[4, 16]"``,
    ``'["resnet50", "vgg16"]'``, ``"[resnet50, vgg16]"``); a comma-separated string (``"4,16"``) or
    a single item (``"resnet50"``, ``4``). Items are converted (``"16"`` -> 16 for ints); ``choices``
    and ``check`` (a predicate, described by ``check_msg``) validate each item. Anything else raises
    :class:`ParameterError` with a one-line message naming ``name``.
    """
    raw = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = _load_flow_list(text, name)
            if not isinstance(value, list):
                raise ParameterError(f"{name}: {raw!r} is not a list; give e.g. -p {name} '[4, 16]'")
        elif text.startswith("{"):
            raise ParameterError(f"{name}: expected a list, got a mapping {raw!r}")
        elif text == "":
            value = []
        else:
            value = [part for part in (p.strip() for p in text.split(",")) if part]
    elif isinstance(value, (list, tuple)):
        value = list(value)
    elif value is None:
        value = []
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    else:
        raise ParameterError(f"{name}: expected a list, got {type(value).__name__} {raw!r}")
    out = [_convert(item, item_type, name, raw) for item in value]
    if not out and not allow_empty:
        raise ParameterError(f"{name}: the list is empty; give at least one value, e.g. -p {name} '[...]'")
    for item in out:
        if choices is not None and item not in choices:
            raise ParameterError(f"{name}: unknown value {item!r}; choose from {', '.join(map(str, choices))}")
        if check is not None and not check(item):
            raise ParameterError(f"{name}: {item!r} is not allowed{': ' + check_msg if check_msg else ''}")
    return out


def parse_choice(value: Any, choices: Sequence[Any], *, name: str = "parameter") -> Any:
    """``value`` if it is one of ``choices``, else a one-line :class:`ParameterError`."""
    if value not in choices:
        raise ParameterError(f"{name}: unknown value {value!r}; choose from {', '.join(map(str, choices))}")
    return value


def repo_root() -> Path | None:
    """The checkout this package was imported from (the folder holding ``notebooks/`` and ``repro/``),
    or None for an installed package."""
    here = Path(__file__).resolve().parents[2]
    if (here / "notebooks").is_dir() and (here / "repro").is_dir():
        return here
    return None


def resolve_path(path: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """An absolute path: ``path`` as given if absolute (``~`` expanded), else relative to ``base``
    (default: the repository root; the current directory only when the package is not a checkout)."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise ParameterError("a path parameter is empty; give a folder, e.g. -p output_dir results/figures")
    p = Path(os.fspath(path)).expanduser()
    if p.is_absolute():
        return p
    root = Path(base) if base is not None else (repo_root() or Path.cwd())
    return (root / p).resolve()


def default_world_sizes(max_ranks: int = 4, cpus: int | None = None) -> list[int]:
    """Real rank counts for a tiny-scale run: 1 (the baseline) and powers of two up to
    ``min(max_ranks, cores)``, so no rank shares a core: ``[1, 2]`` on 2 cores, ``[1, 2, 4]`` on 4+."""
    limit = min(max_ranks, cpus if cpus is not None else available_cpus())
    sizes, p = [1], 2
    while p <= limit:
        sizes.append(p)
        p *= 2
    return sizes
