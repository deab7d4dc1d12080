"""The scheduler registry: every name a user types (CLI, ``repro train``, notebooks), in one table.

A **scheduler** is what a run uses to exchange gradients. It is either a plan scheduler (a planner of
:mod:`repro.core.planners` makes a :class:`~repro.core.plan.Plan` of some family, which the family's executor
runs) or a baseline that executes no plan of ours (PyTorch DDP, no communication at all). Each entry
says where it comes from and what it supports, and names its runtime executor as a lazily imported
``"module:Class"`` (this module never imports torch). The training loop (:mod:`repro.train`) reads
the entry and never compares scheduler names.

``repro schedulers`` prints the table as JSON. Adding a scheduler = one :class:`Scheduler` entry
(plus its planner, and for a new family its files; see :mod:`repro.core.families`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from repro.core.families import resolve

__all__ = ["Scheduler", "SCHEDULERS", "ALIASES", "PAPER_NAMES", "get_scheduler", "scheduler_names",
           "canonical_name", "schedulers_table"]

_MGWFBP = "MG-WFBP (Shi, Chu, Li; INFOCOM 2019 / TPDS 2021)"
_DDP = "PyTorch DDP (Li et al., VLDB 2020)"
_ALLREDUCE_EXECUTOR = "repro.families.allreduce.executor:AllReduceExecutor"
_OMGS = "OMGS-SGD (Shi et al.; INFOCOM 2020)"
_SPARSE_EXECUTOR = "repro.families.sparse.executor:SparseExecutor"
_DEAR = "DeAR (Zhang et al.; ICDCS 2023)"
_DEAR_EXECUTOR = "repro.families.dear.executor:DeARExecutor"
_OSP = "OSP (2-stage synchronization with LGP), this package's reading of its abstract (docs/interpretations.md)"
_PS_EXECUTOR = "repro.families.ps.executor:PSExecutor"


@dataclass(frozen=True)
class Scheduler:
    """One scheduler: its planner or baseline, its executor, its source and capabilities.

    ``planner``: the planner that makes its plan (None for baselines that execute no plan of ours);
    ``planner_options``: run options passed on to the planner (e.g. ``threshold_bytes``);
    ``family``: the family of its plans; ``executor``: ``"module:Class"`` of the runtime executor;
    ``wire_dtype``: can communicate gradients in another dtype (e.g. float16);
    ``online``: plans from what the run measures (warm-up trace and a cost model fitted on the live
    group), so it needs at least two workers or a cost preset; ``needs_cost``: the planner uses a
    cost model (every plan scheduler still gets one, to record a prediction);
    ``communicates``: exchanges gradients at all (False only for the one-worker baseline);
    ``executor_options``: run options (:class:`repro.train.TrainConfig` fields) passed to the executor
    as keyword arguments of the same name (e.g. the DeAR tuner's trial count and search range);
    ``update_note``: how the scheduler changes the update of synchronous SGD, "" when it does not (a
    format string over its options, e.g. ``{density}``: :meth:`changes_update`, :meth:`update_change`);
    ``sparse_gradients``: exchanges sparse gradients (``nn.Embedding(sparse=True)``) as such; the
    others fill dense buffers, and :func:`repro.distribute` refuses such a model for them;
    ``paper_name``: the method's name in its paper, which :func:`get_scheduler` also accepts as this
    scheduler (see :data:`PAPER_NAMES`).
    """

    name: str
    doc: str
    paper: str
    executor: str
    planner: str | None = None
    planner_options: tuple[str, ...] = ()
    family: str | None = None
    wire_dtype: bool = False
    online: bool = False
    needs_cost: bool = False
    communicates: bool = True
    executor_options: tuple[str, ...] = ()
    update_note: str = ""
    sparse_gradients: bool = False
    paper_name: str = ""

    @property
    def has_plan(self) -> bool:
        return self.planner is not None

    @property
    def changes_update(self) -> bool:
        """Whether the method changes synchronous SGD's update on purpose (top-k, ASP, SSP, OSP)."""
        return bool(self.update_note)

    def update_change(self, **options: Any) -> str:
        """``update_note`` with its options filled in ("" for a scheduler that keeps the update)."""
        return self.update_note.format(**options) if self.update_note else ""

    def executor_class(self) -> Any:
        """The runtime executor class (imports torch)."""
        return resolve(self.executor)

    def to_dict(self) -> dict[str, Any]:
        return {"doc": self.doc, "paper": self.paper, "planner": self.planner, "family": self.family,
                "executor": self.executor, "planner_options": list(self.planner_options),
                "executor_options": list(self.executor_options), "paper_name": self.paper_name or None,
                "supports": {"wire_dtype": self.wire_dtype, "online_planning": self.online,
                             "needs_cost_model": self.needs_cost, "sparse_gradients": self.sparse_gradients}}


def _plan_scheduler(name: str, doc: str, paper: str = _MGWFBP, **kw: Any) -> Scheduler:
    planner = kw.pop("planner", name)
    return Scheduler(name, doc, paper, _ALLREDUCE_EXECUTOR, planner=planner, family="allreduce", wire_dtype=True,
                     executor_options=("engine",), **kw)


_TOPK_NOTE = "top-k, density {density:g}, error feedback"
_OSP_NOTE = "stage-2 parameters one iteration stale, LGP-corrected"


def _sparse_scheduler(name: str, doc: str, paper: str = _OMGS, **kw: Any) -> Scheduler:
    return Scheduler(name, doc, paper, _SPARSE_EXECUTOR, planner=name, family="sparse",
                     planner_options=("density", "topk_scope"), update_note=_TOPK_NOTE, **kw)


SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (
    _plan_scheduler("wfbp", "wait-free backpropagation: one all-reduce per layer as soon as its gradient is ready",
                    "WFBP (Zhang et al., Poseidon, USENIX ATC 2017), as the MG-WFBP papers' baseline"),
    _plan_scheduler("syncea", "SyncEASGD: one all-reduce of all gradients after backward",
                    "SyncEASGD (Zhang et al. 2015), as the MG-WFBP papers' baseline"),
    _plan_scheduler("threshold", "greedy fusion in backward order: a bucket closes at --threshold-bytes "
                    "(Horovod tensor fusion style)", "Horovod tensor fusion (Sergeev & Del Balso 2018)",
                    planner_options=("threshold_bytes",)),
    _plan_scheduler("ddp_buckets", "PyTorch DDP's default bucketing (1 MiB, then 25 MiB) as a plan, run on "
                    "this package's executor", _DDP),
    _plan_scheduler("mgwfbp", "the published MG-WFBP merge rule, planned online from the measured trace and "
                    "a cost model fitted on the live group", online=True, needs_cost=True),
    _plan_scheduler("optimal", "exact optimum over contiguous bucketings (dynamic program), planned online",
                    "this package (exact optimum of the MG-WFBP model)", online=True, needs_cost=True),
    Scheduler("ddp", "PyTorch DistributedDataParallel with its defaults (real DDP, not a plan)", _DDP,
              "repro.families.baselines.executors:TorchDDPExecutor", sparse_gradients=True),
    Scheduler("ddp_threshold", "PyTorch DDP given the threshold plan's bucket sizes (bucket_cap_mb_list)",
              _DDP, "repro.families.baselines.executors:TorchDDPExecutor", planner="threshold",
              planner_options=("threshold_bytes",), family="allreduce", sparse_gradients=True),
    _sparse_scheduler("topk_layerwise", "top-k sparsification with error feedback, one top-k and all-gather "
                      "per layer as soon as its gradient is ready (--density)",
                      "layer-wise TopK-SGD, as the OMGS-SGD paper's baseline"),
    _sparse_scheduler("topk_single", "TopK-SGD: one global top-k of all gradients after backward, one "
                      "all-gather of values and indices (--density)",
                      "TopK-SGD (Aji & Heafield 2017; Lin et al. 2018), as the OMGS-SGD paper's baseline"),
    _sparse_scheduler("omgs", "OMGS-SGD: layers merged for top-k by the published rule, planned online from "
                      "the measured trace, measured top-k times and a sparse all-gather fit on the live group",
                      online=True, needs_cost=True),
    _sparse_scheduler("omgs_optimal", "exact optimum of the OMGS timeline over contiguous merges (Pareto "
                      "dynamic program), planned online", "this package (exact optimum of the OMGS-SGD model)",
                      online=True, needs_cost=True),
    _plan_scheduler("horovod", "Horovod-style tensor fusion: a background loop wakes every 5 ms and fuses the "
                    "gradients ready since its last tick into buckets of at most 64 MiB, planned from the measured "
                    "trace", "Horovod tensor fusion (Sergeev & Del Balso 2018), as the DeAR paper's baseline"),
    # "dear" is this entry: the authors' released code runs DeAR with threshold fusion by default (its
    # benchmark scripts import dopt_rsag, whose THRESHOLD is 25 MB, the same rule as ours; the Bayesian-
    # optimisation variant, dopt_rsag_bo, is commented out there): dear_bo is the tuned variant, dear_nofusion
    # the paper's "DeAR w/o TF", dear_model and dear_optimal this package's planners
    Scheduler("dear_threshold", "DeAR: reduce-scatter in backward, all-gather in the next forward, buckets of "
              "consecutive layers below --threshold-bytes (25 MiB by default)", _DEAR, _DEAR_EXECUTOR,
              planner="dear_threshold", planner_options=("threshold_bytes",), family="dear", paper_name="dear"),
    Scheduler("dear_nofusion", "DeAR without tensor fusion: one layer per bucket", _DEAR, _DEAR_EXECUTOR,
              planner="dear_nofusion", family="dear"),
    Scheduler("dear_model", "DeAR with the buffer size the simulator predicts best (exact over every bucketing "
              "of the threshold rule), planned online from the measured trace and reduce-scatter / all-gather "
              "lines fitted on the live group", "this package (model-based DeAR tensor fusion)", _DEAR_EXECUTOR,
              planner="dear_model", family="dear", online=True, needs_cost=True),
    Scheduler("dear_optimal", "DeAR with the exact optimum of its model over every contiguous bucketing (dynamic "
              "program), planned online from the measured trace and reduce-scatter / all-gather lines fitted on "
              "the live group", "this package (exact optimum of the DeAR model)", _DEAR_EXECUTOR,
              planner="dear_optimal", family="dear", online=True, needs_cost=True),
    Scheduler("dear_bo", "DeAR whose buffer size is tuned live by Bayesian optimisation (Gaussian process, expected "
              "improvement, 1-256 MiB, over measured iteration times; rank 0 decides and broadcasts, buckets are "
              "regrouped between trials without losing a gradient or an update)", _DEAR,
              "repro.families.dear.tuner:DeARTunedExecutor", planner="dear_threshold",
              planner_options=("threshold_bytes",), family="dear",
              executor_options=("tuner_trials", "tuner_min_bytes", "tuner_max_bytes", "seed")),
    Scheduler("fsdp", "PyTorch FSDP2 (fully_shard, parameters kept unsharded after forward): reduce-scatter of "
              "gradients in backward, all-gather of parameters in the next forward (real FSDP2, not a plan)",
              "PyTorch FSDP2 (Zhao et al., VLDB 2023), what a user would pick instead of DeAR today",
              "repro.families.baselines.fsdp:FSDPExecutor"),
    Scheduler("bytescheduler", "ByteScheduler-style priority scheduling: layers partitioned into chunks of at "
              "most 4M parameters, input-side chunks first, a credit bounding bytes in flight, each layer "
              "updated as its chunks complete", "ByteScheduler (Peng et al.; SOSP 2019), as the DeAR paper's "
              "baseline", "repro.families.bytescheduler.executor:ByteSchedulerExecutor", planner="bytescheduler",
              family="bytescheduler"),
    Scheduler("ps_bsp", "parameter server, BSP: ranks 0..--servers-1 serve (layers balanced by bytes, the optimizer "
              "runs there); every worker pushes its gradients, the servers average all workers' and every worker "
              "pulls the new values before its next iteration", "BSP on a parameter server, as OSP's baseline",
              _PS_EXECUTOR, planner="ps_bsp", planner_options=("servers",), family="ps"),
    Scheduler("ps_asp", "parameter server, ASP: each worker's gradient is applied (scaled by 1/workers) as soon as it "
              "arrives and the worker pulls whatever is current", "ASP on a parameter server, as OSP's baseline",
              _PS_EXECUTOR, planner="ps_asp", planner_options=("servers",), family="ps",
              update_note="asynchronous: gradients of stale parameters"),
    Scheduler("ps_ssp", "parameter server, SSP: as ASP, but no worker runs more than --staleness iterations ahead of "
              "the slowest", "SSP (Ho et al., NeurIPS 2013), as OSP's baseline", _PS_EXECUTOR, planner="ps_ssp",
              planner_options=("servers", "staleness"), family="ps",
              update_note="stale parameters, at most {staleness} iterations"),
    Scheduler("osp", "OSP: the important --stage1-share of the gradient bytes (--importance) is synchronised as BSP, "
              "the rest in the background during the next iteration, its stale parameters corrected by the local "
              "gradient (LGP, --no-lgp to turn off)", _OSP, _PS_EXECUTOR, planner="osp",
              planner_options=("servers", "stage1_share", "importance", "lgp"), family="ps",
              update_note=_OSP_NOTE),
    Scheduler("osp_auto", "OSP with the automatic split: the largest stage-2 share whose traffic hides behind one "
              "computation under a cost model fitted on the live job (or --network)", _OSP, _PS_EXECUTOR,
              planner="osp_auto", planner_options=("servers", "importance", "lgp"), family="ps", online=True,
              needs_cost=True, update_note=_OSP_NOTE),
    Scheduler("local", "no communication: one worker's computation (the baseline of speedups)",
              "-", "repro.families.baselines.executors:LocalExecutor", communicates=False, sparse_gradients=True),
)}

# Older names, accepted with a DeprecationWarning.
ALIASES = {"ddp_plan": "ddp_threshold"}

# The methods' names in their papers, where a user would type them and no scheduler has that name: each
# means the entry that runs the method as its authors released it (the entry's comment says why). Accepted
# without a warning; a scheduler's own name stays its name (results, plans and `repro schedulers` use it).
PAPER_NAMES = {s.paper_name: s.name for s in SCHEDULERS.values() if s.paper_name}
assert not set(PAPER_NAMES) & (set(SCHEDULERS) | set(ALIASES)), "a paper name must not shadow a scheduler name"


def scheduler_names() -> list[str]:
    return list(SCHEDULERS)


def get_scheduler(name: str) -> Scheduler:
    """The entry for ``name``: a scheduler's name, a paper's name for its method (:data:`PAPER_NAMES`,
    e.g. ``dear``), or an old alias (accepted with a DeprecationWarning)."""
    if isinstance(name, str) and name in PAPER_NAMES:
        return SCHEDULERS[PAPER_NAMES[name]]
    if isinstance(name, str) and name in ALIASES:
        new = ALIASES[name]
        warnings.warn(f"scheduler '{name}' is now called '{new}'", DeprecationWarning, stacklevel=2)
        name = new
    try:
        return SCHEDULERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}") from None


def canonical_name(name: str) -> str:
    """``name`` with old aliases and paper names replaced by the scheduler's name (no warning): for
    reading results written by older versions."""
    return PAPER_NAMES.get(name, ALIASES.get(name, name))


def schedulers_table() -> dict[str, dict[str, Any]]:
    """Every scheduler as JSON-ready dicts (what ``repro schedulers`` prints)."""
    return {name: s.to_dict() for name, s in SCHEDULERS.items()}
