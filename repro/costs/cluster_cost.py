"""A user's cluster as a cost model (``repro plan/simulate/compare --nodes --gpus-per-node
--inter-link RATE[@LATENCY] [--intra-link ...] [--algorithm A]``; guide: docs/cli.md).

A link is a rate and a per-message latency (``beta_s_per_byte = 8 / bits_per_s``; :func:`parse_rate`,
:func:`parse_latency`). Assumed defaults: inter-node latency :data:`DEFAULT_INTER_LATENCY_S` (25 us),
intra-node :data:`DEFAULT_INTRA_LATENCY_S` (5 us), the intra-node link fitted on the measured V100
cluster (:func:`default_intra_link`), free reductions. Top-k cost: ``--topk-gamma S`` or a device of
:data:`TOPK_DEVICES` (OMGS-SGD's P102-100 fit scaled by memory bandwidth, an estimate).
:func:`fit_measurements_csv` fits measured collectives into a cost file for one P; cluster files
(:class:`ClusterDescription`; docs/cluster.md) serve any P. Re-exports :mod:`repro.costs.cluster_model`.
Torch-free.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from repro.costs.cluster_model import (
    CLUSTER_ALGORITHMS, CLUSTER_SCHEMA, CLUSTER_VERSION, DEFAULT_INTER_LATENCY_S, DEFAULT_INTRA_LATENCY_S,
    ClusterDescription, cluster_cost_model, default_intra_link, describe_link, is_cluster_file, load_cluster,
    parse_latency, parse_link, parse_rate)
from repro.core import ranges
from repro.core.cost import COLLECTIVES, CostModel, CostModelError, Linear, fit_linear, relative_errors
from repro.core.outputs import InputPathError, read_input
from repro.costs.presets import preset, preset_names

__all__ = [
    "CLUSTER_ALGORITHMS", "DEFAULT_INTER_LATENCY_S", "DEFAULT_INTRA_LATENCY_S", "TOPK_DEVICES",
    "PUBLISHED_TOPK_GAMMA_S", "parse_rate", "parse_latency", "parse_link", "default_intra_link",
    "cluster_cost_model", "topk_gamma_for_device", "topk_device_of_trace", "load_cost", "fit_measurements",
    "fit_measurements_csv", "describe_link", "CLUSTER_SCHEMA", "CLUSTER_VERSION", "ClusterDescription",
    "is_cluster_file", "load_cluster",
]

PUBLISHED_TOPK_GAMMA_S = 2.19e-10   # OMGS-SGD (INFOCOM 2020): P102-100, density 0.001 (preset 1gbe-allgather)
_PUBLISHED_TOPK_DEVICE = "P102"
# Device -> (peak memory bandwidth in bytes/s, efficiency), as repro.workload.estimate.GPU_SPECS.
_MEMORY: dict[str, tuple[float, float]] = {
    "K80": (480e9 / 2, 0.7), "P100": (732e9, 0.85), "V100": (900e9, 0.85), "A100": (2039e9, 0.85),
    "H100": (3.35e12, 0.85), "H200": (4.8e12, 0.85), "P102": (440.3e9, 0.85),
}

_REF_BW, _REF_EFF = _MEMORY[_PUBLISHED_TOPK_DEVICE]
TOPK_DEVICES: dict[str, float] = {name: PUBLISHED_TOPK_GAMMA_S * (_REF_BW * _REF_EFF) / (bw * eff)
                                  for name, (bw, eff) in _MEMORY.items()}


def _device_key(device: str) -> str:
    return str(device).split("(")[0].strip().upper().replace("P102-100", "P102")


def topk_gamma_for_device(device: str, flag: str = "--topk-device") -> tuple[float, str]:
    """(gamma seconds, where it comes from) of top-k selection on ``device`` (case-insensitive;
    ``"V100 (estimate)"`` reads as V100); CostModelError for an unknown one."""
    key = _device_key(device)
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
    keys = [_device_key(n) for n in (extra.get("gpu"), getattr(trace, "device", None)) if isinstance(n, str)]
    return next((key for key in keys if key in TOPK_DEVICES), None)


def load_cost(spec: str | Path, workers: int | None, flag: str = "--cost") -> CostModel:
    """A cost model from a preset name or a cluster file (both need ``workers``), or a cost model file
    (whose P must equal ``workers`` when given). A file of that name wins over a preset."""
    text = str(spec)
    path = Path(text)
    if not path.exists() and text in preset_names():
        if workers is None:
            raise CostModelError(f"{flag} {text} (a preset) needs --workers P or --nodes N --gpus-per-node G")
        return preset(text, workers)
    if is_cluster_file(path):
        if workers is None:
            raise CostModelError(f"{flag} {text} (a cluster file, any P) needs --workers P")
        try:
            return load_cluster(path).cost_model(workers)
        except CostModelError as e:
            raise CostModelError(f"{flag}: {e}") from None
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


_CSV_COLUMNS = {"bytes": ("bytes", "message_bytes", "size_bytes"), "workers": ("workers", "p"),
                "seconds": ("seconds", "time_s", "seconds_per_collective"), "collective": ("collective",)}


def fit_measurements(rows: list[Mapping[str, Any]], workers: int | None = None, source: str = "fitted") -> CostModel:
    """One :func:`~repro.core.cost.fit_linear` line per collective through ``rows`` of ``{"bytes",
    "workers", "seconds", "collective"}`` of one P (or of ``workers``); ``meta`` keeps the measurements
    and each line's worst relative error."""
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
        x = [n * workers for n in nbytes] if kind == "sparse_allgather" else nbytes  # line on P*n bytes
        try:
            lines[kind] = fit_linear(x, seconds)
        except CostModelError as e:
            raise CostModelError(f"{kind} at P={workers}: {e}") from None
        measurements[kind] = {"bytes": [int(n) for n in nbytes], "seconds": seconds}
        worst[kind] = float(np.max(np.abs(relative_errors(lines[kind], x, seconds))))
    return CostModel(workers, lines, source=source,
                     meta={"measurements": measurements, "max_abs_relative_error": worst})


def fit_measurements_csv(path: str | Path, workers: int | None = None) -> CostModel:
    """:func:`fit_measurements` of a CSV file with columns ``bytes``, ``workers``, ``seconds`` and
    ``collective`` (others ignored); a bad cell raises CostModelError naming the file and line."""
    p = Path(path)
    if p.is_dir():
        raise CostModelError(f"measurements {p} is a folder, not a measurements file")
    if p.exists() and not p.is_file():
        raise CostModelError(f"measurements {p} is not a regular file (a device, pipe or socket)")
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
        for col, ok, what in (("bytes", math.isfinite(nbytes) and nbytes > 0, "a positive number"),
                              ("workers", P.is_integer() and P >= 2, "an integer >= 2"),
                              ("seconds", math.isfinite(sec) and sec > 0, "a positive number")):
            if not ok:
                raise CostModelError(f"{p}:{lineno}: {col} must be {what}, got {raw[col]!r}")
        for col, q, value, low in (("bytes", ranges.BYTES, nbytes, None), ("workers", ranges.WORKERS, P, 2),
                                   ("seconds", ranges.SECONDS, sec, None)):
            try:
                ranges.check(q, value, col, CostModelError, what="column", low=low)
            except CostModelError as e:
                raise CostModelError(f"{p}:{lineno}: {e}") from None
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
