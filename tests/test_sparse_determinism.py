"""Sparse decompression adds every element's contributions in one fixed order, on every device (issue 21).

``Tensor.index_add_`` over repeated indices is a scatter-add; on CUDA its atomics add an index's
contributions in whatever order the threads run, so replicas that decompress the same gathered pairs
can end with different float sums and nothing re-synchronises them. These tests run on the CPU and
emulate that hardware freedom: a ``TorchDispatchMode`` makes every scatter-add kernel (``index_add``,
``index_put`` with accumulate, ``scatter_add``) apply its pairs in a random order of its own. An
implementation whose result depends on that order (plain ``index_add_`` of all gathered pairs: what
the executor did before) then gives different bits per seed, which the tests detect; the fixed one
gives the same bits whatever the emulated order, and hands no kernel two pairs of one index.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from repro.launch.local import launch_local
from repro.families.sparse.executor import TopKCompressor, deterministic_index_add_

_aten = torch.ops.aten


class ShuffledScatter(TorchDispatchMode):
    """Every scatter-add kernel applies its (index, value) pairs in a random order (``seed``), as CUDA
    atomics may; records the calls that got a repeated index (``repeated``) and how many calls ran."""

    _INDEX_ADD = {_aten.index_add_.default, _aten.index_add.default}
    _SCATTER_ADD = {_aten.scatter_add_.default, _aten.scatter_add.default}
    _INDEX_PUT = {_aten.index_put_.default, _aten.index_put.default, _aten._index_put_impl_.default}

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(seed)
        self.calls = 0
        self.repeated = 0

    def _perm(self, index: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        flat = index.reshape(-1)
        if torch.unique(flat).numel() < flat.numel():
            self.repeated += 1
        return torch.randperm(flat.numel(), generator=self.gen)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._INDEX_ADD and args[0].dim() == 1:
            self_, dim, index, source = args[:4]
            p = self._perm(index)
            return func(self_, dim, index[p], source[p], *args[4:], **kwargs)
        if func in self._SCATTER_ADD and args[0].dim() == 1:
            self_, dim, index, src = args[:4]
            p = self._perm(index)
            return func(self_, dim, index[p], src[p], *args[4:], **kwargs)
        if func in self._INDEX_PUT and len(args) > 3 and args[3] and args[0].dim() == 1:  # accumulate=True
            self_, (index,), values = args[0], args[1], args[2]
            p = self._perm(index)
            vals = values[p] if values.numel() > 1 else values
            return func(self_, [index[p]], vals, *args[3:], **kwargs)
        return func(*args, **kwargs)


def _gathered(P: int, n: int, k: int, overlap: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """What the all-gather hands every replica: P workers' (values, int32 indices), worker 0's first;
    each worker's indices distinct, a fraction ``overlap`` of them shared by every worker, values of
    very different magnitudes (so the float sum depends on the order of additions)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randperm(n, generator=g)[:int(overlap * k)]
    idx, vals = [], []
    for _ in range(P):
        rest = torch.randperm(n, generator=g)
        rest = rest[~torch.isin(rest, common)][:k - common.numel()]
        idx.append(torch.cat([common, rest])[torch.randperm(k, generator=g)])
        vals.append(torch.randn(k, generator=g) * torch.exp(3 * torch.randn(k, generator=g)))
    return torch.cat(vals), torch.cat(idx).to(torch.int32)


def _old_decompress(values, indices, out, blocks=None):
    """The decompression before issue 21: one scatter-add of every gathered pair."""
    return out.index_add_(0, indices, values)


@pytest.mark.parametrize("P", [3, 8])
def test_decompression_does_not_depend_on_the_scatter_order(P):
    """Under three different emulated atomic orders the output is bit-identical (tolerance 0: the
    claim is a fixed order of additions, so any difference at all is the defect), no kernel is handed
    a repeated index, and the result equals today's CPU ``index_add_`` bit for bit (tolerance 0: the
    CPU kernel adds in pair order, and so does the fixed order, so both compute the same float sums
    in the same order). The control, plain ``index_add_`` of all pairs, differs between emulated
    orders (so the check can fail)."""
    n, k = 5000, 1000
    values, indices = _gathered(P, n, k, overlap=0.5)
    reference = torch.zeros(n).index_add_(0, indices, values)  # the CPU result (sequential loop)
    for blocks in (P, None):
        outs = []
        for seed in range(3):
            with ShuffledScatter(seed) as mode:
                outs.append(TopKCompressor.decompress(values, indices, torch.zeros(n), blocks=blocks))
            assert mode.calls >= 1 and mode.repeated == 0, (blocks, mode.calls, mode.repeated)
        for out in outs:
            assert torch.equal(out, reference), blocks
    control = []
    for seed in range(3):
        with ShuffledScatter(seed) as mode:
            control.append(_old_decompress(values, indices, torch.zeros(n)))
        assert mode.repeated == 1
    assert not all(torch.equal(control[0], c) for c in control[1:])
    # the sums are equal up to summation order: a few ulps of the summed magnitudes
    assert torch.allclose(control[0], reference, rtol=1e-5, atol=1e-5 * values.abs().max().item())


def test_general_pairs_add_up_in_the_given_order():
    """Any pairs (an index repeated within one block too): every element is the sum in pair order,
    checked against a Python loop of float32 additions (tolerance 0: the same additions in the same
    order); empty input, shape checks."""
    g = torch.Generator().manual_seed(1)
    indices = torch.randint(0, 20, (300,), generator=g, dtype=torch.int32)
    values = torch.randn(300, generator=g) * torch.exp(4 * torch.randn(300, generator=g))
    expected = [torch.tensor(0.0)] * 20
    for i, v in zip(indices.tolist(), values):
        expected[i] = expected[i] + v
    with ShuffledScatter(0) as mode:
        out = deterministic_index_add_(torch.zeros(20), indices, values)
    assert mode.repeated == 0 and mode.calls > 1
    assert torch.equal(out, torch.stack(expected))
    assert torch.equal(deterministic_index_add_(torch.ones(3), torch.tensor([], dtype=torch.int32),
                                                torch.tensor([])), torch.ones(3))
    with pytest.raises(ValueError, match="equal blocks"):
        deterministic_index_add_(torch.zeros(5), torch.tensor([1, 2, 3]), torch.ones(3), blocks=2)
    with pytest.raises(ValueError, match="1-D"):
        deterministic_index_add_(torch.zeros(5), torch.tensor([1, 2]), torch.ones(3))


def test_deterministic_mode_accepts_it():
    """``torch.use_deterministic_algorithms(True)`` does not refuse the ops it uses (on the CPU; on CUDA
    the ops are index_add_ of distinct indices, sort, unique_consecutive, repeat_interleave)."""
    values, indices = _gathered(3, 500, 100, overlap=0.5)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        a = TopKCompressor.decompress(values, indices, torch.zeros(500), blocks=3)
        b = TopKCompressor.decompress(values, indices, torch.zeros(500))
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.equal(a, b)


# ---- three replicas, each with its own emulated atomic order ----

def replicas_under_shuffled_scatter(ctx, control: bool) -> dict:
    """Rank target: two steps of SparseExecutor (3 ranks, dense-ish top-k so the workers' indices
    overlap) while this rank's scatter kernels run in an order seeded by the rank; the parameters."""
    from repro.core.plan import Plan
    from repro.families.sparse.executor import SparseExecutor

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    plan = Plan.from_dict({"family": "sparse", "options": {"density": 0.5},
                           "buckets": [{"layers": ["0.weight", "0.bias", "2.weight", "2.bias"],
                                        "messages": ["sparse_allgather"]}]})
    ex = SparseExecutor(model, plan)
    if control:
        ex.compressor.decompress = _old_decompress
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    mode = ShuffledScatter(seed=rank)
    for _ in range(2):
        x = torch.randn(8, 16, generator=g) * torch.exp(2 * torch.randn(8, 1, generator=g))
        opt.zero_grad(set_to_none=True)
        ex.before_forward()
        (ex.module(x) ** 2).sum().backward()
        with mode:
            ex.after_backward()
        opt.step()
    ex.remove()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "repeated": mode.repeated, "calls": mode.calls}


@pytest.mark.distributed
@pytest.mark.slow
def test_replicas_stay_identical_whatever_the_scatter_order():
    """Three gloo ranks, each decompressing with a different emulated atomic order: the parameters are
    identical bit for bit on every rank (tolerance 0: replicas must never drift apart, and nothing
    re-synchronises them). The control (the old scatter-add of all pairs) leaves the replicas'
    parameters different, so the check can fail."""
    fixed, control = (launch_local(replicas_under_shuffled_scatter, 3, args=(c,), timeout_s=300)
                      for c in (False, True))
    for r in fixed:
        assert r["repeated"] == 0 and r["calls"] >= 3
        for n, p in fixed[0]["params"].items():
            assert torch.equal(r["params"][n], p), n
    assert all(r["repeated"] > 0 for r in control)
    assert any(not torch.equal(r["params"][n], control[0]["params"][n]) for r in control[1:] for n in r["params"])
