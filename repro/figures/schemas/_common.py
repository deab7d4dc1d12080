"""Parameter types several notebooks share: scale, cost mode, link rates, shares, densities, counts."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from repro.published_fits import COST_MODES
from repro.cluster.jobs import LAUNCHERS
from repro.presets import PRESETS
from repro.run_options import RUN_OPTIONS
from repro.figures.params import Float, Int, Name, OneOf, Str
from repro.workload.models import MODEL_NAMES

__all__ = ["SCALES", "Scale", "Launcher", "Slurm",
           "CostMode", "Preset", "Model", "LinkRate", "LinkRateOrLoopback", "Share",
           "Density", "Positive", "NonNegative", "AtLeast2", "PositiveFloat", "Bytes", "estimate_gpus"]

SCALES = ("tiny", "paper")
#: ``tiny`` or ``paper`` (each notebook says what it changes)
Scale = OneOf(SCALES)
#: how a measured notebook at ``scale="paper"`` runs the paper's grid: "" (none), local, slurm, print
#: (repro.cluster.jobs.LAUNCHERS)
Launcher = OneOf(LAUNCHERS, Str)


def _slurm(value: str) -> str:
    from repro.cluster.jobs import slurm_resources

    try:
        slurm_resources(value)  # one line: the bad item and what it should be
    except ValueError as e:
        raise ValueError(str(e).removeprefix("slurm ")) from None
    return value


#: what each SLURM job of a grid asks for: ``key=value`` items (repro.cluster.jobs.slurm_resources), "" = defaults
Slurm = Annotated[Str, AfterValidator(_slurm)]
#: ``paper`` or ``calibrated`` (repro.published_fits.COST_MODES)
CostMode = OneOf(COST_MODES)
def _preset_or_file(value: str) -> str:
    from repro.presets import is_cluster_file, is_cost_file

    if is_cluster_file(value):  # a cluster file (repro cost cluster) serves any P: checked whole here
        from repro.cluster_cost import load_cluster

        load_cluster(value)
        return value
    if value in PRESETS or is_cost_file(value):
        return value
    raise ValueError(f"unknown value {value!r}: not a preset, nor a cost file (a .json path); presets: "
                     f"{', '.join(PRESETS)}")


#: a cost-model preset name (repro.presets.PRESETS), a cost file (.json, e.g. from repro calibrate), or a
#: cluster file (.json of repro cost cluster: any P)
Preset = Annotated[Name, AfterValidator(_preset_or_file)]
#: a model repro can build and train (repro.workload.models.MODEL_NAMES)
Model = OneOf(MODEL_NAMES)


def _rate(value: str) -> str:
    from repro.cluster.netns import parse_bandwidth

    parse_bandwidth(value)  # ValueError: one line saying what a rate looks like
    return value


def _rate_or_loopback(value: str) -> str:
    return value if value in ("", "loopback") else _rate(value)


#: a tc-style link rate: ``10gbit``, ``100mbit``, ``1e9`` (bits per second)
LinkRate = Annotated[Name, AfterValidator(_rate)]
#: a tc-style link rate, or ``loopback`` (or empty: loopback) for no emulation
LinkRateOrLoopback = Annotated[Str, AfterValidator(_rate_or_loopback)]


def _run_option(name: str, base):
    """A notebook parameter checked by run option ``name``'s own check (:mod:`repro.run_options`, where
    each family declares its options once): the same rule and message as ``repro train`` and
    :func:`repro.distribute`."""
    option = RUN_OPTIONS[name]

    def check(value):
        try:
            return option.validate(value)
        except ValueError as e:  # the schema's message adds "(got value)" itself
            raise ValueError(str(e).rsplit(", got ", 1)[0]) from None

    return Annotated[base, AfterValidator(check)]


#: a fraction in [0, 1] (OSP's stage-1 share: run option ``stage1_share``)
Share = _run_option("stage1_share", Float)
#: a top-k density in (0, 1] (run option ``density``)
Density = _run_option("density", Float)
#: an integer >= 1 (steps, repeats, epochs, sizes)
Positive = Annotated[Int, Field(ge=1)]
#: an integer >= 0
NonNegative = Annotated[Int, Field(ge=0)]
#: an integer >= 2 (GPU or rank counts of collectives)
AtLeast2 = Annotated[Int, Field(ge=2)]
#: a number > 0 (learning rates)
PositiveFloat = Annotated[Float, Field(gt=0)]
#: a byte count >= 1
Bytes = Annotated[Int, Field(ge=1)]


def estimate_gpus() -> list[str]:
    """GPUs with shipped estimate traces (``<model>_b<batch>_<gpu>-estimate``): v100, k80, p102."""
    from repro.paths import shipped_traces

    return sorted({s.rsplit("_", 1)[1][: -len("-estimate")] for s in shipped_traces() if s.endswith("-estimate")})
