"""The family registry: what each kind of gradient exchange needs from the shared code.

A **family** is a way of moving gradients: all-reduce during backward (MG-WFBP and its baselines),
and the families later schedulers add (sparse all-gather, reduce-scatter + all-gather across
iterations, a parameter server). A family is one :class:`Family` entry in :data:`FAMILIES`; the shared
code (:class:`~repro.core.plan.Plan`, :func:`repro.core.simulate.simulate`, the training loop) consults the entry and
never compares family names. An entry supplies:

- **plan validation**: the collectives and phases its messages may use, its options (name, meaning,
  check), an optional structural check of the buckets and an optional check of the whole plan (its
  options against its buckets);
- **bytes on the wire** per message (default: every message carries its bucket's gradient bytes);
- **the simulator's task builder**: ``fn(trace, plan, cost) -> SimGraph`` for the event engine, and
  optionally a closed form ``fn(trace, plan, cost) -> SimResult | None`` used when no timeline is
  asked for;
- **the runtime executor**: a class implementing :class:`repro.runtime.executor.Executor`;
- **calibration** (optional): ``fn(trace, device, repeats, network_cost, **planner_options) ->
  CostModel``, called on every rank of a live run before planning, returns what the family's planners
  need (a fitted line of its collective, the top-k cost, ...); ``network_cost`` is the ``--network``
  preset's model or None (then fit on the live group);
- **serving ranks** (optional, the parameter server): ``fn(ctx, cfg, model, optimizer, plan) -> dict``
  run by the first ``cfg.servers`` ranks instead of the training loop, with the model and optimizer in
  the state the trainers reached at the end of the warm-up; the other ranks train (their
  collectives go over a process group of the training ranks only) and the executor talks to the
  servers. The dict holds tidy tables the servers recorded (name -> rows), written with the run.
- **CUDA tensors over gloo** (``gloo_cpu_only``): why its executor cannot run a CUDA model on the gloo
  backend, or None when it can; ``repro train``'s config check and :func:`repro.distribute` refuse such
  a run in one line before any collective.

Hooks are ``"module:attribute"`` strings imported on first use, so this table (and the torch-free
core) never imports torch, and a family's files are loaded only when a plan of that family is used.

Adding a family: write ``planners/<f>.py``, ``sim/<f>.py`` and ``runtime/<f>.py``, then add one entry
here (or call :func:`register_family` from your own package) and one per scheduler in
:mod:`repro.core.schedulers`. Nothing else is edited.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from repro.core import ranges
from repro.core.errors import PlanError

__all__ = ["Option", "Family", "FAMILIES", "get_family", "family_names", "register_family", "resolve",
           "choice_option", "number_option"]


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
    """One family's contract with the shared code (see the module docstring)."""

    name: str
    doc: str
    paper: str
    collectives: tuple[str, ...]
    phases: tuple[str, ...]
    options: tuple[Option, ...]
    simulator: str                       # "module:fn", fn(trace, plan, cost) -> repro.core.simulate.SimGraph
    executor: str                        # "module:Class" implementing repro.runtime.executor.Executor
    closed_form: str | None = None       # "module:fn", fn(trace, plan, cost) -> SimResult | None
    message_bytes: str | None = None     # "module:fn", fn(trace, plan) -> [[bytes per message] per bucket]
    check_buckets: str | None = None     # "module:fn", fn(buckets) raising ValueError on a bad shape
    check_plan: str | None = None        # "module:fn", fn(plan) raising ValueError across options and buckets
    calibrate: str | None = None         # "module:fn", fn(trace, device, repeats, network_cost, **options) -> CostModel
    server: str | None = None            # "module:fn", fn(ctx, cfg, model, optimizer, plan) -> dict: serving ranks
    executor_options: tuple[str, ...] = ()  # run options (repro.core.run_options) its executor takes as keywords
    gloo_cpu_only: str | None = None     # why its executor on gloo cannot take CUDA tensors (None: it can)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def hook(self, which: str) -> Callable[..., Any] | None:
        ref = getattr(self, which)
        if ref is None:
            return None
        if which not in self._cache:
            self._cache[which] = resolve(ref)
        return self._cache[which]

    # ---- plan validation (called by Plan) ----
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

    # ---- bytes, simulation, execution ----
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
        """The cost model for planning this family on the live group (see the module docstring);
        without a calibration hook, ``network_cost`` (which must then be given)."""
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


_WIRE_DTYPE = choice_option("wire_dtype", "dtype of gradients on the wire",
                            ("float32", "float16", "bfloat16"))

FAMILIES: dict[str, Family] = {
    "allreduce": Family(
        name="allreduce",
        doc="each bucket is all-reduced once its gradients are ready during backward (one FCFS "
            "communication stream; priorities, if set, reorder ready buckets)",
        paper="MG-WFBP (Shi, Chu, Li; INFOCOM 2019 / TPDS 2021)",
        collectives=("allreduce",),
        phases=("backward",),
        options=(_WIRE_DTYPE,
                 number_option("cycle_s", "Horovod-style cycle time: messages are launched only at the ticks of a "
                               "background loop waking every cycle_s seconds", minimum=0.0, open_minimum=True,
                               maximum=ranges.SECONDS.high)),
        simulator="repro.families.allreduce.simulate:build_graph",
        closed_form="repro.families.allreduce.simulate:closed_form",
        check_buckets="repro.families.allreduce.simulate:check_buckets",
        executor="repro.families.allreduce.executor:AllReduceExecutor",
        calibrate="repro.families.allreduce.executor:calibrate",
        executor_options=("engine",),
    ),
    "sparse": Family(
        name="sparse",
        doc="top-k sparsified gradients with error feedback: when a bucket's gradients are ready, its "
            "top-k (k = ceil(density x elements)) is selected on the compute stream, then values and "
            "indices are all-gathered (two messages, or one packed message) on one FCFS communication "
            "stream; every worker sums the P sparse contributions and divides by P",
        paper="OMGS-SGD (Shi et al.; INFOCOM 2020)",
        collectives=("sparse_allgather",),
        phases=("backward",),
        options=(number_option("density", "fraction of each bucket's elements sent (k = ceil(density x n))",
                               minimum=0.0, open_minimum=True, maximum=1.0, required=True),
                 choice_option("topk_scope", "bucket: every bucket sends its own ceil(density x n) largest entries "
                               "(OMGS-SGD as published); model: the same total, split between the buckets each step "
                               "by where the model's largest entries were the step before (TopK-SGD's selection, one "
                               "step late)", ("bucket", "model"), default="bucket")),  # repro.families.sparse.simulate.TOPK_SCOPES
        simulator="repro.families.sparse.simulate:build_graph",
        closed_form="repro.families.sparse.simulate:closed_form",
        message_bytes="repro.families.sparse.simulate:message_bytes",
        check_buckets="repro.families.sparse.simulate:check_buckets",
        executor="repro.families.sparse.executor:SparseExecutor",
        calibrate="repro.families.sparse.executor:calibrate",
    ),
    "dear": Family(
        name="dear",
        doc="decoupled all-reduce: buckets are contiguous runs of layers in forward order; each bucket's "
            "reduce-scatter runs in backward once its gradients are ready, its all-gather in the next "
            "iteration's forward just before its layers run (after which its parameters are updated); one "
            "FCFS communication stream",
        paper="DeAR (Zhang et al.; ICDCS 2023)",
        collectives=("reduce_scatter", "allgather"),
        phases=("backward", "next_forward"),
        options=(),
        simulator="repro.families.dear.simulate:build_graph",
        closed_form="repro.families.dear.simulate:closed_form",
        check_buckets="repro.families.dear.simulate:check_buckets",
        executor="repro.families.dear.executor:DeARExecutor",
        calibrate="repro.families.dear.executor:calibrate",
        gloo_cpu_only="its reduce-scatter and all-gather run on gloo as a ring of CPU tensors",
    ),
    "bytescheduler": Family(
        name="bytescheduler",
        doc="priority scheduling of all-reduce chunks (a layer, or a piece of one) across iterations: the free "
            "communication stream starts the most urgent ready chunk (input-side layers first); a layer's "
            "update is applied once its chunks are reduced and the next forward of a layer waits only for it",
        paper="ByteScheduler (Peng et al.; SOSP 2019), as the DeAR paper's baseline",
        collectives=("allreduce",),
        phases=("backward",),
        options=(number_option("credit_bytes", "bytes of chunks in flight at most (the runtime's credit; the "
                               "simulator serves one chunk at a time)", minimum=1, integer=True,
                               maximum=ranges.BYTES.high),),
        simulator="repro.families.bytescheduler.simulate:build_graph",
        check_buckets="repro.families.bytescheduler.simulate:check_buckets",
        executor="repro.families.bytescheduler.executor:ByteSchedulerExecutor",
        calibrate="repro.families.allreduce.executor:calibrate",
    ),
}


def _required(option: Option) -> Option:
    from dataclasses import replace

    return replace(option, required=True)


def _flag_option(name: str, doc: str, default: bool) -> Option:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise ValueError(f"must be true or false, got {v!r}")
        return v

    return Option(name, doc, check, default)


def _servers_of_buckets(v: Any) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                   for s in v):
        raise ValueError(f"must be a list of server indices (integers >= 0), one per bucket, got {v!r}")
    return tuple(v)


FAMILIES["ps"] = Family(
    name="ps",
    doc="parameter server: S server ranks hold the parameters (layers balanced by bytes); every worker pushes "
        "each bucket's gradients to its server and pulls the new values; the server applies the optimizer. "
        "Stage-1 buckets (phase backward) block the next iteration, stage-2 buckets (phase background, OSP only) "
        "overlap with it",
    paper="OSP (2-stage synchronization with LGP), this package's reading of its abstract (docs/interpretations.md); BSP, "
          "ASP and SSP (Ho et al., NeurIPS 2013) as its baselines",
    collectives=("push", "pull"),
    phases=("backward", "background"),
    options=(_required(choice_option("mode", "how the servers synchronise the workers", ("bsp", "asp", "ssp", "osp"))),
             number_option("servers", "parameter-server ranks (ranks 0..servers-1 serve)", minimum=1, integer=True,
                           maximum=ranges.WORKERS.high, required=True),
             number_option("staleness", "SSP: iterations a worker may run ahead of the slowest", minimum=0,
                           integer=True, maximum=ranges.COUNT.high, default=0),
             _flag_option("lgp", "OSP: correct stale stage-2 parameters with the local gradient, w - lr * g", True),
             Option("bucket_servers", "the server of each bucket", _servers_of_buckets, required=True)),
    simulator="repro.families.ps.simulate:build_graph",
    check_buckets="repro.families.ps.simulate:check_buckets",
    check_plan="repro.families.ps.simulate:plan_layout",
    executor="repro.families.ps.executor:PSExecutor",
    calibrate="repro.families.ps.executor:calibrate",
    server="repro.families.ps.executor:serve",
    gloo_cpu_only="gloo's reduce and gather (its co-located pushes) and send/recv (its dedicated servers') read "
                  "CUDA memory as host memory (an H200 run failed with 'writev: Bad address')",
)


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
    if family.name in FAMILIES and not replace:
        raise ValueError(f"family '{family.name}' is already registered")
    FAMILIES[family.name] = family
    return family
