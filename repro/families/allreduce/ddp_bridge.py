"""Run an all-reduce Plan's buckets with PyTorch DDP itself, and check that DDP did::

    caps_mb = ddp_bucket_caps(plan, model)               # one cap per plan bucket, in MiB
    ddp = DistributedDataParallel(model, bucket_cap_mb_list=caps_mb)
    ... two training iterations (DDP rebuilds its buckets at the start of the second forward) ...
    check_ddp_buckets(ddp, plan)                         # one line naming the first bucket that differs

Needs an all-reduce plan of whole layers covering the model, buckets contiguous in the order DDP walks
the parameters, and one parameter dtype. How DDP forms buckets: docs/design/families.md.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from repro.core.plan import Plan, PlanError
from repro.runtime.plan_fit import check_plan_fits
from repro.workload.layers import layer_parameters

__all__ = ["ddp_bucket_caps", "check_ddp_buckets", "ddp_buckets"]

_MIB = 2 ** 20


def _plan_params(plan: Plan, model: nn.Module, view: str) -> list[list[nn.Parameter]]:
    """The model's parameters of each plan bucket (plan order), after checking the plan fits."""
    if plan.family != "allreduce":
        raise PlanError(f"DDP runs all-reduce plans; this plan is of the '{plan.family}' family")
    if any(b.piece is not None for b in plan.buckets):
        raise PlanError("DDP buckets hold whole parameters; this plan splits layers into pieces")
    check_plan_fits(plan, model, view)
    layers = layer_parameters(model, view)
    dtypes = sorted({str(p.dtype) for ps in layers.values() for _, p in ps})
    if len(dtypes) > 1:
        raise PlanError(f"the model mixes parameter dtypes ({', '.join(dtypes)}); DDP buckets each dtype apart, "
                        "so one cap list cannot reproduce the plan")
    return [[p for name in b.layers for _, p in layers[name]] for b in plan.buckets]


def ddp_bucket_caps(plan: Plan, model: nn.Module, *, view: str = "tensor", find_unused_parameters: bool = False,
                    static_graph: bool = False) -> list[float]:
    """DDP's ``bucket_cap_mb_list`` (MiB per bucket) that makes DDP's buckets the plan's buckets.

    ``model``: the module DDP will wrap (the plan's layer names are its names in ``view``).
    ``find_unused_parameters`` / ``static_graph``: what will be passed to DDP (they decide whether DDP
    rebuilds its buckets after the first iteration, hence the order of the caps; see the module)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "bucket_cap_mb_list" not in inspect.signature(DistributedDataParallel).parameters:
        raise RuntimeError("this torch's DistributedDataParallel takes no bucket_cap_mb_list (per-bucket caps); "
                           "upgrade torch, or run the plan with repro.distribute")
    sizes_bytes = [sum(p.numel() * p.element_size() for p in ps) for ps in _plan_params(plan, model, view)]
    caps_mb = [b / _MIB for b in sizes_bytes]
    rebuilds = static_graph or not find_unused_parameters
    return caps_mb if rebuilds else caps_mb[::-1]


def ddp_buckets(ddp: Any) -> list[list[nn.Parameter]]:
    """DDP's current buckets (reduction order, bucket 0 reduced first), as lists of parameters: from
    its reducer (``_get_zeros_like_grad_buckets``, the bucket views DDP itself uses)."""
    reducer = getattr(ddp, "reducer", None)
    if reducer is None or not hasattr(reducer, "_get_zeros_like_grad_buckets"):
        raise RuntimeError("this DistributedDataParallel exposes no reducer buckets (a python reducer, or a "
                           "torch without Reducer._get_zeros_like_grad_buckets)")
    buckets = sorted(reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
    return [list(b.parameters()) for b in buckets]


def check_ddp_buckets(ddp: Any, plan: Plan, *, view: str = "tensor") -> None:
    """Raise ValueError, in one line naming the first bucket that differs, unless DDP's buckets are the
    plan's (the same parameters in each, in the plan's order). Call it after DDP's second forward
    (DDP rebuilds its buckets then, unless ``find_unused_parameters=True``)."""
    module = ddp.module
    wanted = _plan_params(plan, module, view)
    names = {id(p): n for n, p in module.named_parameters()}
    actual = ddp_buckets(ddp)
    rebuilt = bool(ddp._get_ddp_logging_data().get("has_rebuilt_buckets", 0)) if hasattr(
        ddp, "_get_ddp_logging_data") else True
    when = "" if rebuilt or ddp.find_unused_parameters else (" (DDP has not rebuilt its buckets yet: check after "
                                                             "its second forward)")
    for k in range(max(len(wanted), len(actual))):
        plan_k = sorted(names[id(p)] for p in wanted[k]) if k < len(wanted) else []
        ddp_k = sorted(names.get(id(p), "?") for p in actual[k]) if k < len(actual) else []
        if plan_k != ddp_k:
            def show(ns: list[str]) -> str:
                return "nothing" if not ns else f"{ns[:4]}{'...' if len(ns) > 4 else ''} ({len(ns)} tensors)"
            raise ValueError(f"DDP's bucket {k} (of {len(actual)}) holds {show(ddp_k)} but the plan's bucket {k} "
                             f"(of {len(wanted)}) holds {show(plan_k)}{when}")
