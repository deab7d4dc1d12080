"""The second half of the DDP conformance matrix (see tests/test_conformance.py for the models, loops and
the tolerance): the schedulers that finish their exchange after ``backward()`` returns — every DeAR
variant (all-gathers and updates in the next forward), ByteScheduler (layer-wise updates in the next
forward) and the co-located BSP parameter server. Their one refusal is a local clip between backward and
step (``optimizer.clip_grad_norm_`` is the way); the dedicated-server placement is held to DDP by
tests/test_ps_conformance.py."""

from __future__ import annotations

import pytest

from tests import conformance_targets as ct
from tests.test_conformance import check_cells, run_matrix

DEFERRED = ["dear_threshold", "dear_nofusion", "dear_model", "dear_optimal", "dear_bo", "bytescheduler", "ps_bsp"]


@pytest.mark.distributed
@pytest.mark.slow
def test_deferred_families_conform():
    cells = run_matrix(DEFERRED)
    assert len(cells) == len(DEFERRED) * len(ct.MODELS) * len(ct.LOOPS)
    check_cells(cells)


def test_every_exchange_preserving_scheduler_is_in_the_matrix():
    """No scheduler of the registry that keeps the exchange exact is left out of the two halves."""
    from repro.core.schedulers import scheduler_names
    from tests.test_conformance import ALLREDUCE_AND_BASELINES

    held = set(ALLREDUCE_AND_BASELINES) | set(DEFERRED)
    assert held == set(ct.EXCHANGE_PRESERVING)
    changes_math = {"topk_layerwise", "topk_single", "omgs", "omgs_optimal", "ps_asp", "ps_ssp", "osp", "osp_auto",
                    "local"}
    as_torch_has_it = {"fsdp"}  # PyTorch's FSDP2 as it is (docs/conformance.md says what it keeps)
    assert set(scheduler_names()) == held | changes_math | as_torch_has_it
