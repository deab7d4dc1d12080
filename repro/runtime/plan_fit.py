"""The plan-fits-model rule on a live model: the torch side of :func:`repro.core.plan.plan_fit_refusal`."""

from __future__ import annotations

from torch import nn

from repro.core.plan import Plan, PlanError, plan_fit_refusal
from repro.workload.layers import VIEWS, layer_parameters

__all__ = ["check_plan_fits"]


def check_plan_fits(plan: Plan, model: nn.Module, view: str) -> None:
    """PlanError (one line) unless the layers ``plan`` buckets are exactly ``model``'s in ``view``; checked
    before any collective, by :func:`repro.distribute` and by an executor built directly."""
    layers = list(layer_parameters(model, view))
    refusal = plan_fit_refusal(plan, layers, view, views=_other_views(model, view, plan, layers))
    if refusal is not None:
        raise PlanError(refusal)


def _other_views(model: nn.Module, view: str, plan: Plan, layers: list[str]) -> dict[str, list[str]]:
    """The model's layers in the other views, computed only when the plan names an unknown layer."""
    names = set(layers)
    if all(layer in names for b in plan.buckets for layer in b.layers):
        return {}
    return {v: list(layer_parameters(model, v)) for v in VIEWS if v != view}
