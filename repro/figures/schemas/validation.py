"""Parameters of notebooks/validation.ipynb (the simulator against measured runs on this machine)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import Bool, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (BatchSize, LinkRateOrLoopback, Model, Ranks, Repeats, Scale, Steps,
                                           ThresholdBytes)
from repro.core.schedulers import SCHEDULERS


class ValidationParams(NotebookParams):
    notebook: ClassVar[str] = "validation"

    models: ListOf(Model)
    schedulers: ListOf(OneOf([s for s in SCHEDULERS if s != "local"]))
    link_rates: ListOf(LinkRateOrLoopback)
    world_sizes: ListOf(Ranks)
    batch_size: BatchSize
    steps: Steps
    warmup_steps: Steps
    threshold_bytes: ThresholdBytes
    contention_repeats: Repeats
    require_emulation: Bool
    read_only: Bool
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam
