"""Named cost models: the papers' published fits and the shipped calibrated clusters.

``preset(name, P)`` returns a preset's :class:`~repro.core.cost.CostModel` for P workers: a table of
fitted lines per P, per-hop constants valid for any P (each citing its source), or a calibrated
cluster (:mod:`repro.costs.calibrated`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from repro.costs.calibrated import calibrated_presets
from repro.costs.cluster_model import is_cluster_file as _is_cluster_file, load_cluster
from repro.core.cost import CostModel, CostModelError, Linear, check_workers

__all__ = ["preset", "PRESETS", "preset_names", "preset_workers", "is_calibrated_preset", "is_cost_file",
           "is_cluster_file"]


@dataclass(frozen=True)
class _TablePreset:
    collective: str
    table: Mapping[int, tuple[float, float]]
    doc: str
    topk_gamma_s: float | None = None
    # Also reduce-scatter and all-gather lines, each half the all-reduce's (a ring all-reduce is one of each)
    ring_halves: bool = False


@dataclass(frozen=True)
class _HopPreset:
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float
    algorithm: str
    doc: str


_V100_INTRA = {2: (2.555e-6, 9.838e-11), 4: (4.204e-5, 2.059e-10)}

# Per-hop constants derived from the P=16 and P=64 fits by inverting the ring formulas
# (a = 2(P-1) alpha, b = 2(P-1)/P beta): our interpretation, labelled "derived".
_IB16_A, _IB16_B = 2.358e-4, 4.059e-10
_E16_A, _E16_B = 9.081e-4, 7.396e-10
_D64E_A, _D64E_B = 7.04e-3, 9.64e-10
_D64I_A, _D64I_B = 8.06e-4, 5.89e-10

PRESETS: dict[str, _TablePreset | _HopPreset] = {
    "10gbe-v100": _TablePreset("allreduce", {**_V100_INTRA, 8: (5.230e-4, 8.571e-10), 16: (9.081e-4, 7.396e-10)},
                               "MG-WFBP (TPDS 2021) PyTorch version: fitted NCCL all-reduce, 4 nodes x 4 V100, 10GbE"),
    "56gbib-v100": _TablePreset("allreduce", {**_V100_INTRA, 8: (9.754e-5, 3.057e-10), 16: (2.358e-4, 4.059e-10)},
                                "MG-WFBP (TPDS 2021) PyTorch version: fitted NCCL all-reduce, 4 nodes x 4 V100, 56Gb InfiniBand"),
    "10gbe-dear64": _TablePreset("allreduce", {64: (7.04e-3, 9.64e-10)},
                                 "All-reduce fit for 64 workers on 10GbE used by the DeAR authors; "
                                 "reduce-scatter and all-gather each half of it (ring)", ring_halves=True),
    "56gbib-dear64": _TablePreset("allreduce", {64: (8.06e-4, 5.89e-10)},
                                  "All-reduce fit for 64 workers on InfiniBand used by the DeAR authors (their "
                                  "constants are labelled 56Gb IB; the DeAR paper's testbed is 100Gb IB); "
                                  "reduce-scatter and all-gather each half of it (ring)", ring_halves=True),
    "1gbe-allgather": _TablePreset("sparse_allgather", {2: (1.6e-3, 1.0e-8), 4: (2.7e-3, 1.3e-8),
                                                        8: (4.0e-3, 1.5e-8), 16: (1.1e-2, 1.7e-8)},
                                   "OMGS-SGD (INFOCOM 2020): fitted all-gather, P102-100 GPUs, 1GbE; with the "
                                   "published top-k fit gamma = 2.19e-10 s (P102-100, density 0.001)",
                                   topk_gamma_s=2.19e-10),
    "10gbe-k80": _HopPreset(45.25e-6, 1.2 / (9e9 / 8), 160 / 64e9, "ring",
                            "MG-WFBP (INFOCOM 2019) simulator: alpha 45.25 us/hop, 9 Gbit/s (beta = 1.2/B), "
                            "gamma = 160/64e9 s/byte, ring all-reduce"),
    "56gbib-derived": _HopPreset(_IB16_A / 30, _IB16_B * 16 / 30, 0.0, "ring",
                                 "ring alpha/beta derived from the MG-WFBP 56Gb IB fit at P=16 (our interpretation)"),
    "10gbe-derived": _HopPreset(_E16_A / 30, _E16_B * 16 / 30, 0.0, "ring",
                                "ring alpha/beta derived from the MG-WFBP 10GbE fit at P=16 (our interpretation)"),
    "10gbe-dear-derived": _HopPreset(_D64E_A / 126, _D64E_B * 64 / 126, 0.0, "ring",
                                     "ring alpha/beta derived from the DeAR authors' 10GbE fit at P=64 (our "
                                     "interpretation; any P, reduce-scatter and all-gather are the ring halves)"),
    "56gbib-dear-derived": _HopPreset(_D64I_A / 126, _D64I_B * 64 / 126, 0.0, "ring",
                                      "ring alpha/beta derived from the DeAR authors' InfiniBand fit at P=64 (our "
                                      "interpretation; their constants say 56Gb IB, the paper's testbed 100Gb IB)"),
}


def preset_names() -> list[str]:
    """Published presets and the shipped calibrated ones (``*-calibrated``)."""
    return sorted(PRESETS) + sorted(calibrated_presets())


def is_cost_file(name: str) -> bool:
    """True for an existing ``.json`` path that is not a preset's name (a cost model or cluster file)."""
    return isinstance(name, str) and name.endswith(".json") and name not in PRESETS and Path(name).is_file()


def is_cluster_file(name: str) -> bool:
    """True for a cost file that describes a cluster (``repro cost cluster``; any P)."""
    return is_cost_file(name) and _is_cluster_file(name)


def is_calibrated_preset(name: str) -> bool:
    """True for a shipped calibrated preset (``*-calibrated``)."""
    return name not in PRESETS and name in calibrated_presets()


def preset_workers(name: str) -> list[int] | None:
    """Worker counts a table preset or a one-P cost file holds, or None for one valid for any P."""
    if is_cost_file(name):
        return None if is_cluster_file(name) else [CostModel.load(name).workers]
    if is_calibrated_preset(name):
        return None
    p = _get_preset(name)
    return sorted(p.table) if isinstance(p, _TablePreset) else None


def preset(name: str, workers: int) -> CostModel:
    """The cost model ``name`` for ``workers`` workers: a published preset, a calibrated preset
    (``*-calibrated``), a cost file (``.json`` of one P, which must be ``workers``) or a cluster file
    (``repro cost cluster``, any P). Unknown names and worker counts raise :class:`CostModelError`."""
    if is_cluster_file(name):
        try:
            return load_cluster(name).cost_model(workers)
        except CostModelError as e:
            msg = str(e)
            raise CostModelError(msg if msg.startswith(name) else f"cluster file {name}: {msg}") from None
    if is_cost_file(name):
        cost = CostModel.load(name)
        if cost.workers != workers:
            raise CostModelError(f"cost file {name} is for P={cost.workers} workers, asked for P={workers} (a "
                                 f"cluster file of `repro cost cluster` serves any P)")
        return cost
    if is_calibrated_preset(name):
        check_workers(workers)
        return calibrated_presets()[name].cost_model(workers)
    p = _get_preset(name)
    check_workers(workers)
    if isinstance(p, _HopPreset):
        return CostModel.from_alpha_beta(workers, p.alpha_s, p.beta_s_per_byte, p.gamma_s_per_byte,
                                         p.algorithm, source=f"preset {name}")
    if workers not in p.table:
        have = ", ".join(str(k) for k in sorted(p.table))
        anyp = ", ".join(k for k, v in PRESETS.items() if isinstance(v, _HopPreset))
        raise CostModelError(
            f"preset '{name}' has no fit for P={workers} (it has P = {have}); fit one from measured "
            f"times with CostModel.fit / `--alpha-s A --beta-s-per-byte B`, or use a per-hop preset "
            f"valid for any P ({anyp})")
    a, b = p.table[workers]
    lines = {p.collective: Linear(a, b)}
    if p.ring_halves:
        lines["reduce_scatter"] = lines["allgather"] = Linear(a / 2, b / 2)
    return CostModel(workers, lines, source=f"preset {name}", meta={"doc": p.doc}, topk_gamma_s=p.topk_gamma_s)


def _get_preset(name: str):
    try:
        return PRESETS[name]
    except KeyError:
        raise CostModelError(f"unknown network preset '{name}'; known: {', '.join(preset_names())}") from None
