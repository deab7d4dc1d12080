"""Parameters of notebooks/omgs_training.ipynb (OMGS-SGD's convergence and breakdown, measured)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import InputFolder, ListOf, NotebookParams, PathParam
from repro.figures.schemas._common import (BatchSize, CostMode, Density, Epochs, Launcher, LearningRate,
                                           LinkRateOrLoopback, Model, Preset, RanksFrom1, Scale, Seed, SimGPUs,
                                           Slurm, Steps, TimingPairs)


class OmgsTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "omgs_training"

    cnn_model: Model
    cnn_density: Density
    lm_model: Model
    lm_density: Density
    ptb_dir: InputFolder()  # an existing folder, or "": data/datasets/ptb if present, else the pydoc text
    convergence_epochs: Epochs
    convergence_world_size: RanksFrom1
    batch_size: BatchSize
    lr: LearningRate
    lm_lr: LearningRate
    seeds: ListOf(Seed)
    models: ListOf(Model)
    breakdown_world_size: RanksFrom1
    breakdown_density: Density
    steps: Steps
    warmup_steps: Steps
    timing_pairs: TimingPairs
    timing_block_steps: Steps
    timing_extra_densities: ListOf(Density, min_length=0)
    timing_plan_inputs: str  # a recorded-inputs file, a name in data/calibration/, or ""
    link_rate: LinkRateOrLoopback
    paper_workers: SimGPUs
    paper_network: Preset
    cost_mode: CostMode
    runs_dir: InputFolder()  # an existing cluster job's folder to read, or "": train here
    scale: Scale
    launcher: Launcher
    slurm: Slurm  # what each SLURM job asks for (key=value items; repro.grids.jobs.slurm_resources)
    output_dir: PathParam
    results_dir: PathParam
