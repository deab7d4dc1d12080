"""Each family's run options, declared once: name, type, default, unit, help and check.

A run option is what a user sets for one scheduler beyond the common settings (``threshold_bytes``,
``density``, ``servers``...). Schedulers list the ones they take; the fields of
:class:`repro.training.config.TrainConfig`, ``repro train``'s flags and :func:`repro.distribute`'s checks
derive from these declarations. An option with ``default=None`` is refused for a scheduler that does
not take it. A family from another package declares its options with :func:`register_run_option`
before :mod:`repro.training.config` is imported. Torch-free.
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
    """One run option. ``kind``: int, float, str or bool; ``check(value) -> value`` normalises or raises
    ValueError naming the option; ``family``: who declared it; ``quantity``: a number's plausible range."""

    name: str
    kind: type
    help: str
    family: str
    default: Any = None
    unit: str = ""
    choices: tuple[Any, ...] = ()
    check: Callable[[Any], Any] | None = None
    quantity: Quantity | None = None

    @property
    def refused_elsewhere(self) -> bool:
        """Refused for a scheduler that does not take it (options without a default)."""
        return self.default is None

    def validate(self, value: Any, spelled: str | None = None) -> Any:
        """``value`` checked (None: unset); ``spelled``: how a range error names it (default: the name)."""
        if value is None:
            return None
        if self.check is None and self.choices and (isinstance(value, (list, dict)) or value not in self.choices):
            raise ValueError(f"unknown {self.name} {value!r}; choose one of {', '.join(map(str, self.choices))}")
        value = self.check(value) if self.check is not None else value
        if self.quantity is not None:  # after the check, whose words for a wrong type come first
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
    """A check across options (``fn(values)`` raises ValueError; ``values`` include common settings)."""
    _GROUP_CHECKS.append(fn)


def option_flag(name: str) -> str:
    """The command-line flag of option ``name`` (``--stage1-share``; a bool: ``--lgp/--no-lgp``)."""
    flag = "--" + name.replace("_", "-")
    option = RUN_OPTIONS.get(name)
    return f"{flag}/--no-{flag[2:]}" if option is not None and option.kind is bool else flag


def check_run_options(values: Mapping[str, Any], scheduler: Any, *, where: str = "",
                      settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``values`` (name -> value, None: not set) checked and normalised for ``scheduler``: each by its
    option, options it does not take refused when they have no default, then the group checks (which
    also see ``settings``, e.g. ``{"wire_dtype": "float16"}``). ``where="flag"`` spells options as flags."""
    takes = set(scheduler.planner_options) | set(scheduler.executor_options)
    out = dict(values)
    for name, value in values.items():
        option = RUN_OPTIONS.get(name)
        if option is None:
            raise ValueError(f"unknown run option '{name}' (declared: {', '.join(sorted(RUN_OPTIONS))})")
        if value is None:
            continue
        spelled = option_flag(name) if where == "flag" else name
        if option.refused_elsewhere and name not in takes:
            scope = f"--scheduler {scheduler.name}" if where == "flag" else f"scheduler {scheduler.name}"
            takers = ", ".join(_listing(name))
            raise ValueError(f"{spelled} does not apply to {scope} (it applies to: {takers})")
        out[name] = option.validate(value, spelled)
    load_families()  # the families' checks across options are registered when they load
    for check in _GROUP_CHECKS:
        check({**(settings or {}), **out})
    return out


def _listing(name: str) -> list[str]:
    """The schedulers listing run option ``name`` in their planner or executor options."""
    from repro.core.schedulers import SCHEDULERS

    return [n for n, s in SCHEDULERS.items() if name in s.planner_options + s.executor_options]


def option_takers(name: str) -> list[str]:
    """The schedulers listing run option ``name``; if none does, every scheduler of its family."""
    from repro.core.schedulers import SCHEDULERS

    return _listing(name) or [n for n, s in SCHEDULERS.items() if s.family == RUN_OPTIONS[name].family]


def refuse_given_options(given: Sequence[str], scheduler: Any) -> None:
    """Refuse each run option in ``given`` (set on the command line) that ``scheduler`` does not use."""
    for name in given:
        if name in RUN_OPTIONS and scheduler.name not in option_takers(name):
            raise ValueError(f"{option_flag(name)} does not apply to --scheduler {scheduler.name} (it applies to: "
                             f"{', '.join(option_takers(name))})")


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
    """The wire dtype ``scheduler`` is given, or ValueError. A scheduler that casts
    (``Scheduler.wire_dtype``) gets ``wire_dtype``; any other gets None when ``wire_dtype`` is every
    gradient's own dtype (``gradient_dtypes``) and refuses it otherwise."""
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
