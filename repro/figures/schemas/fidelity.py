"""Parameters of notebooks/fidelity.ipynb (per-message terms: fit, cross-validation, fidelity report)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import Bool, NotebookParams, PathParam
from repro.figures.schemas._common import Scale


class FidelityParams(NotebookParams):
    notebook: ClassVar[str] = "fidelity"

    scale: Scale = "tiny"
    refit: Bool = False
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
