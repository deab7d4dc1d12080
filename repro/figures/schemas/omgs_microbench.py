"""Parameters of notebooks/omgs_microbench.ipynb (top-k and all-gather timed on this machine)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from repro.figures.params import Bool, Int, ListOf, NotebookParams, PathParam
from repro.figures.schemas._common import MAX_NUMEL, Bytes, Density, Ranks, Repeats, Scale, Threads


class OmgsMicrobenchParams(NotebookParams):
    notebook: ClassVar[str] = "omgs_microbench"

    density: Density = 0.001
    topk_numels: ListOf(Annotated[Int, Field(ge=2, le=MAX_NUMEL)]) = [1024, 4096, 16384, 65536, 262144, 1048576, 4194304]
    world_sizes: ListOf(Ranks) = [2]
    allgather_max_bytes: Bytes = 4194304
    repeats: Repeats = 5
    threads: Threads = 1
    paper_lines: Bool = True
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
