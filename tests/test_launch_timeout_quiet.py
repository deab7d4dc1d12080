"""A launch that times out ends in its one-line error: no resource-tracker warning about a semaphore that a
killed rank's progress bar left behind (repro.launch.local)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def hang_with_a_progress_bar(ctx) -> None:
    from tqdm import tqdm

    bar = tqdm(total=10, desc="hang")
    bar.update(1)
    time.sleep(600)


@pytest.mark.distributed
def test_a_timed_out_launch_leaks_no_semaphore(tmp_path):
    script = (
        "import sys\n"
        "from repro.launch.local import LaunchTimeoutError, launch_local\n"
        "from tests.test_launch_timeout_quiet import hang_with_a_progress_bar\n"
        "try:\n"
        "    launch_local(hang_with_a_progress_bar, 1, timeout_s=12)\n"
        "except LaunchTimeoutError as e:\n"
        "    print('TIMEOUT', e, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "TIMEOUT launch_local timed out" in r.stderr, r.stderr
    assert "leaked semaphore" not in r.stderr and "resource_tracker" not in r.stderr, r.stderr
