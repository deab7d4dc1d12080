"""Dedicated server ranks through ``repro.distribute(..., dedicated_servers=S)``, and DDP's start:
every trainer begins from the first trainer's parameters and buffers whatever its own initialisation
(issue 21).

3 gloo ranks: rank 0 serves, ranks 1 and 2 train a model each initialised with its own seed. BSP
with a dedicated server is DDP on the two trainers: the server sums the two gradients in worker order
and halves them, DDP halves then sums, and with two terms both are the same float (halving is exact,
addition commutes), the warm-up's all-reduce likewise; so the tolerance is that of the other
two-rank equality tests (``TOL``), with 0.0 expected.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from repro.launch.local import launch_local
from tests.api_targets import _train

TOL = 1e-6
STEPS = 6


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 4))


def _batches(rank: int) -> list:
    g = torch.Generator().manual_seed(300 + rank)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(STEPS)]


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def dedicated(ctx, scheduler: str) -> dict:
    import repro

    rank = dist.get_rank()
    model = _model(seed=rank)  # every rank its own initialisation
    first_init = _flat(_model(seed=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = repro.distribute(model, opt, scheduler=scheduler, dedicated_servers=1, warmup_steps=2)
    if opt.serving:  # rank 0 served the whole run inside distribute()
        try:
            opt.step()
            refused = None
        except RuntimeError as e:
            refused = str(e)
        return {"serving": True, "refused": refused, "tables": sorted(opt.tables)}
    start_diff = (_flat(model) - first_init).abs().max().item()
    losses = _train(model, opt, _batches(rank))
    opt.flush()
    params = _flat(model)
    opt.remove()
    out = {"serving": False, "start_diff": start_diff, "losses": losses, "params": params}
    if scheduler == "ps_bsp":  # the reference: DDP on the trainers, each from its own initialisation
        group = dist.new_group([1, 2])
        ref = _model(seed=rank)
        ddp = nn.parallel.DistributedDataParallel(ref, process_group=group)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
        for x, y in _batches(rank):
            ref_opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            ref_opt.step()
        out["ddp_diff"] = (params - _flat(ref)).abs().max().item()
    return out


def _new_group_on_every_rank(ctx, scheduler: str) -> dict:
    """``dedicated`` with the DDP reference's group made on rank 0 too (new_group is collective)."""
    out = dedicated(ctx, scheduler)
    if out["serving"] and scheduler == "ps_bsp":
        dist.new_group([1, 2])
    return out


@pytest.fixture(scope="module")
def runs():
    return {s: launch_local(_new_group_on_every_rank, 3, args=(s,), timeout_s=300) for s in ("ps_bsp", "osp")}


@pytest.mark.distributed
@pytest.mark.slow
def test_bsp_with_a_dedicated_server_equals_ddp_on_the_trainers(runs):
    server, t1, t2 = runs["ps_bsp"]
    assert server["serving"] and "skip the training loop where optimizer.serving is True" in server["refused"]
    for t in (t1, t2):
        assert not t["serving"]
        assert t["start_diff"] == 0.0  # DDP's start: the first trainer's initialisation on every trainer
        assert t["ddp_diff"] < TOL, t["ddp_diff"]
    assert torch.equal(t1["params"], t2["params"])


@pytest.mark.distributed
@pytest.mark.slow
def test_osp_with_a_dedicated_server_trains(runs):
    server, t1, t2 = runs["osp"]
    assert server["serving"]
    for t in (t1, t2):
        assert all(torch.isfinite(torch.tensor(t["losses"])))
    assert torch.equal(t1["params"], t2["params"])  # after the flush both hold the server's model


@pytest.mark.distributed
def test_dedicated_servers_refusals_are_one_line(one_rank):
    import repro

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cases = [({"scheduler": "mgwfbp", "dedicated_servers": 1}, "applies to a family with server ranks .ps: ps_bsp, ps_asp"),
             ({"scheduler": "ps_bsp", "dedicated_servers": 1}, "leaves no trainer among the job's 1 rank"),
             ({"scheduler": "ps_bsp", "dedicated_servers": -1}, "dedicated_servers must be an integer >= 0"),
             ({"scheduler": "ps_bsp", "dedicated_servers": True}, "dedicated_servers must be an integer >= 0")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            repro.distribute(model, opt, **kwargs)
        assert "\n" not in str(e.value)


@pytest.mark.distributed
def test_module_state_goes_in_pieces_per_dtype(one_rank, monkeypatch):
    """broadcast_module_state (distribute's DDP-like start): DDP's coalesced C++ broadcast for all but bool
    tensors; without it, one flattened broadcast per dtype and piece of at most PIECE_BYTES; bool buffers
    as bytes; every tensor written back."""
    from repro.runtime import buffers

    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))   # float32 params and buffers, an int64 buffer
    model.register_buffer("mask", torch.tensor([True, False]))
    calls = []
    real = dist.broadcast
    monkeypatch.setattr(buffers.dist, "broadcast", lambda t, **kw: calls.append((t.dtype, t.numel())) or real(t, **kw))
    monkeypatch.setattr(buffers, "PIECE_BYTES", 64)   # 16 float32 elements a piece
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # where DDP's C++ call exists, it takes every tensor but the bool ones, in one call
    coalesced_calls = []
    real_coalesced = dist._broadcast_coalesced
    monkeypatch.setattr(buffers.dist, "_broadcast_coalesced", lambda pg, ts, size, src: coalesced_calls.append(
        ([t.dtype for t in ts], size, src)) or real_coalesced(pg, ts, size, src))
    buffers.broadcast_module_state(model)
    assert coalesced_calls == [([torch.float32] * 6 + [torch.int64], 64, 0)]
    assert calls == [(torch.uint8, 2)]  # the bool mask, as bytes
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # without it: weight (16 elements, a piece); bias + BN weight, bias, running mean (16); running var (4);
    # then the bool mask as bytes and the int64 step counter, each in the order its dtype first appears
    monkeypatch.delattr(buffers.dist, "_broadcast_coalesced")
    calls.clear()
    buffers.broadcast_module_state(model)
    assert calls == [(torch.float32, 16), (torch.float32, 16), (torch.float32, 4), (torch.uint8, 2), (torch.int64, 1)]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
