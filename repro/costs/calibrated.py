"""The shipped calibrated clusters (``*-calibrated`` presets): what a calibration *is*, and reading them.

A calibration of one network is a hierarchical cluster (:class:`~repro.core.topology.Topology`: an intra-
and an inter-node link and the all-reduce across them) plus the effects beyond the papers' model
(:class:`~repro.core.realism.Realism`). This module holds the value type and the shipped files
(``data/calibration/*-calibrated.json``); fitting them on published measurements is
:mod:`repro.costs.published_fits`'s job, which sits above the planners and the simulator, while this module
sits below them, so that :mod:`repro.costs.presets` can serve calibrated presets without an import circle.
Never imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from repro.core.cost import CostModel, CostModelError
from repro.core.outputs import write_output
from repro.core.paths import shipped_path
from repro.core.realism import Realism
from repro.core.topology import TOPOLOGY_ALGORITHMS, Link, Topology
from repro.core.trace import Trace

__all__ = ["Calibration", "CalibrationError", "SHIPPED_DIR", "calibrated_presets", "calibrated_preset",
           "calibrated_cost"]

SHIPPED_DIR = shipped_path("calibration")


class CalibrationError(ValueError):
    """Bad calibration input (unknown network, empty rows, a malformed saved calibration)."""


@dataclass(frozen=True)
class Calibration:
    """A calibrated network: cluster shape and links, the all-reduce across them, and realism
    (``compute_scale`` 1: it is set per model from a measured single device)."""

    name: str
    network: str
    topology: Topology
    algorithm: str
    realism: Realism
    source: str = ""
    fit: Mapping[str, Any] | None = None   # fit diagnostics: rows, rms log error, parameters fitted

    def __post_init__(self) -> None:
        if self.algorithm not in TOPOLOGY_ALGORITHMS:
            raise CalibrationError(f"unknown algorithm '{self.algorithm}'; choose one of {', '.join(TOPOLOGY_ALGORITHMS)}")

    def cost_model(self, workers: int, realism: Realism | None = None) -> CostModel:
        """Every collective's line for ``workers`` on this cluster, carrying the realism (or ``realism``,
        e.g. with a model's ``compute_scale``). Beyond the measured cluster's size, nodes of the same
        kind are added (whole nodes: above one node, ``workers`` must be a multiple of the node size)."""
        topo = self.topology
        if isinstance(workers, int) and not isinstance(workers, bool) and workers > topo.devices:
            # The same nodes and links, as many nodes as the job needs.
            topo = replace(topo, nodes=-(-workers // topo.devices_per_node))
        cm = topo.cost_model(workers, self.algorithm)
        return replace(cm.with_realism(realism or self.realism), source=f"calibrated {self.name}: {cm.source}")

    def for_trace(self, trace: Trace, measured_single_s: float | None) -> Realism:
        """This calibration's realism with computation scaled to a measured single-device iteration
        of ``trace`` (``None``: the trace's own computation)."""
        if measured_single_s is None:
            return self.realism
        return self.realism.scaled_to_measured(trace, measured_single_s)

    def params(self) -> dict[str, float]:
        t = self.topology
        return {"intra_alpha_s": t.intra.alpha_s, "intra_beta_s_per_byte": t.intra.beta_s_per_byte,
                "inter_alpha_s": t.inter.alpha_s, "inter_beta_s_per_byte": t.inter.beta_s_per_byte,
                "message_overhead_s": self.realism.message_overhead_s, "contention": self.realism.contention}

    def to_dict(self) -> dict[str, Any]:
        t = self.topology
        return {"name": self.name, "network": self.network, "algorithm": self.algorithm, "source": self.source,
                "topology": {"nodes": t.nodes, "devices_per_node": t.devices_per_node,
                             "intra": {"alpha_s": t.intra.alpha_s, "beta_s_per_byte": t.intra.beta_s_per_byte},
                             "inter": {"alpha_s": t.inter.alpha_s, "beta_s_per_byte": t.inter.beta_s_per_byte},
                             "gamma_s_per_byte": t.gamma_s_per_byte},
                "realism": self.realism.to_dict(), "fit": dict(self.fit or {})}

    @classmethod
    def from_dict(cls, d: Any) -> "Calibration":
        try:
            t = d["topology"]
            topo = Topology(int(t["nodes"]), int(t["devices_per_node"]), Link(**t["intra"]), Link(**t["inter"]),
                            float(t.get("gamma_s_per_byte", 0.0)))
            return cls(str(d["name"]), str(d["network"]), topo, str(d["algorithm"]),
                       Realism.from_dict(d["realism"]), str(d.get("source", "")), dict(d.get("fit") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise CalibrationError(f"malformed calibration: {e}") from None

    def save(self, path: str | Path) -> None:
        write_output(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        p = Path(path)
        if not p.is_file():
            raise CalibrationError(f"calibration file not found: {p}")
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (json.JSONDecodeError, CalibrationError) as e:
            raise CalibrationError(f"{p}: {e}") from None


def calibrated_presets() -> dict[str, Calibration]:
    """The shipped calibrations (``data/calibration/*.json``), by name."""
    return dict(_load_shipped())


@lru_cache(maxsize=1)
def _load_shipped() -> tuple[tuple[str, Calibration], ...]:
    out = []
    for p in sorted(SHIPPED_DIR.glob("*-calibrated.json")):
        cal = Calibration.load(p)
        out.append((cal.name, cal))
    return tuple(out)


def calibrated_preset(name: str) -> Calibration:
    """A shipped calibration by name (e.g. ``"10gbe-calibrated"``) or by network (``"10gbe"``)."""
    presets = calibrated_presets()
    for cal in presets.values():
        if name in (cal.name, cal.network):
            return cal
    raise CostModelError(f"unknown calibrated preset '{name}'; known: {', '.join(presets) or 'none shipped'}")


def calibrated_cost(name: str, workers: int, trace: Trace | None = None,
                    measured_single_s: float | None = None) -> CostModel:
    """The cost model of shipped calibration ``name`` for ``workers``; with ``trace`` and
    ``measured_single_s`` its computation is scaled to that measured single-device iteration."""
    cal = calibrated_preset(name)
    realism = cal.for_trace(trace, measured_single_s) if trace is not None else cal.realism
    return cal.cost_model(workers, realism)
