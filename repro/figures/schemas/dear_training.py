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

    model: Model
    world_sizes: ListOf(Ranks)
    nofusion_schedulers: ListOf(OneOf(RUNNABLE))
    fusion_schedulers: ListOf(OneOf(RUNNABLE))
    threshold_sweep_bytes: ListOf(Bytes, min_length=2)
    batch_size: BatchSize
    steps: Steps
    warmup_steps: Steps
    timing_pairs: TimingPairs
    timing_block_steps: Steps
    bo_steps: Steps
    search_trials: Repeats
    # seeds of BO and random search; 100 is a study of its own
    search_seeds: Annotated[Int, Field(ge=1, le=100)]
    primitive_sizes_bytes: ListOf(Bytes)
    primitive_repeats: Repeats
    link_rate: LinkRateOrLoopback
    paper_models: ListOf(PaperModel)
    network_presets: ListOf(Preset)
    paper_workers: SimGPUs
    cost_mode: CostMode
    tuning_model: PaperModel
    read_only: Bool
    scale: Scale
    launcher: Launcher
    slurm: Slurm  # what each SLURM job asks for (key=value items; repro.grids.jobs.slurm_resources)
    output_dir: PathParam
    results_dir: PathParam
