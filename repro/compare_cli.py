"""``repro compare``: every plannable scheduler's predicted iteration on one trace and one cost model.

For each scheduler of the registry (:mod:`repro.schedulers`) in its order, :func:`compare` makes the
plan its planner makes (:func:`repro.planners.make_plan`) and simulates one iteration of it
(:func:`repro.sim.simulate`, the judge every study uses). A record holds the scheduler, its family, the
planner, the predicted ``iteration_s`` (seconds), the ``buckets`` of the plan, the
``speedup_over_syncea`` (SyncEASGD's iteration / this one: one all-reduce of every gradient after
backward, the MG-WFBP papers' baseline), the throughput in samples per second over all workers,
``plan_wall_s`` (seconds planning took here) and a ``note``.

What a record's ``note`` says, instead of a traceback: why a scheduler could not be planned (a runtime
baseline that executes no plan of ours; a cost model without a line the family needs, or without a
top-k cost; a bad option), that an exact planner's time budget ran out (the plan is then within the
stated gap of the optimum), that an exact planner returned a heuristic's plan because it simulated
faster under contention than the exact search's own (:mod:`repro.planners._judge`), or that the
scheduler is predicted with another scheduler's planner.

Options each planner gets (chosen from the planner's own parameters, never from its name):
``servers`` (parameter-server planners) = ``servers`` given, else one per node the job uses;
``time_budget_s`` (exact planners) = ``time_budget_s``, so a comparison never runs unbounded; the
``density`` of sparse planners when given; every other option at the planner's default. Never imports
torch.
"""

from __future__ import annotations

import csv
import inspect
import io
import logging
import math
import time
from typing import Any, Mapping, Sequence

from repro.cost import CostModel, CostModelError
from repro.families import get_family
from repro.planners import PLANNER_FAMILY, PLANNERS, make_plan
from repro.planners._budget import DEFAULT_TIME_BUDGET_S, check_time_budget
from repro.schedulers import SCHEDULERS
from repro.trace import Trace

log = logging.getLogger(__name__)

__all__ = ["BASELINE", "FIELDS", "compare", "planner_options", "format_table", "format_csv"]

BASELINE = "syncea"
FIELDS = ("scheduler", "family", "planner", "iteration_s", "buckets", "speedup_over_syncea",
          "throughput_samples_per_s", "plan_wall_s", "note")


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e).strip() else type(e).__name__


def planner_options(planner: str, *, servers: int, time_budget_s: float,
                    given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options ``planner`` gets in a comparison (module docstring): those of ``servers``,
    ``time_budget_s`` and ``given`` that its function takes."""
    params = inspect.signature(PLANNERS[planner]).parameters
    wanted = {"servers": servers, "time_budget_s": time_budget_s, **{k: v for k, v in (given or {}).items()
                                                                      if v is not None}}
    return {k: v for k, v in wanted.items() if k in params}


def _budget_note(meta: Mapping[str, Any], budget_s: float) -> str:
    if meta.get("optimal") is False:
        return (f"time budget of {budget_s:g} s spent: at most {float(meta.get('gap_pct', math.nan)):.2f}% above "
                "the optimum")
    return ""


def _judged_note(meta: Mapping[str, Any], planner: str) -> str:
    """For an exact planner whose own plan lost under the judging model (contention) to a heuristic's."""
    won = meta.get("plan_from")
    if not won or won == planner:
        return ""
    return (f"plan of {won}: faster under contention than the exact search's own plan "
            f"({float(meta.get('exact_plan_iteration_s', math.nan)):.4g} s)")


def compare(trace: Trace, cost: CostModel, *, servers: int | None = None,
            time_budget_s: float = DEFAULT_TIME_BUDGET_S, options: Mapping[str, Any] | None = None,
            schedulers: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One record per scheduler (module docstring). ``servers``: parameter servers (default: one per node
    the job uses, ``cost.meta["cluster"]["nodes_used"]`` or a calibrated cluster's ``meta["nodes_used"]``,
    else 1); ``options``: e.g. ``{"density": 0.01}``,
    passed to the planners that take them; ``schedulers``: a subset (default: every scheduler)."""
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
        servers = int((cost.meta.get("cluster") or {}).get("nodes_used") or cost.meta.get("nodes_used") or 1)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ValueError(f"--servers must be a positive integer, got {servers!r}")
    from repro.sim import simulate

    records = []
    for name in names + ([BASELINE] if BASELINE not in names else []):  # the baseline of the speedups
        entry = SCHEDULERS[name]
        rec: dict[str, Any] = {"scheduler": name, "family": entry.family, "planner": entry.planner,
                               "iteration_s": None, "buckets": None, "speedup_over_syncea": None,
                               "throughput_samples_per_s": None, "plan_wall_s": None, "note": ""}
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
            opts = planner_options(entry.planner, servers=servers, time_budget_s=time_budget_s, given=options)
            t0 = time.perf_counter()
            plan = make_plan(entry.planner, trace, cost, **opts)
            rec["plan_wall_s"] = time.perf_counter() - t0
            it = float(simulate(trace, plan, cost, with_ops=False).iteration_s)
            if not math.isfinite(it) or it <= 0:
                raise ValueError(f"the simulator predicts a non-finite or non-positive iteration ({it!r})")
            rec.update(iteration_s=it, buckets=plan.num_buckets,
                       throughput_samples_per_s=cost.workers * trace.batch_size / it)
            notes.append(_budget_note(plan.meta, time_budget_s))
            notes.append(_judged_note(plan.meta, entry.planner))
        except CostModelError as e:
            if cost.topk_gamma_s is None and "top-k" in str(e):  # the sparse family's computation cost
                notes = ["not planned: the cost model has no top-k cost (give --topk-gamma S or --topk-device GPU)"]
            else:
                notes = [f"not planned: {_first_line(e)}"]
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


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def format_table(records: Sequence[Mapping[str, Any]], header_lines: Sequence[str] = ()) -> str:
    """Aligned columns for a person: scheduler, family, iteration (s), buckets, speedup over SyncEASGD,
    note; ``header_lines`` first, each as a ``#`` comment."""
    head = ("scheduler", "family", "iteration_s", "buckets", "speedup_over_syncea", "note")
    rows = [[str(r["scheduler"]), _fmt(r["family"]), _fmt(r["iteration_s"]), _fmt(r["buckets"]),
             _fmt(r["speedup_over_syncea"], 3), str(r["note"] or "")] for r in records]
    cells = [list(head)] + rows
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    lines = [f"# {h}" for h in header_lines]
    lines += ["  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip() for r in cells]
    return "\n".join(lines)


def format_csv(records: Sequence[Mapping[str, Any]]) -> str:
    """CSV with the keys of the JSON records as the header (an empty cell where a value is missing)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(FIELDS), lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in FIELDS})
    return buf.getvalue().rstrip("\n")
