"""Parameters of notebooks/validation.ipynb (the simulator against measured runs on this machine)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import Bool, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (BatchSize, LinkRateOrLoopback, Model, Ranks, Repeats, Scale, Steps,
                                           ThresholdBytes)
from repro.core.schedulers import SCHEDULERS


class ValidationParams(NotebookParams):
    notebook: ClassVar[str] = "validation"

    models: ListOf(Model) = ["tiny_resnet"]
    schedulers: ListOf(OneOf([s for s in SCHEDULERS if s != "local"])) = ["wfbp", "syncea", "threshold", "mgwfbp",
                                                                          "optimal", "ddp"]
    link_rates: ListOf(LinkRateOrLoopback) = ["loopback", "100mbit"]
    world_sizes: ListOf(Ranks) = [2]
    batch_size: BatchSize = 32
    steps: Steps = 10
    warmup_steps: Steps = 3
    threshold_bytes: ThresholdBytes = 65536
    contention_repeats: Repeats = 7
    require_emulation: Bool = False
    read_only: Bool = False
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
