"""One parameter schema per notebook: ``notebooks/<stem>.ipynb`` checks its parameters with
``apply_parameters(schema_for("<stem>"), globals())`` (written out in the notebook as an import of the
schema class from ``repro.figures.schemas.<stem>``).

Each schema declares every parameter of its notebook's ``parameters`` cell, with the same name and type
in the same order (tests/test_notebook_schemas.py checks that they agree), plus the ranges and choices
the notebook needs, so a bad value fails before any rank starts or any file is written. The defaults
are written only in the parameters cell: the fields have none, and
:func:`repro.figures.params.validate_parameters` reads them from the notebook
(:func:`repro.figures.params.notebook_defaults`). The modules import
the registries they check against (planners, presets, models), so they are imported one at a time,
when a notebook or a test asks for one.
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
