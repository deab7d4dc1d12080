"""Notebook parameters as papermill users give them, and the schema machinery that checks them.

``papermill -p workers "[4, 16]"`` passes a *string*, so list parameters accept a list, a JSON/YAML flow
list or ``"4,16"`` (:func:`parse_list`, :func:`ListOf`); a relative path is relative to the repository
root (:func:`resolve_path`). A notebook's ``parameters`` cell holds the defaults; a
:class:`NotebookParams` subclass (:mod:`repro.figures.schemas`) declares types, ranges and choices, and
the notebook's first cell checks its values with ``apply_parameters(Schema, globals())``. Every bad value
is one :class:`ParameterError` line. How and why: ``docs/design/figures.md``.
"""

from __future__ import annotations

import ast
import copy
import functools
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Iterable, Mapping, MutableMapping, Sequence, Union, \
    get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, StringConstraints, ValidationError, \
    ValidationInfo
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from repro.launch.cpus import available_cpus

__all__ = ["ParameterError", "parse_list", "parse_choice", "resolve_path", "repo_root", "available_cpus",
           "default_world_sizes", "NotebookParams", "apply_parameters", "validate_parameters", "notebook_defaults",
           "injected_parameter_names", "notebook_type", "Int", "Float", "Bool", "Str", "Name", "PathParam",
           "ListOf", "OneOf", "InputFolder", "output_folder_problem", "parameter_error", "Bounds", "ListLength",
           "parameter_bounds", "list_length"]


class ParameterError(ValueError):
    """A notebook parameter that cannot be used; the message is one line naming the parameter."""


_TYPE_NAMES = {int: "integers", float: "numbers", str: "strings"}


def _convert(item: Any, item_type: type, name: str, raw: Any) -> Any:
    what = _TYPE_NAMES.get(item_type, item_type.__name__)
    if item_type in (int, float):
        if not isinstance(item, bool):
            whole = isinstance(item, float) and (item_type is float or item.is_integer())
            if isinstance(item, int) or whole:
                return item_type(item)
            if isinstance(item, str):
                try:
                    return item_type(item.strip().replace("_", "") if item_type is int else item.strip())
                except ValueError:
                    pass
        kind = "an integer" if item_type is int else "a number"
        raise ParameterError(f"{name}: {item!r} is not {kind} (in {raw!r}); expected a list of {what}")
    if item_type is str:
        if isinstance(item, str) and item.strip():
            return item.strip()
        raise ParameterError(f"{name}: {item!r} is not a non-empty string (in {raw!r}); expected a list of {what}")
    try:
        return item_type(item)
    except Exception as e:  # noqa: BLE001 - any conversion failure is the user's input
        raise ParameterError(f"{name}: cannot read {item!r} as {item_type.__name__} ({e})") from None


def _load_flow_list(text: str, name: str) -> Any:
    """A JSON or YAML flow list given as text; else a one-line :class:`ParameterError` naming ``name``."""
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
    """``value`` as a list of ``item_type`` (``int``, ``float`` or ``str``), from a list or tuple, a
    JSON/YAML flow list (``"[4, 16]"``, ``"[resnet50, vgg16]"``), a comma-separated string (``"4,16"``) or a
    single item; items are converted (``"16"`` -> 16) and checked against ``choices`` and ``check``
    (described by ``check_msg``). Anything else: a one-line :class:`ParameterError` naming ``name``.
    """
    out = [_convert(item, item_type, name, value) for item in _items(value, name)]
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
    return [1, *itertools.takewhile(lambda p: p <= limit, (2 ** k for k in itertools.count(1)))]


# -- schemas

def _items(value: Any, name: str) -> list:
    """The items of a list parameter, unconverted (the inputs :func:`parse_list` accepts)."""
    raw = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = _load_flow_list(text, name)
            if not isinstance(value, list):
                raise ParameterError(f"{name}: {raw!r} is not a list; give e.g. -p {name} '[4, 16]'")
            return value
        if text.startswith("{"):
            raise ParameterError(f"{name}: expected a list, got a mapping {raw!r}")
        return [part for part in (p.strip() for p in text.split(",")) if part]
    if isinstance(value, (list, tuple)):
        return list(value)
    if value is None:
        return []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    raise ParameterError(f"{name}: expected a list, got {type(value).__name__} {raw!r}")


def _reject_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("not_a_number", "expected a number, got a boolean")
    return value


def _bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise PydanticCustomError("not_a_bool", "expected true or false")


def _path(value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise PydanticCustomError("not_a_path", "expected a folder path (a string)")
    try:
        return resolve_path(value)
    except ParameterError as e:
        raise PydanticCustomError("empty_path", str(e)) from None


def _kind(path: Path) -> str:
    """What ``path`` (which exists) is when it is not a folder: a file, a device, a FIFO, a socket."""
    import stat

    mode = path.stat().st_mode
    for test, what in ((stat.S_ISREG, "a file"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a folder"


def output_folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an output folder (it must be a writable folder, or its first existing parent
    must be one), or None; nothing is created."""
    try:
        if path.exists():
            if not path.is_dir():
                return f"{path} is {_kind(path)}, not a folder"
            if not os.access(path, os.W_OK | os.X_OK):
                return f"{path} is not writable"
            return None
        for up in path.parents:
            if up.exists():
                if not up.is_dir():
                    return f"{path} cannot be created: {up} is {_kind(up)}, not a folder"
                if not os.access(up, os.W_OK | os.X_OK):
                    return f"{path} cannot be created: {up} is not writable"
                return None
    except OSError as e:  # a path too long, a loop of links...
        return f"{path} cannot be used: {e.strerror or e}"
    return None


def _output_folder(value: Path) -> Path:
    problem = output_folder_problem(value)
    if problem:
        raise PydanticCustomError("not_an_output_folder", "{problem}; give a folder that exists or can be created",
                                  {"problem": problem})
    return value


def _input_folder(value: str, *, keep: Sequence[str] = ()) -> str:
    if not value or value.lower() in keep:
        return value
    try:
        path = resolve_path(value)
    except ParameterError as e:
        raise PydanticCustomError("empty_path", str(e)) from None
    if not path.exists():
        raise PydanticCustomError("no_such_folder", "{path} does not exist; give an existing folder, or leave it "
                                  "empty for the default", {"path": str(path)})
    if not path.is_dir():
        raise PydanticCustomError("not_a_folder", "{path} is {kind}, not a folder", {"path": str(path),
                                                                                     "kind": _kind(path)})
    return str(path)


#: An integer: ``2``, ``"2"`` or ``2.0``; never ``2.5``, ``True`` or ``"abc"``. Ranges: ``Field(ge=..., le=...)``.
Int = Annotated[int, BeforeValidator(_reject_bool)]
#: A finite number (an int is taken as a float); never ``True`` or ``"abc"``.
Float = Annotated[float, BeforeValidator(_reject_bool)]
#: ``True``/``False`` (or the strings ``"true"``/``"false"``, any case); never ``"maybe"`` or ``1``.
Bool = Annotated[bool, BeforeValidator(_bool)]
#: A string (a number is refused: ``-p model 5``), surrounding blanks stripped.
Str = Annotated[str, StringConstraints(strip_whitespace=True)]
#: A non-empty string (a name: model, preset, scheduler, rate).
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
#: An output folder (string), made an absolute :class:`~pathlib.Path` (:func:`resolve_path`); it must be a
#: folder or creatable (:func:`output_folder_problem`).
PathParam = Annotated[Path, BeforeValidator(_path), AfterValidator(_output_folder)]


def InputFolder(*keep: str) -> Any:
    """An input folder given as a string: empty (the notebook's default), one of the words ``keep`` (any
    case), or an existing folder, made absolute (:func:`resolve_path`)."""
    words = tuple(k.lower() for k in keep)
    return Annotated[Str, AfterValidator(lambda v: _input_folder(v, keep=words))]


def OneOf(choices: Iterable[Any] | Callable[[], Iterable[Any]], item: Any = None) -> Any:
    """A value (default type: :data:`Name`) that must be one of ``choices`` (a sequence, or a callable
    returning one, read when validating: a registry)."""
    def check(value: Any) -> Any:
        allowed = list(choices() if callable(choices) else choices)
        if value not in allowed:
            raise PydanticCustomError("unknown_choice", f"unknown value {value!r}; choose from "
                                      f"{', '.join(map(str, allowed))}")
        return value

    return Annotated[item if item is not None else Name, AfterValidator(check)]


def ListOf(item: Any, *, min_length: int = 1, max_length: int | None = None) -> Any:
    """A list of ``item`` (e.g. :data:`Int`, :func:`OneOf`) that also accepts papermill's strings
    (:func:`parse_list`), with ``min_length`` (0: may be empty) to ``max_length`` (None: any) items."""
    def split(value: Any, info: ValidationInfo) -> list:
        name = info.field_name or "parameter"
        try:
            items = _items(value, name)
        except ParameterError as e:
            raise PydanticCustomError("not_a_list", str(e).removeprefix(f"{name}: ")) from None
        if len(items) < min_length:
            if not items:
                raise PydanticCustomError("empty_list", "the list is empty; give at least one value, e.g. -p {name} "
                                          "'[...]'", {"name": name})
            raise PydanticCustomError("short_list", "give at least {n} values", {"n": min_length})
        if max_length is not None and len(items) > max_length:
            raise PydanticCustomError("long_list", "give at most {n} values, not {got}",
                                      {"n": max_length, "got": len(items)})
        return items

    return Annotated[list[item], BeforeValidator(split), ListLength(min_length, max_length)]


@dataclass(frozen=True)
class ListLength:
    """Marker in a :func:`ListOf` annotation: the list's allowed length (``max_length`` None: no limit)."""

    min_length: int
    max_length: int | None


@dataclass(frozen=True)
class Bounds:
    """A numeric parameter's declared range (of each item, for a list): ``lo``/``hi`` with whether each end
    is open; None where the schema declares no bound. :func:`parameter_bounds` reads it off a field."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def __str__(self) -> str:
        def num(x: float | None, inf: str) -> str:
            if x is None:
                return inf
            return str(x) if isinstance(x, int) else f"{x:g}"

        return (("(" if self.lo_open or self.lo is None else "[") + num(self.lo, "-inf") + ", "
                + num(self.hi, "inf") + (")" if self.hi_open or self.hi is None else "]"))


def _metadata(annotation: Any) -> list:
    """The constraint objects of an ``Annotated`` type, flattened (a nested FieldInfo's too)."""
    if get_origin(annotation) is not Annotated:
        return []
    out: list = []
    for m in get_args(annotation)[1:]:
        out.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    return out


def parameter_bounds(field: FieldInfo) -> Bounds | None:
    """The declared numeric range of a schema field (for a list of numbers: of each item), from its
    ``ge``/``gt``/``le``/``lt`` constraints; None for a field that is not numeric."""
    annotation, metadata = field.annotation, list(field.metadata)
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
        metadata = _metadata(annotation)
        while get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
    base = notebook_type(annotation)
    if base not in ("int", "float"):
        return None
    b: dict[str, Any] = {}
    for m in metadata:
        for attr, key, open_ in (("ge", "lo", False), ("gt", "lo", True), ("le", "hi", False), ("lt", "hi", True)):
            value = getattr(m, attr, None)
            if value is not None and not isinstance(m, FieldInfo):
                b[key], b[f"{key}_open"] = value, open_
    return Bounds(**b)


def list_length(field: FieldInfo) -> ListLength | None:
    """The allowed length of a :func:`ListOf` field; None for a field that is not a list."""
    return next((m for m in field.metadata if isinstance(m, ListLength)), None)


def notebook_type(annotation: Any) -> str:
    """The annotation a notebook's parameters cell gives a schema field: ``int``, ``float``, ``bool``,
    ``str`` (also for paths and choices) or ``list[...]`` of those."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return notebook_type(get_args(annotation)[0])
    if origin is list:
        return f"list[{notebook_type(get_args(annotation)[0])}]"
    if origin is Union:
        args = [a for a in get_args(annotation) if a is not type(None)]
        return notebook_type(args[0]) if len(args) == 1 else repr(annotation)
    if annotation is Path:
        return "str"
    if str(origin) == "typing.Literal":
        kinds = {type(a) for a in get_args(annotation)}
        return kinds.pop().__name__ if len(kinds) == 1 else repr(annotation)
    return getattr(annotation, "__name__", repr(annotation))


class NotebookParams(BaseModel):
    """Base of the notebooks' parameter schemas: one field per parameter of the notebook's ``parameters``
    cell, same name, type and order, without defaults (the cell holds them: :func:`notebook_defaults`).
    Unknown fields are refused; paths are resolved."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    #: the notebook's file stem, for messages
    notebook: ClassVar[str] = ""


def parameter_error(name: str, message: str) -> PydanticCustomError:
    """An error for a schema's model validator (checks across parameters), naming ``name``."""
    return PydanticCustomError("parameter", "{name}: {message}",
                               {"name": name, "message": message.removeprefix(f"{name}: ")})


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: pydantic's error types for a value outside a field's ge/gt/le/lt bounds
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _range_note(schema: type[NotebookParams] | None, name: str, error: Mapping[str, Any]) -> str:
    """``; <notebook> takes <name> in [lo, hi]`` for a value out of its declared range (or a list of the
    wrong length); empty for other errors."""
    field = schema.model_fields.get(name) if schema is not None else None
    if field is None:
        return ""
    where = schema.notebook or "this notebook"
    if error.get("type") in ("long_list", "short_list"):
        length = list_length(field)
        if length is None:
            return ""
        if length.max_length is None:
            return f"; {where} takes at least {length.min_length} values for {name}"
        return f"; {where} takes {length.min_length} to {length.max_length} values for {name}"
    bounds = parameter_bounds(field)
    if bounds is None or error.get("type") not in _RANGE_ERRORS | {"value_error"}:
        return ""
    each = "each item of " if get_origin(field.annotation) is list else ""
    return f"; {where} takes {each}{name} in {bounds}"


def _error_line(error: Mapping[str, Any], data: Mapping[str, Any],
                schema: type[NotebookParams] | None = None) -> str:
    loc = error.get("loc") or ()
    if error.get("type") == "value_error" and (error.get("ctx") or {}).get("error") is not None:
        message = str(error["ctx"]["error"])
    elif error.get("type") == "extra_forbidden":
        message = "not a parameter of this notebook"
    else:
        message = str(error.get("msg", ""))
    message = message.replace("\n", " ")
    if not loc:  # a model validator: its message names the parameter(s)
        return message
    name = str(loc[0])
    message = message.removeprefix(f"{name}: ") + _range_note(schema, name, error)
    if error.get("type") == "missing":
        return f"{name}: missing"
    raw = data.get(name, error.get("input"))
    if len(loc) > 1:  # an item of a list
        return f"{name}: {message} (got {_short(error.get('input'))} in {_short(raw)})"
    return f"{name}: {message} (got {_short(raw)})"


def _parameters_cell(cells: list, where: str) -> str:
    """The source of the one code cell tagged ``parameters`` among a notebook's ``cells``."""
    found = [c for c in cells
             if c.get("cell_type") == "code" and "parameters" in (c.get("metadata", {}).get("tags") or [])]
    if len(found) != 1:
        raise ParameterError(f"{where}: expected one cell tagged 'parameters', found {len(found)}")
    source = found[0].get("source", "")
    return "".join(source) if isinstance(source, list) else source


@functools.lru_cache(maxsize=None)
def _read_defaults(stem: str) -> tuple[tuple[str, Any], ...]:
    """(name, default) pairs of ``notebooks/<stem>.ipynb``'s parameters cell (see :func:`notebook_defaults`)."""
    root = repo_root()
    path = root / "notebooks" / f"{stem}.ipynb" if root is not None else None
    where = f"notebooks/{stem}.ipynb"
    if path is None or not path.is_file():
        why = "the package is not a checkout" if root is None else f"no such file under {root}"
        raise ParameterError(f"{stem}: cannot read the parameters' defaults: {where} not found ({why})")
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ParameterError(f"{where}: not a readable notebook ({type(e).__name__}: {e})") from None
    source = _parameters_cell(cells, where)
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ParameterError(f"{where}: its parameters cell is not valid Python (line {e.lineno}: {e.msg})") from None
    out: list[tuple[str, Any]] = []
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if not isinstance(target, ast.Name) or node.value is None:
            raise ParameterError(f"{where}: the parameters cell may only assign names, one per line "
                                 f"(line {node.lineno}: {ast.unparse(node)[:80]!r})")
        try:
            out.append((target.id, ast.literal_eval(node.value)))
        except (ValueError, TypeError, SyntaxError):
            raise ParameterError(f"{target.id}: its default in {where} is not a literal value "
                                 f"({ast.unparse(node.value)[:80]!r})") from None
    return tuple(out)


def notebook_defaults(stem: str) -> dict[str, Any]:
    """name -> default of each parameter of ``notebooks/<stem>.ipynb`` (under :func:`repo_root`), in the
    order of its cell tagged ``parameters``, where each line assigns a literal to one name; otherwise one
    :class:`ParameterError` line. Read once per process; each call returns fresh copies."""
    return copy.deepcopy(dict(_read_defaults(stem)))


def validate_parameters(schema: type[NotebookParams], data: Mapping[str, Any]) -> NotebookParams:
    """``schema`` built from ``data``, the parameters it lacks taken from :func:`notebook_defaults`, or one
    :class:`ParameterError` line, ``name: message (got value)`` per bad parameter joined by ``; ``; a value
    out of range also names the notebook and the range (``...; mgwfbp_simulation takes each item of
    workers in [2, 4096] (got 100000 in '[8, 100000]')``)."""
    data = dict(data)
    missing = [name for name in schema.model_fields if name not in data]
    if missing and schema.notebook:
        defaults = notebook_defaults(schema.notebook)
        data.update({name: defaults[name] for name in missing if name in defaults})
    try:
        return schema(**data)
    except ValidationError as e:
        first: dict[Any, Mapping[str, Any]] = {}  # one error per parameter (the first), then the cross checks
        for err in e.errors():
            first.setdefault(err["loc"][0] if err.get("loc") else len(first), err)
        lines = list(dict.fromkeys(_error_line(err, data, schema) for err in first.values()))
        where = f" ({schema.notebook})" if schema.notebook else ""
        raise ParameterError("; ".join(lines) if len(lines) == 1 else f"{len(lines)} bad parameters{where}: "
                             + "; ".join(lines)) from None


def _assigned_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)

    for node in tree.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                targets(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets(node.target)
    return names


def injected_parameter_names(namespace: Mapping[str, Any]) -> list[str]:
    """Names assigned in papermill's injected cells (IPython's ``In`` cells whose first line is exactly
    ``# Parameters``); empty outside IPython."""
    cells = namespace.get("In")
    if not isinstance(cells, (list, tuple)):
        return []
    names: list[str] = []
    for source in cells:
        if not isinstance(source, str):
            continue
        lines = source.lstrip().splitlines()
        if lines and lines[0].strip() == "# Parameters":
            names.extend(_assigned_names(source))
    return list(dict.fromkeys(names))


def apply_parameters(schema: type[NotebookParams], namespace: MutableMapping[str, Any]) -> NotebookParams:
    """Check a notebook's parameters (``namespace``: its ``globals()``) before it does anything and return
    the validated model: a name papermill injected that ``schema`` does not declare, or a bad value, is one
    :class:`ParameterError` line; the normalised values (parsed lists, resolved paths) are written back
    into ``namespace``."""
    declared = list(schema.model_fields)
    unknown = [n for n in injected_parameter_names(namespace) if n not in schema.model_fields]
    if unknown:
        what = f"{schema.notebook} has" if schema.notebook else "this notebook has"
        raise ParameterError(f"{', '.join(unknown)}: unknown parameter{'s' if len(unknown) > 1 else ''} "
                             f"({what} {', '.join(declared)})")
    data = {name: namespace[name] for name in declared if name in namespace}
    model = validate_parameters(schema, data)
    namespace.update(dict(model))
    return model
