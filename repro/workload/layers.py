"""Layers of a model: which parameters make up each layer a Trace names, and their sizes.

``view="tensor"``: one layer per learnable parameter tensor, named by its qualified name.
``view="module"``: one layer per module that directly owns parameters, named by the module's
qualified name (``"<root>"`` for the model itself). Tied parameters belong to their first owner.
The profiler, the estimator and the runtime executors all use these names, so a Trace measured or
estimated here maps onto the live model's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

__all__ = ["VIEWS", "Param", "learnable_params", "unit_name", "unit_sizes", "layer_parameters"]

VIEWS = ("tensor", "module")


@dataclass(frozen=True)
class Param:
    """A learnable parameter: qualified ``name`` (the first, for tied ones), the ``owner`` module's
    qualified name (the first that directly owns it) and the tensor."""

    name: str
    owner: str
    tensor: nn.Parameter


def learnable_params(model: nn.Module) -> list[Param]:
    """Distinct parameters requiring grad, in ``model.named_parameters()`` order, with owners."""
    out: list[Param] = []
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            out.append(Param(f"{mod_name}.{pname}" if mod_name else pname, mod_name, p))
    if not out:
        raise ValueError("the model has no learnable parameters")
    return out


def unit_name(module_fqn: str) -> str:
    """Layer name of a module in the ``module`` view (``"<root>"`` for the model itself)."""
    return module_fqn or "<root>"


def _check_view(view: str) -> None:
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; valid views: {', '.join(VIEWS)}")


def unit_sizes(params: list[Param], view: str, bytes_per_element: int | None = None
               ) -> dict[str, tuple[int, int]]:
    """Layer name -> (parameter count, gradient bytes); ``bytes_per_element`` overrides the dtype's."""
    _check_view(view)
    sizes: dict[str, tuple[int, int]] = {}
    for p in params:
        u = p.name if view == "tensor" else unit_name(p.owner)
        n = p.tensor.numel()
        b = n * (bytes_per_element or p.tensor.element_size())
        old = sizes.get(u, (0, 0))
        sizes[u] = (old[0] + n, old[1] + b)
    return sizes


def layer_parameters(model: nn.Module, view: str = "tensor") -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Layer name -> [(parameter name, parameter)], in ``model.named_parameters()`` order."""
    _check_view(view)
    out: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for p in learnable_params(model):
        name = p.name if view == "tensor" else unit_name(p.owner)
        out.setdefault(name, []).append((p.name, p.tensor))
    return out
