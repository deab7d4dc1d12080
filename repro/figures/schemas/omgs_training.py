"""Parameters of notebooks/omgs_training.ipynb (OMGS-SGD's convergence and breakdown, measured)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import ListOf, NotebookParams, PathParam, Str
from repro.figures.schemas._common import (AtLeast2, CostMode, Density, Launcher, Slurm, LinkRateOrLoopback, Model,
                                           NonNegative, Positive, PositiveFloat, Preset, Scale)


class OmgsTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "omgs_training"

    cnn_model: Model = "tiny_resnet"
    cnn_density: Density = 0.2
    lm_model: Model = "tiny_lstm"
    lm_density: Density = 0.004
    ptb_dir: Str = ""  # a folder, or "": data/datasets/ptb if present, else the pydoc text (the notebook decides)
    convergence_epochs: Positive = 3
    convergence_world_size: Positive = 2
    batch_size: Positive = 32
    lr: PositiveFloat = 0.05
    lm_lr: PositiveFloat = 0.5
    seeds: ListOf(NonNegative) = [0, 1, 2]
    models: ListOf(Model) = ["tiny_resnet", "tiny_lstm"]
    breakdown_world_size: Positive = 2
    breakdown_density: Density = 0.05
    steps: Positive = 8
    warmup_steps: Positive = 2
    link_rate: LinkRateOrLoopback = "10mbit"
    paper_workers: AtLeast2 = 16
    paper_network: Preset = "1gbe-allgather"
    cost_mode: CostMode = "paper"
    runs_dir: Str = ""  # a cluster job's folder to read, or "": train here (the notebook resolves it)
    scale: Scale = "tiny"
    launcher: Launcher = ""
    slurm: Slurm = ""  # what each SLURM job asks for (key=value items; repro.cluster.jobs.slurm_resources)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
