"""Exact top-k selection by magnitude, fast on the CPU: :func:`topk_indices` keeps the candidates above
a threshold picked from a strided sample and runs ``torch.topk`` on those, falling back to all elements
when too few pass, so the result is always exact (ties broken as ``torch.topk`` does). GPUs keep
``torch.topk``.
"""

from __future__ import annotations

import torch

__all__ = ["topk_indices"]

_SAMPLE = 65536          # elements sampled to choose the threshold
_MIN_NUMEL = 1 << 18     # below this (or when k is a large fraction) plain torch.topk is as fast


def topk_indices(magnitudes: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (int64, unsorted) of the ``k`` largest entries of the 1-D tensor ``magnitudes``."""
    n = magnitudes.numel()
    if magnitudes.dim() != 1:
        raise ValueError(f"topk_indices takes a 1-D tensor, got shape {tuple(magnitudes.shape)}")
    if not 0 < k <= n:
        raise ValueError(f"k must be in 1..{n}, got {k}")
    if magnitudes.device.type != "cpu" or n < _MIN_NUMEL or 32 * k > n:
        return torch.topk(magnitudes, k, sorted=False).indices
    sample = magnitudes[:: n // _SAMPLE]
    m = sample.numel()
    above = min(m, int(2 * k * m / n) + 16)   # sample entries meant to lie above the threshold
    threshold = torch.kthvalue(sample, m - above + 1).values
    candidates = (magnitudes >= threshold).nonzero().squeeze(1)
    if candidates.numel() < k:
        return torch.topk(magnitudes, k, sorted=False).indices
    return candidates[torch.topk(magnitudes[candidates], k, sorted=False).indices]
