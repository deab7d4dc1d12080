"""The shipped calibrated clusters (``*-calibrated`` presets): the value type and reading them.

A calibration of one network is a :class:`~repro.core.topology.Topology` plus a
:class:`~repro.core.realism.Realism`. Fitting them to published measurements is
:mod:`repro.costs.published_fits`; this module sits below the planners so that
:mod:`repro.costs.presets` can serve them without an import circle. Torch-free.
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

__all__ = ["Calibration", "CalibrationError", "SHIPPED_DIR", "calibrated_presets", "calibrated_preset"]

SHIPPED_DIR = shipped_path("calibration")


class CalibrationError(ValueError):
    """Bad calibration input (unknown network, empty rows, a malformed saved calibration)."""


@dataclass(frozen=True)
class Calibration:
    """A calibrated network: cluster shape and links, the all-reduce algorithm, and realism
    (``compute_scale`` 1: set per model from a measured single device)."""

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
        """Every collective's line for ``workers`` on this cluster, carrying ``realism`` (default: its
        own). Beyond the measured cluster's size, whole nodes of the same kind are added."""
        topo = self.topology
        if isinstance(workers, int) and not isinstance(workers, bool) and workers > topo.devices:
            topo = replace(topo, nodes=-(-workers // topo.devices_per_node))
        cm = topo.cost_model(workers, self.algorithm)
        return replace(cm.with_realism(realism or self.realism), source=f"calibrated {self.name}: {cm.source}")

    def for_trace(self, trace: Trace, measured_single_s: float | None) -> Realism:
        """Its realism scaled to a measured single-device iteration of ``trace`` (None: unscaled)."""
        if measured_single_s is None:
            return self.realism
        return self.realism.scaled_to_measured(trace, measured_single_s)

    def params(self) -> dict[str, float]:
        t = self.topology
        return {"intra_alpha_s": t.intra.alpha_s, "intra_beta_s_per_byte": t.intra.beta_s_per_byte,
                "inter_alpha_s": t.inter.alpha_s, "inter_beta_s_per_byte": t.inter.beta_s_per_byte,
                "message_overhead_s": self.realism.message_overhead_s, "contention": self.realism.contention}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "network": self.network, "algorithm": self.algorithm, "source": self.source,
                "topology": self.topology.to_dict(), "realism": self.realism.to_dict(),
                "fit": dict(self.fit or {})}

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
    """The shipped calibrations (``data/calibration/*-calibrated.json``), by name."""
    return dict(_load_shipped())


@lru_cache(maxsize=1)
def _load_shipped() -> tuple[tuple[str, Calibration], ...]:
    cals = [Calibration.load(p) for p in sorted(SHIPPED_DIR.glob("*-calibrated.json"))]
    return tuple((cal.name, cal) for cal in cals)


def calibrated_preset(name: str) -> Calibration:
    """A shipped calibration by name (e.g. ``"10gbe-calibrated"``) or by network (``"10gbe"``)."""
    presets = calibrated_presets()
    for cal in presets.values():
        if name in (cal.name, cal.network):
            return cal
    raise CostModelError(f"unknown calibrated preset '{name}'; known: {', '.join(presets) or 'none shipped'}")


