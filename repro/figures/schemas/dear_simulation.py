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

    models: ListOf(OneOf(list(study.DEAR_MODELS)))
    workers: ListOf(SimGPUs)
    network_presets: ListOf(Preset)
    schedulers: ListOf(OneOf(lambda: planner_names("allreduce") + planner_names("dear")
                             + planner_names("bytescheduler")))
    summary_network_presets: ListOf(Preset)
    summary_workers: SimGPUs
    timeline_model: Name
    timeline_network_preset: Preset
    timeline_workers: SimGPUs
    timeline_schedulers: ListOf(OneOf(lambda: planner_names("allreduce") + planner_names("dear")))
    cost_mode: CostMode
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam

    @model_validator(mode="after")
    def _timeline_trace(self):
        try:
            study.find_trace(self.timeline_model)
        except ValueError as e:
            raise parameter_error("timeline_model", str(e)) from None
        return self
