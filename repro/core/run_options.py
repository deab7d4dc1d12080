"""Each family's run options, declared once: name, type, default, unit, help and check.

A *run option* is what a user sets for one scheduler beyond the common settings: ``threshold_bytes``
of the threshold planners, ``density`` of the sparse family, ``servers`` of the parameter server, the
DeAR tuner's range... Schedulers (:mod:`repro.core.schedulers`) list the ones they take in
``planner_options`` / ``executor_options``; everything else derives from the declarations here:

* the fields of :class:`repro.training.config.TrainConfig` (and so ``repro train``'s flags and their help);
* the checks of :func:`repro.distribute`'s keyword options;
* the one-line errors, the same wherever a value comes from.

An option with ``default=None`` means "the planner's own default" and is refused for a scheduler that
does not take it (never silently ignored); an option with a value by default is simply not used by the
schedulers that do not take it. A family added from another package declares its options with
:func:`register_run_option` before :mod:`repro.training.config` is imported (its flags then exist).

Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from repro.core import ranges
from repro.core.ranges import Quantity

__all__ = ["RunOption", "RUN_OPTIONS", "register_run_option", "register_group_check", "check_run_options",
           "option_flag", "check_wire_dtype", "option_takers", "refuse_given_options"]


@dataclass(frozen=True)
class RunOption:
    """One run option. ``kind``: its Python type (int, float, str or bool); ``unit``: of its value
    (``bytes``, ``s``, a fraction...); ``check(value) -> value`` normalises or raises ValueError with a
    whole sentence naming the option; ``family``: who declared it (for ``repro schedulers`` and the docs)."""

    name: str
    kind: type
    help: str
    family: str
    default: Any = None
    unit: str = ""
    choices: tuple[Any, ...] = ()
    check: Callable[[Any], Any] | None = None
    #: the plausible range of a number (int or float option; every one has one, tests/test_train_flags.py)
    quantity: Quantity | None = None

    @property
    def refused_elsewhere(self) -> bool:
        """Set for a scheduler that does not take it: refused (True for options without a default)."""
        return self.default is None

    def validate(self, value: Any, spelled: str | None = None) -> Any:
        """``value`` checked (None: unset); ``spelled``: how a range error names it (default: the name)."""
        if value is None:
            return None
        if self.check is None and self.choices and (isinstance(value, (list, dict)) or value not in self.choices):
            raise ValueError(f"unknown {self.name} {value!r}; choose one of {', '.join(map(str, self.choices))}")
        value = self.check(value) if self.check is not None else value
        if self.quantity is not None:  # after the check: its own words for a wrong type or a negative value
            ranges.check(self.quantity, value, spelled or self.name, what="option")
        return value


RUN_OPTIONS: dict[str, RunOption] = {}
_GROUP_CHECKS: list[Callable[[Mapping[str, Any]], None]] = []


def register_run_option(option: RunOption, *, replace: bool = False) -> RunOption:
    """Declare ``option`` (a family from another package calls this at import)."""
    if option.name in RUN_OPTIONS and not replace:
        raise ValueError(f"run option '{option.name}' is declared already (by the {RUN_OPTIONS[option.name].family} "
                         "family)")
    RUN_OPTIONS[option.name] = option
    return option


def register_group_check(fn: Callable[[Mapping[str, Any]], None]) -> None:
    """A check across several options (``fn(values)`` raises ValueError), run after the single ones;
    ``values`` also holds the run's common settings that such a check may need (``wire_dtype``)."""
    _GROUP_CHECKS.append(fn)


def option_flag(name: str) -> str:
    """The command-line flag of option ``name`` (``--stage1-share``; a bool: ``--lgp/--no-lgp``)."""
    flag = "--" + name.replace("_", "-")
    option = RUN_OPTIONS.get(name)
    return f"{flag}/--no-{flag[2:]}" if option is not None and option.kind is bool else flag


def check_run_options(values: Mapping[str, Any], scheduler: Any, *, where: str = "",
                      settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``values`` (option name -> value, None: not set) checked for ``scheduler`` (a
    :class:`repro.core.schedulers.Scheduler`): each value by its option, options the scheduler does not take
    refused when they have no default, then the checks across options, which also see ``settings`` (the
    run's common settings, e.g. ``{"wire_dtype": "float16"}``). Returns the normalised values.
    ``where``: how the options are spelled for the user (``flag``: ``--stage1-share``; else the name)."""
    from repro.core.schedulers import get_scheduler, scheduler_names

    takes = set(scheduler.planner_options) | set(scheduler.executor_options)
    out = dict(values)
    for name, value in values.items():
        option = RUN_OPTIONS.get(name)
        if option is None:
            raise ValueError(f"unknown run option '{name}' (declared: {', '.join(sorted(RUN_OPTIONS))})")
        if value is None:
            continue
        if option.refused_elsewhere and name not in takes:
            takers = [n for n in scheduler_names() if name in get_scheduler(n).planner_options
                      + get_scheduler(n).executor_options]
            spelled = option_flag(name) if where == "flag" else name
            scope = f"--scheduler {scheduler.name}" if where == "flag" else f"scheduler {scheduler.name}"
            raise ValueError(f"{spelled} does not apply to {scope} (it applies to: {', '.join(takers)})")
        out[name] = option.validate(value, option_flag(name) if where == "flag" else name)
    for check in _GROUP_CHECKS:
        check({**(settings or {}), **out})
    return out


def option_takers(name: str) -> list[str]:
    """The schedulers that use run option ``name``: those listing it in their planner or executor options;
    an option no scheduler lists (``server_placement``) is used by every scheduler of its family."""
    from repro.core.schedulers import get_scheduler, scheduler_names

    listed = [n for n in scheduler_names() if name in get_scheduler(n).planner_options
              + get_scheduler(n).executor_options]
    if listed:
        return listed
    family = RUN_OPTIONS[name].family
    return [n for n in scheduler_names() if get_scheduler(n).family == family]


def refuse_given_options(given: Sequence[str], scheduler: Any) -> None:
    """Each run option in ``given`` (the ones the user set on the command line, defaults or not) that
    ``scheduler`` does not use is refused in one line naming the schedulers that do: an option with a
    default is otherwise silently unused there, and a user who typed it expects it to act."""
    for name in given:
        if name in RUN_OPTIONS and scheduler.name not in option_takers(name):
            raise ValueError(f"{option_flag(name)} does not apply to --scheduler {scheduler.name} (it applies to: "
                             f"{', '.join(option_takers(name))})")


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------

def _integer(name: str, minimum: int, what: str) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must be {what}, got {v!r}")
        return int(v)

    return check


def _fraction(name: str, *, open_low: bool) -> Callable[[Any], float]:
    interval = "(0, 1]" if open_low else "[0, 1]"

    def check(v: Any) -> float:
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or not (0 < v <= 1 if open_low else 0 <= v <= 1):
            extra = " (fraction of elements sent)" if name == "density" else ""
            raise ValueError(f"{name} must be a number in {interval}{extra}, got {v!r}")
        return float(v)

    return check


def _boolean(name: str) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be true or false, got {v!r}")
        return v

    return check


def _policy(v: Any) -> str:
    if v not in ("magnitude", "position"):
        raise ValueError(f"unknown importance policy {v!r}; choose magnitude or position")
    return v


def _declare(family: str, options: Sequence[RunOption]) -> None:
    for option in options:
        register_run_option(option)


# ---------------------------------------------------------------------------------------------
# The families of this package
# ---------------------------------------------------------------------------------------------

_declare("allreduce", [
    RunOption("threshold_bytes", int, "bucket threshold of the threshold schedulers (threshold, dear_threshold, "
              "dear_bo's first trial)", "allreduce", default=25 * 2**20, unit="bytes",
              check=_integer("threshold_bytes", 0, "a non-negative number of bytes"), quantity=ranges.BYTES),
    RunOption("engine", str, "all-reduce plans: what runs the buckets: reducer (PyTorch's C++ reducer, DDP's "
              "engine, given the plan's exact buckets), hooks (this package's Python gradient hooks: wire dtypes, "
              "Horovod's cycle time, GPUs) or auto (the reducer wherever it can run the plan; the default)",
              "allreduce", choices=("auto", "reducer", "hooks")),
])
_declare("sparse", [
    RunOption("density", float, "top-k density of the sparse schedulers (topk_*, omgs*): the fraction of each "
              "bucket's gradient elements a worker sends per step, k = ceil(density x elements), in (0, 1]; 1 sends "
              "everything (dense S-SGD)", "sparse", default=0.001, unit="fraction",
              check=_fraction("density", open_low=True), quantity=ranges.FRACTION),
    RunOption("topk_scope", str, "sparse schedulers: which entries the buckets send: bucket (each bucket its own "
              "ceil(density x elements), as OMGS-SGD is published; every scheduler's default) or model (this "
              "package's variant: that total split between the buckets each step by where the model's largest "
              "entries were the step before, TopK-SGD's selection)", "sparse",
              choices=("bucket", "model")),
])
_declare("dear", [
    RunOption("tuner_trials", int, "dear_bo: Bayesian-optimisation trials after the initial threshold", "dear",
              default=10, check=_integer("tuner_trials", 0, "a non-negative integer"), quantity=ranges.TRIALS),
    RunOption("tuner_min_bytes", int, "dear_bo: smallest fusion threshold the tuner tries", "dear",
              default=2**20, unit="bytes", check=_integer("tuner_min_bytes", 1, "a positive number of bytes"),
              quantity=ranges.BYTES),
    RunOption("tuner_max_bytes", int, "dear_bo: largest fusion threshold the tuner tries", "dear",
              default=2**28, unit="bytes", check=_integer("tuner_max_bytes", 1, "a positive number of bytes"),
              quantity=ranges.BYTES),
])
_declare("ps", [
    RunOption("servers", int, "parameter-server schedulers (ps_*, osp*): servers holding the parameters; "
              "dedicated placement: ranks 0..servers-1 serve and the other ranks train (default 1); "
              "colocated: server s on training rank s (default: one per rank)", "ps",
              check=_integer("servers", 1, "a positive integer"), quantity=ranges.WORKERS),
    RunOption("server_placement", str, "parameter-server schedulers (ps_*, osp*): 'dedicated' server ranks "
              "beside the trainers (gloo only), or 'colocated' on the training ranks (gloo or nccl)", "ps",
              default="dedicated", choices=("dedicated", "colocated")),
    RunOption("staleness", int, "ps_ssp: iterations a worker may run ahead of the slowest (default 2)", "ps",
              unit="iterations", check=_integer("staleness", 0, "a non-negative integer"), quantity=ranges.COUNT),
    RunOption("stage1_share", float, "osp: fraction of the gradient bytes synchronised in the blocking stage 1, "
              "in [0, 1]; the rest goes to stage 2, overlapped with the next iteration (default 0.5)", "ps",
              unit="fraction", check=_fraction("stage1_share", open_low=False), quantity=ranges.FRACTION),
    RunOption("importance", str, "osp*: which layers go to stage 1 first: position (input side first; the "
              "default) or magnitude (largest mean |gradient| in the warm-up)", "ps",
              choices=("position", "magnitude"), check=_policy),
    RunOption("lgp", bool, "osp*: correct stale stage-2 parameters with the local gradient (default on; "
              "--no-lgp: off)", "ps", check=_boolean("lgp")),
])


def _tuner_range(values: Mapping[str, Any]) -> None:
    low, high = values.get("tuner_min_bytes"), values.get("tuner_max_bytes")
    if low is not None and high is not None and not low < high:
        raise ValueError(f"the tuner's range needs 1 <= tuner_min_bytes < tuner_max_bytes, got {low} and {high}")


register_group_check(_tuner_range)


def reducer_engine_refusal(values: Mapping[str, Any]) -> str | None:
    """Why ``engine='reducer'`` cannot run with these settings (one sentence), or None: a wire dtype
    (``wire_dtype``), or a GPU (``device`` 'cuda', or ``backend`` 'nccl'), where it has not run yet. The
    same words from ``repro train``'s check and from :func:`repro.distribute`."""
    if values.get("engine") != "reducer":
        return None
    wire = values.get("wire_dtype")
    if wire:
        return (f"engine 'reducer' cannot send a wire dtype ({wire}): PyTorch's C++ reducer sends each gradient in "
                "its own dtype; use engine 'hooks' (or auto)")
    if values.get("device") == "cuda" or values.get("backend") == "nccl":
        return ("engine 'reducer' runs on the CPU only so far (it has not run on a GPU); use engine 'hooks' "
                "(or auto)")
    return None


def _reducer_engine(values: Mapping[str, Any]) -> None:
    reason = reducer_engine_refusal(values)
    if reason is not None:
        raise ValueError(reason)


register_group_check(_reducer_engine)


def check_wire_dtype(wire_dtype: str | None, scheduler: Any, gradient_dtypes: Sequence[str] = ("float32",)) -> str | None:
    """The wire dtype ``scheduler`` (a :class:`repro.core.schedulers.Scheduler`) is given, or ValueError in one
    line. ``wire_dtype``: a name of :data:`repro.core.plan.WIRE_DTYPE_BYTES`, or None (each gradient in its own
    dtype); ``gradient_dtypes``: the dtypes of the gradients exchanged (by name; ``repro train``'s models:
    float32). A scheduler that casts its messages (``Scheduler.wire_dtype``) gets ``wire_dtype`` as it is.
    Any other scheduler sends each gradient in its own dtype: it gets None when ``wire_dtype`` is that
    dtype for every gradient (nothing to cast, so float32 of a float32 model is accepted by every
    scheduler), and refuses any other. The same rule and words for :func:`repro.distribute`,
    ``repro train`` and ``repro grid check``."""
    from repro.core.plan import WIRE_DTYPE_BYTES
    from repro.core.schedulers import get_scheduler, scheduler_names

    if wire_dtype is None:
        return None
    if not isinstance(wire_dtype, str) or wire_dtype not in WIRE_DTYPE_BYTES:
        raise ValueError(f"unknown wire_dtype {wire_dtype!r}; choose one of {', '.join(WIRE_DTYPE_BYTES)} (by name)")
    if scheduler.wire_dtype:
        return wire_dtype
    own = sorted(set(gradient_dtypes))
    if own == [wire_dtype]:
        return None
    able = [n for n in scheduler_names() if get_scheduler(n).wire_dtype]
    raise ValueError(f"wire_dtype {wire_dtype} does not apply to scheduler '{scheduler.name}', which sends each "
                     f"gradient in its own dtype ({', '.join(own) or 'none'}; the schedulers that cast: "
                     f"{', '.join(able)})")
