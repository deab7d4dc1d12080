"""The public door: any scheduler of this package in your own model and training loop, one call.

Under torchrun (your process group, model, optimizer, loss and data)::

    import repro
    model, optimizer = repro.distribute(model, optimizer, scheduler="mgwfbp")  # or a Plan, or "plan.json"
    for x, y in loader:                                                        # the loop is unchanged
        optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
    optimizer.flush()  # before evaluating or saving: nothing of the exchange is left in flight

* A scheduler that plans trains its first ``warmup_steps`` steps with one exact all-reduce after
  backward while recording when each gradient is ready; then the ranks average that into a Trace, the
  family fits its cost model on the live group (or uses ``network`` / ``cost``), rank 0 plans and
  broadcasts, and the plan's executor takes over (:mod:`repro.runtime.online`, as ``repro train``).
* A :class:`~repro.core.plan.Plan` (or a plan file from ``repro plan``) is executed from the first step.
* A baseline (``ddp``, ``fsdp``, ``local``) wraps the model as it would itself: use the returned model.

The returned model is yours with hooks added (a baseline's wrapper for baselines); ``model.module`` is
the plain module, as on DDP. The returned :class:`DistributedOptimizer` shares your optimizer's groups
and state. The all-reduce and sparse families finish the exchange when ``backward()`` returns, as DDP
does; DeAR, ByteScheduler and the parameter servers finish later (their overlap), so a gradient
changed before ``step()`` without ``synchronize()`` is refused at ``step()``. Parameter servers run
co-located on the training ranks, or on ranks ``0..S-1`` with ``dedicated_servers=S`` (gloo; the
family's :class:`~repro.runtime.serving.DoorServers`). An evaluation forward (``model.eval()``) issues
no collective. Everything is checked before any collective, in one line, on every rank alike; like
``DDP(model)``, the first trainer's parameters and buffers are copied to every trainer.
``docs/training.md`` describes accumulation, unused parameters, AMP, one-rank runs, ``torch.compile``
and the refused misuses; ``docs/conformance.md`` is the support table.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from repro.core.cost import CostModel
from repro.core.families import FAMILIES, get_family
from repro.costs.presets import preset
from repro.core.run_options import RUN_OPTIONS, check_run_options, check_wire_dtype
from repro.core.plan import WIRE_DTYPE_BYTES, Plan, PlanError
from repro.runtime.buffers import broadcast_module_state
from repro.runtime.clock import make_clock
from repro.runtime.executor import (Executor, ExecutorOptions, FoundInfReport, ScaledStep, nonfinite_and_unscale,
                                    scaled_step)
from repro.runtime.online import StepTimes, grad_abs_mean, measured_trace, plan_online, sync_device
from repro.runtime.plan_fit import check_plan_fits
from repro.runtime.serving import Placement
from repro.core.schedulers import SCHEDULERS, Scheduler, get_scheduler
from repro.workload.layers import VIEWS, layer_parameters

__all__ = ["distribute", "DistributedOptimizer"]


def _fail(message: str) -> None:
    raise ValueError(f"repro.distribute: {message}")


def _load_plan(scheduler: Any) -> Plan | None:
    if isinstance(scheduler, Plan):
        return scheduler
    if isinstance(scheduler, (str, os.PathLike)) and (str(scheduler).endswith(".json") or os.sep in str(scheduler)):
        from repro.core.outputs import InputPathError, read_input

        path = Path(scheduler)
        if not path.exists():
            _fail(f"plan file {path} not found (a scheduler name has no '.json' or '/')")
        try:  # a folder, a FIFO or a device: "not a regular file", the words of every command
            return read_input("plan", path, Plan.load)
        except InputPathError as e:
            _fail(str(e))
    return None


def _forward_pre_hook_count(model: nn.Module) -> int:
    """Forward pre-hooks on the model's modules (an executor that acts in forward adds some)."""
    return sum(len(m._forward_pre_hooks) for m in model.modules())


def _is_compiled(model: nn.Module) -> bool:
    """``model`` is what ``torch.compile(module)`` returned."""
    return hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule"


def _model_refusal(model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Why no scheduler can train ``model`` with ``optimizer`` (one sentence, each case's reason in its
    message; DDP accepts foreign trainable parameters silently), or None. Reads only the model and the
    optimizer, so every rank decides alike, before any collective."""
    held = model.__dict__.get("no_sync")
    if isinstance(getattr(held, "__self__", None), _Door):  # the no_sync distribute attached
        return ("the model is already distributed by repro (an earlier repro.distribute returned it): keep using "
                "that model and optimizer, or call remove() on that optimizer before distributing it again")
    if not any(p.requires_grad for p in model.parameters()):
        return ("every parameter of the model is frozen (requires_grad=False), or it has none: there are no "
                "gradients to exchange; unfreeze the ones to train (p.requires_grad_(True)) before distributing")
    devices = sorted({str(p.device) for p in model.parameters()})
    if len(devices) > 1:
        return (f"the model's parameters are on several devices ({', '.join(devices)}): every scheduler here "
                "exchanges a rank's gradients on one device; put the model on one (model.to(device))")
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if on_meta:
        return (f"the model is on the meta device (e.g. {on_meta[0]!r} has no values): materialise it first "
                "(model.to_empty(device=...) and initialise it, or load a state_dict with assign=True)")
    own = {id(p) for p in model.parameters()}
    foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in own and p.requires_grad]
    if foreign:
        return (f"the optimizer holds {len(foreign)} trainable parameter(s) that are not the model's (e.g. one of "
                f"shape {tuple(foreign[0].shape)}): nothing would exchange their gradients, so every rank would "
                "update them alone and the replicas would drift apart; make them part of the model (a submodule) "
                "or leave them out of this optimizer")
    return None


def _sparse_gradient_source(model: nn.Module) -> str | None:
    """What in ``model`` makes sparse gradients, named for a message (``"module 'emb' (Embedding(10, 3,
    sparse=True))"``): the first ``nn.Embedding`` or ``nn.EmbeddingBag`` with ``sparse=True``, or a
    parameter holding a sparse gradient already; None when nothing does."""
    for name, m in model.named_modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse:
            return f"module {name!r} ({m})"
    for name, p in model.named_parameters():
        if p.grad is not None and p.grad.layout != torch.strided:
            return f"parameter {name!r} (a {p.grad.layout} gradient)"
    return None


def _one_rank_scheduler(name: str, sched: Scheduler, network: Any, cost: Any) -> str:
    """The scheduler that runs ``name`` in a job of one rank, where every exchange is the identity (an
    average over one rank) and no network can be fitted to plan with: the baseline with the same
    executor (``ddp_threshold``: ``ddp``), else ``local``; so the update is the one ``name`` makes
    there, as DDP trains at world size 1. A scheduler that changes the update on purpose (top-k, the
    parameter server's ASP/SSP/OSP) is refused: it would need its plan, which needs 2 ranks or more."""
    if sched.changes_update:
        _fail(f"'{name}' changes SGD's update on purpose and plans for a job of 2 ranks or more; this job has 1 "
              "rank: train alone with scheduler='local', or launch more ranks")
    if network is not None or cost is not None:
        _fail("network and cost describe the exchange among 2 ranks or more; this job has 1 rank, which exchanges "
              "nothing: leave them out")
    return next((s.name for s in SCHEDULERS.values() if s.planner is None and s.executor == sched.executor), "local")


def _from_this_package(frame: Any) -> bool:
    """Whether the call that ``frame`` made came from this package: the first frame outside torch (its
    optimizer and LR-scheduler wrappers, GradScaler) belongs to a ``repro`` module."""
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch."):
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return module == "repro" or module.startswith("repro.")


def _refuse_direct_steps(optimizer: torch.optim.Optimizer, door: "_Door") -> None:
    """While ``door`` is live (until ``remove()``, or until nothing holds it), ``step()`` of the optimizer
    given to distribute is refused unless this package calls it: stepped by the user's loop it would
    update with this rank's own gradients, the exchange still in flight. Stepping the returned optimizer
    next finishes the refused iteration. The hook holds the door weakly (keeps no buffers alive)."""
    live = weakref.ref(door)

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        held = live()
        if held is None or getattr(held, "removed", False) or _from_this_package(sys._getframe(1)):
            return None
        _fail("the optimizer given to distribute was stepped directly, which skips the gradient exchange: step "
              "the optimizer distribute returned (model, optimizer = repro.distribute(model, optimizer, ...)); "
              "its step() finishes the exchange, then steps this one")

    optimizer.register_step_pre_hook(before_step)


def _give_module(model: nn.Module) -> None:
    """DDP's ``model.module`` on a returned model that is the user's own: the plain module (the model
    itself; ``torch.compile``'s original module for a compiled one), set in the instance's ``__dict__``
    so that it is neither a submodule nor in ``state_dict`` (keys keep no ``module.`` prefix); it stays
    after ``remove()`` (the model itself, as harmless there). A model with a ``module`` attribute of its
    own (e.g. a submodule of that name) keeps it."""
    if not hasattr(model, "module"):
        model.__dict__["module"] = model._orig_mod if _is_compiled(model) else model


def _grad_hook_keys(model: nn.Module) -> dict[int, tuple[torch.Tensor, set]]:
    """Per parameter (by id): the keys of its post-accumulate-grad hooks now."""
    return {id(p): (p, set(p._post_accumulate_grad_hooks or ())) for p in model.parameters()}


class _HeldHooks:
    """The post-accumulate-grad hooks one executor registered on the model's parameters (those added
    while it was built), which :meth:`hold` takes out of each parameter's hook table and :meth:`put_back`
    returns to their places (the user's own hooks stay and keep their order). Every family exchanges
    from these hooks, so holding them is ``no_sync`` for any executor, with no change to its code."""

    def __init__(self, before: dict[int, tuple[torch.Tensor, set]], model: nn.Module) -> None:
        self.mine = [(p, key) for pid, (p, keys) in _grad_hook_keys(model).items()
                     for key in keys - before.get(pid, (None, set()))[1]]
        self.held: list[tuple[torch.Tensor, Any, Any, list]] = []

    def hold(self) -> None:
        for p, key in self.mine:
            table = p._post_accumulate_grad_hooks
            if table is not None and key in table:
                order = list(table)
                self.held.append((p, key, table.pop(key), order))

    def put_back(self) -> None:
        held, self.held = self.held, []
        for p, key, fn, order in held:
            table = p._post_accumulate_grad_hooks
            others = dict(table)  # hooks still there, and any registered meanwhile
            table.clear()
            for k in order:
                if k == key:
                    table[k] = fn
                elif k in others:
                    table[k] = others.pop(k)
            table.update(others)


class _Door:
    """The state behind a distributed model and optimizer (kept apart from both, as DDP's comm-hook
    states are): the executor in use, the warm-up's measurements, the plan."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: str | None,
                 plan: Plan | None, *, warmup_steps: int, network_cost: CostModel | None, view: str,
                 planner_options: dict[str, Any], executor_options: dict[str, Any], fit_repeats: int,
                 record_timeline: bool, grad_scaler: Any = None, context: Placement | None = None) -> None:
        self.model, self.inner = model, optimizer
        self.context = context or Placement()
        self._last_stamps: dict[str, float | None] = {}  # the last training step's phase stamps (see last_stamps)
        # after the warm-up, a GPU's phase stamps are CUDA events (resolved when read), not host enqueue times
        self._phase_clock = make_clock(next(model.parameters()).device)
        self.grad_scaler = grad_scaler
        self.synchronized = False  # synchronize() finished this step's exchange already
        self._report = None
        self.scheduler = scheduler
        self.plan = plan
        self.view = view
        self.warmup_left = 0
        self.network_cost, self.planner_options = network_cost, planner_options
        self.executor_options, self.fit_repeats = executor_options, fit_repeats
        self.options = ExecutorOptions(view=view, record_timeline=record_timeline, group=self.context.group)
        self.device = next(model.parameters()).device
        self.batch_size = 0
        self.cost: CostModel | None = None
        self.trace = None
        self._measured: list[tuple[StepTimes, dict[str, float]]] = []
        self._stamps: dict[str, float] = {}
        self.accumulating = 0  # depth of model.no_sync() blocks
        self._last_forward_synced = True  # the last training forward was outside no_sync (DDP's buffer rule)
        self._compiled_forward = False  # a forward of the model ran inside a torch.compile'd frame
        self._ex_forward_hooks = 0  # forward pre-hooks the executor in use put on the model's modules
        self._hooks: list[Any] = []  # removed by remove(): the door's hooks on the model (and a baseline's module)
        sched = get_scheduler(scheduler) if scheduler else None
        if plan is None and sched is not None and sched.has_plan:  # plan online after a warm-up
            from repro.families.allreduce.executor import AllReduceExecutor

            self.warmup_left = warmup_steps
            names = list(layer_parameters(model, view))
            before = _grad_hook_keys(model)
            # the warm-up measures each gradient's ready time through the executor's clock (CUDA events
            # on a GPU): the Python hook engine marks them there
            self.ex: Executor = AllReduceExecutor(model, Plan.from_dict({"solver": "syncea", "buckets": [names]}),
                                                  self.options, engine="hooks")
            self._ex_hooks = _HeldHooks(before, model)
            self.run_opt: Any = optimizer
        else:
            self._start(plan)
        # model.state_dict() / load_state_dict() see no update in flight (DeAR's are applied in the next
        # forward): a checkpoint written in the usual order, model first, holds the last step's update
        self._hooks += [model.register_forward_pre_hook(self._before_forward),
                       model.register_forward_hook(self._after_forward),
                       model.register_state_dict_pre_hook(lambda *_: self.flush()),
                       model.register_load_state_dict_pre_hook(lambda *_: self.flush())]
        # the end of every backward (see _backward_end): these hooks are the door's, not an executor's, so
        # no_sync does not hold them and a plan switch keeps them
        self._end_queued = False
        self._grads_at_backward_end: dict[int, tuple[Any, int]] | None = None
        self._hooks += [p.register_post_accumulate_grad_hook(self._grad_arrived)
                        for p in model.parameters() if p.requires_grad]

    # ---- the executor in use ----
    def _start(self, plan: Plan | None) -> None:
        cls = (get_scheduler(self.scheduler) if self.scheduler  # a plan given on its own: its family's executor
               else get_family(plan.family)).executor_class()
        self.plan = plan
        before, forward_hooks = _grad_hook_keys(self.model), _forward_pre_hook_count(self.model)
        self.ex = cls(self.model, plan, self.options, **self.executor_options)
        self._ex_hooks = _HeldHooks(before, self.model)
        self._ex_forward_hooks = _forward_pre_hook_count(self.model) - forward_hooks
        if self.ex.module is not self.model:  # a baseline's module (FSDP's sharded copy) is what the loop calls
            self._hooks += [self.ex.module.register_forward_pre_hook(self._before_forward),
                            self.ex.module.register_forward_hook(self._after_forward)]
        self._check_compiled()
        takes_scaler = "grad_scaler" in inspect.signature(self.ex.wrap_optimizer).parameters
        scaler = {"grad_scaler": self.grad_scaler} if self.grad_scaler is not None and takes_scaler else {}
        self.run_opt = self.ex.wrap_optimizer(self.inner, **scaler)  # with a scaler: the family unscales and skips

    def _check_compiled(self) -> None:
        """Refuse an executor that acts in its forward pre-hooks (DeAR and ByteScheduler apply the last
        step's updates there) on a compiled model: the compiled forward does not run them where the
        eager one does (measured: DeAR's parameters 7.6e-4 away from DDP's after 5 steps, either order
        of torch.compile and distribute), so training would be silently wrong."""
        if self._ex_forward_hooks and (self._compiled_forward or _is_compiled(self.model)):
            self.remove()
            _fail(f"'{self.scheduler or self.plan.solver}' applies updates in forward pre-hooks of the model's "
                  "modules, which a torch.compile'd forward does not run in place; with torch.compile use an "
                  "all-reduce or sparse scheduler (e.g. mgwfbp), or leave the model uncompiled")

    @property
    def warming_up(self) -> bool:
        return self.warmup_left > 0

    @contextlib.contextmanager
    def no_sync(self):
        """DDP's ``no_sync``: backward passes inside accumulate ``param.grad`` locally, without any
        exchange; the first backward after the block exchanges the accumulated gradients."""
        self.check_live()
        ex_hooks = self._ex_hooks
        hold_exchange = getattr(self.ex, "hold_exchange", None)  # an executor whose hooks are not Python's
        if self.accumulating == 0:
            ex_hooks.hold()
            if hold_exchange is not None:
                hold_exchange(True)
        self.accumulating += 1
        try:
            yield
        finally:
            self.accumulating -= 1
            if self.accumulating == 0 and ex_hooks is self._ex_hooks and not getattr(self, "removed", False):
                ex_hooks.put_back()
                if hold_exchange is not None:
                    hold_exchange(False)

    # ---- hooks ----
    def _before_forward(self, module: nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():  # traced by torch.compile (compiled after distribute): remembered
            self._compiled_forward = True
        if not module.training:  # an evaluation: the last step's exchange finished (e.g. DeAR's pending
            self.ex.flush()      # updates applied), nothing new issued (no buffer broadcast: ranks may
            return               # evaluate different numbers of batches, or one rank alone)
        if self.warming_up:
            sync_device(self.device)
            if not self.batch_size and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
                self.batch_size = int(args[0].shape[0])
        self._stamps = {}
        self._stamp("start")
        # as DDP: the buffers are broadcast unless the last training forward was under no_sync or without
        # gradients (so once per accumulation cycle, before its first micro-batch)
        self.ex.sync_buffers = self._last_forward_synced
        self._last_forward_synced = torch.is_grad_enabled() and not self.accumulating
        self.ex.before_forward()
        if self.warming_up:
            sync_device(self.device)
        self._stamp("forward_start")

    def _after_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        if module.training:
            if self.warming_up:
                sync_device(self.device)
            self._stamp("backward_start")

    # ---- the end of a backward ----
    def _grad_arrived(self, param: torch.Tensor) -> None:
        """A gradient was accumulated: the first of a backward queues :meth:`_backward_end` behind every
        callback queued so far (the reducer engine's finalisation among them)."""
        if not self._end_queued:
            self._end_queued = True
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(self._backward_end))

    def _backward_end(self) -> None:
        """What DDP guarantees when ``backward()`` returns, kept where the family allows it.

        An executor that finishes its exchange in backward (``finishes_in_backward``: the all-reduce and
        sparse families) finishes it here, so ``param.grad`` is the averaged gradient when ``backward()``
        returns, as under DDP: the usual loop's ``clip_grad_norm_`` (or any code that reads or changes
        gradients before ``step()``) sees and changes what ``step()`` applies. A family that finishes
        later (DeAR's all-gathers in the next forward, ByteScheduler's layer-wise updates, the parameter
        servers) cannot; for those the gradients' identities and version counters are noted here, and
        :meth:`step` refuses a step whose gradients were changed since (see :meth:`_check_grads_untouched`)."""
        self._end_queued = False
        if self.accumulating or getattr(self, "removed", False):
            self._grads_at_backward_end = None
            return
        if getattr(self.ex, "finishes_in_backward", False):
            self.synchronize()
            self._grads_at_backward_end = None
            return
        self._grads_at_backward_end = {id(p): (p.grad, p.grad._version) for p in self.model.parameters()
                                       if p.grad is not None}

    def _check_grads_untouched(self) -> None:
        """Refuse a step whose ``param.grad`` changed between the end of backward and ``step()`` (e.g.
        ``torch.nn.utils.clip_grad_norm_``, which works in place): the family steps with the exchanged
        gradients, which that change never reached, so the step would be silently unclipped."""
        seen, self._grads_at_backward_end = self._grads_at_backward_end, None
        if not seen:
            return
        for p in self.model.parameters():
            was = seen.get(id(p))
            if was is not None and (p.grad is not was[0] or p.grad._version != was[1]):
                _fail(f"param.grad was changed between backward() and step() (e.g. by "
                      f"torch.nn.utils.clip_grad_norm_), but '{self.scheduler or self.plan.solver}' steps with the "
                      "exchanged gradients, which it finishes later: clip with optimizer.clip_grad_norm_(max_norm), "
                      "or call optimizer.synchronize() before changing param.grad")

    # ---- the optimizer's step ----
    def synchronize(self) -> None:
        """Finish this step's exchange now (``param.grad`` averaged on every rank), for unscaling or
        clipping before ``step()``."""
        if self.synchronized:
            return
        self._stamp("backward_end")
        self.ex.after_backward()
        if getattr(self.run_opt, "_step_supports_amp_scaling", False) and hasattr(self.run_opt, "synchronize"):
            self.run_opt.synchronize()  # the family's own (DeAR, ByteScheduler finish their exchange here)
        self.synchronized = True

    def step(self, closure: Callable[[], Any] | None, outer: torch.optim.Optimizer) -> Any:
        """``outer``: the optimizer GradScaler.step called, with its ``grad_scale`` and ``found_inf``
        attributes when there is one (:func:`~repro.runtime.executor.scaled_step`)."""
        self._check_compiled()
        if self.accumulating:
            _fail("optimizer.step() inside model.no_sync(): leave the block for the last micro-batch's forward "
                  "and backward, then step (as with DDP, the gradients inside are not exchanged)")
        amp = scaled_step(outer)
        if not self.synchronized and (amp is None or amp.inv_scale is not None):
            self._check_grads_untouched()  # (a scaler that unscaled already is refused by the family)
        self._grads_at_backward_end = None
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stamps = self._stamps
        family_amp = getattr(self.run_opt, "_step_supports_amp_scaling", False)
        if not self.synchronized:
            self._stamp("backward_end")
            self.ex.after_backward()
        self.synchronized = False
        if self.warming_up:
            sync_device(self.device)
        self._stamp("exchange_end")
        if amp is None:
            self.run_opt.step()
        elif family_amp:  # the family's optimizer takes GradScaler's attributes as GradScaler gave them
            self.run_opt.grad_scale, self.run_opt.found_inf = vars(outer)["grad_scale"], vars(outer)["found_inf"]
            try:
                self.run_opt.step()
            finally:
                del self.run_opt.grad_scale, self.run_opt.found_inf
        else:
            self._scaled_step(amp)
        if self.warming_up:
            sync_device(self.device)
            if {"start", "forward_start", "backward_start"} <= set(stamps):
                st = StepTimes(stamps["start"], stamps["forward_start"], stamps["backward_start"],
                               stamps["backward_end"], stamps["exchange_end"], time.perf_counter(), float("nan"))
                self._measured.append((st, dict(self.ex.grad_ready_s)))
            self.warmup_left -= 1
            if not self.warming_up:
                self._plan_and_switch()
        self._last_stamps = dict(stamps)
        self._phase_clock.end_iteration()
        return loss

    def _stamp(self, key: str) -> None:
        """Phase ``key`` of this step reached: a host ``perf_counter`` stamp on a CPU and during the
        warm-up (which synchronises the device before each stamp); after it on a GPU a CUDA event on the
        model's device (the host only enqueued the work by then), resolved in :attr:`last_stamps`."""
        if self.warming_up or self._phase_clock.kind == "host":
            self._stamps[key] = time.perf_counter()
        else:
            self._phase_clock.mark(key)
            self._stamps[key] = None

    @property
    def last_stamps(self) -> dict[str, float]:
        """:attr:`DistributedOptimizer.last_stamps` (a GPU's CUDA events read back here: one device synchronize)."""
        stamps = dict(self._last_stamps)
        if any(v is None for v in stamps.values()):
            ready = self._phase_clock.resolve()
            stamps = {k: ready.get(k, float("nan")) if v is None else v for k, v in stamps.items()}
        return stamps

    def _scaled_step(self, amp: ScaledStep) -> None:
        """A GradScaler step on the exchanged gradients: they are the same on every rank, so the inf/nan
        verdict is too (a rank's inf reaches every rank's average); skipped everywhere or nowhere, and
        the scaler's ``update()`` is told (its own check saw this rank's gradient before the exchange)."""
        groups = getattr(self.run_opt, "param_groups", None) or self.inner.param_groups  # the ones it steps
        grads = [p.grad for g in groups for p in g["params"] if p.grad is not None]
        if amp.inv_scale is None:  # scaler.unscale_(opt) after synchronize(): it checked the exchanged gradients
            if not amp.found_inf:
                self.run_opt.step()
            return
        if self.grad_scaler is None:
            _fail("a GradScaler stepped this optimizer: pass it to repro.distribute(..., grad_scaler=scaler) so "
                  "that every rank skips (and backs the scale off) together")
        found = nonfinite_and_unscale(grads, amp.inv_scale, self.device)
        if self._report is None:
            self._report = FoundInfReport(self.grad_scaler, self.device)
        self._report.report(found)
        if not found:
            self.run_opt.step()

    def _plan_and_switch(self) -> None:
        magnitudes = grad_abs_mean(self.model, self.view)  # the exchanged gradients of the last warm-up step
        self.ex.remove()
        if not self._measured:
            _fail("no training step was seen during the warm-up (call the returned model in train mode, "
                  "then backward, then optimizer.step())")
        ctx = self.context
        trace = measured_trace(self.model, self._measured, self.device,
                               model_name=ctx.trace_name or type(self.model).__name__,
                               batch_size=max(1, self.batch_size), view=self.view, group=ctx.group,
                               grad_abs_mean=magnitudes)
        plan, self.cost, self.trace = plan_online(self.scheduler, trace, self.device,
                                                  planner_options=self.planner_options,
                                                  network_cost=self.network_cost, fit_repeats=self.fit_repeats,
                                                  first=ctx.first, servers=ctx.servers)
        self._measured.clear()
        if ctx.on_plan is not None:
            ctx.on_plan()
        self._start(plan)

    @property
    def module(self) -> nn.Module:
        """The module to call: the model, or the executor's wrapper of it (a baseline's DDP)."""
        return self.ex.module

    def flush(self) -> None:
        self.ex.flush()

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs besides the model and the optimizer: the plan (so a resumed run
        executes the same one instead of planning again), the executor's state (e.g. residuals) and
        how much of the warm-up is left. Taken after a flush."""
        return {"plan": self.plan.to_dict() if self.plan is not None else None, "scheduler": self.scheduler,
                "executor": self.ex.state_dict(), "warmup_left": self.warmup_left}

    def load_state(self, state: dict[str, Any]) -> None:
        plan = Plan.from_dict(state["plan"]) if state.get("plan") is not None else None
        if plan is not None and (self.plan is None or plan.to_dict() != self.plan.to_dict()):
            try:
                check_plan_fits(plan, self.model, self.view)
            except PlanError as e:
                _fail(str(e))
            self.ex.remove()
            self.warmup_left = 0
            self._measured.clear()
            self._start(plan)
        elif plan is None:
            self.warmup_left = min(self.warmup_left, int(state.get("warmup_left", self.warmup_left)))
        self.ex.load_state_dict(state.get("executor") or {})

    def remove(self) -> None:
        for h in getattr(self, "_hooks", []):
            h.remove()
        self._hooks = []
        self.ex.remove()
        if self.model.__dict__.get("no_sync") == self.no_sync:
            del self.model.__dict__["no_sync"]
        self.removed = True

    def check_checkpointable(self) -> None:
        refusal = getattr(self.ex, "checkpoint_refusal", None)
        if refusal:
            _fail(refusal)

    def check_live(self) -> None:
        if getattr(self, "removed", False):
            _fail("this optimizer was removed (remove() detached the exchange); step the optimizer it wraps "
                  "(optimizer.optimizer) to train alone, or call repro.distribute again")


class DistributedOptimizer(torch.optim.Optimizer):
    """Your optimizer, with this package's gradient exchange: ``step()`` finishes the exchange of the
    step's gradients, then updates (or lets the executor update, as DeAR does in the next forward).
    It shares the wrapped optimizer's ``param_groups`` and ``state``, so LR schedulers and
    ``state_dict`` see one optimizer. Made by :func:`distribute`."""

    _step_supports_amp_scaling = True  # GradScaler.step always calls step(): every rank joins the exchange
    serving = False  # this rank trains (a serving rank of dedicated_servers gets a ServingRankOptimizer)

    def __init__(self, optimizer: torch.optim.Optimizer, door: _Door) -> None:
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.param_groups = optimizer.param_groups  # the same list: an LR scheduler's change reaches both
        self.state = optimizer.state
        self.optimizer = optimizer
        self._door = door

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        self._door.check_live()
        return self._door.step(closure, self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._door.check_live()
        self._door.run_opt.zero_grad(set_to_none=set_to_none)

    def flush(self) -> None:
        """Finish every exchange in flight: afterwards the parameters are the ones all ranks agree on
        (call it before evaluating, checkpointing or reading the parameters)."""
        self._door.flush()

    def synchronize(self) -> None:
        """Finish this step's gradient exchange now, before ``step()`` (Horovod's escape hatch):
        ``param.grad`` then holds the averaged gradient on every rank, ready for
        ``scaler.unscale_(optimizer)`` and clipping; ``step()`` then only updates."""
        self._door.synchronize()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` of this step's averaged gradients (the norm over every
        parameter of the optimizer, the same on every rank), as a DDP loop clips after ``backward()``:
        :meth:`synchronize` first, then the clip; returns the total norm before clipping. Every rank
        calls it (with a family that finishes its exchange later, synchronize() is a collective)."""
        self._door.check_live()
        self.synchronize()
        groups = getattr(self._door.run_opt, "param_groups", None) or self.param_groups  # the ones it steps
        params = [p for g in groups for p in g["params"] if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                              error_if_nonfinite=error_if_nonfinite, foreach=foreach)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict`` (after a flush), plus under ``"repro"`` the plan, the
        executor's state (e.g. error-feedback residuals) and the warm-up left, so that
        :meth:`load_state_dict` resumes the run bit for bit. A plain torch optimizer loading it ignores
        the extra key."""
        self._door.flush()
        self._door.check_checkpointable()
        return {**self.optimizer.state_dict(), "repro": self._door.state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`: the optimizer's state, and the saved plan executed from the next
        step on (no second warm-up, no new plan), with the executor's state."""
        state_dict = dict(state_dict)
        extra = state_dict.pop("repro", None)
        self._door.check_checkpointable()
        self._door.flush()
        self.optimizer.load_state_dict(state_dict)
        if extra is not None:
            self._door.load_state(extra)

    @property
    def plan(self) -> Plan | None:
        """The plan being executed (None during the warm-up and for baselines)."""
        return self._door.plan

    @property
    def warming_up(self) -> bool:
        """Still in the warm-up: steps measured before planning online (False once the plan runs)."""
        return self._door.warming_up

    @property
    def module(self) -> nn.Module:
        """The module to call now: the model distribute returned, or with ``wrap_after_warmup`` the
        executor's wrapper of it once the warm-up ends (e.g. DDP's for ``ddp_threshold``)."""
        return self._door.module

    @property
    def trace(self) -> Any:
        """The :class:`~repro.core.trace.Trace` measured in the warm-up that the plan was made from (None
        during the warm-up, for a given plan, for a plan made from the parameters' sizes, and for baselines)."""
        return self._door.trace

    @property
    def cost(self) -> CostModel | None:
        """The cost model the plan was made with (fitted on the live group, or ``network``/``cost``);
        None where :attr:`trace` is None."""
        return self._door.cost

    @property
    def last_stamps(self) -> dict[str, float]:
        """When the last training step reached each phase, in seconds on the host ``time.perf_counter``
        base: ``start`` (its forward's pre-hook), ``forward_start``, ``backward_start`` (the forward
        returned), ``backward_end`` (the exchange was asked to finish), ``exchange_end`` (the
        optimizer's update starts). The device's times (synchronised in the warm-up; CUDA events
        after it on a GPU, read here with one device synchronize), the host's on a CPU. Empty before
        the first step."""
        return self._door.last_stamps

    @property
    def executor(self) -> Executor:
        """The executor in use (:class:`repro.runtime.executor.Executor`: the warm-up's exact all-reduce,
        then the plan's family's): what it measures (``grad_ready_s``, ``timings`` with
        ``record_timeline``) and records (``tables()``). Read it; stepping goes through this optimizer."""
        return self._door.ex

    def check_checkpointable(self) -> None:
        """ValueError in one line if this run's state cannot be checkpointed (an executor that cannot
        save its state, e.g. FSDP's): :meth:`state_dict` refuses the same; call it up front to fail
        before training rather than at the first checkpoint."""
        self._door.check_checkpointable()

    def remove(self) -> None:
        """Detach the hooks (after a flush): the model trains alone again, with the wrapped optimizer
        (``optimizer.optimizer``); this one refuses further steps. Removing twice does nothing."""
        if getattr(self._door, "removed", False):
            return
        self._door.flush()
        self._door.remove()


def distribute(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: str | Plan | os.PathLike = "mgwfbp",
               *, warmup_steps: int = 3, network: str | None = None, cost: CostModel | str | os.PathLike | None = None,
               view: str = "tensor", wire_dtype: str | None = None, fit_repeats: int = 5,
               record_timeline: bool = False, grad_scaler: Any = None, dedicated_servers: int = 0,
               model_name: str | None = None, wrap_after_warmup: bool = False,
               **options: Any) -> tuple[nn.Module, DistributedOptimizer]:
    """Put ``scheduler`` between ``model``'s backward and ``optimizer``'s step; returns ``(model,
    optimizer)`` to use in place of yours (see the module docstring).

    ``scheduler``: a name of ``repro schedulers`` (``mgwfbp``, ``optimal``, ``dear_threshold``,
    ``bytescheduler``, ``omgs``, ...; ``dear``, the paper's name, is ``dear_threshold``, DeAR as its
    authors released it), a :class:`~repro.core.plan.Plan`, or a plan file (``repro plan -o``).
    ``warmup_steps``: steps measured before planning online (>= 1). ``network``: a cost preset name
    for this world size instead of fitting the live group; ``cost``: a CostModel or its JSON file.
    ``view``: layers are parameter tensors (``tensor``) or parameter-owning modules (``module``); a
    given plan's layer names must be the model's in that view. ``wire_dtype``: send gradients in
    ``"float16"``/``"bfloat16"`` (by name; schedulers that cast, ``repro schedulers``); every scheduler
    takes the gradients' own dtype (``"float32"`` for a float32 model), which changes nothing. ``options``: the scheduler's own
    options (e.g. ``threshold_bytes``, ``density``; ``repro schedulers`` lists each one's). ``grad_scaler``: the
    ``torch.amp.GradScaler`` your loop uses (``scaler.scale(loss).backward(); scaler.step(optimizer);
    scaler.update()``): the exchanged gradients are unscaled, and a step with an inf/nan on any rank is
    skipped on every rank; to clip, call ``optimizer.synchronize()`` then ``scaler.unscale_(optimizer)``
    and clip before ``scaler.step``. ``model_name``: the model's name in the measured trace and the plan's
    provenance (default: its class name). ``wrap_after_warmup``: a scheduler whose executor wraps the
    model (``ddp_threshold``: DDP's wrapper) plans at once from the parameters' sizes and wraps now, so
    the returned model is the one that trains; True measures a warm-up on your model first and plans
    from it, as every other scheduler does, and wraps after it: the module to call is then
    ``optimizer.module`` (it changes at the end of the warm-up). ``dedicated_servers``: for a family with server ranks (the
    parameter server), ranks ``0..S-1`` serve instead of training (gloo only): there this call
    serves the whole run and returns when every trainer has called ``optimizer.remove()`` (or exited),
    with ``optimizer.serving`` True, so the script skips its loop there. The process group must be
    initialised (torchrun + ``torch.distributed.init_process_group``); with one rank, a scheduler that
    plans runs as the baseline with its executor (``docs/training.md``). Like DDP, the parameters and buffers of the first trainer (rank 0) are copied
    to every trainer here, so the replicas start equal whatever each rank's initialisation. Misuse is
    refused here, before any collective, with a ValueError of one line starting ``repro.distribute:``.

    The steps, in order (each a function below): the model and optimizer, distribute's own keywords
    (declared in :data:`_KEYWORDS`), the scheduler or plan (a given plan fits the model), where the ranks
    go, the scheduler's options against their declarations (:mod:`repro.core.run_options`), then the plan,
    the executor and the wrapped optimizer."""
    _check_model_and_optimizer(model, optimizer)
    _check_keywords(view=view, warmup_steps=warmup_steps, fit_repeats=fit_repeats, grad_scaler=grad_scaler,
                    dedicated_servers=dedicated_servers, model_name=model_name, wrap_after_warmup=wrap_after_warmup)
    if network is not None and cost is not None:
        _fail("give network or cost, not both")
    run = _choose(scheduler, model, view)  # the scheduler, or a given plan (which fits the model)
    _check_placement(run, model, options, grad_scaler, dedicated_servers, wrap_after_warmup)
    _check_options(run, model, options, wire_dtype)
    if run.alone:  # nothing to exchange, no network to plan for: _one_rank_scheduler's baseline, with no options
        run.name = _one_rank_scheduler(run.name, run.sched, network, cost)
        run.sched, run.plan_now = get_scheduler(run.name), False
        run.planner_options, run.executor_options = {}, {}
    _check_executor_can_run(run, model)
    network_cost = _network_cost(network, cost, run.trainers)
    # the plan (every check is made: the collectives start here, on every rank alike)
    if run.plan_now:
        run.plan, _, _ = plan_online(run.name, _sizes_trace(model, view), next(model.parameters()).device,
                                     planner_options=run.planner_options, network_cost=network_cost,
                                     fit_repeats=fit_repeats)
    # the executor (the door's), then the wrapped optimizer
    placement = Placement(trace_name=model_name)
    if dedicated_servers:
        placement = run.servers.place(model, optimizer, dedicated=dedicated_servers, name=run.name, plan=run.plan,
                                      planner_options=run.planner_options, network_cost=network_cost, view=view,
                                      fit_repeats=fit_repeats, model_name=model_name)
        if isinstance(placement, torch.optim.Optimizer):  # a serving rank: the run is over here
            return model, placement
    else:
        broadcast_module_state(model, placement.first, placement.group)
    door = _Door(model, optimizer, run.name, run.plan, warmup_steps=warmup_steps, network_cost=network_cost,
                 view=view, planner_options=run.planner_options, executor_options=run.executor_options,
                 fit_repeats=fit_repeats, record_timeline=record_timeline, grad_scaler=grad_scaler,
                 context=placement)
    dopt = _wrap_optimizer(model, optimizer, door)
    if run.servers is not None:
        run.servers.attach(dopt, dedicated_servers)
    return door.ex.module, dopt


# ---------------------------------------------------------------------------------------------
# distribute's steps, in the order it takes them
# ---------------------------------------------------------------------------------------------

def _check_model_and_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The process group is up, ``model`` and ``optimizer`` are what every scheduler can train (one line
    each, read from them alone, so every rank decides alike before any collective)."""
    if not dist.is_available() or not dist.is_initialized():
        _fail("the default process group is not initialised: call torch.distributed.init_process_group() "
              "first (under torchrun it reads its settings from the environment)")
    if not isinstance(model, nn.Module):
        _fail(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        _fail(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, DistributedOptimizer):
        _fail("this optimizer is already distributed")
    own = {id(p) for p in model.parameters()}
    if not any(p is not None and id(p) in own for g in optimizer.param_groups for p in g["params"]):
        _fail("the optimizer holds none of the model's parameters")
    refusal = _model_refusal(model, optimizer)
    if refusal is not None:
        _fail(refusal)
    if getattr(model, "no_sync", None) is not None:
        _fail(f"the model already has a 'no_sync' ({type(model).__name__}.no_sync): distribute the plain module "
              f"(not one wrapped by DDP) so that model.no_sync() can hold off this package's exchange")


@dataclass(frozen=True)
class _Keyword:
    """One of distribute's own keywords, declared: a bad value is refused as ``"{name} must be {must_be},
    got {shown(value)}"``."""

    name: str
    must_be: str
    ok: Callable[[Any], bool]
    shown: Callable[[Any], str] = repr


def _integer_from(low: int) -> Callable[[Any], bool]:
    return lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= low


#: distribute's keywords that every scheduler takes (the scheduler's own options are declared in
#: repro.core.run_options, checked by :func:`_check_options`)
_KEYWORDS = (
    _Keyword("view", f"one of {', '.join(VIEWS)}", lambda v: isinstance(v, str) and v in VIEWS),
    _Keyword("warmup_steps", "an integer >= 1", _integer_from(1)),
    _Keyword("fit_repeats", "an integer >= 1", _integer_from(1)),
    _Keyword("dedicated_servers", "an integer >= 0", _integer_from(0)),
    _Keyword("grad_scaler", "a torch.amp.GradScaler",
             lambda v: v is None or all(hasattr(v, a) for a in ("scale", "unscale_", "update")),
             shown=lambda v: type(v).__name__),
    _Keyword("model_name", "a non-empty string", lambda v: v is None or (isinstance(v, str) and bool(v.strip()))),
    _Keyword("wrap_after_warmup", "True or False", lambda v: isinstance(v, bool)),
)


def _check_keywords(**values: Any) -> None:
    """Each of ``values`` (distribute's keywords, by name) checked against its declaration in :data:`_KEYWORDS`."""
    for keyword in _KEYWORDS:
        value = values[keyword.name]
        if not keyword.ok(value):
            _fail(f"{keyword.name} must be {keyword.must_be}, got {keyword.shown(value)}")


@dataclass
class _Run:
    """What distribute settles before any collective: the scheduler (``name``/``sched``; None for a plan
    given on its own), the plan (given, or made at once from the parameters' sizes when ``plan_now``),
    the family, the checked options split by who takes them, and the ranks."""

    name: str | None
    sched: Scheduler | None
    plan: Plan | None
    family: str | None
    world: int
    trainers: int
    plan_now: bool = False
    planner_options: dict[str, Any] = field(default_factory=dict)
    executor_options: dict[str, Any] = field(default_factory=dict)

    @property
    def servers(self) -> Any:
        """The family's server ranks under distribute (:class:`repro.runtime.serving.DoorServers`), or None."""
        return get_family(self.family).hook("door_servers") if self.family is not None else None

    @property
    def alone(self) -> bool:
        """A job of one rank with a scheduler that would plan: it runs as :func:`_one_rank_scheduler` says."""
        return self.world == 1 and self.plan is None and self.sched is not None and self.sched.has_plan

    @property
    def executor_class(self) -> type:
        return (self.sched.executor_class() if self.sched is not None
                else get_family(self.plan.family).executor_class())

    @property
    def takes(self) -> tuple[str, ...]:
        """The run options this run takes: its scheduler's, or a given plan's family executor's."""
        if self.sched is not None:
            return tuple(self.sched.planner_options + self.sched.executor_options)
        return tuple(get_family(self.plan.family).executor_options)


def _choose(scheduler: Any, model: nn.Module, view: str) -> _Run:
    """The scheduler by name, or the plan (a Plan or a plan file) and its family; a given plan fits the
    model (:func:`repro.runtime.plan_fit.check_plan_fits`, the one check of that rule on the door's path);
    a model that makes sparse gradients needs a scheduler that exchanges them."""
    plan = _load_plan(scheduler)
    name, sched = None, None
    if plan is None:
        if not isinstance(scheduler, str):
            _fail(f"scheduler must be a name, a Plan or a plan file, got {type(scheduler).__name__}")
        try:
            sched = get_scheduler(scheduler)
        except ValueError as e:
            _fail(str(e))
        name = sched.name  # a paper's name (dear) or an old alias: the scheduler's own name from here on
    else:
        try:
            check_plan_fits(plan, model, view)
        except PlanError as e:
            _fail(str(e))
    family = sched.family if sched is not None else plan.family
    if not (sched is not None and sched.sparse_gradients):
        sparse = _sparse_gradient_source(model)
        if sparse is not None:
            able = [n for n, s in SCHEDULERS.items() if s.sparse_gradients and s.communicates]
            who = f"scheduler {name!r}" if name else f"the executor of a given {family} plan"
            _fail(f"{sparse} makes sparse gradients, which {who} cannot exchange (it exchanges dense buffers): pass "
                  f"sparse=False, or use a scheduler that exchanges them ({', '.join(able)})")
    world = dist.get_world_size()
    return _Run(name, sched, plan, family, world, world)


def _check_placement(run: _Run, model: nn.Module, options: dict[str, Any], grad_scaler: Any,
                     dedicated_servers: int, wrap_after_warmup: bool) -> None:
    """Where the run's ranks go: dedicated servers (``options['servers']`` set to them), the device on the
    backend, co-located servers' count; and whether the returned model is the one that trains (an
    executor that wraps the model is planned now, from the parameters' sizes, unless
    ``wrap_after_warmup``). ``options`` is updated."""
    if dedicated_servers and run.servers is None:
        with_servers = [f.name for f in FAMILIES.values() if f.door_servers is not None]
        able = [n for n, s in SCHEDULERS.items() if s.family in with_servers]
        _fail(f"dedicated_servers applies to a family with server ranks ({', '.join(with_servers)}: "
              f"{', '.join(able)}), not to {run.name or 'a ' + str(run.family) + ' plan'}")
    if run.family is not None:
        _check_device_tensors_on_backend(model, run.family, run.name)
    if run.servers is not None:
        try:
            options.update(run.servers.settle_options(
                dedicated_servers, name=run.name, plan=run.plan, grad_scaler=grad_scaler, options=options,
                planner_options=run.sched.planner_options if run.sched else (), world=run.world))
        except ValueError as e:
            _fail(str(e))
        run.trainers = run.world - dedicated_servers
    sched = run.sched
    if (not wrap_after_warmup and sched is not None and sched.has_plan and run.plan is None
            and run.executor_class.module is not Executor.module):
        if sched.online:
            _fail(f"'{run.name}' plans online and then wraps the model (its executor's module is another object), so "
                  "the model you hold during the warm-up would not be the one that trains; plan first (repro "
                  "plan) and pass the Plan, or pass wrap_after_warmup=True and call optimizer.module")
        # a planner that does not plan from measurements (e.g. ddp_threshold's sizes), whose executor wraps
        # the model: planned now, so that the returned module (the wrapper) is the one used from step 1
        run.plan_now = True


def _check_options(run: _Run, model: nn.Module, options: dict[str, Any], wire_dtype: Any) -> None:
    """The scheduler's own options (``options``) checked once against their declarations
    (:mod:`repro.core.run_options`): one the run does not take, or a bad value, is refused in one line; then
    ``wire_dtype`` (:func:`repro.core.run_options.check_wire_dtype`) and what the executor can refuse before
    a plan exists. Sets ``run.planner_options`` and ``run.executor_options``."""
    takes = run.takes
    undeclared = sorted(k for k in takes if k not in RUN_OPTIONS) if run.sched is None else []
    if undeclared:  # a family from another package that forgot register_run_option
        _fail(f"{', '.join(undeclared)}: taken by the {run.family} family's executor but not declared as a run "
              "option (repro.core.run_options.register_run_option)")
    unknown = sorted(set(options) - set(takes))
    if unknown:
        _fail(f"option(s) {', '.join(unknown)} do not apply to scheduler {run.name or 'given as a plan'} "
              f"(it takes: {', '.join(sorted(takes)) or 'none'})")
    try:  # the values, by the options' declarations
        if run.sched is not None:  # (an option of its own, not a declared run option, as it is: dear_bo's seed)
            options.update(check_run_options({k: v for k, v in options.items() if k in RUN_OPTIONS}, run.sched))
        else:
            options.update({k: RUN_OPTIONS[k].validate(v) for k, v in options.items()})
    except ValueError as e:
        _fail(str(e))
    wire = _check_wire(run, model, wire_dtype)
    planner = set(run.sched.planner_options) if run.sched is not None else set()
    run.planner_options = {k: v for k, v in options.items() if k in planner}
    if wire is not None:  # None: the gradients' own dtype, nothing to cast
        run.planner_options["wire_dtype"] = wire
    executor = set(run.sched.executor_options) if run.sched is not None else set(takes)
    run.executor_options = {k: v for k, v in options.items() if k in executor and v is not None}


def _check_executor_can_run(run: _Run, model: nn.Module) -> None:
    """What the run's executor can tell it cannot run from the options, a given plan and the model is
    refused now, before any collective, instead of once the plan is made (the all-reduce executor:
    ``engine='reducer'`` with a wire dtype or on a GPU, the same rule as ``repro train``'s config check)."""
    early_check = getattr(run.executor_class, "check_run_options", None)
    if early_check is not None:
        try:
            early_check({**run.planner_options, **run.executor_options}, run.plan, model)
        except (ValueError, PlanError) as e:
            _fail(str(e))


def _check_wire(run: _Run, model: nn.Module, wire_dtype: Any) -> str | None:
    """The wire dtype the scheduler is given (None: each gradient in its own dtype), or one line."""
    if wire_dtype is None:
        return None
    if not isinstance(wire_dtype, str) or wire_dtype not in WIRE_DTYPE_BYTES:
        _fail(f"unknown wire_dtype {wire_dtype!r}; choose one of {', '.join(WIRE_DTYPE_BYTES)} (by name)")
    if run.sched is None:
        _fail("wire_dtype does not apply to a given plan, which fixes its own (make the plan with wire_dtype)")
    own = {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad
           and p.is_floating_point()}
    try:
        return check_wire_dtype(wire_dtype, run.sched, sorted(own))
    except ValueError as e:
        _fail(str(e))


def _network_cost(network: str | None, cost: Any, trainers: int) -> CostModel | None:
    """The cost model ``network`` (a preset for ``trainers`` ranks) or ``cost`` (a CostModel or its file)
    gives, or None (the family fits one on the live group)."""
    if network is not None:
        try:
            return preset(network, trainers)
        except (ValueError, KeyError) as e:
            _fail(str(e).splitlines()[0])
    if cost is None:
        return None
    try:
        model = cost if isinstance(cost, CostModel) else CostModel.load(cost)
    except ValueError as e:
        _fail(f"cost: {str(e).splitlines()[0]}")
    if model.workers != trainers:
        _fail(f"cost: the cost model is for P={model.workers} workers, this job trains on {trainers}")
    return model


def _wrap_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, door: _Door) -> DistributedOptimizer:
    """The returned optimizer; the model gets DDP's ``no_sync`` and ``module`` (unless a baseline's wrapper
    has its own), and the given optimizer refuses direct steps while the door is live."""
    if door.ex.module is model:
        model.__dict__["no_sync"] = door.no_sync  # DDP's spelling: `with model.no_sync(): loss.backward()`
        _give_module(model)
    dopt = DistributedOptimizer(optimizer, door)
    _refuse_direct_steps(optimizer, door)
    return dopt


def _check_device_tensors_on_backend(model: nn.Module, family: str, name: str | None) -> None:
    """A family whose executor cannot pass CUDA tensors to gloo (``Family.gloo_cpu_only``) refused in one
    line when ``model`` is on a GPU and the process group is gloo."""
    why = get_family(family).gloo_cpu_only
    if why and dist.get_backend() == "gloo" and any(p.is_cuda for p in model.parameters()):
        _fail(f"{name or 'a ' + family + ' plan'} cannot train a CUDA model over gloo: {why}; use the nccl "
              "backend (one GPU per rank) or keep the model on the CPU")


def _sizes_trace(model: nn.Module, view: str) -> Any:
    """A trace of the model's layers in registration order (taken as the forward order, as DDP does)
    with their gradient sizes and no times: what a planner that plans from sizes alone needs."""
    from repro.core.trace import Layer, Trace

    layers = [Layer(name, sum(p.numel() for _, p in params), sum(p.numel() * p.element_size() for _, p in params),
                    0.0, 0.0) for name, params in layer_parameters(model, view).items()]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return Trace(type(model).__name__, 1, str(next(model.parameters()).device), dtype, layers,
                 extra={"source": "parameter sizes", "view": view})
