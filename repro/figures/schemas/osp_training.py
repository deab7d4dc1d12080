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

    model: Model = "tiny_resnet"
    dataset: OneOf(["digits", "cifar10", "imagenet"]) = "digits"
    ps_workers: Ranks = 2
    servers: Servers = 1
    link_rate: LinkRateOrLoopback = "100mbit"
    epochs: Epochs = 3
    batch_size: BatchSize = 32
    warmup_steps: Steps = 2
    timing_pairs: TimingPairs = 5
    timing_block_steps: Steps = 6
    lr: LearningRate = 0.05
    momentum: Float = Field(0.5, ge=0, lt=1)
    stage1_share: Share = 0.5
    ablation_shares: ListOf(Share) = [0.0, 0.5]
    ratio_shares: ListOf(Share, min_length=0) = [0.0, 0.5]
    staleness: Staleness = 2
    seeds: ListOf(Seed) = [0, 1, 2]
    importance: OneOf(["magnitude", "position"]) = "magnitude"
    paper_models: ListOf(OneOf(list(OSP_MODELS))) = ["resnet50", "vgg16", "bert_base", "inception_v4"]
    sim_link_rates: ListOf(LinkRate) = ["10gbit", "100gbit"]
    sim_stage1_shares: ListOf(Share) = [0.0, 0.25, 0.5, 0.75, 1.0]
    paper_workers: SimGPUs = 8
    read_only: Bool = False
    cost_mode: CostMode = "paper"
    scale: Scale = "tiny"
    launcher: Launcher = ""
    slurm: Slurm = ""  # what each SLURM job asks for (key=value items; repro.launch.jobs.slurm_resources)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
