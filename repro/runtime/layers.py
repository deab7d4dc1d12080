"""Map a Trace's layer names onto a model's parameters (the names the profiler gives layers).

``view="tensor"``: one layer per learnable parameter tensor, named by its qualified name.
``view="module"``: one layer per module that directly owns parameters, named by the module's
qualified name (``"<root>"`` for the model itself). Tied parameters belong to their first owner.
"""

from __future__ import annotations

from torch import nn

from repro.profile import VIEWS, _learnable_params, _unit_name

__all__ = ["layer_parameters"]


def layer_parameters(model: nn.Module, view: str = "tensor") -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Layer name -> [(parameter name, parameter)], in ``model.named_parameters()`` order."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; valid views: {', '.join(VIEWS)}")
    out: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for p in _learnable_params(model):
        name = p.name if view == "tensor" else _unit_name(p.owner)
        out.setdefault(name, []).append((p.name, p.tensor))
    return out
