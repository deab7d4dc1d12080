"""Parameters of notebooks/fidelity.ipynb (per-message terms: fit, cross-validation, fidelity report)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import Bool, NotebookParams, PathParam
from repro.figures.schemas._common import Scale


class FidelityParams(NotebookParams):
    notebook: ClassVar[str] = "fidelity"

    scale: Scale
    refit: Bool
    output_dir: PathParam
    results_dir: PathParam
