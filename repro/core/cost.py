"""Collective communication cost models: seconds for a message of n bytes among P workers.

A :class:`CostModel` holds one :class:`Linear` (``a + b * n`` seconds) per collective for a fixed
worker count P. ``n`` is the argument of the collective's method:

- ``allreduce_s(n)``: bytes of the tensor reduced;
- ``reduce_scatter_s(n)``, ``allgather_s(n)``: bytes of the *full* tensor;
- ``sparse_allgather_s(n)``: bytes each worker contributes; the line is on the gathered ``P * n``
  bytes (OMGS-SGD's ``T_ag(m) = a + b * m * P``);
- ``push_s(n)``, ``pull_s(n)``: one worker's n-byte message to (from) a parameter server.

It may carry the top-k cost ``topk_s(d) = gamma * d * log2(d)`` seconds (``topk_gamma_s``). Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from repro.core import ranges
from repro.core.families import COLLECTIVES, is_known_collective, known_collectives
from repro.core.realism import Realism, RealismError
from repro.core.outputs import write_output

__all__ = ["COLLECTIVES", "ALGORITHMS", "Linear", "CostModel", "CostModelError", "fit_linear",
           "relative_errors", "fit_topk_gamma", "topk_time_s", "alpha_beta_lines", "check_workers"]

ALGORITHMS = ("ring", "tree", "recursive_doubling", "halving_doubling")


class CostModelError(ValueError):
    """Bad cost-model input (unknown preset, worker count a preset lacks, bad fit data)."""


@dataclass(frozen=True)
class Linear:
    """``seconds = a_s + b_s_per_byte * bytes``."""

    a_s: float
    b_s_per_byte: float

    def __post_init__(self) -> None:
        for name in ("a_s", "b_s_per_byte"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise CostModelError(f"{name} must be a finite non-negative number, got {v!r}")

    def __call__(self, nbytes):
        """Seconds for ``nbytes`` (scalar or numpy array); zero bytes cost nothing."""
        n = np.asarray(nbytes, dtype=float)
        t = np.where(n > 0, self.a_s + self.b_s_per_byte * n, 0.0)
        return float(t) if t.ndim == 0 else t

    def to_dict(self) -> dict[str, float]:
        return {"a_s": self.a_s, "b_s_per_byte": self.b_s_per_byte}


def fit_linear(nbytes: Iterable[float], seconds: Iterable[float], *, weighting: str = "relative") -> Linear:
    """Least-squares line ``a + b*bytes`` through measured (bytes, seconds) pairs, with ``a, b >= 0``
    exactly (a negative term of the unconstrained optimum is set to 0 and the other refitted).

    ``weighting="relative"`` (default) minimises squared *relative* errors, so small messages count as
    much as large ones; ``"absolute"`` is ordinary least squares.
    """
    x = np.asarray(list(nbytes), dtype=float)
    y = np.asarray(list(seconds), dtype=float)
    if x.shape != y.shape:
        raise CostModelError(f"fit needs as many byte sizes as times, got {x.size} and {y.size}")
    if x.size < 2 or np.unique(x).size < 2:
        raise CostModelError("fit needs measurements at two or more distinct message sizes")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))) or np.any(x < 0) or np.any(y < 0):
        raise CostModelError("fit data must be finite and non-negative")
    if weighting not in ("relative", "absolute"):
        raise CostModelError(f"weighting must be 'relative' or 'absolute', got {weighting!r}")
    if weighting == "relative" and np.any(y <= 0):
        raise CostModelError("a relative-error fit needs positive times")
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    t = y * w

    def loss(a: float, b: float) -> float:
        return float(np.sum((A @ np.array([a, b]) - t) ** 2))

    sol, *_ = np.linalg.lstsq(A, t, rcond=None)
    if sol[0] >= 0 and sol[1] >= 0:
        return Linear(float(sol[0]), float(sol[1]))
    # the constrained optimum lies on a boundary: a = 0 or b = 0
    b0 = float(max(0.0, A[:, 1] @ t / (A[:, 1] @ A[:, 1]))) if np.any(A[:, 1]) else 0.0
    a0 = float(max(0.0, A[:, 0] @ t / (A[:, 0] @ A[:, 0])))
    return Linear(*min([(0.0, b0), (a0, 0.0)], key=lambda ab: loss(*ab)))


def relative_errors(line: Linear, nbytes: Iterable[float], seconds: Iterable[float]) -> np.ndarray:
    """``fitted / measured - 1`` per measurement (what a relative-error fit minimises)."""
    x = np.asarray(list(nbytes), dtype=float)
    y = np.asarray(list(seconds), dtype=float)
    return (line.a_s + line.b_s_per_byte * x) / y - 1.0


def topk_time_s(gamma_s: float, numel):
    """``gamma * d * log2(d)`` seconds for top-k selection on ``d`` elements (0 for d <= 1)."""
    d = np.asarray(numel, dtype=float)
    t = np.where(d > 1, gamma_s * d * np.log2(np.maximum(d, 1.0)), 0.0)
    return float(t) if t.ndim == 0 else t


def fit_topk_gamma(numel: Iterable[float], seconds: Iterable[float]) -> float:
    """Least-squares ``gamma`` of ``t = gamma * d * log2(d)`` through measured (elements, seconds)
    pairs, minimising squared *relative* errors."""
    d = np.asarray(list(numel), dtype=float)
    y = np.asarray(list(seconds), dtype=float)
    if d.shape != y.shape or d.size < 1:
        raise CostModelError(f"top-k fit needs as many sizes as times (and at least one), got {d.size} and {y.size}")
    if not (np.all(np.isfinite(d)) and np.all(np.isfinite(y))) or np.any(d < 2) or np.any(y <= 0):
        raise CostModelError("top-k fit data must be finite, with sizes >= 2 elements and positive times")
    r = d * np.log2(d) / y
    return float(np.sum(r) / np.sum(r * r))


def alpha_beta_lines(workers: int, alpha_s: float, beta_s_per_byte: float,
                     gamma_s_per_byte: float = 0.0, algorithm: str = "ring") -> dict[str, Linear]:
    """Lines of every collective from per-hop latency alpha, transfer beta and reduction gamma.

    All-reduce follows Thakur et al. 2005 / Chan et al. 2007 as tabulated by MG-WFBP; reduce-scatter and
    all-gather are the matching halves (P-1 steps for ``ring``, log2 P otherwise); push/pull are one
    worker's message over one link, ``alpha + beta * n``.
    """
    check_workers(workers)
    if algorithm not in ALGORITHMS:
        raise CostModelError(f"unknown algorithm '{algorithm}'; choose one of {', '.join(ALGORITHMS)}")
    P, alpha, beta, gamma = workers, alpha_s, beta_s_per_byte, gamma_s_per_byte
    frac = (P - 1) / P
    lg = math.log2(P)
    ring_b = 2 * frac * beta + frac * gamma
    ar_a, ar_b, half_a = {"ring": (2 * (P - 1) * alpha, ring_b, (P - 1) * alpha),
                          "tree": (2 * lg * alpha, 2 * lg * (beta + gamma), lg * alpha),
                          "recursive_doubling": (lg * alpha, lg * (beta + gamma), lg * alpha),
                          "halving_doubling": (2 * lg * alpha, ring_b, lg * alpha)}[algorithm]
    ar = Linear(ar_a, ar_b)
    rs = Linear(half_a, frac * (beta + gamma))
    ag = Linear(half_a, frac * beta)
    ps = Linear(alpha, beta)
    return {"allreduce": ar, "reduce_scatter": rs, "allgather": ag, "sparse_allgather": ag,
            "push": ps, "pull": ps}


@dataclass(frozen=True)
class CostModel:
    """Per-collective linear costs for ``workers`` workers. ``source`` says where the numbers came from."""

    workers: int
    lines: Mapping[str, Linear]
    source: str = "custom"
    meta: Mapping[str, object] = field(default_factory=dict, compare=False)
    topk_gamma_s: float | None = None   # top-k selection: gamma * d * log2(d) seconds (None: unknown)
    # None: the paper model. Its line terms are added by :meth:`line`; ``lines`` stay the network's own.
    realism: Realism | None = None
    # The file it was read from, named by later errors; not compared, not written.
    path: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_workers(self.workers)
        if self.realism is not None and not isinstance(self.realism, Realism):
            raise CostModelError(f"realism must be a repro.core.realism.Realism, got {type(self.realism).__name__}")
        g = self.topk_gamma_s
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g)
                              or g < 0):
            raise CostModelError(f"topk_gamma_s must be a finite non-negative number, got {g!r}")
        unknown = {c for c in self.lines if not is_known_collective(c)}
        if unknown:
            raise CostModelError(f"unknown collective(s) {sorted(unknown)}; known: {', '.join(known_collectives())}")
        object.__setattr__(self, "lines", dict(self.lines))

    @classmethod
    def linear(cls, workers: int, a_s: float, b_s_per_byte: float, collective: str = "allreduce",
               source: str = "linear") -> "CostModel":
        """A model with one directly given line, e.g. the papers' fitted all-reduce ``a + b*M``."""
        return cls(workers, {collective: Linear(a_s, b_s_per_byte)}, source=source)

    @classmethod
    def from_alpha_beta(cls, workers: int, alpha_s: float, beta_s_per_byte: float,
                        gamma_s_per_byte: float = 0.0, algorithm: str = "ring",
                        source: str | None = None) -> "CostModel":
        lines = alpha_beta_lines(workers, alpha_s, beta_s_per_byte, gamma_s_per_byte, algorithm)
        meta = {"alpha_s": alpha_s, "beta_s_per_byte": beta_s_per_byte,
                "gamma_s_per_byte": gamma_s_per_byte, "algorithm": algorithm}
        return cls(workers, lines, source=source or f"alpha-beta ({algorithm})", meta=meta)

    @classmethod
    def fit(cls, workers: int, measurements: Mapping[str, tuple[Iterable[float], Iterable[float]]],
            source: str = "fitted") -> "CostModel":
        """Fit each collective from ``{collective: (bytes, seconds)}`` measured among ``workers``."""
        lines = {name: fit_linear(x, y) for name, (x, y) in measurements.items()}
        return cls(workers, lines, source=source)

    def with_topk(self, gamma_s: float) -> "CostModel":
        """A copy that also knows the top-k cost ``gamma_s * d * log2(d)``."""
        return replace(self, topk_gamma_s=gamma_s)

    def topk_s(self, numel):
        """Seconds of top-k selection on ``numel`` elements (scalar or array): ``gamma d log2 d``."""
        if self.topk_gamma_s is None:
            raise CostModelError(
                f"cost model '{self.source}' (P={self.workers}) has no top-k cost; fit gamma from measured "
                "top-k times (repro.core.cost.fit_topk_gamma, repro.families.sparse.calibrate.fit_topk) and use "
                "CostModel.with_topk(gamma), or the preset '1gbe-allgather'")
        return topk_time_s(self.topk_gamma_s, numel)

    def with_realism(self, realism: Realism | None) -> "CostModel":
        """A copy carrying ``realism`` (``None`` or an all-off one: the paper model)."""
        return replace(self, realism=None if realism is None or realism.is_paper_model else realism)

    @property
    def is_paper_model(self) -> bool:
        """True when no realism is attached: the lines and the papers' perfect-overlap model."""
        return self.realism is None

    def for_wire_dtype(self, wire_dtype: str | None) -> "CostModel":
        """The model a plan sending ``wire_dtype`` gradients sees: 16-bit ones also pay the cast cost."""
        if self.realism is None:
            return self
        r = self.realism.for_wire_dtype(wire_dtype)
        return self if r is self.realism else replace(self, realism=r)

    def with_line(self, collective: str, line: Linear) -> "CostModel":
        return replace(self, lines={**self.lines, collective: line})

    def line(self, collective: str) -> Linear:
        if not is_known_collective(collective):
            raise CostModelError(f"unknown collective '{collective}'; known: {', '.join(known_collectives())}")
        try:
            raw = self.lines[collective]
        except KeyError:
            have = ", ".join(sorted(self.lines)) or "none"
            where = f"cost file {self.path}: " if self.path else ""
            raise CostModelError(
                f"{where}cost model '{self.source}' (P={self.workers}) has no {collective} line (field 'lines' has: "
                f"{have}); fit one with CostModel.fit or use an alpha-beta model") from None
        if self.realism is None:
            return raw
        extra_a, extra_b = self.realism.line_extra(self.workers)
        return Linear(raw.a_s + extra_a, raw.b_s_per_byte + extra_b) if (extra_a or extra_b) else raw

    def time_s(self, collective: str, nbytes):
        """Seconds of ``collective`` on ``nbytes`` (see the module docstring for the byte convention)."""
        if collective == "sparse_allgather":
            return self.line(collective)(np.asarray(nbytes, dtype=float) * self.workers)
        return self.line(collective)(nbytes)

    def allreduce_s(self, nbytes):
        return self.time_s("allreduce", nbytes)

    def reduce_scatter_s(self, nbytes):
        return self.time_s("reduce_scatter", nbytes)

    def allgather_s(self, nbytes):
        return self.time_s("allgather", nbytes)

    def sparse_allgather_s(self, nbytes_per_worker):
        return self.time_s("sparse_allgather", nbytes_per_worker)

    def push_s(self, nbytes):
        return self.time_s("push", nbytes)

    def pull_s(self, nbytes):
        return self.time_s("pull", nbytes)

    @property
    def startup_s(self) -> float:
        """All-reduce start-up latency ``a`` (the MG-WFBP merge rule's threshold)."""
        return self.line("allreduce").a_s

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"workers": self.workers, "source": self.source,
                                "lines": {k: v.to_dict() for k, v in self.lines.items()}, "meta": dict(self.meta)}
        if self.topk_gamma_s is not None:
            d["topk_gamma_s"] = self.topk_gamma_s
        if self.realism is not None:
            d["realism"] = self.realism.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "CostModel":
        if not isinstance(d, Mapping):
            raise CostModelError(f"a cost model must be a JSON object, got {type(d).__name__}")
        lines_raw = d.get("lines")
        if not isinstance(lines_raw, Mapping) or not lines_raw:
            raise CostModelError("malformed cost model JSON: field 'lines' must be a non-empty object of "
                                 "{collective: {a_s, b_s_per_byte}}")
        lines = {}
        for k, v in lines_raw.items():
            if not isinstance(v, Mapping) or not {"a_s", "b_s_per_byte"} <= set(v):
                raise CostModelError(f"malformed cost model JSON: field 'lines.{k}' must have a_s and b_s_per_byte")
            ranges.check(ranges.SECONDS, v["a_s"], f"lines.{k}.a_s", CostModelError, what="cost model field")
            ranges.check(ranges.SECONDS_PER_BYTE, v["b_s_per_byte"], f"lines.{k}.b_s_per_byte", CostModelError,
                         what="cost model field")
            lines[k] = Linear(v["a_s"], v["b_s_per_byte"])
        workers = int(ranges.check(ranges.WORKERS, d.get("workers"), "workers", CostModelError, low=2,
                                   what="cost model field"))
        meta = d.get("meta", {})
        if not isinstance(meta, Mapping):
            raise CostModelError("malformed cost model JSON: field 'meta' must be an object")
        gamma = d.get("topk_gamma_s")
        if gamma is not None:
            ranges.check(ranges.TOPK_GAMMA_S, gamma, "topk_gamma_s", CostModelError, what="cost model field")
        realism = d.get("realism")
        if realism is not None:
            try:
                realism = Realism.from_dict(realism)
            except RealismError as e:
                raise CostModelError(f"malformed cost model JSON: field 'realism': {e}") from None
        return cls(workers, lines, source=str(d.get("source", "custom")), meta=dict(meta), topk_gamma_s=gamma,
                   realism=realism)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save(self, path: str | Path) -> None:
        """Write the model (with its fit measurements, if any) as JSON; :meth:`load` reads it back."""
        write_output(path, self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str) -> "CostModel":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise CostModelError(f"cost model is not valid JSON: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        p = Path(path)
        if not p.is_file():
            raise CostModelError(f"cost model file not found: {p}")
        try:
            return replace(cls.from_json(p.read_text()), path=str(p))
        except CostModelError as e:
            raise CostModelError(f"{p}: {e}") from None


def check_workers(workers: int) -> None:
    """A worker count a cost model can be made for (an integer >= 2), else CostModelError."""
    if not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers < 2:
        raise CostModelError(f"number of workers must be an integer >= 2, got {workers!r}")
