"""A cluster as data, for any P: rate and latency parsing, :func:`cluster_cost_model` and cluster
files (:class:`ClusterDescription`, ``repro cost cluster``). Below :mod:`repro.costs.presets` so that
presets can build a cluster file's model; :mod:`repro.costs.cluster_cost` re-exports every name.
Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from repro.core import ranges
from repro.core.cost import ALGORITHMS, CostModel, CostModelError, Linear, alpha_beta_lines, check_workers
from repro.core.outputs import InputPathError, read_input
from repro.core.topology import TOPOLOGY_ALGORITHMS, Link, Topology

__all__ = ["CLUSTER_ALGORITHMS", "DEFAULT_INTER_LATENCY_S", "DEFAULT_INTRA_LATENCY_S", "parse_rate", "parse_latency",
           "parse_link", "describe_link", "default_intra_link", "cluster_cost_model", "CLUSTER_SCHEMA",
           "CLUSTER_VERSION", "ClusterDescription", "is_cluster_file", "load_cluster"]

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
    ``500MB/s``, ``1GiB/s`` (x 8). One-line :class:`~repro.core.cost.CostModelError` naming ``flag`` otherwise."""
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
    if not ranges.BITS_PER_S.contains(bps):
        raise CostModelError(f"{flag}: rate {s!r} ({bps:.3g} bit/s) is outside the plausible range "
                             f"{ranges.BITS_PER_S.range_text()}")
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
    if not ranges.LATENCY_S.contains(value):
        raise CostModelError(f"{flag}: latency {s!r} is outside the plausible range {ranges.LATENCY_S.range_text()}")
    return value


def parse_link(text: str, flag: str, default_latency_s: float) -> Link:
    """``RATE[@LATENCY]`` as a :class:`~repro.core.topology.Link` (latency ``default_latency_s`` when not given)."""
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
    from repro.costs.calibrated import calibrated_preset

    return calibrated_preset("10gbe-calibrated").topology.intra


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise CostModelError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def cluster_cost_model(nodes: int, gpus_per_node: int, inter: Link | None, intra: Link | None = None,
                       algorithm: str = "ring", workers: int | None = None) -> CostModel:
    """Every collective's line for ``workers`` (default: every device) on ``nodes`` x ``gpus_per_node``
    devices: :class:`~repro.core.topology.Topology` for ``ring``/``hierarchical``, else the flat
    algorithm over the slowest link crossed. ``inter`` may be None only on one node; ``intra`` None is
    :func:`default_intra_link`. ``meta["cluster"]`` records the cluster."""
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
    intra_used = inter if g == 1 else intra  # one device per node: no intra-node hop
    if algorithm in TOPOLOGY_ALGORITHMS:
        lines = dict(Topology(nodes, gpus_per_node, intra_used, inter).cost_model(P, algorithm).lines)
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


CLUSTER_SCHEMA = "repro.launch"
CLUSTER_VERSION = 1
_CLUSTER_KEYS = ("schema", "version", "name", "gpus_per_node", "inter_link", "intra_link", "algorithm",
                 "topk_gamma_s", "topk_source")


@dataclass(frozen=True)
class ClusterDescription:
    """A cluster as a cluster file holds it: a cost model for any P."""

    gpus_per_node: int
    inter: Link
    intra: Link | None = None          # None: default_intra_link() (the measured V100 cluster's)
    algorithm: str = "ring"
    topk_gamma_s: float | None = None
    topk_source: str | None = None
    name: str = ""

    def __post_init__(self) -> None:
        _positive_int("gpus_per_node", self.gpus_per_node)
        if self.algorithm not in CLUSTER_ALGORITHMS:
            raise CostModelError(f"algorithm {self.algorithm!r} unknown; choose one of {', '.join(CLUSTER_ALGORITHMS)}")
        g = self.topk_gamma_s
        if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < math.inf):
            raise CostModelError(f"topk_gamma_s must be a finite non-negative number of seconds, got {g!r}")

    def cost_model(self, workers: int) -> CostModel:
        """The cost model for ``workers`` on ``ceil(workers / gpus_per_node)`` nodes, with the top-k cost."""
        check_workers(workers)
        nodes = math.ceil(int(workers) / self.gpus_per_node)
        if workers > self.gpus_per_node and workers % self.gpus_per_node:
            raise CostModelError(f"P={workers} does not fill whole nodes of {self.gpus_per_node} GPUs (uneven nodes "
                                 "are not modelled)")
        cost = cluster_cost_model(nodes, self.gpus_per_node, self.inter, self.intra, self.algorithm, int(workers))
        meta = {**cost.meta, "cluster_file": self.name or True}
        if self.topk_gamma_s is not None:
            cost = cost.with_topk(float(self.topk_gamma_s))
            meta["topk_source"] = self.topk_source or f"top-k gamma {self.topk_gamma_s:g} s (cluster file)"
        return replace(cost, meta=meta)

    def to_dict(self) -> dict[str, Any]:
        def link(x: Link | None):
            return None if x is None else {"rate_bits_per_s": 8.0 / x.beta_s_per_byte if x.beta_s_per_byte
                                           else math.inf, "latency_s": x.alpha_s}

        return {"schema": CLUSTER_SCHEMA, "version": CLUSTER_VERSION, "name": self.name,
                "gpus_per_node": self.gpus_per_node, "inter_link": link(self.inter), "intra_link": link(self.intra),
                "algorithm": self.algorithm, "topk_gamma_s": self.topk_gamma_s, "topk_source": self.topk_source}

    @classmethod
    def from_dict(cls, data: Any, where: str = "cluster file") -> "ClusterDescription":
        """A description from a cluster file's JSON; CostModelError naming ``where``."""
        def fail(msg: str) -> CostModelError:
            return CostModelError(f"{where}: {msg}")

        if not isinstance(data, dict):
            raise fail("a cluster file is a JSON object (schema, version, gpus_per_node, inter_link, ...)")
        if data.get("schema") != CLUSTER_SCHEMA:
            raise fail(f"schema must be {CLUSTER_SCHEMA!r} (a cluster file of `repro cost cluster`), "
                       f"got {data.get('schema')!r}")
        if data.get("version") != CLUSTER_VERSION:
            raise fail(f"version {data.get('version')!r} is not supported (this repro reads version "
                       f"{CLUSTER_VERSION})")
        unknown = sorted(set(data) - set(_CLUSTER_KEYS))
        if unknown:
            raise fail(f"unknown key(s) {', '.join(unknown)}; a cluster file has {', '.join(_CLUSTER_KEYS)}")

        def link(key: str, default_latency_s: float) -> Link | None:
            v = data.get(key)
            if v is None:
                return None
            if isinstance(v, str):
                return parse_link(v, key, default_latency_s)
            if not isinstance(v, dict) or set(v) - {"rate_bits_per_s", "latency_s"}:
                raise CostModelError(f"{key} must be {{\"rate_bits_per_s\": R, \"latency_s\": L}} or a string "
                                     f"such as \"25gbit@20us\", got {v!r}")
            rate, lat = v.get("rate_bits_per_s"), v.get("latency_s", default_latency_s)
            ranges.check(ranges.BITS_PER_S, rate, f"{key}.rate_bits_per_s", CostModelError)
            ranges.check(ranges.LATENCY_S, lat, f"{key}.latency_s", CostModelError)
            return Link.from_rate(float(lat), float(rate))

        try:
            inter = link("inter_link", DEFAULT_INTER_LATENCY_S)
            if inter is None:
                raise CostModelError("inter_link is missing: the network between nodes (e.g. \"25gbit@20us\")")
            name = data.get("name") or ""
            if not isinstance(name, str):
                raise CostModelError(f"name must be a string, got {name!r}")
            source = data.get("topk_source")
            ranges.check(ranges.WORKERS, data.get("gpus_per_node"), "gpus_per_node", CostModelError)
            if data.get("topk_gamma_s") is not None:
                ranges.check(ranges.TOPK_GAMMA_S, data["topk_gamma_s"], "topk_gamma_s", CostModelError)
            return cls(gpus_per_node=data.get("gpus_per_node"), inter=inter,
                       intra=link("intra_link", DEFAULT_INTRA_LATENCY_S), algorithm=data.get("algorithm", "ring"),
                       topk_gamma_s=data.get("topk_gamma_s"), topk_source=str(source) if source else None,
                       name=name)
        except CostModelError as e:
            raise fail(str(e)) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def is_cluster_file(path: str | Path) -> bool:
    """True for a ``.json`` file whose object says ``"schema": "repro.launch"`` (read, not checked)."""
    p = Path(str(path))
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        data = _read_json(p)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("schema") == CLUSTER_SCHEMA


def load_cluster(path: str | Path) -> ClusterDescription:
    """A cluster file (see :class:`ClusterDescription`); every error one line naming the file."""
    p = Path(str(path))

    def load(q: Path) -> ClusterDescription:
        try:
            data = _read_json(q)
        except FileNotFoundError:
            raise CostModelError(f"cluster file {q} does not exist") from None
        except json.JSONDecodeError as e:
            raise CostModelError(f"{q}: not JSON ({e.msg} at line {e.lineno})") from None
        return ClusterDescription.from_dict(data, str(q))

    try:
        return read_input("cluster file", p, load)
    except InputPathError as e:
        raise CostModelError(str(e)) from None

