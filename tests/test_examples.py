"""The examples run as their docstrings say: under torchrun, 2 gloo ranks on the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.distributed
@pytest.mark.slow
def test_torchvision_example_under_torchrun(tmp_path):
    """A torchvision model and the user's own loop with `repro.distribute` as the only repro call, one
    torchrun job training five schedulers in turn: the example's own DDP check must print a zero
    difference for the exact exchanges (two ranks: see test_api) and a non-zero one for the sparse
    family, which changes the math on purpose (it must train and differ)."""
    schedulers = ["mgwfbp", "optimal", "dear_threshold", "bytescheduler", "omgs"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(EXAMPLES / "distribute_torchvision.py"), "--scheduler", ",".join(schedulers), "--steps", "4",
           "--check-ddp", "--option", "threshold_bytes=1048576", "--option", "density=0.01"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    for scheduler in schedulers:
        m = re.search(rf"^{scheduler}: (\d+) buckets, last loss [\d.]+, max \|param - DDP's\| (\S+)$", done.stdout,
                      re.M)
        assert m, (scheduler, done.stdout)
        exact = scheduler != "omgs"
        assert int(m.group(1)) >= 1 and (float(m.group(2)) < 1e-6) == exact, (scheduler, m.group(0))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("scheduler, options", [("ps_bsp", []), ("osp", ["--option", "stage1_share=0.5"])])
def test_parameter_server_example_under_torchrun(scheduler, options, tmp_path):
    """The PS family in the user's own loop, servers co-located on the 2 ranks (one shard each): BSP
    equals DDP (zero up to rounding, see test_api_ps); OSP trains with stale stage-2 parameters, so it
    differs on purpose."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(EXAMPLES / "distribute_ps.py"), "--scheduler", scheduler, "--steps", "4", "--check-ddp", *options]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    line = rf"^{scheduler}: mode (\w+), 2 servers, (\d+) buckets, last loss [\d.]+, max \|param - DDP's\| (\S+)$"
    m = re.search(line, done.stdout, re.M)
    assert m, done.stdout
    assert m.group(1) == scheduler.removeprefix("ps_") and int(m.group(2)) >= 2
    assert (float(m.group(3)) < 1e-6) == (scheduler == "ps_bsp")
