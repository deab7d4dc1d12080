"""Run folders have one owner (repro.results.runs): never half-written, mixed, silently overwritten or outside
the results directory."""

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from repro.core.cost import CostModel
from repro.core.plan import Plan
from repro.results.runs import (
    PLAN_JSON, RUN_JSON, RunError, RunExistsError, RunWriter, check_run_id, list_runs, load_run, prepare_run,
    runs_table)
from tests.helpers import make_trace


def write(root, run_id, value, **kw):
    trace = make_trace([1.0, 2.0], [400, 400])
    with RunWriter(root, run_id, **kw) as w:
        w.table("iterations.csv", pd.DataFrame({"iteration_s": [value]}))
        w.trace(trace)
        w.plan(Plan.from_groups(trace, [[1, 0]], f"plan{value}"))
        w.cost(CostModel.linear(2, 1e-3, 1e-9))
        w.record({"run_id": run_id, "config": {"x": value}, "summary": {"steps": 1, "iteration_s": value}})


def test_a_run_round_trips_with_typed_files(tmp_path):
    write(tmp_path, "r1", 1.0)
    run = load_run(tmp_path / "r1")
    assert run.summary == {"steps": 1, "iteration_s": 1.0} and run.can_simulate
    assert run.plan.solver == "plan1.0" and run.cost.workers == 2 and run.trace.num_layers == 2
    assert runs_table(tmp_path)["run_id"].tolist() == ["r1"]


def test_reusing_a_run_id_is_refused_and_leaves_the_first_run_untouched(tmp_path):
    write(tmp_path, "r1", 1.0)
    before = {p.name: p.read_bytes() for p in (tmp_path / "r1").iterdir()}
    with pytest.raises(RunExistsError, match="already exists.*--overwrite"):
        write(tmp_path, "r1", 2.0)
    assert {p.name: p.read_bytes() for p in (tmp_path / "r1").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["r1"]  # no temporary folder left behind


def test_overwrite_replaces_the_folder_whole(tmp_path):
    write(tmp_path, "r1", 1.0)
    (tmp_path / "r1" / "buckets.csv").write_text("only in the first run\n")
    with RunWriter(tmp_path, "r1", overwrite=True) as w:  # a second run without a plan
        w.record({"run_id": "r1", "config": {}, "summary": {"steps": 1, "iteration_s": 2.0}})
    names = sorted(p.name for p in (tmp_path / "r1").iterdir())
    assert names == [RUN_JSON]  # nothing of the first run survives beside the second one's record
    assert load_run(tmp_path / "r1").plan is None
    assert [p.name for p in tmp_path.iterdir()] == ["r1"]


def test_a_failed_writer_leaves_nothing(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with RunWriter(tmp_path, "r1") as w:
            w.table("iterations.csv", pd.DataFrame({"a": [1]}))
            1 / 0
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RunError, match="no run.json"):
        with RunWriter(tmp_path, "r2") as w:
            w.table("iterations.csv", pd.DataFrame({"a": [1]}))
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writer_leaves_no_folder_that_looks_complete(tmp_path):
    script = textwrap.dedent(f"""
        import os, pandas as pd
        from repro.results.runs import RunWriter
        w = RunWriter({str(tmp_path)!r}, "r1")
        w.table("iterations.csv", pd.DataFrame({{"a": [1]}}))
        w.record({{"run_id": "r1", "config": {{}}, "summary": {{}}}})
        os.kill(os.getpid(), 9)  # killed before the folder is moved into place
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert r.returncode == -9
    assert not (tmp_path / "r1").exists()
    assert [p.name.startswith(".r1.partial-") for p in tmp_path.iterdir()] == [True]
    assert list_runs(tmp_path) == []  # readers skip the partial folder
    write(tmp_path, "r1", 3.0)  # and the id is still free
    assert load_run(tmp_path / "r1").summary == {"steps": 1, "iteration_s": 3.0}


@pytest.mark.parametrize("bad", ["../../x", "a/b", "..", ".", ".hidden", "-rf", "", "a\\b", "a\x00b", "x" * 201])
def test_run_ids_are_one_safe_path_component(tmp_path, bad):
    with pytest.raises(RunError, match="is not allowed"):
        check_run_id(bad)
    with pytest.raises(RunError):
        RunWriter(tmp_path, bad)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_or_file_results_dirs_fail_before_any_work(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(RunError, match="is a file"):
        prepare_run(f, "r1")
    with pytest.raises(RunError, match="not writable"):  # unwritable even for root
        prepare_run("/proc/repro-results", "r1")
    if os.geteuid() != 0:  # root writes everywhere else
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(RunError, match="not writable"):
            prepare_run(ro, "r1")


def test_plan_file_name_is_owned_here(tmp_path):
    write(tmp_path, "r1", 1.0)
    assert (tmp_path / "r1" / PLAN_JSON).is_file()


def test_progress_of_a_run_is_readable_and_superseded_by_the_finished_run(tmp_path):
    import pandas as pd

    from repro.results.runs import ProgressWriter, RunWriter, list_incomplete, load_progress, prepare_run

    pw = ProgressWriter(tmp_path, "r1")
    pw.update([{"epoch": 1, "test_accuracy": 0.5}], {"model": "m"})
    pw.update([{"epoch": 1, "test_accuracy": 0.5}, {"epoch": 2, "test_accuracy": 0.7}], {"model": "m"})
    assert list_incomplete(tmp_path) == [tmp_path / "r1.incomplete"]
    info, epochs = load_progress(tmp_path / "r1.incomplete")
    assert info["epochs_completed"] == 2 and not info["complete"]
    assert epochs["test_accuracy"].tolist() == [0.5, 0.7]
    assert not [p for p in (tmp_path / "r1.incomplete").iterdir() if p.name.startswith(".")]  # no temp left
    assert list_runs(tmp_path) == []  # never mistaken for a finished run
    with pytest.raises(RunExistsError, match="stopped part-way"):  # a new run of the id is refused ...
        prepare_run(tmp_path, "r1")
    prepare_run(tmp_path, "r1", overwrite=True)  # ... unless asked to overwrite
    with RunWriter(tmp_path, "r1") as w:  # the run itself finishes: its progress folder goes
        w.table("epochs.csv", pd.DataFrame({"epoch": [1, 2, 3]}))
        w.record({"run_id": "r1", "config": {}, "summary": {"steps": 3, "iteration_s": 0.1}})
    assert list_incomplete(tmp_path) == [] and not (tmp_path / "r1.incomplete").exists()
    assert [r.run_id for r in list_runs(tmp_path)] == ["r1"]


@pytest.mark.distributed
def test_a_run_stopped_part_way_leaves_its_completed_epochs_readable(tmp_path):
    from repro.launch.local import RankFailedError, launch_local
    from repro.results.runs import list_incomplete, load_progress
    from tests.launch_targets import train_then_fail_in_epoch

    cfg = {"model": "tiny_resnet", "scheduler": "ddp", "dataset": "digits", "epochs": 3, "batch_size": 256,
           "warmup_steps": 0, "compute_steps": 0, "quiet": True, "results_dir": str(tmp_path), "run_id": "stopped"}
    with pytest.raises(RankFailedError, match="stopped on purpose in epoch 2"):
        launch_local(train_then_fail_in_epoch, 2, args=(cfg, 2), timeout_s=120)
    assert not (tmp_path / "stopped").exists()
    [folder] = list_incomplete(tmp_path)
    info, epochs = load_progress(folder)
    assert info["run_id"] == "stopped" and info["epochs_completed"] == 1
    assert epochs["epoch"].tolist() == [1] and 0 < epochs["test_accuracy"].iloc[0] <= 1
