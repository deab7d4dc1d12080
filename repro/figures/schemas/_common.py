"""Parameter types several notebooks share: scale, cost mode, link rates, shares, densities, and the bounded
counts (workers, ranks, bytes, batch sizes, steps...) with the argument for each bound."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from repro.costs.published_fits import COST_MODES
from repro.grids.jobs import LAUNCHERS
from repro.costs.presets import PRESETS
from repro.core.run_options import RUN_OPTIONS
from repro.figures.params import Float, Int, Name, OneOf, Str
from repro.workload.models import MODEL_NAMES

__all__ = ["SCALES", "Scale", "Launcher", "Slurm", "CostMode", "Preset", "Model", "LinkRate",
           "LinkRateOrLoopback", "Share", "Density", "SimGPUs", "Ranks", "RanksFrom1", "Servers", "BatchSize",
           "Steps", "Epochs", "Repeats", "Seed", "TimingPairs", "Staleness", "Bytes", "ThresholdBytes",
           "LearningRate", "Threads", "MAX_SIM_GPUS", "MAX_RANKS", "MAX_BYTES", "MAX_BATCH", "MAX_STEPS",
           "MAX_EPOCHS", "MAX_REPEATS", "MAX_NUMEL", "MAX_SEED", "estimate_gpus"]

SCALES = ("tiny", "paper")
#: ``tiny`` or ``paper`` (each notebook says what it changes)
Scale = OneOf(SCALES)
#: how a measured notebook at ``scale="paper"`` runs the paper's grid: "" (none), local, slurm, print
#: (repro.grids.jobs.LAUNCHERS)
Launcher = OneOf(LAUNCHERS, Str)


def _slurm(value: str) -> str:
    from repro.grids.jobs import slurm_resources

    try:
        slurm_resources(value)  # one line: the bad item and what it should be
    except ValueError as e:
        raise ValueError(str(e).removeprefix("slurm ")) from None
    return value


#: what each SLURM job of a grid asks for: ``key=value`` items (repro.grids.jobs.slurm_resources), "" = defaults
Slurm = Annotated[Str, AfterValidator(_slurm)]
#: ``paper`` or ``calibrated`` (repro.costs.published_fits.COST_MODES)
CostMode = OneOf(COST_MODES)
def _preset_or_file(value: str) -> str:
    from repro.costs.presets import is_cluster_file, is_cost_file

    if is_cluster_file(value):  # a cluster file (repro cost cluster) serves any P: checked whole here
        from repro.costs.cluster_cost import load_cluster

        load_cluster(value)
        return value
    if value in PRESETS or is_cost_file(value):
        return value
    raise ValueError(f"unknown value {value!r}: not a preset, nor a cost file (a .json path); presets: "
                     f"{', '.join(PRESETS)}")


#: a cost-model preset name (repro.costs.presets.PRESETS), a cost file (.json, e.g. from repro calibrate), or a
#: cluster file (.json of repro cost cluster: any P)
Preset = Annotated[Name, AfterValidator(_preset_or_file)]
#: a model repro can build and train (repro.workload.models.MODEL_NAMES)
Model = OneOf(MODEL_NAMES)


def _rate(value: str) -> str:
    from repro.core import ranges
    from repro.launch.netns import parse_bandwidth

    bps = parse_bandwidth(value)  # ValueError: one line saying what a rate looks like (as repro train's)
    if not ranges.BITS_PER_S.contains(bps):  # 1e30gbit: no link is that fast (repro.core.ranges.BITS_PER_S)
        raise ValueError(f"rate {value!r} ({bps:.3g} bit/s) is outside the plausible range "
                         f"{ranges.BITS_PER_S.range_text()}")
    return value


def _rate_or_loopback(value: str) -> str:
    return value if value in ("", "loopback") else _rate(value)


#: a tc-style link rate: ``10gbit``, ``100mbit``, ``1e9`` (bits per second)
LinkRate = Annotated[Name, AfterValidator(_rate)]
#: a tc-style link rate, or ``loopback`` (or empty: loopback) for no emulation
LinkRateOrLoopback = Annotated[Str, AfterValidator(_rate_or_loopback)]


def _run_option(name: str, base):
    """A notebook parameter checked by run option ``name``'s own check (:mod:`repro.core.run_options`): the
    same rule and message as ``repro train``."""
    option = RUN_OPTIONS[name]

    def check(value):
        try:
            return option.validate(value)
        except ValueError as e:  # the schema's message adds "(got value)" itself
            raise ValueError(str(e).rsplit(", got ", 1)[0]) from None

    return Annotated[base, AfterValidator(check)]


# Every numeric parameter has a plausible range (tests/test_notebook_schemas.py requires one): a value
# past it is a typo or a unit slip that would otherwise fail late, inside a rank. Why each bound:

#: MG-WFBP's scaling sweep, the papers' largest simulated P, is 2048 GPUs; one more doubling
MAX_SIM_GPUS = 4096
#: the papers' largest real cluster is 64 GPUs (DeAR); each rank holds a model copy
MAX_RANKS = 128
#: BERT-Large's whole fp32 gradient (~1.34 GB) fits under 2 GiB: no bucket or message is larger
MAX_BYTES = 2**31
#: the papers' largest per-GPU batch is 128; 1e12 samples fails to allocate
MAX_BATCH = 1024
#: the notebooks time 2 to 80 steps
MAX_STEPS = 10_000
#: the papers' longest schedules are ~160 epochs (CIFAR)
MAX_EPOCHS = 300
#: repeats or trials of a measurement or search (the notebooks use 3 to 8)
MAX_REPEATS = 1000
#: BERT-Large's ~340 M parameters are under 2**29
MAX_NUMEL = 2**29
#: numpy's and torch's seeds are 32-bit
MAX_SEED = 2**32 - 1


def _bounded(lo: int, hi: int, *, base=Int):
    return Annotated[base, Field(ge=lo, le=hi)]


#: a fraction in [0, 1] (run option ``stage1_share``; ``ge``/``le`` declare the range its check enforces)
Share = Annotated[_run_option("stage1_share", Float), Field(ge=0, le=1)]
#: a top-k density in (0, 1] (run option ``density``)
Density = Annotated[_run_option("density", Float), Field(gt=0, le=1)]
#: simulated GPU (worker) counts: 2 to :data:`MAX_SIM_GPUS`
SimGPUs = _bounded(2, MAX_SIM_GPUS)
#: real ranks of a collective (all-reduce, all-gather, parameter-server workers): 2 to :data:`MAX_RANKS`
Ranks = _bounded(2, MAX_RANKS)
#: real ranks where 1 is the single-worker baseline: 1 to :data:`MAX_RANKS`
RanksFrom1 = _bounded(1, MAX_RANKS)
#: parameter-server shards: 1 to 64 (a shard per worker of the largest real cluster)
Servers = _bounded(1, 64)
#: samples per rank and step: 1 to :data:`MAX_BATCH`
BatchSize = _bounded(1, MAX_BATCH)
#: steps of a run: 1 to :data:`MAX_STEPS`
Steps = _bounded(1, MAX_STEPS)
#: epochs of a convergence run: 1 to :data:`MAX_EPOCHS`
Epochs = _bounded(1, MAX_EPOCHS)
#: repeats, trials or iterations of a measurement, search or drawn timeline: 1 to :data:`MAX_REPEATS`
Repeats = _bounded(1, MAX_REPEATS)
#: interleaved pairs of a timing comparison: 2 (the fewest a ratio's spread needs) to :data:`MAX_REPEATS`
TimingPairs = _bounded(2, MAX_REPEATS)
#: a seed: 0 to :data:`MAX_SEED`
Seed = _bounded(0, MAX_SEED)
#: SSP's staleness bound, iterations: 0 to 100 (the papers use single digits)
Staleness = _bounded(0, 100)
#: a byte count (message size, bucket threshold): 1 to :data:`MAX_BYTES`
Bytes = _bounded(1, MAX_BYTES)
#: a bucket threshold where 0 means "no merging": 0 to :data:`MAX_BYTES`
ThresholdBytes = _bounded(0, MAX_BYTES)
#: a learning rate in (0, 100] (the PTB LSTM recipe starts at 20)
LearningRate = Annotated[Float, Field(gt=0, le=100)]
#: torch CPU threads: 1 to 256 (more than any CPU node's cores)
Threads = _bounded(1, 256)


def estimate_gpus() -> list[str]:
    """GPUs with shipped estimate traces (``<model>_b<batch>_<gpu>-estimate``): v100, k80, p102."""
    from repro.core.paths import shipped_traces

    return sorted({s.rsplit("_", 1)[1][: -len("-estimate")] for s in shipped_traces() if s.endswith("-estimate")})
