"""What each writer of the command line writes, the matching reader reads: the cost flags carry the ranges
of the files they end up in (repro.core.ranges), and a plan or cluster file that would be refused on reading
is refused before it is written (`repro plan --alpha-s 1e300` used to write iteration_s 1e300, which
`repro simulate --plan` refused; `repro cost cluster --gpus-per-node 1000000000` exited 0 with a file
`--cost` refused)."""

from __future__ import annotations

import json

import pytest

from repro.cli.main import main

TRACE = "tiny_resnet_b32_cpu"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err.strip()


@pytest.mark.parametrize("argv, words", [
    (["plan", "--solver", "mgwfbp", "--alpha-s", "1e300", "--beta-s-per-byte", "1e-9"],
     "flag '--alpha-s' = 1e+300 is outside the plausible range [0, 1e6] s"),
    (["plan", "--solver", "mgwfbp", "--alpha-s", "1e-4", "--beta-s-per-byte", "2"],
     "flag '--beta-s-per-byte' = 2.0 is outside the plausible range [0, 1] s/byte"),
    (["plan", "--solver", "mgwfbp", "--alpha-s", "nan", "--beta-s-per-byte", "1e-9"], "--alpha-s"),
    (["plan", "--solver", "mgwfbp", "--network", "10gbe-calibrated", "--nodes", "2", "--gpus-per-node",
      "1000000000"], "flag '--gpus-per-node' = 1000000000 is outside the plausible range [1, 100000]"),
    (["plan", "--solver", "mgwfbp", "--network", "10gbe-calibrated", "--nodes", "1000", "--gpus-per-node", "1000"],
     "--nodes 1000 x --gpus-per-node 1000 = 1000000 devices is outside the plausible range"),
    (["plan", "--solver", "mgwfbp", "--network", "10gbe-calibrated", "--workers", "1000000000"],
     "flag '--workers' = 1000000000 is outside the plausible range [2, 100000]"),
    (["plan", "--solver", "mgwfbp", "--alpha-s", "1e6", "--beta-s-per-byte", "1"],
     "the plan would not load back (plan field 'iteration_s'"),
])
def test_plan_refuses_what_simulate_would_refuse(tmp_path, capsys, argv, words):
    out = tmp_path / "p.json"
    rc, _, err = _run(capsys, *argv, "--trace", TRACE, "-o", str(out))
    assert rc == 2, err
    assert words in err, err
    assert len(err.splitlines()) == 1
    assert not out.exists()


def test_simulate_refuses_an_absurd_cost(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert _run(capsys, "plan", "--trace", TRACE, "--solver", "mgwfbp", "--alpha-s", "1e-4",
                "--beta-s-per-byte", "1e-9", "-o", str(plan))[0] == 0
    rc, out, err = _run(capsys, "simulate", "--trace", TRACE, "--plan", str(plan), "--alpha-s", "1e300",
                        "--beta-s-per-byte", "1e-9")
    assert rc == 2 and "--alpha-s" in err and out == "", err
    rc, out, err = _run(capsys, "simulate", "--trace", TRACE, "--plan", str(plan), "--alpha-s", "1e6",
                        "--beta-s-per-byte", "1")
    assert rc == 2 and "predicted 'iteration_s'" in err and "outside the plausible range" in err and out == "", err


def test_cost_cluster_refuses_what_its_readers_refuse(tmp_path, capsys):
    c = tmp_path / "c.json"
    rc, _, err = _run(capsys, "cost", "cluster", "--gpus-per-node", "1000000000", "--inter-link", "25gbit",
                      "-o", str(c))
    assert rc == 2 and "flag '--gpus-per-node' = 1000000000 is outside the plausible range" in err, err
    assert not c.exists()
    rc, _, err = _run(capsys, "cost", "cluster", "--gpus-per-node", "8", "--inter-link", "25gbit",
                      "--topk-gamma", "5", "-o", str(c))
    assert rc == 2 and "flag '--topk-gamma' = 5.0 is outside the plausible range [0, 1e-3]" in err, err
    assert not c.exists()


def test_what_each_writer_writes_its_reader_reads(tmp_path, capsys):
    """The largest values the flags take still give files the readers take."""
    c, p, s = tmp_path / "c.json", tmp_path / "p.json", tmp_path / "s.json"
    assert _run(capsys, "cost", "cluster", "--gpus-per-node", "100000", "--inter-link", "25gbit",
                "-o", str(c))[0] == 0
    for reader in ("--cost", "--network"):
        rc, _, err = _run(capsys, "plan", "--trace", TRACE, "--solver", "mgwfbp", reader, str(c), "--workers", "8",
                          "-o", str(p))
        assert rc == 0, err
    assert json.loads(p.read_text())["provenance"]["workers"] == 8
    rc, _, err = _run(capsys, "simulate", "--trace", TRACE, "--plan", str(p), "--cost", str(c), "--workers", "8",
                      "-o", str(s))
    assert rc == 0, err
    rc, _, err = _run(capsys, "plan", "--trace", TRACE, "--solver", "mgwfbp", "--alpha-s", "1e-3",
                      "--beta-s-per-byte", "1e-3", "--workers", "100000", "-o", str(p))
    assert rc == 0, err
    rc, _, err = _run(capsys, "simulate", "--trace", TRACE, "--plan", str(p), "--alpha-s", "1e-3",
                      "--beta-s-per-byte", "1e-3", "--workers", "100000")
    assert rc == 0, err
