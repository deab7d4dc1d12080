"""Plausible ranges of the numbers read from files: each quantity declared once, with why.

Every number this package reads from a file (a trace, a plan, a cost file or cluster file, a CSV of
measured collectives, a grid file) is one of the quantities below. The loaders check it with
:func:`check` where the file is read, so a number that cannot be (``params: 10**30``, ``bytes: 1e300``,
``iteration_s: 1e308``) is refused in one line naming the file, the field, the value and the range,
before any output is written or any rank starts, instead of overflowing later or silently wrecking a
fit. The bounds are generous on purpose: they refuse what no real system has, not what is merely unusual.

Imports nothing of this package (and never torch): the torch-free core uses it.
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
    integer. ``text`` is the range as a person reads it in a message."""

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


# ---- the table -------------------------------------------------------------------------------------------
#: Bytes of a gradient, a message or a whole model: [0, 2**50] (1 PiB). The largest model of the papers
#: (BERT-large, ~3.4e8 parameters; the papers stay below 1e9) has a few GB of fp32 gradients, and the
#: largest accelerator memory today is ~1.4e11 bytes (an H200); 1 PiB is >1e5 times the papers' largest
#: model and ~1e4 GPUs' memory in one tensor, so anything above is a typo or a corrupted file.
BYTES = Quantity("bytes", 0, 2 ** 50, integer=True, high_text="2**50", suffix="bytes (1 PiB)")
#: Elements (parameters) of a layer or a model: [0, 2**50]; no element is smaller than a byte, so a tensor
#: has at most as many elements as :data:`BYTES` allows bytes (1e15 parameters is ~1e6 x the papers' largest).
ELEMENTS = Quantity("parameters", 0, 2 ** 50, integer=True, high_text="2**50", suffix="elements")
#: Seconds of a layer's compute, an iteration, an overhead, a collective's start-up, a prediction:
#: [0, 1e6] (~11.6 days). The papers' iterations take well under 10 s; one iteration (let alone one layer)
#: lasting more than a week and a half is no training run anyone times.
SECONDS = Quantity("seconds", 0, 1e6, high_text="1e6", suffix="s")
#: A link's per-message latency: [0, 10] s. A geostationary satellite hop is ~0.6 s, data-centre links are
#: microseconds; 10 s per message is beyond any network.
LATENCY_S = Quantity("seconds", 0, 10.0, high_text="10", suffix="s")
#: Seconds per byte of a fitted collective line: [0, 1]. One byte per second is slower than a 300-baud
#: modem (~30 bytes/s); even a tree all-reduce over 1e5 workers (2*log2(P) ~ 34 hops) on an 8 kbit/s link
#: stays below it.
SECONDS_PER_BYTE = Quantity("seconds per byte", 0, 1.0, high_text="1", suffix="s/byte")
#: Top-k selection cost gamma (seconds per d*log2(d), d elements): [0, 1e-3]. The only published fit is
#: 2.19e-10 s (OMGS-SGD, P102-100); 1e-3 s is ~5e6 times that, slower than any CPU's sort.
TOPK_GAMMA_S = Quantity("seconds", 0, 1e-3, high_text="1e-3", suffix="s")
#: A link's rate in bits per second: [8, 1e15]. 8 bit/s is the one byte per second of :data:`SECONDS_PER_BYTE`;
#: the fastest links today (NVLink 4: 900 GB/s, ~7.2e12 bit/s) are >100 times below 1e15 (1 Pbit/s).
BITS_PER_S = Quantity("bits per second", 8, 1e15, high_text="1e15", suffix="bit/s")
#: Floating-point operations of a layer's or a model's forward or backward pass (the estimator's FLOPs):
#: [0, 1e21]. BERT-large's forward at batch 32 is ~1e13 FLOPs; 1e21 is a whole H100 (~1e15 FLOP/s) busy for
#: ~11.6 days (:data:`SECONDS`) on one pass.
FLOPS = Quantity("floating-point operations", 0, 1e21, high_text="1e21", suffix="FLOPs")
#: Workers (ranks, GPUs, P; also GPUs per node): [1, 1e5]. The papers run at most 64 GPUs; the largest
#: training clusters known have ~1e5 GPUs. (A cost model needs P >= 2; its loader says so itself.)
WORKERS = Quantity("workers", 1, 100_000, integer=True, high_text="100000", suffix="workers")
#: Samples per GPU per step: [1, 2**24]. The papers' per-GPU batches are <= 1024 samples; 16.7 M samples
#: of even one byte each would not fit one step of any GPU's memory with activations.
BATCH_SIZE = Quantity("samples", 1, 2 ** 24, integer=True, high_text="2**24", suffix="samples")
#: A count of steps, epochs or pieces: [0, 1e9]. A billion steps of even 1 ms each is ~11.6 days
#: (:data:`SECONDS`); the papers run thousands.
COUNT = Quantity("count", 0, 1e9, integer=True, high_text="1e9")
#: A dimensionless factor that scales a time (realism's contention, compute_scale): [0, 1e6]. The papers'
#: effects are factors of a few; a model a million times off its measurement is the wrong model.
FACTOR = Quantity("factor", 0, 1e6, high_text="1e6")

# ---- the numbers of a training run's flags (repro train, repro launch, repro profile) ------------------
#: An optimizer's learning rate: [0, 1e3]. Published rates are <= ~30 (LARS at batch 32k, You et al. 2017;
#: SGD 0.1 x batch/256 stays below 10 at the papers' batches); a step of 1000 x the gradient diverges for any
#: model, and above ~3.4e38 torch cannot even hold the rate in float32 ("cannot be converted without overflow").
LEARNING_RATE = Quantity("learning rate", 0, 1e3, high_text="1e3")
#: SGD momentum: [0, 1]. The velocity is v <- momentum * v + g: above 1 it grows geometrically even with a zero
#: gradient (the run diverges whatever the rate); 1 itself never forgets a gradient (the degenerate edge, kept);
#: the papers use 0.9.
MOMENTUM = Quantity("momentum", 0, 1.0, high_text="1")
#: Weight decay: [0, 10]. Published values are <= 0.3 (AdamW's ViT runs; SGD's L2 is ~1e-4); a decay of 10 per
#: unit rate already shrinks the weights ten times faster than the rate moves them, so more is a typo.
WEIGHT_DECAY = Quantity("weight decay", 0, 10.0, high_text="10")
#: A random seed: [0, 2**32 - 1], what numpy's legacy seeding (and so the data loaders' workers) takes.
SEED = Quantity("seed", 0, 2 ** 32 - 1, integer=True, high_text="2**32-1")
#: Tokens per sample of a sequence model: [1, 2**20]. The papers use 35 (LSTM) to 512 (BERT); ~1e6 tokens is
#: the longest context any model is trained on today, and attention over it does not fit one rank's memory.
SEQ_LEN = Quantity("tokens", 1, 2 ** 20, integer=True, high_text="2**20", suffix="tokens")
#: Output classes (or vocabulary) of a model: [1, 2**24]. ImageNet-21k has ~2.2e4 classes, large vocabularies
#: ~2.6e5 tokens; 16.7 M outputs per sample is beyond any classifier head.
CLASSES = Quantity("classes", 1, 2 ** 24, integer=True, high_text="2**24", suffix="classes")
#: Data-loader processes per rank: [0, 256]. Each is a process of its own; the largest two-socket servers have
#: 256 cores (2 x 128), which a rank shares with the others, so more loaders than that only thrash.
LOADER_WORKERS = Quantity("processes", 0, 256, integer=True, high_text="256", suffix="processes")
#: Timed repeats per message size of a cost fit: [1, 1000] (``repro calibrate --repeats`` too): the median of a
#: thousand timings is as precise as timing gets, and each repeat sends every size once more.
REPEATS = Quantity("repeats", 1, 1000, integer=True, high_text="1000")
#: Trials of a Bayesian-optimisation tuner: [0, 10000]. DeAR tunes with ~10-20; a Gaussian process over n
#: trials costs O(n**3) per proposal (1e12 operations at 1e4), and each trial is a measured step.
TRIALS = Quantity("trials", 0, 10_000, integer=True, high_text="10000")
#: Minutes of wall-clock time (e.g. between in-run checkpoints): [0, 1e5] (~69 days), beyond any batch job's
#: time limit (SLURM sites allow days to a few weeks), so an interval longer never fires.
MINUTES = Quantity("minutes", 0, 1e5, high_text="1e5", suffix="min")

#: CPUs of one node (a SLURM task's --cpus-per-task): [1, 4096]. The largest single servers (8 sockets, SMT)
#: have ~1000 hardware threads; 4x that is no machine a job can ask for.
CPUS = Quantity("CPUs", 1, 4096, integer=True, high_text="4096", suffix="CPUs")
#: Memory of one node in GB (SLURM's --mem): (0, 1e5]. The largest shared-memory nodes have ~32 TB (3.2e4 GB).
MEMORY_GB = Quantity("GB", 0, 1e5, high_text="1e5", suffix="GB")

#: A share of a whole (top-k density, a stage's share of the bytes): [0, 1]; an option may exclude 0 itself.
FRACTION = Quantity("fraction", 0, 1.0, high_text="1")

#: Gradient dtypes a trace may declare: what the profiler writes (a torch floating dtype's name, or
#: ``mixed`` when a model's parameters differ) and what the estimator writes (float32, float16).
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
