"""The command line's contract: every option documented, --version, one error line with one prefix
before any work, quiet on a closed pipe and on Ctrl-C."""

import argparse
import json
import re
import signal
import subprocess
import sys
import time

import pytest

from repro import __version__
from repro.cli.main import build_parser, main
from repro.train import build_parser as train_parser

PY = [sys.executable, "-m", "repro"]


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_every_option_has_help_and_defaults_are_shown():
    parsers = [("repro", build_parser()), ("train", train_parser())] + list(_subparsers(build_parser()))
    for name, parser in parsers:
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = " ".join(parser.format_help().split())
        assert "(default: None)" not in text and "(default: False)" not in text, name  # only real defaults
    assert "(default: 0.05)" in train_parser().format_help()  # --lr
    assert "(default: 5)" in " ".join(dict(_subparsers(build_parser()))["calibrate"].format_help().split())


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"repro {__version__}"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def plan_args():
    return ["plan", "--trace", "tiny_vgg_b32_cpu", "--solver", "syncea", "--alpha-s", "1e-4", "--beta-s-per-byte", "1e-9"]


def test_outputs_that_cannot_be_written_fail_first_with_one_line(capsys, tmp_path, plan_args):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, message in [(tmp_path, "is a folder"), (afile / "x.json", "is a file, not a folder"),
                         (tmp_path / "missing" / "x.json", "does not exist"),
                         ("/proc/repro-plan.json", "cannot be written")]:
        rc, stdout, err = run(capsys, *plan_args, "-o", str(out))
        assert rc == 2 and message in err, (out, err)
        assert err.startswith("repro: error: ") and err.count("\n") == 1 and "repro: error: repro" not in err
    rc, _, err = run(capsys, "profile", "--model", "tiny_vgg", "--batch-size", "2", "-o", str(tmp_path))
    assert rc == 2 and "is a folder" in err  # before any profiling
    rc, _, err = run(capsys, "calibrate", "--nproc", "2", "-o", str(afile / "c.json"))
    assert rc == 2 and "is a file, not a folder" in err  # before any rank starts
    rc, _, _ = run(capsys, *plan_args, "-o", str(tmp_path / "plan.json"))
    assert rc == 0 and json.loads((tmp_path / "plan.json").read_text())["solver"] == "syncea"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "plan.json"]  # no temporary files left


@pytest.mark.parametrize("argv, message", [
    (["plan", "--trace", "tiny_vgg_b32_cpu", "--solver", "threshold", "--threshold-bytes", "-1", "--alpha-s", "1",
      "--beta-s-per-byte", "1"], "threshold_bytes must not be negative"),
    (["plan", "--trace", "tiny_vgg_b32_cpu", "--solver", "nope"], "plan: argument --solver: invalid choice"),
    (["profile", "--model", "nope", "--batch-size", "2", "-o", "x.json"], "unknown model 'nope'"),
    (["profile", "--model", "tiny_vgg", "--batch-size", "2", "--estimate-gpu", "Z80", "-o", "x.json"], "Z80"),
    (["calibrate", "--nproc", "2", "--sizes", "0"], "--sizes must be between 2 and 64"),
    (["calibrate", "--nproc", "2", "--repeats", "0"], "--repeats must be between 1 and 1000"),
    (["launch", "--nproc", "2", "--timeout-s", "inf", "--", "--model", "tiny_vgg"], "finite"),
    (["launch", "--nproc", "2", "--", "--no-such-flag"], "train: unrecognized arguments: --no-such-flag"),
    (["launch", "--nproc", "2", "--", "--lr", "nan"], "lr must be a finite non-negative number"),
    (["launch", "--nproc", "2", "--", "--network", "nope"], "unknown network preset 'nope'"),
    (["launch", "--nproc", "2", "--", "--results-dir", "/proc/repro-runs"], "results dir /proc/repro-runs is not"),
])
def test_bad_input_is_one_line_with_one_prefix(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and message in err, err
    assert err.startswith("repro: error: ") and err.count("\n") == 1 and "usage:" not in err


def test_bad_plans_and_traces_are_one_line(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"buckets": [["l0"]], "wire_dtype": ["float16"]}))
    rc, _, err = run(capsys, "simulate", "--trace", "tiny_vgg_b32_cpu", "--plan", str(plan), "--alpha-s", "1",
                     "--beta-s-per-byte", "1")
    assert rc == 2 and "wire_dtype" in err and "must be one of" in err
    big = tmp_path / "t.json"
    big.write_text(json.dumps({"model": "m", "batch_size": 1, "device": "cpu", "dtype": "float32", "layers": [
        {"name": "a", "params": 1, "bytes": 4, "forward_s": 1e308, "backward_s": 1e308}]}))
    rc, out, err = run(capsys, "plan", "--trace", str(big), "--solver", "syncea", "--alpha-s", "1",
                       "--beta-s-per-byte", "1")
    assert rc == 2 and "'layers[0].forward_s' = 1e+308 is outside the plausible range" in err and "Infinity" not in out


def test_a_closed_pipe_ends_quietly():
    r = subprocess.run(" ".join(PY) + " presets | head -c 20 > /dev/null", shell=True, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.distributed
def test_ctrl_c_is_one_line():
    p = subprocess.Popen(PY + ["launch", "--nproc", "1", "--", "--model", "tiny_vgg", "--scheduler", "local",
                               "--steps", "100000", "--quiet"], stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == "repro: interrupted" and "Traceback" not in err


def _commands() -> list[str]:
    return list(dict(_subparsers(build_parser())))


def test_the_usage_line_and_the_readme_table_name_every_command():
    """`repro --help`'s first line lists every subcommand (it once left out grid), and the README's
    command table has a row for each (it once left out compare, cost and grid)."""
    from pathlib import Path

    description = build_parser().description
    listed = description[description.index("{") + 1: description.index("}")].split(",")
    assert listed == _commands()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.splitlines() if line.startswith("| `repro ")]
    named = {word.strip("`,") for row in rows for word in row.split("|")[1].split()} - {"repro"}
    assert set(_commands()) <= named, sorted(set(_commands()) - named)


def test_no_help_text_stops_mid_sentence():
    """Each subcommand's summary and description end as sentences or phrases do, not on a dangling
    option (`repro launch`'s once ended "... and ARGS' --pg-timeout-s")."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert not re.search(r"--[\w-]+$", choice.help.rstrip()), (choice.dest, choice.help)
                assert not choice.help.rstrip().endswith((",", ";", " and", " or")), (choice.dest, choice.help)
    for name, parser in _subparsers(build_parser()):
        if parser.description:
            assert parser.description.rstrip().endswith((".", ")")), (name, parser.description[-80:])
