"""Realism: the physical effects the papers' model leaves out, as explicit parameters with units.

The papers' model is a trace's compute, a collective's ``a + b·n`` line and perfect overlap. Each
effect is one field of :class:`Realism`, all off in the **paper model**:

- ``message_overhead_s`` (``a0``), ``message_overhead_per_peer_s`` (``a1``) and
  ``message_overhead_per_in_flight_s`` (``a2``): seconds per collective beyond the network's line,
  ``per_message_s(P, in_flight) = a0 + a1·(P-1) + a2·in_flight``; ``a0 + a1·(P-1)`` is added to every
  line's ``a``, ``a2`` is applied by the simulator (:mod:`repro.core.contention`);
- ``copy_s_per_byte``: copying into and out of a fusion buffer, added to every line's ``b``;
- ``fp16_cast_s_per_byte``: per wire byte of a 16-bit message, added to ``b``;
- ``contention``: computation runs ``1 + contention`` times slower while communication is in flight;
- ``update_s_per_byte``: the optimizer update per gradient byte (without a measured ``update_s``);
- ``compute_scale``: factor on every layer's compute seconds (:meth:`Realism.scaled_to_measured`).

A :class:`~repro.core.cost.CostModel` carries a ``Realism`` (``None``: the paper model);
:meth:`Realism.apply_to_trace` applies the trace side. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

__all__ = ["Realism", "RealismError", "PAPER_MODEL", "SIXTEEN_BIT_DTYPES"]

SIXTEEN_BIT_DTYPES = ("float16", "bfloat16")


class RealismError(ValueError):
    """A realism parameter is out of range; the message names it."""


@dataclass(frozen=True)
class Realism:
    """Effects beyond the papers' model (module docstring); the defaults are the paper model."""

    message_overhead_s: float = 0.0
    copy_s_per_byte: float = 0.0
    fp16_cast_s_per_byte: float = 0.0
    contention: float = 0.0
    update_s_per_byte: float = 0.0
    compute_scale: float = 1.0
    message_overhead_per_peer_s: float = 0.0
    message_overhead_per_in_flight_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise RealismError(f"realism parameter {f.name} must be a finite non-negative number, got {v!r}")
            object.__setattr__(self, f.name, float(v))
        if self.compute_scale <= 0:
            raise RealismError(f"realism parameter compute_scale must be positive, got {self.compute_scale!r}")

    @property
    def is_paper_model(self) -> bool:
        """True when every effect is off."""
        return self == PAPER_MODEL

    @property
    def overlap_slowdown(self) -> float:
        """Fractional slowdown of computation while a collective is in flight (``contention``)."""
        return self.contention

    def per_message_s(self, workers: int = 1, in_flight: int = 0) -> float:
        """Seconds one collective costs beyond the network's line, among ``workers`` workers with
        ``in_flight`` other messages waiting on its stream: ``a0 + a1·(P-1) + a2·in_flight``."""
        return (self.message_overhead_s + self.message_overhead_per_peer_s * max(0, int(workers) - 1)
                + self.message_overhead_per_in_flight_s * max(0, int(in_flight)))

    def line_extra(self, workers: int = 1) -> tuple[float, float]:
        """``(seconds, seconds per byte)`` added to every line of a ``workers``-worker model."""
        return self.per_message_s(workers, 0), self.copy_s_per_byte

    def for_wire_dtype(self, wire_dtype: str | None) -> "Realism":
        """This realism for a plan sending ``wire_dtype`` gradients: for 16-bit ones the cast cost joins
        the copy cost."""
        if wire_dtype in SIXTEEN_BIT_DTYPES and self.fp16_cast_s_per_byte > 0:
            return replace(self, copy_s_per_byte=self.copy_s_per_byte + self.fp16_cast_s_per_byte,
                           fp16_cast_s_per_byte=0.0)
        return self

    def apply_to_trace(self, trace: Any) -> Any:
        """``trace`` with compute scaled by ``compute_scale`` and, without a measured update,
        ``overheads.update_s = update_s_per_byte x gradient bytes`` (``trace`` itself if unchanged)."""
        if self.compute_scale == 1.0 and (self.update_s_per_byte == 0.0 or trace.overheads.update_s > 0):
            return trace
        layers = trace.layers
        if self.compute_scale != 1.0:
            k = self.compute_scale
            layers = [replace(layer, forward_s=layer.forward_s * k, backward_s=layer.backward_s * k)
                      for layer in layers]
        o = trace.overheads
        if self.update_s_per_byte > 0 and o.update_s == 0:
            o = replace(o, update_s=self.update_s_per_byte * float(trace.total_bytes))
        return trace.replace_layers(layers, overheads=o)

    def scaled_to_measured(self, trace: Any, measured_iteration_s: float) -> "Realism":
        """This realism with ``compute_scale`` set so that one device's iteration of ``trace``
        (forward + backward x scale, plus the update) takes ``measured_iteration_s`` seconds."""
        if not (isinstance(measured_iteration_s, (int, float)) and math.isfinite(measured_iteration_s)
                and measured_iteration_s > 0):
            raise RealismError(f"measured single-device iteration must be a positive number of seconds, "
                               f"got {measured_iteration_s!r}")
        update = trace.overheads.update_s or self.update_s_per_byte * float(trace.total_bytes)
        compute = trace.total_forward_s + trace.total_backward_s
        if compute <= 0 or measured_iteration_s <= update:
            raise RealismError(f"cannot scale {trace.model}'s computation ({compute:.3g} s) to a measured "
                               f"{measured_iteration_s:.3g} s iteration with a {update:.3g} s update")
        return replace(self, compute_scale=(measured_iteration_s - update) / compute)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Realism":
        if not isinstance(d, Mapping):
            raise RealismError(f"realism must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RealismError(f"unknown realism parameter(s) {unknown}; known: {', '.join(sorted(known))}")
        from repro.core import ranges

        for key, v in d.items():
            q = (ranges.SECONDS_PER_BYTE if key.endswith("_s_per_byte") else ranges.SECONDS if key.endswith("_s")
                 else ranges.FACTOR)
            ranges.check(q, v, key, RealismError, what="realism parameter")
        return cls(**dict(d))


PAPER_MODEL = Realism()
