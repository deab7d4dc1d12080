"""The scheduler registry: every name a user types (CLI, ``repro train``, notebooks), in one table.

A scheduler is a plan scheduler (a planner of :mod:`repro.core.planners` makes a
:class:`~repro.core.plan.Plan` that its family's executor runs) or a baseline that executes no plan of
ours. Executors are lazily imported ``"module:Class"`` strings, so this module never imports torch.
Family packages register their schedulers (:func:`register_scheduler`; docs/extending.md).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from repro.core.families import resolve
from repro.core.registry import Registry

__all__ = ["Scheduler", "SCHEDULERS", "ALIASES", "PAPER_NAMES", "get_scheduler", "scheduler_names",
           "canonical_name", "schedulers_table", "register_scheduler"]

@dataclass(frozen=True)
class Scheduler:
    """One scheduler: its planner or baseline, its executor (``"module:Class"``) and capabilities.

    ``planner``: None for baselines that execute no plan of ours; ``planner_options`` and
    ``executor_options``: run options passed on by name; ``wire_dtype``: can send gradients in another
    dtype; ``online``: plans from what the run measures (needs two workers or a cost preset);
    ``needs_cost``: the planner uses a cost model; ``communicates``: False only for the one-worker
    baseline; ``update_note``: how it changes synchronous SGD's update, a format string over its
    options ("" when it does not); ``sparse_gradients``: exchanges sparse gradients as such;
    ``paper_name``: the method's name in its paper, also accepted by :func:`get_scheduler`.
    """

    name: str
    doc: str
    paper: str
    executor: str
    planner: str | None = None
    planner_options: tuple[str, ...] = ()
    family: str | None = None
    wire_dtype: bool = False
    online: bool = False
    needs_cost: bool = False
    communicates: bool = True
    executor_options: tuple[str, ...] = ()
    update_note: str = ""
    sparse_gradients: bool = False
    paper_name: str = ""

    @property
    def has_plan(self) -> bool:
        return self.planner is not None

    @property
    def changes_update(self) -> bool:
        """Whether the method changes synchronous SGD's update on purpose (top-k, ASP, SSP, OSP)."""
        return bool(self.update_note)

    def update_change(self, **options: Any) -> str:
        """``update_note`` with its options filled in ("" for a scheduler that keeps the update)."""
        return self.update_note.format(**options) if self.update_note else ""

    def executor_class(self) -> Any:
        """The runtime executor class (imports torch)."""
        return resolve(self.executor)

    def to_dict(self) -> dict[str, Any]:
        return {"doc": self.doc, "paper": self.paper, "planner": self.planner, "family": self.family,
                "executor": self.executor, "planner_options": list(self.planner_options),
                "executor_options": list(self.executor_options), "paper_name": self.paper_name or None,
                "supports": {"wire_dtype": self.wire_dtype, "online_planning": self.online,
                             "needs_cost_model": self.needs_cost, "sparse_gradients": self.sparse_gradients}}


#: every registered scheduler by name (filled by the family packages: :mod:`repro.core.registry`)
SCHEDULERS: Registry[Scheduler] = Registry("scheduler")

# Older names, accepted with a DeprecationWarning.
ALIASES = {"ddp_plan": "ddp_threshold"}


class _PaperNames(Mapping[str, str]):
    """Paper name -> scheduler name (``Scheduler.paper_name``), read from the registry when asked."""

    def _table(self) -> dict[str, str]:
        return {s.paper_name: s.name for s in SCHEDULERS.values() if s.paper_name}

    def __getitem__(self, name: str) -> str:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


PAPER_NAMES: Mapping[str, str] = _PaperNames()


def register_scheduler(scheduler: Scheduler, *, replace: bool = False) -> Scheduler:
    """Add ``scheduler`` to the registry; its paper name must not be another scheduler's name."""
    if not isinstance(scheduler, Scheduler):
        raise TypeError(f"register_scheduler takes a Scheduler, got {type(scheduler).__name__}")
    if scheduler.paper_name and scheduler.paper_name in SCHEDULERS.entries:
        raise ValueError(f"paper name '{scheduler.paper_name}' of scheduler '{scheduler.name}' is a scheduler's name")
    return SCHEDULERS.add(scheduler.name, scheduler, replace=replace)


def scheduler_names() -> list[str]:
    return list(SCHEDULERS)


def get_scheduler(name: str) -> Scheduler:
    """The entry for a scheduler's name, a paper name (:data:`PAPER_NAMES`) or an old alias (with a
    DeprecationWarning)."""
    if isinstance(name, str) and name in PAPER_NAMES:
        return SCHEDULERS[PAPER_NAMES[name]]
    if isinstance(name, str) and name in ALIASES:
        new = ALIASES[name]
        warnings.warn(f"scheduler '{name}' is now called '{new}'", DeprecationWarning, stacklevel=2)
        name = new
    try:
        return SCHEDULERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}") from None


def canonical_name(name: str) -> str:
    """``name`` with old aliases and paper names replaced by the scheduler's name (no warning)."""
    return PAPER_NAMES.get(name, ALIASES.get(name, name))


def schedulers_table() -> dict[str, dict[str, Any]]:
    """Every scheduler as JSON-ready dicts (what ``repro schedulers`` prints)."""
    return {name: s.to_dict() for name, s in SCHEDULERS.items()}
