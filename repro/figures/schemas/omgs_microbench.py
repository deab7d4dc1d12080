"""Parameters of notebooks/omgs_microbench.ipynb (top-k and all-gather timed on this machine)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from repro.figures.params import Bool, Int, ListOf, NotebookParams, PathParam
from repro.figures.schemas._common import MAX_NUMEL, Bytes, Density, Ranks, Repeats, Scale, Threads


class OmgsMicrobenchParams(NotebookParams):
    notebook: ClassVar[str] = "omgs_microbench"

    density: Density
    topk_numels: ListOf(Annotated[Int, Field(ge=2, le=MAX_NUMEL)])
    world_sizes: ListOf(Ranks)
    allgather_max_bytes: Bytes
    repeats: Repeats
    threads: Threads
    paper_lines: Bool
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam
