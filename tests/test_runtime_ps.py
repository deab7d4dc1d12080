"""The parameter-server runtime (repro.families.ps.executor), gloo on CPU, 1 server + 2 workers (and 2 + 2 once).

One 3-rank launch (roles: a server, two workers; targets in tests/ps_targets.py) runs every executor
case, DDP on the workers' own process group, and three runs of the generic loop; the tests compare:

1. OSP with a stage-1 share of 1 equals BSP bit for bit (different plans and solvers);
2. OSP with share 0 and LGP off equals the one-step-stale reference written below (and not BSP);
3. LGP moves only the stage-2 parameters, by exactly ``- lr * g_local`` from the freshest aggregated
   values; stage-1 parameters untouched; the whole LGP trajectory equals the reference with LGP;
4. SSP never lets a worker run more than s iterations ahead (server clocks), with a slow worker so the
   bound binds; ASP/SSP workers end with the servers' values;
5. BSP on the PS equals DDP (SGD with momentum and weight decay; AdamW);
6. ps_bsp / osp / ps_ssp through ``repro train`` arguments (and 2 servers + 2 workers);
8. a dead worker or server ends the launch naming it, well within the process-group timeout.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from repro.launch.local import RankFailedError, Role, launch_local
from tests import ps_targets as T

K = 5   # steps per executor case

CASES = {
    "bsp": {"mode": "bsp", "steps": K},
    "osp_share1": {"mode": "osp", "share": 1.0, "steps": K},
    "osp_share0_nolgp": {"mode": "osp", "share": 0.0, "lgp": False, "steps": K},
    "osp_half_lgp": {"mode": "osp", "share": 0.5, "lgp": True, "steps": K},
    "osp_half_nolgp": {"mode": "osp", "share": 0.5, "lgp": False, "steps": K},
    "osp_share0_lgp": {"mode": "osp", "share": 0.0, "lgp": True, "steps": K},
    "bsp_adamw": {"mode": "bsp", "optimizer": "adamw", "steps": K},
    "osp_half_lgp_adamw": {"mode": "osp", "share": 0.5, "lgp": True, "optimizer": "adamw", "steps": K},
    "ssp": {"mode": "ssp", "staleness": 1, "steps": 8, "sleep": {1: 0.04}},
    "asp": {"mode": "asp", "steps": 6, "sleep": {0: 0.02}},
}
NAMES = list(CASES)
TRAIN = ["--model", "tiny_resnet", "--steps", "3", "--warmup-steps", "1", "--compute-steps", "0", "--batch-size",
         "4", "--fit-repeats", "1", "--quiet", "--servers"]


def _argvs(results_dir, runs):
    return [[*TRAIN, str(servers), "--scheduler", sched, *extra, "--results-dir", str(results_dir), "--run-id", rid]
            for rid, sched, servers, extra in runs]


RUNS_3 = [("bsp", "ps_bsp", 1, []), ("osp", "osp", 1, ["--stage1-share", "0.5", "--importance", "position"]),
          ("ssp", "ps_ssp", 1, ["--staleness", "1"])]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Server, worker 0, worker 1 results of the one 3-rank launch, by case name."""
    runs_dir = tmp_path_factory.mktemp("ps_runs")
    cases = [CASES[n] for n in NAMES]
    argvs = _argvs(runs_dir, RUNS_3)
    t0 = time.perf_counter()
    out = launch_local(roles=[Role("server", T.ps_suite, 1, args=(cases, argvs)),
                              Role("worker", T.ps_suite, 2, args=(cases, argvs))], timeout_s=300, pg_timeout_s=60)
    server, *workers = out
    return {"server": dict(zip(NAMES, server["cases"])), "workers": [dict(zip(NAMES, w["cases"])) for w in workers],
            "ddp": [w["ddp"] for w in workers], "runs": [r["runs"] for r in out], "runs_dir": runs_dir,
            "seconds": time.perf_counter() - t0}


def _diff(a: dict, b: dict) -> float:
    return max((a[n].double() - b[n].double()).abs().max().item() for n in a)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ---------------------------------------------------------------------------------------------
# the written reference: one process, plain torch
# ---------------------------------------------------------------------------------------------

def _stage_two(plan_dict: dict) -> set[str]:
    from repro.core.plan import Plan
    from repro.families.ps.simulate import plan_layout

    plan = Plan.from_dict(plan_dict)
    return {n for b, (stage, _) in zip(plan.buckets, plan_layout(plan)) if stage == 2 for n in b.layers}


def reference(case: dict, stage2: set[str], workers: int = 2) -> list[dict]:
    """The servers' parameters W_0..W_K of OSP (BSP when ``stage2`` is empty), from the math:

        W_{t+1} = opt(W_t, (g_0 + ... + g_{N-1}) / N),  g_i = grad of worker i's loss at P_t^i, where
        P_t^i = W_t on stage-1 parameters and W_{max(t-1, 0)} on stage-2 ones (one step stale: the
        stage-2 values used in iteration t are those after step t-1's update, W_0 while there is none),
        and with LGP, for t >= 1, P_t^i -= lr * g_i(t-1) on stage-2 parameters (worker i's own last one).
    """
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kind = case.get("optimizer", "sgd")
        lgp = case["mode"] == "osp" and case.get("lgp", True)
        master = T.make_model()
        opt = T.make_optimizer(kind, master.parameters())
        lr = T.LR[kind]
        data = [T.batches(i, case["steps"]) for i in range(workers)]
        W = [{n: p.detach().clone() for n, p in master.named_parameters()}]
        last = [None] * workers
        probe = T.make_model()
        for t in range(case["steps"]):
            stale = W[max(t - 1, 0)]
            grads = []
            for i in range(workers):
                with torch.no_grad():
                    for n, p in probe.named_parameters():
                        v = stale[n] if n in stage2 else W[t][n]
                        if lgp and n in stage2 and t >= 1:
                            v = v.add(last[i][n], alpha=-lr)
                        p.copy_(v)
                probe.zero_grad(set_to_none=True)
                x, y = data[i][t]
                T.loss_of(probe, x, y).backward()
                grads.append({n: p.grad.detach().clone() for n, p in probe.named_parameters()})
                last[i] = grads[-1]
            for n, p in master.named_parameters():
                total = grads[0][n].clone()
                for g in grads[1:]:
                    total += g[n]
                p.grad = total / workers
            opt.step()
            W.append({n: p.detach().clone() for n, p in master.named_parameters()})
        return W
    finally:
        torch.set_num_threads(prev_threads)


# ---------------------------------------------------------------------------------------------
# 1-3: OSP, BSP and the reference
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
def test_osp_with_everything_in_stage_one_is_bsp_exactly(world):
    from repro.core.plan import Plan

    for w in world["workers"]:
        bsp, osp = w["bsp"], w["osp_share1"]
        p_bsp, p_osp = Plan.from_dict(bsp["plan"]), Plan.from_dict(osp["plan"])
        assert p_bsp.solver == "ps_bsp" and p_osp.solver == "osp" and p_bsp != p_osp
        assert p_osp.option("mode") == "osp" and p_bsp.option("mode") == "bsp"
        assert set(osp["stages"].values()) == {1}
        assert _equal(bsp["params"], osp["params"])
        # the compared runs moved, and a stale OSP run ends elsewhere: the equality can fail
        assert _diff(bsp["params"], dict(T.make_model().named_parameters())) > 1e-3
        assert _diff(bsp["params"], w["osp_share0_nolgp"]["params"]) > 1e-4
    assert _equal(world["server"]["bsp"]["params"], world["server"]["osp_share1"]["params"])
    assert _equal(world["server"]["bsp"]["params"], world["workers"][0]["bsp"]["params"])


@pytest.mark.distributed
def test_bsp_equals_the_reference_without_staleness(world):
    for name in ("bsp", "bsp_adamw"):
        ref = reference(CASES[name], set())
        for w in world["workers"]:
            assert _diff(w[name]["params"], ref[-1]) < 1e-6, name


@pytest.mark.distributed
def test_osp_share_zero_without_lgp_is_one_step_stale(world):
    case = CASES["osp_share0_nolgp"]
    w0 = world["workers"][0]["osp_share0_nolgp"]
    stage2 = _stage_two(w0["plan"])
    assert stage2 == set(w0["params"]) and set(w0["stages"].values()) == {2}
    ref = reference(case, stage2)
    fresh = reference(case, set())
    for w in world["workers"]:
        row = w["osp_share0_nolgp"]
        assert _diff(row["params"], ref[-1]) < 1e-6
        assert _diff(row["params"], fresh[-1]) > 1e-4              # ... and it is not BSP
        assert _diff(row["params"], w["bsp"]["params"]) > 1e-4
        # in-run: iteration t computes with W_{max(t-1, 0)}, the servers' values after step t-1
        for rec in row["records"]:
            t = rec["step"]
            assert _diff(rec["after"], ref[max(t - 1, 0)]) < 1e-6, t
            if t >= 2:
                assert _diff(rec["after"], ref[t]) > 1e-5, t       # not the fresh values
        # before the flush the worker still holds what iteration K-1 computed with, W_{K-2} (the values
        # of steps K-2 and K-1 are pulled, or in flight, but not installed); the flush installs W_K
        assert _diff(row["unflushed"], ref[K - 2]) < 1e-6 and _diff(row["unflushed"], ref[K]) > 1e-5


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["osp_half_lgp", "osp_share0_lgp", "osp_half_lgp_adamw"])
def test_lgp_corrects_only_stage_two_by_its_formula(world, name):
    for w in world["workers"]:
        row = w[name]
        stage2 = {n for n, s in row["stages"].items() if s == 2}
        assert stage2 and stage2 == _stage_two(row["plan"])
        records = row["records"]
        assert [r["step"] for r in records] == list(range(K))
        moved = 0
        for rec in records:
            t, lr = rec["step"], rec["lr"]
            assert lr == T.LR[CASES[name].get("optimizer", "sgd")]
            assert set(rec["installed"]) == (stage2 if t >= 2 else set())
            for n in rec["after"]:
                if n not in stage2:   # stage 1: before_forward never touches it
                    assert torch.equal(rec["after"][n], rec["before"][n]), (t, n)
                    continue
                base = rec["installed"].get(n, rec["before"][n])  # the freshest aggregated values
                if t == 0:
                    assert not rec["local"] and torch.equal(rec["after"][n], base)
                    continue
                # g_local: this worker's own gradient of the previous step, exactly
                assert torch.equal(rec["local"][n], records[t - 1]["grads"][n]), (t, n)
                assert torch.equal(rec["after"][n], base.add(rec["local"][n], alpha=-lr)), (t, n)
                moved += int(not torch.equal(rec["after"][n], base))
        assert moved > 0
    # and the whole trajectory equals the reference with LGP (the installed values are the servers')
    case = CASES[name]
    ref = reference(case, _stage_two(world["workers"][0][name]["plan"]))
    for w in world["workers"]:
        assert _diff(w[name]["params"], ref[-1]) < 1e-5
    no_lgp = {"osp_half_lgp": "osp_half_nolgp", "osp_share0_lgp": "osp_share0_nolgp"}.get(name)
    if no_lgp:  # LGP changes the run
        assert _diff(world["workers"][0][name]["params"], world["workers"][0][no_lgp]["params"]) > 1e-5


@pytest.mark.distributed
def test_without_lgp_stale_parameters_are_the_aggregated_values(world):
    row = world["workers"][1]["osp_half_nolgp"]
    stage2 = {n for n, s in row["stages"].items() if s == 2}
    assert stage2 and stage2 != set(row["stages"])
    for rec in row["records"]:
        assert not rec["local"]
        for n in rec["after"]:
            expect = rec["installed"].get(n, rec["before"][n])
            assert torch.equal(rec["after"][n], expect)
    ref = reference(CASES["osp_half_nolgp"], stage2)
    assert _diff(row["params"], ref[-1]) < 1e-6


# ---------------------------------------------------------------------------------------------
# 4: SSP and ASP
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
def test_ssp_never_exceeds_its_staleness_bound(world):
    rows = world["server"]["ssp"]["tables"]["server_clocks"]
    s = CASES["ssp"]["staleness"]
    assert len(rows) == 2 * CASES["ssp"]["steps"]
    assert all(r["staleness"] == s for r in rows)
    ahead = [r["iteration"] - r["slowest_clock"] for r in rows]
    assert max(ahead) <= s
    assert ahead.count(s) >= 3          # the slow worker makes the bound bind (so this can fail)
    assert all(r["slowest_clock"] >= 0 for r in rows)
    for w in range(2):
        its = [r["iteration"] for r in rows if r["worker"] == w]
        assert its == list(range(1, CASES["ssp"]["steps"] + 1))


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["ssp", "asp"])
def test_asynchronous_workers_end_with_the_servers_values(world, name):
    server = world["server"][name]
    assert set(server["owned"]) == set(server["params"])
    finals = [w[name]["params"] for w in world["workers"]]
    for p in finals:
        assert _equal(p, server["params"])
    # before the flush at least one worker did not hold them (so the comparison can fail)
    assert any(not _equal(w[name]["unflushed"], server["params"]) for w in world["workers"])
    assert _diff(server["params"], dict(T.make_model().named_parameters())) > 1e-3
    if name == "asp":
        assert "server_clocks" not in server["tables"]


# ---------------------------------------------------------------------------------------------
# 5: DDP
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.parametrize("kind,name,tol", [("sgd", "bsp", 1e-6), ("adamw", "bsp_adamw", 1e-6)])
def test_bsp_on_the_ps_equals_ddp(world, kind, name, tol):
    for w, ddp in zip(world["workers"], world["ddp"]):
        states = ddp[kind]
        assert len(states) == K
        assert _diff(w[name]["params"], states[-1]) < tol
        assert _diff(w[name]["params"], states[-2]) > 1e-4    # one step fewer differs: this can fail
    assert _diff(world["ddp"][0]["sgd"][-1], world["ddp"][0]["adamw"][-1]) > 1e-4


# ---------------------------------------------------------------------------------------------
# 6: the generic loop
# ---------------------------------------------------------------------------------------------

def _summary(run_dir):
    return json.loads((run_dir / "run.json").read_text())["summary"]


@pytest.mark.distributed
def test_train_runs_on_one_server_and_two_workers(world):
    import pandas as pd

    runs_dir = world["runs_dir"]
    for i, (rid, sched, servers, _) in enumerate(RUNS_3):
        run = runs_dir / rid
        assert run.is_dir(), rid
        summary = _summary(run)
        assert summary["servers"] == 1 and summary["world_size"] == 2, summary
        assert summary["scheduler"] == sched and summary["steps"] == 3
        # every rank returns the first worker's summary; the workers end with the same parameters
        assert all(world["runs"][r][i]["summary"]["run_id"] == rid for r in range(3))
        w1, w2 = world["runs"][1][i]["params"], world["runs"][2][i]["params"]
        assert _equal(w1, w2), rid
        assert _equal(world["runs"][0][i]["params"], w1), rid   # one server holds every layer
    clocks = pd.read_csv(runs_dir / "ssp" / "server_clocks.csv")
    assert len(clocks) == 2 * 3 and ((clocks.iteration - clocks.slowest_clock) <= 1).all()
    for rid in ("bsp", "osp"):
        assert not (runs_dir / rid / "server_clocks.csv").exists()
    plan = json.loads((runs_dir / "osp" / "plan.json").read_text())
    assert {m["phase"] for b in plan["buckets"] for m in b["messages"]} == {"backward", "background"}


@pytest.mark.distributed
def test_train_runs_on_two_servers(tmp_path):
    from repro.core.plan import Plan
    from repro.families.ps.simulate import plan_layout

    argvs = _argvs(tmp_path, [("bsp2", "ps_bsp", 2, [])])
    out = launch_local(T.train_runs, 4, args=(argvs,), timeout_s=240, pg_timeout_s=60)
    summary = _summary(tmp_path / "bsp2")
    assert summary["servers"] == 2 and summary["world_size"] == 2
    plan = Plan.from_dict(json.loads((tmp_path / "bsp2" / "plan.json").read_text()))
    owners = {n: s for b, (_, s) in zip(plan.buckets, plan_layout(plan)) for n in b.layers}
    assert set(owners.values()) == {0, 1}
    workers = [out[2][0]["params"], out[3][0]["params"]]
    assert _equal(*workers)
    for s in (0, 1):   # each server holds the workers' values on its own shard only
        mine = [n for n, o in owners.items() if o == s]
        theirs = [n for n, o in owners.items() if o != s]
        assert all(torch.equal(out[s][0]["params"][n], workers[0][n]) for n in mine)
        assert any(not torch.equal(out[s][0]["params"][n], workers[0][n]) for n in theirs)


# ---------------------------------------------------------------------------------------------
# 8: faults
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.parametrize("who", ["worker", "server"])
def test_a_dead_rank_ends_the_run_naming_it(tmp_path, who):
    stamp = tmp_path / "died_at"
    if who == "worker":
        case = {"mode": "bsp", "steps": 400, "sleep": {0: 0.02, 1: 0.02}, "die": {"rank": 2, "after": 2,
                                                                                  "stamp": str(stamp)}}
    else:
        case = {"mode": "osp", "share": 0.5, "steps": 400, "sleep": {0: 0.02, 1: 0.02},
                "die": {"rank": 0, "after_s": 0.5, "stamp": str(stamp)}}
    rank = case["die"]["rank"]
    with pytest.raises(RankFailedError) as e:
        launch_local(roles=[Role("server", T.ps_server, 1, args=([case],)),
                            Role("worker", T.ps_worker, 2, args=([case],))], timeout_s=120, pg_timeout_s=20)
    noticed = time.time()
    err = e.value
    assert err.rank == rank and err.role == who
    assert str(err).splitlines()[0].startswith(f"rank {rank} of 3 (role {who}") and "exit code 3" in str(err)
    died = float(stamp.read_text())
    assert noticed - died < 10, noticed - died      # well within the process-group timeout (20 s)


@pytest.mark.distributed
def test_a_silent_worker_is_named_by_the_server():
    # worker rank 2 stops sending (alive, as a stopped process): the server's wait for it reaches the
    # process-group limit and the run ends naming rank 2, not the innocent worker the server's exit cuts off
    case = {"mode": "bsp", "steps": 400, "sleep": {0: 0.02, 1: 0.02}, "die": {"rank": 2, "after": 2, "hang": True}}
    with pytest.raises(RankFailedError) as e:
        launch_local(roles=[Role("server", T.ps_server, 1, args=([case],)),
                            Role("worker", T.ps_worker, 2, args=([case],))], timeout_s=120, pg_timeout_s=6)
    first = str(e.value).splitlines()[0]
    assert e.value.rank == 0 and "PSPeerSilentError" in first and "no message from worker rank 2" in first, first
