"""Parameters of notebooks/omgs_simulation.ipynb (OMGS-SGD's simulated figures and a measured timeline)."""

from __future__ import annotations

import warnings
from typing import Annotated, ClassVar

from pydantic import AfterValidator, model_validator

from repro.figures.params import InputFolder, ListOf, Name, NotebookParams, OneOf, PathParam, Str, parameter_error
from repro.figures.schemas._common import (CostMode, Density, Model, Preset, Ranks, Scale, SimGPUs, Steps,
                                           estimate_gpus)
from repro.core.planners import planner_names
from repro.studies import omgs_sim as study


def _preset_or_empty(value: str) -> str:
    from repro.costs.presets import PRESETS

    if value and value not in PRESETS:
        raise ValueError(f"unknown value {value!r}; choose from {', '.join(PRESETS)} (or empty: fit on the live group)")
    return value


class OmgsSimulationParams(NotebookParams):
    notebook: ClassVar[str] = "omgs_simulation"

    models: ListOf(Name)
    gpu: OneOf(estimate_gpus)
    network_preset: Preset
    workers: ListOf(SimGPUs)
    densities: ListOf(Density)
    schedulers: ListOf(OneOf(lambda: planner_names("sparse")))
    tiny_skip_models: ListOf(Name, min_length=0)
    timeline_model: Name
    timeline_workers: SimGPUs
    runs_dir: InputFolder("none")  # an existing folder, "" (measure here) or "none" (no measured panel)
    measured_model: Model
    measured_world_size: Ranks
    measured_density: Density
    measured_network_preset: Annotated[Str, AfterValidator(_preset_or_empty)]
    steps: Steps
    warmup_steps: Steps
    cost_mode: CostMode
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam

    @model_validator(mode="after")
    def _traces_exist(self):
        gpus = [self.gpu] + [g for g in ("p102", "v100") if g != self.gpu]
        for name, models in (("models", self.models), ("timeline_model", [self.timeline_model])):
            for m in models:
                try:
                    with warnings.catch_warnings():  # the notebook warns of a fallback when it loads the trace
                        warnings.simplefilter("ignore")
                        study.find_trace(m, gpus)
                except ValueError as e:
                    raise parameter_error(name, str(e)) from None
        return self
