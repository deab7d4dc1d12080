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
from repro.core.registry import Registry, load_families

__all__ = ["RunOption", "RUN_OPTIONS", "register_run_option", "register_group_check", "check_run_options",
           "option_flag", "check_wire_dtype", "option_takers", "refuse_given_options", "integer_check",
           "fraction_check", "boolean_check"]


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


#: every declared run option by name (filled by the family packages: :mod:`repro.core.registry`)
RUN_OPTIONS: Registry[RunOption] = Registry("run option")
_GROUP_CHECKS: list[Callable[[Mapping[str, Any]], None]] = []


def register_run_option(option: RunOption, *, replace: bool = False) -> RunOption:
    """Declare ``option`` (a family from another package calls this at import)."""
    if option.name in RUN_OPTIONS.entries and not replace:
        raise ValueError(f"run option '{option.name}' is declared already (by the "
                         f"{RUN_OPTIONS.entries[option.name].family} family)")
    return RUN_OPTIONS.add(option.name, option, replace=replace)


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
    load_families()  # the families' checks across options are registered when they load
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

def integer_check(name: str, minimum: int, what: str) -> Callable[[Any], int]:
    """A check that ``name`` is an integer >= ``minimum`` (``what``: how the error describes it)."""
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must be {what}, got {v!r}")
        return int(v)

    return check


def fraction_check(name: str, *, open_low: bool) -> Callable[[Any], float]:
    """A check that ``name`` is a number in (0, 1] (``open_low``) or [0, 1]."""
    interval = "(0, 1]" if open_low else "[0, 1]"

    def check(v: Any) -> float:
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or not (0 < v <= 1 if open_low else 0 <= v <= 1):
            extra = " (fraction of elements sent)" if name == "density" else ""
            raise ValueError(f"{name} must be a number in {interval}{extra}, got {v!r}")
        return float(v)

    return check


def boolean_check(name: str) -> Callable[[Any], bool]:
    """A check that ``name`` is True or False."""
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be true or false, got {v!r}")
        return v

    return check


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
