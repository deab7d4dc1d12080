"""Small, fast contract checks of the command line (issue 20): help, listings, version, one-line errors."""

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from repro.cli import main

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

    from repro.cli import build_parser
    from repro.train_config import build_parser as train_parser

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
    "from repro.cli import main; main(['train', '--help'])",
    "import runpy; sys.argv = ['repro.train', '--help']; runpy.run_module('repro.train', run_name='__main__')",
], ids=["repro_train", "python_m_repro_train"])
def test_train_help_does_not_import_torch_and_lists_models_and_schedulers(call):
    from repro.schedulers import scheduler_names
    from repro.workload.catalog import MODEL_NAMES

    r = subprocess.run([sys.executable, "-c", _NO_TORCH.format(call=call)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    words = set(r.stdout.replace(",", " ").split())
    assert set(MODEL_NAMES) <= words and set(scheduler_names()) <= words
    assert "(default: None)" not in r.stdout


def test_the_torch_free_catalogue_is_the_registry():
    from repro.train_config import VIEWS
    from repro.workload import layers, models
    from repro.workload.catalog import MODEL_INFO

    assert VIEWS == layers.VIEWS
    assert list(models.MODELS) == list(MODEL_INFO)
    for name, info in MODEL_INFO.items():
        assert {k: getattr(models.MODELS[name], k) for k in info.as_kwargs()} == info.as_kwargs()


# ---- the run's numbers are checked before any rank starts ----

@pytest.fixture
def no_ranks(monkeypatch):
    from repro.cluster import local

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
