"""What both parameter-server executors share: the plan's buckets laid out on a model's parameters,
flattening them into one message, and the per-bucket timing record. The dedicated-server protocol
(:mod:`repro.families.ps.executor`) and the co-located one (:mod:`repro.families.ps.colocated`) import it; it
imports neither, so they do not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from repro.core.plan import Plan, PlanError
from repro.runtime.deferred import hyperparameters  # noqa: F401 - the families' one copy of the groups' settings
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["PSTiming", "ps_layout", "HandOverOptimizer"]


@dataclass
class PSTiming:
    """One bucket of the last step (``--record-timeline``): when its push was launched and when its pull
    finished (seconds on the host ``perf_counter`` base; on NCCL the device's times, from CUDA events,
    delivered by ``settle_timings()``). A stage-2 pull is installed two steps later, after this step's
    record was taken, so its ``end_s`` stays None."""

    bucket: int
    stage: int
    server: int
    bytes: int
    launch_s: float
    end_s: float | None = None


@dataclass(frozen=True)
class _Bucket:
    index: int
    stage: int              # 1 (blocking) or 2 (background)
    server: int
    params: tuple           # parameters in bucket order
    numel: int


def ps_layout(model: nn.Module, plan: Plan, view: str) -> list[_Bucket]:
    """The plan's buckets with their parameters on ``model`` (PlanError if the plan does not fit)."""
    from repro.families.ps.simulate import plan_layout

    if plan is None or plan.family != "ps":
        raise PlanError(f"a parameter-server run needs a 'ps' plan, got {getattr(plan, 'family', None)!r}")
    check_plan_fits(plan, model, view)
    layers = layer_parameters(model, view)
    out = []
    for b, (bucket, (stage, server)) in enumerate(zip(plan.buckets, plan_layout(plan))):
        params = [p for name in bucket.layers for _, p in layers[name]]
        out.append(_Bucket(b, stage, server, tuple(params), sum(p.numel() for p in params)))
    if sum(len(b.params) for b in out) != sum(len(v) for v in layers.values()):
        raise PlanError("a parameter-server plan holds each layer in one bucket; this one names a layer twice")
    return out


def _flatten_into(buf: torch.Tensor, tensors) -> None:
    off = 0
    for t in tensors:
        n = t.numel()
        buf[off:off + n].copy_(t.reshape(-1))
        off += n


def _unflatten_from(buf: torch.Tensor, params) -> None:
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(buf[off:off + n].view_as(p))
            off += n


class HandOverOptimizer:
    """What the loop steps on a parameter-server rank: the servers apply the optimizer, so ``step()``
    only hands over to the executor (``finish()``: install what the servers computed); ``zero_grad``,
    ``param_groups``, ``state_dict`` and ``load_state_dict`` are the wrapped optimizer's."""

    def __init__(self, executor: Any, optimizer: Any, finish: Callable[[], None]) -> None:
        self.executor = executor
        self.optimizer = optimizer
        self._finish = finish

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self._finish()

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state) -> None:
        self.optimizer.load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# What a push carries besides the gradient, and what the owners keep for the user's optimizer
# ---------------------------------------------------------------------------------------------

def push_numel(bucket: _Bucket) -> int:
    """Elements of one push of ``bucket``: its flat gradient, then one "had a gradient" flag per
    parameter (1 or 0 in the gradient's dtype; summed over the ranks by a reduce, a count)."""
    return bucket.numel + len(bucket.params)


def fill_push(buf: torch.Tensor, bucket: _Bucket) -> None:
    """``buf`` (:func:`push_numel` elements) <- this rank's gradients of ``bucket`` (zeros where
    ``param.grad`` is None) and their flags (1 where it is not)."""
    grads, flags = buf[:bucket.numel], buf[bucket.numel:]
    off = 0
    for i, p in enumerate(bucket.params):
        n = p.numel()
        if p.grad is None:
            grads[off:off + n].zero_()
            flags[i] = 0
        else:
            grads[off:off + n].copy_(p.grad.reshape(-1))
            flags[i] = 1
        off += n


def average_into_grads(buckets: list[_Bucket], push: dict[int, torch.Tensor], group: Any, divisor: int) -> int:
    """``synchronize()`` under BSP/OSP: every bucket's gradients and "had a gradient" flags
    (:func:`fill_push` into ``push[bucket.index]``) all-reduced over ``group`` and divided by ``divisor``
    (the ranks that push); ``param.grad`` becomes that average (None stays None where no rank had a
    gradient). A collective of ``group``. Returns the bytes all-reduced."""
    import torch.distributed as dist

    works = []
    with torch.no_grad():
        for b in buckets:
            buf = push[b.index]
            fill_push(buf, b)
            works.append((b, buf, dist.all_reduce(buf, group=group, async_op=True)))
        nbytes = 0
        for b, buf, work in works:
            work.wait()
            buf[:b.numel].div_(divisor)
            off = 0
            for p, used in zip(b.params, (buf[b.numel:] > 0).tolist()):
                n = p.numel()
                if used:
                    v = buf[off:off + n].view_as(p)
                    if p.grad is None:
                        p.grad = v.clone()
                    else:
                        p.grad.copy_(v)
                off += n
            nbytes += buf.numel() * buf.element_size()
    return nbytes


def begin_step(ex: Any) -> tuple[bool, int]:
    """The start of a parameter-server executor's step (co-located or dedicated: both keep ``_push_due``,
    ``_synced`` and ``_watch``): refuse a step without a backward, consume the step (a refused step is
    dropped, so ``flush()`` and ``remove()`` still work); returns whether ``synchronize()`` ran this step
    and how many gradients changed since backward without it (0 after it)."""
    if not ex._push_due:
        raise RuntimeError("step() without after_backward(): the parameter server has no gradient to apply")
    synced, ex._synced = ex._synced, False
    ex._push_due = False
    changed = 0 if synced else ex._watch.changed()
    ex._watch.clear()
    return synced, changed


def set_grads_from(buf: torch.Tensor, bucket: _Bucket) -> None:
    """Set ``bucket``'s ``param.grad`` to views of a push's gradient part where its flag (a count)
    is positive, None where no rank had a gradient (the optimizer then leaves the parameter, and its
    state, alone: DDP's ``find_unused_parameters`` rule)."""
    grads, flags = buf[:bucket.numel], buf[bucket.numel:]
    used = (flags > 0).tolist()
    off = 0
    for p, u in zip(bucket.params, used):
        n = p.numel()
        p.grad = grads[off:off + n].view_as(p) if u else None
        off += n


def set_hyperparameters(optimizer: Any, saved: list[dict]) -> None:
    """Put :func:`hyperparameters` back into ``optimizer``'s parameter groups (matched by position)."""
    if len(saved) != len(optimizer.param_groups):
        raise RuntimeError(f"the optimizer has {len(optimizer.param_groups)} parameter group(s), its saved "
                           f"settings {len(saved)}: add_param_group during a parameter-server run is not supported")
    for group, values in zip(optimizer.param_groups, saved):
        group.update(values)


class GradChangeWatch:
    """Notices a ``param.grad`` replaced or modified in place between backward and the push (tensor
    identity and version counter). ``GradScaler.unscale_`` does not bump the version counter, so an
    unscale alone is not seen (harmless: it is linear)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self._seen: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._record) for p in params]

    def _record(self, p: torch.Tensor) -> None:
        if p.grad is not None:
            self._seen[id(p)] = (p, p.grad, p.grad._version)

    def changed(self) -> int:
        """How many parameters' gradients changed since backward recorded them."""
        return sum(1 for p, g, v in self._seen.values() if p.grad is not g or g._version != v)

    def clear(self) -> None:
        self._seen.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._seen.clear()


def grad_changed_error(count: int) -> ValueError:
    return ValueError(
        f"parameter server: param.grad of {count} parameter(s) changed between backward() and step() (e.g. "
        "clip_grad_norm_): the push would send this rank's own changed gradient, not a change of the average "
        "as under DDP; call optimizer.synchronize() before changing gradients (param.grad then holds what is "
        "pushed), or use optimizer.clip_grad_norm_(max_norm)")


# ---------------------------------------------------------------------------------------------
# The optimizer's state, whole on every rank (each server's shard holds its parameters' part)
# ---------------------------------------------------------------------------------------------

#: key of a gathered state dict: the indices of the parameters that had state when it was gathered
GATHERED_KEY = "ps_gathered_state"


def param_indices(optimizer: Any) -> dict[int, int]:
    """id(param) -> its index in ``optimizer.state_dict()`` (parameters numbered across groups)."""
    return {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}


def merge_shards(state_dict: dict, shards: dict[int, dict], owned: dict[int, int]) -> dict:
    """``state_dict`` with the state of every parameter a server owns (``owned``: index -> server)
    taken from that server's shard (``shards``: server -> {index: state}; absent there: no state);
    a parameter no server owns keeps this rank's entry. Marked with :data:`GATHERED_KEY`."""
    state = {i: s for i, s in state_dict["state"].items() if i not in owned}
    for i, server in owned.items():
        if i in shards.get(server, {}):
            state[i] = shards[server][i]
    out = {**state_dict, "state": dict(sorted(state.items()))}
    out[GATHERED_KEY] = sorted(state)
    return out


def check_whole(state_dict: dict) -> dict:
    """Refuse (one line) a gathered state dict some of whose parameters' state was removed (e.g. one
    shard's part kept); returns it without the marker."""
    expected = state_dict.get(GATHERED_KEY)
    if expected is None:
        return state_dict
    missing = sorted(set(expected) - set(state_dict["state"]))
    if missing:
        raise ValueError(f"parameter server: this optimizer state dict lacks the state of {len(missing)} of the "
                         f"{len(expected)} parameters that had state when it was gathered (e.g. index {missing[0]}): "
                         "a part of the shards; load the whole dict that optimizer.state_dict() returns (on every "
                         "rank)")
    return {k: v for k, v in state_dict.items() if k != GATHERED_KEY}
