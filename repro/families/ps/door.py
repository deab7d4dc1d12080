"""The parameter server's ranks under :func:`repro.distribute` (:class:`repro.runtime.serving.DoorServers`):
servers co-located on the training ranks (:mod:`.colocated`), or dedicated ranks ``0..S-1``
(:mod:`.dedicated`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch.distributed as dist

from repro.families.ps import dedicated as ps_dedicated
from repro.families.ps.colocated import colocated_options
from repro.runtime.buffers import broadcast_module_state
from repro.runtime.serving import Placement

__all__ = ["DOOR_SERVERS", "PSDoorServers"]


class PSDoorServers:
    """See :class:`repro.runtime.serving.DoorServers`."""

    def settle_options(self, dedicated: int, *, name: str | None, plan: Any, planner_options: Sequence[str],
                       options: dict[str, Any], world: int, grad_scaler: Any) -> dict[str, Any]:
        if not dedicated:
            return colocated_options(plan, planner_options, options, world)
        if dist.get_backend() == "nccl":
            raise ValueError("dedicated servers talk point to point from one thread per worker, which NCCL does not "
                             "support: use the gloo backend, or the co-located servers (dedicated_servers=0, the "
                             "default)")
        if dedicated >= world:
            raise ValueError(f"dedicated_servers={dedicated} leaves no trainer among the job's {world} rank(s)")
        if grad_scaler is not None:
            raise ValueError("grad_scaler goes with the co-located servers (dedicated_servers=0): dedicated servers "
                             "apply the pushed gradients without a scaler's verdict")
        if plan is not None:
            if int(plan.option("servers")) != dedicated:
                raise ValueError(f"the plan has {plan.option('servers')} server(s), dedicated_servers={dedicated}")
            return options
        options = dict(options)
        given = options.setdefault("servers", dedicated)
        if given != dedicated:
            raise ValueError(f"servers={given} but dedicated_servers={dedicated}: with dedicated servers each serving "
                             "rank is one server (leave servers out)")
        return options

    def place(self, model: Any, optimizer: Any, *, dedicated: int, name: str | None, plan: Any,
              planner_options: dict[str, Any], network_cost: Any, view: str, fit_repeats: int,
              model_name: str | None) -> Placement | Any:
        group = ps_dedicated.trainer_group(dedicated)
        if dist.get_rank() < dedicated:
            tables = ps_dedicated.serve_until_done(model, optimizer, name, plan, servers=dedicated, view=view,
                                                   planner_options=planner_options, network_cost=network_cost,
                                                   fit_repeats=fit_repeats)
            return ps_dedicated.ServingRankOptimizer(optimizer, dedicated, tables)
        broadcast_module_state(model, dedicated, group)

        def on_plan() -> None:
            ps_dedicated.share_trainer_state(model, optimizer, dedicated)

        if plan is not None:  # no warm-up: the servers take the first trainer's state now
            on_plan()
        return Placement(group=group, first=dedicated, servers=dedicated, trace_name=model_name,
                         on_plan=None if plan is not None else on_plan)

    def attach(self, optimizer: Any, dedicated: int) -> None:
        if dedicated:
            ps_dedicated.stop_at_exit(optimizer)


DOOR_SERVERS = PSDoorServers()
