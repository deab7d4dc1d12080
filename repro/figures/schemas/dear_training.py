"""Parameters of notebooks/dear_training.ipynb (DeAR measured on this machine, tuned, simulated)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from repro.figures.params import Bool, Int, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (BatchSize, Bytes, CostMode, Launcher, LinkRateOrLoopback, Model, Preset,
                                           Ranks, Repeats, Scale, SimGPUs, Slurm, Steps, TimingPairs)
from repro.core.schedulers import SCHEDULERS
from repro.studies import dear_sim as sim

#: schedulers a measured run can use (dear_bo has its own live run)
RUNNABLE = [s for s in SCHEDULERS if s not in ("local", "dear_bo")]
PaperModel = OneOf(list(sim.DEAR_MODELS))


class DearTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "dear_training"

    model: Model = "tiny_resnet"
    world_sizes: ListOf(Ranks) = [2]
    nofusion_schedulers: ListOf(OneOf(RUNNABLE)) = ["wfbp", "bytescheduler", "dear_nofusion"]
    fusion_schedulers: ListOf(OneOf(RUNNABLE)) = ["horovod", "ddp", "fsdp", "mgwfbp", "dear_threshold", "dear_model",
                                                 "dear_optimal"]
    threshold_sweep_bytes: ListOf(Bytes, min_length=2) = [8192, 32768, 131072, 524288]
    batch_size: BatchSize = 16
    steps: Steps = 6
    warmup_steps: Steps = 2
    timing_pairs: TimingPairs = 5
    timing_block_steps: Steps = 4
    bo_steps: Steps = 80
    search_trials: Repeats = 8
    search_seeds: Annotated[Int, Field(ge=1, le=100)] = 3  # seeds of BO and random search: 3 by default; 100 is a study of its own
    primitive_sizes_bytes: ListOf(Bytes) = [4096, 32768, 262144, 2097152]
    primitive_repeats: Repeats = 3
    link_rate: LinkRateOrLoopback = "100mbit"
    paper_models: ListOf(PaperModel) = ["resnet50", "densenet201", "inception_v4", "bert_base", "bert_large"]
    network_presets: ListOf(Preset) = ["10gbe-dear64", "56gbib-dear64"]
    paper_workers: SimGPUs = 64
    cost_mode: CostMode = "paper"
    tuning_model: PaperModel = "bert_base"
    read_only: Bool = False
    scale: Scale = "tiny"
    launcher: Launcher = ""
    slurm: Slurm = ""  # what each SLURM job asks for (key=value items; repro.launch.jobs.slurm_resources)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
