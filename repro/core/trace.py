"""Trace: a model's learnable layers in forward order, with timings and gradient sizes.

The JSON format every tool of the project reads and writes::

    {"model": "resnet50", "batch_size": 32, "device": "V100 (estimate)", "dtype": "float32",
     "layers": [{"name": "conv1.weight", "params": 9408, "bytes": 37632,
                 "forward_s": 1.2e-4, "backward_s": 2.5e-4}, ...]}

Layer 0 is the input side; layer ``l``'s gradient is ready ``sum(backward_s[l:])`` seconds after
backward starts. Extra keys (top level or per layer) survive a round trip. ``overheads``
(:class:`Overheads`, optional; top-level ``pre_forward_s`` / ``straggler_s`` / ``update_s`` are read as
them too) are measured seconds per iteration outside the layers. Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import numpy as np

from repro.core import ranges
from repro.core.outputs import write_output

__all__ = ["Layer", "Overheads", "Trace", "TraceError", "load_trace"]


class TraceError(ValueError):
    """A trace is malformed; the message names the offending field."""


_LAYER_FIELDS = {"name": str, "params": int, "bytes": int, "forward_s": float, "backward_s": float}
_TOP_FIELDS = {"model": str, "batch_size": int, "device": str, "dtype": str}
# The plausible range of each number of a layer (repro.core.ranges says why each bound).
_LAYER_RANGES = {"params": ranges.ELEMENTS, "bytes": ranges.BYTES, "forward_s": ranges.SECONDS,
                 "backward_s": ranges.SECONDS}


@dataclass(frozen=True)
class Layer:
    """One unit of gradient production: ``params`` elements, ``bytes`` of gradient, seconds of compute."""

    name: str
    params: int
    bytes: int
    forward_s: float
    backward_s: float
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "params": self.params, "bytes": self.bytes,
             "forward_s": self.forward_s, "backward_s": self.backward_s}
        d.update(self.extra)
        return d


@dataclass(frozen=True)
class Overheads:
    """Measured seconds per iteration outside the layers' compute (all 0 in the papers' model):
    ``pre_forward_s`` (e.g. the buffer broadcast), ``straggler_s`` (how much later than the average
    rank the slowest one finishes computing) and ``update_s`` (the optimizer step, after the last
    collective)."""

    pre_forward_s: float = 0.0
    straggler_s: float = 0.0
    update_s: float = 0.0

    def __post_init__(self) -> None:
        for key in OVERHEAD_FIELDS:
            v = ranges.check(ranges.SECONDS, getattr(self, key), f"overheads.{key}", TraceError, what="trace field")
            object.__setattr__(self, key, float(v))

    @property
    def after_backward_s(self) -> float:
        """Seconds added after the last collective: the straggler wait plus the update."""
        return self.straggler_s + self.update_s

    @property
    def total_s(self) -> float:
        return self.pre_forward_s + self.straggler_s + self.update_s

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in OVERHEAD_FIELDS}

    @classmethod
    def from_dict(cls, d: Any) -> "Overheads":
        if not isinstance(d, dict):
            raise TraceError(f"trace field 'overheads' must be an object, got {type(d).__name__}")
        unknown = set(d) - set(OVERHEAD_FIELDS)
        if unknown:
            raise TraceError(f"trace field 'overheads' has unknown key(s) {sorted(unknown)}; "
                             f"known: {', '.join(OVERHEAD_FIELDS)}")
        return cls(**{k: d[k] for k in OVERHEAD_FIELDS if k in d})


OVERHEAD_FIELDS = ("pre_forward_s", "straggler_s", "update_s")


@dataclass(frozen=True)
class Trace:
    """Per-layer forward/backward seconds and gradient bytes of one model at one batch size."""

    model: str
    batch_size: int
    device: str
    dtype: str
    layers: tuple[Layer, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    overheads: Overheads = field(default_factory=Overheads)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not isinstance(self.overheads, Overheads):
            raise TraceError(f"trace overheads must be an Overheads, got {type(self.overheads).__name__}")
        clash = set(self.extra) & ({"overheads", "layers"} | set(OVERHEAD_FIELDS) | set(_TOP_FIELDS))
        if clash:
            raise TraceError(f"trace extra must not hold the typed field(s) {sorted(clash)}")
        _check_top(self.to_dict_header())
        if not self.layers:
            raise TraceError("trace field 'layers' is empty: a trace needs at least one layer")
        names = tuple(layer.name for layer in self.layers)
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})[:3]
            raise TraceError(f"trace field 'layers' has duplicate layer names: {dup}")
        for i, layer in enumerate(self.layers):
            _check_layer(layer.to_dict(), i)
        total_s = sum(layer.forward_s + layer.backward_s for layer in self.layers) + self.overheads.total_s
        if not total_s <= ranges.SECONDS.high:
            raise TraceError(f"trace times: the layers' forward_s and backward_s and the overheads add up to "
                             f"{total_s:.4g} s per iteration, outside the plausible range {ranges.SECONDS.range_text()}")
        for key, q in (("params", ranges.ELEMENTS), ("bytes", ranges.BYTES)):
            total = sum(getattr(layer, key) for layer in self.layers)
            if total > q.high:
                raise TraceError(f"trace field 'layers[*].{key}' adds up to {ranges.show(total)} for the model, "
                                 f"outside the plausible range {q.range_text()}")
        # Views read many times by planners and the simulator: computed once, handed out read-only.
        cache = {"names": names, "index": {n: i for i, n in enumerate(names)}}
        for key, attr, dtype in (("forward", "forward_s", float), ("backward", "backward_s", float),
                                 ("bytes", "bytes", float), ("params", "params", np.int64)):
            arr = np.array([getattr(layer, attr) for layer in self.layers], dtype=dtype)
            arr.setflags(write=False)
            cache[key] = arr
        object.__setattr__(self, "_views", cache)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def names(self) -> list[str]:
        return list(self._views["names"])

    def forward_s(self) -> np.ndarray:
        """Forward seconds per layer (read-only array, forward order)."""
        return self._views["forward"]

    def backward_s(self) -> np.ndarray:
        """Backward seconds per layer (read-only array, forward order)."""
        return self._views["backward"]

    def bytes(self) -> np.ndarray:
        """Gradient bytes per layer (read-only float array)."""
        return self._views["bytes"]

    def params(self) -> np.ndarray:
        """Parameters per layer (read-only int64 array)."""
        return self._views["params"]

    @property
    def total_forward_s(self) -> float:
        return float(sum(layer.forward_s for layer in self.layers))

    @property
    def total_backward_s(self) -> float:
        return float(sum(layer.backward_s for layer in self.layers))

    @property
    def total_bytes(self) -> int:
        return int(sum(layer.bytes for layer in self.layers))

    @property
    def total_params(self) -> int:
        return int(sum(layer.params for layer in self.layers))

    @property
    def is_estimate(self) -> bool:
        """True when timings come from the roofline estimator rather than a measurement."""
        return bool(self.extra.get("estimate", False))

    def index(self) -> Mapping[str, int]:
        """Layer name -> position in forward order (read-only mapping)."""
        return MappingProxyType(self._views["index"])

    def replace_layers(self, layers: Iterable[Layer], **changes: Any) -> "Trace":
        """A copy with other layers (and optionally other top-level fields)."""
        d = {"model": self.model, "batch_size": self.batch_size, "device": self.device,
             "dtype": self.dtype, "extra": dict(self.extra), "overheads": self.overheads}
        d.update(changes)
        return Trace(layers=tuple(layers), **d)

    def to_dict_header(self) -> dict[str, Any]:
        return {"model": self.model, "batch_size": self.batch_size, "device": self.device,
                "dtype": self.dtype}

    def to_dict(self) -> dict[str, Any]:
        d = self.to_dict_header()
        d.update(self.extra)
        if self.overheads != Overheads():
            d["overheads"] = self.overheads.to_dict()
        d["layers"] = [layer.to_dict() for layer in self.layers]
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, path: str | Path) -> None:
        write_output(path, self.to_json() + "\n")

    @classmethod
    def from_dict(cls, d: Any) -> "Trace":
        if not isinstance(d, dict):
            raise TraceError(f"a trace must be a JSON object, got {type(d).__name__}")
        _check_top(d)
        raw_layers = d.get("layers")
        if raw_layers is None:
            raise TraceError("trace field 'layers' is missing")
        if not isinstance(raw_layers, list):
            raise TraceError("trace field 'layers' must be a list")
        if not raw_layers:
            raise TraceError("trace field 'layers' is empty: a trace needs at least one layer")
        layers = []
        for i, raw in enumerate(raw_layers):
            _check_layer(raw, i)
            _check_layer_bytes(raw, i, d["dtype"])
            extra = {k: v for k, v in raw.items() if k not in _LAYER_FIELDS}
            _check_extra_numbers(extra, f"layers[{i}]")
            layers.append(Layer(name=raw["name"], params=int(raw["params"]), bytes=int(raw["bytes"]),
                                forward_s=float(raw["forward_s"]), backward_s=float(raw["backward_s"]),
                                extra=extra))
        extra = {k: v for k, v in d.items() if k not in _TOP_FIELDS and k != "layers"}
        _check_extra_numbers({k: v for k, v in extra.items() if k != "overheads"}, "")
        legacy = {k: extra.pop(k) for k in OVERHEAD_FIELDS if k in extra}
        raw_over = extra.pop("overheads", {})
        if legacy and raw_over:
            raise TraceError("trace has both 'overheads' and top-level " + ", ".join(sorted(legacy)))
        overheads = Overheads.from_dict(raw_over or legacy)
        return cls(model=d["model"], batch_size=int(d["batch_size"]), device=d["device"],
                   dtype=d["dtype"], layers=tuple(layers), extra=extra, overheads=overheads)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"trace is not valid JSON: {e}") from None
        except RecursionError:
            raise TraceError("trace JSON is nested too deeply to be a trace") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a trace file; every error names the file."""
        p = Path(path)
        if p.is_dir():
            raise TraceError(f"trace {p} is a folder, not a trace file")
        if p.exists() and not p.is_file():
            raise TraceError(f"trace {p} is not a regular file (a device, pipe or socket)")
        if not p.is_file():
            raise TraceError(f"trace file not found: {p}")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{p}: a trace is UTF-8 JSON text, but byte {e.start} is not UTF-8") from None
        except OSError as e:
            raise TraceError(f"{p}: cannot be read: {e.strerror or e}") from None
        try:
            return cls.from_json(text)
        except TraceError as e:
            raise TraceError(f"{p}: {e}") from None
        except (ValueError, TypeError, RecursionError) as e:
            raise TraceError(f"{p}: not a trace: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                             ) from None


_SHIPPED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def load_trace(path_or_name: str | Path) -> Trace:
    """Load a trace from a path, or a shipped trace by stem (e.g. ``"resnet50_b32_v100-estimate"``;
    letters, digits, ``_ . -``, never ``..`` or a separator; ``repro traces`` lists them)."""
    if not str(path_or_name).strip():
        raise TraceError("the trace is empty: give a trace file or a shipped trace name (`repro traces`)")
    p = Path(path_or_name)
    if p.suffix == ".json" or p.exists():
        return Trace.load(p)
    name = str(path_or_name)
    if "/" in name or "\\" in name or name != p.name:  # a path to a file that is not there
        raise TraceError(f"trace file not found: {p}")
    if not _SHIPPED_NAME.fullmatch(name) or ".." in name:
        raise TraceError(f"{name!r} is not a shipped trace name (letters, digits, _ . - and no '..'; "
                         "`repro traces` lists them) nor a trace file")
    from repro.core.paths import shipped_trace_path, traces_dir

    path = shipped_trace_path(name)
    if path.resolve().parent != traces_dir().resolve():
        raise TraceError(f"shipped trace name {name!r} resolves outside the shipped traces folder")
    return Trace.load(path)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_top(d: dict[str, Any]) -> None:
    for key, typ in _TOP_FIELDS.items():
        if key not in d:
            raise TraceError(f"trace field '{key}' is missing")
        v = d[key]
        if typ is str and not isinstance(v, str):
            raise TraceError(f"trace field '{key}' must be a string, got {v!r}")
        if typ is int:
            if not _is_int(v):
                raise TraceError(f"trace field '{key}' must be an integer, got {ranges.show(v)}")
            ranges.check(ranges.BATCH_SIZE, v, key, TraceError, what="trace field")
    if d["dtype"] not in ranges.TRACE_DTYPES:
        raise TraceError(f"trace field 'dtype' must be one of {', '.join(ranges.TRACE_DTYPES)}, got "
                         f"{ranges.show(d['dtype'])}")


#: bytes per element of a gradient dtype a trace may declare (``mixed``: per layer, not known here)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _check_layer_bytes(raw: dict[str, Any], i: int, dtype: str) -> None:
    """A layer's ``bytes`` must be its ``params`` x the trace's dtype size (not checked for ``mixed``)."""
    size = _DTYPE_BYTES.get(dtype)
    if size is not None and raw["bytes"] != raw["params"] * size:
        raise TraceError(f"trace field 'layers[{i}].bytes' = {ranges.show(raw['bytes'])} does not match its "
                         f"params {ranges.show(raw['params'])} x {size} bytes ({dtype}) = "
                         f"{ranges.show(raw['params'] * size)}")


# Ranges of extra numbers by key suffix, then the counts by name; any other number must be finite.
_EXTRA_RANGES = (("_s", ranges.SECONDS), ("_bytes_moved", ranges.BYTES), ("_flops", ranges.FLOPS))
_EXTRA_COUNTS = ("warmup", "iters", "order_changes", "kernels", "num_threads")


def _check_extra_numbers(extra: dict[str, Any], where: str, depth: int = 0) -> None:
    for key, v in extra.items():
        name = f"{where}.{key}" if where else key
        if isinstance(v, dict) and depth < 3:
            _check_extra_numbers(v, name, depth + 1)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(f"trace field '{name}' must be a finite number, got {ranges.show(v)}")
        if depth:  # nested (the estimator's assumptions): finite is all that is known
            continue
        q = next((q for suffix, q in _EXTRA_RANGES if key.endswith(suffix)),
                 ranges.COUNT if key in _EXTRA_COUNTS else None)
        if q is not None:
            ranges.check(q, v, name, TraceError, what="trace field")
        elif key in ("grad_abs_mean", "seed") and v < 0:
            raise TraceError(f"trace field '{name}' must be >= 0, got {ranges.show(v)}")


def _check_layer(raw: Any, i: int) -> None:
    where = f"layers[{i}]"
    if not isinstance(raw, dict):
        raise TraceError(f"trace field '{where}' must be an object")
    for key, typ in _LAYER_FIELDS.items():
        if key not in raw:
            raise TraceError(f"trace field '{where}.{key}' is missing")
        v = raw[key]
        if typ is str:
            if not isinstance(v, str) or not v:
                raise TraceError(f"trace field '{where}.{key}' must be a non-empty string")
            continue
        if typ is int and not _is_int(v):
            raise TraceError(f"trace field '{where}.{key}' must be an integer, got {ranges.show(v)}")
        ranges.check(_LAYER_RANGES[key], v, f"{where}.{key}", TraceError, what="trace field")
