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
