"""The parameter-server family through ``repro.distribute``, servers co-located on the training ranks
(repro.families.ps.colocated), 2 gloo ranks that both train and serve.

One 2-rank launch (targets: tests/ps_targets.py ``colocated_suite``) runs every case and DDP on the
same data; the tests compare:

1. BSP equals DDP (SGD with momentum and weight decay; AdamW), with one server or one per rank;
2. OSP equals the written reference of tests/test_runtime_ps.py (the dedicated servers' math), and in
   the run, stage-2 parameters are one step stale (without LGP);
3. ASP and SSP(s) equal the written lockstep reference below (each rank's gradient its own optimizer
   step, in rank order; SSP's pulls s iterations late), in the run too;
4. both ranks issue the same sequence of collectives (op, root, buffer), nothing but collectives
   and every tensor handed to torch.distributed a float32 tensor on the parameters' device (no
   int64 header, no CPU staging): what NCCL needs;
5. planned online (ps_bsp, osp): the warm-up, the calibration's ping-pong (mirrored send/recv) and the
   plan with one server per rank; ps_bsp online equals DDP.

Every case fails on the code before co-location (distribute refused the family).
"""

from __future__ import annotations

import pytest
import torch

from repro.launch.local import launch_local
from tests import ps_targets as T
from tests.test_runtime_ps import _stage_two, reference

K = 5   # steps per case

CASES = {
    "bsp": {"mode": "bsp", "steps": K, "servers": 2},
    "bsp_one_server": {"mode": "bsp", "steps": K, "servers": 1},
    "bsp_adamw": {"mode": "bsp", "optimizer": "adamw", "steps": K, "servers": 2},
    "osp_half_lgp": {"mode": "osp", "share": 0.5, "lgp": True, "steps": K, "servers": 2},
    "osp_half_nolgp": {"mode": "osp", "share": 0.5, "lgp": False, "steps": K, "servers": 2},
    "asp": {"mode": "asp", "steps": K, "servers": 2},
    "ssp": {"mode": "ssp", "staleness": 2, "steps": K, "servers": 2},
    "online_bsp": {"scheduler": "ps_bsp", "steps": K, "kwargs": {"warmup_steps": 1}},
    "online_osp": {"scheduler": "osp", "steps": K, "kwargs": {"warmup_steps": 1, "stage1_share": 0.5}},
    "online_ssp_one_server": {"scheduler": "ps_ssp", "steps": K, "kwargs": {"warmup_steps": 1, "servers": 1,
                                                                          "staleness": 1}},
}
NAMES = list(CASES)

# Tolerance against DDP and the written references: the exchanged gradient of 2 ranks is g0 + g1
# (commutative, so the same float sum whichever rank adds) halved (exact), as DDP and the references
# compute it, and each parameter's optimizer update is the same single-tensor kernel whether the
# owner steps its shard or the reference the whole model (CPU); what can differ is the grouping of
# a multi-tensor (foreach) kernel, a few ulps (~1e-7) per step. 1e-6 is ten times that over 5 steps;
# a wrong exchange (a bucket missed or counted twice, a pull one step off, an unaveraged gradient)
# moves the parameters by more than 1e-4 (asserted where a test could otherwise pass vacuously).
TOL = 1e-6


@pytest.fixture(scope="module")
def world():
    out = launch_local(T.colocated_suite, 2, args=([CASES[n] for n in NAMES], K), timeout_s=400, pg_timeout_s=60)
    return {"ranks": [dict(zip(NAMES, r["cases"])) for r in out], "ddp": [r["ddp"] for r in out]}


def _diff(a: dict, b: dict) -> float:
    return max((a[n].double() - b[n].double()).abs().max().item() for n in a)


def lockstep_reference(case: dict, workers: int = 2) -> list[dict]:
    """The servers' parameters W_0..W_K of co-located ASP / SSP(s) from the math: every rank i
    computes g_i(t) at W_{max(t - s, 0)} (s = 0 for ASP); then, for i = 0..N-1 in turn, one
    optimizer step with the gradient g_i(t) / N gives W_{t+1} after the N-th."""
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        s = case.get("staleness", 0) if case["mode"] == "ssp" else 0
        master = T.make_model()
        opt = T.make_optimizer(case.get("optimizer", "sgd"), master.parameters())
        data = [T.batches(i, case["steps"]) for i in range(workers)]
        W = [{n: p.detach().clone() for n, p in master.named_parameters()}]
        probe = T.make_model()
        for t in range(case["steps"]):
            grads = []
            for i in range(workers):
                with torch.no_grad():
                    for n, p in probe.named_parameters():
                        p.copy_(W[max(t - s, 0)][n])
                probe.zero_grad(set_to_none=True)
                T.loss_of(probe, *data[i][t]).backward()
                grads.append({n: p.grad.detach().clone() for n, p in probe.named_parameters()})
            for i in range(workers):
                for n, p in master.named_parameters():
                    p.grad = grads[i][n] / workers
                opt.step()
            W.append({n: p.detach().clone() for n, p in master.named_parameters()})
        return W
    finally:
        torch.set_num_threads(prev_threads)


# ---------------------------------------------------------------------------------------------
# 1: BSP is DDP
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name,kind", [("bsp", "sgd"), ("bsp_one_server", "sgd"), ("bsp_adamw", "adamw"),
                                       ("online_bsp", "sgd")])
def test_bsp_through_distribute_equals_ddp(world, name, kind):
    for rank, ddp in zip(world["ranks"], world["ddp"]):
        row = rank[name]
        assert row["is_optimizer"]
        assert _diff(row["params"], ddp[kind][-1]) < TOL, name
        assert _diff(row["params"], ddp[kind][-2]) > 1e-4          # a step fewer differs: this can fail
        assert row["plan"]["family"] == "ps" and row["plan"]["options"]["mode"] == "bsp"
    servers = world["ranks"][0][name]["plan"]["options"]["servers"]
    assert servers == (1 if name == "bsp_one_server" else 2)       # online: one server per rank by default


# ---------------------------------------------------------------------------------------------
# 2-3: OSP, ASP, SSP against their written references
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["osp_half_lgp", "osp_half_nolgp"])
def test_osp_through_distribute_equals_the_reference(world, name):
    case = CASES[name]
    stage2 = _stage_two(world["ranks"][0][name]["plan"])
    assert stage2 and stage2 != set(world["ranks"][0][name]["params"])   # both stages are used
    ref = reference(case, stage2)
    fresh = reference(case, set())
    for rank in world["ranks"]:
        row = rank[name]
        assert _diff(row["params"], ref[-1]) < TOL
        assert _diff(row["params"], fresh[-1]) > 1e-4                  # ... and it is not BSP
        if not case["lgp"]:   # iteration t computes with W_t on stage 1, W_{max(t-1, 0)} on stage 2
            for t, used in enumerate(row["used"]):
                want = {n: (ref[max(t - 1, 0)] if n in stage2 else ref[t])[n] for n in used}
                assert _diff(used, want) < TOL, t
    lgp, nolgp = (world["ranks"][0][n]["params"] for n in ("osp_half_lgp", "osp_half_nolgp"))
    assert _diff(lgp, nolgp) > 1e-5                                    # LGP changes the run


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["asp", "ssp"])
def test_asp_and_ssp_through_distribute_equal_the_lockstep_reference(world, name):
    case = CASES[name]
    s = case.get("staleness", 0)
    ref = lockstep_reference(case)
    for rank in world["ranks"]:
        row = rank[name]
        assert _diff(row["params"], ref[-1]) < TOL
        assert len(row["used"]) == K
        for t, used in enumerate(row["used"]):   # iteration t computes with W_{max(t - s, 0)}
            assert _diff(used, ref[max(t - s, 0)]) < TOL, t
        if s:  # before the flush a rank holds what its last iteration used, W_{K-1-s}; the flush installs W_K
            assert _diff(row["unflushed"], ref[K - 1 - s]) < TOL and _diff(row["unflushed"], ref[K]) > 1e-5
    # the per-rank steps change the math (SGD with momentum): not BSP, and SSP's staleness matters
    bsp = world["ranks"][0]["bsp"]["params"]
    assert _diff(world["ranks"][0][name]["params"], bsp) > 1e-4
    if s:
        assert _diff(world["ranks"][0]["ssp"]["params"], world["ranks"][0]["asp"]["params"]) > 1e-4


# ---------------------------------------------------------------------------------------------
# 4: the same collectives on every rank, device tensors only
# ---------------------------------------------------------------------------------------------

def _signature(calls: list[dict]) -> list[tuple]:
    """What must match across ranks: the op, its root and the buffer (the owner's gather list is its own)."""
    return [(c["op"], c["root"], c["tensors"][0] if c["tensors"] else None) for c in calls]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("online")])
def test_every_rank_issues_the_same_collectives_on_device_tensors(world, name):
    rank0, rank1 = (r[name] for r in world["ranks"])
    calls = rank0["calls"]
    assert calls and _signature(calls) == _signature(rank1["calls"])
    ops = {c["op"] for c in calls}
    push = "gather" if CASES[name]["mode"] in ("asp", "ssp") else "reduce"
    assert ops == {push, "broadcast"}, ops          # collectives only: no point-to-point, no header
    for row in (rank0, rank1):
        for c in row["calls"]:
            for shape, dtype, device in c["tensors"]:
                assert dtype == "torch.float32" and device == row["device"], c
    # K steps, every bucket pushed once and pulled once per step, after one broadcast per bucket at the start
    # and, before those, distribute's DDP-like start (rank 0's parameters, one float32 piece: no buffers here)
    buckets = len(rank0["plan"]["buckets"])
    assert sum(c["op"] == push for c in calls) == K * buckets
    assert sum(c["op"] == "broadcast" for c in calls) == (K + 1) * buckets + 1
    assert calls[0]["op"] == "broadcast" and calls[0]["root"] == 0
    owners = {c["root"] for c in calls}
    assert owners == set(range(CASES[name]["servers"]))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["online_bsp", "online_osp", "online_ssp_one_server"])
def test_online_planning_with_colocated_servers(world, name):
    rank0, rank1 = (r[name] for r in world["ranks"])
    assert rank0["plan"] == rank1["plan"]
    assert rank0["plan"]["options"]["servers"] == CASES[name]["kwargs"].get("servers", 2)
    assert _diff(rank0["params"], rank1["params"]) == 0.0              # the flush leaves the servers' model
    assert _diff(rank0["params"], dict(T.make_model().named_parameters())) > 1e-3
    # collectives match; the calibration's ping-pong is point to point, each send met by the peer's recv
    coll = [c for c in rank0["calls"] if c["op"] not in ("send", "recv")]
    assert _signature(coll) == _signature([c for c in rank1["calls"] if c["op"] not in ("send", "recv")])
    p2p = [(c["op"], c["tensors"][0]) for c in rank0["calls"] if c["op"] in ("send", "recv")]
    mirror = {"send": "recv", "recv": "send"}
    assert p2p and p2p == [(mirror[c["op"]], c["tensors"][0]) for c in rank1["calls"] if c["op"] in ("send", "recv")]
    if name == "online_osp":
        assert {m["phase"] for b in rank0["plan"]["buckets"] for m in b["messages"]} == {"backward", "background"}


# ---------------------------------------------------------------------------------------------
# options, checked before any collective (no process group needed)
# ---------------------------------------------------------------------------------------------

def test_colocated_options_default_and_refusals():
    from repro.core.plan import Plan
    from repro.families.ps.colocated import colocated_options

    assert colocated_options(None, ("servers", "staleness"), {}, 4) == {"servers": 4}
    assert colocated_options(None, ("servers",), {"servers": 2}, 4) == {"servers": 2}
    with pytest.raises(ValueError, match="3 server.* exceed the job's 2 rank"):
        colocated_options(None, ("servers",), {"servers": 3}, 2)
    messages = [{"collective": "push", "phase": "backward"}, {"collective": "pull", "phase": "backward"}]
    plan = Plan.from_dict({"solver": "ps_bsp", "family": "ps",
                           "buckets": [{"layers": [name], "messages": messages} for name in "abc"],
                           "options": {"mode": "bsp", "servers": 3, "bucket_servers": [0, 1, 2]}})
    with pytest.raises(ValueError, match="plan's 3 server"):
        colocated_options(plan, (), {}, 2)


def test_bucket_lag_follows_the_modes():
    from repro.families.ps.colocated import bucket_lag

    assert [bucket_lag("bsp", 1, 0), bucket_lag("asp", 1, 0), bucket_lag("ssp", 1, 3)] == [0, 0, 3]
    assert [bucket_lag("osp", 1, 0), bucket_lag("osp", 2, 0)] == [0, 1]


def test_dedicated_servers_send_headers_on_the_data_device_and_refuse_nccl(monkeypatch):
    import torch.distributed as dist

    from repro.families.ps import executor as ps

    header = ps._header(ps.STEP, 7, torch.device("meta"))   # a stand-in for a GPU: any device but the CPU
    assert header.device.type == "meta" and header.dtype == torch.int64 and header.shape == (3,)  # kind, step, bytes
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")
    with pytest.raises(ValueError, match="NCCL does not support; use co-located servers"):
        ps._refuse_nccl("serve")


# ---------------------------------------------------------------------------------------------
# one rank on a device: NCCL on a GPU (pytest -m gpu), the same body on the CPU with gloo
# ---------------------------------------------------------------------------------------------

def colocated_on_one_rank(device: torch.device, steps: int = 4) -> dict:
    """BSP and OSP (share 0.5, LGP) through distribute on a process group of one on ``device``: the
    largest difference of BSP from plain SGD on the same device and data (a reduce of one rank and a
    broadcast from itself change nothing: the same kernels, so equal up to the grouping of a
    multi-tensor update), and the dtype/device of every tensor handed to torch.distributed."""
    import repro

    data = [(x.to(device), y.to(device)) for x, y in T.batches(0, steps)]
    out = {}
    for case in ({"mode": "bsp", "servers": 1}, {"mode": "osp", "share": 0.5, "lgp": True, "servers": 1}):
        model = T.make_model().to(device)
        opt = T.make_optimizer("sgd", model.parameters())
        with T.RecordingDist() as rec:
            net, dopt = repro.distribute(model, opt, scheduler=T.make_case_plan(T.make_model(), case))
            for x, y in data:
                dopt.zero_grad()
                T.loss_of(net, x, y).backward()
                dopt.step()
            dopt.flush()
            dopt.remove()
        ref = T.make_model().to(device)
        ref_opt = T.make_optimizer("sgd", ref.parameters())
        for x, y in data:
            ref_opt.zero_grad()
            T.loss_of(ref, x, y).backward()
            ref_opt.step()
        diff = max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
        out[case["mode"]] = {"diff": diff, "kinds": {(dtype, dev) for c in rec.calls for _, dtype, dev in c["tensors"]},
                             "ops": {c["op"] for c in rec.calls}, "finite": all(bool(torch.isfinite(p).all())
                                                                              for p in model.parameters())}
    return out


def _check_one_rank(out: dict, device: torch.device) -> None:
    want = {("torch.float32", str(device))}
    assert out["bsp"]["diff"] < 1e-6 and out["bsp"]["kinds"] == want and out["bsp"]["ops"] == {"reduce", "broadcast"}
    assert out["osp"]["finite"] and out["osp"]["kinds"] == want and out["osp"]["diff"] > 1e-5  # stale: not SGD


@pytest.mark.distributed
def test_colocated_on_a_gloo_group_of_one(tmp_path):
    from tests.test_gpu import one_rank

    with one_rank("gloo", torch.device("cpu"), tmp_path / "store"):
        _check_one_rank(colocated_on_one_rank(torch.device("cpu")), torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.distributed
def test_colocated_on_an_nccl_group_of_one(tmp_path):
    from tests.test_gpu import CUDA, one_rank

    with one_rank("nccl", CUDA, tmp_path / "store"):
        _check_one_rank(colocated_on_one_rank(CUDA), CUDA)
