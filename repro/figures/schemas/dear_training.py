"""Parameters of notebooks/dear_training.ipynb (DeAR measured on this machine, tuned, simulated)."""

from __future__ import annotations

from typing import ClassVar

from repro.figures.params import Bool, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (AtLeast2, Bytes, CostMode, Launcher, LinkRateOrLoopback, Model, Positive,
                                           Preset, Scale, Slurm)
from repro.schedulers import SCHEDULERS
from repro.studies import dear_sim as sim

#: schedulers a measured run can use (dear_bo has its own live run)
RUNNABLE = [s for s in SCHEDULERS if s not in ("local", "dear_bo")]
PaperModel = OneOf(list(sim.DEAR_MODELS))


class DearTrainingParams(NotebookParams):
    notebook: ClassVar[str] = "dear_training"

    model: Model = "tiny_resnet"
    world_sizes: ListOf(AtLeast2) = [2]
    nofusion_schedulers: ListOf(OneOf(RUNNABLE)) = ["wfbp", "bytescheduler", "dear_nofusion"]
    fusion_schedulers: ListOf(OneOf(RUNNABLE)) = ["horovod", "ddp", "fsdp", "mgwfbp", "dear_threshold", "dear_model",
                                                 "dear_optimal"]
    threshold_sweep_bytes: ListOf(Bytes, min_length=2) = [8192, 32768, 131072, 524288]
    batch_size: Positive = 16
    steps: Positive = 8
    warmup_steps: Positive = 2
    bo_steps: Positive = 80
    search_trials: Positive = 8
    search_seeds: Positive = 3
    primitive_sizes_bytes: ListOf(Bytes) = [4096, 32768, 262144, 2097152]
    primitive_repeats: Positive = 3
    link_rate: LinkRateOrLoopback = "100mbit"
    paper_models: ListOf(PaperModel) = ["resnet50", "densenet201", "inception_v4", "bert_base", "bert_large"]
    network_presets: ListOf(Preset) = ["10gbe-dear64", "56gbib-dear64"]
    paper_workers: AtLeast2 = 64
    cost_mode: CostMode = "paper"
    tuning_model: PaperModel = "bert_base"
    read_only: Bool = False
    scale: Scale = "tiny"
    launcher: Launcher = ""
    slurm: Slurm = ""  # what each SLURM job asks for (key=value items; repro.cluster.jobs.slurm_resources)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
