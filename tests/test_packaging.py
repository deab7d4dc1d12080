"""The package as a user installs it: a wheel carries its data, and the README example runs from it."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

README_EXAMPLE = """
from repro.trace import load_trace
from repro.presets import preset
from repro.planners import make_plan
from repro.sim import simulate

trace = load_trace("resnet50_b32_v100-estimate")
cost = preset("10gbe-v100", 16)
plan = make_plan("mgwfbp", trace, cost)
print(plan.num_buckets, simulate(trace, plan, cost).iteration_s)
"""


def test_the_readme_example_is_the_one_in_the_readme():
    assert README_EXAMPLE.strip() in (ROOT / "README.md").read_text()


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
