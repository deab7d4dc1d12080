"""Bad numbers and unused flags of `repro train`/`launch`/`profile`/`calibrate`: refused in one line naming the
flag, its value and the range (or the schedulers that take it), before any rank starts; exit status 2."""

import dataclasses
import json
import math
import os
import re

import pytest
import torch

from repro.core import ranges
from repro.cli.main import main
from repro.launch.netns import MAX_EMULATED_BPS, parse_bandwidth
from repro.core.run_options import RUN_OPTIONS, option_takers
from repro.training.config import FIELD_RANGES, TrainConfig, config_from_argv

TRACE = os.path.join(os.path.dirname(__file__), "..", "data", "traces", "tiny_resnet_b32_cpu.json")


def _refused(capsys, argv, *needles):
    """``repro ARGV`` exits 2 with one line holding every needle."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture
def plan(tmp_path, capsys):
    """A tiny_resnet mgwfbp plan for 2 workers (the issue's recipe)."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--trace", TRACE, "--solver", "mgwfbp", "--network", "10gbe-derived", "--workers", "2",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    return out


def _numeric_fields():
    out = []
    for f in dataclasses.fields(TrainConfig):
        option = RUN_OPTIONS.get(f.name)
        kind = option.kind if option is not None else f.metadata.get("kind")
        numeric = kind in (int, float) if kind is not None else re.search(r"\b(int|float)\b", str(f.type))
        if numeric and "bool" not in str(f.type):
            out.append(f.name)
    return out


def test_every_numeric_train_field_declares_an_upper_bound():
    names = _numeric_fields()
    assert {"batch_size", "steps", "lr", "momentum", "threshold_bytes", "density", "num_workers"} <= set(names)
    unbounded = [n for n in names if n not in FIELD_RANGES
                 and (n not in RUN_OPTIONS or RUN_OPTIONS[n].quantity is None)]
    assert not unbounded, f"numeric TrainConfig fields without a plausible range: {unbounded}"


@pytest.mark.parametrize("name", _numeric_fields())
def test_every_numeric_train_field_refuses_an_absurd_value(name):
    option = RUN_OPTIONS.get(name)
    kind = option.kind if option is not None else (float if name in ("lr", "momentum", "weight_decay",
                                                                      "checkpoint_every_min",
                                                                      "emulated_bandwidth_bps") else int)
    kw = {name: 1e30 if kind is float else 10 ** 30}
    if option is not None:
        kw["scheduler"] = option_takers(name)[0]
    if name == "epochs":
        kw["dataset"] = "digits"
    if name == "checkpoint_stop_at_step":
        kw.update(results_dir="/nonexistent", run_id="r")
    with pytest.raises(ValueError) as e:
        TrainConfig(**kw)
    text = str(e.value)
    assert name in text or "--" + name.replace("_", "-") in text, text


@pytest.mark.parametrize("argv, needles", [
    (["--batch-size", "1000000000000"], ["--batch-size", "1000000000000", "[1, 2**24]"]),
    (["--lr", "1e300"], ["--lr", "1e+300", "[0, 1e3]"]),
    (["--momentum", "5"], ["--momentum", "5.0", "[0, 1]"]),
    (["--weight-decay", "1e9"], ["--weight-decay"]),
    (["--steps", "100000000000000"], ["--steps", "[0, 1e9]"]),
    (["--warmup-steps", "100000000000"], ["--warmup-steps", "[0, 1e9]"]),
    (["--num-workers", "100000"], ["--num-workers", "100000", "[0, 256]"]),
    (["--model", "tiny_bert", "--seq-len", "100000000"], ["--seq-len", "100000000", "2**20"]),
    (["--fit-repeats", "100000"], ["--fit-repeats", "[1, 1000]"]),
    (["--scheduler", "threshold", "--threshold-bytes", str(10 ** 20)], ["--threshold-bytes", "2**50"]),
    (["--pg-timeout-s", "1e300"], ["--pg-timeout-s", "1e6"]),
    (["--warmup-steps", "-1"], ["warmup_steps (--warmup-steps) must be >= 0, got -1"]),
    (["--compute-steps", "-2"], ["compute_steps (--compute-steps) must be >= 0, got -2"]),
])
def test_train_numbers_out_of_range_are_refused_naming_the_flag(argv, needles):
    with pytest.raises(ValueError) as e:
        config_from_argv(argv)
    assert len(str(e.value).splitlines()) == 1
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


@pytest.mark.parametrize("argv, flag, takers", [
    (["--threshold-bytes", "1000"], "--threshold-bytes", "threshold"),
    (["--density", "0.5"], "--density", "omgs"),
    (["--tuner-trials", "5"], "--tuner-trials", "dear_bo"),
    (["--server-placement", "colocated"], "--server-placement", "ps_bsp"),
    (["--server-placement", "dedicated"], "--server-placement", "ps_bsp"),  # given, even as the default
])
def test_given_flags_the_scheduler_does_not_use_are_refused(argv, flag, takers):
    with pytest.raises(ValueError, match=re.escape(f"{flag} does not apply to --scheduler mgwfbp")) as e:
        config_from_argv(["--scheduler", "mgwfbp", *argv])
    assert takers in str(e.value)


def test_flags_the_scheduler_uses_and_defaults_still_pass():
    cfg, _ = config_from_argv(["--scheduler", "threshold", "--threshold-bytes", "1000"])
    assert cfg.threshold_bytes == 1000
    cfg, _ = config_from_argv(["--scheduler", "mgwfbp"])  # defaults of options it does not take: fine
    assert cfg.density == RUN_OPTIONS["density"].default


def test_plan_disagreeing_scheduler_and_fit_repeats_are_refused(plan):
    with pytest.raises(ValueError, match="--scheduler omgs disagrees with --plan .*'mgwfbp' runs"):
        config_from_argv(["--scheduler", "omgs", "--plan", str(plan)])
    with pytest.raises(ValueError, match="--fit-repeats does not apply with --plan"):
        config_from_argv(["--fit-repeats", "3", "--plan", str(plan)])
    cfg, _ = config_from_argv(["--scheduler", "mgwfbp", "--plan", str(plan)])
    assert cfg.scheduler == "mgwfbp"
    with pytest.raises(ValueError, match="--fit-repeats does not apply to --scheduler ddp"):
        config_from_argv(["--scheduler", "ddp", "--fit-repeats", "3"])


def test_plan_view_field_is_checked_and_errors_name_the_path_once(plan, tmp_path):
    d = json.loads(plan.read_text())
    d["provenance"]["view"] = "pixel"
    bad = tmp_path / "pixel.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"'provenance.view' is 'pixel', not one of tensor, module"):
        config_from_argv(["--plan", str(bad)])
    d = json.loads(plan.read_text())
    d["buckets"][0] = [5]
    bad.write_text(json.dumps(d))
    with pytest.raises(ValueError) as e:
        config_from_argv(["--plan", str(bad)])
    assert str(e.value).count(str(bad)) == 1, str(e.value)
    with pytest.raises(ValueError) as e:
        config_from_argv(["--plan", str(tmp_path / "none.json")])
    assert str(e.value) == f"--plan {tmp_path / 'none.json'}: no such file"


def test_launch_refuses_a_plan_of_another_model_before_any_rank(plan, capsys):
    _refused(capsys, ["launch", "--nproc", "2", "--", "--model", "tiny_vgg", "--plan", str(plan), "--steps", "2",
                      "--batch-size", "4"], f"--plan {plan} names 19 layer(s) that --model tiny_vgg does not have",
             "planned for 'tiny_resnet'")


def test_launch_refuses_a_plan_that_leaves_a_layer_out_or_was_made_for_another_p(plan, capsys, tmp_path):
    """Both were refused only inside the ranks ("rank 0 of 2 failed: PlanError ..."): now before any starts."""
    import json

    data = json.loads(plan.read_text())
    partial, other_p = dict(data, buckets=data["buckets"][1:]), json.loads(plan.read_text())
    other_p["provenance"]["workers"] = 3
    for name, content in (("partial.json", partial), ("p3.json", other_p)):
        (tmp_path / name).write_text(json.dumps(content))
    argv = ["launch", "--nproc", "2", "--", "--model", "tiny_resnet", "--steps", "2", "--batch-size", "4", "--plan"]
    _refused(capsys, argv + [str(tmp_path / "partial.json")], "leaves 1 layer(s) of --model tiny_resnet out")
    _refused(capsys, argv + [str(tmp_path / "p3.json")], "made for 3 workers (provenance.workers)", "this job has 2")


@pytest.mark.parametrize("argv, needles", [
    (["launch", "--nproc", "2", "--emulate-bandwidth", "1e30gbit", "--", "--steps", "2"],
     ["--emulate-bandwidth", "1e30gbit", "[8, 1e15]"]),
    (["calibrate", "--nproc", "2", "--emulate-bandwidth", "1e40bit"], ["--emulate-bandwidth", "1e40bit", "[8, 1e15]"]),
    (["calibrate", "--nproc", "2", "--emulate-bandwidth", "100tbit"], ["--emulate-bandwidth", "tc can shape"]),
    (["calibrate", "--nproc", "2", "--collectives", ""], ["no collective given", "allreduce"]),
    (["launch", "--nproc", "2", "--", "--batch-size", "1000000000000"], ["--batch-size", "[1, 2**24]"]),
    (["launch", "--nproc", "2", "--", "--lr", "1e300"], ["--lr", "[0, 1e3]"]),
    (["launch", "--nproc", "2", "--", "--model", "tiny_bert", "--seq-len", "100000"],
     ["--seq-len 100000", "GiB per step", "available"]),
    (["launch", "--nproc", "1000000", "--", "--steps", "2"], ["--nproc 1000000", "at most"]),
    (["calibrate", "--nproc", "2", "--timeout-s", "1e300"], ["--timeout-s", "1e6"]),
    (["profile", "--model", "tiny_resnet", "--batch-size", "1000000000000", "-o", "t.json"],
     ["--batch-size", "[1, 2**24]"]),
    (["profile", "--model", "mymodels:build", "--input-shape", "100000,100000,100000", "--batch-size", "4",
      "-o", "t.json"], ["--input-shape 100000,100000,100000", "GiB per step"]),
])
def test_cli_numbers_out_of_range_exit_2_in_one_line(argv, needles, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    _refused(capsys, argv, *needles)


def test_parse_bandwidth_range():
    assert parse_bandwidth("10gbit") == 1e10
    with pytest.raises(ValueError, match=r"^--emulate-bandwidth: bandwidth '1e30gbit' .* \[8, 1e15\] bit/s"):
        parse_bandwidth("1e30gbit", "--emulate-bandwidth")
    assert parse_bandwidth("100tbit") == 1e14  # a link rate, for the simulator...
    with pytest.raises(ValueError, match="tc can shape"):  # ... but not one tc can shape
        parse_bandwidth("100tbit", emulated=True)
    assert MAX_EMULATED_BPS / 8 * 1e-3 <= 2 ** 32 - 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_not_a_regular_file_not_missing(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=f"^--plan {re.escape(str(fifo))} is not a regular file"):
        config_from_argv(["--plan", str(fifo)])
    with pytest.raises(ValueError, match="--network .* is not a regular file"):
        config_from_argv(["--network", str(fifo)])
    _refused(capsys, ["cost", "fit", str(fifo)], "is not a regular file")


@pytest.mark.distributed
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_distribute_with_a_fifo_plan_says_not_a_regular_file(tmp_path):
    import torch
    import torch.distributed as dist

    import repro

    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        net = torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="not a regular file"):
            repro.distribute(net, torch.optim.SGD(net.parameters(), lr=0.1), scheduler=str(fifo))
    finally:
        dist.destroy_process_group()


def test_slurm_resources_are_bounded():
    from repro.grids.jobs import GridStop, slurm_resources

    with pytest.raises(GridStop, match=r"cpus_per_task=100000000: expected an integer in \[1, 4096\]"):
        slurm_resources(None, cpus_per_task=100000000)
    with pytest.raises(GridStop, match="mem_gb"):
        slurm_resources(None, mem_gb=1e9)
    assert slurm_resources(None, cpus_per_task=64).cpus_per_task == 64


def test_new_quantities_are_listed():
    for q in (ranges.LEARNING_RATE, ranges.MOMENTUM, ranges.SEQ_LEN, ranges.LOADER_WORKERS, ranges.CPUS):
        assert q in ranges.QUANTITIES.values() and math.isfinite(q.high)


@pytest.mark.distributed
def test_the_summary_records_a_given_plans_wire_dtype(one_rank):
    """A float16 plan runs with float16 on the wire (its executor applies the plan's dtype); the run's
    summary said float32, the flag's default, so the record was wrong."""
    from types import SimpleNamespace

    from repro.training.record import summarise

    cfg = SimpleNamespace(model="tiny_resnet", scheduler="mgwfbp", emulated_bandwidth_bps=None, batch_size=4,
                          wire_dtype=None)
    rows = [{"iteration_s": 0.1, "backward_call_s": 0.05}]
    plan = SimpleNamespace(wire_dtype="float16", num_buckets=3, meta={"iteration_s": 0.09})
    assert summarise(cfg, "r", rows, [0.05], plan, None, torch.device("cpu"))["wire_dtype"] == "float16"
    assert summarise(cfg, "r", rows, [0.05], None, None, torch.device("cpu"))["wire_dtype"] == "float32"
