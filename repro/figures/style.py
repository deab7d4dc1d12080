"""One plotting style for every figure of the project, and fixed colours/names per scheduler.

Call :func:`use_style` once at the top of a notebook. Colours come from seaborn's colour-blind-safe
``"colorblind"`` palette (hard-coded here so they never depend on seaborn's defaults), and each
scheduler keeps the same colour and display name in every figure::

    ax.plot(p, speedup, color=scheduler_color("mgwfbp"), label=scheduler_label("mgwfbp"))

Unknown names get a deterministic colour (a hash into the palette) and are displayed as given.
"""

from __future__ import annotations

import zlib
from typing import Any

__all__ = [
    "PALETTE",
    "SCHEDULER_COLORS",
    "SCHEDULER_LABELS",
    "KIND_COLORS",
    "use_style",
    "canonical_scheduler",
    "scheduler_color",
    "scheduler_label",
    "scheduler_style",
    "kind_color",
]

# seaborn.color_palette("colorblind") (Okabe-Ito based), fixed here.
PALETTE: tuple[str, ...] = (
    "#0173b2",  # 0 blue
    "#de8f05",  # 1 orange
    "#029e73",  # 2 green
    "#d55e00",  # 3 vermillion
    "#cc78bc",  # 4 purple
    "#ca9161",  # 5 brown
    "#fbafe4",  # 6 pink
    "#949494",  # 7 grey
    "#ece133",  # 8 yellow
    "#56b4e9",  # 9 sky blue
)

SCHEDULER_COLORS: dict[str, str] = {
    # MG-WFBP
    "wfbp": PALETTE[0],
    "syncea": PALETTE[1],
    "threshold": PALETTE[4],
    "mgwfbp": PALETTE[3],
    "optimal": "#000000",
    "linear": PALETTE[7],
    "paper": "#4d4d4d",
    # DeAR
    "ddp": PALETTE[5],
    "horovod": PALETTE[9],
    "bytescheduler": PALETTE[6],
    "dear": PALETTE[2],
    # OMGS-SGD
    "ssgd": PALETTE[0],
    "topk": PALETTE[1],
    "omgs": PALETTE[2],
    # OSP
    "bsp": PALETTE[0],
    "asp": PALETTE[1],
    "ssp": PALETTE[4],
    "osp": PALETTE[2],
    "osp_nolgp": PALETTE[9],
}

SCHEDULER_LABELS: dict[str, str] = {
    "wfbp": "WFBP",
    "syncea": "SyncEASGD",
    "threshold": "Fixed threshold",
    "mgwfbp": "MG-WFBP",
    "optimal": "Optimal (exact DP)",
    "linear": "Linear",
    "paper": "Paper (published)",
    "ddp": "PyTorch DDP",
    "horovod": "Horovod (fusion)",
    "bytescheduler": "ByteScheduler",
    "dear": "DeAR",
    "ssgd": "S-SGD (dense)",
    "topk": "TopK-SGD",
    "omgs": "OMGS-SGD",
    "bsp": "BSP",
    "asp": "ASP",
    "ssp": "SSP",
    "osp": "OSP",
    "osp_nolgp": "OSP w/o LGP",
}

# Reference curves are drawn differently from methods.
_LINESTYLES: dict[str, str] = {"linear": "--", "optimal": ":", "paper": ""}
_MARKERS: dict[str, str] = {"paper": "D", "optimal": "", "linear": ""}

_ALIASES: dict[str, str] = {
    "syncea_sgd": "syncea",
    "synceasgd": "syncea",
    "mg_wfbp": "mgwfbp",
    "optimum": "optimal",
    "exact": "optimal",
    "exact_dp": "optimal",
    "published": "paper",
    "ideal": "linear",
    "s_sgd": "ssgd",
    "dense": "ssgd",
    "topk_sgd": "topk",
    "omgs_sgd": "omgs",
    "osp_no_lgp": "osp_nolgp",
    "osp_without_lgp": "osp_nolgp",
}

# Gantt-chart colours per operation kind.
KIND_COLORS: dict[str, str] = {
    "forward": PALETTE[9],
    "backward": PALETTE[0],
    "allreduce": PALETTE[3],
    "reduce_scatter": PALETTE[1],
    "allgather": PALETTE[2],
    "sparsify": PALETTE[4],
    "update": PALETTE[5],
    "push": PALETTE[3],
    "pull": PALETTE[2],
    "comm": PALETTE[3],
    "wait": "#d9d9d9",
    "idle": "#d9d9d9",
}


def _hashed_color(name: str) -> str:
    return PALETTE[zlib.crc32(name.encode("utf-8")) % len(PALETTE)]


def canonical_scheduler(name: str) -> str:
    """Lower-case key of a scheduler name: ``"MG-WFBP"`` -> ``"mgwfbp"``, ``"SyncEA-SGD"`` -> ``"syncea"``."""
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    if key in SCHEDULER_COLORS:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    squashed = key.replace("_", "")
    for k in SCHEDULER_COLORS:
        if k.replace("_", "") == squashed:
            return k
    return _ALIASES.get(squashed, key)


def scheduler_color(name: str) -> str:
    """Fixed colour (hex) of a scheduler; deterministic fallback for unknown names."""
    key = canonical_scheduler(name)
    return SCHEDULER_COLORS.get(key) or _hashed_color(key)


def scheduler_label(name: str) -> str:
    """Display name of a scheduler (``"mgwfbp"`` -> ``"MG-WFBP"``); unknown names are returned as given."""
    return SCHEDULER_LABELS.get(canonical_scheduler(name), str(name))


def scheduler_style(name: str) -> dict[str, Any]:
    """Keyword arguments for ``ax.plot``: color, label, linestyle, marker."""
    key = canonical_scheduler(name)
    return {
        "color": scheduler_color(key),
        "label": scheduler_label(name),
        "linestyle": _LINESTYLES.get(key, "-"),
        "marker": _MARKERS.get(key, "o"),
    }


def kind_color(kind: str) -> str:
    """Colour of an operation kind in Gantt charts (``"allreduce"``, ``"backward"``...)."""
    key = str(kind).strip().lower().replace("-", "_").replace(" ", "_")
    key = {"all_reduce": "allreduce", "all_gather": "allgather", "reducescatter": "reduce_scatter",
           "fwd": "forward", "bwd": "backward"}.get(key, key)
    return KIND_COLORS.get(key) or _hashed_color(key)


def use_style(*, context: str = "notebook", font_scale: float = 1.0) -> None:
    """Apply the project's style (seaborn whitegrid + colour-blind palette) to matplotlib's rcParams.

    Safe under the Agg backend and idempotent; it never changes the backend.
    """
    import seaborn as sns

    sns.set_theme(
        context=context,
        style="whitegrid",
        palette=list(PALETTE),
        font_scale=font_scale,
        rc={
            "figure.figsize": (6.4, 4.0),
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "savefig.bbox": "tight",
            "axes.titlesize": "large",
            "axes.titleweight": "bold",
            "figure.titlesize": "x-large",
            "figure.titleweight": "bold",
            "axes.labelsize": "medium",
            "legend.fontsize": "small",
            "legend.title_fontsize": "small",
            "legend.frameon": False,
            "grid.linewidth": 0.6,
            "lines.linewidth": 1.8,
            "lines.markersize": 5,
            "pdf.fonttype": 42,  # embed TrueType: text stays editable/searchable in the PDF
            "ps.fonttype": 42,
            "svg.fonttype": "none",
        },
    )
