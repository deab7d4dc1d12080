"""Parameters of notebooks/mgwfbp_training.ipynb (MG-WFBP measured on this machine)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator

from repro.figures.params import Bool, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (BatchSize, Bytes, Epochs, Launcher, LinkRateOrLoopback, Model,
                                           RanksFrom1, Scale, Slurm, Steps, TimingPairs)
from repro.core.schedulers import SCHEDULERS
from repro.workload.datasets import DATASET_NAMES


def _epochs_dataset(value: str) -> str:
    # repro train's rule (repro.training.config): epochs need a real dataset; the convergence runs train epochs
    if value == "synthetic":
        raise ValueError("epochs need a real dataset (synthetic data has no epochs; repro train refuses "
                         f"--epochs with --dataset synthetic); choose from "
                         f"{', '.join(d for d in DATASET_NAMES if d != 'synthetic')}")
    return value


class MgwfbpTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "mgwfbp_training"

    models: ListOf(Model)
    world_sizes: ListOf(RanksFrom1, min_length=0)  # empty: the notebook picks default_world_sizes()
    schedulers: ListOf(OneOf([s for s in SCHEDULERS if s != "local"]))
    precisions: ListOf(OneOf(["float32", "float16"]))
    threshold_sweep_bytes: ListOf(Bytes, min_length=0)
    batch_size: BatchSize
    steps: Steps
    warmup_steps: Steps
    timing_pairs: TimingPairs
    timing_block_steps: Steps
    timing_plan_inputs: str  # a recorded-inputs file, a name in data/calibration/, or ""
    convergence_model: Model
    convergence_dataset: Annotated[OneOf(DATASET_NAMES), AfterValidator(_epochs_dataset)]
    convergence_epochs: Epochs
    convergence_world_size: RanksFrom1
    allreduce_sizes_bytes: ListOf(Bytes)
    link_rate: LinkRateOrLoopback
    read_only: Bool
    scale: Scale
    launcher: Launcher
    slurm: Slurm  # what each SLURM job asks for (key=value items; repro.grids.jobs.slurm_resources)
    output_dir: PathParam
    results_dir: PathParam
