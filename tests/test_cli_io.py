"""``-o`` and the inputs of a command: an output that is an input is refused (never destroyed), ``-o -`` and
``-o /dev/stdout`` are standard output (a pipe included), and ``compare --schedulers`` needs a scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli.main import main
from tests.helpers import make_trace
from tests.test_outputs import OUTPUT_COMMANDS, PLAN_ARGS

ROOT = Path(__file__).resolve().parents[1]
NET = ["--network", "10gbe-v100", "--workers", "16"]
CSV = "bytes,workers,seconds,collective\n1000,8,0.001,allreduce\n1000000,8,0.01,allreduce\n"


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err


def _plan_file(tmp_path: Path, capsys) -> Path:
    plan = tmp_path / "p.json"
    assert main([*PLAN_ARGS, "-o", str(plan)]) == 0
    capsys.readouterr()
    return plan


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(tmp_path, capsys):
    plan = _plan_file(tmp_path, capsys)
    trace = tmp_path / "t.json"
    make_trace([1.0, 2.0], [400, 400]).save(trace)
    csv = tmp_path / "m.csv"
    csv.write_text(CSV)
    (tmp_path / "link.json").symlink_to(plan)
    before = {p: p.read_bytes() for p in (plan, trace, csv)}
    cases = [
        (["simulate", "--trace", "resnet50_b64_v100-estimate", "--plan", str(plan), *NET, "-o", str(plan)], "--plan"),
        (["simulate", "--trace", "resnet50_b64_v100-estimate", "--plan", str(plan), *NET,
          "-o", str(tmp_path / "link.json")], "--plan"),  # through a link
        (["simulate", "--trace", "resnet50_b64_v100-estimate", "--plan", "p.json", *NET,
          "-o", str(plan)], "--plan"),  # the same file by another name
        (["plan", "--trace", str(trace), "--solver", "mgwfbp", *NET, "-o", str(trace)], "--trace"),
        (["compare", "--trace", str(trace), *NET, "-o", str(trace)], "--trace"),
        (["compare", "--trace", "resnet50_b64_v100-estimate", "--workers", "16", "--cost", str(plan),
          "-o", str(plan)], "--cost"),
        (["cost", "fit", str(csv), "-o", str(csv)], "measurements"),
    ]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for argv, flag in cases:
            assert main(argv) == 2, argv
            err = _one_line(capsys)
            assert "is the same file as" in err and flag in err and "destroy the input" in err, err
    finally:
        os.chdir(cwd)
    assert {p: p.read_bytes() for p in (plan, trace, csv)} == before
    assert (tmp_path / "link.json").is_symlink()


@pytest.mark.parametrize("command", ["plan", "simulate", "compare", "cost fit", "cost cluster"])
def test_dash_is_standard_output_not_a_file(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    plan = _plan_file(tmp_path, capsys)
    (tmp_path / "m.csv").write_text(CSV)
    args = [a.replace("PLAN", str(plan)).replace("MEASUREMENTS", str(tmp_path / "m.csv"))
            for a in OUTPUT_COMMANDS[command]]
    assert main([*command.split(), *args, "-o", "-"]) == 0
    out = capsys.readouterr().out
    if command == "compare":  # a table for a person
        assert "scheduler" in out and "mgwfbp" in out
    else:
        json.loads(out)
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_standard_output_works_on_a_pipe(tmp_path, out):
    r = subprocess.run([sys.executable, "-m", "repro", *PLAN_ARGS, "-o", out], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout)["solver"] == "mgwfbp" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["-", "/dev/stdout"])
def test_profile_refuses_standard_output_before_measuring(capsys, monkeypatch, out):
    """profile prints its summary on standard output: its trace cannot go there too."""
    def measured(*_a, **_k):
        raise AssertionError("measured before checking the output path")

    monkeypatch.setattr("repro.workload.profile.profile_model", measured)
    assert main(["profile", *OUTPUT_COMMANDS["profile"], "-o", out]) == 2
    assert "standard output" in _one_line(capsys)


@pytest.mark.parametrize("schedulers", [",", "", " , ,"])
def test_compare_refuses_an_empty_scheduler_list(capsys, schedulers):
    assert main(["compare", "--trace", "resnet50_b64_v100-estimate", *NET, "--schedulers", schedulers]) == 2
    err = _one_line(capsys)
    assert "--schedulers" in err and "names no scheduler" in err and "mgwfbp" in err


def test_compare_function_refuses_an_empty_scheduler_list():
    from repro.cli.compare import compare
    from repro.costs.presets import preset

    with pytest.raises(ValueError, match="names no scheduler"):
        compare(make_trace([1.0, 2.0], [400, 400]), preset("10gbe-v100", 4), schedulers=[])
