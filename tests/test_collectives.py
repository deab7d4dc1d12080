"""repro.runtime.collectives.CommStream: ring reduce-scatter / all-gather on gloo (2 and 3 ranks).

Each rank builds every rank's input from a seed, so it checks its result against a reference computed
from all inputs (not from the collective): RS = the sum of every rank's shard (exact on integer-valued
float64, allclose on float32), AG = the concatenation, RS then AG = all-reduce; ops submitted back to
back run in FIFO order while the main thread runs its own collectives; bad buffers are refused before
any communication; a peer that never shows up makes ``wait()`` raise within the stream's timeout.
The launch targets live here (module-level, importable as ``tests.test_collectives:<name>``).
"""

import time

import pytest
import torch

from repro.launch.local import launch_local

SIZES = [1, 7, 1000, 333_334]  # x P elements: tiny (P), odd, small, ~1e6 (several 1 MiB chunks per shard)


def _inputs(n: int, P: int, dtype: torch.dtype, salt: int) -> list[torch.Tensor]:
    """Every rank's input for one case (rank i's is inputs[i]); float64 ones are integer-valued."""
    out = []
    for i in range(P):
        g = torch.Generator().manual_seed(1000 * salt + i)
        if dtype == torch.float64:
            out.append(torch.randint(-1000, 1000, (n,), generator=g).to(dtype))
        else:
            out.append(torch.randn(n, generator=g, dtype=dtype))
    return out


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def correctness_suite(ctx) -> dict:
    """Launch target: the checks on every rank; returns max errors and flags (the test asserts on them)."""
    import torch.distributed as dist

    from repro.runtime.collectives import CommStream

    P, r = dist.get_world_size(), dist.get_rank()
    res: dict = {"rs": [], "ag": [], "rs_ag_vs_ar": [], "native": []}
    ring = CommStream(backend_impl="ring")
    auto = CommStream()  # a second stream and group: both coexist
    native = CommStream(backend_impl="native")
    res["repr"] = repr(auto)
    case = 0
    for dtype in (torch.float32, torch.float64):
        for m in SIZES:
            if dtype == torch.float64 and m > 1000:
                continue
            case += 1
            n = m * P
            xs = _inputs(n, P, dtype, case)
            total = torch.stack(xs).sum(0)
            sl = slice(r * m, (r + 1) * m)
            # reduce-scatter: own shard = the sum over ranks
            buf = xs[r].clone()
            auto.reduce_scatter(buf).wait()
            res["rs"].append((str(dtype), n, _err(buf[sl], total[sl])))
            # then all-gather: every shard = its owner's sum = the all-reduce
            auto.all_gather(buf).wait()
            ar = xs[r].clone()
            dist.all_reduce(ar)
            res["rs_ag_vs_ar"].append((str(dtype), n, _err(buf, total), _err(buf, ar)))
            # all-gather alone: shard r holds rank r's data, the rest is garbage
            buf = torch.full((n,), float("nan"), dtype=dtype)
            buf[sl] = xs[r][sl]
            auto.all_gather(buf).wait()
            concat = torch.cat([xs[i][i * m:(i + 1) * m] for i in range(P)])
            res["ag"].append((str(dtype), n, _err(buf, concat), bool(torch.isnan(buf).any())))
            # the stream's all-reduce (native) and the ring one (RS + AG)
            a, b = xs[r].clone(), xs[r].clone()
            ha, hb = auto.all_reduce(a), ring.all_reduce(b)
            ha.wait(), hb.wait()
            res["rs_ag_vs_ar"].append((str(dtype), n, _err(a, total), _err(b, total)))
            # backend_impl="native": torch's own RS / AG on the stream's group
            c = xs[r].clone()
            native.reduce_scatter(c).wait()
            d = torch.zeros(n, dtype=dtype)
            d[sl] = xs[r][sl]
            native.all_gather(d).wait()
            res["native"].append((str(dtype), n, _err(c[sl], total[sl]), _err(d, concat)))

    # FIFO: several ops submitted back to back, then the main thread runs its own collectives meanwhile
    m = 200_000
    n = m * P
    xs = [_inputs(n, P, torch.float32, 100 + k) for k in range(5)]
    bufs = [x[r].clone() for x in xs]
    ag_in = torch.zeros(n)
    ag_in[r * m:(r + 1) * m] = xs[1][r][r * m:(r + 1) * m]
    bufs[1] = ag_in
    if r == 1:
        time.sleep(0.3)  # rank 0's first op cannot finish before rank 1 submits
    handles = [ring.reduce_scatter(bufs[0]), ring.all_gather(bufs[1]), ring.all_reduce(bufs[2]),
               ring.reduce_scatter(bufs[3]), auto.all_reduce(bufs[4])]
    res["first_pending"] = not handles[0].is_completed()
    side = torch.full((1000,), float(r + 1))
    for _ in range(5):
        dist.all_reduce(side)  # the default group, concurrently with the stream's traffic
    res["side"] = side[0].item()
    for h in handles:
        h.wait()
    res["completed"] = all(h.is_completed() for h in handles)
    stamps = [(h.submit_s, h.start_s, h.end_s) for h in handles[:4]]  # the ring stream's ops, in order
    res["fifo"] = all(s <= st <= e for s, st, e in stamps) and all(
        stamps[i][2] <= stamps[i + 1][1] for i in range(3))
    sl = slice(r * m, (r + 1) * m)
    totals = [torch.stack(x).sum(0) for x in xs]
    res["fifo_errs"] = [_err(bufs[0][sl], totals[0][sl]),
                        _err(bufs[1], torch.cat([xs[1][i][i * m:(i + 1) * m] for i in range(P)])),
                        _err(bufs[2], totals[2]), _err(bufs[3][sl], totals[3][sl]), _err(bufs[4], totals[4])]

    # bad buffers: refused at submission on one rank only; the next op still matches on every rank
    errors = []
    if r == 0:
        for bad in (torch.zeros(P + 1), torch.zeros(4 * P, 2).t()):
            try:
                ring.reduce_scatter(bad)
            except ValueError as e:
                errors.append(str(e))
        try:
            ring.all_gather(torch.zeros(2 * P + 1))
        except ValueError as e:
            errors.append(str(e))
    res["errors"] = errors
    buf = torch.full((P,), float(r + 1))
    ring.reduce_scatter(buf).wait()
    res["after_errors"] = buf[r].item()

    for s in (ring, auto, native):
        t0 = time.perf_counter()
        s.close()
        s.close()  # idempotent
        res.setdefault("close_s", []).append(time.perf_counter() - t0)
    with CommStream() as s:
        buf = torch.ones(P)
        s.reduce_scatter(buf).wait()
    res["ctx_manager"] = buf[r].item()
    try:
        s.all_gather(buf)
        res["after_close"] = None
    except RuntimeError as e:
        res["after_close"] = str(e)
    return res


def absent_peer(ctx, timeout_s: float) -> dict:
    """Launch target: rank 0 submits a reduce-scatter that rank 1 never joins; rank 0's wait must raise."""
    import torch.distributed as dist

    from repro.runtime.collectives import CommStream

    res = {}
    stream = CommStream(timeout_s=timeout_s)
    if dist.get_rank() == 0:
        t0 = time.perf_counter()
        h = stream.reduce_scatter(torch.ones(1 << 16))
        try:
            h.wait()
            res["error"] = None
        except RuntimeError as e:
            res["error"] = str(e)
        res["wait_s"] = time.perf_counter() - t0
        try:
            stream.all_gather(torch.ones(4))
            res["later"] = None
        except RuntimeError as e:
            res["later"] = str(e)
    t0 = time.perf_counter()
    stream.close()
    res["close_s"] = time.perf_counter() - t0
    dist.barrier()  # the default group still works
    return res


@pytest.fixture(scope="module", params=[2, 3])
def suite(request):
    return request.param, launch_local(correctness_suite, request.param, timeout_s=120)


@pytest.mark.distributed
def test_reduce_scatter_is_the_sum_of_every_ranks_shard(suite):
    P, out = suite
    for res in out:
        assert len(res["rs"]) == len(SIZES) + 3
        for dtype, n, err in res["rs"]:
            assert err == 0.0 if dtype == "torch.float64" else err < 1e-5, (P, dtype, n, err)
        for dtype, n, err_c, err_n in res["native"]:
            assert err_c < 1e-5 and err_n == 0.0, (P, dtype, n)


@pytest.mark.distributed
def test_all_gather_is_the_concatenation(suite):
    P, out = suite
    for res in out:
        for dtype, n, err, has_nan in res["ag"]:
            assert err == 0.0 and not has_nan, (P, dtype, n)


@pytest.mark.distributed
def test_reduce_scatter_then_all_gather_is_an_all_reduce(suite):
    P, out = suite
    for res in out:
        for dtype, n, err_ref, err_other in res["rs_ag_vs_ar"]:
            tol = 0.0 if dtype == "torch.float64" else 1e-5
            assert err_ref <= tol and err_other <= tol, (P, dtype, n, err_ref, err_other)
    assert "ring" in out[0]["repr"] and f"of {P}" in out[0]["repr"]


@pytest.mark.distributed
def test_back_to_back_ops_run_in_fifo_order_beside_main_thread_collectives(suite):
    P, out = suite
    assert out[0]["first_pending"]
    for res in out:
        assert res["completed"] and res["fifo"]
        assert max(res["fifo_errs"]) < 1e-5, res["fifo_errs"]
        assert res["side"] == (P * (P + 1) / 2) * P ** 4  # 5 all-reduces of (r + 1)


@pytest.mark.distributed
def test_bad_buffers_are_refused_before_any_communication(suite):
    P, out = suite
    errs = out[0]["errors"]
    assert len(errs) == 3 and all("\n" not in e for e in errs)
    assert f"numel {P + 1} is not divisible by the world size {P}" in errs[0]
    assert "contiguous" in errs[1]
    assert "all_gather" in errs[2] and "divisible" in errs[2]
    for r, res in enumerate(out):  # nothing was sent: the next op matched on every rank
        assert res["after_errors"] == P * (P + 1) / 2
        assert res["ctx_manager"] == P
        assert "closed" in res["after_close"]
        assert max(res["close_s"]) < 1.0


@pytest.mark.distributed
def test_an_absent_peer_fails_wait_within_the_timeout():
    r0, r1 = launch_local(absent_peer, 2, args=(2.0,), timeout_s=60)
    assert r0["error"] is not None and "reduce_scatter" in r0["error"], r0
    assert r0["wait_s"] < 10.0, r0
    assert "broken" in r0["later"]
    assert r0["close_s"] < 1.0 and r1["close_s"] < 1.0
