"""Small, fast contract checks of the command line (issue 20): help, listings, version, one-line errors."""

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from repro.cli.main import main

PY = [sys.executable, "-m", "repro"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_version_is_the_installed_metadata_version():
    r = subprocess.run(PY + ["--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"repro {version('repro')}"
    import repro

    assert repro.__version__ == version("repro")


# ---- --help: real defaults only; `repro train --help` quick, torch-free, naming the choices ----

def _all_parsers():
    import argparse

    from repro.cli.main import build_parser
    from repro.training.config import build_parser as train_parser

    top = build_parser()
    yield "repro", top
    yield "repro train", train_parser()
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def test_help_shows_a_default_only_where_there_is_one():
    for name, parser in _all_parsers():
        text = " ".join(parser.format_help().split())
        for nothing in ("(default: None)", "(default: False)", "(default: ==SUPPRESS==)"):
            assert nothing not in text, (name, nothing)
    helps = dict(_all_parsers())
    assert "(default: 3600.0)" in " ".join(helps["launch"].format_help().split())  # --timeout-s
    assert "(default: mgwfbp)" in " ".join(helps["repro train"].format_help().split())


_NO_TORCH = """
import contextlib, io, sys
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        {call}
    except SystemExit as e:
        assert e.code == 0, e.code
assert "torch" not in sys.modules, "torch was imported"
print(out.getvalue())
"""


@pytest.mark.parametrize("call", [
    "from repro.cli.main import main; main(['train', '--help'])",
    "import runpy; sys.argv = ['repro.train', '--help']; runpy.run_module('repro.train', run_name='__main__')",
], ids=["repro_train", "python_m_repro_train"])
def test_train_help_does_not_import_torch_and_lists_models_and_schedulers(call):
    from repro.core.schedulers import scheduler_names
    from repro.workload.catalog import MODEL_NAMES

    r = subprocess.run([sys.executable, "-c", _NO_TORCH.format(call=call)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    words = set(r.stdout.replace(",", " ").split())
    assert set(MODEL_NAMES) <= words and set(scheduler_names()) <= words
    assert "(default: None)" not in r.stdout


def test_the_torch_free_catalogue_is_the_registry():
    from repro.training.config import VIEWS
    from repro.workload import layers, models
    from repro.workload.catalog import MODEL_INFO

    assert VIEWS == layers.VIEWS
    assert list(models.MODELS) == list(MODEL_INFO)
    for name, info in MODEL_INFO.items():
        assert {k: getattr(models.MODELS[name], k) for k in info.as_kwargs()} == info.as_kwargs()


# ---- the run's numbers are checked before any rank starts ----

@pytest.fixture
def no_ranks(monkeypatch):
    from repro.launch import local

    def refuse(*args, **kwargs):
        raise AssertionError("ranks would have been started")

    monkeypatch.setattr(local, "_launch", refuse)
    monkeypatch.setattr(local, "launch_local", refuse)


@pytest.mark.parametrize("train_args, message", [
    (["--model", "tiny_bert", "--seq-len", "-3"], "--seq-len must be a positive number of tokens, got -3"),
    (["--model", "tiny_lstm", "--seq-len", "0"], "--seq-len must be a positive number of tokens, got 0"),
    (["--model", "tiny_vgg", "--seq-len", "8"], "model 'tiny_vgg' does not take seq_len"),
    (["--model", "tiny_vgg", "--seed", "-1"], "seed must be an integer in [0, 2**32)"),
    (["--model", "tiny_vgg", "--seed", str(2**40)], "seed must be an integer in [0, 2**32)"),
])
def test_train_numbers_are_refused_before_any_rank_starts(capsys, no_ranks, train_args, message):
    rc, out, err = run(capsys, "launch", "--nproc", "2", "--", *train_args)
    assert rc == 2 and message in err, err
    assert err.startswith("repro: error: ") and err.count("\n") == 1
    rc, out, err = run(capsys, "train", *train_args)  # per rank: before the process group
    assert rc == 2 and message in err and err.count("\n") == 1, err


# ---- listings: a table for a person, --format json for scripts ----

@pytest.mark.parametrize("command", ["schedulers", "presets", "models", "traces"])
def test_listings_print_a_table_or_json(capsys, command):
    rc, table, err = run(capsys, command)
    assert rc == 0 and err == ""
    with pytest.raises(json.JSONDecodeError):
        json.loads(table)
    header = table.splitlines()[0].split()
    assert header[0] == command.rstrip("s")
    rc, out, err = run(capsys, command, "--format", "json")
    assert rc == 0 and err == ""
    obj = json.loads(out)
    names = obj["schedulers"] if command == "schedulers" else obj
    rows = [line.split()[0] for line in table.splitlines()[1:len(names) + 1]]
    assert rows == list(names)  # one row per entry, in the JSON's order
    rc, _, err = run(capsys, command, "--format", "yaml")
    assert rc == 2 and "invalid choice: 'yaml'" in err and err.count("\n") == 1


def test_listings_json_content():
    from repro.costs.presets import preset_names
    from repro.core.paths import shipped_traces
    from repro.core.schedulers import SCHEDULERS
    from repro.workload.catalog import MODEL_NAMES

    def listing(command):
        r = subprocess.run(PY + [command, "--format", "json"], capture_output=True, text=True, check=True)
        return json.loads(r.stdout)

    s = listing("schedulers")
    assert set(s) == {"schedulers", "aliases", "families"} and set(s["schedulers"]) == set(SCHEDULERS)
    p = listing("presets")
    assert list(p) == list(preset_names()) and set(p["10gbe-v100"]) == {"workers", "doc"}
    m = listing("models")
    assert list(m) == list(MODEL_NAMES)
    assert m["resnet50"]["family"] == "vision" and m["resnet50"]["params"] == 25_557_032
    assert m["tiny_vgg"]["kind"] == "tiny" and m["tiny_vgg"]["paper_batch_size"] is None
    t = listing("traces")
    assert list(t) == shipped_traces()
    assert {k: t["resnet50_b32_v100-estimate"][k] for k in ("model", "batch_size", "device")} == \
        {"model": "resnet50", "batch_size": 32, "device": "V100 (estimate)"}
    assert t["resnet50_b32_v100-estimate"]["layers"] > 50


def test_models_and_traces_do_not_import_torch():
    code = ("import sys; from repro.cli.main import main; assert main(['models']) == 0; assert main(['traces']) == 0; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resnet50" in r.stdout and "tiny_vgg_b32_cpu" in r.stdout


# ---- huge numbers: one line, no numpy warnings ----

@pytest.mark.parametrize("solver", ["mgwfbp", "optimal"])
def test_overflowing_costs_are_one_line_without_warnings(tmp_path, solver):
    huge = ["--alpha-s", "1e308", "--beta-s-per-byte", "1e308"]
    r = subprocess.run(PY + ["plan", "--trace", "tiny_vgg_b32_cpu", "--solver", solver, *huge], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("repro: error: ") and r.stderr.count("\n") == 1, r.stderr
    # refused by the flag's range (repro.core.ranges: what a plan or cost file may hold) before any arithmetic
    assert "Warning" not in r.stderr and "flag '--alpha-s' = 1e+308 is outside the plausible range" in r.stderr
    plan = tmp_path / "plan.json"
    assert main(["plan", "--trace", "tiny_vgg_b32_cpu", "--solver", "syncea", "--alpha-s", "1", "--beta-s-per-byte",
                 "1e-6", "-o", str(plan)]) == 0
    r = subprocess.run(PY + ["simulate", "--trace", "tiny_vgg_b32_cpu", "--plan", str(plan), *huge],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Warning" not in r.stderr, r.stderr


def test_trace_errors_name_the_file_in_one_line(capsys, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    for trace, message in [(deep, f"{deep}: trace JSON is nested too deeply"), (tmp_path, "is a folder"),
                           ("../calibration/10gbe-calibrated", "trace file not found")]:
        rc, out, err = run(capsys, "plan", "--trace", str(trace), "--solver", "syncea", "--alpha-s", "1",
                           "--beta-s-per-byte", "1")
        assert rc == 2 and out == "" and message in err and err.count("\n") == 1, err


# ---- a progress bar's line is ended before the error line ----

def test_launch_ends_a_killed_ranks_progress_bar_line_before_the_error(capsys, monkeypatch):
    from repro.launch import local

    def rank_killed_mid_bar(fn, world_size, args, **kwargs):
        mark = args[2]
        assert mark, "the ranks were not given a progress mark"
        open(mark, "w").close()  # what rank 0's bar does when it opens
        sys.stderr.write("tiny_vgg/local:   3%|#         | 3/100")  # ... and the rank is killed mid-line
        raise RuntimeError("rank 0 of 2 failed: killed")

    monkeypatch.setattr(local, "launch_local", rank_killed_mid_bar)
    rc, out, err = run(capsys, "launch", "--nproc", "2", "--", "--model", "tiny_vgg", "--scheduler", "local")
    assert rc == 2
    assert err.splitlines()[-1] == "repro: error: rank 0 of 2 failed: killed", err

    def quiet_run(fn, world_size, args, **kwargs):
        assert args[2] is None  # --quiet: no bar, no mark
        raise RuntimeError("rank 0 of 2 failed: killed")

    monkeypatch.setattr(local, "launch_local", quiet_run)
    rc, out, err = run(capsys, "launch", "--nproc", "2", "--", "--model", "tiny_vgg", "--scheduler", "local",
                       "--quiet")
    assert rc == 2 and err == "repro: error: rank 0 of 2 failed: killed\n"


def test_a_rank_ends_its_progress_bar_line_when_training_fails(capsys, monkeypatch, tmp_path):
    import repro.train as train

    def fail_mid_run(ctx, cfg):
        bar = train._progress(True, 10, cfg)
        bar.update(3)
        assert (tmp_path / "mark").exists()
        raise RuntimeError("peer went away")

    monkeypatch.setattr(train, "train_worker", fail_mid_run)
    with pytest.raises(RuntimeError, match="peer went away"):
        train.worker_from_argv(None, ["--model", "tiny_vgg", "--scheduler", "local"], None, str(tmp_path / "mark"))
    err = capsys.readouterr().err
    assert err.endswith("\n") and "3/10" in err  # the bar's line is ended
    assert not (tmp_path / "mark").exists() and train._Progress.live == []


# ---- every error of main() is one line, exit 2 ----

@pytest.fixture
def bad_files(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"buckets": "caf\xe9"}')
    folder = tmp_path / "folder.json"
    folder.mkdir()
    return {"deep": (deep, "nested too deeply"), "latin": (latin, "not UTF-8"), "folder": (folder, "is a folder"),
            "device": (Path("/dev/null"), "is not a regular file")}


@pytest.mark.parametrize("which", ["deep", "latin", "folder", "device"])
@pytest.mark.parametrize("kind", ["plan", "cost"])
def test_plan_and_cost_file_errors_name_the_file(capsys, bad_files, which, kind):
    path, message = bad_files[which]
    if kind == "plan":
        argv = ["simulate", "--trace", "tiny_vgg_b32_cpu", "--plan", str(path), "--alpha-s", "1",
                "--beta-s-per-byte", "1"]
    else:
        argv = ["plan", "--trace", "tiny_vgg_b32_cpu", "--solver", "syncea", "--cost", str(path)]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == "" and str(path) in err and message in err, err
    assert err.startswith("repro: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["plan", "--trace", "", "--solver", "syncea", "--alpha-s", "1", "--beta-s-per-byte", "1"], "the trace is empty"),
    (["profile", "--model", "tiny_vgg", "--batch-size", "2", "--warmup", str(10**20), "-o", "x.json"],
     "--warmup must be in [0, 1000]"),
    (["profile", "--model", "tiny_vgg", "--batch-size", "2", "--iters", str(10**9), "-o", "x.json"],
     "--iters in [1, 10000]"),
])
def test_more_bad_input_is_one_line(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_an_internal_error_is_one_line_too(capsys, monkeypatch):
    import repro.cli.main as cli

    def bug(args):
        raise KeyError("oops")

    monkeypatch.setattr(cli, "cmd_presets", bug)
    rc, out, err = run(capsys, "presets")
    assert rc == 2 and err.startswith("repro: error: KeyError: 'oops'") and err.count("\n") == 1, err
    rc, out, err = run(capsys, "-vv", "presets")  # asked for details: the traceback, then the line
    assert rc == 2 and "Traceback" in err and err.splitlines()[-1].startswith("repro: error: KeyError")
