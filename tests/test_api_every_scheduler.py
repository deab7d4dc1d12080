"""Every scheduler of ``repro schedulers`` through ``repro.distribute`` in a user's own loop (issue 21):
2 gloo ranks, a user-defined CNN with batch norm, one warm-up step then the scheduler's own executor,
each rank initialised with its own seed (``distribute`` starts every rank from rank 0's weights, as
DDP does).

What is checked per scheduler: the loop runs, the loss stays finite, and after ``flush()`` the two
ranks hold the same parameters bit for bit, except where the method lets replicas differ on
purpose: ``local`` (no exchange at all). The exact equalities with DDP are in ``test_api.py`` and
``test_api_loops.py``; this file is the census, so that no scheduler is left out of the door.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from repro.launch.local import launch_local
from repro.core.schedulers import scheduler_names

STEPS = 4
# per scheduler, options a tiny run needs (the tuner's trials fit in the steps)
OPTIONS = {"dear_bo": {"tuner_trials": 1, "tuner_min_bytes": 1024, "tuner_max_bytes": 65536},
           "threshold": {"threshold_bytes": 4096}, "ddp_threshold": {"threshold_bytes": 4096},
           "dear_threshold": {"threshold_bytes": 4096}}
REPLICAS_DIFFER = {"local"}


def every_scheduler(ctx, names: list[str]) -> list[dict]:
    import repro
    from tests.api_targets import UserNet, _batches, _train

    rank = dist.get_rank()
    data = _batches(rank, STEPS)
    out = []
    for name in names:
        torch.manual_seed(rank)  # each rank its own initialisation
        net = UserNet()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        row = {"scheduler": name}
        try:
            model, dopt = repro.distribute(net, opt, scheduler=name, warmup_steps=1, fit_repeats=1,
                                           **OPTIONS.get(name, {}))
            losses = _train(model, dopt, data)
            dopt.flush()
            flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
            everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, flat)
            row.update(losses=losses, replicas_diff=max(float((e - flat).abs().max()) for e in everyone),
                       plan=None if dopt.plan is None else dopt.plan.solver,
                       is_optimizer=isinstance(dopt, torch.optim.Optimizer))
            dopt.remove()
        except Exception as e:  # noqa: BLE001 - reported per scheduler; the other rank fails the same way
            row["error"] = f"{type(e).__name__}: {e}"
            raise
        out.append(row)
    return out


@pytest.fixture(scope="module")
def census():
    return launch_local(every_scheduler, 2, args=(scheduler_names(),), timeout_s=600)


@pytest.mark.distributed
@pytest.mark.slow
def test_every_scheduler_trains_through_distribute(census):
    rows = census[0]
    assert [r["scheduler"] for r in rows] == scheduler_names()
    for row in rows:
        assert row["is_optimizer"], row
        assert all(torch.isfinite(torch.tensor(row["losses"]))), row
        if row["scheduler"] in REPLICAS_DIFFER:
            assert row["replicas_diff"] > 0, row
        else:
            assert row["replicas_diff"] == 0.0, row
