"""Keep module state consistent across ranks as DDP does: rank 0's parameters and buffers when a model
is wrapped (:func:`broadcast_module_state`), its buffers (e.g. BatchNorm statistics) before every
forward (:func:`broadcast_buffers`), so plan schedulers and DDP leave identical models behind.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["broadcast_buffers", "broadcast_module_state", "broadcast_tensors"]

PIECE_BYTES = 256 * 2**20  # at most this much is flattened into one broadcast (a copy of it is made)


@torch.no_grad()
def broadcast_tensors(tensors: Iterable[torch.Tensor], src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Overwrite every rank's ``tensors`` with global rank ``src``'s: through
    ``dist._broadcast_coalesced`` (DDP's C++ call) where it exists; bool tensors (as bytes), and all
    where it does not, as one flattened broadcast per dtype, device and piece of :data:`PIECE_BYTES`."""
    tensors = list(tensors)
    coalesced = getattr(dist, "_broadcast_coalesced", None)
    if coalesced is not None and any(t.dtype != torch.bool for t in tensors):
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        group_src = src if group is None else dist.get_group_rank(group, src)
        coalesced(pg, [t for t in tensors if t.dtype != torch.bool], PIECE_BYTES, group_src)
        tensors = [t for t in tensors if t.dtype == torch.bool]
    kinds: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    sizes: dict[tuple[torch.dtype, torch.device], int] = {}
    for t in tensors:
        key, nbytes = (t.dtype, t.device), t.numel() * t.element_size()
        pieces = kinds.setdefault(key, [[]])
        if pieces[-1] and sizes.get(key, 0) + nbytes > PIECE_BYTES:
            pieces.append([])
            sizes[key] = 0
        pieces[-1].append(t)
        sizes[key] = sizes.get(key, 0) + nbytes
    # every piece's broadcast in flight at once: one round trip, not one per dtype
    sent = []
    for pieces in kinds.values():
        for piece in pieces:
            flat = _flatten_dense_tensors(piece)
            work = dist.broadcast(flat.view(torch.uint8) if flat.dtype == torch.bool else flat, src=src, group=group,
                                  async_op=True)
            sent.append((piece, flat, work))
    for piece, flat, work in sent:
        work.wait()
        torch._foreach_copy_(piece, _unflatten_dense_tensors(flat, piece))


def broadcast_buffers(model: nn.Module, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Overwrite every rank's buffers with rank ``src``'s."""
    broadcast_tensors(model.buffers(), src, group)


def broadcast_module_state(model: nn.Module, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Overwrite every rank's parameters and buffers with rank ``src``'s (DDP's start)."""
    broadcast_tensors([p.detach() for p in model.parameters()] + list(model.buffers()), src, group)
