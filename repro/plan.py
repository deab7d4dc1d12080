"""Plan: which layers' gradients travel together, in which order, over which collective.

A :class:`Plan` is the seam between planners (which produce it) and the simulator and runtime (which
execute it). Buckets are listed in the order the communication stream should prefer them (for the
all-reduce family: backward order, output side first). A bucket may hold any set of layers,
contiguous or not; it is ready when all of its layers' gradients are. JSON form::

    {"solver": "mgwfbp", "buckets": [["fc.weight", "fc.bias"], ["conv1.weight"]],
     "collectives": ["allreduce", "allreduce"], "wire_dtype": null}

(``collectives`` may be omitted, meaning all-reduce everywhere; ``iteration_s`` and other keys are
kept as ``meta``.) This module never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from repro.cost import COLLECTIVES
from repro.trace import Trace

__all__ = ["Bucket", "Plan", "PlanError", "WIRE_DTYPE_BYTES"]

WIRE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class PlanError(ValueError):
    """A plan is malformed or does not fit the trace it is used with."""


@dataclass(frozen=True)
class Bucket:
    """Layers (by name) whose gradients are sent as one message with ``collective``."""

    layers: tuple[str, ...]
    collective: str = "allreduce"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise PlanError("a bucket must hold at least one layer")
        if self.collective not in COLLECTIVES:
            raise PlanError(f"unknown collective '{self.collective}'; known: {', '.join(COLLECTIVES)}")


@dataclass(frozen=True)
class Plan:
    """Ordered buckets. ``wire_dtype`` (e.g. "float16") overrides the trace's gradient dtype on the wire."""

    buckets: tuple[Bucket, ...]
    solver: str = "custom"
    wire_dtype: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "buckets", tuple(self.buckets))
        if not self.buckets:
            raise PlanError("a plan must have at least one bucket")
        if self.wire_dtype is not None and self.wire_dtype not in WIRE_DTYPE_BYTES:
            raise PlanError(f"unknown wire_dtype '{self.wire_dtype}'; known: {', '.join(WIRE_DTYPE_BYTES)}")
        seen: set[str] = set()
        for b in self.buckets:
            for name in b.layers:
                if name in seen:
                    raise PlanError(f"layer '{name}' appears in more than one bucket")
                seen.add(name)

    # ---- construction from layer indices (what planners produce) ----
    @classmethod
    def from_groups(cls, trace: Trace, groups: Iterable[Sequence[int]], solver: str,
                    collective: str = "allreduce", **kwargs: Any) -> "Plan":
        """Buckets from groups of layer indices (forward order), given in communication order."""
        names = trace.names
        buckets = tuple(Bucket(tuple(names[i] for i in g), collective) for g in groups)
        return cls(buckets, solver=solver, **kwargs)

    def groups(self, trace: Trace) -> list[list[int]]:
        """Layer indices per bucket; checks that the plan covers every layer of ``trace`` exactly once."""
        index = trace.index()
        out = []
        for b in self.buckets:
            try:
                out.append([index[name] for name in b.layers])
            except KeyError as e:
                raise PlanError(f"plan layer {e.args[0]!r} is not in trace '{trace.model}'") from None
        covered = sum(len(g) for g in out)
        if covered != trace.num_layers:
            missing = [n for n in trace.names if n not in {x for b in self.buckets for x in b.layers}]
            raise PlanError(f"plan does not cover {len(missing)} layer(s) of trace '{trace.model}', "
                            f"e.g. {missing[:3]}")
        return out

    def bucket_bytes(self, trace: Trace) -> list[float]:
        """Bytes on the wire per bucket (after ``wire_dtype`` conversion)."""
        nbytes = trace.bytes()
        params = trace.params()
        out = []
        for g in self.groups(trace):
            if self.wire_dtype is None:
                out.append(float(sum(nbytes[i] for i in g)))
            else:
                out.append(float(sum(params[i] for i in g)) * WIRE_DTYPE_BYTES[self.wire_dtype])
        return out

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    # ---- JSON ----
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"solver": self.solver}
        d.update(self.meta)
        d["buckets"] = [list(b.layers) for b in self.buckets]
        if any(b.collective != "allreduce" for b in self.buckets):
            d["collectives"] = [b.collective for b in self.buckets]
        if self.wire_dtype is not None:
            d["wire_dtype"] = self.wire_dtype
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1) + "\n")

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        if not isinstance(d, dict):
            raise PlanError(f"a plan must be a JSON object, got {type(d).__name__}")
        buckets = d.get("buckets")
        if not isinstance(buckets, list) or not buckets:
            raise PlanError("plan field 'buckets' must be a non-empty list of lists of layer names")
        colls = d.get("collectives", ["allreduce"] * len(buckets))
        if not isinstance(colls, list) or len(colls) != len(buckets):
            raise PlanError("plan field 'collectives' must list one collective per bucket")
        out = []
        for i, (b, c) in enumerate(zip(buckets, colls)):
            if not isinstance(b, list) or not all(isinstance(n, str) for n in b):
                raise PlanError(f"plan field 'buckets[{i}]' must be a list of layer names")
            out.append(Bucket(tuple(b), c))
        meta = {k: v for k, v in d.items() if k not in ("solver", "buckets", "collectives", "wire_dtype")}
        return cls(tuple(out), solver=str(d.get("solver", "custom")), wire_dtype=d.get("wire_dtype"),
                   meta=meta)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        p = Path(path)
        if not p.is_file():
            raise PlanError(f"plan file not found: {p}")
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise PlanError(f"{p}: plan is not valid JSON: {e}") from None
        return cls.from_dict(d)
