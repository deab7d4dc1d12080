"""The ByteScheduler family (the DeAR paper's baseline): priority scheduling of all-reduce chunks across iterations.

Registers, on import: the family, its planner (:mod:`.planners`) and scheduler. Simulator :mod:`.simulate`,
executor :mod:`.executor` (torch).
"""

from __future__ import annotations

from repro.core import ranges
from repro.core.families import Family, number_option, register_family
from repro.core.planners import register_planner
from repro.core.schedulers import Scheduler, register_scheduler
from repro.families.bytescheduler import planners

register_family(Family(
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
))

register_planner("bytescheduler", planners.bytescheduler)
register_scheduler(Scheduler(
    "bytescheduler", "ByteScheduler-style priority scheduling: layers partitioned into chunks of at most 4M "
    "parameters, input-side chunks first, a credit bounding bytes in flight, each layer updated as its chunks "
    "complete", "ByteScheduler (Peng et al.; SOSP 2019), as the DeAR paper's baseline",
    "repro.families.bytescheduler.executor:ByteSchedulerExecutor", planner="bytescheduler", family="bytescheduler"))
