"""`repro calibrate --torchrun`: every rank of a torchrun job (any number of nodes) times the
collectives and rank 0 writes the cost file that plan, simulate, compare and train accept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from repro.cli.main import main
from repro.core.cost import CostModel


@pytest.mark.parametrize("argv, env, message", [
    (["calibrate", "--torchrun"], {}, "WORLD_SIZE is not set"),
    (["calibrate", "--torchrun", "--nproc", "2"], {"WORLD_SIZE": "2"}, "leave --nproc"),
    (["calibrate"], {}, "needs --nproc N"),
])
def test_bad_combinations_are_one_line(argv, env, message, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.distributed
@pytest.mark.slow
def test_under_torchrun_rank_zero_writes_a_cost_file_the_planners_take(tmp_path):
    out = tmp_path / "cost.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "repro",
           "calibrate", "--torchrun", "--collectives", "allreduce,reduce_scatter,allgather", "--sizes", "2",
           "--min-bytes", "4096", "--max-bytes", "65536", "--repeats", "1", "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    cost = CostModel.load(out)
    assert cost.workers == 2 and {"allreduce", "reduce_scatter", "allgather"} <= set(cost.lines)
    assert json.loads(out.read_text())["meta"]["rsag_impl"] == "ring"
    plan = subprocess.run([sys.executable, "-m", "repro", "plan", "--trace", "resnet50_b32_v100-estimate",
                           "--solver", "dear_threshold", "--cost", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert plan.returncode == 0, plan.stderr
