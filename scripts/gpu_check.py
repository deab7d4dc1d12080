"""Run the GPU tests (``pytest -m gpu``) and write a Markdown report with the environment.

    python scripts/gpu_check.py                 # on a machine with CUDA: writes docs/gpu_report.md
    python scripts/gpu_check.py out/report.md   # somewhere else

Commit the report whenever a GPU is at hand: it is the record of what one GPU proved (tests/test_gpu.py
and every other test marked ``gpu``). Without CUDA the gpu tests are collected and skipped (see
tests/conftest.py); the script says so and exits 0, and leaves docs/gpu_report.md alone unless a
report path is given (so a committed GPU report is not overwritten by a CPU run). CI never needs it.

Exit status: pytest's on a GPU (0: every gpu test passed), 0 without one.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPORT = ROOT / "docs" / "gpu_report.md"


def environment() -> dict[str, str]:
    """Device name, torch / CUDA / NCCL versions, date, commit (what can be read; never raises)."""
    env = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "platform": platform.platform()}
    try:
        env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        if dirty:
            env["commit"] += " (with uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        env["commit"] = "unknown"
    try:
        import torch
    except ImportError:
        env["torch"] = "not installed"
        env["cuda_available"] = "False"
        return env
    env["torch"] = torch.__version__
    env["cuda (torch built with)"] = str(torch.version.cuda)
    env["cuda_available"] = str(torch.cuda.is_available())
    if torch.cuda.is_available():
        env["device_count"] = str(torch.cuda.device_count())
        env["device"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        env["capability"] = f"{major}.{minor}"
        props = torch.cuda.get_device_properties(0)
        env["memory"] = f"{props.total_memory / 2**30:.1f} GiB"
        env["bf16 supported"] = str(torch.cuda.is_bf16_supported())
    try:
        import torch.cuda.nccl as nccl

        v = nccl.version()
        env["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # noqa: BLE001 - a build without NCCL
        env["nccl"] = f"unavailable ({type(e).__name__})"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            env["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return env


def run_tests(extra: list[str]) -> tuple[int, list[dict[str, str]], str]:
    """``pytest -m gpu -q`` from the repository root; (exit status, one row per test, output tail)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "gpu.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *extra]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        rows = parse_junit(junit) if junit.exists() else []
    output = (proc.stdout + proc.stderr).strip()
    return proc.returncode, rows, "\n".join(output.splitlines()[-40:])


def parse_junit(path: Path) -> list[dict[str, str]]:
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                detail = (el.get("message") or "").splitlines()[0][:160] if el.get("message") else ""
                break
        rows.append({"test": f"{case.get('classname', '')}::{case.get('name', '')}", "outcome": outcome,
                     "time_s": f"{float(case.get('time') or 0):.2f}", "detail": detail})
    return rows


def verdict(status: int, rows: list[dict[str, str]], cuda: bool) -> str:
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests"
    if not cuda:
        return f"no GPU (torch.cuda.is_available() is False): the gpu tests were collected and skipped ({summary})"
    if status == 5:
        return "no test marked gpu was collected"
    return ("all gpu tests passed" if status == 0 else f"FAILED (pytest exit status {status})") + f": {summary}"


def render(env: dict[str, str], status: int, rows: list[dict[str, str]], tail: str, cuda: bool) -> str:
    lines = ["# GPU check", "",
             "Written by `python scripts/gpu_check.py` (`pytest -m gpu -q`: tests/test_gpu.py and every other "
             "test marked `gpu`). Commit it whenever a GPU is at hand; CI never runs it.", "",
             f"**Result:** {verdict(status, rows, cuda)}", "", "## Environment", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines += ["", "## Tests", ""]
    if rows:
        lines += ["| test | outcome | seconds | detail |", "|---|---|---:|---|"]
        lines += [f"| `{r['test']}` | {r['outcome']} | {r['time_s']} | {r['detail'].replace('|', '/')} |"
                  for r in rows]
    else:
        lines.append("(no per-test results)")
    lines += ["", "## pytest output (tail)", "", "```", tail, "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", default=None,
                    help=f"Markdown report to write (default {DEFAULT_REPORT.relative_to(ROOT)}; without "
                         "CUDA it is written only when given)")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, one string (e.g. '-x -k nccl')")
    args = ap.parse_args(argv)
    env = environment()
    cuda = env.get("cuda_available") == "True"
    status, rows, tail = run_tests(args.pytest_args.split())
    print(verdict(status, rows, cuda))
    report = Path(args.report) if args.report else (DEFAULT_REPORT if cuda else None)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(render(env, status, rows, tail, cuda))
        print(f"report written to {report}")
    else:
        print(f"no GPU: {DEFAULT_REPORT.relative_to(ROOT)} left as it is (give a path to write a report anyway)")
    if not cuda:
        return 0 if status in (0, 5) else status
    return status


if __name__ == "__main__":
    sys.exit(main())
