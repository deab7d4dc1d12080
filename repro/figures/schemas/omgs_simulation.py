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

    models: ListOf(Name) = ["vgg16_cifar", "resnet50", "inception_v4", "lstm_ptb"]
    gpu: OneOf(estimate_gpus) = "p102"
    network_preset: Preset = "1gbe-allgather"
    workers: ListOf(SimGPUs) = [2, 4, 8, 16]
    densities: ListOf(Density) = [0.001, 0.004, 0.01, 0.05]
    schedulers: ListOf(OneOf(lambda: planner_names("sparse"))) = ["topk_layerwise", "topk_single", "omgs",
                                                                  "omgs_optimal"]
    tiny_skip_models: ListOf(Name, min_length=0) = ["inception_v4"]
    timeline_model: Name = "lstm_ptb"
    timeline_workers: SimGPUs = 16
    runs_dir: InputFolder("none") = ""  # an existing folder, "" (measure here) or "none" (no measured panel)
    measured_model: Model = "tiny_resnet"
    measured_world_size: Ranks = 2
    measured_density: Density = 0.05
    measured_network_preset: Annotated[Str, AfterValidator(_preset_or_empty)] = "1gbe-allgather"
    steps: Steps = 3
    warmup_steps: Steps = 1
    cost_mode: CostMode = "paper"
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"

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
