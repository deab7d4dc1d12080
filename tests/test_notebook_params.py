"""Notebooks as papermill users run them: documented parameters, string lists, one vocabulary,
paths resolved against the repository, the project's kernel, no references outside the repository."""

import json
import re
from pathlib import Path

import pytest

from repro.figures.params import (
    ParameterError, default_world_sizes, parse_choice, parse_list, repo_root, resolve_path)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNELSPEC = {"name": "repro", "display_name": "Python (repro)", "language": "python"}

# One vocabulary: each name means one thing in every notebook (and has one type).
VOCABULARY = {
    "models": "list[str]", "schedulers": "list[str]", "workers": "list[int]", "world_sizes": "list[int]",
    "network_presets": "list[str]", "link_rates": "list[str]", "link_rate": "str", "threshold_bytes": "int",
    "threshold_sweep_bytes": "list[int]", "batch_size": "int", "steps": "int", "warmup_steps": "int",
    "read_only": "bool", "scale": "str", "output_dir": "str", "results_dir": "str", "cost_mode": "str",
}
RETIRED = {"networks", "world_size", "thresholds_bytes", "emulate_bandwidth", "timeline_network", "solvers"}


# ------------------------------------------------------------------------------------------ parse_list

@pytest.mark.parametrize("value, item_type, expected", [
    ([4, 16], int, [4, 16]),
    ((4, 16), int, [4, 16]),
    ("[4, 16]", int, [4, 16]),
    ("4,16", int, [4, 16]),
    (" [ 4 ,16 ] ", int, [4, 16]),
    (["4", "16"], int, [4, 16]),
    (8, int, [8]),
    ('["resnet50", "vgg16"]', str, ["resnet50", "vgg16"]),
    ("[resnet50, vgg16]", str, ["resnet50", "vgg16"]),
    ("resnet50", str, ["resnet50"]),
    ("[10gbe-derived, 56gbib-derived]", str, ["10gbe-derived", "56gbib-derived"]),
    ("[0.5, 1e-3]", float, [0.5, 1e-3]),
])
def test_parse_list_accepts_lists_and_papermill_strings(value, item_type, expected):
    assert parse_list(value, item_type, name="p") == expected


@pytest.mark.parametrize("value, item_type, match", [
    ("[4, 16", int, r"workers: cannot parse '\[4, 16' as a list"),
    ("[4, x]", int, r"workers: 'x' is not an integer"),
    ("[4.5]", int, r"workers: 4.5 is not an integer"),
    ("[true]", int, r"workers: True is not an integer"),
    ("{a: 1}", int, r"workers: expected a list, got a mapping"),
    ("[]", int, r"workers: the list is empty"),
    ({"a": 1}, int, r"workers: expected a list, got dict"),
    ("[[4]]", int, r"workers: \[4\] is not an integer"),
    ("[vgg16, 1]", str, r"workers: 1 is not a non-empty string"),
    ("[vgg16, null]", str, r"workers: None is not a non-empty string"),
])
def test_parse_list_rejects_with_one_line_naming_the_parameter(value, item_type, match):
    with pytest.raises(ParameterError, match=match) as e:
        parse_list(value, item_type, name="workers")
    assert "\n" not in str(e.value)


def test_parse_list_choices_checks_and_empty():
    assert parse_list("[]", int, name="w", allow_empty=True) == []
    assert parse_list("", str, name="w", allow_empty=True) == []
    with pytest.raises(ParameterError, match="schedulers: unknown value 'nope'; choose from wfbp, mgwfbp"):
        parse_list("[wfbp, nope]", str, name="schedulers", choices=["wfbp", "mgwfbp"])
    with pytest.raises(ParameterError, match="workers: 1 is not allowed: at least 2"):
        parse_list("[1, 4]", int, name="workers", check=lambda p: p >= 2, check_msg="at least 2")
    with pytest.raises(ParameterError, match="scale: unknown value 'huge'"):
        parse_choice("huge", ("tiny", "paper"), name="scale")


# ------------------------------------------------------------------------------------ paths and cores

def test_relative_paths_resolve_against_the_repository_wherever_we_start(tmp_path, monkeypatch):
    assert repo_root() == ROOT
    for cwd in (tmp_path, ROOT / "notebooks", ROOT):
        monkeypatch.chdir(cwd)
        assert resolve_path("results/figures") == ROOT / "results" / "figures"
    assert resolve_path(tmp_path / "x") == tmp_path / "x"
    assert resolve_path("out", base=tmp_path) == tmp_path / "out"
    with pytest.raises(ParameterError, match="empty"):
        resolve_path("")


def test_default_world_sizes_never_exceed_the_cores():
    assert default_world_sizes(cpus=1) == [1]
    assert default_world_sizes(cpus=2) == [1, 2]
    assert default_world_sizes(cpus=3) == [1, 2]
    assert default_world_sizes(cpus=16) == [1, 2, 4]
    from repro.studies.common import available_cpus

    assert max(default_world_sizes()) <= available_cpus()


# ------------------------------------------------------------------------------------------ notebooks

def _parameters(nb_path: Path):
    from papermill.inspection import inspect_notebook

    return inspect_notebook(str(nb_path))


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {"mgwfbp_simulation.ipynb", "mgwfbp_training.ipynb", "validation.ipynb"}


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_parameter_is_typed_documented_and_in_the_vocabulary(nb_path):
    params = _parameters(nb_path)
    assert params, f"{nb_path.name}: no parameters cell"
    for name, p in params.items():
        assert p["inferred_type_name"] not in ("None", ""), f"{nb_path.name}: {name} has no type annotation"
        assert p["help"].strip(), f"{nb_path.name}: {name} has no inline comment"
        assert name not in RETIRED, f"{nb_path.name}: {name} is a retired parameter name"
        if name in VOCABULARY:
            assert p["inferred_type_name"] == VOCABULARY[name], (nb_path.name, name, p["inferred_type_name"])
    for name in ("scale", "output_dir", "results_dir"):
        assert name in params, f"{nb_path.name}: the figure runner sets {name}"
    for name in ("output_dir", "results_dir"):
        default = json.loads(params[name]["default"])
        assert not Path(default).is_absolute() and ".." not in Path(default).parts, (name, default)


@pytest.mark.parametrize("nb_path", [*NOTEBOOKS, ROOT / "tests" / "fixtures" / "tiny_figure.ipynb"],
                         ids=lambda p: p.name)
def test_kernel_is_the_projects_own(nb_path):
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    assert nb["metadata"]["kernelspec"] == KERNELSPEC


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_refer_only_to_files_in_the_repository(nb_path):
    text = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in json.loads(nb_path.read_text(encoding="utf-8"))["cells"])
    assert "shared/papers" not in text and "repro/shipped/" not in text  # the shipped data are in data/
    assert not re.search(r"[\"']\.\./", text), "relative paths leaving the repository"
    for path in re.findall(r"(?<![\w/.])data/(?:traces|paper_numbers|calibration|grids|claims)[\w/.-]*\w", text):
        assert (ROOT / path).exists(), path


def _kernel() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    return "repro" if "repro" in KernelSpecManager().find_kernel_specs() else "python3"


@pytest.mark.notebook
@pytest.mark.slow
def test_papermill_string_lists_run_and_bad_lists_fail_clearly(tmp_path, monkeypatch):
    """The issue's command: `papermill mgwfbp_simulation.ipynb out.ipynb -p workers "[4, 16]"` (strings)."""
    import papermill as pm

    monkeypatch.chdir(ROOT)  # papermill started from the repository root
    out = tmp_path / "out.ipynb"
    params = {"workers": "[4, 16]", "models": "[googlenet]", "network_presets": "[10gbe-derived]",
              "schedulers": "[wfbp, mgwfbp, optimal]", "hist_models": "[googlenet]", "paper_check": False,
              "output_dir": str(tmp_path / "figures"), "results_dir": "relative-results-dir-of-the-test"}
    try:
        pm.execute_notebook(str(ROOT / "notebooks" / "mgwfbp_simulation.ipynb"), str(out), parameters=params,
                            kernel_name=_kernel(), progress_bar=False)
        written = ROOT / "relative-results-dir-of-the-test"
        assert (written / "mgwfbp_sim_speedup.csv").is_file()  # relative to the repository, not ../
        # both cost modes in the claims' tables (issue 35); the gap summary has an "all" row per mode
        import pandas as pd

        assert set(pd.read_csv(written / "mgwfbp_sim_speedup.csv").cost_mode) == {"paper", "calibrated"}
        summary = pd.read_csv(written / "mgwfbp_optimal_gap_summary.csv")
        assert sorted(summary[summary.model == "all"].cost_mode) == ["calibrated", "paper"]
        assert json.loads((written / "mgwfbp_sim_speedup.json").read_text())["params"]["calibrated_omitted"] == {}
        assert (tmp_path / "figures" / "mgwfbp_sim_speedup.png").is_file()
        executed = json.loads(out.read_text())
        stderr = [o.get("text", "") for c in executed["cells"] for o in c.get("outputs", [])
                  if o.get("name") == "stderr"]
        text = "".join("".join(t) if isinstance(t, list) else t for t in stderr)
        assert "DeprecationWarning" not in text and "FutureWarning" not in text, text
    finally:
        import shutil

        shutil.rmtree(ROOT / "relative-results-dir-of-the-test", ignore_errors=True)
    with pytest.raises(pm.PapermillExecutionError, match="workers: cannot parse"):
        pm.execute_notebook(str(ROOT / "notebooks" / "mgwfbp_simulation.ipynb"), str(out),
                            parameters={**params, "workers": "[4, 16", "results_dir": str(tmp_path / "d")},
                            kernel_name=_kernel(), progress_bar=False)
