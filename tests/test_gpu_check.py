"""scripts/gpu_check.py on a CPU: its parsers, time limits, report and exit status, and the parts that can
run without a GPU (part 3's pipeline on tiny_resnet, part 4's bodies on gloo). The GPU run itself is
the script's job (docs/gpu_report.md)."""

from __future__ import annotations

import csv
import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from repro.core.trace import Trace

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # its dataclasses look their module up while being made
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("gpu_check", None)


# ---- parsers ----

def test_parse_verbose_reads_the_tests_that_ran_before_a_cut(gc):
    output = "\n".join([
        "============ test session starts ============",
        "tests/test_gpu.py::test_executor_on_nccl_equals_local_sgd[allreduce] PASSED     [  4%]",
        "tests/test_gpu.py::test_executor_on_nccl_equals_local_sgd[sparse] FAILED        [  8%]",
        "tests/test_gallery.py::test_gallery SKIPPED (could not import 'nbformat')   [ 12%]",
        "tests/test_gpu.py::test_gradient_ready_times_are_the_devices ",  # cut while it ran
    ])
    rows = gc.parse_verbose(output)
    assert [(r["test"].split("::")[1], r["outcome"]) for r in rows] == [
        ("test_executor_on_nccl_equals_local_sgd[allreduce]", "passed"),
        ("test_executor_on_nccl_equals_local_sgd[sparse]", "failed"), ("test_gallery", "skipped")]
    assert gc.count_text(rows) == "1 passed, 1 failed, 1 skipped"
    assert gc.verdict(None, rows, cuda=True, timed_out=True, limit_s=120) == \
        "CUT after 120 s (its time limit): 1 passed, 1 failed, 1 skipped before the cut"


def _race(data_ptr: int, op: str, previous: str, frame: str) -> str:
    """One race as torch.cuda._sanitizer prints it (UnsynchronizedAccessError.__str__)."""
    return (f"============================\nCSAN detected a possible data race on tensor with data pointer {data_ptr}\n"
            f"Access by stream 7 during kernel:\n{op}(Tensor self) -> Tensor\nwriting to argument(s) self\n"
            f"With stack trace:\n  File \"/x/site-packages/torch/a.py\", line 3, in f\n"
            f"  File \"/w/{frame}\", line 412, in hook\n    x.add_(y)\n\n"
            f"Previous access by stream 0 during kernel:\n{previous}(Tensor self) -> Tensor\n"
            "reading from argument(s) self\n"
            f"With stack trace:\n  File \"/w/repro/runtime/other.py\", line 9, in g\n\n"
            "Tensor was allocated with stack trace:\n  File \"/w/repro/z.py\", line 1, in h\n")


def test_csan_races_are_one_line_each_and_distinct(gc):
    text = ("E   torch.cuda._sanitizer.CUDASanitizerErrors: detected 3 errors\n----- Captured stderr call -----\n"
            + _race(1, "aten::add_.Tensor", "aten::mul.Tensor", "repro/families/dear/executor.py")
            + _race(2, "aten::add_.Tensor", "aten::mul.Tensor", "repro/families/dear/executor.py")  # the same race again
            + _race(3, "aten::copy_", "aten::sum", "tests/test_gpu.py"))
    assert gc.csan_races(text) == [
        "aten::add_.Tensor (stream 7) after aten::mul.Tensor (stream 0) at families/dear/executor.py:412",
        "aten::copy_ (stream 7) after aten::sum (stream 0) at test_gpu.py:412"]
    assert gc.csan_races("24 passed in 44s") == []


@pytest.mark.parametrize("name, tag, gpu, noted", [
    ("NVIDIA H200", "h200", "H200", None),  # the estimator has an H200 entry now
    ("NVIDIA H100 80GB HBM3", "h100", "H100", None),
    ("Tesla V100-SXM2-32GB", "v100", "V100", None),
    ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090", "H100", "GeForce RTX 4090"),
])
def test_device_tag_and_the_estimators_gpu(gc, name, tag, gpu, noted):
    assert gc.device_tag(name) == tag
    chosen, note = gc.estimator_gpu(name)
    assert chosen == gpu
    assert (note == "") if noted is None else (noted in note and "H100" in note)
    assert gc.trace_file_name("resnet50", 32, tag, "fp32") == f"resnet50_b32_{tag}-fp32.json"


# ---- time limits ----

def test_a_subprocess_past_its_limit_is_killed_with_what_it_started(gc):
    child = ("import subprocess, sys, time\n"
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
             "print('grandchild', p.pid, flush=True)\n"
             "time.sleep(120)\n")
    t0 = time.monotonic()
    run = gc.run_bounded([sys.executable, "-c", child], timeout_s=3)
    assert run.timed_out and run.returncode is None and time.monotonic() - t0 < 20
    pid = int(run.output.split("grandchild")[1].split()[0])  # the output before the kill is kept
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the grandchild outlived the time-out")
    done = gc.run_bounded([sys.executable, "-c", "print('ok')"], timeout_s=60)
    assert (done.timed_out, done.returncode, done.output.strip()) == (False, 0, "ok")


def test_budget_gives_a_part_its_limit_or_what_is_left(gc):
    budget = gc.Budget(100.0)
    assert budget.limit(30.0) == 30.0 and 99.0 < budget.limit(1000.0) <= 100.0
    budget.start -= 95.0  # 95 s have passed
    assert budget.limit(30.0) <= 5.0 and gc.Budget(0.0).limit(30.0) == 0.0


# ---- the report and the exit status ----

def _parts(gc, tests_status=0, extras_status="passed"):
    rows = [{"test": "tests.test_gpu::test_a", "outcome": "passed", "time_s": "0.50", "detail": ""},
            {"test": "tests.test_gpu::test_b", "outcome": "failed" if tests_status else "passed", "time_s": "1.00",
             "detail": "AssertionError: 0.1 < 1e-5"}]
    tests = gc.Part("tests", "1. gpu tests (pytest -m gpu)", "passed" if tests_status == 0 else "failed", 44.0,
                    "n", {"run": gc.TestRun(tests_status, rows, "2 passed in 44s", False, 44.0),
                          "verdict": gc.verdict(tests_status, rows, True)})
    sanitizer = gc.Part("sanitizer", "2. gpu tests under TORCH_CUDA_SANITIZER=1", "failed", 130.0, "1 race",
                        {"run": gc.TestRun(1, rows[:1] + [{**rows[1], "outcome": "failed",
                                                           "detail": "CUDASanitizerErrors: detected 1 errors"}],
                                           "", False, 130.0),
                         "races": ["aten::add_ (stream 7) after aten::mul (stream 0) at runtime/dear.py:412"]})
    profiles = gc.Part("profiles", "3. Measured traces and the estimator's error", "passed", 90.0, "10/10", {
        "measured": [{"model": "resnet50", "batch": 32, "precision": "bf16", "status": "measured", "seconds": 4.2,
                      "file": "resnet50_b32_h200-bf16.json", "layers": 107, "forward_s": 0.0101, "backward_s": 0.0202},
                     {"model": "vgg16", "batch": 32, "precision": "fp32", "status": "timed out", "seconds": None,
                      "error": "no result within 60 s"}],
        "errors": [{"model": "resnet50", "batch": 32, "precision": "bf16", "estimate_gpu": "H100",
                    "estimate_dtype": "float16", "layers": 107, "compared": 107, "median_abs_rel_error": 0.4321,
                    "measured_total_s": 0.0303, "estimated_total_s": 0.0152, "total_ratio": 0.5016}],
        "gpu": "H100", "gpu_note": "the estimator has no NVIDIA H200", "warmup": 2, "iters": 5, "out_dir": "DIR"})
    extras = gc.Part("extras", "4. Extra checks", extras_status, 60.0, "x", {"checks": {
        "two_ranks": {"what": "(b) two gloo ranks", "status": extras_status, "seconds": 50.0, "numbers": "4/5 train",
                      "result": {"ps_bsp": {"trains": False, "error": "RankFailedError: rank 1 of 2 failed: boom",
                                            "seconds": 3.0},
                                 "mgwfbp": {"trains": True, "rank_spread": 0.0, "losses": [1.2, 1.07],
                                            "plan": "allreduce", "seconds": 9.0, "error": None}}}}})
    return [tests, sanitizer, profiles, extras]


def test_the_report_lists_every_part_with_its_numbers(gc):
    text = gc.render({"device": "NVIDIA H200"}, _parts(gc), True, 390)
    assert "**Result:** all gpu tests passed: 2 passed" in text
    for title in ("1. gpu tests", "2. gpu tests under TORCH_CUDA_SANITIZER=1", "3. Measured traces", "4. Extra checks"):
        assert f"## {title}" in text and f"| {title}" in text  # a section and a row of the summary table
    assert "CUDASanitizerErrors: detected 1 errors" in text and "runtime/dear.py:412" in text
    assert "| resnet50 | 32 | bf16 | measured | resnet50_b32_h200-bf16.json | 107 | 10.1 | 20.2 | 4.2 |" in text
    assert "| vgg16 | 32 | fp32 | timed out | no result within 60 s |" in text
    assert "| resnet50 | bf16 | H100 float16 | 107/107 | 43% | 30.3 | 15.2 | 0.50 |" in text
    assert "Note: the estimator has no NVIDIA H200." in text
    assert "| ps_bsp |  | NO |  |  | 3.0 | RankFailedError: rank 1 of 2 failed: boom |" in text
    assert "| mgwfbp | allreduce | yes | 0 | 1.200 -> 1.070 | 9.0 |  |" in text


def test_exit_status(gc):
    assert gc.exit_status(_parts(gc)[:1] + _parts(gc)[2:], cuda=True) == 0
    assert gc.exit_status(_parts(gc), cuda=True) == 1  # the sanitizer part failed
    assert gc.exit_status(_parts(gc, tests_status=1), cuda=True) == 1
    parts = _parts(gc, extras_status="timed out")
    assert gc.exit_status([parts[0], parts[3]], cuda=True) == 1
    assert gc.exit_status(_parts(gc, tests_status=2), cuda=True) == 2  # pytest's own status first
    assert gc.exit_status(_parts(gc), cuda=False) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_without_cuda_it_exits_0_and_leaves_the_committed_report_alone(gc, tmp_path, capsys):
    committed = gc.DEFAULT_REPORT.read_bytes()
    t0 = time.monotonic()
    assert gc.main(["--out-dir", str(tmp_path), "--parts", "profiles,extras,sanitizer"]) == 0
    assert time.monotonic() - t0 < 30
    assert gc.DEFAULT_REPORT.read_bytes() == committed
    report = (tmp_path / "gpu_report.md").read_text()
    assert report.count("| skipped | 0 | no GPU (torch.cuda.is_available() is False) |") == 3
    out = capsys.readouterr().out
    assert "no GPU" in out and "extras      skipped" in out
    assert not list(tmp_path.glob("*.json"))


# ---- the parts that run on a CPU ----

@pytest.mark.slow
def test_part_3_on_a_cpu_writes_traces_and_the_error_tables_and_reports_a_failure(gc, tmp_path):
    part = gc.part_profiles(gc.Budget(300), tmp_path, "NVIDIA H200", "bf16", [("nope", 2), ("tiny_resnet", 4)],
                            warmup=0, iters=1, device="cpu")
    assert part.status == "failed"  # the unknown model; the next one was still measured
    assert [r["status"] for r in part.data["measured"]] == ["failed", "failed", "measured", "measured"]
    assert "unknown model 'nope'" in part.data["measured"][0]["error"]
    fp32, bf16 = (Trace.load(tmp_path / f"tiny_resnet_b4_h200-{p}.json") for p in ("fp32", "bf16"))
    assert (fp32.extra["precision"], bf16.extra["precision"]) == ("float32", "autocast-bfloat16")
    assert fp32.names and set(fp32.names) == set(bf16.names) and fp32.extra["view"] == "module"
    with open(tmp_path / "estimate_error.csv") as f:
        summary = list(csv.DictReader(f))
    assert [(r["precision"], r["estimate_gpu"], r["estimate_dtype"]) for r in summary] == [
        ("fp32", "H200", "float32"), ("bf16", "H200", "bfloat16")]
    assert all(int(r["compared"]) == fp32.num_layers and float(r["total_ratio"]) > 0 for r in summary)
    with open(tmp_path / "estimate_error_layers.csv") as f:
        layers = list(csv.DictReader(f))
    assert len(layers) == 2 * fp32.num_layers and {r["layer"] for r in layers} == set(fp32.names)
    assert part.data["gpu_note"] == "" and "2/4 traces measured" in part.numbers  # the estimator has an H200


@pytest.mark.distributed
def test_the_sparse_timeline_check_runs_in_a_worker_on_gloo(gc):
    run = gc.run_worker("sparse_timeline", {"device": "cpu", "backend": "gloo"}, timeout_s=120)
    assert run.status == "passed", run.output[-2000:]
    ok, numbers = gc.judge_extra("sparse_timeline", run.result)
    assert ok and set(run.result) == {"topk_single", "omgs"}, numbers
    assert [len(v["rows"]) for v in run.result.values()] == [1, 2]


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_report_a_failing_family_and_go_on(gc):
    from tests.gpu_targets import two_ranks_per_family

    out = two_ranks_per_family("cpu", schedulers=("no_such_scheduler", "mgwfbp"), timeout_s=60)
    assert out["no_such_scheduler"]["trains"] is False
    assert "unknown scheduler" in out["no_such_scheduler"]["error"].lower(), out["no_such_scheduler"]
    assert out["mgwfbp"]["trains"] and out["mgwfbp"]["plan"] == "allreduce", out["mgwfbp"]
    ok, numbers = gc.judge_extra("two_ranks", out)
    assert not ok and numbers.startswith("1/2 families train; no_such_scheduler: FAILS; mgwfbp: trains")
    late = two_ranks_per_family("cpu", schedulers=("mgwfbp",), budget_s=1.0)
    assert late["mgwfbp"]["error"] == "not run: out of time"


def test_on_a_gpu_every_part_runs_in_order_a_crash_in_one_is_reported_and_both_reports_are_written(
        gc, tmp_path, monkeypatch, capsys):
    ran = []

    def fake_tests(budget, key, pytest_args, cuda):
        ran.append(key)
        rows = [{"test": "t::a", "outcome": "passed", "time_s": "1.00", "detail": ""}]
        return gc.Part(key, gc.TITLES[key], "passed", 1.0, "1 passed",
                       {"run": gc.TestRun(0, rows, "1 passed", False, 1.0), "verdict": gc.verdict(0, rows, True)})

    def crashing_profiles(budget, out_dir, device_name, amp, models, warmup, iters):
        ran.append("profiles")
        assert (device_name, amp, models[0], warmup, iters) == ("NVIDIA H200", "bf16", ("resnet50", 32), 2, 5)
        raise KeyError("a defect")

    def fake_extras(budget, names):
        ran.append("extras")
        return gc.Part("extras", gc.TITLES["extras"], "passed", 2.0, "3 passed", {"checks": {}})

    monkeypatch.setattr(gc, "environment", lambda: {"cuda_available": "True", "device": "NVIDIA H200",
                                                    "bf16 supported": "True"})
    monkeypatch.setattr(gc, "part_tests", fake_tests)
    monkeypatch.setattr(gc, "part_profiles", crashing_profiles)
    monkeypatch.setattr(gc, "part_extras", fake_extras)
    monkeypatch.setattr(gc, "DEFAULT_REPORT", tmp_path / "docs" / "gpu_report.md")
    out = tmp_path / "out"
    assert gc.main(["--out-dir", str(out)]) == 1  # the crashed part fails the run
    assert ran == ["tests", "profiles", "extras", "sanitizer"]
    default, copy = (tmp_path / "docs" / "gpu_report.md").read_text(), (out / "gpu_report.md").read_text()
    assert default == copy
    assert "| 3. Measured traces and the estimator's error | failed | 0 | the script failed: KeyError: 'a defect' |" \
        in default
    titles = [line.split(" | ")[0] for line in default.splitlines() if line.startswith("| 1.") or
              line.startswith("| 2.") or line.startswith("| 3.") or line.startswith("| 4.")]
    assert titles == ["| 1. gpu tests (pytest -m gpu)", "| 2. gpu tests under TORCH_CUDA_SANITIZER=1",
                      "| 3. Measured traces and the estimator's error", "| 4. Extra checks"]
    stdout = capsys.readouterr().out
    assert "profiles    failed" in stdout and "extras      passed" in stdout
