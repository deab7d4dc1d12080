"""Plan: which gradients travel together, how, when and in which order.

A :class:`Plan` is what planners produce and the simulator and runtime execute. It names its family
(:mod:`repro.core.families`) and holds buckets in the order the communication stream should prefer
them. A bucket holds any set of layers, or one **piece** of a single layer (``count`` near-equal
chunks by elements). Each of its messages has a collective, a **phase** and a **priority** (lower
first): ``backward`` (sent once the bucket's gradients are ready), ``next_forward`` (done before its
layers run forward in the next iteration) or ``background`` (across iterations, off the critical
path). Family options (wire dtype, density, ...) are validated by the family; ``meta`` holds
information such as the planner's ``iteration_s``. JSON form::

    {"family": "allreduce", "solver": "mgwfbp", "options": {"wire_dtype": "float16"},
     "buckets": [["fc.weight", "fc.bias"], ["conv1.weight"]], "iteration_s": 0.12}

A bucket other than one backward all-reduce of whole layers at priority 0 is an object
``{"layers": [...], "messages": [{"collective", "phase", "priority"}, ...], "piece": [0, 4]}``. Older
files still load: no ``family`` means all-reduce; a top-level ``wire_dtype`` and a ``collectives``
list are understood. Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from repro.core import ranges
from repro.core.families import is_known_collective, known_collectives
from repro.core.errors import PlanError
from repro.core.trace import Trace
from repro.core.outputs import write_output

__all__ = ["Message", "Bucket", "Plan", "PlanError", "PHASES", "WIRE_DTYPE_BYTES", "layer_wire_bytes",
           "check_plan_workers", "plan_fit_refusal"]

WIRE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PHASES = ("backward", "next_forward", "background")
DEFAULT_FAMILY = "allreduce"


@dataclass(frozen=True)
class Message:
    """One collective the communication stream runs for a bucket: what, in which phase, how urgent."""

    collective: str
    phase: str = "backward"
    priority: float = 0.0

    def __post_init__(self) -> None:
        if not is_known_collective(self.collective):
            raise PlanError(f"unknown collective '{self.collective}'; known: {', '.join(known_collectives())}")
        if self.phase not in PHASES:
            raise PlanError(f"unknown phase '{self.phase}'; known: {', '.join(PHASES)}")
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p):
            raise PlanError(f"message priority must be a finite number, got {self.priority!r}")
        object.__setattr__(self, "priority", float(self.priority))

    @property
    def is_default(self) -> bool:
        return self.collective == "allreduce" and self.phase == "backward" and self.priority == 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "phase": self.phase, "priority": self.priority}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "Message":
        if isinstance(d, str):
            return cls(d)
        if not isinstance(d, dict) or "collective" not in d:
            raise PlanError(f"plan field '{where}' must be an object with a 'collective'")
        unknown = set(d) - {"collective", "phase", "priority"}
        if unknown:
            raise PlanError(f"plan field '{where}' has unknown key(s) {sorted(unknown)}")
        return cls(d["collective"], d.get("phase", "backward"), d.get("priority", 0.0))


_ONE_ALLREDUCE = (Message("allreduce"),)


@dataclass(frozen=True)
class Bucket:
    """Layers (by name) whose gradients travel together, and the messages that carry them.

    ``Bucket(layers)`` is one all-reduce in backward; ``Bucket(layers, "reduce_scatter")`` one message
    of that collective. ``piece=(index, count)``: the bucket carries chunk ``index`` of ``count``
    near-equal chunks (by elements) of its single layer.
    """

    layers: tuple[str, ...]
    messages: tuple[Message, ...] = _ONE_ALLREDUCE
    piece: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layers, str):
            raise PlanError(f"bucket layers must be a list of layer names, got the string {self.layers!r}")
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise PlanError("a bucket must hold at least one layer")
        if not all(isinstance(n, str) and n for n in self.layers):
            raise PlanError(f"bucket layer names must be non-empty strings, got {list(self.layers)[:3]}")
        if len(set(self.layers)) != len(self.layers):
            raise PlanError(f"a bucket names a layer twice: {list(self.layers)[:3]}")
        messages = self.messages
        if messages is not _ONE_ALLREDUCE:  # the common case is shared and already valid
            if isinstance(messages, (str, Message)):
                messages = (messages,)
            messages = tuple(m if isinstance(m, Message) else Message(m) for m in messages)
            if not messages:
                raise PlanError("a bucket needs at least one message")
            object.__setattr__(self, "messages", messages)
        if (p := self.piece) is not None:
            if (not isinstance(p, (tuple, list)) or len(p) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in p)):
                raise PlanError(f"bucket piece must be [index, count] integers, got {p!r}")
            index, count = p
            if count < 1 or not 0 <= index < count:
                raise PlanError(f"bucket piece [{index}, {count}] needs 0 <= index < count")
            if len(self.layers) != 1:
                raise PlanError("a bucket that carries a piece of a layer must hold exactly that one layer")
            object.__setattr__(self, "piece", (index, count))

    @property
    def collective(self) -> str:
        """The collective of the bucket's first message (the only one in the all-reduce family)."""
        return self.messages[0].collective

    @property
    def is_default(self) -> bool:
        return self.piece is None and len(self.messages) == 1 and self.messages[0].is_default

    def to_json_value(self) -> Any:
        if self.is_default:
            return list(self.layers)
        d: dict[str, Any] = {"layers": list(self.layers), "messages": [m.to_dict() for m in self.messages]}
        if self.piece is not None:
            d["piece"] = list(self.piece)
        return d

    @classmethod
    def from_json_value(cls, v: Any, i: int, collective: str | None = None) -> "Bucket":
        where = f"buckets[{i}]"
        if isinstance(v, list):
            if not all(isinstance(n, str) for n in v):
                raise PlanError(f"plan field '{where}' must be a list of layer names")
            return cls(tuple(v), (Message(collective or "allreduce"),))
        if not isinstance(v, dict):
            raise PlanError(f"plan field '{where}' must be a list of layer names or an object")
        unknown = set(v) - {"layers", "messages", "piece"}
        if unknown:
            raise PlanError(f"plan field '{where}' has unknown key(s) {sorted(unknown)}")
        layers = v.get("layers")
        if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
            raise PlanError(f"plan field '{where}.layers' must be a list of layer names")
        raw = v.get("messages", ["allreduce"])
        if not isinstance(raw, list):
            raise PlanError(f"plan field '{where}.messages' must be a list")
        msgs = tuple(Message.from_dict(m, f"{where}.messages[{k}]") for k, m in enumerate(raw))
        piece = v.get("piece")
        if isinstance(piece, list) and len(piece) == 2:
            ranges.check(ranges.COUNT, piece[1], f"{where}.piece[1]", PlanError, low=1, what="plan field")
        return cls(tuple(layers), msgs, tuple(piece) if isinstance(piece, list) else piece)


def layer_wire_bytes(trace: Trace, wire_dtype: str | None = None) -> np.ndarray:
    """Bytes of each layer's gradient on the wire: the trace's bytes, or params x the wire dtype's size."""
    if wire_dtype is None:
        return trace.bytes()
    try:
        size = WIRE_DTYPE_BYTES[wire_dtype]
    except (KeyError, TypeError):
        raise PlanError(f"unknown wire_dtype {wire_dtype!r}; known: {', '.join(WIRE_DTYPE_BYTES)}") from None
    return trace.params().astype(float) * size


def _piece_fraction(params: int, index: int, count: int) -> float:
    """Fraction of a layer's elements in chunk ``index`` of ``count`` (the first ``params % count``
    chunks hold one more)."""
    if params <= 0:
        return 1.0 / count
    base, extra = divmod(params, count)
    return (base + (1 if index < extra else 0)) / params


class Plan:
    """Ordered buckets of one family, with validated family options. Immutable.

    ``wire_dtype`` is a shortcut for ``options["wire_dtype"]``. An unknown option, a bad value or a
    layer in two buckets raises :class:`PlanError`.
    """

    __slots__ = ("buckets", "solver", "family", "_options", "meta")

    def __init__(self, buckets: Iterable[Bucket], solver: str = "custom", wire_dtype: str | None = None,
                 meta: Mapping[str, Any] | None = None, *, family: str = DEFAULT_FAMILY,
                 options: Mapping[str, Any] | None = None) -> None:
        buckets = tuple(buckets)
        if not buckets:
            raise PlanError("a plan must have at least one bucket")
        if not all(isinstance(b, Bucket) for b in buckets):
            raise PlanError("plan buckets must be Bucket objects")
        if not isinstance(solver, str) or not solver:
            raise PlanError(f"plan solver must be a non-empty string, got {solver!r}")
        opts = dict(options or {})
        if wire_dtype is not None:
            if opts.get("wire_dtype", wire_dtype) != wire_dtype:
                raise PlanError("wire_dtype given twice with different values")
            opts["wire_dtype"] = wire_dtype
        from repro.core.families import get_family  # lazy: families import this module

        fam = get_family(family)
        opts = fam.check_options(opts)
        fam.check_messages(buckets)
        whole: set[str] = set()
        pieces: dict[str, dict[int, int]] = {}
        for b in buckets:
            for name in b.layers:
                if name in whole or (b.piece is None and name in pieces):
                    raise PlanError(f"layer '{name}' appears in more than one bucket")
            if b.piece is None:
                whole.update(b.layers)
            else:
                name = b.layers[0]
                index, count = b.piece
                have = pieces.setdefault(name, {})
                if index in have or any(c != count for c in have.values()):
                    raise PlanError(f"layer '{name}' is split inconsistently: piece [{index}, {count}] "
                                    "repeats or disagrees with the other pieces' count")
                have[index] = count
        for name, have in pieces.items():
            count = next(iter(have.values()))
            if len(have) != count:
                raise PlanError(f"layer '{name}' is split into {count} pieces but the plan has "
                                f"{len(have)} of them")
        for name, value in (("buckets", buckets), ("solver", solver), ("family", fam.name),
                            ("_options", tuple(sorted(opts.items()))), ("meta", dict(meta or {}))):
            object.__setattr__(self, name, value)
        fam.validate_plan(self)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Plan is immutable; build a new one (cannot set '{name}')")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (self.buckets, self.solver, self.family, self._options) == (
            other.buckets, other.solver, other.family, other._options)

    def __hash__(self) -> int:
        return hash((self.buckets, self.solver, self.family, self._options))

    def __repr__(self) -> str:
        opts = f", options={self.options}" if self._options else ""
        return f"Plan(family={self.family!r}, solver={self.solver!r}, buckets={self.num_buckets}{opts})"

    @property
    def options(self) -> dict[str, Any]:
        """The family options set on this plan (validated; defaults are not filled in)."""
        return dict(self._options)

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self._options).get(name, default)

    @property
    def wire_dtype(self) -> str | None:
        """The dtype gradients travel in (None: the trace's own dtype)."""
        return self.option("wire_dtype")

    def replace(self, **changes: Any) -> "Plan":
        """A copy with other ``buckets``, ``solver``, ``family``, ``options`` or ``meta``."""
        kw = {"buckets": self.buckets, "solver": self.solver, "family": self.family,
              "options": self.options, "meta": dict(self.meta)}
        unknown = set(changes) - set(kw)
        if unknown:
            raise TypeError(f"Plan.replace() got unknown field(s) {sorted(unknown)}")
        kw.update(changes)
        return Plan(kw["buckets"], kw["solver"], meta=kw["meta"], family=kw["family"], options=kw["options"])

    @classmethod
    def from_groups(cls, trace: Trace, groups: Iterable[Sequence[int]], solver: str,
                    collective: str = "allreduce", **kwargs: Any) -> "Plan":
        """Buckets from groups of layer indices (forward order), given in communication order."""
        names = trace.names
        messages = _ONE_ALLREDUCE if collective == "allreduce" else (Message(collective),)
        buckets = tuple(Bucket(tuple(names[i] for i in g), messages) for g in groups)
        return cls(buckets, solver=solver, **kwargs)

    def groups(self, trace: Trace) -> list[list[int]]:
        """Layer indices per bucket; checks that the plan covers every layer of ``trace`` exactly once."""
        index = trace.index()
        out = []
        for b in self.buckets:
            try:
                out.append([index[name] for name in b.layers])
            except KeyError as e:
                raise PlanError(f"plan field 'buckets[{len(out)}]': layer {e.args[0]!r} is not in trace "
                                f"'{trace.model}' ({trace.num_layers} layers, e.g. {trace.names[:2]})") from None
        covered = {name for b in self.buckets for name in b.layers}
        if len(covered) != trace.num_layers:
            missing = [n for n in trace.names if n not in covered]
            raise PlanError(f"plan does not cover {len(missing)} layer(s) of trace '{trace.model}', "
                            f"e.g. {missing[:3]}")
        return out

    def bucket_bytes(self, trace: Trace) -> list[float]:
        """Bytes of each bucket's gradients on the wire (after the ``wire_dtype`` conversion; a piece
        carries its share of its layer)."""
        nbytes = layer_wire_bytes(trace, self.wire_dtype)
        params = trace.params()
        return [float(sum(nbytes[i] for i in g)) if b.piece is None
                else float(nbytes[g[0]]) * _piece_fraction(int(params[g[0]]), *b.piece)
                for b, g in zip(self.buckets, self.groups(trace))]

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"family": self.family, "solver": self.solver}
        d.update(self.meta)
        d["buckets"] = [b.to_json_value() for b in self.buckets]
        if self._options:
            d["options"] = self.options
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, path: str | Path) -> None:
        write_output(path, self.to_json(indent=1) + "\n")

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        if not isinstance(d, dict):
            raise PlanError(f"a plan must be a JSON object, got {type(d).__name__}")
        buckets = d.get("buckets")
        if not isinstance(buckets, list) or not buckets:
            raise PlanError("plan field 'buckets' must be a non-empty list of lists of layer names")
        colls = d.get("collectives")  # older files: one collective per bucket
        if colls is not None and (not isinstance(colls, list) or len(colls) != len(buckets)):
            raise PlanError("plan field 'collectives' must list one collective per bucket")
        out = [Bucket.from_json_value(b, i, colls[i] if colls else None) for i, b in enumerate(buckets)]
        options = d.get("options", {})
        if not isinstance(options, dict):
            raise PlanError("plan field 'options' must be an object")
        options = dict(options)
        if d.get("wire_dtype") is not None:  # older files kept it at the top level
            options.setdefault("wire_dtype", d["wire_dtype"])
        family = d.get("family", DEFAULT_FAMILY)
        if not isinstance(family, str):
            raise PlanError(f"plan field 'family' must be a string, got {family!r}")
        solver = d.get("solver", "custom")
        if not isinstance(solver, str):
            raise PlanError(f"plan field 'solver' must be a string, got {solver!r}")
        meta = {k: v for k, v in d.items()
                if k not in ("family", "solver", "buckets", "collectives", "wire_dtype", "options")}
        _check_meta_numbers(meta)
        return cls(tuple(out), solver=solver, meta=meta, family=family, options=options)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """Read a plan file; every error names the file."""
        p = Path(path)
        if not p.is_file():
            raise PlanError(f"plan file not found: {p}")
        try:
            return cls.from_json(p.read_text())
        except PlanError as e:
            raise PlanError(f"{p}: {e}") from None


def plan_fit_refusal(plan: "Plan", layers: Sequence[str], view: str, *, model: str = "the model",
                     source: str = "the plan", views: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """Why ``plan`` does not fit a model whose layers in ``view`` are ``layers``, as one sentence, or None
    when every layer a bucket names is the model's and every model layer is in some bucket.

    ``model``/``source``: how the model and the plan are named (``"--model tiny_vgg"``, ``"--plan p.json"``).
    ``views``: the model's layers in its other views, by view name, to hint at the view the plan fits."""
    names = set(layers)
    planned = list(dict.fromkeys(layer for b in plan.buckets for layer in b.layers))
    unknown = [layer for layer in planned if layer not in names]
    if unknown:
        fits = [v for v, other in (views or {}).items() if v != view and set(planned) <= set(other)]
        made_for = (plan.meta.get("provenance") or {}).get("trace_model")
        if fits:
            hint = f"; they are its layers in the '{fits[0]}' view: use that view"
        elif isinstance(made_for, str) and made_for not in model:
            hint = f"; it was planned for '{made_for}'"
        else:
            hint = "; was it planned for another model or view?"
        return (f"{source} names {len(unknown)} layer(s) that {model} does not have in the '{view}' view "
                f"(e.g. {unknown[0]!r}){hint}")
    left_out = [layer for layer in layers if layer not in set(planned)]
    if left_out:
        return (f"{source} leaves {len(left_out)} layer(s) of {model} out (e.g. {left_out[0]!r}): every layer's "
                "gradient must be in a bucket")
    return None


# Ranges of a plan's meta numbers by key suffix (iteration_s, lower_bound_s, threshold_bytes)
_META_RANGES = (("_s", ranges.SECONDS), ("_bytes", ranges.BYTES))


def check_plan_workers(plan: "Plan", workers: int, where: str | Path = "plan") -> None:
    """Raise :class:`PlanError` when ``plan`` records (``provenance.workers``) another P than ``workers``.
    A plan without a recorded P is not checked."""
    recorded = (plan.meta.get("provenance") or {}).get("workers")
    if recorded is not None and int(recorded) != int(workers):
        raise PlanError(f"{where}: the plan was made for {recorded} workers (provenance.workers) but this job has "
                        f"{workers}; make it for {workers} (repro plan --workers {workers}) or run {recorded} ranks")


_PROVENANCE_RANGES = {"workers": ranges.WORKERS, "batch_size": ranges.BATCH_SIZE, "layers": ranges.COUNT}


def _check_provenance(prov: Any) -> None:
    if prov is None:
        return
    if not isinstance(prov, dict):
        raise PlanError(f"plan field 'provenance' must be an object, got {ranges.show(prov)}")
    for key, q in _PROVENANCE_RANGES.items():
        if prov.get(key) is not None:
            ranges.check(q, prov[key], f"provenance.{key}", PlanError, what="plan field")
    dtype = prov.get("wire_dtype")
    if dtype is not None and dtype not in WIRE_DTYPE_BYTES:
        raise PlanError(f"plan field 'provenance.wire_dtype' must be one of {', '.join(WIRE_DTYPE_BYTES)} (or null), "
                        f"got {ranges.show(dtype)}")


def _check_meta_numbers(meta: Mapping[str, Any]) -> None:
    """Predictions in range, ``*_share`` fractions in [0, 1], provenance plausible, any other number
    finite; ``null`` means "not predicted"."""
    _check_provenance(meta.get("provenance"))
    for key, v in meta.items():
        if key.endswith("_share") and v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v <= 1):
                raise PlanError(f"plan field '{key}' must be a fraction in [0, 1], got {ranges.show(v)}")
            continue
        for suffix, q in _META_RANGES:
            if key.endswith(suffix) and v is not None:
                ranges.check(q, v, key, PlanError, what="plan field")
                break
        else:
            if isinstance(v, float) and not math.isfinite(v):
                raise PlanError(f"plan field '{key}' must be a finite number, got {v!r}")
