"""The parameter-server family (OSP and its baselines BSP, ASP, SSP): workers push gradients to server ranks
and pull parameters; OSP splits each iteration's traffic into a blocking and a background stage.

Registers, on import: the family, its planners (:mod:`.planners`), schedulers and run options. Simulator
:mod:`.simulate`; executor :mod:`.executor` with co-located (:mod:`.colocated`) and dedicated
(:mod:`.dedicated`) servers (torch); the layers' placement on servers :mod:`.layout`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from repro.core import ranges
from repro.core.families import Family, Option, choice_option, number_option, register_family
from repro.core.planners import register_planner
from repro.core.run_options import RunOption, boolean_check, fraction_check, integer_check, register_run_option
from repro.core.schedulers import Scheduler, register_scheduler
from repro.families.ps import planners

OSP = "OSP (2-stage synchronization with LGP), this package's reading of its abstract (docs/interpretations.md)"
EXECUTOR = "repro.families.ps.executor:PSExecutor"
OSP_NOTE = "stage-2 parameters one iteration stale, LGP-corrected"


def _flag(name: str, doc: str, default: bool) -> Option:
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


register_family(Family(
    name="ps",
    doc="parameter server: S server ranks hold the parameters (layers balanced by bytes); every worker pushes "
        "each bucket's gradients to its server and pulls the new values; the server applies the optimizer. "
        "Stage-1 buckets (phase backward) block the next iteration, stage-2 buckets (phase background, OSP only) "
        "overlap with it",
    paper=OSP + "; BSP, ASP and SSP (Ho et al., NeurIPS 2013) as its baselines",
    collectives=("push", "pull"),
    phases=("backward", "background"),
    options=(replace(choice_option("mode", "how the servers synchronise the workers", ("bsp", "asp", "ssp", "osp")),
                     required=True),
             number_option("servers", "parameter-server ranks (ranks 0..servers-1 serve)", minimum=1, integer=True,
                           maximum=ranges.WORKERS.high, required=True),
             number_option("staleness", "SSP: iterations a worker may run ahead of the slowest", minimum=0,
                           integer=True, maximum=ranges.COUNT.high, default=0),
             _flag("lgp", "OSP: correct stale stage-2 parameters with the local gradient, w - lr * g", True),
             Option("bucket_servers", "the server of each bucket", _servers_of_buckets, required=True)),
    simulator="repro.families.ps.simulate:build_graph",
    check_buckets="repro.families.ps.simulate:check_buckets",
    check_plan="repro.families.ps.simulate:plan_layout",
    executor=EXECUTOR,
    calibrate="repro.families.ps.executor:calibrate",
    server="repro.families.ps.executor:serve",
    door_servers="repro.families.ps.door:DOOR_SERVERS",
    gloo_cpu_only="gloo's reduce and gather (its co-located pushes) and send/recv (its dedicated servers') read "
                  "CUDA memory as host memory (an H200 run failed with 'writev: Bad address')",
))

for _name in ("ps_bsp", "ps_asp", "ps_ssp", "osp", "osp_auto"):
    register_planner(_name, getattr(planners, _name))

for _s in (
    Scheduler("ps_bsp", "parameter server, BSP: ranks 0..--servers-1 serve (layers balanced by bytes, the optimizer "
              "runs there); every worker pushes its gradients, the servers average all workers' and every worker "
              "pulls the new values before its next iteration", "BSP on a parameter server, as OSP's baseline",
              EXECUTOR, planner="ps_bsp", planner_options=("servers",), family="ps"),
    Scheduler("ps_asp", "parameter server, ASP: each worker's gradient is applied (scaled by 1/workers) as soon as it "
              "arrives and the worker pulls whatever is current", "ASP on a parameter server, as OSP's baseline",
              EXECUTOR, planner="ps_asp", planner_options=("servers",), family="ps",
              update_note="asynchronous: gradients of stale parameters"),
    Scheduler("ps_ssp", "parameter server, SSP: as ASP, but no worker runs more than --staleness iterations ahead of "
              "the slowest", "SSP (Ho et al., NeurIPS 2013), as OSP's baseline", EXECUTOR, planner="ps_ssp",
              planner_options=("servers", "staleness"), family="ps",
              update_note="stale parameters, at most {staleness} iterations"),
    Scheduler("osp", "OSP: the important --stage1-share of the gradient bytes (--importance) is synchronised as BSP, "
              "the rest in the background during the next iteration, its stale parameters corrected by the local "
              "gradient (LGP, --no-lgp to turn off)", OSP, EXECUTOR, planner="osp",
              planner_options=("servers", "stage1_share", "importance", "lgp"), family="ps", update_note=OSP_NOTE),
    Scheduler("osp_auto", "OSP with the automatic split: the largest stage-2 share whose traffic hides behind one "
              "computation under a cost model fitted on the live job (or --network)", OSP, EXECUTOR,
              planner="osp_auto", planner_options=("servers", "importance", "lgp"), family="ps", online=True,
              needs_cost=True, update_note=OSP_NOTE),
):
    register_scheduler(_s)


def _policy(v: Any) -> str:
    if v not in ("magnitude", "position"):
        raise ValueError(f"unknown importance policy {v!r}; choose magnitude or position")
    return v


for _o in (
    RunOption("servers", int, "parameter-server schedulers (ps_*, osp*): servers holding the parameters; "
              "dedicated placement: ranks 0..servers-1 serve and the other ranks train (default 1); "
              "colocated: server s on training rank s (default: one per rank)", "ps",
              check=integer_check("servers", 1, "a positive integer"), quantity=ranges.WORKERS),
    RunOption("server_placement", str, "parameter-server schedulers (ps_*, osp*): 'dedicated' server ranks "
              "beside the trainers (gloo only), or 'colocated' on the training ranks (gloo or nccl)", "ps",
              default="dedicated", choices=("dedicated", "colocated")),
    RunOption("staleness", int, "ps_ssp: iterations a worker may run ahead of the slowest (default 2)", "ps",
              unit="iterations", check=integer_check("staleness", 0, "a non-negative integer"), quantity=ranges.COUNT),
    RunOption("stage1_share", float, "osp: fraction of the gradient bytes synchronised in the blocking stage 1, "
              "in [0, 1]; the rest goes to stage 2, overlapped with the next iteration (default 0.5)", "ps",
              unit="fraction", check=fraction_check("stage1_share", open_low=False), quantity=ranges.FRACTION),
    RunOption("importance", str, "osp*: which layers go to stage 1 first: position (input side first; the "
              "default) or magnitude (largest mean |gradient| in the warm-up)", "ps",
              choices=("position", "magnitude"), check=_policy),
    RunOption("lgp", bool, "osp*: correct stale stage-2 parameters with the local gradient (default on; "
              "--no-lgp: off)", "ps", check=boolean_check("lgp")),
):
    register_run_option(_o)
