"""The documentation: the README stays a short first read, and the mkdocs site (guides + API reference
generated from the docstrings) builds in strict mode."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _readme_lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def test_readme_is_a_short_first_read():
    lines = _readme_lines()
    assert len(lines) < 220, f"README.md has {len(lines)} lines; move detail to docs/ (keep it under 220)"
    head = "\n".join(lines[:40])
    assert "make test" in head and "make figures" in head, "the two commands come first (first 40 lines)"
    assert re.search(r"^#+\s*(table of )?contents\b", "\n".join(lines), re.I | re.M), \
        "README.md needs a table of contents (a '## Contents' heading)"
    text = "\n".join(lines)
    assert "../shared" not in text, "README.md must not point outside the repository (cite papers by name)"


def test_readme_links_to_docs_pages_that_exist():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert links, "README.md should link to the docs pages"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_anchors_match_its_headings():
    text = README.read_text(encoding="utf-8")
    headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#{2,6}\s+(.+)$", text, re.M)}
    anchors = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert anchors <= headings, f"table-of-contents anchors without a heading: {sorted(anchors - headings)}"


def test_mkdocs_nav_names_every_page_and_only_existing_ones():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)

    nav = set(pages(config["nav"]))
    docs = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert nav <= docs, f"nav names missing pages: {sorted(nav - docs)}"
    assert docs <= nav, f"pages not in the nav: {sorted(docs - nav)}"


def test_the_example_parameter_file_names_only_parameters_of_its_notebook():
    """README's `papermill ... -f notebooks/validation.yaml` must keep working."""
    papermill = pytest.importorskip("papermill")
    params = yaml.safe_load((ROOT / "notebooks" / "validation.yaml").read_text(encoding="utf-8"))
    known = papermill.inspect_notebook(str(ROOT / "notebooks" / "validation.ipynb"))
    unknown = set(params) - set(known)
    assert not unknown, f"notebooks/validation.yaml names parameters validation.ipynb lacks: {sorted(unknown)}"


@pytest.mark.slow
def test_mkdocs_builds_in_strict_mode(tmp_path):
    missing = [m for m in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material")
               if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} not installed under CI: pip install -e '.[docs]'")
        pytest.skip(f"{missing} not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    assert (tmp_path / "site" / "api" / "trace" / "index.html").is_file()
    assert "load_trace" in (tmp_path / "site" / "api" / "trace" / "index.html").read_text(encoding="utf-8")
