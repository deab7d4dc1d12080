"""The family registry: what each kind of gradient exchange needs from the shared code.

A **family** is a way of moving gradients (all-reduce during backward, sparse all-gather,
reduce-scatter + all-gather across iterations, a parameter server), declared as one :class:`Family`
in :data:`FAMILIES`. The shared code (:class:`~repro.core.plan.Plan`, :func:`repro.core.simulate.simulate`,
the training loop) consults the entry and never compares family names. Its fields say what the family
supplies: plan validation (collectives, phases, options, bucket and plan checks), bytes per message,
the simulator's task builder and closed form, the runtime executor, calibration, serving ranks
(``server`` under ``repro train``, ``door_servers`` under :func:`repro.distribute`), and why its
executor cannot take CUDA tensors over gloo. Hooks are ``"module:attribute"`` strings
imported on first use, so the core never imports torch. A family registers itself with
:func:`register_family` from its package's ``__init__`` (docs/extending.md).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from repro.core.errors import PlanError
from repro.core.registry import Registry

__all__ = ["Option", "Family", "FAMILIES", "get_family", "family_names", "register_family", "resolve",
           "choice_option", "number_option", "known_collectives",
           "is_known_collective", "COLLECTIVES"]


def resolve(ref: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ValueError(f"a hook reference must look like 'package.module:attribute', got {ref!r}")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Option:
    """A family option of a plan: ``check(value)`` returns the normalised value or raises ValueError."""

    name: str
    doc: str
    check: Callable[[Any], Any]
    default: Any = None
    required: bool = False   # every plan of the family must set it

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "doc": self.doc, "default": self.default, "required": self.required}


def choice_option(name: str, doc: str, choices: Sequence[Any], default: Any = None) -> Option:
    """An option whose value is one of ``choices``."""
    allowed = tuple(choices)

    def check(v: Any) -> Any:
        if isinstance(v, (list, dict)) or v not in allowed:
            raise ValueError(f"must be one of {', '.join(map(str, allowed))}, got {v!r}")
        return v

    return Option(name, f"{doc} (one of {', '.join(map(str, allowed))})", check, default)


def number_option(name: str, doc: str, *, minimum: float | None = None, maximum: float | None = None,
                  integer: bool = False, open_minimum: bool = False, default: Any = None,
                  required: bool = False) -> Option:
    """A numeric option in [minimum, maximum] (``open_minimum``: strictly above the minimum)."""

    def check(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}")
        if integer:
            if isinstance(v, float) and not v.is_integer():
                raise ValueError(f"must be an integer, got {v!r}")
            v = int(v)
        if minimum is not None and (v <= minimum if open_minimum else v < minimum):
            raise ValueError(f"must be {'>' if open_minimum else '>='} {minimum}, got {v!r}")
        if maximum is not None and v > maximum:
            raise ValueError(f"must be <= {maximum}, got {v!r}")
        return v

    return Option(name, doc, check, default, required)


@dataclass(frozen=True)
class Family:
    """One family's contract with the shared code. Hooks are ``"module:attribute"`` strings."""

    name: str
    doc: str
    paper: str
    collectives: tuple[str, ...]
    phases: tuple[str, ...]
    options: tuple[Option, ...]
    simulator: str                       # fn(trace, plan, cost) -> repro.core.simulate.SimGraph
    executor: str                        # Class implementing repro.runtime.executor.Executor
    closed_form: str | None = None       # fn(trace, plan, cost) -> SimResult | None
    message_bytes: str | None = None     # fn(trace, plan) -> [[bytes per message] per bucket]
    check_buckets: str | None = None     # fn(buckets), ValueError on a bad shape
    check_plan: str | None = None        # fn(plan), ValueError across options and buckets
    calibrate: str | None = None         # fn(trace, device, repeats, network_cost, **options) -> CostModel
    # fn(ctx, cfg, model, optimizer, plan) -> {table name: rows}, run by the first cfg.servers ranks
    # (model and optimizer as the trainers left them after the warm-up) instead of the training loop
    server: str | None = None
    door_servers: str | None = None      # repro.runtime.serving.DoorServers: its server ranks under distribute
    executor_options: tuple[str, ...] = ()  # run options (repro.core.run_options) its executor takes
    gloo_cpu_only: str | None = None     # why its executor on gloo cannot take CUDA tensors (None: it can)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def hook(self, which: str) -> Callable[..., Any] | None:
        ref = getattr(self, which)
        if ref is None:
            return None
        if which not in self._cache:
            self._cache[which] = resolve(ref)
        return self._cache[which]

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        known = {o.name: o for o in self.options}
        out = {}
        for k, v in options.items():
            if k not in known:
                have = ", ".join(known) or "none"
                raise PlanError(f"family '{self.name}' has no option '{k}' (its options: {have})")
            if v is None:
                continue
            try:
                out[k] = known[k].check(v)
            except ValueError as e:
                raise PlanError(f"plan option '{k}' of family '{self.name}' {e}") from None
        for o in self.options:
            if o.required and o.name not in out:
                raise PlanError(f"a '{self.name}' plan needs option '{o.name}' ({o.doc})")
        return out

    def check_messages(self, buckets: Sequence[Any]) -> None:
        for i, b in enumerate(buckets):
            for m in b.messages:
                if m.collective not in self.collectives:
                    raise PlanError(f"bucket {i}: family '{self.name}' does not send '{m.collective}' messages "
                                    f"(it uses {', '.join(self.collectives)})")
                if m.phase not in self.phases:
                    raise PlanError(f"bucket {i}: family '{self.name}' has no '{m.phase}' phase "
                                    f"(it uses {', '.join(self.phases)})")
        self._run_check("check_buckets", buckets)

    def validate_plan(self, plan: Any) -> None:
        """The family's whole-plan check (its options against its buckets), if it has one."""
        self._run_check("check_plan", plan)

    def _run_check(self, which: str, arg: Any) -> None:
        """Call check hook ``which`` on ``arg``; its ValueError becomes a one-line PlanError."""
        check = self.hook(which)
        if check is None:
            return
        try:
            check(arg)
        except PlanError:
            raise
        except ValueError as e:
            raise PlanError(str(e)) from None

    def bytes_per_message(self, trace: Any, plan: Any) -> list[list[float]]:
        """Bytes of every message of every bucket, as :meth:`repro.core.cost.CostModel.time_s` takes them."""
        fn = self.hook("message_bytes")
        if fn is not None:
            return fn(trace, plan)
        return [[n] * len(b.messages) for b, n in zip(plan.buckets, plan.bucket_bytes(trace))]

    def executor_class(self) -> Any:
        """The runtime executor class (imports torch)."""
        return self.hook("executor")

    def calibrate_cost(self, trace: Any, device: Any, repeats: int, network_cost: Any = None,
                       **options: Any) -> Any:
        """The cost model for planning this family on the live group (called on every rank before
        planning; ``network_cost``: the ``--network`` preset's model or None, then fit on the live
        group). Without a calibration hook, ``network_cost``, which must then be given."""
        fn = self.hook("calibrate")
        if fn is not None:
            return fn(trace, device, repeats, network_cost, **options)
        if network_cost is None:
            raise ValueError(f"family '{self.name}' cannot fit a cost model on the live group; give a "
                             "network preset")
        return network_cost

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "doc": self.doc, "paper": self.paper, "collectives": list(self.collectives),
                "phases": list(self.phases), "options": [o.to_dict() for o in self.options],
                "simulator": self.simulator, "executor": self.executor, "calibrate": self.calibrate,
                "server": self.server, "executor_options": list(self.executor_options)}


#: the collectives every cost model can price (a family may declare more; :func:`known_collectives`)
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "sparse_allgather", "push", "pull")

#: every registered family by name (filled by the family packages: :mod:`repro.core.registry`)
FAMILIES: Registry[Family] = Registry("family")


def family_names() -> list[str]:
    return list(FAMILIES)


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise PlanError(f"unknown plan family {name!r}; known: {', '.join(FAMILIES)}") from None


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` to the registry (``replace=True`` to redefine an existing name)."""
    if not isinstance(family, Family):
        raise TypeError(f"register_family takes a Family, got {type(family).__name__}")
    return FAMILIES.add(family.name, family, replace=replace)


def is_known_collective(name: str) -> bool:
    """Whether ``name`` is a builtin collective (no family loaded) or one a registered family declares."""
    return name in COLLECTIVES or name in known_collectives()


def known_collectives() -> tuple[str, ...]:
    """Every collective a message may use: :data:`COLLECTIVES` and those the families declare."""
    return tuple(dict.fromkeys([*COLLECTIVES, *(c for f in FAMILIES.values() for c in f.collectives)]))
