"""The figure pipeline never calls an interrupted or broken figure ``done``, writes every file whole,
checks every option before deleting anything, refuses undeclared parameters and holds a lock per
output folder (issue 20 items 2 and 4)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from repro.figures.gallery import collect_cards, figure_problem, write_run_record
from repro.figures.manifest import load_manifest
from repro.figures.runner import main, out_folder_lock
from repro.figures.save import save_figure
from repro.results.tables import write_table

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def manifest(tmp_path) -> Path:
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    shutil.copy(FIXTURES / "tiny_figure.ipynb", nbs / "demo.ipynb")
    p = nbs / "figures.yaml"
    p.write_text(yaml.safe_dump({"figures": [
        {"id": "demo.tiny", "notebook": "demo.ipynb", "stem": "demo_tiny", "status": "done", "kind": "simulated",
         "title": "A tiny timeline"}], "papers": {"demo": "Demo paper"}}, sort_keys=False), encoding="utf-8")
    return p


def _figure(out: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    ax.set_title("t")
    side = save_figure(fig, "demo.tiny", out / "figures", scale="tiny", source="simulated")
    plt.close(fig)
    return side


def _state(out: Path, manifest: Path) -> tuple[str, str]:
    card = collect_cards(out, load_manifest(manifest))[0]
    return card.state, card.error


def test_figure_without_a_finished_run_is_not_done(tmp_path, manifest):
    out = tmp_path / "results"
    _figure(out)
    assert _state(out, manifest)[0] == "missing"  # files alone are not trusted
    # a run killed part-way: papermill's copy exists (it is saved at each cell start), no run record
    (out / "notebooks").mkdir(parents=True)
    (out / "notebooks" / "demo.ipynb").write_text(json.dumps(
        {"cells": [], "metadata": {"papermill": {"start_time": "2026-01-01T00:00:00", "end_time": None}},
         "nbformat": 4, "nbformat_minor": 5}))
    state, error = _state(out, manifest)
    assert state == "interrupted" and "part-way" in error
    write_run_record(out, "demo.ipynb", {"status": "done", "error": None, "tables": []})
    assert _state(out, manifest)[0] == "done"


def test_an_interrupted_run_is_interrupted_not_failed(tmp_path, manifest, monkeypatch):
    """Ctrl-C while a notebook runs: the runner re-raises (exit 130 on the command line), and its run record
    and the gallery say ``interrupted``; a notebook that failed stays ``failed``."""
    from repro.figures import runner

    def stopped(src, dst, *a, **k):
        dst.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_execute", stopped)
    monkeypatch.setattr(runner, "check_kernel", lambda *a, **k: tmp_path)
    out = tmp_path / "results"
    with pytest.raises(KeyboardInterrupt):
        runner.run(out, manifest=manifest, say=lambda _l: None, heartbeat_s=0)
    assert json.loads((out / "notebooks" / "demo.run.json").read_text())["status"] == "interrupted"
    state, error = _state(out, manifest)
    assert state == "interrupted" and "interrupted (Ctrl-C)" in error
    assert "| interrupted |" in (out / "index.md").read_text()
    assert 'class="badge interrupted"' in (out / "index.html").read_text()
    monkeypatch.setattr(runner, "_execute", lambda *a, **k: "demo.ipynb failed in cell 2: ValueError: x")
    with pytest.raises(runner.FiguresError):
        runner.run(out, manifest=manifest, say=lambda _l: None, heartbeat_s=0)
    assert _state(out, manifest)[0] == "failed"


def test_truncated_png_or_pdf_or_missing_sidecar_is_not_done(tmp_path, manifest):
    out = tmp_path / "results"
    write_run_record(out, "demo.ipynb", {"status": "done", "error": None, "tables": []})
    figs = out / "figures"
    for breakage in ("png", "pdf", "json"):
        _figure(out)
        assert _state(out, manifest)[0] == "done"
        f = figs / f"demo_tiny.{breakage}"
        if breakage == "json":
            f.unlink()
        else:
            data = f.read_bytes()
            f.write_bytes(data[: len(data) // 2])
        state, error = _state(out, manifest)
        assert state == "failed", breakage
        assert f.name in error


def test_figure_problem_names_every_missing_file(tmp_path):
    files = {x: tmp_path / f"a.{x}" for x in ("png", "pdf", "json")}
    problem = figure_problem(files)
    assert "a.png" in problem and "a.pdf" in problem


def test_save_figure_leaves_no_half_file_when_the_writer_fails(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    side = _figure(tmp_path)
    figs = tmp_path / "figures"
    before = {p.name: p.read_bytes() for p in figs.iterdir()}
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    real = fig.savefig

    def dies_on_pdf(path, **kw):
        if str(path).endswith(".pdf"):
            Path(path).write_bytes(b"%PDF-half")
            raise KeyboardInterrupt  # killed mid-write
        return real(path, **kw)

    monkeypatch.setattr(fig, "savefig", dies_on_pdf)
    with pytest.raises(KeyboardInterrupt):
        save_figure(fig, "demo.tiny", figs, scale="tiny", source="simulated")
    after = {p.name: p for p in figs.iterdir()}
    assert sorted(after) == sorted(before)  # no temporary left behind
    assert after["demo_tiny.pdf"].read_bytes() == before["demo_tiny.pdf"]  # the old PDF, whole
    assert json.loads(after["demo_tiny.json"].read_text()) == side  # the old sidecar
    plt.close(fig)


def test_write_table_keeps_the_old_table_when_writing_fails(tmp_path, monkeypatch):
    write_table(pd.DataFrame({"a": [1]}), tmp_path, "t")

    def dies_half_way(self, path, **kw):
        Path(path).write_text("a\n2\n3")
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(pd.DataFrame, "to_csv", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        write_table(pd.DataFrame({"a": [2, 3, 4]}), tmp_path, "t")
    monkeypatch.undo()
    assert pd.read_csv(tmp_path / "t.csv")["a"].tolist() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.json"]


# ------------------------------------------------------------------------ the runner's options

def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _good_run(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "results"
    (out / "figures").mkdir(parents=True)
    good = out / "figures" / "demo_tiny.png"
    good.write_bytes(b"previous good figure")
    return out, {"png": good.read_bytes()}


@pytest.mark.parametrize("flags, words", [
    (["--cell-timeout", "nan"], "--cell-timeout"),
    (["--cell-timeout", "-1"], "--cell-timeout"),
    (["--heartbeat", "inf"], "--heartbeat"),
    (["--parameters-json", '{"nosuchparam": 1}'], "nosuchparam"),
])
def test_bad_options_are_refused_before_anything_is_deleted(tmp_path, manifest, capsys, flags, words):
    out, before = _good_run(tmp_path)
    rc = main(["run", "--out", str(out), "--manifest", str(manifest), *flags])
    assert rc == 2
    assert words in _one_line_error(capsys)
    assert (out / "figures" / "demo_tiny.png").read_bytes() == before["png"]
    assert not (out / "notebooks").exists()


@pytest.mark.parametrize("command", ["run", "index"])
def test_out_that_is_a_file_is_one_line(tmp_path, manifest, capsys, command):
    f = tmp_path / "afile"
    f.write_text("mine")
    rc = main([command, "--out", str(f), "--manifest", str(manifest)])
    assert rc == 2
    assert "is a file, not a folder" in _one_line_error(capsys)
    assert f.read_text() == "mine"


def test_out_on_a_read_only_mount_is_one_line(tmp_path, manifest, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")
    try:
        for command in ("run", "index"):
            rc = main([command, "--out", str(ro / "results"), "--manifest", str(manifest)])
            assert rc == 2
            assert "not writable" in _one_line_error(capsys)
    finally:
        subprocess.run(["umount", str(ro)], check=False)


def test_second_runner_into_one_folder_is_refused(tmp_path, manifest, capsys):
    out, before = _good_run(tmp_path)
    with out_folder_lock(out.resolve()):
        for command in (["run", "--out", str(out), "--manifest", str(manifest)],
                        ["index", "--out", str(out), "--manifest", str(manifest)]):
            assert main(command) == 1
            err = _one_line_error(capsys)
            assert "another figure run" in err and "is writing to" in err
    assert (out / "figures" / "demo_tiny.png").read_bytes() == before["png"]
    assert main(["index", "--out", str(out), "--manifest", str(manifest)]) == 0  # free again


@pytest.mark.slow
@pytest.mark.notebook
def test_ctrl_c_of_the_runner_is_one_line_and_status_130(tmp_path):
    """Ctrl-C while a notebook runs: exit 130 and ``repro.figures: interrupted``, no zmq traceback from the
    kernel's shutdown (issue 33 item 8), and no kernel left running."""
    import os
    import signal
    import sys
    import time

    import nbformat

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    params = nbformat.v4.new_code_cell('output_dir = "figures"\nresults_dir = "data"\nscale = "tiny"')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(
        "import os, time\nfrom pathlib import Path\nPath('started').write_text(str(os.getpid()))\ntime.sleep(120)")],
        metadata={"kernelspec": {"name": "repro", "display_name": "Python (repro)", "language": "python"}})
    nbformat.write(nb, nbs / "slow.ipynb")
    (nbs / "figures.yaml").write_text(yaml.safe_dump({"figures": [
        {"id": "demo.slow", "notebook": "slow.ipynb", "stem": "demo_slow", "status": "done", "kind": "simulated",
         "title": "Slow"}], "papers": {"demo": "Demo paper"}}), encoding="utf-8")
    started = nbs / "started"
    proc = subprocess.Popen([sys.executable, "-m", "repro.figures", "run", "--out", str(tmp_path / "out"),
                             "--manifest", str(nbs / "figures.yaml")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() or not started.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the terminal's process group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "repro.figures: interrupted", err
    assert "Traceback" not in err and "ERROR" not in err, err
    kernel = int(started.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(kernel, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(kernel, signal.SIGKILL)
        raise AssertionError(f"the kernel (pid {kernel}) is still running after the runner ended")


# ------------------------------------------------------------------ bad input: status 2, nothing written

REAL_MANIFEST = Path(__file__).resolve().parents[1] / "notebooks" / "figures.yaml"


@pytest.mark.parametrize("flags, words", [
    (["--parameters-json", "{not json"], "not valid JSON"),
    (["--parameters-json", "[1]"], "JSON object"),
    (["--parameters-json", '{"nosuchparam": 1}'], "nosuchparam"),
    (["--only", "bogus"], "--only 'bogus'"),
    (["--cell-timeout", "-1"], "--cell-timeout"),
    (["--heartbeat", "nan"], "--heartbeat"),
    (["--manifest", "/nonexistent/figures.yaml"], "figure manifest not found"),
    (["--kernel", "no-such-kernel-xyz"], "no-such-kernel-xyz"),
    (["--only", "omgs_training", "--parameters-json", '{"steps": -1}'], "omgs_training.ipynb: bad parameter: steps"),
    (["--only", "omgs_training", "--parameters-json", '{"link_rate": "1e30gbit"}'], "link_rate"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_status_2_in_one_line_before_anything_is_written(tmp_path, capsys, flags, words):
    """Each is refused in one line with status 2 (a failed run is 1), before --out is created or a kernel
    starts; ``{"steps": -1}`` used to be refused only in a notebook's cell 3, after the runner wrote
    index.html, notebooks/*.html and its lock and went on to the other notebooks."""
    out = tmp_path / "results"
    argv = ["run", "--out", str(out), *flags]
    if "--manifest" not in flags:
        argv += ["--manifest", str(REAL_MANIFEST)]
    rc = main(argv)
    err = _one_line_error(capsys)
    assert rc == 2, err
    assert words in err, err
    assert err.startswith("repro.figures: error: ")
    assert not out.exists(), sorted(out.rglob("*"))


def test_parameters_are_checked_against_every_selected_notebook(tmp_path):
    from repro.figures.runner import FiguresInputError, check_notebook_parameters

    check_notebook_parameters({"omgs_training.ipynb": {"steps": 3}, "demo.ipynb": {"anything": -1}})
    with pytest.raises(FiguresInputError, match=r"^mgwfbp_training.ipynb: bad parameter: steps: .*\[1, 10000\]"):
        check_notebook_parameters({"omgs_training.ipynb": {"steps": 3}, "mgwfbp_training.ipynb": {"steps": -1}})
