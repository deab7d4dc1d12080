"""The figure gallery (results/index.html, index.md): cards, status words, links, tables, a real browser.

A results folder is fabricated in tmp_path (figures saved with save_figure, tables with write_table,
an "executed" notebook with papermill's metadata, run records as the runner writes them), so these
tests take seconds and need no kernel. The browser test renders the page in headless Chromium: it is
skipped when no Chromium/Chrome binary is found, except under CI (CI set), where it fails.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

# the notebooks extra; without it (a GPU node set up for `pytest -m gpu` alone) this file is skipped, not
# a collection error that stops every other file's tests
nbformat = pytest.importorskip("nbformat")
import yaml  # noqa: E402
from PIL import Image  # noqa: E402

from repro.figures import save_figure  # noqa: E402
from repro.figures.gallery import (  # noqa: E402
    STATES,
    collect_cards,
    figure_tables,
    write_index,
    write_run_record,
)
from repro.figures.manifest import load_manifest  # noqa: E402
from repro.results.tables import write_table  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


# ------------------------------------------------------------------------------------------ fixture

def _figure(out: Path, fig_id: str, size: tuple[float, float], **side) -> None:
    fig, ax = plt.subplots(figsize=size)
    ax.plot([1, 2, 4, 8, 16], [1, 1.9, 3.6, 6.5, 11], marker="o", label="MG-WFBP")
    ax.plot([1, 2, 4, 8, 16], [1, 1.6, 2.7, 4.1, 5.5], marker="s", label="WFBP")
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup")
    ax.legend(loc="upper left")
    ax.set_title(fig_id)
    with warnings.catch_warnings():  # the wide one is meant to be wide
        warnings.simplefilter("ignore", UserWarning)
        save_figure(fig, fig_id, out / "figures", scale="tiny", source="simulated",
                    caption=f"Caption of {fig_id}.")
    plt.close(fig)
    if side:  # what save_figure may record later (e.g. the tables a figure is drawn from)
        p = out / "figures" / f"{fig_id.replace('.', '_')}.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), **side}))


def _executed_notebook(path: Path, start: dt.datetime, end: dt.datetime) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Demo notebook"),
                nbformat.v4.new_code_cell("print('hello from the demo')", execution_count=1,
                                          outputs=[nbformat.v4.new_output("stream", text="hello from the demo\n")])]
    nb.metadata["kernelspec"] = {"name": "repro", "display_name": "Python (repro)", "language": "python"}
    nb.metadata["papermill"] = {"start_time": start.isoformat(), "end_time": end.isoformat(),
                                "parameters": {"scale": "tiny"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


@pytest.fixture
def fake_run(tmp_path) -> tuple[Path, Path]:
    """(manifest, out): one paper's figures in every state, as a run of two notebooks leaves them."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for nb in ("sim.ipynb", "train.ipynb", "broken.ipynb", "notrun.ipynb"):
        (nbs / nb).write_text("{}")
    figures = [
        # sim.ipynb: tables found by name (stem and stem_*), and by the sidecar's list
        ("demo.speedup", "sim.ipynb", "done", "Simulated speedup vs workers"),
        ("demo.layers", "sim.ipynb", "done", "Gradient size per layer"),
        ("demo.wide", "sim.ipynb", "done", "A very wide figure"),
        # train.ipynb: no run record, tables found through papermill's start/end times
        ("demo.curve", "train.ipynb", "done", "Measured training curve | with a pipe"),
        ("demo.broken", "broken.ipynb", "done", "A figure whose notebook failed"),
        ("demo.notrun", "notrun.ipynb", "done", "A figure whose notebook has not run here"),
        ("demo.later", "later.ipynb", "planned", "Something for later"),
        ("other.future", "future.ipynb", "planned", "A figure of another paper"),
    ]
    manifest = nbs / "figures.yaml"
    manifest.write_text(yaml.safe_dump({
        "papers": {"demo": "Demo paper (2024)", "other": "Other paper"},
        "figures": [{"id": i, "notebook": nb, "stem": i.replace(".", "_"), "status": s, "kind": "simulated",
                     "title": t} for i, nb, s, t in figures]}, sort_keys=False))

    out = tmp_path / "results"
    table = pd.DataFrame({"P": [1, 2, 4], "speedup": [1.0, 1.8, 3.2]})
    t0 = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)
    # sim.ipynb, with a run record listing what it wrote
    _figure(out, "demo.speedup", (5, 3.2))
    _figure(out, "demo.layers", (4, 5), tables=["demo_layer_table.csv", "data/demo_absent"])
    _figure(out, "demo.wide", (14, 2.4))
    for name in ("demo_speedup", "demo_speedup_summary", "demo_layer_table", "demo_unrelated"):
        write_table(table, out / "data", name, {"note": name})
        meta = out / "data" / f"{name}.json"  # written during sim.ipynb's run, ten minutes ago
        data = json.loads(meta.read_text())
        data["environment"]["time_utc"] = (t0 + dt.timedelta(seconds=20)).isoformat(timespec="seconds")
        meta.write_text(json.dumps(data))
    _executed_notebook(out / "notebooks" / "sim.ipynb", t0, t0 + dt.timedelta(seconds=30))
    write_run_record(out, "sim.ipynb", {"status": "done", "error": None, "seconds": 30.0,
                                        "tables": ["demo_layer_table", "demo_speedup", "demo_speedup_summary",
                                                   "demo_unrelated"]})
    # train.ipynb, executed by hand (no run record): its tables are those written during its run
    _figure(out, "demo.curve", (5, 3.2))
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    write_table(table, out / "data", "demo_training_runs", {})
    write_table(table, out / "data", "demo_training_epochs", {})
    _executed_notebook(out / "notebooks" / "train.ipynb", start, dt.datetime.now(dt.timezone.utc)
                       + dt.timedelta(seconds=1))
    # broken.ipynb ran and failed before saving its figure
    _executed_notebook(out / "notebooks" / "broken.ipynb", t0, t0 + dt.timedelta(seconds=3))
    write_run_record(out, "broken.ipynb", {"status": "failed", "tables": [],
                                           "error": "broken.ipynb failed in cell 3: RuntimeError: boom"})
    return manifest, out


# ------------------------------------------------------------------------------------------- links

class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("href", "src") and v is not None:
                self.links.append((tag, v))
            if k == "id" and v:
                self.ids.add(v)


def _html_links(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def _md_links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))


def _broken_links(page: Path, links: list[str], ids: set[str]) -> list[str]:
    """Links that are not relative paths to existing files (or anchors present in the page)."""
    bad = []
    for link in links:
        parts = urlsplit(link)
        if parts.scheme or parts.netloc or link.startswith("/"):
            bad.append(f"{link} (not relative: the page must work from the file system)")
        elif not parts.path:
            if parts.fragment not in ids:
                bad.append(f"{link} (no element with that id)")
        elif not (page.parent / unquote(parts.path)).is_file():
            bad.append(f"{link} (no such file)")
    return bad


def _cards(page_text: str) -> dict[str, str]:
    """id of the figure -> the HTML of its card."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<article class="card [a-z]+" id="([^"]+)">.*?</article>',
                                                        page_text, re.S)}


# ------------------------------------------------------------------------------------------ tests

@pytest.mark.slow
def test_gallery_cards_statuses_and_links(fake_run):
    manifest, out = fake_run
    md, page = write_index(out, manifest=manifest)
    text = page.read_text()

    links = _html_links(page)
    assert not _broken_links(page, [v for _, v in links.links], links.ids)
    md_links = _md_links(md)
    assert not _broken_links(md, md_links, {e.stem for e in load_manifest(manifest, check_files=False)})
    assert any(link.endswith(".csv") for link in md_links)

    # one card per figure, grouped by paper in manifest order, one status word each
    cards = _cards(text)
    assert list(cards) == ["demo_speedup", "demo_layers", "demo_wide", "demo_curve", "demo_broken",
                           "demo_notrun", "demo_later", "other_future"]
    assert text.index("Demo paper (2024)") < text.index('id="demo_speedup"') < text.index("Other paper")
    expected = {"demo_speedup": "done", "demo_layers": "done", "demo_wide": "done", "demo_curve": "done",
                "demo_broken": "failed", "demo_notrun": "missing", "demo_later": "planned",
                "other_future": "planned"}
    for stem, state in expected.items():
        assert f'class="card {state}"' in cards[stem], stem
        assert re.findall(r'<span class="badge (\w+)"', cards[stem]) == [state], stem
    assert "generated" not in text and "generated" not in md.read_text().split("\n", 3)[3]

    # a done card: thumbnail linking to the PNG, PDF, its tables, the notebook as HTML
    card = cards["demo_speedup"]
    assert 'href="figures/demo_speedup.png"' in card and 'src="figures/thumbs/demo_speedup.png"' in card
    assert 'href="figures/demo_speedup.pdf"' in card
    assert "scale: tiny" in card and "source: simulated" in card
    assert 'href="notebooks/sim.html"' in card and "Caption of demo.speedup." in card
    links_part = card[:card.index('<details class="more">')]
    assert re.findall(r'href="(data/[^"]+)"', links_part) == ["data/demo_speedup.csv", "data/demo_speedup_summary.csv"]
    # found by name: the notebook's other tables are listed too, folded away (it may use them)
    more = card[card.index('<details class="more">'):]
    more = more[:more.index("</details>")]
    assert "2 other table(s) of sim.ipynb" in more
    assert re.findall(r'href="(data/[^"]+)"', more) == ["data/demo_layer_table.csv", "data/demo_unrelated.csv"]
    # the sidecar's list wins; a listed table that does not exist is said, not linked
    assert re.findall(r'href="(data/[^"]+)"', cards["demo_layers"]) == ["data/demo_layer_table.csv"]
    assert "tables not found: demo_absent" in cards["demo_layers"]
    # no sidecar list, no name match: the notebook's tables, labelled as such
    assert re.findall(r'href="(data/[^"]+)"', cards["demo_curve"]) == [
        "data/demo_training_epochs.csv", "data/demo_training_runs.csv"]
    assert "tables of train.ipynb" in cards["demo_curve"]
    # failed: the error and the rendered notebook; planned: title and notebook, no picture
    assert "RuntimeError: boom" in cards["demo_broken"] and 'href="notebooks/broken.html"' in cards["demo_broken"]
    assert "<img" not in cards["demo_broken"] and "<img" not in cards["demo_later"]
    assert "Something for later" in cards["demo_later"] and "later.ipynb" in cards["demo_later"]
    assert "notrun.ipynb" in cards["demo_notrun"] and "href=" not in cards["demo_notrun"]

    # no link opens raw JSON; notebooks are nbconvert HTML pages next to the executed .ipynb
    assert not [v for _, v in links.links if v.endswith((".ipynb", ".json"))]
    assert not [v for v in md_links if v.endswith((".ipynb", ".json"))]
    nb_html = (out / "notebooks" / "sim.html").read_text()
    assert nb_html.lstrip().lower().startswith("<!doctype html") and "hello from the demo" in nb_html

    # summary table: id, title, scale, source, status for every figure
    summary = text[text.index('<table class="summary">'):text.index("</table>")]
    assert re.findall(r"<th>(\w+)</th>", summary) == ["id", "title", "scale", "source", "status"]
    assert summary.count("<tr>") == 1 + len(expected)
    md_text = md.read_text()
    assert "| id | title | scale | source | status |" in md_text
    assert "| [`demo.curve`](#demo_curve) | Measured training curve \\| with a pipe | tiny | simulated | done |" \
        in md_text
    assert "8 figures: 4 done, 2 planned, 1 failed, 1 missing" in text


@pytest.mark.slow
def test_thumbnails_are_downscaled_and_refreshed(fake_run):
    manifest, out = fake_run
    write_index(out, manifest=manifest)
    for stem in ("demo_speedup", "demo_layers", "demo_wide"):
        full = Image.open(out / "figures" / f"{stem}.png")
        thumb = Image.open(out / "figures" / "thumbs" / f"{stem}.png")
        assert thumb.width <= 640 and thumb.height <= 520
        assert thumb.mode == "P", "palette PNG: a few times smaller than true colour"
        assert (out / "figures" / "thumbs" / f"{stem}.png").stat().st_size < 60_000
        assert thumb.width < full.width
        assert abs(thumb.width / thumb.height - full.width / full.height) < 0.05, "aspect ratio kept"
    # a figure redrawn later gets a new thumbnail
    thumb = out / "figures" / "thumbs" / "demo_wide.png"
    before = thumb.read_bytes()
    _figure(out, "demo.wide", (4, 4))
    os.utime(out / "figures" / "demo_wide.png", ns=(thumb.stat().st_mtime_ns + 10**9,) * 2)
    write_index(out, manifest=manifest)
    assert thumb.read_bytes() != before
    full = Image.open(out / "figures" / "demo_wide.png")
    assert abs(Image.open(thumb).width / Image.open(thumb).height - full.width / full.height) < 0.05
    assert full.width / full.height < 1.5, "the thumbnail shows the redrawn, near-square figure"


@pytest.mark.slow
def test_figure_tables_rules(fake_run):
    manifest, out = fake_run
    entries = {e.id: e for e in load_manifest(manifest, check_files=False)}
    side = {"tables": ["demo_unrelated", "demo_unrelated.csv"]}
    assert figure_tables(out, entries["demo.speedup"], side) == (["demo_unrelated"], [], "sidecar")
    assert figure_tables(out, entries["demo.speedup"], {}) == (
        ["demo_speedup", "demo_speedup_summary"], [], "name")
    assert figure_tables(out, entries["demo.wide"], {})[2] == "notebook"
    assert figure_tables(out, entries["demo.curve"], {}) == (
        ["demo_training_epochs", "demo_training_runs"], [], "notebook")
    assert figure_tables(out, entries["demo.notrun"], {}) == ([], [], "")
    # an empty sidecar list means "not recorded", not "no tables"
    assert figure_tables(out, entries["demo.speedup"], {"tables": []})[2] == "name"


@pytest.mark.slow
def test_states_are_one_vocabulary(fake_run):
    manifest, out = fake_run
    cards = collect_cards(out, load_manifest(manifest, check_files=False))
    assert {c.state for c in cards} | {"interrupted"} == set(STATES) == {"done", "planned", "failed", "interrupted",
                                                                          "missing"}
    # a run stopped by Ctrl-C before the figure was made: interrupted, not failed
    (out / "notebooks" / "broken.run.json").write_text(json.dumps({"status": "interrupted", "tables": [],
                                                                   "error": "broken.ipynb was interrupted (Ctrl-C)"}))
    cards = {c.entry.id: c for c in collect_cards(out, load_manifest(manifest, check_files=False))}
    assert cards["demo.broken"].state == "interrupted" and "Ctrl-C" in cards["demo.broken"].error
    # a failed notebook that still saved one of its figures: the figure is done, the card says why
    (out / "notebooks" / "sim.run.json").write_text(json.dumps({"status": "failed", "error": "late failure",
                                                                "tables": []}))
    cards = {c.entry.id: c for c in collect_cards(out, load_manifest(manifest, check_files=False))}
    assert cards["demo.speedup"].state == "done" and cards["demo.speedup"].error == "late failure"


# ----------------------------------------------------------------------------------------- browser

def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_browser() -> str | None:
    """A Chromium or Chrome binary: $CHROMIUM if set, else the first of BROWSERS on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env) or (env if Path(env).is_file() else None)
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _require_browser() -> str:
    browser = find_browser()
    if browser is None:
        reason = (f"no headless browser found (looked for $CHROMIUM, {', '.join(BROWSERS)}); install one: "
                  "apt-get install chromium (make install does this when run as root)")
        if _in_ci():
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    return browser


def _chromium(browser: str, tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--no-default-browser-check", "--disable-extensions", "--mute-audio",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_gallery_in_headless_browser(fake_run, tmp_path):
    browser = _require_browser()
    manifest, out = fake_run
    _, page = write_index(out, manifest=manifest)

    shot = Path(os.environ.get("GALLERY_SCREENSHOT") or tmp_path / "gallery.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.unlink(missing_ok=True)
    proc = _chromium(browser, tmp_path, f"--screenshot={shot}", "--window-size=1280,1600",
                     "--virtual-time-budget=5000", page.as_uri())
    assert shot.is_file(), f"no screenshot from {browser}: {proc.stderr[-2000:]}"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 1600)
    pixels = np.asarray(img.resize((320, 400)))
    non_white = float((pixels.min(axis=2) < 235).mean())
    assert non_white > 0.03, f"screenshot is nearly blank ({non_white:.1%} non-white pixels)"
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    assert colours > 200, f"screenshot has {colours} colours: too few to show figures"

    # every <img> actually loads in the browser: a probe copy of the page reports broken images
    probe = out / "_probe.html"
    probe_js = ("<script>window.addEventListener('load',function(){var b=[],n=0;"
                "document.querySelectorAll('img').forEach(function(i){n++;"
                "if(!i.complete||i.naturalWidth===0)b.push(i.getAttribute('src'));});"
                "var p=document.createElement('pre');p.id='probe';"
                "p.textContent='images='+n+' broken='+JSON.stringify(b);document.body.appendChild(p);});</script>")
    probe.write_text(page.read_text().replace(' loading="lazy"', "").replace("</body>", probe_js + "</body>"))
    try:
        proc = _chromium(browser, tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    finally:
        probe.unlink()
    m = re.search(r'<pre id="probe">images=(\d+) broken=(.*?)</pre>', proc.stdout)
    assert m, f"probe did not run: {proc.stdout[-500:]} {proc.stderr[-1000:]}"
    assert int(m.group(1)) == 4 and json.loads(m.group(2).replace("&quot;", '"')) == []


def test_browser_test_fails_in_ci_without_a_browser(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "find_browser", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        _require_browser()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        _require_browser()
