"""The DDP conformance matrix: every exchange-preserving scheduler of ``repro schedulers`` (the all-reduce
family, every DeAR variant, ByteScheduler, the co-located BSP parameter server, and the ``ddp``
baseline; ``fsdp`` is PyTorch's FSDP2 run as it is, not held to DDP: docs/conformance.md) through ``repro.distribute``, on four models a user writes (a CNN with BatchNorm; a
small GPT with ``nn.MultiheadAttention`` and an output layer tied to the token embedding through
``F.linear``; a model with a head unused on some steps and some ranks; a parameter used in the parent's
forward and a Linear called twice) and thirteen loops a DDP user writes (tests/conformance_targets.py),
each against ``DistributedDataParallel`` from the same seed on the same data, 2 gloo ranks. Each cell is
what the support table in docs/conformance.md says: equal to DDP, or refused in one line (the same
line on both ranks, before anything is half-done), or not run (with the reason).

Tolerance: TOL = 1e-5 on every parameter and buffer after 6 steps (lr 0.05 SGD with momentum, AdamW at
lr 0.01). Two ranks: an exchange adds two numbers per element in their own dtype (commutative in IEEE
arithmetic) and halves them (exact), as DDP does, so an exact exchange gives DDP's gradients bit for bit;
the parameters may then differ only by how the optimizer's kernels are grouped (DeAR and ByteScheduler
step bucket by bucket instead of one foreach step; FSDP2 updates the shards), a few ulps of values of
order 1 (~1e-7). 1e-5 bounds that with a factor of 100, while every defect this matrix was built to
catch moves parameters by 1e-4 to 1e-1 in these steps: an update applied after the parameter was read
(2.9e-4 to 2.8e-2), with the next step's learning rate (2.9e-3 to 5.8e-2), a clip of unexchanged
gradients (2.8e-3 to 0.64), momentum moving an unused parameter (8.3e-3), a checkpoint that lost state
(7.1e-3). Under bf16 autocast a single wrong bit in an exchanged gradient flips bf16 roundings
(2^-8 relative), so there too an exact exchange is 0 and a wrong one far above TOL. (Measured: 0.0 in
every "equal" cell.)

The whole matrix runs in ``make test`` (two files, one per half, so that pytest-xdist runs them side by
side); ``test_sample_of_the_matrix`` is the fast tier's sample (``sample`` marker).
"""

from __future__ import annotations

import pytest

from repro.launch.local import launch_local
from tests import conformance_targets as ct

TOL = 1e-5

ALLREDUCE_AND_BASELINES = ["wfbp", "syncea", "threshold", "ddp_buckets", "mgwfbp", "optimal", "horovod",
                           "ddp_threshold", "ddp"]


def run_matrix(schedulers: list[str], models: list[str] | None = None, loops: list[str] | None = None) -> list:
    cases = [{"scheduler": s, **ct.EXCHANGE_PRESERVING[s]} for s in schedulers]
    ranks = launch_local(ct.matrix, 2, args=(cases, models or list(ct.MODELS), loops or list(ct.LOOPS)),
                         timeout_s=1500)
    return list(zip(*ranks))


def check_cells(cells: list) -> None:
    """Every cell behaves as the expectations (and the docs' table) say; failures listed together."""
    wrong = []
    for per_rank in cells:
        first = per_rank[0]
        scheduler, model, loop = first["case"]["scheduler"], first["model"], first["loop"]
        expected = ct.expectation(scheduler, model, loop)
        if expected == "not run":
            assert all(r.get("not_run") for r in per_rank)
            continue
        if expected == "refused":
            messages = [r.get("refused") for r in per_rank]
            ok = all(m is not None and "\n" not in m for m in messages) and len(set(messages)) == 1
        else:
            ok = all(r.get("diff") is not None and r["diff"] <= TOL for r in per_rank)
        if not ok:
            wrong.append((scheduler, model, loop, expected,
                          [{k: v for k, v in r.items() if k in ("diff", "refused", "error", "where")} for r in per_rank]))
    assert not wrong, "\n".join(map(str, wrong))


@pytest.fixture(scope="module")
def allreduce_cells():
    return run_matrix(ALLREDUCE_AND_BASELINES)


@pytest.mark.distributed
@pytest.mark.slow
def test_allreduce_family_and_baselines_conform(allreduce_cells):
    assert len(allreduce_cells) == len(ALLREDUCE_AND_BASELINES) * len(ct.MODELS) * len(ct.LOOPS)
    check_cells(allreduce_cells)


@pytest.mark.distributed
@pytest.mark.sample
def test_sample_of_the_matrix():
    """The fast tier's sample: the three executors that apply updates differently (all-reduce, DeAR's
    next-forward updates, ByteScheduler's layer-wise ones) on the tied-embedding GPT under a per-step LR
    schedule, a local clip (refused where it cannot work) and the optimizer's own clip."""
    check_cells(run_matrix(["mgwfbp", "dear_threshold", "bytescheduler"], ["gpt"],
                           ["lr_schedule", "clip", "clip_opt"]))


def test_support_table_in_the_docs_is_the_matrix_expectations():
    """docs/conformance.md is generated from the expectations (scripts/conformance_table.py)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("conformance_table", root / "scripts" / "conformance_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (root / "docs" / "conformance.md").read_text()
    assert text == module.render(), "docs/conformance.md is stale: run python scripts/conformance_table.py"
    for scheduler in ct.EXCHANGE_PRESERVING:
        assert f"| `{scheduler}`" in text
