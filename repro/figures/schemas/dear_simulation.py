"""Parameters of notebooks/dear_simulation.ipynb (DeAR's simulated figures)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from repro.figures.params import ListOf, Name, NotebookParams, OneOf, PathParam, parameter_error
from repro.figures.schemas._common import CostMode, Preset, Scale, SimGPUs
from repro.core.planners import planner_names
from repro.studies import dear_sim as study


class DearSimulationParams(NotebookParams):
    notebook: ClassVar[str] = "dear_simulation"

    models: ListOf(OneOf(list(study.DEAR_MODELS))) = ["resnet50", "bert_base"]
    workers: ListOf(SimGPUs) = [8, 64]
    network_presets: ListOf(Preset) = ["10gbe-dear-derived", "56gbib-dear-derived"]
    schedulers: ListOf(OneOf(lambda: planner_names("allreduce") + planner_names("dear")
                             + planner_names("bytescheduler"))) = [
        "wfbp", "bytescheduler", "horovod", "ddp_buckets", "mgwfbp", "dear_nofusion", "dear_threshold", "dear_model",
        "dear_optimal"]
    summary_network_presets: ListOf(Preset) = ["10gbe-dear64", "56gbib-dear64"]
    summary_workers: SimGPUs = 64
    timeline_model: Name = "bert_base"
    timeline_network_preset: Preset = "56gbib-dear64"
    timeline_workers: SimGPUs = 64
    timeline_schedulers: ListOf(OneOf(lambda: planner_names("allreduce") + planner_names("dear"))) = [
        "wfbp", "dear_threshold"]
    cost_mode: CostMode = "paper"
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"

    @model_validator(mode="after")
    def _timeline_trace(self):
        try:
            study.find_trace(self.timeline_model)
        except ValueError as e:
            raise parameter_error("timeline_model", str(e)) from None
        return self
