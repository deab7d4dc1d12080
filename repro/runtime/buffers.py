"""Keep module state (parameters at the start, buffers such as BatchNorm running statistics before
every forward) consistent across ranks, as DDP does.

PyTorch DDP broadcasts rank 0's parameters and buffers when it wraps a model, and (``broadcast_buffers=
True``, its default) rank 0's buffers before every forward. :func:`broadcast_module_state` and
:func:`broadcast_buffers` do the same with one coalesced broadcast per dtype and device (in pieces of at
most :data:`PIECE_BYTES`), so that plan schedulers and DDP leave identical models behind.
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
    """Overwrite every rank's ``tensors`` with rank ``src``'s (a global rank): per dtype and device, one
    flattened broadcast per piece of at most :data:`PIECE_BYTES` (bool tensors travel as bytes).

    All but bool tensors go through ``torch.distributed._broadcast_coalesced``, the C++ call DDP syncs its
    buffers with; bool tensors, and every tensor where that call does not exist, take the pieces."""
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
    # every piece's broadcast is in flight at once (one round trip, not one per dtype: tiny_resnet's float32
    # and int64 buffers took 1.1 ms one after the other on 2 gloo ranks); one C++ call each way per piece
    # (as DDP's _broadcast_coalesced), not a Python slice and copy per tensor
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
