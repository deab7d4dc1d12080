"""Parameters of notebooks/validation_published.ipynb (published measurements vs the two cost models)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from repro.figures.params import Bool, Int, NotebookParams, PathParam
from repro.figures.schemas._common import Scale


class ValidationPublishedParams(NotebookParams):
    notebook: ClassVar[str] = "validation_published"

    scale: Scale = "tiny"
    refit: Bool = False
    max_nfev: Int = Field(60, ge=5)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
