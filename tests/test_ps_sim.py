"""The parameter-server simulator (repro.families.ps.simulate): BSP, ASP, SSP and OSP timelines over iterations."""

from __future__ import annotations

import numpy as np
import pytest

from repro.core.cost import Linear
from repro.families.ps.simulate import PSSetting, auto_stage2_share, simulate_ps

LINE = Linear(1e-4, 1e-8)   # 100 us + 10 ns per byte (100 MB/s) per message on a server link
MB = 1e6


def _run(mode, N=4, S=1, compute=None, nbytes=2 * MB, update_s=0.0, **kw):
    compute = compute if compute is not None else [0.05] * N
    return simulate_ps(compute, nbytes, LINE, LINE, PSSetting(N, S, mode, iterations=10, **kw), update_s)


def test_one_worker_bsp_is_compute_push_update_pull():
    res = _run("bsp", N=1, update_s=0.003)
    assert res.period_s == pytest.approx(0.05 + LINE(2 * MB) + 0.003 + LINE(2 * MB))


def test_server_links_bound_the_period():
    # every period each server link carries N pushes (and N pulls) of n/S bytes
    for mode in ("bsp", "asp", "ssp"):
        for N, S in ((4, 1), (8, 2), (3, 3)):
            res = _run(mode, N=N, S=S, compute=[0.001] * N)
            assert res.period_s >= N * LINE(2 * MB / S) - 1e-12, (mode, N, S)


def test_osp_with_the_whole_gradient_in_stage_one_is_bsp():
    rng = np.random.default_rng(0)
    for _ in range(10):
        N = int(rng.integers(1, 6))
        compute = rng.uniform(0.01, 0.08, N).tolist()
        a = _run("bsp", N=N, compute=compute, update_s=0.002)
        b = _run("osp", N=N, compute=compute, update_s=0.002, stage1_share=1.0)
        assert a.period_s == b.period_s
        assert np.array_equal(a.compute_starts_s(), b.compute_starts_s())


def test_osp_hides_stage_two_behind_the_next_computation():
    # 4 workers, 2 MB, 50 ms compute: BSP exposes 4 pushes + 4 pulls (~0.16 s); with everything in
    # stage 2 the link work (0.16 s per period) exceeds compute, so the period is link-bound; with the
    # automatic share the stage-2 traffic fits into the 50 ms of compute
    bsp = _run("bsp").period_s
    share2 = auto_stage2_share(0.05, 2 * MB, LINE, LINE, workers=4)
    assert 0 < share2 < 1
    b2 = share2 * 2 * MB
    assert 4 * (LINE(b2) + LINE(b2)) <= 0.05 + 1e-12
    osp = _run("osp", stage1_share=1 - share2).period_s
    assert osp < bsp
    periods = [_run("osp", stage1_share=r).period_s for r in (1.0, 0.9, 1 - share2, 0.5, 0.25, 0.0)]
    assert all(b <= a + 1e-9 for a, b in zip(periods, periods[1:]))  # less in stage 1, never slower here
    # nothing in stage 1: the period is bound by the server link, full duplex (4 pushes in, 4 pulls out)
    assert periods[-1] == pytest.approx(max(0.05, 4 * LINE(2 * MB)), rel=1e-9)


def test_osp_waits_for_stage_two_of_the_iteration_before_last():
    res = _run("osp", N=2, stage1_share=0.5)
    starts = res.compute_starts_s()
    pulls2 = {}
    for op in res.ops:
        if op.kind == "pull_stage2":
            w, i = (int(x[1:]) for x in op.label.split())
            pulls2[(w, i)] = max(pulls2.get((w, i), 0.0), op.end_s)
    for (w, i), end in pulls2.items():
        if i + 2 < starts.shape[1]:
            assert starts[w, i + 2] >= end - 1e-12


def test_asp_never_waits_for_a_straggler_and_bsp_does():
    compute = [0.02, 0.02, 0.02, 0.2]  # one worker 10x slower
    bsp = _run("bsp", compute=compute, nbytes=0.1 * MB)
    asp = _run("asp", compute=compute, nbytes=0.1 * MB)
    fast_bsp = np.diff(bsp.compute_starts_s()[0]).mean()
    fast_asp = np.diff(asp.compute_starts_s()[0]).mean()
    assert fast_bsp > 0.2 and fast_asp < 0.03


@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_keeps_every_worker_within_its_staleness_bound(s):
    compute = [0.01, 0.015, 0.03, 0.2]
    res = _run("ssp", compute=compute, nbytes=0.1 * MB, staleness=s)
    applied_end: dict[tuple[int, int], float] = {}
    for op in res.ops:
        if op.kind == "update":
            w, i = (int(x[1:]) for x in op.label.split())
            applied_end[(w, i)] = op.end_s
    starts = res.compute_starts_s()
    N, M = starts.shape
    for w in range(N):
        for i in range(s + 1, M):
            slowest_done = min(applied_end[(v, i - s - 1)] for v in range(N) if v != w)
            assert starts[w, i] >= slowest_done - 1e-12  # iteration i starts only once all finished i-s-1
    # a larger bound lets the fast workers run further ahead
    loose = _run("ssp", compute=compute, nbytes=0.1 * MB, staleness=s + 3)
    assert np.diff(loose.compute_starts_s()[0]).mean() <= np.diff(starts[0]).mean() + 1e-12


def test_shards_share_the_load():
    one = _run("bsp", N=8, S=1, compute=[0.001] * 8).period_s
    four = _run("bsp", N=8, S=4, compute=[0.001] * 8).period_s
    assert four < one / 2


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="unknown synchronisation mode"):
        PSSetting(2, mode="bulk")
    with pytest.raises(ValueError, match="stage1_share"):
        PSSetting(2, mode="osp", stage1_share=1.5)
    with pytest.raises(ValueError, match="iterations must exceed"):
        PSSetting(2, iterations=2, warmup=2)
    with pytest.raises(ValueError, match="compute_s has 1 entries for 2 workers"):
        simulate_ps([0.1], 1e6, LINE, LINE, PSSetting(2))
