"""The plan-fits-model rule on a live model: :func:`check_plan_fits`, the torch side of
:func:`repro.core.plan.plan_fit_refusal` (one rule, one wording, for the door and every executor)."""

from __future__ import annotations

from torch import nn

from repro.core.plan import Plan, PlanError, plan_fit_refusal
from repro.workload.layers import VIEWS, layer_parameters

__all__ = ["check_plan_fits"]


def check_plan_fits(plan: Plan, model: nn.Module, view: str) -> None:
    """PlanError (one line, :func:`repro.core.plan.plan_fit_refusal`) unless every layer ``plan`` names is one of
    ``model``'s in ``view`` and every one of them is in a bucket. :func:`repro.distribute` checks this
    before any collective; an executor built directly calls it too, so it never runs a plan that does
    not fit."""
    layers = list(layer_parameters(model, view))
    refusal = plan_fit_refusal(plan, layers, view, views=_other_views(model, view, plan, layers))
    if refusal is not None:
        raise PlanError(refusal)


def _other_views(model: nn.Module, view: str, plan: Plan, layers: list[str]) -> dict[str, list[str]]:
    """The model's layers in the views other than ``view``, only computed when the plan names an unknown layer."""
    names = set(layers)
    if all(layer in names for b in plan.buckets for layer in b.layers):
        return {}
    return {v: list(layer_parameters(model, v)) for v in VIEWS if v != view}
