"""The figure pipeline: style, save_figure, plot helpers, the manifest, the papermill runner, the index."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from repro.figures import (  # noqa: E402
    SCHEDULER_COLORS,
    gantt,
    save_figure,
    scheduler_color,
    scheduler_label,
    scheduler_lines,
    stacked_bars,
    tag_title,
    use_style,
)
from repro.figures.manifest import (  # noqa: E402
    ManifestError,
    default_manifest_path,
    done_notebooks,
    load_manifest,
)
from repro.figures.runner import (  # noqa: E402
    KERNEL_NAME,
    FiguresError,
    check_kernel,
    main,
    notebook_parameters,
    run,
    select_notebooks,
    write_index,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The project's figure inventory, kept in the repository (a copy of shared/papers/FIGURES.md; see
# tests/fixtures/README.md), so the coverage check runs in a clone of the project alone.
FIGURES_MD = Path(__file__).resolve().parent / "fixtures" / "FIGURES.md"
REAL_MANIFEST = ROOT / "notebooks" / "figures.yaml"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _nonempty(p: Path) -> bool:
    return p.is_file() and p.stat().st_size > 0


# ------------------------------------------------------------------------------------------- style

def test_use_style_is_idempotent_and_sets_the_project_rc():
    use_style()
    use_style()
    assert matplotlib.rcParams["pdf.fonttype"] == 42
    assert matplotlib.rcParams["savefig.dpi"] == 150
    assert matplotlib.rcParams["axes.facecolor"] == "white"
    assert matplotlib.get_backend().lower() == "agg"


def test_scheduler_colors_are_fixed_distinct_and_aliased():
    names = ["wfbp", "syncea", "threshold", "mgwfbp", "optimal", "linear", "ddp", "paper"]
    colors = [scheduler_color(n) for n in names]
    assert all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colors)
    assert len(set(colors)) == len(names), "schedulers drawn together need distinct colours"
    for group in (["dear", "wfbp", "bytescheduler", "horovod", "ddp", "mgwfbp"],
                  ["ssgd", "topk", "omgs"], ["bsp", "asp", "ssp", "osp", "osp_nolgp"]):
        assert len({scheduler_color(n) for n in group}) == len(group)
    assert scheduler_color("MG-WFBP") == scheduler_color("mgwfbp") == SCHEDULER_COLORS["mgwfbp"]
    assert scheduler_color("SyncEASGD") == scheduler_color("syncea")
    assert scheduler_color("some-new-method") == scheduler_color("some-new-method")  # deterministic
    assert scheduler_label("wfbp") == "WFBP"
    assert scheduler_label("syncea") == "SyncEASGD"
    assert scheduler_label("mgwfbp") == "MG-WFBP"
    assert scheduler_label("optimal") == "Optimal (ours, exact DP)"
    assert scheduler_label("Mystery") == "Mystery"


# -------------------------------------------------------------------------------------------- save

def test_save_figure_writes_png_pdf_and_sidecar(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9])
    fig.suptitle("Speedup at paper scale")
    side = save_figure(fig, "mgwfbp.sim_speedup", tmp_path / "figs", scale="paper", source="model",
                       caption="A caption.", paper_numbers="Table 3 of the TPDS paper")
    d = tmp_path / "figs"
    for ext in ("png", "pdf", "json"):
        assert _nonempty(d / f"mgwfbp_sim_speedup.{ext}")
    on_disk = json.loads((d / "mgwfbp_sim_speedup.json").read_text())
    assert on_disk == side
    assert side["id"] == "mgwfbp.sim_speedup"
    assert side["scale"] == "paper" and side["source"] == "model"
    assert side["caption"] == "A caption." and side["paper_numbers"] == "Table 3 of the TPDS paper"
    assert side["files"] == ["mgwfbp_sim_speedup.png", "mgwfbp_sim_speedup.pdf"]
    assert fig.get_suptitle() == "Speedup at paper scale"  # nothing to tag
    assert (d / "mgwfbp_sim_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (d / "mgwfbp_sim_speedup.pdf").read_bytes()[:5] == b"%PDF-"


def test_save_figure_custom_stem_and_source_list(tmp_path):
    fig, ax = plt.subplots()
    ax.set_title("Measured vs simulated, tiny run")
    side = save_figure(fig, "validation.sim_vs_real", tmp_path, scale="tiny",
                       source=["measured", "simulated", "measured"], stem="custom")
    assert side["source"] == ["measured", "simulated"]
    assert (tmp_path / "custom.png").is_file() and (tmp_path / "custom.json").is_file()
    assert ax.get_title() == "Measured vs simulated, tiny run"  # says tiny and simulated already


@pytest.mark.parametrize("kwargs, match", [
    (dict(scale="huge", source="measured"), "scale"),
    (dict(scale="tiny", source="guessed"), "source"),
    (dict(scale="tiny", source=[]), "source"),
    (dict(scale="tiny", source="measured", stem="a/b"), "stem"),
    (dict(scale="tiny", source="measured", paper_numbers=3), "paper_numbers"),
])
def test_save_figure_rejects_bad_arguments(tmp_path, kwargs, match):
    fig, _ = plt.subplots()
    with pytest.raises(ValueError, match=match):
        save_figure(fig, "mgwfbp.timeline", tmp_path, **kwargs)
    assert not list(tmp_path.iterdir()), "nothing may be written on a bad call"


def test_tiny_and_simulated_tags_go_on_the_suptitle(tmp_path):
    fig, axes = plt.subplots(1, 2)
    fig.suptitle("Timeline")
    axes[0].set_title("WFBP")
    side = save_figure(fig, "mgwfbp.timeline", tmp_path, scale="tiny", source=["simulated"])
    assert fig.get_suptitle() == "Timeline (tiny scale) (simulated)"
    assert side["title"] == "Timeline (tiny scale) (simulated)"
    assert axes[0].get_title() == "WFBP"
    save_figure(fig, "mgwfbp.timeline", tmp_path, scale="tiny", source="simulated")  # idempotent
    assert fig.get_suptitle() == "Timeline (tiny scale) (simulated)"


def test_tags_respect_existing_words_and_single_axes_titles():
    fig, ax = plt.subplots()
    ax.set_title("Simulated speedup")
    assert tag_title(fig, scale="tiny", source="simulated") == "Simulated speedup (tiny scale)"
    assert ax.get_title() == "Simulated speedup (tiny scale)" and fig.get_suptitle() == ""

    fig, ax = plt.subplots()
    ax.set_title("Tiny-scale run")
    tag_title(fig, scale="tiny", source="measured")
    assert ax.get_title() == "Tiny-scale run"

    fig, ax = plt.subplots()
    tag_title(fig, scale="paper", source="simulated")
    assert ax.get_title() == "(simulated)"

    fig, _ = plt.subplots(2, 1)  # several axes, no suptitle: one is created
    tag_title(fig, scale="tiny", source="measured")
    assert fig.get_suptitle() == "(tiny scale)"

    fig, ax = plt.subplots()
    ax.set_title("Measured")
    tag_title(fig, scale="paper", source=["measured", "trace"])
    assert ax.get_title() == "Measured"


# ------------------------------------------------------------------------------------------- plots

@dataclass
class _Op:
    stream: str
    kind: str
    label: str
    start_s: float
    end_s: float


def _ops():
    return [
        _Op("comm", "allreduce", "l3-l7", 0.010, 0.020),
        {"stream": "compute", "kind": "forward", "label": "fwd", "start_s": 0.0, "end_s": 0.004},
        {"stream": "compute", "kind": "backward", "label": "l7", "start_s": 0.004, "end_s": 0.0042},
        _Op("compute", "backward", "l0-l6", 0.0042, 0.010),
    ]


def test_gantt_rows_colours_labels_and_ms_axis(tmp_path):
    fig, ax = plt.subplots()
    assert gantt(ax, _ops(), label_min_width_frac=0.05) is ax
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "comm"]
    assert ax.get_ylim()[0] > ax.get_ylim()[1], "first stream must be on top"
    assert "ms" in ax.get_xlabel()
    assert ax.get_xlim()[1] == pytest.approx(20.0, rel=0.05)
    assert len(ax.patches) == 4
    texts = {t.get_text() for t in ax.texts}
    assert {"l3-l7", "l0-l6", "fwd"} <= texts and "l7" not in texts  # l7 is 1% of the span
    widths = sorted(p.get_width() for p in ax.patches)
    assert widths[-1] == pytest.approx(10.0)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["allreduce", "forward", "backward"]
    colours = {p.get_facecolor() for p in ax.patches}
    assert len(colours) == 3
    save_figure(fig, "mgwfbp.timeline", tmp_path, scale="paper", source="simulated")
    assert _nonempty(tmp_path / "mgwfbp_timeline.png")


def test_gantt_accepts_dataframe_and_explicit_streams():
    fig, ax = plt.subplots()
    df = pd.DataFrame([{"stream": "rs", "kind": "reduce_scatter", "label": "b0", "start_s": 0, "end_s": 1},
                       {"stream": "ag", "kind": "allgather", "label": "b0", "start_s": 1, "end_s": 2}])
    gantt(ax, df, streams=["compute", "rs", "ag"], legend=False)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["compute", "rs", "ag"]
    assert ax.get_legend() is None


def test_gantt_rejects_bad_ops():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="ends before"):
        gantt(ax, [_Op("compute", "forward", "x", 2.0, 1.0)])
    with pytest.raises(ValueError, match="streams"):
        gantt(ax, _ops(), streams=["compute"])
    with pytest.raises(ValueError, match="start_s"):
        gantt(ax, [{"stream": "compute", "kind": "forward", "end_s": 1.0}])


def test_scheduler_lines_and_stacked_bars():
    df = pd.DataFrame({"P": [4, 8, 4, 8, 8, 4], "speedup": [3.5, 6.0, 3.9, 7.5, 8, 4],
                       "scheduler": ["wfbp", "wfbp", "mgwfbp", "mgwfbp", "linear", "linear"]})
    fig, ax = plt.subplots()
    scheduler_lines(ax, df, x="P", y="speedup", logx=True)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["WFBP", "MG-WFBP", "Linear"]
    assert ax.lines[1].get_color() == scheduler_color("mgwfbp")
    assert ax.lines[2].get_linestyle() == "--"
    assert ax.get_xscale() == "log"

    bd = pd.DataFrame({"method": ["WFBP", "MG-WFBP"], "backward": [1.0, 1.0], "allreduce": [0.8, 0.3]})
    fig, ax = plt.subplots()
    stacked_bars(ax, bd, x="method", parts=["backward", "allreduce"])
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_xticklabels()] == ["WFBP", "MG-WFBP"]
    tops = sorted(p.get_y() + p.get_height() for p in ax.patches)
    assert tops[-1] == pytest.approx(1.8)


# ---------------------------------------------------------------------------------------- manifest

_FIGURES_MD_ROW = re.compile(r"^\|\s*`([a-z0-9_]+\.[a-z0-9_]+)`\s*\|(.*)\|(.*)\|\s*$")


def _figures_md_rows() -> dict[str, str]:
    """id -> kind, from the tables of FIGURES.md; a table row that does not parse is an error."""
    rows: dict[str, str] = {}
    for line in FIGURES_MD.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue  # headers, separators, prose
        m = _FIGURES_MD_ROW.match(line)
        assert m, f"FIGURES.md figure row does not parse: {line!r}"
        assert m.group(1) not in rows, f"FIGURES.md lists {m.group(1)} twice"
        rows[m.group(1)] = m.group(3).strip()
    return rows


def test_manifest_covers_every_figure_of_the_inventory():
    if not FIGURES_MD.is_file():
        pytest.fail(f"the figure inventory {FIGURES_MD} is missing: it is part of the repository "
                    "(tests/fixtures/FIGURES.md, a copy of shared/papers/FIGURES.md)")
    inventory = _figures_md_rows()
    assert len(inventory) >= 34, f"FIGURES.md parsed to only {len(inventory)} ids"
    entries = load_manifest(REAL_MANIFEST, check_files=False)
    by_id = {e.id: e for e in entries}
    missing = sorted(set(inventory) - set(by_id))
    assert not missing, f"figure ids of FIGURES.md missing from the manifest: {missing}"
    extra = sorted(set(by_id) - set(inventory))
    assert not extra, f"manifest ids that FIGURES.md does not list: {extra}"
    assert len(entries) == len(inventory)
    wrong_kind = {i: (by_id[i].kind, k) for i, k in inventory.items() if by_id[i].kind != k}
    assert not wrong_kind, f"manifest kind differs from FIGURES.md: {wrong_kind}"


def test_inventory_check_fails_when_figures_md_is_absent(monkeypatch, tmp_path):
    """The inventory is in the repository: a missing one fails the coverage check, in CI or not (never a skip)."""
    monkeypatch.setattr(sys.modules[__name__], "FIGURES_MD", tmp_path / "absent" / "FIGURES.md")
    for ci in ("true", ""):
        monkeypatch.setenv("CI", ci)
        with pytest.raises(pytest.fail.Exception, match="part of the repository"):
            test_manifest_covers_every_figure_of_the_inventory()


def test_real_manifest_is_well_formed():
    entries = load_manifest(REAL_MANIFEST, check_files=False)
    assert default_manifest_path() == REAL_MANIFEST
    assert len({e.stem for e in entries}) == len(entries)
    for e in entries:
        assert e.stem == e.id.replace(".", "_"), "save_figure's default stem must match the manifest"
        assert (e.notebook_path.parent == REAL_MANIFEST.parent)
    assert done_notebooks(entries), "at least one figure is done"


def test_real_manifest_done_notebooks_exist():
    """Fails while a notebook marked done in figures.yaml has not been written yet."""
    load_manifest(REAL_MANIFEST)


def _write_manifest(tmp_path: Path, figures: list[dict], papers: dict | None = None) -> Path:
    p = tmp_path / "figures.yaml"
    data = {"figures": figures}
    if papers is not None:
        data["papers"] = papers
    p.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return p


def _entry(fid: str, status: str = "planned", notebook: str = "nb.ipynb", **extra) -> dict:
    d = {"id": fid, "notebook": notebook, "stem": fid.replace(".", "_"), "status": status,
         "kind": "simulated", "title": f"Title of {fid}"}
    d.update(extra)
    return d


@pytest.mark.parametrize("figures, match", [
    ([_entry("mgwfbp.a"), _entry("mgwfbp.a")], "duplicate id"),
    ([_entry("mgwfbp.a", status="wip")], "unknown status 'wip'"),
    ([{k: v for k, v in _entry("mgwfbp.a").items() if k != "stem"}], "missing key.*stem"),
    ([_entry("mgwfbp.a", status="done", notebook="absent.ipynb")], "does not exist.*absent.ipynb"),
    ([_entry("nopaper.a")], "unknown paper prefix 'nopaper'"),
    ([_entry("mgwfbp.a"), _entry("mgwfbp.b", stem="mgwfbp_a")], "duplicate stem"),
    ([_entry("mgwfbp.a", colour="red")], "unknown key.*colour"),
    ([_entry("MGWFBP a")], "id must look like"),
    ([_entry("mgwfbp.a", notebook="../x.ipynb")], "notebook must be"),
])
def test_manifest_validation_errors(tmp_path, figures, match):
    with pytest.raises(ManifestError, match=match):
        load_manifest(_write_manifest(tmp_path, figures))


def test_manifest_not_a_figures_list_or_missing(tmp_path):
    p = tmp_path / "figures.yaml"
    p.write_text("- just a list\n")
    with pytest.raises(ManifestError, match="'figures' list"):
        load_manifest(p)
    with pytest.raises(ManifestError, match="not found"):
        load_manifest(tmp_path / "nope.yaml")


def test_done_notebooks_unique_in_order(tmp_path):
    for nb in ("b.ipynb", "a.ipynb"):
        (tmp_path / nb).write_text("{}")
    p = _write_manifest(tmp_path, [
        _entry("mgwfbp.x", "done", "b.ipynb"), _entry("mgwfbp.y", "planned", "c.ipynb"),
        _entry("mgwfbp.z", "done", "a.ipynb"), _entry("omgs.w", "done", "b.ipynb")])
    entries = load_manifest(p)
    assert done_notebooks(entries) == ["b.ipynb", "a.ipynb"]
    assert [e.paper for e in entries] == ["mgwfbp", "mgwfbp", "mgwfbp", "omgs"]
    assert entries[0].notebook_path == tmp_path / "b.ipynb"
    assert select_notebooks(entries, ["a"]) == ["a.ipynb"]
    assert select_notebooks(entries, ["omgs.w", "mgwfbp_z"]) == ["b.ipynb", "a.ipynb"]
    assert select_notebooks(entries, ["mgwfbp"]) == ["b.ipynb", "a.ipynb"]
    with pytest.raises(FiguresError, match="planned"):
        select_notebooks(entries, ["mgwfbp.y"])
    with pytest.raises(FiguresError, match="matches no done"):
        select_notebooks(entries, ["nothing"])


def test_notebook_parameters(tmp_path):
    p = notebook_parameters(tmp_path / "out", {"seed": 3})
    assert p == {"output_dir": str((tmp_path / "out/figures").resolve()),
                 "results_dir": str((tmp_path / "out/data").resolve()), "scale": "tiny", "seed": 3}
    assert notebook_parameters(tmp_path, {"scale": "paper"})["scale"] == "paper"
    with pytest.raises(FiguresError, match="output_dir"):
        notebook_parameters(tmp_path, {"output_dir": "/elsewhere"})
    with pytest.raises(FiguresError, match="scale"):
        notebook_parameters(tmp_path, {"scale": "medium"})


# ------------------------------------------------------------------------------------------ runner

@pytest.fixture
def demo_manifest(tmp_path) -> Path:
    """A notebooks folder with the fixture notebook (one done figure) and a planned figure."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    shutil.copy(FIXTURES / "tiny_figure.ipynb", nbs / "demo.ipynb")
    return _write_manifest(nbs, [
        {"id": "demo.tiny", "notebook": "demo.ipynb", "stem": "demo_tiny", "status": "done",
         "kind": "simulated", "title": "A tiny timeline"},
        {"id": "demo.later", "notebook": "later.ipynb", "stem": "demo_later", "status": "planned",
         "kind": "measured", "title": "Something for later"},
    ], papers={"demo": "Demo paper"})


def _check_notebook_outputs(manifest: Path, notebook: str, out: Path, parameters: dict | None = None) -> None:
    """Run one notebook of ``manifest`` at tiny scale; every declared figure must be a non-empty PNG+PDF."""
    entries = load_manifest(manifest)
    declared = [e for e in entries if e.done and e.notebook == notebook]
    assert declared, f"{notebook} declares no done figure"
    report = run(out, only=[notebook], manifest=manifest, parameters=parameters, say=lambda _msg: None)
    assert report.notebooks == [notebook]
    assert _nonempty(out / "notebooks" / notebook)
    for e in declared:
        for ext in ("png", "pdf"):
            f = out / "figures" / f"{e.stem}.{ext}"
            assert _nonempty(f), f"{notebook} did not write {f.name}"


@pytest.mark.notebook
@pytest.mark.slow
def test_runner_end_to_end_on_fixture(demo_manifest, tmp_path, capsys):
    import repro

    out = tmp_path / "results"
    rc = main(["run", "--out", str(out), "--manifest", str(demo_manifest),
               "--parameters-json", '{"fig_id": "demo.tiny"}'])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    # progress: which notebook, its time, then one line per figure (id, status, file); then the index
    lines = captured.out.splitlines()
    assert lines[0] == "[1/1] demo.ipynb: 1 figure(s), running ..."
    assert re.fullmatch(r"\[1/1\] demo\.ipynb: done in \d+ s", lines[1]), lines[1]
    assert re.fullmatch(r"    done    demo\.tiny  \S*demo_tiny\.png", lines[2]), lines[2]
    assert lines[3].startswith("index: ") and lines[3].endswith("index.html (and index.md)")
    assert re.fullmatch(r"done: 1 notebook\(s\), 1 figure\(s\) in \S+ \(\d+ s\); open \S+index\.html",
                        lines[4]), lines[4]
    assert len(lines) == 5, "concise: nothing else on stdout"

    executed = json.loads((out / "notebooks" / "demo.ipynb").read_text())
    params = executed["metadata"]["papermill"]["parameters"]
    assert params["output_dir"] == str(out.resolve() / "figures")
    assert params["results_dir"] == str(out.resolve() / "data")
    assert params["scale"] == "tiny"
    # the notebook ran in the notebooks folder
    assert (out / "data" / "cwd.txt").read_text() == str(demo_manifest.parent.resolve())
    # beside the executed notebook: its nbconvert HTML page and the run record
    page_nb = (out / "notebooks" / "demo.html").read_text()
    assert page_nb.lstrip().lower().startswith("<!doctype html") and "Fixture notebook" in page_nb
    record = json.loads((out / "notebooks" / "demo.run.json").read_text())
    assert record["status"] == "done" and record["error"] is None and record["kernel"] == "repro"
    assert record["tables"] == [] and record["seconds"] > 0

    for ext in ("png", "pdf", "json"):
        assert _nonempty(out / "figures" / f"demo_tiny.{ext}")
    side = json.loads((out / "figures" / "demo_tiny.json").read_text())
    assert side["scale"] == "tiny" and side["source"] == "simulated"
    assert side["title"] == "Fixture timeline (tiny scale) (simulated)"

    md = (out / "index.md").read_text()
    page = (out / "index.html").read_text()
    for text in (md, page):
        assert "demo.tiny" in text and "demo.later" in text
        assert "Demo paper" in text
        assert "figures/demo_tiny.png" in text and "figures/thumbs/demo_tiny.png" in text
        assert "figures/demo_tiny.pdf" in text
        assert "notebooks/demo.html" in text and "notebooks/demo.ipynb" not in text
        assert "A two-op timeline." in text
        assert f"repro {repro.__version__}" in text
        assert "2 figures: 1 done, 1 planned, 0 failed, 0 missing" in text
        assert "generated" not in text.split("\n", 3)[3], "one word per status: done, not generated"
    assert md.index("demo.tiny") < md.index("demo.later")
    assert "| [`demo.tiny`](#demo_tiny) | A tiny timeline | tiny | simulated | done |" in md
    assert "| [`demo.later`](#demo_later) | Something for later | — | — | planned |" in md
    later = page[page.index('id="demo_later"'):]
    later = later[:later.index("</article>")]
    assert 'class="badge planned"' in later and "Something for later" in later and "later.ipynb" in later
    assert "<img" not in later and "demo_later.png" not in later
    assert _nonempty(out / "figures" / "thumbs" / "demo_tiny.png")

    # rebuilding only the index gives the same listing
    (out / "index.md").unlink()
    assert main(["index", "--out", str(out), "--manifest", str(demo_manifest)]) == 0
    assert "figures/demo_tiny.png" in (out / "index.md").read_text()


@pytest.mark.notebook
@pytest.mark.slow
def test_runner_fails_naming_the_missing_figure(demo_manifest, tmp_path, capsys):
    out = tmp_path / "results"
    stale = out / "figures" / "demo_tiny.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale output of an earlier run")
    rc = main(["run", "--out", str(out), "--manifest", str(demo_manifest),
               "--parameters-json", '{"make_figure": false}'])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 1
    assert len(err.splitlines()) == 1
    assert "demo_tiny.png" in err and "demo_tiny.pdf" in err and "demo.tiny" in err
    assert "    failed  demo.tiny  missing demo_tiny.png, demo_tiny.pdf" in captured.out.splitlines()
    assert not stale.exists()
    assert (out / "index.md").is_file(), "the index is written even when the run fails"
    assert "| [`demo.tiny`](#demo_tiny) | A tiny timeline | — | — | failed |" in (out / "index.md").read_text()
    assert json.loads((out / "notebooks" / "demo.run.json").read_text())["status"] == "failed"


@pytest.mark.notebook
@pytest.mark.slow
def test_runner_reports_a_failing_notebook(demo_manifest, tmp_path):
    with pytest.raises(FiguresError, match=r"demo.ipynb failed.*RuntimeError: fixture asked to fail"):
        run(tmp_path / "results", manifest=demo_manifest, parameters={"fail": True},
            say=lambda _msg: None)
    assert (tmp_path / "results" / "notebooks" / "demo.ipynb").is_file()
    assert (tmp_path / "results" / "notebooks" / "demo.html").is_file(), "the traceback is readable as HTML"
    page = (tmp_path / "results" / "index.html").read_text()
    card = page[page.index('<article class="card failed" id="demo_tiny">'):]
    assert "fixture asked to fail" in card[:card.index("</article>")]


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_check_logic_on_fixture(demo_manifest, tmp_path):
    _check_notebook_outputs(demo_manifest, "demo.ipynb", tmp_path / "out")


@pytest.mark.notebook
@pytest.mark.slow
def test_runner_links_the_tables_a_notebook_writes(tmp_path):
    """The run record lists the data/*.csv a notebook created or changed; the card links them."""
    import nbformat

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('output_dir = "figures"\nresults_dir = "data"\nscale = "tiny"',
                                  metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nimport pandas as pd\n"
            "from repro.figures import save_figure\nfrom repro.results.tables import write_table\n"
            "df = pd.DataFrame({'P': [1, 2], 'speedup': [1.0, 1.9]})\n"
            "write_table(df, results_dir, 'demo_tables_points', {})\n"
            "write_table(df, results_dir, 'demo_tables', {})\n"
            "fig, ax = plt.subplots(figsize=(3, 2))\nax.plot(df.P, df.speedup)\n"
            "save_figure(fig, 'demo.tables', output_dir, scale=scale, source='measured')"),
    ]
    nb.metadata["kernelspec"] = {"name": "repro", "display_name": "Python (repro)", "language": "python"}
    nbformat.write(nb, str(nbs / "tables.ipynb"))
    manifest = _write_manifest(nbs, [_entry("demo.tables", "done", "tables.ipynb")], papers={"demo": "Demo"})
    out = tmp_path / "results"
    (out / "data").mkdir(parents=True)
    pd.DataFrame({"x": [1]}).to_csv(out / "data" / "older_table.csv", index=False)  # not this notebook's
    run(out, manifest=manifest, say=lambda _msg: None)
    record = json.loads((out / "notebooks" / "tables.run.json").read_text())
    assert record["tables"] == ["demo_tables", "demo_tables_points"]
    page = (out / "index.html").read_text()
    assert re.findall(r'href="(data/[^"]+)"', page) == ["data/demo_tables.csv", "data/demo_tables_points.csv"]


def test_write_index_without_any_output(demo_manifest, tmp_path):
    md, page = write_index(tmp_path / "empty", manifest=demo_manifest)
    text = md.read_text()
    assert "2 figures: 0 done, 1 planned, 0 failed, 1 missing" in text
    assert "| [`demo.tiny`](#demo_tiny) | A tiny timeline | — | — | missing |" in text
    assert "demo.later" in page.read_text() and 'class="card missing"' in page.read_text()


def test_runner_says_how_to_install_a_missing_kernel(demo_manifest, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "no-kernels-here"))
    rc = main(["run", "--out", str(tmp_path / "o"), "--manifest", str(demo_manifest),
               "--kernel", "no-such-kernel-xyz"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "Jupyter kernel 'no-such-kernel-xyz' is not installed" in err
    assert "-m ipykernel install --sys-prefix --name no-such-kernel-xyz" in err
    assert not (tmp_path / "o" / "notebooks").exists(), "nothing runs without the kernel"


def test_runner_refuses_a_kernel_without_repro(demo_manifest, tmp_path, monkeypatch):
    """A kernel registered under the name but running a Python that lacks repro is found before running."""
    fake_python = tmp_path / "bin" / "python-without-repro"
    fake_python.parent.mkdir()
    fake_python.write_text("#!/bin/sh\nexit 1\n")
    fake_python.chmod(0o755)
    spec_dir = tmp_path / "jupyter" / "kernels" / "repro"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(fake_python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (repro)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    with pytest.raises(FiguresError, match=r"kernel 'repro' runs .*python-without-repro, which cannot "
                                           r"import repro; register it with: .* --name repro "
                                           r'--display-name "Python \(repro\)"'):
        check_kernel("repro")
    # the default kernel of this environment (make install registers it) is fine
    monkeypatch.delenv("JUPYTER_PATH")
    assert KERNEL_NAME == "repro"
    assert (check_kernel() / "kernel.json").is_file()


def test_heartbeat_says_elapsed_time_and_cell(tmp_path):
    import time as _time

    from repro.figures.runner import _heartbeat

    executed = tmp_path / "nb.ipynb"
    executed.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "metadata": {}},
        {"cell_type": "code", "metadata": {"papermill": {"status": "completed"}}},
        {"cell_type": "code", "metadata": {"papermill": {"status": "running"}}},
        {"cell_type": "code", "metadata": {"papermill": {"status": "pending"}}}]}))
    said: list[str] = []
    with _heartbeat("[2/3] nb.ipynb:", executed, said.append, every=0.05):
        _time.sleep(0.3)
    assert said and all(re.fullmatch(r"\[2/3\] nb\.ipynb: running \d+ s, cell 2/3", m) for m in said), said
    n = len(said)
    _time.sleep(0.15)
    assert len(said) == n, "stops with the notebook"
    with _heartbeat("x:", tmp_path / "absent.ipynb", said.append, every=0):
        _time.sleep(0.1)
    assert len(said) == n, "every=0 says nothing"


def test_cli_list_and_bad_input(tmp_path, capsys):
    proc = subprocess.run([sys.executable, "-m", "repro.figures", "list"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for e in load_manifest(REAL_MANIFEST, check_files=False):
        assert e.id in proc.stdout
    assert main(["run", "--out", str(tmp_path), "--parameters-json", "[1]",
                 "--manifest", str(REAL_MANIFEST)]) == 2
    assert "JSON object" in capsys.readouterr().err
    bad = _write_manifest(tmp_path, [_entry("mgwfbp.a", status="wip")])
    assert main(["run", "--out", str(tmp_path / "o"), "--manifest", str(bad)]) == 2
    assert "unknown status" in capsys.readouterr().err


# ------------------------------------------------------------------ the real notebooks, tiny scale

def _real_done_notebooks() -> list[str]:
    """Done notebooks of the real manifest; raises if the manifest is unreadable, invalid or has none."""
    notebooks = done_notebooks(load_manifest(REAL_MANIFEST, check_files=False))
    if not notebooks:
        raise ManifestError(f"{REAL_MANIFEST}: no done notebook")
    return notebooks


def _real_notebook_params() -> list:
    """One param per done notebook. A broken manifest gives one failing param, never zero tests."""
    try:
        return [pytest.param(nb, None, id=nb) for nb in _real_done_notebooks()]
    except Exception as e:  # noqa: BLE001 - reported by the test itself
        return [pytest.param(None, f"{type(e).__name__}: {e}", id="manifest-unreadable")]


def test_real_manifest_yields_notebook_tests():
    """Fast guard (not marked slow): the notebook tests below are generated from a readable manifest."""
    assert _real_done_notebooks()


@pytest.mark.parametrize("text", ["figures: [\n  - id: [unclosed\n", "- not a mapping\n",
                                  "figures:\n  - id: mgwfbp.a\n", None])
def test_a_broken_manifest_gives_a_failing_notebook_test(monkeypatch, tmp_path, text):
    bad = tmp_path / "figures.yaml"
    if text is not None:
        bad.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REAL_MANIFEST", bad)
    params = _real_notebook_params()
    assert len(params) == 1 and params[0].id == "manifest-unreadable"
    assert "ManifestError" in params[0].values[1]
    with pytest.raises(ManifestError):
        test_real_manifest_yields_notebook_tests()


# CI's smoke scale for the notebooks that train: every cell and every figure of the notebook runs, with
# fewer timed steps, epochs and sweep points than the tiny defaults (`make figures` runs those). The
# grids keep every scheduler, model and link a figure draws, so a figure that needs one still fails here.
# The timing samples (repro.studies.timing) run at their fewest pairs (2) and short blocks here.
_SMOKE_TIMING = {"timing_pairs": 2, "timing_block_steps": 2}
SMOKE_PARAMETERS: dict[str, dict] = {
    "mgwfbp_training.ipynb": {"steps": 4, "warmup_steps": 2, "convergence_epochs": 1,
                              "threshold_sweep_bytes": [16384, 262144],
                              "allreduce_sizes_bytes": [4096, 262144, 4194304], **_SMOKE_TIMING},
    "validation.ipynb": {"steps": 5, "warmup_steps": 2, "contention_repeats": 3},
    "compare_schedulers.ipynb": {"steps": 4},
    "omgs_training.ipynb": {"convergence_epochs": 1, "steps": 4, "seeds": [0, 1],  # two seeds: the spread is drawn
                            **_SMOKE_TIMING},
    "osp_training.ipynb": {"epochs": 1, "seeds": [0, 1], **_SMOKE_TIMING},  # two seeds: medians and the spread
    "dear_training.ipynb": {"steps": 4, "search_trials": 4, "search_seeds": 2, "primitive_repeats": 2,
                            "threshold_sweep_bytes": [8192, 131072], **_SMOKE_TIMING},
}


def test_smoke_parameters_are_declared_by_their_notebooks():
    """Fast guard: a renamed parameter must not make the smoke run fail late (or silently run the defaults)."""
    import papermill

    for notebook, params in SMOKE_PARAMETERS.items():
        declared = set(papermill.inspect_notebook(str(REAL_MANIFEST.parent / notebook)))
        assert set(params) <= declared, (notebook, set(params) - declared)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("notebook, manifest_error", _real_notebook_params())
def test_real_notebook_makes_its_declared_figures(notebook, manifest_error, tmp_path):
    if manifest_error is not None:
        pytest.fail(f"cannot list the real notebooks: {manifest_error}")
    _check_notebook_outputs(REAL_MANIFEST, notebook, tmp_path / "results", SMOKE_PARAMETERS.get(notebook))


def test_real_index_lists_every_done_figure_with_status(tmp_path):
    from repro.figures.manifest import load_manifest
    from repro.figures.runner import write_index

    md, html = write_index(tmp_path)
    md_text, html_text = Path(md).read_text(), Path(html).read_text()
    entries = load_manifest()
    assert sum(e.done for e in entries) >= 11
    for e in entries:  # nothing ran in tmp_path: done figures are missing here, the others planned
        state = "missing" if e.done else "planned"
        assert re.search(rf"^\| \[`{re.escape(e.id)}`\]\(#{e.stem}\) \|.*\| {state} \|$", md_text, re.M), e.id
        assert f'<article class="card {state}" id="{e.stem}">' in html_text, e.id
