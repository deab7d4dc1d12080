"""Parameters of notebooks/validation_published.ipynb (published measurements vs the two cost models)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from repro.figures.params import Bool, Int, NotebookParams, PathParam
from repro.figures.schemas._common import Scale


class ValidationPublishedParams(NotebookParams):
    notebook: ClassVar[str] = "validation_published"

    scale: Scale
    refit: Bool
    # least-squares function evaluations per start (only with refit); the cost of a refit grows with it
    max_nfev: Int = Field(ge=5, le=10_000)
    output_dir: PathParam
    results_dir: PathParam
