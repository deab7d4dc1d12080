"""Dedicated server ranks under :func:`repro.distribute` (``dedicated_servers=S``): ranks ``0..S-1``
serve (:func:`repro.families.ps.executor.serve`), ranks ``S..`` train with
:class:`repro.families.ps.executor.PSExecutor` on a group of their own.

A serving rank makes the same collectives as ``repro train``'s, in the same order: the trainers' group,
the state hand-over (or online planning), then serving until every trainer stops;
``distribute()`` then returns ``(model, optimizer)`` with ``optimizer.serving`` True. Refused on nccl.
"""

from __future__ import annotations

import atexit
import weakref
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["ServingRankOptimizer", "serve_until_done", "share_trainer_state", "stop_at_exit", "trainer_group"]


def trainer_group(servers: int) -> Any:
    """The process group of ranks ``servers..world-1`` (every rank of the job calls it)."""
    return dist.new_group(list(range(servers, dist.get_world_size())))


def share_trainer_state(model: nn.Module, optimizer: torch.optim.Optimizer, first: int) -> None:
    """The first trainer's (global rank ``first``) parameters, buffers and optimizer state on every
    rank that is not a trainer (every rank of the job calls it; the trainers keep theirs)."""
    box: list[Any] = [None]
    if dist.get_rank() == first:
        box[0] = ({k: v.detach().cpu() for k, v in model.state_dict().items()}, optimizer.state_dict())
    dist.broadcast_object_list(box, src=first)
    if dist.get_rank() < first:
        state, opt_state = box[0]
        model.load_state_dict(state)
        optimizer.load_state_dict(opt_state)


def serve_until_done(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: str | None, plan: Any, *,
                     servers: int, view: str, planner_options: dict[str, Any], network_cost: Any,
                     fit_repeats: int) -> dict[str, list[dict[str, Any]]]:
    """A serving rank's part of the run (module docstring); returns the tables it recorded."""
    from repro.core.families import get_family
    from repro.runtime.online import plan_online

    device = next(model.parameters()).device
    if plan is None:
        plan, _, _ = plan_online(scheduler, None, device, planner_options=planner_options,
                                 network_cost=network_cost, fit_repeats=fit_repeats, first=servers,
                                 servers=servers)
    share_trainer_state(model, optimizer, servers)
    serve = get_family(plan.family).hook("server")  # the family's serving ranks (repro.families.ps.executor:serve)
    return serve(None, SimpleNamespace(view=view), model, optimizer, plan)


def stop_at_exit(optimizer: Any) -> None:
    """Stop the servers' threads for this trainer when the interpreter exits, if the script did not
    call ``optimizer.remove()`` (the servers would otherwise wait for this worker). Nothing happens
    when the process group is gone already (the servers then see the peer leave and stop with an
    error naming it)."""
    ref = weakref.ref(optimizer)

    def stop() -> None:
        opt = ref()
        if opt is None or not (dist.is_available() and dist.is_initialized()):
            return
        try:
            opt.remove()
        except Exception:  # noqa: BLE001 - at exit: nothing left to report to
            pass

    atexit.register(stop)


class ServingRankOptimizer(torch.optim.Optimizer):
    """The optimizer ``distribute()`` returns on a serving rank after the run: ``serving`` True,
    ``tables`` what the server recorded (SSP's ``server_clocks``); stepping it is refused."""

    serving = True

    def __init__(self, optimizer: torch.optim.Optimizer, servers: int, tables: dict[str, list]) -> None:
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.optimizer = optimizer
        self.tables = tables
        self._servers = servers

    def _refuse(self) -> None:
        raise RuntimeError(f"repro.distribute: this rank served the run (dedicated_servers={self._servers}: ranks "
                           f"0..{self._servers - 1} serve); skip the training loop where optimizer.serving is True")

    def step(self, closure=None):  # type: ignore[override]
        self._refuse()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._refuse()

    def flush(self) -> None:
        """Nothing in flight: the run is over on this rank."""

    def remove(self) -> None:
        """Nothing attached."""
