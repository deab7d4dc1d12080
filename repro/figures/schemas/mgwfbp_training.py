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

    models: ListOf(Model) = ["tiny_resnet"]
    world_sizes: ListOf(RanksFrom1, min_length=0) = []  # empty: the notebook picks default_world_sizes()
    schedulers: ListOf(OneOf([s for s in SCHEDULERS if s != "local"])) = ["wfbp", "syncea", "mgwfbp", "optimal",
                                                                          "ddp"]
    precisions: ListOf(OneOf(["float32", "float16"])) = ["float32", "float16"]
    threshold_sweep_bytes: ListOf(Bytes, min_length=0) = [4096, 65536, 1048576]
    batch_size: BatchSize = 32
    steps: Steps = 6
    warmup_steps: Steps = 3
    timing_pairs: TimingPairs = 5
    timing_block_steps: Steps = 5
    convergence_model: Model = "tiny_resnet"
    convergence_dataset: Annotated[OneOf(DATASET_NAMES), AfterValidator(_epochs_dataset)] = "digits"
    convergence_epochs: Epochs = 2
    convergence_world_size: RanksFrom1 = 2
    allreduce_sizes_bytes: ListOf(Bytes) = [4096, 16384, 65536, 262144, 1048576, 4194304]
    link_rate: LinkRateOrLoopback = "100mbit"
    read_only: Bool = False
    scale: Scale = "tiny"
    launcher: Launcher = ""
    slurm: Slurm = ""  # what each SLURM job asks for (key=value items; repro.launch.jobs.slurm_resources)
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
