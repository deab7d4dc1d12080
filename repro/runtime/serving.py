"""Server ranks under :func:`repro.distribute`, for a family that has them (``Family.door_servers``).

The door asks the family's :class:`DoorServers` three things, so that it names no family: the run's
options with its servers settled (before any collective), where the ranks go (a :class:`Placement`,
or, on a rank that serves, the optimizer to return once the run is over), and what the returned
optimizer needs on a trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

__all__ = ["Placement", "DoorServers"]


@dataclass(frozen=True)
class Placement:
    """Where a run's ranks are: ``group``, the process group of the training ranks (None: every rank
    trains); ``first``, the global rank that plans; ``servers``, serving ranks before it (they plan
    alongside); ``trace_name``, the model's name in the measured trace; ``on_plan``, called on every
    trainer after planning, before the plan's executor starts."""

    group: Any = None
    first: int = 0
    servers: int = 0
    trace_name: str | None = None
    on_plan: Callable[[], None] | None = None


class DoorServers(Protocol):
    """A family's server ranks under :func:`repro.distribute` (``dedicated``: ``dedicated_servers``,
    0 for servers co-located on the training ranks)."""

    def settle_options(self, dedicated: int, *, name: str | None, plan: Any, planner_options: Sequence[str],
                       options: dict[str, Any], world: int, grad_scaler: Any) -> dict[str, Any]:
        """``options`` with the servers settled; ValueError in one line for a run that cannot be placed."""

    def place(self, model: Any, optimizer: Any, *, dedicated: int, name: str | None, plan: Any,
              planner_options: dict[str, Any], network_cost: Any, view: str, fit_repeats: int,
              model_name: str | None) -> Placement | Any:
        """Called on every rank with ``dedicated`` > 0 (collectively): a trainer's :class:`Placement` (the
        first trainer's state broadcast to the trainers), or on a serving rank, after the whole run, the
        optimizer :func:`repro.distribute` returns there."""

    def attach(self, optimizer: Any, dedicated: int) -> None:
        """Called on a trainer with the optimizer :func:`repro.distribute` returns."""
