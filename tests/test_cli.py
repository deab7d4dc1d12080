import json
import subprocess
import sys

import pytest

from repro.cli.main import main
from tests.helpers import make_trace


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "trace.json"
    make_trace([1e-3, 2e-3, 3e-3, 1e-4], [4000, 4_000_000, 400, 40_000]).save(p)
    return p


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("solver", ["wfbp", "syncea", "threshold", "mgwfbp", "optimal"])
def test_plan_then_simulate_round_trip(capsys, tmp_path, trace_file, solver):
    rc, out, err = run(capsys, "plan", "--trace", str(trace_file), "--solver", solver,
                       "--alpha-s", "1e-3", "--beta-s-per-byte", "1e-9")
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["solver"] == solver and plan["iteration_s"] > 0
    assert sorted(n for b in plan["buckets"] for n in b) == ["l0", "l1", "l2", "l3"]
    (tmp_path / "plan.json").write_text(out)
    rc, out, err = run(capsys, "simulate", "--trace", str(trace_file), "--plan", str(tmp_path / "plan.json"),
                       "--alpha-s", "1e-3", "--beta-s-per-byte", "1e-9")
    assert rc == 0, err
    sim = json.loads(out)
    assert sim["iteration_s"] == pytest.approx(plan["iteration_s"])
    assert {op["stream"] for op in sim["ops"]} == {"compute", "comm"}
    assert set(sim["ops"][0]) == {"stream", "kind", "label", "start_s", "end_s"}


def test_alpha_beta_means_a_plus_b_times_bytes(capsys, tmp_path):
    p = tmp_path / "one.json"
    make_trace([0.0], [1000], forward_s=[0.0]).save(p)
    rc, out, _ = run(capsys, "plan", "--trace", str(p), "--solver", "wfbp", "--alpha-s", "0.5",
                     "--beta-s-per-byte", "0.001")
    assert rc == 0 and json.loads(out)["iteration_s"] == pytest.approx(0.5 + 1.0)


def test_network_preset_and_threshold(capsys, trace_file):
    rc, out, err = run(capsys, "plan", "--trace", str(trace_file), "--solver", "threshold",
                       "--threshold-bytes", "1000000", "--network", "10gbe-v100", "--workers", "16")
    assert rc == 0, err
    assert json.loads(out)["threshold_bytes"] == 1000000


@pytest.mark.parametrize("argv, message", [
    (["plan", "--trace", "T", "--solver", "bogus", "--alpha-s", "1", "--beta-s-per-byte", "1"], "invalid choice: 'bogus'"),
    (["plan", "--trace", "T", "--solver", "wfbp"], "give exactly one cost source"),
    (["plan", "--trace", "T", "--solver", "wfbp", "--network", "10gbe-v100"], "needs --workers"),
    (["plan", "--trace", "T", "--solver", "wfbp", "--network", "10gbe-v100", "--workers", "32"], "no fit for P=32"),
    (["plan", "--trace", "T", "--solver", "wfbp", "--network", "nope", "--workers", "4"], "unknown network preset 'nope'"),
    (["plan", "--trace", "T", "--solver", "wfbp", "--alpha-s", "1"], "must be given together"),
    (["plan", "--trace", "T", "--solver", "wfbp", "--alpha-s", "-1", "--beta-s-per-byte", "1"], "flag '--alpha-s' = -1.0 is outside"),
    (["plan", "--trace", "T", "--solver", "wfbp", "--threshold-bytes", "5", "--alpha-s", "1", "--beta-s-per-byte", "1"], "--threshold-bytes does not apply to --solver wfbp"),
    (["plan", "--trace", "missing.json", "--solver", "wfbp", "--alpha-s", "1", "--beta-s-per-byte", "1"], "trace file not found"),
    (["simulate", "--trace", "T", "--plan", "missing.json", "--alpha-s", "1", "--beta-s-per-byte", "1"], "plan file not found"),
    (["bogus"], "invalid choice"),
])
def test_bad_input_gives_one_line_and_exit_2(capsys, trace_file, argv, message):
    argv = [str(trace_file) if a == "T" else a for a in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_malformed_trace_file_is_named(capsys, tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"model": "m", "batch_size": 1, "device": "cpu", "dtype": "float32", "layers": [{"name": "x"}]}))
    rc, _, err = run(capsys, "plan", "--trace", str(p), "--solver", "wfbp", "--alpha-s", "1", "--beta-s-per-byte", "1")
    assert rc == 2 and "'layers[0].params' is missing" in err


def test_plan_with_unknown_layer_is_rejected(capsys, tmp_path, trace_file):
    (tmp_path / "plan.json").write_text(json.dumps({"buckets": [["nope"]]}))
    rc, _, err = run(capsys, "simulate", "--trace", str(trace_file), "--plan", str(tmp_path / "plan.json"),
                     "--alpha-s", "1", "--beta-s-per-byte", "1")
    assert rc == 2 and "'nope' is not in trace" in err


def test_module_entry_point_and_console_script(trace_file):
    r = subprocess.run([sys.executable, "-m", "repro", "plan", "--trace", str(trace_file), "--solver",
                        "optimal", "--network", "56gbib-derived", "--workers", "64"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["solver"] == "optimal"
    r = subprocess.run([sys.executable, "-m", "repro", "plan"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_profile_measures_and_estimates(capsys, tmp_path):
    out = tmp_path / "t.json"
    rc, stdout, err = run(capsys, "profile", "--model", "tiny_vgg", "--batch-size", "4", "--warmup", "1",
                          "--iters", "2", "-o", str(out))
    assert rc == 0, err
    from repro.core.trace import Trace

    t = Trace.load(out)
    assert t.model == "tiny_vgg" and t.device == "cpu" and t.total_backward_s > 0
    assert json.loads(stdout)["layers"] == t.num_layers
    assert t.extra["precision"] == "float32"
    rc, _, err = run(capsys, "profile", "--model", "tiny_vgg", "--batch-size", "4", "--warmup", "0",
                     "--iters", "1", "--autocast", "bfloat16", "-o", str(out))
    assert rc == 0, err
    t = Trace.load(out)
    assert t.extra["precision"] == "autocast-bfloat16" and t.dtype == "float32"
    rc, _, err = run(capsys, "profile", "--model", "tiny_vgg", "--batch-size", "4", "--estimate-gpu", "V100",
                     "-o", str(out))
    assert rc == 0, err
    t = Trace.load(out)
    assert t.is_estimate and "estimate" in t.device


@pytest.mark.parametrize("argv, message", [
    (["--model", "resnet5", "--batch-size", "4"], "unknown model 'resnet5'"),
    (["--model", "tiny_vgg", "--batch-size", "0"], "--batch-size must be positive"),
    (["--model", "tiny_vgg", "--batch-size", "4", "--estimate-gpu", "GTX480"], "GTX480"),
    (["--model", "tiny_vgg", "--batch-size", "4", "--estimate-gpu", "V100", "--autocast", "bfloat16"],
     "--autocast is for measuring"),
])
def test_profile_bad_input(capsys, tmp_path, argv, message):
    rc, _, err = run(capsys, "profile", *argv, "-o", str(tmp_path / "t.json"))
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.distributed
def test_launch_and_calibrate_on_local_ranks(tmp_path):
    r = subprocess.run([sys.executable, "-m", "repro", "launch", "--nproc", "2", "--", "--model", "tiny_vgg",
                        "--scheduler", "optimal", "--steps", "2", "--warmup-steps", "1", "--batch-size", "4"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["scheduler"] == "optimal"
    out = tmp_path / "cost.json"
    r = subprocess.run([sys.executable, "-m", "repro", "calibrate", "--nproc", "2", "--collectives",
                        "allreduce,allgather", "--max-bytes", "262144", "--sizes", "3", "--repeats", "1",
                        "-o", str(out)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    from repro.core.cost import CostModel

    cost = CostModel.from_dict(json.loads(out.read_text()))
    assert cost.workers == 2 and set(cost.lines) == {"allreduce", "allgather"}


@pytest.mark.parametrize("argv, message", [
    (["launch", "--nproc", "2", "--", "--scheduler", "nope"], "unknown scheduler 'nope'"),
    (["calibrate", "--nproc", "2", "--collectives", "broadcast"], "unknown collective"),
    (["calibrate", "--nproc", "1"], "needs --nproc 2"),
    (["launch", "--nproc", "2", "--emulate-bandwidth", "fast", "--", "--model", "tiny_vgg"], "bandwidth"),
])
def test_local_launch_bad_input(capsys, argv, message):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------------
# launch / calibrate: what the train arguments ask of the launcher, and bounds checked before any rank
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def no_ranks(monkeypatch):
    """Starting ranks is an error: these inputs must be refused before any rank starts."""
    from repro.launch import local

    def refuse(*args, **kwargs):
        raise AssertionError("ranks would have been started")

    monkeypatch.setattr(local, "_launch", refuse)
    return monkeypatch


def test_launch_passes_the_train_backend_and_pg_timeout_to_the_launcher(capsys, monkeypatch):
    from repro.launch import local
    from repro.train import config_from_argv

    seen = {}

    def fake_launch_local(fn, world_size, **kwargs):
        seen.clear()
        seen.update(kwargs, world_size=world_size)
        return [{"scheduler": "optimal", "epochs": []}] * world_size

    monkeypatch.setattr(local, "launch_local", fake_launch_local)
    rc, out, err = run(capsys, "launch", "--nproc", "2", "--timeout-s", "30", "--", "--model", "tiny_vgg",
                       "--pg-timeout-s", "10", "--backend", "gloo")
    assert rc == 0, err
    assert json.loads(out) == {"scheduler": "optimal"}
    assert (seen["world_size"], seen["backend"], seen["pg_timeout_s"], seen["timeout_s"]) == (2, "gloo", 10.0, 30.0)
    rc, _, err = run(capsys, "launch", "--nproc", "2", "--", "--model", "tiny_vgg")
    assert rc == 0, err
    assert seen["backend"] == "gloo"  # the launcher's default: one CPU process per rank
    assert seen["pg_timeout_s"] == config_from_argv(["--model", "tiny_vgg"])[1].pg_timeout_s


def test_launch_with_nccl_without_cuda_fails_before_any_rank_starts(capsys, no_ranks):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only error")
    rc, _, err = run(capsys, "launch", "--nproc", "2", "--", "--model", "tiny_vgg", "--backend", "nccl")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "nccl" in err and "CUDA" in err


@pytest.mark.parametrize("argv, message", [
    (["launch", "--nproc", "2", "--timeout-s", "inf", "--", "--model", "tiny_vgg"],
     "--timeout-s must be a finite positive number of seconds, got inf"),
    (["launch", "--nproc", "2", "--timeout-s", "nan", "--", "--model", "tiny_vgg"], "--timeout-s must be a finite"),
    (["launch", "--nproc", "2", "--timeout-s", "0", "--", "--model", "tiny_vgg"], "--timeout-s must be a finite"),
    (["launch", "--nproc", "2", "--", "--model", "tiny_vgg", "--pg-timeout-s", "inf"],
     "--pg-timeout-s must be a finite positive number of seconds, got inf"),
    (["calibrate", "--nproc", "2", "--timeout-s", "inf"], "--timeout-s must be a finite"),
    (["launch", "--nproc", "1000000000", "--", "--model", "tiny_vgg"], "at most"),
    (["calibrate", "--nproc", "1000000000"], "at most"),
    pytest.param(["calibrate", "--nproc", "2", "--sizes", "1000000000"], "--sizes must be between 2 and 64",
                 id="huge_sizes"),
    (["calibrate", "--nproc", "2", "--sizes", "1"], "--sizes must be between 2 and 64"),
    (["calibrate", "--nproc", "2", "--repeats", "0"], "--repeats must be between 1 and 1000"),
    (["calibrate", "--nproc", "2", "--repeats", "1000000000"], "--repeats must be between 1 and 1000"),
    (["calibrate", "--nproc", "2", "--min-bytes", "0"], "--min-bytes must be at least 4"),
    (["calibrate", "--nproc", "2", "--max-bytes", "-1"], "--max-bytes must be"),
    (["calibrate", "--nproc", "2", "--min-bytes", "8192", "--max-bytes", "4096"],
     "--min-bytes (8192) must not exceed --max-bytes (4096)"),
    (["calibrate", "--nproc", "2", "--min-bytes", "4096", "--max-bytes", "8192"],
     "--max-bytes (8192) must be at least 4 x --min-bytes"),
    (["calibrate", "--nproc", "2", "--max-bytes", str(10**15)], "more memory than is available"),
    (["calibrate", "--nproc", "8", "--collectives", "allreduce,sparse_allgather", "--max-bytes", str(2**34)],
     "sparse_allgather"),
])
def test_launch_and_calibrate_bounds_are_checked_before_any_rank_starts(capsys, no_ranks, argv, message):
    rc, _, err = run(capsys, *argv)
    assert rc == 2, err
    assert message in err and len(err.strip().splitlines()) == 1


def test_nproc_bound_states_the_limit_of_this_machine(capsys, no_ranks):
    import re

    from repro.launch.local import max_local_ranks

    limit, _ = max_local_ranks()
    rc, _, err = run(capsys, "calibrate", "--nproc", str(10 * limit + 100))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert re.search(r"at most \d+ ranks \(.* GiB available memory / about \d+ MiB per rank", err), err


@pytest.mark.slow
def test_launch_refuses_bad_runs_before_ranks_start(tmp_path):
    import subprocess as _sp
    import sys as _sys

    base = [_sys.executable, "-m", "repro", "launch", "--nproc", "1", "--"]
    r = _sp.run(base + ["--model", "tiny_vgg", "--scheduler", "optimal", "--steps", "1"], capture_output=True,
                text=True)
    assert r.returncode == 2 and "at least 2 ranks" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "taken").mkdir()
    r = _sp.run(base + ["--model", "tiny_vgg", "--scheduler", "syncea", "--steps", "1"], capture_output=True,
                text=True)  # a plan scheduler on one rank: it would fail inside the rank on a P=1 cost model
    assert r.returncode == 2 and "at least 2 ranks" in r.stderr and "--scheduler local" in r.stderr
    r = _sp.run(base + ["--model", "tiny_vgg", "--scheduler", "local", "--steps", "1", "--results-dir",
                        str(tmp_path), "--run-id", "taken"], capture_output=True, text=True)
    assert r.returncode == 2 and "already exists" in r.stderr
    r = _sp.run(base + ["--model", "tiny_vgg", "--run-id", "../../x"], capture_output=True, text=True)
    assert r.returncode == 2 and "is not allowed" in r.stderr


@pytest.mark.parametrize("solver", ["topk_layerwise", "topk_single", "omgs", "omgs_optimal"])
def test_sparse_plan_then_simulate_round_trip(capsys, tmp_path, trace_file, solver):
    rc, out, err = run(capsys, "plan", "--trace", str(trace_file), "--solver", solver, "--density", "0.01",
                       "--network", "1gbe-allgather", "--workers", "4", "-o", str(tmp_path / "plan.json"))
    assert rc == 0, err
    plan = json.loads((tmp_path / "plan.json").read_text())
    scope = {}  # every sparse planner keeps the paper's per-bucket rule (the default, left out of the plan)
    assert plan["family"] == "sparse" and plan["options"] == {"density": 0.01, **scope}
    rc, out, err = run(capsys, "plan", "--trace", str(trace_file), "--solver", solver, "--density", "0.01",
                       "--topk-scope", "bucket", "--network", "1gbe-allgather", "--workers", "4")
    assert rc == 0, err
    assert json.loads(out)["options"] == {"density": 0.01}  # the paper's per-bucket rule, the family's default
    assert all(len(b["messages"]) == 2 for b in plan["buckets"])  # values and indices
    rc, out, err = run(capsys, "simulate", "--trace", str(trace_file), "--plan", str(tmp_path / "plan.json"),
                       "--network", "1gbe-allgather", "--workers", "4")
    assert rc == 0, err
    sim = json.loads(out)
    assert sim["iteration_s"] == pytest.approx(plan["iteration_s"]) and sim["sparsify_s"] > 0
    assert {op["kind"] for op in sim["ops"]} >= {"sparsify", "sparse_allgather"}


@pytest.mark.parametrize("argv, message", [
    (["--solver", "mgwfbp", "--density", "0.1", "--network", "10gbe-v100"], "--density does not apply to --solver mgwfbp"),
    (["--solver", "omgs", "--threshold-bytes", "5", "--network", "1gbe-allgather"], "--threshold-bytes does not apply"),
    (["--solver", "omgs", "--density", "2", "--network", "1gbe-allgather"], "density must be a number in"),
    (["--solver", "omgs", "--network", "10gbe-v100"], "has no sparse_allgather line"),
])
def test_sparse_plan_bad_input_is_one_line(capsys, trace_file, argv, message):
    rc, out, err = run(capsys, "plan", "--trace", str(trace_file), *argv, "--workers", "16")
    assert rc == 2 and out == ""
    assert err.startswith("repro: error:") and message in err and err.count("\n") == 1, err
