"""One comparison of every scheduler on one trace and one cost model: ``repro compare`` and the
``compare_schedulers`` notebook (:mod:`repro.studies.compare`) both call :func:`predict` with the
defaults below, so both give the same predicted time for the same trace, network and P.

For each scheduler of the registry, in its order, :func:`predict` plans
(:func:`repro.core.planners.make_plan`) and simulates one iteration; a scheduler that cannot be planned
gets a note saying why. Defaults:

- cost mode :data:`DEFAULT_COST_MODE`: a network preset becomes the cluster calibrated on the published
  measurements (:func:`repro.costs.published_fits.cost_for_mode`); ``"paper"``: its published lines;
- servers: one per node the job uses, else ``ceil(P / 4)`` (:func:`default_servers`);
- options :data:`DEFAULT_OPTIONS`, each passed only to the planners that take it; exact planners get
  ``time_budget_s`` (seconds);
- top-k cost ``gamma * d * log2(d)`` seconds: ``gamma`` as given, else the cost model's, else
  :data:`TOPK_GAMMA_S` (OMGS-SGD's published fit, the only one published).

Never imports torch."""

from __future__ import annotations

import csv
import inspect
import io
import logging
import math
import time
from typing import Any, Mapping, Sequence

from dataclasses import replace

from repro.core.text import text_table
from repro.core.cost import CostModel
from repro.core.families import get_family
from repro.core.planners import PLANNER_FAMILY, PLANNERS, make_plan
from repro.core.budget import DEFAULT_TIME_BUDGET_S, check_time_budget
from repro.costs.presets import PRESETS
from repro.costs.published_fits import DEVICES_PER_NODE, check_cost_mode, cost_for_mode
from repro.core.schedulers import SCHEDULERS
from repro.core.trace import Trace

log = logging.getLogger(__name__)

__all__ = ["BASELINE", "FIELDS", "DEFAULT_COST_MODE", "DEFAULT_DENSITY", "DEFAULT_STALENESS", "DEFAULT_STAGE1_SHARE",
           "DEFAULT_IMPORTANCE", "DEFAULT_OPTIONS", "TOPK_GAMMA_S", "TOPK_GAMMA_SOURCE", "network_cost",
           "default_servers", "with_topk", "predict", "compare", "planner_options", "format_table", "format_csv"]

BASELINE = "syncea"
FIELDS = ("scheduler", "family", "planner", "iteration_s", "buckets", "speedup_over_syncea",
          "throughput_samples_per_s", "plan_wall_s", "note")

DEFAULT_COST_MODE = "calibrated"
DEFAULT_DENSITY = 0.001        # OMGS-SGD's density for the CNNs
DEFAULT_STALENESS = 2          # SSP's bound, iterations
DEFAULT_STAGE1_SHARE = 0.5     # OSP's blocking share of the gradient bytes
DEFAULT_IMPORTANCE = "position"  # OSP's importance: the estimate traces hold no gradient magnitudes
DEFAULT_OPTIONS: dict[str, Any] = {"density": DEFAULT_DENSITY, "staleness": DEFAULT_STALENESS,
                                   "stage1_share": DEFAULT_STAGE1_SHARE, "importance": DEFAULT_IMPORTANCE}
TOPK_GAMMA_S: float = float(PRESETS["1gbe-allgather"].topk_gamma_s)  # type: ignore[union-attr, arg-type]
TOPK_GAMMA_SOURCE = (f"top-k gamma {TOPK_GAMMA_S:g} s: OMGS-SGD's published fit (P102-100 GPU, density 0.001; "
                     "preset 1gbe-allgather)")


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def network_cost(network: str, workers: int, cost_mode: str = DEFAULT_COST_MODE) -> CostModel:
    """The cost model of network preset ``network`` at ``workers`` under ``cost_mode`` (module docstring)."""
    return cost_for_mode(network, workers, check_cost_mode(cost_mode))


def default_servers(cost: CostModel) -> int:
    """Parameter servers by default: one per node the job uses (``nodes_used`` in the cost model's meta), else
    ``ceil(P / DEVICES_PER_NODE)``."""
    nodes = (cost.meta.get("cluster") or {}).get("nodes_used") or cost.meta.get("nodes_used")
    return int(nodes) if nodes else max(1, -(-int(cost.workers) // DEVICES_PER_NODE))


def with_topk(cost: CostModel, topk_gamma_s: float | None = None, source: str | None = None) -> CostModel:
    """``cost`` with the comparison's top-k cost: ``topk_gamma_s`` seconds when given, else the cost model's
    own, else :data:`TOPK_GAMMA_S`; ``meta["topk_source"]`` names it (``source``)."""
    if topk_gamma_s is None:
        if cost.topk_gamma_s is not None:
            return cost
        topk_gamma_s, source = TOPK_GAMMA_S, TOPK_GAMMA_SOURCE
    source = source or f"top-k gamma {float(topk_gamma_s):g} s"
    return replace(cost.with_topk(float(topk_gamma_s)), meta={**cost.meta, "topk_source": source})


def planner_options(planner: str, *, servers: int, time_budget_s: float,
                    given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options ``planner`` gets in a comparison: those of ``servers``, ``time_budget_s`` and ``given``
    (None values dropped) that its function takes."""
    params = inspect.signature(PLANNERS[planner]).parameters
    wanted = {"servers": servers, "time_budget_s": time_budget_s, **{k: v for k, v in (given or {}).items()
                                                                      if v is not None}}
    return {k: v for k, v in wanted.items() if k in params}


def _iteration_s(trace: Trace, plan, cost: CostModel) -> float:
    """The simulated iteration of ``plan``, seconds. A parameter-server plan carries its own simulated period
    (``meta["iteration_s"]``), used unless a realism ``compute_scale`` other than 1 applies."""
    from repro.core.simulate import simulate

    realism = cost.realism
    if plan.family == "ps" and "iteration_s" in plan.meta and (realism is None or realism.compute_scale == 1.0):
        return float(plan.meta["iteration_s"])
    return float(simulate(trace, plan, cost, with_ops=False).iteration_s)


def predict(trace: Trace, cost: CostModel, *, servers: int | None = None,
            time_budget_s: float = DEFAULT_TIME_BUDGET_S, options: Mapping[str, Any] | None = None,
            schedulers: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One record per scheduler: the :data:`FIELDS`, plus ``options`` (what the planner got),
    ``stage1_bytes_share``, ``plan_from`` and ``exact_plan_iteration_s`` (None where not given).
    ``servers``: default :func:`default_servers`; ``options``: overrides of :data:`DEFAULT_OPTIONS` (None
    keeps the default); ``schedulers``: a subset, in the given order. Unknown schedulers or bad
    ``servers``: ValueError."""
    time_budget_s = check_time_budget(time_budget_s)
    names = list(SCHEDULERS) if schedulers is None else list(dict.fromkeys(schedulers))
    if not names:
        raise ValueError(f"--schedulers: the list names no scheduler; give one or more of {', '.join(SCHEDULERS)} "
                         "separated by commas, or leave --schedulers out for every one")
    unknown = [s for s in names if s not in SCHEDULERS]
    if unknown:
        raise ValueError(f"--schedulers: unknown scheduler(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(SCHEDULERS)}")
    if servers is None:
        servers = default_servers(cost)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"--servers must be a positive integer, got {servers!r}")
    given = {**DEFAULT_OPTIONS, **{k: v for k, v in (options or {}).items() if v is not None}}
    cost = with_topk(cost)

    records = []
    for name in names + ([BASELINE] if BASELINE not in names else []):  # the baseline of the speedups
        entry = SCHEDULERS[name]
        rec: dict[str, Any] = {**dict.fromkeys(FIELDS), "scheduler": name, "family": entry.family,
                               "planner": entry.planner, "note": "", "options": {}, "stage1_bytes_share": None,
                               "plan_from": None, "exact_plan_iteration_s": None}
        if not entry.has_plan:
            rec["note"] = "a runtime baseline that executes no plan of ours: nothing to predict"
            records.append(rec)
            continue
        rec["family"] = PLANNER_FAMILY[entry.planner]
        notes = [] if entry.planner == name else [f"predicted with planner {entry.planner}'s plan"]
        missing = [c for c in get_family(rec["family"]).collectives if c not in cost.lines]
        if missing:
            rec["note"] = (f"not planned: the cost model has no {' or '.join(missing)} line (it has "
                           f"{', '.join(sorted(cost.lines))}); describe the cluster (--nodes --gpus-per-node "
                           "--inter-link) or give a cost file with it")
            records.append(rec)
            continue
        try:
            opts = planner_options(entry.planner, servers=servers, time_budget_s=time_budget_s, given=given)
            rec["options"] = opts
            t0 = time.perf_counter()
            plan = make_plan(entry.planner, trace, cost, **opts)
            rec["plan_wall_s"] = time.perf_counter() - t0
            it = _iteration_s(trace, plan, cost)
            if not math.isfinite(it) or it <= 0:
                raise ValueError(f"the simulator predicts a non-finite or non-positive iteration ({it!r})")
            rec.update(iteration_s=it, buckets=plan.num_buckets,
                       throughput_samples_per_s=cost.workers * trace.batch_size / it,
                       stage1_bytes_share=plan.meta.get("stage1_bytes_share"),
                       plan_from=plan.meta.get("plan_from", name),
                       exact_plan_iteration_s=plan.meta.get("exact_plan_iteration_s"))
            if plan.meta.get("optimal") is False:
                notes.append(f"time budget of {time_budget_s:g} s spent: at most "
                             f"{float(plan.meta.get('gap_pct', math.nan)):.2f}% above the optimum")
            won = plan.meta.get("plan_from")
            if won and won != entry.planner:  # an exact planner's own plan lost under contention to a heuristic's
                notes.append(f"plan of {won}: faster under contention than the exact search's own plan "
                             f"({float(plan.meta.get('exact_plan_iteration_s', math.nan)):.4g} s)")
        except Exception as e:  # noqa: BLE001 - every reason is a note, never a traceback
            notes = [f"not planned: {_first_line(e)}"]
        rec["note"] = "; ".join(n for n in notes if n)
        records.append(rec)
        log.info("compare: %s %s", name, "predicted %.6g s" % rec["iteration_s"] if rec["iteration_s"] is not None
                 else rec["note"])
    base = next((r["iteration_s"] for r in records if r["scheduler"] == BASELINE), None)
    if base is not None:
        for r in records:
            if r["iteration_s"] is not None:
                r["speedup_over_syncea"] = base / r["iteration_s"]
    return [r for r in records if r["scheduler"] in names]


def compare(trace: Trace, cost: CostModel, *, servers: int | None = None,
            time_budget_s: float = DEFAULT_TIME_BUDGET_S, options: Mapping[str, Any] | None = None,
            schedulers: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """:func:`predict`'s records, each with the :data:`FIELDS` only (what ``repro compare`` prints)."""
    return [{k: r[k] for k in FIELDS} for r in predict(trace, cost, servers=servers, time_budget_s=time_budget_s,
                                                        options=options, schedulers=schedulers)]


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def format_table(records: Sequence[Mapping[str, Any]], header_lines: Sequence[str] = ()) -> str:
    """Aligned columns for a person (scheduler, family, iteration, buckets, speedup, note);
    ``header_lines`` first, each as a ``#`` comment."""
    head = ("scheduler", "family", "iteration_s", "buckets", "speedup_over_syncea", "note")
    rows = [[str(r["scheduler"]), _fmt(r["family"]), _fmt(r["iteration_s"]), _fmt(r["buckets"]),
             _fmt(r["speedup_over_syncea"], 3), str(r["note"] or "")] for r in records]
    return "\n".join([f"# {h}" for h in header_lines] + [text_table(rows, head)])


def format_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """CSV with the keys of the JSON records as the header (an empty cell where a value is missing)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(FIELDS), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if r.get(k) is None else r.get(k)) for k in FIELDS} for r in records)
    return buf.getvalue().rstrip("\n")
