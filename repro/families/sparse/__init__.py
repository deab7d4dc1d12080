"""The sparse family (OMGS-SGD and TopK-SGD): top-k gradients with error feedback, all-gathered per bucket.

Registers, on import: the family, its planners (:mod:`.planners`), schedulers and run options. Simulator
:mod:`.simulate`, executor :mod:`.executor` (torch), top-k kernel :mod:`.topk`.
"""

from __future__ import annotations

from typing import Any

from repro.core import ranges
from repro.core.families import Family, choice_option, number_option, register_family
from repro.core.planners import register_planner
from repro.core.run_options import RunOption, fraction_check, register_run_option
from repro.core.schedulers import Scheduler, register_scheduler
from repro.families.sparse import planners

OMGS = "OMGS-SGD (Shi et al.; INFOCOM 2020)"
EXECUTOR = "repro.families.sparse.executor:SparseExecutor"
TOPK_NOTE = "top-k, density {density:g}, error feedback"

register_family(Family(
    name="sparse",
    doc="top-k sparsified gradients with error feedback: when a bucket's gradients are ready, its "
        "top-k (k = ceil(density x elements)) is selected on the compute stream, then values and "
        "indices are all-gathered (two messages, or one packed message) on one FCFS communication "
        "stream; every worker sums the P sparse contributions and divides by P",
    paper=OMGS,
    collectives=("sparse_allgather",),
    phases=("backward",),
    options=(number_option("density", "fraction of each bucket's elements sent (k = ceil(density x n))",
                           minimum=0.0, open_minimum=True, maximum=1.0, required=True),
             choice_option("topk_scope", "bucket: every bucket sends its own ceil(density x n) largest entries "
                           "(OMGS-SGD as published); model: the same total, split between the buckets each step "
                           "by where the model's largest entries were the step before (TopK-SGD's selection, one "
                           "step late)", ("bucket", "model"), default="bucket")),  # .simulate.TOPK_SCOPES
    simulator="repro.families.sparse.simulate:build_graph",
    closed_form="repro.families.sparse.simulate:closed_form",
    message_bytes="repro.families.sparse.simulate:message_bytes",
    check_buckets="repro.families.sparse.simulate:check_buckets",
    executor=EXECUTOR,
    calibrate="repro.families.sparse.executor:calibrate",
))

for _name in ("topk_layerwise", "topk_single", "omgs", "omgs_optimal"):
    register_planner(_name, getattr(planners, _name))


def _scheduler(name: str, doc: str, paper: str = OMGS, **kw: Any) -> Scheduler:
    return Scheduler(name, doc, paper, EXECUTOR, planner=name, family="sparse",
                     planner_options=("density", "topk_scope"), update_note=TOPK_NOTE, **kw)


for _s in (
    _scheduler("topk_layerwise", "top-k sparsification with error feedback, one top-k and all-gather "
               "per layer as soon as its gradient is ready (--density)",
               "layer-wise TopK-SGD, as the OMGS-SGD paper's baseline"),
    _scheduler("topk_single", "TopK-SGD: one global top-k of all gradients after backward, one "
               "all-gather of values and indices (--density)",
               "TopK-SGD (Aji & Heafield 2017; Lin et al. 2018), as the OMGS-SGD paper's baseline"),
    _scheduler("omgs", "OMGS-SGD: layers merged for top-k by the published rule, planned online from "
               "the measured trace, measured top-k times and a sparse all-gather fit on the live group",
               online=True, needs_cost=True),
    _scheduler("omgs_optimal", "exact optimum of the OMGS timeline over contiguous merges (Pareto "
               "dynamic program), planned online", "this package (exact optimum of the OMGS-SGD model)",
               online=True, needs_cost=True),
):
    register_scheduler(_s)

register_run_option(RunOption(
    "density", float, "top-k density of the sparse schedulers (topk_*, omgs*): the fraction of each "
    "bucket's gradient elements a worker sends per step, k = ceil(density x elements), in (0, 1]; 1 sends "
    "everything (dense S-SGD)", "sparse", default=0.001, unit="fraction",
    check=fraction_check("density", open_low=True), quantity=ranges.FRACTION))
register_run_option(RunOption(
    "topk_scope", str, "sparse schedulers: which entries the buckets send: bucket (each bucket its own "
    "ceil(density x elements), as OMGS-SGD is published; every scheduler's default) or model (this "
    "package's variant: that total split between the buckets each step by where the model's largest "
    "entries were the step before, TopK-SGD's selection)", "sparse", choices=("bucket", "model")))
