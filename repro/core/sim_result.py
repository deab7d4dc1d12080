"""What a family's simulator hands back: a task graph for the engine, and the simulated iteration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from repro.core.engine import Op, Task

__all__ = ["SimGraph", "SimResult"]


@dataclass(frozen=True)
class SimGraph:
    """A family's task graph of one iteration (or of several, for families that overlap them).

    ``in_order_streams``: compute streams (the others are queue streams); times in seconds per
    iteration (``forward_s``/``backward_s`` include overheads; ``sparsify_s``: top-k selection on the
    compute stream). ``iteration_s`` maps the engine's ops to the iteration time (default: last end).
    """

    tasks: Sequence[Task]
    in_order_streams: frozenset[str]
    forward_s: float
    backward_s: float
    comm_s: float
    iteration_s: Callable[[list[Op]], float] | None = None
    sparsify_s: float = 0.0


@dataclass(frozen=True)
class SimResult:
    """Simulated iteration: ``iteration_s`` and the ops of its timeline (seconds from start)."""

    iteration_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    ops: list[Op] = field(default_factory=list, repr=False)
    sparsify_s: float = 0.0   # compression on the compute stream (sparse family), seconds

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.sparsify_s

    @property
    def exposed_comm_s(self) -> float:
        """Communication not hidden behind computation."""
        return max(0.0, self.iteration_s - self.compute_s)

    def to_dict(self, with_ops: bool = True) -> dict[str, object]:
        d: dict[str, object] = {"iteration_s": self.iteration_s, "forward_s": self.forward_s,
                                "backward_s": self.backward_s, "sparsify_s": self.sparsify_s,
                                "comm_s": self.comm_s, "exposed_comm_s": self.exposed_comm_s}
        if with_ops:
            d["ops"] = [op.to_dict() for op in self.ops]
        return d
