"""A hierarchical cluster: nodes of several devices, a fast link inside a node, the network between.

A job of P workers fills nodes of ``devices_per_node`` in order. Each :class:`Link` is a per-message
``alpha_s`` and a per-byte ``beta_s_per_byte``. All-reduce of M bytes (:meth:`Topology.cost_model`):

- ``"ring"``: one ring over all P devices, each step as slow as its slowest hop:
  ``2(P-1)·alpha + 2(P-1)/P·M·beta``;
- ``"hierarchical"`` on ``n`` nodes of ``g``: reduce-scatter in each node, ring all-reduce of each
  ``M/g`` shard across nodes, all-gather in each node:
  ``2(g-1)·alpha_i + 2(g-1)/g·M·beta_i + 2(n-1)·alpha_e + 2(n-1)/n·(M/g)·beta_e``.

Reductions cost ``gamma_s_per_byte`` on ``(P-1)/P·M`` bytes. Reduce-scatter and all-gather are the
halves; push/pull are one message over the inter link (the intra link on one node). Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from repro.core.cost import CostModel, CostModelError, Linear

__all__ = ["Link", "Topology", "TOPOLOGY_ALGORITHMS"]

TOPOLOGY_ALGORITHMS = ("ring", "hierarchical")


def _check(name: str, v: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise CostModelError(f"{name} must be a finite non-negative number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha_s`` seconds per message (start-up), ``beta_s_per_byte`` seconds per byte."""

    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha_s", _check("alpha_s", self.alpha_s))
        object.__setattr__(self, "beta_s_per_byte", _check("beta_s_per_byte", self.beta_s_per_byte))

    @classmethod
    def from_rate(cls, alpha_s: float, bits_per_s: float) -> "Link":
        """A link of ``bits_per_s`` (e.g. 10e9 for 10 Gbit/s) with start-up ``alpha_s``."""
        if isinstance(bits_per_s, bool) or not isinstance(bits_per_s, (int, float)) or not bits_per_s > 0 \
                or not math.isfinite(bits_per_s):
            raise CostModelError(f"bits_per_s must be a finite positive number, got {bits_per_s!r}")
        return cls(alpha_s, 8.0 / bits_per_s)


@dataclass(frozen=True)
class Topology:
    """``nodes`` x ``devices_per_node`` devices, an ``intra`` link inside a node and an ``inter`` link
    between nodes."""

    nodes: int
    devices_per_node: int
    intra: Link
    inter: Link
    gamma_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        for name in ("nodes", "devices_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CostModelError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.intra, Link) or not isinstance(self.inter, Link):
            raise CostModelError("intra and inter must be Link objects")
        object.__setattr__(self, "gamma_s_per_byte", _check("gamma_s_per_byte", self.gamma_s_per_byte))

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def placement(self, workers: int) -> tuple[int, int]:
        """(nodes used, workers per node) of a job of ``workers``, filling nodes in order; a job that
        does not fill whole nodes raises CostModelError."""
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
            raise CostModelError(f"number of workers must be an integer >= 2, got {workers!r}")
        if workers > self.devices:
            raise CostModelError(f"{workers} workers do not fit {self.nodes} nodes x {self.devices_per_node} devices")
        g = min(workers, self.devices_per_node)
        n = math.ceil(workers / g)
        if n * g != workers:
            raise CostModelError(f"{workers} workers do not fill whole nodes of {self.devices_per_node} devices")
        return n, g

    def allreduce_line(self, workers: int, algorithm: str = "ring") -> Linear:
        """Seconds of an all-reduce of M bytes among ``workers``: ``a + b·M`` (module docstring)."""
        halves = self._halves(workers, algorithm)
        return Linear(2 * halves.a_s, 2 * halves.b_s_per_byte + self._gamma(workers))

    def _gamma(self, workers: int) -> float:
        return (workers - 1) / workers * self.gamma_s_per_byte

    def _halves(self, workers: int, algorithm: str) -> Linear:
        """A reduce-scatter's (= an all-gather's) line without the reduction."""
        if algorithm not in TOPOLOGY_ALGORITHMS:
            raise CostModelError(f"unknown algorithm '{algorithm}'; choose one of {', '.join(TOPOLOGY_ALGORITHMS)}")
        n, g = self.placement(workers)
        P = workers
        if n == 1:
            return Linear((P - 1) * self.intra.alpha_s, (P - 1) / P * self.intra.beta_s_per_byte)
        if algorithm == "ring":  # every step waits for its slowest hop, intra or inter
            alpha = max(self.intra.alpha_s, self.inter.alpha_s)
            beta = max(self.intra.beta_s_per_byte, self.inter.beta_s_per_byte)
            return Linear((P - 1) * alpha, (P - 1) / P * beta)
        a = (g - 1) * self.intra.alpha_s + (n - 1) * self.inter.alpha_s
        b = (g - 1) / g * self.intra.beta_s_per_byte + (n - 1) / (n * g) * self.inter.beta_s_per_byte
        return Linear(a, b)

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "devices_per_node": self.devices_per_node, "intra": asdict(self.intra),
                "inter": asdict(self.inter), "gamma_s_per_byte": self.gamma_s_per_byte}

    def cost_model(self, workers: int, algorithm: str = "ring") -> CostModel:
        """Every collective's line for ``workers`` on this cluster (the topology is kept in ``meta``)."""
        half = self._halves(workers, algorithm)
        gamma = self._gamma(workers)
        n, g = self.placement(workers)
        p2p = self.intra if n == 1 else self.inter
        lines = {"allreduce": Linear(2 * half.a_s, 2 * half.b_s_per_byte + gamma),
                 "reduce_scatter": Linear(half.a_s, half.b_s_per_byte + gamma),
                 "allgather": half, "sparse_allgather": half,
                 "push": Linear(p2p.alpha_s, p2p.beta_s_per_byte), "pull": Linear(p2p.alpha_s, p2p.beta_s_per_byte)}
        meta = {"topology": self.to_dict(), "algorithm": algorithm, "nodes_used": n, "workers_per_node": g}
        return CostModel(workers, lines, source=f"hierarchical cluster {self.nodes}x{self.devices_per_node} "
                         f"({algorithm}, {n} node(s) x {g})", meta=meta)
