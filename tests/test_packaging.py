"""The package as a user installs it: a wheel carries its data, and the README example runs from it."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

README_EXAMPLE = """
from repro.core.trace import load_trace
from repro.costs.presets import preset
from repro.core.planners import make_plan
from repro.core.simulate import simulate

trace = load_trace("resnet50_b32_v100-estimate")
cost = preset("10gbe-v100", 16)
plan = make_plan("mgwfbp", trace, cost)
print(plan.num_buckets, simulate(trace, plan, cost).iteration_s)
"""


def test_the_readme_example_is_the_one_in_the_readme():
    assert README_EXAMPLE.strip() in (ROOT / "README.md").read_text()


def _data_files() -> set[str]:
    """The files under data/ that ship (all but local datasets and bytecode), relative to data/."""
    data = ROOT / "data"
    return {p.relative_to(data).as_posix() for p in data.rglob("*") if p.is_file()
            and p.relative_to(data).parts[0] not in ("datasets", "__pycache__")}


def test_the_shipped_data_live_in_data_and_every_package_is_listed():
    """data/ holds the shipped data (a README per kind), repro/shipped is gone from the source tree, and
    pyproject.toml's package list (not found, because data/ is mapped to repro.shipped) names every
    package under repro/."""
    import tomllib

    from setuptools import find_packages

    assert not (ROOT / "repro" / "shipped").exists()
    for kind in ("traces", "paper_numbers", "calibration", "grids", "claims", "datasets"):
        assert (ROOT / "data" / kind / "README.md").is_file(), kind
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"repro.shipped": "data"}
    assert sorted(config["packages"]) == sorted(find_packages(str(ROOT), include=["repro*"]) + ["repro.shipped"])


def test_the_checkout_reads_the_shipped_data_from_data():
    """Installed editable (or a checkout on sys.path), repro.core.paths resolves data/ of the checkout."""
    from repro.core.paths import paper_numbers_path, shipped_dir, traces_dir

    assert shipped_dir().resolve() == (ROOT / "data").resolve()
    assert traces_dir().resolve() == (ROOT / "data" / "traces").resolve()
    assert paper_numbers_path("omgs_iteration_times").is_file()


@pytest.mark.slow
def test_a_wheel_carries_traces_paper_numbers_and_types_and_runs_the_readme_example(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next(wheels.glob("repro-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "repro/py.typed" in names
    assert "repro/shipped/traces/resnet50_b32_v100-estimate.json" in names
    assert "repro/shipped/paper_numbers/mgwfbp_conference_speedup.csv" in names
    assert {f"repro/shipped/grids/{p}.yaml" for p in ("mgwfbp", "omgs", "dear", "osp")} <= set(names)
    assert {f"repro/shipped/claims/{p}.yaml" for p in ("mgwfbp", "omgs", "dear", "osp")} <= set(names)
    # Every file of the top-level data/ folder, and nothing else, is the wheel's repro/shipped (local
    # datasets stay out).
    shipped = {n.removeprefix("repro/shipped/") for n in names if n.startswith("repro/shipped/")}
    assert shipped == _data_files(), shipped ^ _data_files()
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: torch" in meta
    # A clean environment with the wheel and the torch-free core's one dependency (numpy): the
    # README example runs, from a folder that is not the checkout.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "numpy"], check=True, capture_output=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    out = subprocess.run([str(py), "-c", README_EXAMPLE], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    buckets, seconds = out.stdout.split()
    assert int(buckets) >= 1 and 0 < float(seconds) < 1


def test_the_license_is_an_spdx_string_that_the_required_setuptools_reads():
    """PEP 639: ``license = "MIT"``, not the table ``{text = ...}`` setuptools deprecates (refused from
    Feb 2027); setuptools reads the string from 77 on, so the build system asks for at least that."""
    import tomllib

    from packaging.requirements import Requirement

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["project"]["license"] == "MIT"
    setuptools = next(Requirement(r) for r in config["build-system"]["requires"] if r.startswith("setuptools"))
    assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains("77.0")
