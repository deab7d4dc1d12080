"""Parameters of notebooks/compare_schedulers.ipynb (every scheduler, simulated and measured)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from repro.figures.params import Bool, Float, ListOf, Name, NotebookParams, OneOf, PathParam, parameter_error
from repro.figures.schemas._common import (BatchSize, CostMode, Density, LinkRateOrLoopback, Model, Preset, Ranks,
                                           Scale, SimGPUs, Steps)
from repro.studies import compare

Scheduler = OneOf(compare.SCHEDULERS)


class CompareSchedulersParams(NotebookParams):
    notebook: ClassVar[str] = "compare_schedulers"

    models: ListOf(Name)
    network_presets: ListOf(Preset)
    workers: ListOf(SimGPUs)
    cost_mode: CostMode
    schedulers: ListOf(Scheduler)
    density: Density
    # seconds per element and log2: OMGS-SGD's P102-100 fit is 2.19e-10; 1e-6 would be ~5000x slower than that GPU
    topk_gamma_s: Float = Field(ge=0, le=1e-6)
    measured_schedulers: ListOf(Scheduler, min_length=0)
    measured_model: Model
    measured_workers: Ranks
    link_rate: LinkRateOrLoopback
    batch_size: BatchSize
    steps: Steps
    warmup_steps: Steps
    read_only: Bool
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam

    @model_validator(mode="after")
    def _traces_and_nodes(self):
        for m in self.models:
            try:
                compare.resolve_trace(m)
            except ValueError as e:
                raise parameter_error("models", str(e)) from None
        try:
            compare.check_workers(self.workers, self.cost_mode)  # calibrated clusters: whole nodes
        except ValueError as e:
            raise parameter_error("workers", f"{e} (cost_mode {self.cost_mode})") from None
        return self
