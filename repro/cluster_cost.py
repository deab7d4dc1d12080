"""A user's cluster as a cost model: nodes, devices per node, link rates and latencies, top-k cost.

What ``repro plan``, ``repro simulate`` and ``repro compare`` build from ``--nodes N --gpus-per-node G
--inter-link RATE[@LATENCY] [--intra-link RATE[@LATENCY]] [--algorithm A]``:

- **Links.** A link is a rate and a per-message start-up latency (:class:`~repro.topology.Link`:
  ``beta_s_per_byte = 8 / bits_per_s``, ``alpha_s`` = latency). Rates: bits per second ``25gbit``,
  ``100mbit``, ``1.5gbit``, ``512kibit`` (IEC prefixes are powers of 1024), or bytes per second with a
  capital ``B`` and ``/s``: ``10GB/s``, ``500MB/s``, ``1GiB/s`` (:func:`parse_rate`). ``gbps``, ``Gb/s``
  and ``gb/s`` are refused: they read as bits to some and bytes to others, a factor of eight.
  Latencies need a unit: ``5us``, ``0.5ms``, ``200ns``, ``1e-5s`` (:func:`parse_latency`).
- **Defaults** (assumptions, stated where they are used): an inter-node link given without a latency
  has :data:`DEFAULT_INTER_LATENCY_S` (25 us: between the per-hop start-ups the MG-WFBP fits give for
  56 Gb InfiniBand, 7.9 us, and 10GbE, 30 us; presets ``56gbib-derived`` and ``10gbe-derived``); an
  intra-node link given without one has :data:`DEFAULT_INTRA_LATENCY_S` (5 us, a PCIe/NVLink
  peer-to-peer copy's start-up). Without ``--intra-link`` the devices of a node are joined by the
  intra-node link fitted on the measured V100 cluster (the shipped ``10gbe-calibrated`` preset: 4
  V100s per node over PCIe, about 4.3 GB/s and 17 us; :func:`default_intra_link`).
- **Collectives.** Every family's lines (all-reduce, reduce-scatter, all-gather, sparse all-gather,
  push, pull) for P workers, from :class:`~repro.topology.Topology` for ``ring`` (one ring over every
  device, each step as slow as its slowest hop) and ``hierarchical`` (intra-node reduce-scatter, a ring
  across nodes, intra-node all-gather); the flat algorithms of :func:`repro.cost.alpha_beta_lines`
  (``tree``, ``recursive_doubling``, ``halving_doubling``) use the slowest link the job crosses. Push
  and pull (a parameter server on another node) go over the inter-node link, on one node over the
  intra-node one. Reductions cost nothing per byte (``gamma`` = 0).
- **Top-k cost** (the sparse family's ``gamma * d * log2(d)`` seconds on d elements,
  :meth:`repro.cost.CostModel.topk_s`): ``--topk-gamma S`` directly, or a device of
  :data:`TOPK_DEVICES` (:func:`topk_gamma_for_device`): the OMGS-SGD paper's published fit on a
  P102-100 (2.19e-10 s at density 0.001, the only published one) scaled to the device by effective
  memory bandwidth (top-k selection streams the tensor through memory, so it is taken to be
  memory-bound), with the GPU table of the roofline estimates (:mod:`repro.workload.estimate`).

A user's own measurements of collectives (a CSV of message bytes, P, seconds, collective) fit into a
cost file with :func:`fit_measurements_csv` (``repro cost fit``), one line per collective by
:func:`repro.cost.fit_linear`, the same relative-error least squares ``repro calibrate`` uses.
Never imports torch.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from repro.cost import ALGORITHMS, COLLECTIVES, CostModel, CostModelError, Linear, alpha_beta_lines, fit_linear, relative_errors
from repro.outputs import InputPathError, read_input
from repro.presets import preset, preset_names
from repro.topology import TOPOLOGY_ALGORITHMS, Link, Topology

__all__ = [
    "CLUSTER_ALGORITHMS", "DEFAULT_INTER_LATENCY_S", "DEFAULT_INTRA_LATENCY_S", "TOPK_DEVICES",
    "PUBLISHED_TOPK_GAMMA_S", "parse_rate", "parse_latency", "parse_link", "default_intra_link",
    "cluster_cost_model", "topk_gamma_for_device", "topk_device_of_trace", "load_cost", "fit_measurements",
    "fit_measurements_csv", "describe_link",
]

CLUSTER_ALGORITHMS = tuple(dict.fromkeys(TOPOLOGY_ALGORITHMS + ALGORITHMS))
DEFAULT_INTER_LATENCY_S = 25e-6
DEFAULT_INTRA_LATENCY_S = 5e-6

_BIT_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
               "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}
_BYTE_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"
_BITS_RE = re.compile(rf"^{_NUMBER}\s*([kmgtKMGT][iI]?)?bits?$", re.I)
_BYTES_RE = re.compile(rf"^{_NUMBER}\s*([kKMGT]i?)?B/s$")
_LATENCY_RE = re.compile(rf"^{_NUMBER}\s*(s|ms|us|µs|ns)$")
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_rate(text: str, flag: str = "rate") -> float:
    """Bits per second of ``text``: ``25gbit``, ``100mbit``, ``1gibit``, or bytes per second ``10GB/s``,
    ``500MB/s``, ``1GiB/s`` (x 8). One-line :class:`~repro.cost.CostModelError` naming ``flag`` otherwise."""
    s = str(text).strip()
    m = _BITS_RE.match(s)
    if m:
        bps = float(m.group(1)) * _BIT_PREFIX[(m.group(2) or "").lower()]
    else:
        m = _BYTES_RE.match(s)
        if m:
            bps = 8.0 * float(m.group(1)) * _BYTE_PREFIX[m.group(2) or ""]
        elif re.search(r"(bps|b/s)$", s, re.I):
            raise CostModelError(f"{flag}: rate {s!r} is ambiguous (bits or bytes per second?); write bits per "
                                 "second as e.g. 25gbit or bytes per second with a capital B as e.g. 10GB/s")
        else:
            raise CostModelError(f"{flag}: cannot read rate {s!r}; write bits per second (25gbit, 100mbit, 1gibit) "
                                 "or bytes per second (10GB/s, 500MB/s)")
    if not math.isfinite(bps) or bps <= 0:
        raise CostModelError(f"{flag}: rate {s!r} must be positive and finite")
    return bps


def parse_latency(text: str, flag: str = "latency") -> float:
    """Seconds of ``text``: a number with a unit, ``5us``, ``0.5ms``, ``200ns``, ``1e-5s`` (>= 0)."""
    s = str(text).strip()
    m = _LATENCY_RE.match(s)
    if not m:
        raise CostModelError(f"{flag}: cannot read latency {s!r}; write a number with a unit s, ms, us or ns, "
                             "e.g. 5us or 0.5ms")
    value = float(m.group(1)) * _LATENCY_UNITS[m.group(2)]
    if not math.isfinite(value):
        raise CostModelError(f"{flag}: latency {s!r} must be finite")
    return value


def parse_link(text: str, flag: str, default_latency_s: float) -> Link:
    """``RATE[@LATENCY]`` as a :class:`~repro.topology.Link` (latency ``default_latency_s`` when not given)."""
    if not isinstance(text, str) or not text.strip():
        raise CostModelError(f"{flag}: give a link as RATE[@LATENCY], e.g. 25gbit@20us or 10GB/s")
    rate, at, latency = text.partition("@")
    if at and not latency.strip():
        raise CostModelError(f"{flag}: nothing after '@' in {text!r}; write RATE@LATENCY, e.g. 25gbit@20us")
    alpha = parse_latency(latency, flag) if at else default_latency_s
    return Link.from_rate(alpha, parse_rate(rate, flag))


def describe_link(link: Link) -> str:
    """``"25 Gbit/s, 25 us"`` for a person."""
    return f"{8.0 / link.beta_s_per_byte / 1e9:.4g} Gbit/s, {link.alpha_s * 1e6:.4g} us" if link.beta_s_per_byte \
        else f"infinite rate, {link.alpha_s * 1e6:.4g} us"


def default_intra_link() -> Link:
    """The intra-node link fitted on the measured V100 cluster (shipped preset ``10gbe-calibrated``)."""
    from repro.published_fits import calibrated_preset

    return calibrated_preset("10gbe-calibrated").topology.intra


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise CostModelError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def cluster_cost_model(nodes: int, gpus_per_node: int, inter: Link | None, intra: Link | None = None,
                       algorithm: str = "ring", workers: int | None = None) -> CostModel:
    """Every collective's line for ``workers`` (default: every device, ``nodes x gpus_per_node``) on a
    cluster of ``nodes`` nodes of ``gpus_per_node`` devices (module docstring). ``inter`` may be None only
    on one node; ``intra`` None is :func:`default_intra_link`. ``meta["cluster"]`` records the cluster."""
    nodes = _positive_int("--nodes", nodes)
    gpus_per_node = _positive_int("--gpus-per-node", gpus_per_node)
    if algorithm not in CLUSTER_ALGORITHMS:
        raise CostModelError(f"--algorithm: unknown algorithm {algorithm!r}; choose one of "
                             f"{', '.join(CLUSTER_ALGORITHMS)}")
    intra_given = intra is not None
    intra = intra if intra is not None else default_intra_link()
    if inter is None:
        if nodes > 1:
            raise CostModelError(f"--nodes {nodes} needs --inter-link RATE[@LATENCY], the network between nodes")
        inter = intra
    P = nodes * gpus_per_node if workers is None else workers
    if P < 2:
        raise CostModelError(f"{nodes} node(s) x {gpus_per_node} device(s) is {P} worker: nothing to communicate "
                             "(give 2 or more workers)")
    topo = Topology(nodes, gpus_per_node, intra, inter)
    try:
        n, g = topo.placement(P)
    except CostModelError as e:
        raise CostModelError(f"--workers {P}: {e}") from None
    if g == 1:  # one device per node: no intra-node hop to wait for (a ring's step is the network's)
        intra_used = inter
        topo = Topology(nodes, gpus_per_node, inter, inter)
    else:
        intra_used = intra
    if algorithm in TOPOLOGY_ALGORITHMS:
        cm = topo.cost_model(P, algorithm)
        lines = dict(cm.lines)
    else:  # a flat algorithm over the slowest link the job crosses
        alpha = max(intra_used.alpha_s, inter.alpha_s) if n > 1 else intra.alpha_s
        beta = max(intra_used.beta_s_per_byte, inter.beta_s_per_byte) if n > 1 else intra.beta_s_per_byte
        lines = alpha_beta_lines(P, alpha, beta, 0.0, algorithm)
        p2p = inter if n > 1 else intra
        lines["push"] = lines["pull"] = Linear(p2p.alpha_s, p2p.beta_s_per_byte)
    cluster = {"nodes": nodes, "gpus_per_node": gpus_per_node, "nodes_used": n, "workers_per_node": g,
               "algorithm": algorithm, "inter": {"alpha_s": inter.alpha_s, "beta_s_per_byte": inter.beta_s_per_byte},
               "intra": {"alpha_s": intra.alpha_s, "beta_s_per_byte": intra.beta_s_per_byte},
               "intra_default": not intra_given}
    parts = [f"inter {describe_link(inter)}"] if n > 1 else []
    if g > 1:  # with one device per node the intra link carries nothing
        parts.append(f"intra {describe_link(intra)}{' (default: 10gbe-calibrated intra link)' if not intra_given else ''}")
    where = ", ".join(parts)
    return CostModel(P, lines, source=f"cluster {n} node(s) x {g} ({algorithm}; {where})", meta={"cluster": cluster})


# ------------------------------------------------------------------------------------------ top-k
PUBLISHED_TOPK_GAMMA_S = 2.19e-10   # OMGS-SGD (INFOCOM 2020): P102-100, density 0.001 (preset 1gbe-allgather)
_PUBLISHED_TOPK_DEVICE = "P102"
# Device -> (peak memory bandwidth, bytes/s; memory efficiency): the numbers of
# repro.workload.estimate.GPU_SPECS (tests/test_cluster_cost.py checks that they agree).
_MEMORY: dict[str, tuple[float, float]] = {
    "K80": (480e9 / 2, 0.7), "P100": (732e9, 0.85), "V100": (900e9, 0.85), "A100": (2039e9, 0.85),
    "H100": (3.35e12, 0.85), "P102": (440.3e9, 0.85),
}


def _scaled_gamma(device: str) -> float:
    bw, eff = _MEMORY[device]
    ref_bw, ref_eff = _MEMORY[_PUBLISHED_TOPK_DEVICE]
    return PUBLISHED_TOPK_GAMMA_S * (ref_bw * ref_eff) / (bw * eff)


TOPK_DEVICES: dict[str, float] = {name: _scaled_gamma(name) for name in _MEMORY}


def topk_gamma_for_device(device: str, flag: str = "--topk-device") -> tuple[float, str]:
    """(gamma seconds, where it comes from) of top-k selection on ``device`` (case-insensitive; a
    trace's ``"V100 (estimate)"`` reads as V100). One line naming the devices for an unknown one."""
    key = str(device).split("(")[0].strip().upper().replace("P102-100", "P102")
    if key not in TOPK_DEVICES:
        raise CostModelError(f"{flag}: no top-k cost for device {device!r}; known: {', '.join(TOPK_DEVICES)} "
                             "(or give --topk-gamma S)")
    gamma = TOPK_DEVICES[key]
    if key == _PUBLISHED_TOPK_DEVICE:
        return gamma, "top-k gamma 2.19e-10 s: OMGS-SGD's published fit (P102-100, density 0.001)"
    return gamma, (f"top-k gamma {gamma:.3g} s: OMGS-SGD's P102-100 fit scaled to the {key}'s memory bandwidth "
                   "(an estimate)")


def topk_device_of_trace(trace) -> str | None:
    """The GPU of an estimated trace (``extra["gpu"]``) or a measured one on a known device, else None."""
    extra = getattr(trace, "extra", None) or {}
    for name in (extra.get("gpu"), getattr(trace, "device", None)):
        if isinstance(name, str):
            key = name.split("(")[0].strip().upper().replace("P102-100", "P102")
            if key in TOPK_DEVICES:
                return key
    return None


# ------------------------------------------------------------------------------------------ sources
def load_cost(spec: str | Path, workers: int | None, flag: str = "--cost") -> CostModel:
    """A cost model from a preset name or a CostModel JSON file (a file of that name wins). A preset
    needs ``workers``; a file's P must equal ``workers`` when given."""
    text = str(spec)
    path = Path(text)
    if not path.exists() and text in preset_names():
        if workers is None:
            raise CostModelError(f"{flag} {text} (a preset) needs --workers P or --nodes N --gpus-per-node G")
        return preset(text, workers)
    if not path.exists() and not text.endswith(".json") and "/" not in text:
        raise CostModelError(f"{flag}: unknown network preset {text!r} (and no file of that name); known: "
                             f"{', '.join(preset_names())}")
    try:
        cost = read_input("cost model", path, CostModel.load)
    except (InputPathError, CostModelError) as e:
        raise CostModelError(f"{flag}: {e}") from None
    if workers is not None and workers != cost.workers:
        raise CostModelError(f"{flag}: the cost model in {path} is for P={cost.workers}, not the {workers} workers "
                             f"asked for; leave the worker count out or fit a model for P={workers}")
    return cost


# ------------------------------------------------------------------------------------------ fitting
_CSV_COLUMNS = {"bytes": ("bytes", "message_bytes", "size_bytes"), "workers": ("workers", "p"),
                "seconds": ("seconds", "time_s", "seconds_per_collective"), "collective": ("collective",)}


def fit_measurements(rows: list[Mapping[str, Any]], workers: int | None = None, source: str = "fitted") -> CostModel:
    """One line per collective through ``rows`` of ``{"bytes", "workers", "seconds", "collective"}``
    (bytes as the collective's method takes them, :mod:`repro.cost`; seconds per collective), all of one P
    (or the rows of ``workers``). :func:`repro.cost.fit_linear` (relative errors) fits each line;
    ``meta`` keeps the measurements (as ``repro calibrate`` does) and each line's worst relative error."""
    ps = sorted({int(r["workers"]) for r in rows})
    if not ps:
        raise CostModelError("no measurements to fit")
    if workers is None:
        if len(ps) > 1:
            raise CostModelError(f"the measurements are for P = {', '.join(map(str, ps))}; a cost model is for one "
                                 "P: choose one with --workers")
        workers = ps[0]
    chosen = [r for r in rows if int(r["workers"]) == workers]
    if not chosen:
        raise CostModelError(f"no measurements for P={workers} (they are for P = {', '.join(map(str, ps))})")
    lines: dict[str, Linear] = {}
    measurements: dict[str, dict[str, list]] = {}
    worst: dict[str, float] = {}
    for kind in COLLECTIVES:
        mine = [r for r in chosen if r["collective"] == kind]
        if not mine:
            continue
        nbytes = [float(r["bytes"]) for r in mine]
        seconds = [float(r["seconds"]) for r in mine]
        x = [n * workers for n in nbytes] if kind == "sparse_allgather" else nbytes  # its line is on P*n bytes
        try:
            lines[kind] = fit_linear(x, seconds)
        except CostModelError as e:
            raise CostModelError(f"{kind} at P={workers}: {e}") from None
        measurements[kind] = {"bytes": [int(n) for n in nbytes], "seconds": seconds}
        worst[kind] = float(np.max(np.abs(relative_errors(lines[kind], x, seconds))))
    return CostModel(workers, lines, source=source,
                     meta={"measurements": measurements, "max_abs_relative_error": worst})


def fit_measurements_csv(path: str | Path, workers: int | None = None) -> CostModel:
    """:func:`fit_measurements` of a CSV file with a header naming the columns ``bytes`` (message bytes),
    ``workers`` (P), ``seconds`` (one collective's seconds) and ``collective`` (one of
    :data:`repro.cost.COLLECTIVES`); other columns are ignored. Every bad cell is one line naming the file
    and line."""
    p = Path(path)
    if not p.is_file():
        raise CostModelError(f"measurements file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CostModelError(f"{p}: a measurements file is UTF-8 CSV text, but byte {e.start} is not UTF-8") from None
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if not header:
        raise CostModelError(f"{p}: empty; the first line names the columns bytes,workers,seconds,collective")
    names = [h.strip().lower() for h in header]
    index = {}
    for col, aliases in _CSV_COLUMNS.items():
        found = [names.index(a) for a in aliases if a in names]
        if not found:
            raise CostModelError(f"{p}: no column {col!r} in the header ({', '.join(header)}); the columns are "
                                 "bytes,workers,seconds,collective")
        index[col] = found[0]
    rows = []
    for lineno, cells in enumerate(reader, start=2):
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) < len(header):
            raise CostModelError(f"{p}:{lineno}: {len(cells)} cells, the header has {len(header)}")
        raw = {col: cells[i].strip() for col, i in index.items()}
        try:
            nbytes, P, sec = float(raw["bytes"]), float(raw["workers"]), float(raw["seconds"])
        except ValueError:
            raise CostModelError(f"{p}:{lineno}: bytes, workers and seconds must be numbers, got "
                                 f"{raw['bytes']!r}, {raw['workers']!r}, {raw['seconds']!r}") from None
        if not (math.isfinite(nbytes) and nbytes > 0):
            raise CostModelError(f"{p}:{lineno}: bytes must be a positive number, got {raw['bytes']!r}")
        if not (P.is_integer() and P >= 2):
            raise CostModelError(f"{p}:{lineno}: workers must be an integer >= 2, got {raw['workers']!r}")
        if not (math.isfinite(sec) and sec > 0):
            raise CostModelError(f"{p}:{lineno}: seconds must be a positive number, got {raw['seconds']!r}")
        if raw["collective"] not in COLLECTIVES:
            raise CostModelError(f"{p}:{lineno}: unknown collective {raw['collective']!r}; known: "
                                 f"{', '.join(COLLECTIVES)}")
        rows.append({"bytes": nbytes, "workers": int(P), "seconds": sec, "collective": raw["collective"]})
    if not rows:
        raise CostModelError(f"{p}: no measurements after the header")
    try:
        cost = fit_measurements(rows, workers, source=f"fitted to measurements in {p.name}")
    except CostModelError as e:
        raise CostModelError(f"{p}: {e}") from None
    return replace(cost, meta={**cost.meta, "measurements_file": str(p)})
