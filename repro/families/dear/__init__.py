"""The DeAR family: reduce-scatter in backward, all-gather in the next forward (decoupled all-reduce).

Registers, on import: the family, its planners (:mod:`.planners`), schedulers and the tuner's run options.
Simulator :mod:`.simulate`, executor :mod:`.executor` and the live Bayesian-optimisation tuner :mod:`.tuner`
(torch).
"""

from __future__ import annotations

from typing import Any, Mapping

from repro.core import ranges
from repro.core.families import Family, register_family
from repro.core.planners import register_planner
from repro.core.run_options import RunOption, integer_check, register_group_check, register_run_option
from repro.core.schedulers import Scheduler, register_scheduler
from repro.families.dear import planners

DEAR = "DeAR (Zhang et al.; ICDCS 2023)"
EXECUTOR = "repro.families.dear.executor:DeARExecutor"

register_family(Family(
    name="dear",
    doc="decoupled all-reduce: buckets are contiguous runs of layers in forward order; each bucket's "
        "reduce-scatter runs in backward once its gradients are ready, its all-gather in the next "
        "iteration's forward just before its layers run (after which its parameters are updated); one "
        "FCFS communication stream",
    paper=DEAR,
    collectives=("reduce_scatter", "allgather"),
    phases=("backward", "next_forward"),
    options=(),
    simulator="repro.families.dear.simulate:build_graph",
    closed_form="repro.families.dear.simulate:closed_form",
    check_buckets="repro.families.dear.simulate:check_buckets",
    executor=EXECUTOR,
    calibrate="repro.families.dear.executor:calibrate",
    gloo_cpu_only="its reduce-scatter and all-gather run on gloo as a ring of CPU tensors",
))

for _name in ("dear_nofusion", "dear_threshold", "dear_model", "dear_optimal"):
    register_planner(_name, getattr(planners, _name))

# "dear" (the paper's name) is dear_threshold: the authors' released code runs threshold fusion (25 MB) by
# default; dear_bo is the tuned variant, dear_nofusion the paper's "DeAR w/o TF".
for _s in (
    Scheduler("dear_threshold", "DeAR: reduce-scatter in backward, all-gather in the next forward, buckets of "
              "consecutive layers below --threshold-bytes (25 MiB by default)", DEAR, EXECUTOR,
              planner="dear_threshold", planner_options=("threshold_bytes",), family="dear", paper_name="dear"),
    Scheduler("dear_nofusion", "DeAR without tensor fusion: one layer per bucket", DEAR, EXECUTOR,
              planner="dear_nofusion", family="dear"),
    Scheduler("dear_model", "DeAR with the buffer size the simulator predicts best (exact over every bucketing "
              "of the threshold rule), planned online from the measured trace and reduce-scatter / all-gather "
              "lines fitted on the live group", "this package (model-based DeAR tensor fusion)", EXECUTOR,
              planner="dear_model", family="dear", online=True, needs_cost=True),
    Scheduler("dear_optimal", "DeAR with the exact optimum of its model over every contiguous bucketing (dynamic "
              "program), planned online from the measured trace and reduce-scatter / all-gather lines fitted on "
              "the live group", "this package (exact optimum of the DeAR model)", EXECUTOR,
              planner="dear_optimal", family="dear", online=True, needs_cost=True),
    Scheduler("dear_bo", "DeAR whose buffer size is tuned live by Bayesian optimisation (Gaussian process, expected "
              "improvement, 1-256 MiB, over measured iteration times; rank 0 decides and broadcasts, buckets are "
              "regrouped between trials without losing a gradient or an update)", DEAR,
              "repro.families.dear.tuner:DeARTunedExecutor", planner="dear_threshold",
              planner_options=("threshold_bytes",), family="dear",
              executor_options=("tuner_trials", "tuner_min_bytes", "tuner_max_bytes", "seed")),
):
    register_scheduler(_s)

register_run_option(RunOption(
    "tuner_trials", int, "dear_bo: Bayesian-optimisation trials after the initial threshold", "dear",
    default=10, check=integer_check("tuner_trials", 0, "a non-negative integer"), quantity=ranges.TRIALS))
register_run_option(RunOption(
    "tuner_min_bytes", int, "dear_bo: smallest fusion threshold the tuner tries", "dear",
    default=2**20, unit="bytes", check=integer_check("tuner_min_bytes", 1, "a positive number of bytes"),
    quantity=ranges.BYTES))
register_run_option(RunOption(
    "tuner_max_bytes", int, "dear_bo: largest fusion threshold the tuner tries", "dear",
    default=2**28, unit="bytes", check=integer_check("tuner_max_bytes", 1, "a positive number of bytes"),
    quantity=ranges.BYTES))


def _tuner_range(values: Mapping[str, Any]) -> None:
    low, high = values.get("tuner_min_bytes"), values.get("tuner_max_bytes")
    if low is not None and high is not None and not low < high:
        raise ValueError(f"the tuner's range needs 1 <= tuner_min_bytes < tuner_max_bytes, got {low} and {high}")


register_group_check(_tuner_range)
