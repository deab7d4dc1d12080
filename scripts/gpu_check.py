"""Run every GPU check of the project, each part time-boxed, and write a Markdown report with the numbers.

    python scripts/gpu_check.py                      # on a machine with CUDA: writes docs/gpu_report.md
    python scripts/gpu_check.py --out-dir DIR        # traces, CSVs and DIR/gpu_report.md (and docs/gpu_report.md)
    python scripts/gpu_check.py out/report.md        # the report somewhere else (docs/ left alone)
    python scripts/gpu_check.py --out-dir DIR --parts profiles,extras   # some parts only (a rerun)

The parts, in the order they run (each in its own subprocess with a time limit; a part that fails or
runs out of time is reported and the next one runs):

1. ``tests``: ``pytest -m gpu`` (tests/test_gpu.py and every other test marked ``gpu``);
3. ``profiles``: measured per-layer traces (``repro.workload.profile.profile_model``, module view) of
   resnet50, vgg16, inception_v4, densenet201 and bert_base at their paper batch sizes, in fp32 and
   under bf16 autocast (fp16 where the GPU has no bf16), written as ``<model>_b<batch>_<gpu>-<precision>.json``
   into the output folder, and the roofline estimator's per-layer error against each
   (``estimate_error.csv`` per trace, ``estimate_error_layers.csv`` per layer);
4. ``extras``: (a) the sparse executor with its timeline recorded against plain SGD (NCCL, world size
   1); (b) two gloo ranks sharing the GPU, one run per family through ``repro.distribute``; (c) float16
   + GradScaler through ``repro.distribute`` against DDP (NCCL, world size 1). The bodies live in
   tests/gpu_targets.py;
2. ``sanitizer``: part 1's tests again under ``TORCH_CUDA_SANITIZER=1`` (PyTorch's CUDA stream
   sanitizer), with whatever time is left, as the slowest and least predictable part.

The whole run is bounded by ``--budget-s`` (default 390 s: a 7-minute slot with room to start); each
part gets at most its own limit (``LIMITS_S``: tests 120 s, profiles 200 s with 60 s per model,
extras 45 + 120 + 60 s, sanitizer 150 s) and what is left of the budget, and is skipped when under 10 s
remain.
The report goes to ``DIR/gpu_report.md`` and, when no report path is given, to docs/gpu_report.md
(commit it: it is the record of what one GPU proved). A table of the parts is printed at the end.

Without CUDA the gpu tests are collected and skipped (tests/conftest.py), the other parts are skipped,
the script says so and exits 0, and writes a report only where asked (a path or ``--out-dir``), so a
committed GPU report is not overwritten by a CPU run. CI never needs it.

Exit status: pytest's of part 1 where not 0; else 1 when another part failed or ran out of time; else 0
(always 0 without CUDA, unless the collection itself failed).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REPORT = ROOT / "docs" / "gpu_report.md"
DEFAULT_OUT_DIR = ROOT / "results" / "gpu_check"

#: the paper models of part 3 (each at its paper batch size, ``repro models``)
PROFILE_MODELS = ("resnet50", "vgg16", "inception_v4", "densenet201", "bert_base")
PARTS = ("tests", "profiles", "extras", "sanitizer")  # the order they run in
TITLES = {"tests": "1. gpu tests (pytest -m gpu)", "sanitizer": "2. gpu tests under TORCH_CUDA_SANITIZER=1",
          "profiles": "3. Measured traces and the estimator's error", "extras": "4. Extra checks"}
#: each part's own limit, seconds (and per profiled model, and per extra check)
LIMITS_S = {"tests": 120.0, "profiles": 200.0, "profile_model": 60.0, "sanitizer": 150.0,
            "sparse_timeline": 45.0, "two_ranks": 120.0, "fp16_vs_ddp": 60.0}
MIN_PART_S = 10.0  # a part (or a model, or a check) is skipped with less than this left
WORKER_START_S = 15.0  # a worker's start (python, torch, CUDA) and exit, left out of a budget given to it
#: the extra checks of part 4: name -> (module, function, whether it takes a backend, what it checks)
EXTRA_CHECKS = {
    "sparse_timeline": ("tests.gpu_targets", "sparse_timeline_matches_sgd", True,
                        "(a) sparse executor (topk_single, omgs merge) at density 1, record_timeline=True, "
                        "NCCL world size 1, against plain SGD"),
    "two_ranks": ("tests.gpu_targets", "two_ranks_per_family", False,
                  "(b) two gloo ranks sharing cuda:0, 5 steps per family through repro.distribute "
                  "(2 warm-up steps, planned online)"),
    "fp16_vs_ddp": ("tests.gpu_targets", "fp16_scaler_vs_ddp", True,
                    "(c) float16 autocast + GradScaler (an inf loss at step 2) through repro.distribute "
                    "against DDP, NCCL world size 1"),
}
RESULT_MARK = "GPU_CHECK_RESULT "
ERROR_MARK = "GPU_CHECK_ERROR "
PRECISION_AUTOCAST = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
#: the estimator's dtype for a measured precision: under autocast the matmuls and convolutions run on
#: tensor cores at the 16-bit rate, which is the estimator's "float16" (its bf16 peak is the same)
PRECISION_ESTIMATE_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# ---------------------------------------------------------------------------------------------
# Environment, time limits, subprocesses
# ---------------------------------------------------------------------------------------------

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


class Budget:
    """The run's wall-clock budget: ``limit(cap)`` is the seconds a part may take now (its own ``cap``
    or what is left of ``total_s``, whichever is less; never negative)."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.start = time.monotonic()

    def left(self) -> float:
        return max(0.0, self.total_s - (time.monotonic() - self.start))

    def limit(self, cap_s: float) -> float:
        return min(cap_s, self.left())


@dataclass
class Bounded:
    """One subprocess run under a time limit: exit status (None if it was killed), stdout and stderr
    interleaved, whether the limit was hit, and the wall seconds it took."""

    returncode: int | None
    output: str
    timed_out: bool
    seconds: float


def run_bounded(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> Bounded:
    """Run ``cmd`` from the repository root for at most ``timeout_s`` seconds. On time-out its whole
    process group (it is started in a session of its own, so the ranks it spawned go too) is killed
    and the output so far is kept."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(timeout_s, 0.1))
        return Bounded(proc.returncode, out or "", False, time.perf_counter() - t0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process outside the group still holds the pipe
            proc.kill()
            out = ""
        return Bounded(None, out or "", True, time.perf_counter() - t0)


def _subprocess_env(**extra: str) -> dict[str, str]:
    """This environment with the repository root first on PYTHONPATH (the workers import tests.*)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _shown(path: Path) -> str:
    """``path`` relative to the repository root where it is inside it (for messages)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


# ---------------------------------------------------------------------------------------------
# Workers: one function in a subprocess, its JSON result on one marked stdout line
# ---------------------------------------------------------------------------------------------

@dataclass
class WorkerRun:
    """``status``: "passed" (a result came back), "error" (it raised or died: ``error``, one line), or
    "timed out"; ``seconds`` of wall time."""

    status: str
    result: Any
    error: str
    seconds: float
    output: str = ""


def run_worker(name: str, kwargs: dict[str, Any], timeout_s: float) -> WorkerRun:
    """``worker(name, **kwargs)`` in ``python scripts/gpu_check.py --worker`` for at most ``timeout_s`` s."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--worker-args", json.dumps(kwargs)]
    run = run_bounded(cmd, timeout_s, env=_subprocess_env())
    for line in reversed(run.output.splitlines()):
        if line.startswith(RESULT_MARK):
            return WorkerRun("passed", json.loads(line[len(RESULT_MARK):]), "", run.seconds, run.output)
        if line.startswith(ERROR_MARK):
            return WorkerRun("error", None, line[len(ERROR_MARK):], run.seconds, run.output)
    if run.timed_out:
        return WorkerRun("timed out", None, f"no result within {timeout_s:.0f} s", run.seconds, run.output)
    return WorkerRun("error", None, f"exit status {run.returncode}: {_last_line(run.output)}", run.seconds,
                     run.output)


def _worker_function(name: str):
    """The function a worker runs: ``profile`` (below) or an extra check's body (tests/gpu_targets.py)."""
    if name == "profile":
        return profile_worker
    if name not in EXTRA_CHECKS:
        raise ValueError(f"unknown worker {name!r}; known: profile, {', '.join(EXTRA_CHECKS)}")
    import importlib

    module, function, _, _ = EXTRA_CHECKS[name]
    return getattr(importlib.import_module(module), function)


def worker_main(name: str, args_json: str) -> int:
    """Entry point of a worker process: run it, print its JSON result (or one error line) marked."""
    sys.path.insert(0, str(ROOT))
    try:
        result = _worker_function(name)(**json.loads(args_json))
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line, the traceback above it
        traceback.print_exc()
        print(ERROR_MARK + _one_line(e), flush=True)
        return 1
    print(RESULT_MARK + json.dumps(result, default=str), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Parts 1 and 2: pytest -m gpu (plain, and under the CUDA sanitizer)
# ---------------------------------------------------------------------------------------------

@dataclass
class TestRun:
    """One ``pytest -m gpu`` run: exit status (None if cut by its time limit), one row per test, output."""

    status: int | None
    rows: list[dict[str, str]]
    output: str
    timed_out: bool
    seconds: float

    @property
    def tail(self) -> str:
        return "\n".join(self.output.strip().splitlines()[-40:])


def run_tests(extra: list[str], timeout_s: float, env_extra: dict[str, str] | None = None) -> TestRun:
    """``pytest -m gpu -v`` from the repository root for at most ``timeout_s`` seconds. Rows from the
    JUnit XML; when cut by the limit (no XML), from the verbose lines printed so far."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "gpu.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *extra]
        run = run_bounded(cmd, timeout_s, env=_subprocess_env(**(env_extra or {})))
        rows = parse_junit(junit) if junit.exists() else parse_verbose(run.output)
    return TestRun(run.returncode, rows, run.output, run.timed_out, run.seconds)


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


_VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def parse_verbose(output: str) -> list[dict[str, str]]:
    """Rows from ``pytest -v`` lines (``path::test[param] PASSED  [ 4%]``): what ran before a cut."""
    outcome = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
               "XFAIL": "skipped", "XPASS": "passed"}
    rows = []
    for line in output.splitlines():
        m = _VERBOSE_LINE.match(line.strip())
        if m:
            rows.append({"test": m.group(1), "outcome": outcome[m.group(2)], "time_s": "", "detail": ""})
    return rows


def counts(rows: list[dict[str, str]]) -> dict[str, int]:
    return {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}


def count_text(rows: list[dict[str, str]]) -> str:
    return ", ".join(f"{v} {k}" for k, v in counts(rows).items() if v) or "no tests"


def verdict(status: int | None, rows: list[dict[str, str]], cuda: bool, timed_out: bool = False,
            limit_s: float | None = None) -> str:
    summary = count_text(rows)
    if not cuda:
        return f"no GPU (torch.cuda.is_available() is False): the gpu tests were collected and skipped ({summary})"
    if timed_out:
        return f"CUT after {limit_s:.0f} s (its time limit): {summary} before the cut"
    if status == 5:
        return "no test marked gpu was collected"
    return ("all gpu tests passed" if status == 0 else f"FAILED (pytest exit status {status})") + f": {summary}"


_RACE_HEAD = re.compile(r"Access by stream (\d+) during kernel:")
_PREVIOUS = re.compile(r"Previous access by stream (\d+) during kernel:")
_REPRO_FRAME = re.compile(r'File "([^"]*/(?:repro|tests)/[^"]+)", line (\d+)')


def csan_races(output: str) -> list[str]:
    """The data races the CUDA sanitizer printed, one line each (distinct, in order of appearance):
    ``op (stream a) after op (stream b) at path:line`` with the last repro/tests frame of the racing
    access's stack trace."""
    races: list[str] = []
    for block in output.split("CSAN detected a possible data race")[1:]:
        lines = block.splitlines()
        current = previous = where = ""
        stream_now = stream_before = "?"
        for i, line in enumerate(lines):
            m = _RACE_HEAD.search(line)
            if m and not current:
                stream_now, current = m.group(1), (lines[i + 1].strip() if i + 1 < len(lines) else "?")
                continue
            m = _PREVIOUS.search(line)
            if m:
                stream_before, previous = m.group(1), (lines[i + 1].strip() if i + 1 < len(lines) else "?")
                break
            f = _REPRO_FRAME.search(line)
            if f and current:
                where = f"{f.group(1).split('/repro/')[-1].split('/tests/')[-1]}:{f.group(2)}"
        text = f"{current.split('(')[0]} (stream {stream_now}) after {previous.split('(')[0]} (stream {stream_before})"
        text += f" at {where}" if where else ""
        if text not in races:
            races.append(text)
    return races


# ---------------------------------------------------------------------------------------------
# Part 3: measured traces and the estimator's error
# ---------------------------------------------------------------------------------------------

def device_tag(device_name: str) -> str:
    """A short lower-case tag for trace names: the first model number in the device name (``"NVIDIA
    H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``), else the name's words without
    "NVIDIA", joined by ``-``."""
    name = device_name.replace("NVIDIA", "")
    m = re.search(r"\b([A-Za-z]{1,2}\d{2,4})\b", name)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def estimator_gpu(device_name: str) -> tuple[str, str]:
    """The estimator's GPU for a measured device: (name, note). A GPU of the estimator's table named in
    the device name is used as it is; otherwise the H100, with a note saying so."""
    from repro.workload.estimate import GPU_SPECS

    tag = device_tag(device_name)
    for name in GPU_SPECS:
        if name.lower() == tag:
            return name, ""
    note = (f"the estimator has no {device_name} ({', '.join(GPU_SPECS)}): the H100 SXM's datasheet peaks "
            "are used")
    if tag == "h200":
        note += ("; the H200's compute peaks are the H100 SXM's and its memory bandwidth is higher (4.8 vs "
                 "3.35 TB/s), so memory-bound layers should measure faster than this estimate")
    return "H100", note


def trace_file_name(model: str, batch_size: int, tag: str, precision: str) -> str:
    """``resnet50_b32_h200-fp32.json``: the shipped traces' naming (``<model>_b<batch>_<device>``) with
    the precision."""
    return f"{model}_b{batch_size}_{tag}-{precision}.json"


def profile_worker(model: str, batch_size: int, out_dir: str, tag: str, precisions: list[str], warmup: int,
                   iters: int, device: str = "cuda") -> dict[str, Any]:
    """(In a worker.) Profile ``model`` on ``device`` in each precision (module view) and save each trace to
    ``out_dir``; per precision the file, layer count, forward / backward totals (seconds) and the wall
    seconds it took, or the one-line error (a failure does not stop the next precision)."""
    import torch

    from repro.workload.profile import profile_model

    out: dict[str, Any] = {}
    for precision in precisions:
        t0 = time.perf_counter()
        try:
            trace = profile_model(model, batch_size, device=device, view="module", warmup=warmup, iters=iters,
                                  autocast=PRECISION_AUTOCAST[precision])
            path = Path(out_dir) / trace_file_name(model, batch_size, tag, precision)
            trace.save(path)
            out[precision] = {"file": path.name, "layers": trace.num_layers, "forward_s": trace.total_forward_s,
                              "backward_s": trace.total_backward_s, "seconds": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - e.g. out of memory: reported, the next precision still runs
            out[precision] = {"error": _one_line(e), "seconds": time.perf_counter() - t0}
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return out


def estimate_rows(measured_path: Path, gpu: str, dtype: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The estimator's error against one measured trace file: (summary, per-layer rows), from
    :func:`repro.workload.estimate.layer_errors` with ``estimate_trace`` of the same model, batch and
    view on ``gpu`` in ``dtype``."""
    from repro.core.trace import Trace
    from repro.workload.estimate import error_summary, estimate_trace, layer_errors

    measured = Trace.load(measured_path)
    estimated = estimate_trace(measured.model, measured.batch_size, gpu=gpu, view=measured.extra.get("view", "module"),
                               dtype=dtype, **measured.extra.get("model_kwargs", {}))
    rows = layer_errors(measured, estimated)
    return error_summary(rows), rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` (dicts with the same keys) as CSV with a header; an empty list removes ``path`` (no file
    of an earlier run is left to be read as this one's)."""
    if not rows:
        path.unlink(missing_ok=True)
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@dataclass
class Part:
    """One part's outcome: ``status`` ("passed", "failed", "timed out", "skipped"), wall ``seconds``,
    ``numbers`` (one line for the summary table) and ``data`` for its report section."""

    key: str
    title: str
    status: str
    seconds: float
    numbers: str
    data: dict[str, Any] = field(default_factory=dict)


def part_profiles(budget: Budget, out_dir: Path, device_name: str, amp: str, models: list[tuple[str, int]],
                  warmup: int, iters: int, device: str = "cuda") -> Part:
    """Part 3: one worker per (model, batch size), both precisions, on ``device`` (named ``device_name``,
    which also picks the trace names' tag and the estimator's GPU); then the estimator's error per trace
    (here, on the CPU: the estimator needs no GPU). Writes the traces and two CSVs into ``out_dir``."""
    from repro.core.trace import Trace

    t0 = time.perf_counter()
    part_limit = budget.limit(LIMITS_S["profiles"])
    tag = device_tag(device_name)
    gpu, gpu_note = estimator_gpu(device_name)
    precisions = ["fp32", amp]
    measured: list[dict[str, Any]] = []
    for model, batch in models:
        left = part_limit - (time.perf_counter() - t0)
        limit = min(LIMITS_S["profile_model"], left)
        files = {p: out_dir / trace_file_name(model, batch, tag, p) for p in precisions}
        for f in files.values():
            f.unlink(missing_ok=True)  # a trace found afterwards is this run's
        if limit < MIN_PART_S:
            measured += [{"model": model, "batch": batch, "precision": p, "status": "skipped",
                          "error": "out of time"} for p in precisions]
            continue
        print(f"  profiling {model} (batch {batch}, {'/'.join(precisions)}, limit {limit:.0f} s) ...", flush=True)
        run = run_worker("profile", {"model": model, "batch_size": batch, "out_dir": str(out_dir), "tag": tag,
                                     "precisions": precisions, "warmup": warmup, "iters": iters,
                                     "device": device}, limit)
        for p in precisions:
            got = (run.result or {}).get(p)
            row = {"model": model, "batch": batch, "precision": p, "seconds": (got or {}).get("seconds")}
            if got and "file" in got:
                row.update(status="measured", **{k: got[k] for k in ("file", "layers", "forward_s", "backward_s")})
            elif files[p].exists():  # saved before the worker was cut or failed
                trace = Trace.load(files[p])
                row.update(status="measured", file=files[p].name, layers=trace.num_layers,
                           forward_s=trace.total_forward_s, backward_s=trace.total_backward_s,
                           note=f"worker {run.status} after saving it")
            else:
                row.update(status="failed" if run.status != "timed out" else "timed out",
                           error=(got or {}).get("error") or run.error)
            measured.append(row)
    errors, layer_rows = [], []
    for row in measured:
        if row["status"] != "measured":
            continue
        dtype = PRECISION_ESTIMATE_DTYPE[row["precision"]]
        try:
            summary, rows = estimate_rows(out_dir / row["file"], gpu, dtype)
        except Exception as e:  # noqa: BLE001 - e.g. a model the estimator cannot trace: reported
            row["estimate_error"] = _one_line(e)
            continue
        errors.append({"model": row["model"], "batch": row["batch"], "precision": row["precision"],
                       "estimate_gpu": gpu, "estimate_dtype": dtype, **summary})
        layer_rows += [{"model": row["model"], "batch": row["batch"], "precision": row["precision"], **r}
                       for r in rows]
    write_csv(out_dir / "estimate_error.csv", errors)
    write_csv(out_dir / "estimate_error_layers.csv", layer_rows)
    ok = [r for r in measured if r["status"] == "measured"]
    medians = [e["median_abs_rel_error"] for e in errors if e["median_abs_rel_error"] is not None]
    numbers = f"{len(ok)}/{len(measured)} traces measured; estimator ({gpu}) error on {len(errors)}"
    if medians:
        numbers += f": median abs. rel. error per layer {min(medians):.0%}-{max(medians):.0%}"
    status = "passed" if len(ok) == len(measured) and len(errors) == len(ok) else (
        "timed out" if any(r["status"] in ("timed out", "skipped") for r in measured) else "failed")
    return Part("profiles", TITLES["profiles"], status, time.perf_counter() - t0,
                numbers, {"measured": measured, "errors": errors, "gpu": gpu, "gpu_note": gpu_note,
                          "warmup": warmup, "iters": iters, "out_dir": str(out_dir)})


# ---------------------------------------------------------------------------------------------
# Part 4: the extra checks
# ---------------------------------------------------------------------------------------------

def judge_extra(name: str, result: dict[str, Any]) -> tuple[bool, str]:
    """Whether an extra check passed, and its numbers in one line."""
    if name == "sparse_timeline":
        ok = all(v["diff"] < 1e-5 and v["timeline_ok"] for v in result.values())
        return ok, "; ".join(f"{k}: max abs diff {v['diff']:.2g}, timeline {'complete' if v['timeline_ok'] else 'BAD'}"
                             for k, v in result.items())
    if name == "two_ranks":
        ok = all(v["trains"] or v.get("refused") for v in result.values())

        def outcome(v: dict[str, Any]) -> str:
            return ("trains" if v["trains"] else "refused in one line" if v.get("refused") else
                    "not run" if str(v.get("error")).startswith("not run") else "FAILS")
        return ok, f"{sum(v['trains'] for v in result.values())}/{len(result)} families train; " + "; ".join(
            f"{k}: {outcome(v)}" for k, v in result.items())
    if name == "fp16_vs_ddp":
        ok = all(v["diff"] < 1e-4 and v["scales_equal"] and v["finite"] for v in result.values())
        return ok, "; ".join(f"{k}: max abs diff {v['diff']:.2g}, scales {'=' if v['scales_equal'] else '!='} DDP's"
                             for k, v in result.items())
    raise ValueError(name)


def part_extras(budget: Budget, names: list[str], device: str = "cuda", backend: str = "nccl") -> Part:
    """Part 4: each extra check in a worker of its own (its limit in LIMITS_S) on ``device``; the
    world-size-1 checks on ``backend`` (the two-rank check is gloo by definition)."""
    t0 = time.perf_counter()
    checks = {}
    for name in names:
        _, _, takes_backend, what = EXTRA_CHECKS[name]
        kwargs = {"device": device, **({"backend": backend} if takes_backend else {})}
        limit = budget.limit(LIMITS_S[name])
        if name == "two_ranks":  # one launch per family: all of them report before this worker's limit
            kwargs["budget_s"] = max(limit - WORKER_START_S, 1.0)
        if limit < MIN_PART_S:
            checks[name] = {"what": what, "status": "skipped", "numbers": "out of time", "seconds": 0.0}
            continue
        print(f"  {name} (limit {limit:.0f} s) ...", flush=True)
        run = run_worker(name, kwargs, limit)
        entry = {"what": what, "seconds": run.seconds, "result": run.result}
        if run.status == "passed":
            ok, numbers = judge_extra(name, run.result)
            entry.update(status="passed" if ok else "failed", numbers=numbers)
        else:
            entry.update(status=run.status, numbers=run.error)
        checks[name] = entry
        print(f"    {entry['status']}: {entry['numbers']}", flush=True)
    statuses = [c["status"] for c in checks.values()]
    status = ("passed" if all(s == "passed" for s in statuses) else
              "failed" if any(s in ("failed", "error") for s in statuses) else "timed out")
    numbers = ", ".join(f"{k} {c['status']}" for k, c in checks.items())
    return Part("extras", TITLES["extras"], status, time.perf_counter() - t0, numbers, {"checks": checks})


def part_tests(budget: Budget, key: str, pytest_args: list[str], cuda: bool) -> Part:
    """Part 1 (``tests``) or 2 (``sanitizer``: the same under TORCH_CUDA_SANITIZER=1)."""
    sanitizer = key == "sanitizer"
    limit = budget.limit(LIMITS_S[key])
    title = TITLES[key]
    if limit < MIN_PART_S:
        return Part(key, title, "skipped", 0.0, f"out of time ({limit:.0f} s left)")
    run = run_tests(pytest_args, limit, {"TORCH_CUDA_SANITIZER": "1"} if sanitizer else None)
    text = verdict(run.status, run.rows, cuda, run.timed_out, limit)
    status = ("skipped" if not cuda else "timed out" if run.timed_out else "passed" if run.status == 0
              else "failed")
    data = {"run": run, "verdict": text, "limit_s": limit}
    if sanitizer:
        data["races"] = csan_races(run.output)
        text += f"; {len(data['races'])} distinct data race(s) reported"
    return Part(key, title, status, run.seconds, text, data)


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _ms(seconds: Any) -> str:
    return f"{1e3 * seconds:.1f}" if isinstance(seconds, (int, float)) else ""


def _pct(fraction: Any) -> str:
    return f"{100 * fraction:.0f}%" if isinstance(fraction, (int, float)) else "n/a"


def _cell(text: Any) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _test_rows(rows: list[dict[str, str]], only_bad: bool = False) -> list[str]:
    shown = [r for r in rows if not only_bad or r["outcome"] in ("failed", "error")]
    if not shown:
        return ["(no per-test results)" if not rows else "(every test that ran passed or was skipped)"]
    return ["| test | outcome | seconds | detail |", "|---|---|---:|---|"] + [
        f"| `{r['test']}` | {r['outcome']} | {r['time_s']} | {_cell(r['detail'])} |" for r in shown]


def summary_table(parts: list[Part]) -> list[str]:
    return ["| part | outcome | seconds | numbers |", "|---|---|---:|---|"] + [
        f"| {p.title} | {p.status} | {p.seconds:.0f} | {_cell(p.numbers)} |" for p in parts]


def render(env: dict[str, str], parts: list[Part], cuda: bool, budget_s: float) -> str:
    by_key = {p.key: p for p in parts}
    first = by_key.get("tests")
    lines = ["# GPU check", "",
             "Written by `python scripts/gpu_check.py` (its docstring says what each part does). Commit it "
             "whenever a GPU is at hand; CI never runs it.", "",
             f"**Result:** {first.data['verdict'] if first and 'verdict' in first.data else 'part 1 did not run'}",
             "", f"## Parts (budget {budget_s:.0f} s)", ""]
    lines += summary_table(parts)
    lines += ["", "## Environment", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in env.items()]
    for p in parts:
        lines += ["", f"## {p.title}", "", f"**{p.status}** in {p.seconds:.0f} s: {p.numbers}", ""]
        if p.key in ("tests", "sanitizer") and "run" in p.data:
            lines += render_tests(p)
        elif p.key == "profiles" and p.data:
            lines += render_profiles(p)
        elif p.key == "extras" and p.data:
            lines += render_extras(p)
    lines.append("")
    return "\n".join(lines)


def render_tests(p: Part) -> list[str]:
    run: TestRun = p.data["run"]
    lines = _test_rows(run.rows, only_bad=p.key == "sanitizer")
    if p.key == "sanitizer":
        races = p.data.get("races", [])
        lines += ["", f"Data races the sanitizer reported: {len(races)} distinct."]
        lines += [f"- `{r}`" for r in races[:20]]
    lines += ["", "Output (tail):", "", "```", run.tail, "```"]
    return lines


def render_profiles(p: Part) -> list[str]:
    d = p.data
    lines = [f"Module view, warm-up {d['warmup']} and {d['iters']} timed iterations (per-layer medians), "
             f"CUDA events; traces in `{d['out_dir']}`. fp32 runs with PyTorch's default TF32 settings "
             "(recorded in each trace's `tf32`).", "",
             "| model | batch | precision | outcome | trace | layers | forward ms | backward ms | wall s |",
             "|---|---:|---|---|---|---:|---:|---:|---:|"]
    for r in d["measured"]:
        what = r.get("file", "") if r["status"] == "measured" else _cell(r.get("error", ""))
        wall = f"{r['seconds']:.1f}" if isinstance(r.get("seconds"), (int, float)) else ""
        lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['status']} | {what} | "
                     f"{r.get('layers', '')} | {_ms(r.get('forward_s'))} | {_ms(r.get('backward_s'))} | {wall} |")
    lines += ["", f"Estimator: `repro profile --estimate-gpu {d['gpu']}` (roofline, module view) for the same "
                  "model and batch; fp32 against its float32 estimate (CUDA-core peak), 16-bit autocast against "
                  "its float16 estimate (tensor-core peak, the same for bf16). Per layer: forward + backward "
                  "seconds; relative error = estimate / measured - 1.", ""]
    if d["gpu_note"]:
        lines += [f"Note: {d['gpu_note']}.", ""]
    lines += ["| model | precision | estimate | layers compared | median abs. rel. error | measured total ms | "
              "estimated total ms | total ratio (est./meas.) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for e in d["errors"]:
        ratio = f"{e['total_ratio']:.2f}" if e["total_ratio"] is not None else "n/a"
        lines.append(f"| {e['model']} | {e['precision']} | {e['estimate_gpu']} {e['estimate_dtype']} | "
                     f"{e['compared']}/{e['layers']} | {_pct(e['median_abs_rel_error'])} | "
                     f"{_ms(e['measured_total_s'])} | {_ms(e['estimated_total_s'])} | {ratio} |")
    failed = [r for r in d["measured"] if r.get("estimate_error")]
    lines += [f"- estimate failed for {r['model']} {r['precision']}: {_cell(r['estimate_error'])}" for r in failed]
    lines += ["", "Per layer: `estimate_error_layers.csv`; these totals: `estimate_error.csv` (same folder)."]
    return lines


def render_extras(p: Part) -> list[str]:
    lines = ["| check | outcome | seconds | numbers |", "|---|---|---:|---|"]
    checks = p.data["checks"]
    for name, c in checks.items():
        lines.append(f"| {_cell(c['what'])} | {c['status']} | {c['seconds']:.0f} | {_cell(c['numbers'])} |")
    two = (checks.get("two_ranks") or {}).get("result")
    if two:
        lines += ["", "Two ranks on one GPU over gloo, per family:", "",
                  "| scheduler | plan family | trains | max diff between ranks | first -> last loss (rank 0) | "
                  "seconds | error |", "|---|---|---|---:|---|---:|---|"]
        for k, v in two.items():
            losses = v.get("losses") or []
            loss = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else ""
            spread = f"{v['rank_spread']:.2g}" if "rank_spread" in v else ""
            lines.append(f"| {k} | {v.get('plan') or ''} | {'yes' if v['trains'] else 'NO'} | {spread} | {loss} | "
                         f"{v['seconds']:.1f} | {_cell(v.get('error') or '')} |")
    return lines


def print_summary(parts: list[Part]) -> None:
    """The parts as a short fixed-width table on stdout."""
    print("\npart        outcome     seconds  numbers")
    for p in parts:
        print(f"{p.key:<11} {p.status:<11} {p.seconds:>7.0f}  {p.numbers[:150]}")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------

def exit_status(parts: list[Part], cuda: bool) -> int:
    """pytest's status of part 1 where not 0; else 1 when another part failed or was cut by its time
    limit; else 0. Without CUDA: 0, unless the collection of the gpu tests itself failed (then 1)."""
    first = next((p for p in parts if p.key == "tests" and "run" in p.data), None)
    status = first.data["run"].status if first is not None else 0
    if not cuda:
        return 0 if status in (0, 5) else 1
    if status not in (0, None):
        return status
    return 1 if any(p.status in ("failed", "timed out") for p in parts) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", default=None,
                    help=f"Markdown report to write (default {_shown(DEFAULT_REPORT)} on a GPU, and "
                         "OUT_DIR/gpu_report.md when --out-dir is given; without CUDA it is written only where "
                         "given)")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help=f"folder for the traces, CSVs and a copy of the report (default "
                         f"{_shown(DEFAULT_OUT_DIR)}; the report copy only when given)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    ap.add_argument("--budget-s", type=float, default=390.0, help="wall-clock seconds for the whole run")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, one string (e.g. '-x -k nccl')")
    ap.add_argument("--models", default=",".join(PROFILE_MODELS), help="models to profile (part 3), comma-separated")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations per profiled trace")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per profiled trace")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-args", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.worker_args)
    selected = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in selected if p not in PARTS]
    if unknown or not selected:
        ap.error(f"--parts: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(PARTS)}")
    budget = Budget(args.budget_s)
    env = environment()
    cuda = env.get("cuda_available") == "True"
    out_dir = args.out_dir if args.out_dir is not None else DEFAULT_OUT_DIR
    pytest_args = args.pytest_args.split()
    amp = "bf16" if env.get("bf16 supported") == "True" else "fp16"
    parts: list[Part] = []
    for key in (k for k in PARTS if k in selected):
        if key != "tests" and not cuda:
            parts.append(Part(key, TITLES[key], "skipped", 0.0, "no GPU (torch.cuda.is_available() is False)"))
            continue
        print(f"[{key}] {TITLES[key]} ...", flush=True)
        t0 = time.perf_counter()
        try:
            if key in ("tests", "sanitizer"):
                part = part_tests(budget, key, pytest_args, cuda)
            elif key == "profiles":
                from repro.workload.catalog import model_info

                out_dir.mkdir(parents=True, exist_ok=True)
                models = [(m.strip(), model_info(m.strip()).paper_batch_size) for m in args.models.split(",")
                          if m.strip()]
                part = part_profiles(budget, out_dir, env.get("device", "gpu"), amp, models, args.warmup,
                                     args.iters)
            else:
                part = part_extras(budget, list(EXTRA_CHECKS))
        except Exception as e:  # noqa: BLE001 - a defect of this script in one part: reported, the rest runs
            traceback.print_exc()
            part = Part(key, TITLES[key], "failed", time.perf_counter() - t0, f"the script failed: {_one_line(e)}")
        parts.append(part)
        print(f"  {part.status}: {part.numbers}", flush=True)
    order = list(TITLES)
    parts.sort(key=lambda p: order.index(p.key))  # the report lists the parts by number
    if not cuda:
        print("no GPU: torch.cuda.is_available() is False; the gpu tests were collected and skipped, the other "
              "parts skipped")
    text = render(env, parts, cuda, args.budget_s)
    targets = []
    if args.report:
        targets.append(Path(args.report))
    elif cuda:
        targets.append(DEFAULT_REPORT)
    if args.out_dir is not None:
        targets.append(args.out_dir / "gpu_report.md")
    for report in targets:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(text)
        print(f"report written to {report}")
    if not targets:
        print(f"{_shown(DEFAULT_REPORT)} left as it is (give a path or --out-dir to write a report anyway)")
    print_summary(parts)
    print(f"total {time.monotonic() - budget.start:.0f} s of a {args.budget_s:.0f} s budget")
    return exit_status(parts, cuda)


if __name__ == "__main__":
    sys.exit(main())
