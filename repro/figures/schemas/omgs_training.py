"""Parameters of notebooks/omgs_training.ipynb (OMGS-SGD's convergence and breakdown, measured)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import InputFolder, ListOf, NotebookParams, PathParam
from repro.figures.schemas._common import (BatchSize, CostMode, Density, Epochs, Launcher, LearningRate,
                                           LinkRateOrLoopback, Model, Preset, RanksFrom1, Scale, Seed, SimGPUs,
                                           Slurm, Steps, TimingPairs)


class OmgsTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "omgs_training"

    cnn_model: Model = "tiny_resnet"
    cnn_density: Density = 0.2
    lm_model: Model = "tiny_lstm"
    lm_density: Density = 0.004
    ptb_dir: InputFolder() = ""  # an existing folder, or "": data/datasets/ptb if present, else the pydoc text
    convergence_epochs: Epochs = 3
    convergence_world_size: RanksFrom1 = 2
    batch_size: BatchSize = 32
    lr: LearningRate = 0.05
    lm_lr: LearningRate = 0.5
    seeds: ListOf(Seed) = [0, 1, 2]
    models: ListOf(Model) = ["tiny_resnet", "tiny_lstm"]
    breakdown_world_size: RanksFrom1 = 2
    breakdown_density: Density = 0.05
    steps: Steps = 6
    warmup_steps: Steps = 2
    timing_pairs: TimingPairs = 5
    timing_block_steps: Steps = 5
    timing_extra_densities: ListOf(Density, min_length=0) = [0.001]
    timing_plan_inputs: str = "omgs_timing_inputs.json"  # a recorded-inputs file, a name in data/calibration/, or ""
    link_rate: LinkRateOrLoopback = "10mbit"
    paper_workers: SimGPUs = 16
    paper_network: Preset = "1gbe-allgather"
    cost_mode: CostMode = "paper"
    runs_dir: InputFolder() = ""  # an existing cluster job's folder to read, or "": train here
    scale: Scale = "tiny"
    launcher: Launcher = ""
    slurm: Slurm = ""  # what each SLURM job asks for (key=value items; repro.launch.jobs.slurm_resources)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
