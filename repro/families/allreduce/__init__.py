"""The all-reduce family (MG-WFBP and its baselines): each bucket is all-reduced once its gradients are ready.

Registers, on import: the family (:class:`~repro.core.families.Family`), its planners (:mod:`.planners`), its
schedulers and its run options. Its simulator is :mod:`.simulate`, its executor :mod:`.executor` (torch).
"""

from __future__ import annotations

from typing import Any, Mapping

from repro.core import ranges
from repro.core.families import Family, choice_option, number_option, register_family
from repro.core.planners import register_planner
from repro.core.run_options import RunOption, integer_check, register_group_check, register_run_option
from repro.core.schedulers import Scheduler, register_scheduler
from repro.families.allreduce import planners

MGWFBP = "MG-WFBP (Shi, Chu, Li; INFOCOM 2019 / TPDS 2021)"
DDP = "PyTorch DDP (Li et al., VLDB 2020)"
EXECUTOR = "repro.families.allreduce.executor:AllReduceExecutor"
WIRE_DTYPE = choice_option("wire_dtype", "dtype of gradients on the wire", ("float32", "float16", "bfloat16"))

register_family(Family(
    name="allreduce",
    doc="each bucket is all-reduced once its gradients are ready during backward (one FCFS "
        "communication stream; priorities, if set, reorder ready buckets)",
    paper=MGWFBP,
    collectives=("allreduce",),
    phases=("backward",),
    options=(WIRE_DTYPE,
             number_option("cycle_s", "Horovod-style cycle time: messages are launched only at the ticks of a "
                           "background loop waking every cycle_s seconds", minimum=0.0, open_minimum=True,
                           maximum=ranges.SECONDS.high)),
    simulator="repro.families.allreduce.simulate:build_graph",
    closed_form="repro.families.allreduce.simulate:closed_form",
    check_buckets="repro.families.allreduce.simulate:check_buckets",
    executor=EXECUTOR,
    calibrate="repro.families.allreduce.executor:calibrate",
    executor_options=("engine",),
))

for _name in ("wfbp", "syncea", "threshold", "ddp_buckets", "horovod", "mgwfbp", "optimal"):
    register_planner(_name, getattr(planners, _name))


def _scheduler(name: str, doc: str, paper: str = MGWFBP, **kw: Any) -> Scheduler:
    planner = kw.pop("planner", name)
    return Scheduler(name, doc, paper, EXECUTOR, planner=planner, family="allreduce", wire_dtype=True,
                     executor_options=("engine",), **kw)


for _s in (
    _scheduler("wfbp", "wait-free backpropagation: one all-reduce per layer as soon as its gradient is ready",
               "WFBP (Zhang et al., Poseidon, USENIX ATC 2017), as the MG-WFBP papers' baseline"),
    _scheduler("syncea", "SyncEASGD: one all-reduce of all gradients after backward",
               "SyncEASGD (Zhang et al. 2015), as the MG-WFBP papers' baseline"),
    _scheduler("threshold", "greedy fusion in backward order: a bucket closes at --threshold-bytes "
               "(Horovod tensor fusion style)", "Horovod tensor fusion (Sergeev & Del Balso 2018)",
               planner_options=("threshold_bytes",)),
    _scheduler("ddp_buckets", "PyTorch DDP's default bucketing (1 MiB, then 25 MiB) as a plan, run on "
               "this package's executor", DDP),
    _scheduler("mgwfbp", "the published MG-WFBP merge rule, planned online from the measured trace and "
               "a cost model fitted on the live group", online=True, needs_cost=True),
    _scheduler("optimal", "exact optimum over contiguous bucketings (dynamic program), planned online",
               "this package (exact optimum of the MG-WFBP model)", online=True, needs_cost=True),
    _scheduler("horovod", "Horovod-style tensor fusion: a background loop wakes every 5 ms and fuses the "
               "gradients ready since its last tick into buckets of at most 64 MiB, planned from the measured "
               "trace", "Horovod tensor fusion (Sergeev & Del Balso 2018), as the DeAR paper's baseline"),
):
    register_scheduler(_s)

register_run_option(RunOption(
    "threshold_bytes", int, "bucket threshold of the threshold schedulers (threshold, dear_threshold, "
    "dear_bo's first trial)", "allreduce", default=25 * 2**20, unit="bytes",
    check=integer_check("threshold_bytes", 0, "a non-negative number of bytes"), quantity=ranges.BYTES))
register_run_option(RunOption(
    "engine", str, "all-reduce plans: what runs the buckets: reducer (PyTorch's C++ reducer, DDP's "
    "engine, given the plan's exact buckets), hooks (this package's Python gradient hooks: wire dtypes, "
    "Horovod's cycle time, GPUs) or auto (the reducer wherever it can run the plan; the default)",
    "allreduce", choices=("auto", "reducer", "hooks")))


def reducer_engine_refusal(values: Mapping[str, Any]) -> str | None:
    """Why ``engine='reducer'`` cannot run with these settings (a wire dtype, a GPU), in one sentence,
    or None; the same words for ``repro train``'s check and :func:`repro.distribute`."""
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
