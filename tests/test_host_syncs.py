"""Host syncs per training step under ``torch.amp.GradScaler`` (issue 32, item 9).

A host sync (``.item()``, ``bool(t)``, ``float(t)``...) stalls the host until the GPU has finished
everything queued, so a loop that makes one per gradient serialises itself once per gradient. Counted on
a CPU (tests/host_sync_targets.py: every such read reaches the dispatcher as
``aten._local_scalar_dense``), on 2 gloo ranks, for one step of a 6-layer MLP (12 gradients) after the
warm-up. Measured before the fix: 13 per step for the all-reduce family and the ``ddp`` baseline (GradScaler's
verdict read once, then ``bool(torch.isfinite(g).all())`` per gradient), 14 for ByteScheduler (one per
layer, 12 tensors, plus the verdict and GradScaler's), 3 for DeAR and OMGS. Now 1 each: the verdict of the
whole step, read once (GradScaler's own flag is folded into it unread,
:meth:`repro.runtime.executor.ScaledStep.found_inf_tensor`).
"""

from __future__ import annotations

import pytest

from repro.launch.local import launch_local
from tests import host_sync_targets as t

CASES = {
    "mgwfbp": {"warmup_steps": 1, "fit_repeats": 1},            # all-reduce family (Python hooks)
    "ddp": {},                                                  # PyTorch DDP baseline, through the same door
    "bytescheduler": {"warmup_steps": 1, "fit_repeats": 1},
    "dear_threshold": {"warmup_steps": 1, "fit_repeats": 1, "threshold_bytes": 2048},
    "omgs": {"warmup_steps": 1, "fit_repeats": 1},              # sparse family
}


def test_the_counter_counts_item_bool_float_and_tolist():
    import torch

    x = torch.ones(3)
    with t.count_host_syncs() as box:
        x.sum().item()
        bool(x.all())
        float(x[0])
        x.tolist()
        y = x * 2  # no read
    assert box["count"] == 4 and y.shape == (3,)


@pytest.mark.distributed
@pytest.mark.slow
def test_one_host_sync_per_gradscaler_step():
    ranks = launch_local(t.syncs_per_step, 2, args=(CASES,), timeout_s=300)
    for rank, counts in enumerate(ranks):
        for scheduler, c in counts.items():
            assert c["fp16_scaler"] <= 1, (rank, scheduler, c)
            assert c["bf16"] == 0, (rank, scheduler, c)  # without a scaler no step reads anything
