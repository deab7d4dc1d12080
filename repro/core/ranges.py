"""Plausible ranges of the numbers read from files, each quantity declared once.

Loaders call :func:`check` where a file is read, so an impossible number is refused in one line naming
the field, the value and the range. Imports nothing of this package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Quantity", "BYTES", "ELEMENTS", "SECONDS", "LATENCY_S", "SECONDS_PER_BYTE", "TOPK_GAMMA_S",
           "BITS_PER_S", "FLOPS", "WORKERS", "BATCH_SIZE", "COUNT", "FACTOR", "LEARNING_RATE", "MOMENTUM",
           "WEIGHT_DECAY", "SEED", "SEQ_LEN", "CLASSES", "LOADER_WORKERS", "REPEATS", "TRIALS", "MINUTES", "CPUS",
           "MEMORY_GB", "FRACTION", "TRACE_DTYPES", "check", "show", "QUANTITIES"]


@dataclass(frozen=True)
class Quantity:
    """A kind of number: its unit, the closed range ``[low, high]`` it must lie in, and whether it is an
    integer."""

    unit: str
    low: float
    high: float
    integer: bool = False
    high_text: str = ""   # the upper bound as written in messages (e.g. "2**50"); default: the number
    suffix: str = ""      # after the range in messages (e.g. "s", "bytes (1 PiB)")

    def range_text(self, low: float | None = None) -> str:
        lo = self.low if low is None else low
        return f"[{lo:g}, {self.high_text or format(self.high, 'g')}]" + (f" {self.suffix}" if self.suffix else "")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


# Why each bound: docs/design/core.md. The bounds refuse what no real system has, not the unusual.
BYTES = Quantity("bytes", 0, 2 ** 50, integer=True, high_text="2**50", suffix="bytes (1 PiB)")
ELEMENTS = Quantity("parameters", 0, 2 ** 50, integer=True, high_text="2**50", suffix="elements")
SECONDS = Quantity("seconds", 0, 1e6, high_text="1e6", suffix="s")
LATENCY_S = Quantity("seconds", 0, 10.0, high_text="10", suffix="s")
SECONDS_PER_BYTE = Quantity("seconds per byte", 0, 1.0, high_text="1", suffix="s/byte")
TOPK_GAMMA_S = Quantity("seconds", 0, 1e-3, high_text="1e-3", suffix="s")
BITS_PER_S = Quantity("bits per second", 8, 1e15, high_text="1e15", suffix="bit/s")
FLOPS = Quantity("floating-point operations", 0, 1e21, high_text="1e21", suffix="FLOPs")
WORKERS = Quantity("workers", 1, 100_000, integer=True, high_text="100000", suffix="workers")
BATCH_SIZE = Quantity("samples", 1, 2 ** 24, integer=True, high_text="2**24", suffix="samples")
COUNT = Quantity("count", 0, 1e9, integer=True, high_text="1e9")
FACTOR = Quantity("factor", 0, 1e6, high_text="1e6")
LEARNING_RATE = Quantity("learning rate", 0, 1e3, high_text="1e3")
MOMENTUM = Quantity("momentum", 0, 1.0, high_text="1")
WEIGHT_DECAY = Quantity("weight decay", 0, 10.0, high_text="10")
SEED = Quantity("seed", 0, 2 ** 32 - 1, integer=True, high_text="2**32-1")
SEQ_LEN = Quantity("tokens", 1, 2 ** 20, integer=True, high_text="2**20", suffix="tokens")
CLASSES = Quantity("classes", 1, 2 ** 24, integer=True, high_text="2**24", suffix="classes")
LOADER_WORKERS = Quantity("processes", 0, 256, integer=True, high_text="256", suffix="processes")
REPEATS = Quantity("repeats", 1, 1000, integer=True, high_text="1000")
TRIALS = Quantity("trials", 0, 10_000, integer=True, high_text="10000")
MINUTES = Quantity("minutes", 0, 1e5, high_text="1e5", suffix="min")
CPUS = Quantity("CPUs", 1, 4096, integer=True, high_text="4096", suffix="CPUs")
MEMORY_GB = Quantity("GB", 0, 1e5, high_text="1e5", suffix="GB")
FRACTION = Quantity("fraction", 0, 1.0, high_text="1")
#: Gradient dtypes a trace may declare (``mixed``: a model whose parameters differ).
TRACE_DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "mixed")

QUANTITIES = {"bytes": BYTES, "elements": ELEMENTS, "seconds": SECONDS, "latency_s": LATENCY_S,
              "seconds_per_byte": SECONDS_PER_BYTE, "topk_gamma_s": TOPK_GAMMA_S, "bits_per_s": BITS_PER_S,
              "flops": FLOPS, "workers": WORKERS, "batch_size": BATCH_SIZE, "count": COUNT, "factor": FACTOR,
              "learning_rate": LEARNING_RATE, "momentum": MOMENTUM, "weight_decay": WEIGHT_DECAY, "seed": SEED,
              "seq_len": SEQ_LEN, "classes": CLASSES, "loader_workers": LOADER_WORKERS, "repeats": REPEATS,
              "trials": TRIALS, "minutes": MINUTES, "cpus": CPUS, "memory_gb": MEMORY_GB, "fraction": FRACTION}


def show(value: Any) -> str:
    """``value`` for a one-line message: short even for a huge integer or a long string."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int) and value.bit_length() > 133:  # more than 40 digits
        return f"{value:.3e}" if value.bit_length() < 1000 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check(quantity: Quantity, value: Any, field: str, error: type[Exception] = ValueError,
          *, low: float | None = None, what: str = "field") -> Any:
    """``value`` if it is a number of ``quantity`` in its range (``low`` raises the lower bound, e.g. 2 for
    a cost model's workers), else ``error`` with one line naming ``field`` (after ``what``, e.g. ``trace field``), the value and the range. An
    integer quantity takes a float only when it is integral (``4.0``); the value is returned unchanged."""
    lo = quantity.low if low is None else low
    rng = quantity.range_text(low)
    kind = "an integer" if quantity.integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what} '{field}' must be {kind} of {quantity.unit} in {rng}, got {show(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise error(f"{what} '{field}' must be a finite number of {quantity.unit} in {rng}, got {show(value)}")
    if quantity.integer and isinstance(value, float) and not value.is_integer():
        raise error(f"{what} '{field}' must be {kind} of {quantity.unit} in {rng}, got {show(value)}")
    if not (lo <= value <= quantity.high):
        raise error(f"{what} '{field}' = {show(value)} is outside the plausible range {rng}")
    return value
