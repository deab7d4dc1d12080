"""`repro compare` and the cluster flags of plan / simulate / compare (repro.cli.compare, repro.cli.main):
every family predicted on a described cluster, reasons instead of tracebacks, bounded exact planners,
the three formats, a user's measurements fitted into a cost file that every command accepts, torch-free."""

import csv
import io
import json
import math
import subprocess
import sys

import pytest

from repro.cli.main import main
from repro.cli.compare import FIELDS, compare, planner_options
from repro.costs.presets import preset
from repro.core.schedulers import SCHEDULERS
from repro.core.trace import load_trace

TINY = "tiny_vgg_b32_cpu"
CLUSTER = ["--nodes", "2", "--gpus-per-node", "2", "--inter-link", "1gbit@50us", "--topk-gamma", "1e-10"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, *argv):
    rc, out, err = run(capsys, "compare", "--trace", TINY, *argv, "--format", "json")
    assert rc == 0, err
    return json.loads(out)


def test_every_plannable_scheduler_is_predicted_on_a_described_cluster(capsys):
    records = _json(capsys, *CLUSTER)
    assert [r["scheduler"] for r in records] == list(SCHEDULERS)
    assert all(set(r) == set(FIELDS) for r in records)
    by = {r["scheduler"]: r for r in records}
    planned = [r for r in records if r["iteration_s"] is not None]
    # every scheduler with a planner gets a finite prediction; the runtime baselines say why they do not
    assert {r["scheduler"] for r in planned} == {n for n, s in SCHEDULERS.items() if s.has_plan}
    assert all(math.isfinite(r["iteration_s"]) and r["iteration_s"] > 0 and r["buckets"] >= 1 for r in planned)
    assert {r["family"] for r in planned} == {"allreduce", "sparse", "dear", "bytescheduler", "ps"}
    for name, s in SCHEDULERS.items():
        if not s.has_plan:
            assert by[name]["iteration_s"] is None and "executes no plan" in by[name]["note"]
    base = by["syncea"]["iteration_s"]
    assert by["syncea"]["speedup_over_syncea"] == 1.0
    for r in planned:
        assert r["speedup_over_syncea"] == pytest.approx(base / r["iteration_s"], rel=1e-12)  # one division
        assert r["throughput_samples_per_s"] == pytest.approx(4 * 32 / r["iteration_s"], rel=1e-12)


def test_a_prediction_is_the_simulated_plan(capsys):
    """compare predicts what `repro plan` + `repro simulate` give for the same flags."""
    rec = {r["scheduler"]: r for r in _json(capsys, *CLUSTER, "--schedulers", "dear_optimal,ps_bsp")}
    rc, out, err = run(capsys, "plan", "--trace", TINY, "--solver", "dear_optimal", *CLUSTER)
    assert rc == 0, err
    plan = json.loads(out)
    assert len(plan["buckets"]) == rec["dear_optimal"]["buckets"]
    assert plan["iteration_s"] == pytest.approx(rec["dear_optimal"]["iteration_s"], rel=1e-9)  # the planner's own model
    rc, out, err = run(capsys, "plan", "--trace", TINY, "--solver", "ps_bsp", "--servers", "2", *CLUSTER)
    assert rc == 0, err
    assert json.loads(out)["iteration_s"] == pytest.approx(rec["ps_bsp"]["iteration_s"], rel=1e-9)


def test_simulate_takes_the_cluster_flags(capsys, tmp_path):
    plan = tmp_path / "p.json"
    rc, out, err = run(capsys, "plan", "--trace", TINY, "--solver", "omgs", *CLUSTER, "-o", str(plan))
    assert rc == 0, err
    rc, out, err = run(capsys, "simulate", "--trace", TINY, "--plan", str(plan), "--no-ops", *CLUSTER)
    assert rc == 0, err
    assert json.loads(out)["iteration_s"] > 0


def test_reasons_instead_of_tracebacks(capsys):
    """An all-reduce-only preset (its published lines): the families it cannot serve say which line is
    missing; without a top-k cost the sparse family is predicted with OMGS-SGD's published fit."""
    rc, out, err = run(capsys, "compare", "--trace", TINY, "--network", "10gbe-v100", "--workers", "4",
                       "--cost-mode", "paper")
    assert rc == 0 and "Traceback" not in out + err, err
    lines = {line.split()[0]: line for line in out.splitlines() if not line.startswith("#")}
    assert "no reduce_scatter or allgather line" in lines["dear_optimal"]
    assert "no push or pull line" in lines["osp"]
    assert "no sparse_allgather line" in lines["omgs"]
    assert lines["scheduler"].split()[-1] == "note"   # the table's header row
    records = _json(capsys, "--nodes", "2", "--gpus-per-node", "2", "--inter-link", "1gbit")
    omgs = next(r for r in records if r["scheduler"] == "omgs")
    assert omgs["iteration_s"] > 0 and omgs["note"] == ""
    rc, out, err = run(capsys, "compare", "--trace", TINY, "--nodes", "2", "--gpus-per-node", "2", "--inter-link",
                       "1gbit", "--schedulers", "omgs")
    assert "# top-k gamma 2.19e-10 s: OMGS-SGD's published fit" in out


def test_exact_planners_get_the_time_budget():
    assert planner_options("dear_optimal", servers=3, time_budget_s=2.0) == {"time_budget_s": 2.0}
    assert planner_options("omgs_optimal", servers=3, time_budget_s=2.0, given={"density": 0.01}) == \
        {"time_budget_s": 2.0, "density": 0.01}
    assert planner_options("ps_bsp", servers=3, time_budget_s=2.0, given={"density": 0.01}) == {"servers": 3}
    assert planner_options("wfbp", servers=3, time_budget_s=2.0) == {}


def test_a_spent_budget_is_a_note_with_the_gap():
    trace = load_trace("resnet50_b32_v100-estimate")
    cost = preset("10gbe-dear-derived", 16)
    rec = compare(trace, cost, time_budget_s=1e-9, schedulers=["dear_optimal"])[0]
    assert rec["iteration_s"] > 0 and rec["note"].startswith("time budget of 1e-09 s spent: at most ")


def test_table_and_csv_hold_what_json_holds(capsys):
    records = _json(capsys, *CLUSTER, "--schedulers", "syncea,mgwfbp,ddp")
    rc, out, err = run(capsys, "compare", "--trace", TINY, *CLUSTER, "--schedulers", "syncea,mgwfbp,ddp",
                       "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["scheduler"] for r in rows] == ["syncea", "mgwfbp", "ddp"] and list(rows[0]) == list(FIELDS)
    assert float(rows[1]["iteration_s"]) == records[1]["iteration_s"] and rows[2]["iteration_s"] == ""
    rc, out, err = run(capsys, "compare", "--trace", TINY, *CLUSTER, "--schedulers", "mgwfbp")
    assert rc == 0
    head = [line for line in out.splitlines() if line.startswith("#")]
    assert any("P=4" in line and "cluster 2 node(s) x 2" in line for line in head)
    assert any("--topk-gamma" in line for line in head)
    # the speedup needs SyncEASGD even when it is not asked for
    assert records[1]["speedup_over_syncea"] is not None
    table_head = out.splitlines()[len(head)].split()
    assert table_head == ["scheduler", "family", "iteration_s", "buckets", "speedup_over_syncea", "note"]
    assert set(table_head) <= set(FIELDS)  # the table's columns are named as the CSV's (once speedup_vs_syncea)


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "2", "--inter-link", "25gbps"], "--inter-link: rate '25gbps' is ambiguous"),
    (["--nodes", "2", "--inter-link", "25gbit@5"], "--inter-link: cannot read latency '5'"),
    (["--inter-link", "25gbit"], "a cluster needs --nodes N"),
    (["--nodes", "2", "--gpus-per-node", "4", "--inter-link", "1gbit", "--algorithm", "x"], "--algorithm: unknown"),
    (["--network", "10gbe-derived", "--workers", "4", "--algorithm", "ring"], "--algorithm applies to a cluster"),
    (["--network", "10gbe-derived", "--nodes", "2", "--gpus-per-node", "4", "--workers", "4"], "contradicts"),
    (["--network", "10gbe-derived", "--inter-link", "1gbit", "--nodes", "2"], "give exactly one cost source"),
    ([*CLUSTER[:6], "--topk-device", "X100"], "--topk-device: no top-k cost for device 'X100'"),
    ([*CLUSTER, "--time-budget-s", "0"], "--time-budget-s must be a finite positive"),
    ([*CLUSTER, "--schedulers", "nope"], "--schedulers: unknown scheduler(s) nope"),
])
def test_bad_flags_are_one_line(capsys, argv, message):
    rc, out, err = run(capsys, "compare", "--trace", TINY, *argv)
    assert rc == 2 and out == "" and message in err and err.count("\n") == 1, err


def test_a_users_measurements_become_a_cost_file_every_command_takes(capsys, tmp_path):
    P, a, b = 4, 1e-4, 8e-10
    sizes = (4096, 2 ** 18, 2 ** 22)
    body = "bytes,workers,seconds,collective\n"
    for kind, per in (("allreduce", 1.0), ("reduce_scatter", 0.5), ("allgather", 0.5), ("sparse_allgather", P),
                      ("push", 0.25), ("pull", 0.25)):
        body += "".join(f"{n},{P},{a + b * per * n!r},{kind}\n" for n in sizes)
    csv_path, cost_path = tmp_path / "mine.csv", tmp_path / "cost.json"
    csv_path.write_text(body)
    rc, out, err = run(capsys, "cost", "fit", str(csv_path), "-o", str(cost_path))
    assert rc == 0, err
    fitted = json.loads(cost_path.read_text())
    assert fitted["workers"] == P and set(fitted["lines"]) == {"allreduce", "reduce_scatter", "allgather",
                                                             "sparse_allgather", "push", "pull"}
    # exact data: the fitted all-reduce line is the one measured (rounding only)
    assert fitted["lines"]["allreduce"]["b_s_per_byte"] == pytest.approx(b, rel=1e-9)
    for flag in ("--cost", "--network"):
        records = _json(capsys, flag, str(cost_path), "--topk-gamma", "1e-10")
        planned = [r for r in records if r["iteration_s"] is not None]
        assert len(planned) == sum(s.has_plan for s in SCHEDULERS.values())
    rc, out, err = run(capsys, "plan", "--trace", TINY, "--solver", "dear_threshold", "--cost", str(cost_path))
    assert rc == 0, err
    rc, out, err = run(capsys, "plan", "--trace", TINY, "--solver", "wfbp", "--cost", "10gbe-derived",
                       "--workers", "4")
    assert rc == 0 and json.loads(out)["provenance"]["cost_source"] == "preset 10gbe-derived", err
    rc, out, err = run(capsys, "cost", "fit", str(csv_path), "--workers", "8")
    assert rc == 2 and "no measurements for P=8" in err and err.count("\n") == 1


def test_compare_never_imports_torch():
    code = ("import sys, contextlib, io\nfrom repro.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main(['compare', '--trace', '{TINY}', '--nodes', '2', '--gpus-per-node', '2', "
            "'--inter-link', '10gbit', '--format', 'json', '--schedulers', 'omgs,dear_model,osp'])\n"
            "print(rc, sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0 []"


@pytest.mark.slow
def test_the_issue_check_on_resnet50_at_32_gpus(capsys):
    """Issue 22's check: a finite prediction for at least 15 schedulers covering every family."""
    rc, out, err = run(capsys, "compare", "--trace", "resnet50_b32_v100-estimate", "--nodes", "4", "--gpus-per-node",
                       "8", "--inter-link", "25gbit", "--format", "json")
    assert rc == 0, err
    finite = [r for r in json.loads(out) if r["iteration_s"] is not None and math.isfinite(r["iteration_s"])]
    assert len(finite) >= 15
    names = {r["scheduler"] for r in finite}
    assert {"mgwfbp", "optimal", "dear_optimal", "omgs", "osp", "bytescheduler"} <= names


@pytest.mark.parametrize("cost_mode", ["calibrated", "paper"])
def test_the_cli_and_the_notebooks_study_predict_the_same_times(capsys, cost_mode):
    """`repro compare` and the compare_schedulers notebook's table (repro.studies.compare) at their defaults,
    on the same trace, network and P: every scheduler's predicted time equal."""
    from repro.studies import compare as study

    stem = "resnet50_b64_v100-estimate"
    argv = ["--network", "10gbe-derived", "--workers", "16"] + (["--cost-mode", "paper"] if cost_mode == "paper"
                                                                  else [])
    rc, out, err = run(capsys, "compare", "--trace", stem, *argv, "--format", "json")
    assert rc == 0, err
    cli = {r["scheduler"]: r for r in json.loads(out)}
    kwargs = {} if cost_mode == "calibrated" else {"cost_mode": "paper"}
    table = study.simulated_table([stem], ["10gbe-derived"], [16], **kwargs).set_index("scheduler")
    assert len(table) == len(study.SCHEDULERS) == 21
    for s, row in table.iterrows():
        assert cli[s]["iteration_s"] == row["iteration_s"], s
        assert cli[s]["buckets"] == row["buckets"], s
    ps = table.loc[list(study.PARAMETER_SERVER)]
    assert (ps["servers"] == 4).all()  # one server per node of 4 GPUs in both modes
