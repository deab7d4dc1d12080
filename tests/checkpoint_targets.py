"""Launch targets of tests/test_train_checkpoint.py (importable by the ranks launch_local starts)."""

from __future__ import annotations

from typing import Any


def train_and_report(ctx, config: dict[str, Any]) -> dict[str, Any]:
    """Train ``config`` on this rank; the flat parameters afterwards, or ``{"preempted": step}`` when the
    run checkpointed on its (simulated) signal and stopped."""
    import torch

    from repro.train import TrainConfig, run_training
    from repro.training.checkpoint import Preempted

    try:
        model, summary = run_training(ctx, TrainConfig(**config))
    except Preempted as e:
        return {"preempted": e.step}
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    buffers = [b.detach().clone() for b in model.buffers()]
    return {"params": flat, "buffers": buffers, "summary": summary}
