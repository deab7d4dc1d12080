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

    models: ListOf(OspModel)
    sim_link_rates: ListOf(LinkRate)
    # per-message latency, µs: 50 is a datacentre TCP round trip; 1 s (1e6) is no longer a datacentre network
    latency_us: Float = Field(ge=0, le=1e6)
    sim_workers: SimGPUs
    servers: Servers
    stage1_share: Share
    staleness: Staleness
    stage1_shares: ListOf(Share)
    timeline_model: OspModel
    timeline_link_rate: LinkRate
    timeline_schedulers: ListOf(OneOf(SIM_METHODS))
    timeline_iterations: Repeats
    cost_mode: CostMode
    scale: Scale
    output_dir: PathParam
    results_dir: PathParam
