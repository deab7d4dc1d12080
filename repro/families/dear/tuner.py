"""DeAR with its bucket threshold tuned live by Bayesian optimisation (scheduler ``dear_bo``): rank 0's
GP proposes thresholds, every rank regroups identically between steps (no gradient or update lost) and
the best measured one is kept. :func:`tune_offline` runs the same search without torch.distributed.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from repro.core.plan import Bucket, Plan, PlanError
from repro.families.dear.planners import DEAR_MESSAGES, threshold_groups
from repro.runtime.executor import Executor, ExecutorOptions
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["DeARTunedExecutor", "ThresholdBO", "tune_offline", "DEFAULT_BOUNDS", "DEFAULT_TRIALS", "METHODS",
           "TUNING_COLUMNS"]

DEFAULT_BOUNDS = (2**20, 2**28)  # 1 MiB .. 256 MiB
DEFAULT_TRIALS = 10
DEFAULT_XI = 0.1
METHODS = ("bo", "grid", "random")
TUNING_COLUMNS = ("trial", "threshold_bytes", "buckets", "iteration_s", "best_so_far_s", "source", "chosen")
_PARAM = "log2_threshold"


def _check_bounds(bounds: Sequence[float]) -> tuple[int, int]:
    lo, hi = (int(b) for b in bounds)
    if not 1 <= lo < hi:
        raise ValueError(f"bounds must be 1 <= low < high bytes, got {tuple(bounds)}")
    return lo, hi


class ThresholdBO:
    """Bayesian optimisation of a bucket threshold: GP + expected improvement over log2(bytes).

    ``suggest()`` -> a threshold in bytes; ``register(threshold_bytes, seconds)`` records a measured
    (lower is better) time. Targets given to the GP are ``-seconds / reference`` (the first registered
    time, or ``reference_s``)."""

    def __init__(self, bounds: Sequence[float] = DEFAULT_BOUNDS, seed: int = 0, xi: float = DEFAULT_XI,
                 reference_s: float | None = None) -> None:
        from bayes_opt import BayesianOptimization, acquisition

        self.bounds = _check_bounds(bounds)
        self.reference_s = reference_s
        self.optimizer = BayesianOptimization(
            f=None, pbounds={_PARAM: (math.log2(self.bounds[0]), math.log2(self.bounds[1]))},
            acquisition_function=acquisition.ExpectedImprovement(xi=xi),
            random_state=seed, verbose=0, allow_duplicate_points=True)

    def in_bounds(self, threshold_bytes: int | None) -> bool:
        return threshold_bytes is not None and self.bounds[0] <= threshold_bytes <= self.bounds[1]

    def suggest(self) -> int:
        x = float(self.optimizer.suggest()[_PARAM])
        return int(min(self.bounds[1], max(self.bounds[0], round(2.0**x))))

    def register(self, threshold_bytes: int, seconds: float) -> None:
        if not self.in_bounds(threshold_bytes):
            return  # outside the search space: measured, but not evidence for the GP
        if self.reference_s is None:
            self.reference_s = float(seconds)
        self.optimizer.register({_PARAM: math.log2(threshold_bytes)}, -float(seconds) / self.reference_s)


def tune_offline(objective: Callable[[int], float], method: str = "bo", trials: int = DEFAULT_TRIALS,
                 bounds: Sequence[float] = DEFAULT_BOUNDS, seed: int = 0, initial: int | None = None,
                 xi: float = DEFAULT_XI) -> list[dict[str, Any]]:
    """Search a threshold minimising ``objective(threshold_bytes) -> seconds`` without torch.distributed:
    ``method`` ``"bo"`` (:class:`ThresholdBO`), ``"grid"`` (log2-spaced) or ``"random"`` (seeded);
    ``initial`` is evaluated first. One row per evaluation: ``trial``, ``threshold_bytes``,
    ``iteration_s``, ``best_so_far_s``, ``best_threshold_bytes``, ``source``."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if trials < 0:
        raise ValueError(f"trials must be >= 0, got {trials}")
    lo, hi = _check_bounds(bounds)
    rows: list[dict[str, Any]] = []
    best: tuple[float, int] | None = None

    def record(t: int, source: str) -> float:
        nonlocal best
        s = float(objective(int(t)))
        if best is None or s < best[0]:
            best = (s, int(t))
        rows.append({"trial": len(rows), "threshold_bytes": int(t), "iteration_s": s, "best_so_far_s": best[0],
                     "best_threshold_bytes": best[1], "source": source})
        return s

    bo = ThresholdBO((lo, hi), seed, xi) if method == "bo" else None
    if initial is not None:
        s = record(int(initial), "initial")
        if bo is not None:
            bo.register(int(initial), s)
    if method == "grid":
        points = [int(round(2.0**x)) for x in np.linspace(math.log2(lo), math.log2(hi), trials)] if trials > 1 \
            else [int(round(2.0**((math.log2(lo) + math.log2(hi)) / 2)))] * trials
        for t in points:
            record(t, "grid")
    elif method == "random":
        rng = np.random.default_rng(seed)
        for _ in range(trials):
            record(int(round(2.0**rng.uniform(math.log2(lo), math.log2(hi)))), "random")
    else:
        for _ in range(trials):
            t = bo.suggest()
            bo.register(t, record(t, "bo"))
    return rows


class DeARTunedExecutor(Executor):
    """DeAR whose bucket threshold is tuned while training; ``plan``: the starting plan (trial 0). Every
    rank builds it at the same point (it makes the stream every trial's executor shares)."""

    def __init__(self, model: nn.Module, plan: Plan | None = None, options: ExecutorOptions | None = None, *,
                 trials: int = DEFAULT_TRIALS, settle_steps: int = 2, trial_steps: int = 5,
                 bounds: Sequence[float] = DEFAULT_BOUNDS, seed: int = 0, xi: float = DEFAULT_XI,
                 tuner_trials: int | None = None, tuner_min_bytes: int | None = None,
                 tuner_max_bytes: int | None = None) -> None:
        # the run options of `repro train` (TrainConfig fields, see Scheduler.executor_options)
        if tuner_trials is not None:
            trials = tuner_trials
        if tuner_min_bytes is not None or tuner_max_bytes is not None:
            bounds = (bounds[0] if tuner_min_bytes is None else tuner_min_bytes,
                      bounds[1] if tuner_max_bytes is None else tuner_max_bytes)
        super().__init__(model, plan, options)
        if plan is None:
            raise PlanError("the DeAR tuner needs a starting plan")
        if plan.family != "dear":
            raise PlanError(f"DeARTunedExecutor executes 'dear' plans, got a '{plan.family}' plan")
        for name, v, low in (("trials", trials, 0), ("settle_steps", settle_steps, 0), ("trial_steps", trial_steps, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        self.trials, self.settle_steps, self.trial_steps = trials, settle_steps, trial_steps
        self.bounds = _check_bounds(bounds)
        self.seed, self.xi = seed, xi
        from repro.runtime.collectives import CommStream
        from repro.families.dear.executor import DeARExecutor

        self._executor_class = DeARExecutor
        self.initial_plan = plan
        layers = layer_parameters(model, self.options.view)
        self._order = [name for b in plan.buckets for name in b.layers]  # the plan's forward order
        check_plan_fits(plan, model, self.options.view)
        if len(self._order) != len(layers):
            raise PlanError("the starting plan must hold every layer of the model once (one names a layer twice)")
        self._nbytes = [sum(p.numel() * p.element_size() for _, p in layers[n]) for n in self._order]
        self._device = next(p for _, ps in layers.items() for _, p in ps).device
        self._stream = CommStream()
        self.executor = DeARExecutor(model, plan, self.options, stream=self._stream)
        self.current_plan = plan
        self._sync_views()
        self._optimizer: Any = None
        self._rank = dist.get_rank()
        self._bo = ThresholdBO(self.bounds, seed, xi) if self._rank == 0 and trials > 0 else None
        self._rows: list[dict[str, Any]] = []
        self._tuning = trials > 0
        t0 = plan.meta.get("threshold_bytes")
        self._trial = {"trial": 0, "threshold_bytes": None if t0 is None else int(t0), "buckets": plan.num_buckets,
                       "source": "initial"}
        self._since = 0
        self._intervals: list[float] = []
        self._last: float | None = None

    def wrap_optimizer(self, optimizer: Any, grad_scaler: Any = None) -> Any:
        """As :meth:`DeARExecutor.wrap_optimizer` (every executor of a trial gets the optimizer and the
        scaler)."""
        from repro.families.dear.executor import DeAROptimizer

        self._optimizer = optimizer
        self._grad_scaler = grad_scaler
        self.executor.wrap_optimizer(optimizer, grad_scaler=grad_scaler)
        return DeAROptimizer(self, optimizer)  # its step() and state_dict() come here: step() / flush()

    def step(self, amp: Any = None) -> None:
        """The loop's optimizer step: the current executor's, then the tuner measures (and may regroup)."""
        self.executor.step(amp)
        self._after_step()

    def synchronize(self) -> None:
        """The current executor's :meth:`~repro.families.dear.executor.DeARExecutor.synchronize`."""
        self.executor.synchronize()

    def before_forward(self) -> None:
        self.executor.sync_buffers = self.sync_buffers
        self.executor.before_forward()

    def after_backward(self) -> None:
        self.executor.after_backward()

    def flush(self) -> None:
        self.executor.flush()
        self._last = None  # an evaluation or checkpoint may follow: the next step's time is not an iteration's

    def remove(self) -> None:
        try:
            self.executor.remove()
        finally:
            self._stream.close()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"tuning": [dict(r) for r in self._rows]}

    @property
    def tuning(self) -> bool:
        """True while trials are still being measured."""
        return self._tuning

    def _sync_views(self) -> None:
        self.grad_ready_s = self.executor.grad_ready_s
        self.timings = self.executor.timings

    def _after_step(self) -> None:
        if not self._tuning:
            return
        now = time.perf_counter()
        self._since += 1
        if self._last is not None and self._since > self.settle_steps:
            self._intervals.append(now - self._last)
        self._last = now
        if len(self._intervals) < self.trial_steps:
            return
        # Every collective of the run goes through the executor's stream (one thread, one order on every
        # rank, as NCCL needs): the slowest rank's mean is the max of a one-hot vector summed over ranks.
        world = dist.get_world_size()
        means = torch.zeros(world, dtype=torch.float64, device=self._device)
        means[self._rank] = statistics.fmean(self._intervals)
        self._stream.all_reduce(means).wait()
        seconds = float(means.max().item())
        best = min([r["iteration_s"] for r in self._rows] + [seconds])
        row = {**self._trial, "iteration_s": seconds, "best_so_far_s": best, "chosen": False}
        self._rows.append({c: row[c] for c in TUNING_COLUMNS})
        done = len(self._rows) > self.trials
        nxt = torch.zeros(1, dtype=torch.float64, device=self._device)
        if self._rank == 0:
            if self._trial["threshold_bytes"] is not None:
                self._bo.register(self._trial["threshold_bytes"], seconds)
            nxt[0] = -1.0 if done else float(self._bo.suggest())
        self._stream.broadcast(nxt, src=0).wait()
        if done:  # keep the best measured bucketing (the earliest of equals)
            k = min(range(len(self._rows)), key=lambda i: self._rows[i]["iteration_s"])
            self._rows[k]["chosen"] = True
            self._tuning = False
            self._regroup(self._rows[k]["threshold_bytes"])
            return
        threshold = int(nxt.item())
        self._regroup(threshold)
        self._trial = {"trial": len(self._rows), "threshold_bytes": threshold,
                       "buckets": self.current_plan.num_buckets, "source": "bo"}
        self._since = 0
        self._intervals = []
        self._last = time.perf_counter()

    def plan_for(self, threshold_bytes: int | None) -> Plan:
        """The DeAR plan of ``threshold_bytes`` over this model's layers (None: the starting plan)."""
        if threshold_bytes is None:
            return self.initial_plan
        groups = threshold_groups(self._nbytes, int(threshold_bytes))
        return Plan([Bucket(tuple(self._order[i] for i in g), DEAR_MESSAGES) for g in groups], "dear_bo",
                    meta={"threshold_bytes": int(threshold_bytes)}, family="dear")

    def _regroup(self, threshold_bytes: int | None) -> None:
        """Between steps: flush and remove the current executor (every update applied), build the next."""
        plan = self.plan_for(threshold_bytes)
        self.executor.remove()  # flushes: the pending all-gathers finish and every update is applied
        self.executor = self._executor_class(self.model, plan, self.options, stream=self._stream)
        if self._optimizer is not None:
            self.executor.wrap_optimizer(self._optimizer, grad_scaler=getattr(self, "_grad_scaler", None))
        self.current_plan = plan
        self._sync_views()
