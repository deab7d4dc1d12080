"""Keep module buffers (e.g. BatchNorm running statistics) consistent across ranks, as DDP does.

PyTorch DDP (``broadcast_buffers=True``, its default) broadcasts rank 0's buffers before every
forward; :func:`broadcast_buffers` does the same with one broadcast per buffer dtype, so that plan
schedulers and DDP leave identical models behind (evaluation included).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["broadcast_buffers"]


@torch.no_grad()
def broadcast_buffers(model: nn.Module, src: int = 0, group: dist.ProcessGroup | None = None) -> None:
    """Overwrite every rank's buffers with rank ``src``'s (one coalesced broadcast per dtype)."""
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for b in model.buffers():
        by_dtype.setdefault((b.dtype, b.device), []).append(b)
    for bufs in by_dtype.values():
        # one C++ call each way (as DDP's _broadcast_coalesced), not a Python slice and copy per buffer
        flat = _flatten_dense_tensors(bufs)
        dist.broadcast(flat, src=src, group=group)
        torch._foreach_copy_(bufs, _unflatten_dense_tensors(flat, bufs))
