"""Parameters of notebooks/osp_simulation.ipynb (OSP on a simulated parameter server)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from repro.figures.params import Float, Int, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import AtLeast2, CostMode, LinkRate, Positive, Scale, Share
from repro.studies.osp_sim import OSP_MODELS, SIM_METHODS

OspModel = OneOf(list(OSP_MODELS))


class OspSimulationParams(NotebookParams):
    notebook: ClassVar[str] = "osp_simulation"

    models: ListOf(OspModel) = ["resnet50", "vgg16", "bert_base", "inception_v4"]
    sim_link_rates: ListOf(LinkRate) = ["10gbit", "100gbit"]
    latency_us: Float = Field(50.0, ge=0)
    sim_workers: AtLeast2 = 8
    servers: Positive = 1
    stage1_share: Share = 0.5
    staleness: Int = Field(2, ge=0)
    stage1_shares: ListOf(Share) = [0.0, 0.25, 0.5, 0.75, 1.0]
    timeline_model: OspModel = "resnet50"
    timeline_link_rate: LinkRate = "10gbit"
    timeline_schedulers: ListOf(OneOf(SIM_METHODS)) = ["ps_bsp", "osp_auto", "osp"]
    timeline_iterations: Positive = 3
    cost_mode: CostMode = "paper"
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
