"""Rank functions of tests/test_train_amp.py: ``repro train --amp`` runs on local gloo ranks."""

from __future__ import annotations

import torch


def train_runs(ctx, runs: list[list[str]]) -> list[dict]:
    """Each ``repro train`` argument list of ``runs`` in turn on this rank (the same process group):
    per run its summary, its trained parameters and buffers (``state``) and parameters alone
    (``params``) and the parameters it started from (``start``), float64 on the CPU."""
    from repro.train import config_from_argv, run_training
    from repro.workload.models import build_model

    out = []
    for argv in runs:
        cfg, _ = config_from_argv(argv)
        torch.manual_seed(cfg.seed)  # the weights run_training starts from (it seeds and builds the same way)
        start = {k: v.detach().double().clone() for k, v in
                 build_model(cfg.model, device=torch.device("cpu"), **cfg.model_kwargs).named_parameters()}
        model, summary = run_training(ctx, cfg)
        state = {k: v.detach().double().cpu().clone() for k, v in model.state_dict().items()
                 if v.is_floating_point()}
        params = {k: v.detach().double().cpu().clone() for k, v in model.named_parameters()}
        out.append({"summary": summary, "state": state, "params": params, "start": start})
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k].numel())
