"""Parameters of notebooks/mgwfbp_simulation.ipynb (MG-WFBP's simulated figures)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from repro.figures.params import Bool, ListOf, Name, NotebookParams, OneOf, PathParam, parameter_error
from repro.figures.schemas._common import CostMode, Preset, Scale, SimGPUs, ThresholdBytes, estimate_gpus
from repro.core.planners import PLANNERS
from repro.studies import mgwfbp_sim as study


class MgwfbpSimulationParams(NotebookParams):
    notebook: ClassVar[str] = "mgwfbp_simulation"

    models: ListOf(Name) = ["resnet50", "resnet152", "densenet161", "densenet201", "inception_v4", "googlenet",
                            "vgg16", "bert_base", "bert_large"]
    gpu: OneOf(estimate_gpus) = "v100"
    network_presets: ListOf(Preset) = ["10gbe-derived", "56gbib-derived"]
    workers: ListOf(SimGPUs) = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    schedulers: ListOf(OneOf(lambda: list(PLANNERS))) = ["wfbp", "syncea", "threshold", "mgwfbp", "optimal"]
    threshold_bytes: ThresholdBytes = 67108864
    paper_check: Bool = True
    timeline_model: Name = "googlenet"
    timeline_network_preset: Preset = "10gbe-v100"
    timeline_workers: SimGPUs = 16
    hist_models: ListOf(Name, min_length=0, max_length=2) = ["resnet50", "bert_base"]
    cost_mode: CostMode = "paper"
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"

    @model_validator(mode="after")
    def _traces_exist(self):
        for name, models in (("models", self.models), ("timeline_model", [self.timeline_model])):
            for m in models:
                try:
                    study.find_trace(m, f"{self.gpu}-estimate")
                except ValueError as e:
                    raise parameter_error(name, str(e)) from None
        return self
