"""Parameters of notebooks/osp_training.ipynb (OSP measured on a local parameter server, and simulated)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from repro.figures.params import Bool, Float, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (BatchSize, CostMode, Epochs, Launcher, LearningRate, LinkRate,
                                           LinkRateOrLoopback, Model, Ranks, Scale, Seed, Servers, Share, SimGPUs,
                                           Slurm, Staleness, Steps, TimingPairs)
from repro.studies.osp_sim import OSP_MODELS


class OspTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "osp_training"

    model: Model
    dataset: OneOf(["digits", "cifar10", "imagenet"])
    ps_workers: Ranks
    servers: Servers
    link_rate: LinkRateOrLoopback
    epochs: Epochs
    batch_size: BatchSize
    warmup_steps: Steps
    timing_pairs: TimingPairs
    timing_block_steps: Steps
    lr: LearningRate
    momentum: Float = Field(ge=0, lt=1)
    stage1_share: Share
    ablation_shares: ListOf(Share)
    ratio_shares: ListOf(Share, min_length=0)
    staleness: Staleness
    seeds: ListOf(Seed)
    importance: OneOf(["magnitude", "position"])
    paper_models: ListOf(OneOf(list(OSP_MODELS)))
    sim_link_rates: ListOf(LinkRate)
    sim_stage1_shares: ListOf(Share)
    paper_workers: SimGPUs
    read_only: Bool
    cost_mode: CostMode
    scale: Scale
    launcher: Launcher
    slurm: Slurm  # what each SLURM job asks for (key=value items; repro.grids.jobs.slurm_resources)
    output_dir: PathParam
    results_dir: PathParam
