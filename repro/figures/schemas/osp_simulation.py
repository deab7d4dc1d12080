"""Parameters of notebooks/osp_simulation.ipynb (OSP on a simulated parameter server)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from repro.figures.params import Float, ListOf, NotebookParams, OneOf, PathParam
from repro.figures.schemas._common import (CostMode, LinkRate, Repeats, Scale, Servers, Share, SimGPUs,
                                           Staleness)
from repro.studies.osp_sim import OSP_MODELS, SIM_METHODS

OspModel = OneOf(list(OSP_MODELS))


class OspSimulationParams(NotebookParams):
    notebook: ClassVar[str] = "osp_simulation"

    models: ListOf(OspModel) = ["resnet50", "vgg16", "bert_base", "inception_v4"]
    sim_link_rates: ListOf(LinkRate) = ["10gbit", "100gbit"]
    # per-message latency, µs: 50 is a datacentre TCP round trip; 1 s (1e6) is no longer a datacentre network
    latency_us: Float = Field(50.0, ge=0, le=1e6)
    sim_workers: SimGPUs = 8
    servers: Servers = 1
    stage1_share: Share = 0.5
    staleness: Staleness = 2
    stage1_shares: ListOf(Share) = [0.0, 0.25, 0.5, 0.75, 1.0]
    timeline_model: OspModel = "resnet50"
    timeline_link_rate: LinkRate = "10gbit"
    timeline_schedulers: ListOf(OneOf(SIM_METHODS)) = ["ps_bsp", "osp_auto", "osp"]
    timeline_iterations: Repeats = 3
    cost_mode: CostMode = "paper"
    scale: Scale = "tiny"
    output_dir: PathParam = "results/figures"
    results_dir: PathParam = "results/data"
