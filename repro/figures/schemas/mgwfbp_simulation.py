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

    models: ListOf(Name)
    gpu: OneOf(estimate_gpus)
    network_presets: ListOf(Preset)
    workers: ListOf(SimGPUs)
    schedulers: ListOf(OneOf(lambda: list(PLANNERS)))
    threshold_bytes: ThresholdBytes
    paper_check: Bool
    timeline_model: Name
    timeline_network_preset: Preset
    timeline_workers: SimGPUs
    hist_models: ListOf(Name, min_length=0, max_length=2)
    cost_mode: CostMode
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam

    @model_validator(mode="after")
    def _traces_exist(self):
        for name, models in (("models", self.models), ("timeline_model", [self.timeline_model])):
            for m in models:
                try:
                    study.find_trace(m, f"{self.gpu}-estimate")
                except ValueError as e:
                    raise parameter_error(name, str(e)) from None
        return self
