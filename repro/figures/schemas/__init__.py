"""One parameter schema per notebook, in ``repro.figures.schemas.<stem>``: ``notebooks/<stem>.ipynb`` checks
its parameters with ``apply_parameters(<Schema>, globals())``. Each schema declares its notebook's
parameters (same names, types and order as the ``parameters`` cell, no defaults) with their ranges and
choices. The modules import the registries they check against, so each is imported only when asked for.
"""

from __future__ import annotations

import importlib

from repro.figures.params import NotebookParams

__all__ = ["SCHEMAS", "schema_for"]

#: notebook stem -> the schema class in ``repro.figures.schemas.<stem>``
SCHEMAS: dict[str, str] = {
    "compare_schedulers": "CompareSchedulersParams",
    "dear_simulation": "DearSimulationParams",
    "fidelity": "FidelityParams",
    "dear_training": "DearTrainingParams",
    "mgwfbp_simulation": "MgwfbpSimulationParams",
    "mgwfbp_training": "MgwfbpTrainingParams",
    "omgs_microbench": "OmgsMicrobenchParams",
    "omgs_simulation": "OmgsSimulationParams",
    "omgs_training": "OmgsTrainingParams",
    "osp_simulation": "OspSimulationParams",
    "osp_training": "OspTrainingParams",
    "validation": "ValidationParams",
    "validation_published": "ValidationPublishedParams",
}


def schema_for(notebook: str) -> type[NotebookParams]:
    """The schema of ``notebooks/<notebook>.ipynb`` (the stem, e.g. ``"osp_simulation"``)."""
    if notebook not in SCHEMAS:
        raise KeyError(f"no parameter schema for notebook {notebook!r}; known: {', '.join(SCHEMAS)}")
    return getattr(importlib.import_module(f"{__name__}.{notebook}"), SCHEMAS[notebook])
