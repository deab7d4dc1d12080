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
    """One bucket of the last step: when its push was launched and its pull finished (``perf_counter``
    seconds; device times on NCCL, after ``settle_timings()``); ``end_s`` stays None for stage 2."""

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


def _views(flat: torch.Tensor, tensors) -> list[torch.Tensor]:
    """Consecutive views of ``flat`` shaped as ``tensors``."""
    sizes = [t.numel() for t in tensors]
    return [v.view_as(t) for v, t in zip(flat[:sum(sizes)].split(sizes), tensors)]


def _flatten_into(buf: torch.Tensor, tensors) -> None:
    for v, t in zip(_views(buf, tensors), tensors):
        v.copy_(t)


def _unflatten_from(buf: torch.Tensor, params) -> None:
    with torch.no_grad():
        for p, v in zip(params, _views(buf, params)):
            p.copy_(v)


def param_lrs(optimizer: Any, params) -> list[float]:
    """Each parameter's learning rate now (its group's; the first group's if it is in none)."""
    group_of = {id(p): float(g["lr"]) for g in optimizer.param_groups for p in g["params"]}
    first = float(optimizer.param_groups[0]["lr"])
    return [group_of.get(id(p), first) for p in params]


class HandOverOptimizer:
    """What the loop steps on a parameter-server rank: ``step()`` hands over to the executor's
    ``finish()``; everything else is the wrapped optimizer's."""

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


def push_numel(bucket: _Bucket) -> int:
    """Elements of one push of ``bucket``: its flat gradient, then one "had a gradient" flag (1 or 0)
    per parameter."""
    return bucket.numel + len(bucket.params)


def fill_push(buf: torch.Tensor, bucket: _Bucket) -> None:
    """``buf`` (:func:`push_numel` elements) <- this rank's gradients of ``bucket`` (zeros where
    ``param.grad`` is None) and their flags (1 where it is not)."""
    flags = buf[bucket.numel:]
    for i, (p, v) in enumerate(zip(bucket.params, _views(buf, bucket.params))):
        if p.grad is None:
            v.zero_()
            flags[i] = 0
        else:
            v.copy_(p.grad)
            flags[i] = 1


def average_into_grads(buckets: list[_Bucket], push: dict[int, torch.Tensor], group: Any, divisor: int) -> int:
    """``synchronize()`` under BSP/OSP, a collective of ``group``: every bucket's push all-reduced and
    divided by ``divisor``; ``param.grad`` becomes that average (None where no rank had a gradient).
    Returns the bytes all-reduced."""
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
            for p, v, used in zip(b.params, _views(buf, b.params), (buf[b.numel:] > 0).tolist()):
                if used and p.grad is None:
                    p.grad = v.clone()
                elif used:
                    p.grad.copy_(v)
            nbytes += buf.numel() * buf.element_size()
    return nbytes


def begin_step(ex: Any) -> tuple[bool, int]:
    """Start a PS executor's step (either kind: ``_push_due``, ``_synced``, ``_watch``): refuse one
    without a backward, consume it; returns ``(synchronize() ran, gradients changed without it)``."""
    if not ex._push_due:
        raise RuntimeError("step() without after_backward(): the parameter server has no gradient to apply")
    synced, ex._synced = ex._synced, False
    ex._push_due = False
    changed = 0 if synced else ex._watch.changed()
    ex._watch.clear()
    return synced, changed


def set_grads_from(buf: torch.Tensor, bucket: _Bucket) -> None:
    """Set ``bucket``'s ``param.grad`` to views of a push's gradients where its flag (a count) is
    positive, else None (the optimizer leaves the parameter alone: DDP's unused-parameter rule)."""
    used = (buf[bucket.numel:] > 0).tolist()
    for p, v, u in zip(bucket.params, _views(buf, bucket.params), used):
        p.grad = v if u else None


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


#: key of a gathered state dict: the indices of the parameters that had state when it was gathered
GATHERED_KEY = "ps_gathered_state"


def param_indices(optimizer: Any) -> dict[int, int]:
    """id(param) -> its index in ``optimizer.state_dict()`` (parameters numbered across groups)."""
    return {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}


def merge_shards(state_dict: dict, shards: dict[int, dict], owned: dict[int, int]) -> dict:
    """``state_dict`` with each owned parameter's state (``owned``: index -> server) from its server's
    shard (``shards``: server -> {index: state}); others keep this rank's. Marked :data:`GATHERED_KEY`."""
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
