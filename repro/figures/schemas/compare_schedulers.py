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

    models: ListOf(Name) = ["resnet50", "bert_base", "vgg16"]
    network_presets: ListOf(Preset) = ["10gbe-derived", "56gbib-derived"]
    workers: ListOf(SimGPUs) = [8, 16, 32]
    cost_mode: CostMode = "calibrated"
    schedulers: ListOf(Scheduler) = ["wfbp", "syncea", "threshold", "horovod", "ddp_buckets", "mgwfbp", "optimal",
                                     "topk_layerwise", "topk_single", "omgs", "omgs_optimal", "dear_nofusion",
                                     "dear_threshold", "dear_model", "dear_optimal", "bytescheduler", "ps_bsp",
                                     "ps_asp", "ps_ssp", "osp", "osp_auto"]
    density: Density = 0.001
    # seconds per element and log2: OMGS-SGD's P102-100 fit is 2.19e-10; 1e-6 would be ~5000x slower than that GPU
    topk_gamma_s: Float = Field(2.19e-10, ge=0, le=1e-6)
    measured_schedulers: ListOf(Scheduler, min_length=0) = ["mgwfbp", "omgs", "dear_threshold", "osp"]
    measured_model: Model = "tiny_resnet"
    measured_workers: Ranks = 2
    link_rate: LinkRateOrLoopback = "100mbit"
    batch_size: BatchSize = 16
    steps: Steps = 6
    warmup_steps: Steps = 2
    read_only: Bool = False
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"

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
