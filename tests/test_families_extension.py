"""A family is a folder that registers itself, and a new one edits no existing file.

The example family of docs/extending.md (``blocking``) is written from the page's code blocks into a
temporary package, installed through an entry point of group ``repro.families``, and then listed, planned,
simulated and trained with (against PyTorch DDP) in fresh processes; the core and every family's
torch-free modules are checked to stay torch-free.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"


def write_example_family(where: Path) -> Path:
    """The files of docs/extending.md's example (each code block after ``<!-- file: PATH -->``) under
    ``where``, with an installed distribution's metadata naming the module under ``repro.families``."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", text, re.S)
    assert {p for p, _ in blocks} == {f"repro_blocking/{f}" for f in
                                      ("__init__.py", "planners.py", "simulate.py", "executor.py")}
    for path, code in blocks:
        (where / path).parent.mkdir(parents=True, exist_ok=True)
        (where / path).write_text(code, encoding="utf-8")
    info = where / "repro_blocking-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: repro-blocking\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[repro.families]\nblocking = repro_blocking\n")
    return where


def _run(code: str, path: Path, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_core_imports_nothing_outside_the_core():
    for path in sorted((ROOT / "repro" / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("repro") or name == "repro.core" or name.startswith("repro.core."), \
                    f"{path.name} imports {name}"


def test_the_shared_runtime_names_no_family():
    """What every executor shares (repro/runtime) imports no family's module: a family reaches it, not
    the other way round."""
    for path in sorted((ROOT / "repro" / "runtime").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("repro.families") for n in names), f"{path.name} imports {names}"


def test_the_core_and_the_families_planners_and_simulators_never_import_torch():
    families = sorted(p.name for p in (ROOT / "repro" / "families").iterdir() if (p / "__init__.py").is_file())
    assert {"allreduce", "sparse", "dear", "bytescheduler", "ps", "baselines"} <= set(families)
    modules = [f"repro.core.{p.stem}" for p in (ROOT / "repro" / "core").glob("*.py") if p.stem != "__init__"]
    modules += [f"repro.families.{f}.{m}" for f in families for m in ("planners", "simulate")
                if (ROOT / "repro" / "families" / f / f"{m}.py").is_file()]
    out = _run("import importlib, sys, json\n"
               f"for m in {modules!r}: importlib.import_module(m)\n"
               "from repro.core.schedulers import scheduler_names\n"
               "print(json.dumps({'torch': 'torch' in sys.modules, 'schedulers': len(scheduler_names())}))",
               ROOT)
    seen = json.loads(out)
    assert seen == {"torch": False, "schedulers": seen["schedulers"]} and seen["schedulers"] >= 26


def test_a_family_from_another_package_is_listed_planned_and_simulated(tmp_path):
    pkg = write_example_family(tmp_path)
    out = _run("""
import json
from repro.core.cost import CostModel
from repro.core.families import family_names
from repro.core.planners import make_plan, planner_names
from repro.core.schedulers import get_scheduler, scheduler_names
from repro.core.simulate import simulate
from repro.core.trace import load_trace
trace = load_trace("resnet50_b32_v100-estimate")
cost = CostModel.from_alpha_beta(8, 1e-4, 1e-9)
plan = make_plan("blocking", trace, cost)
sim = simulate(trace, plan, cost)
comm = [cost.time_s("allreduce", n) for n in plan.bucket_bytes(trace)]
print(json.dumps({"families": family_names(), "planners": planner_names("blocking"),
                  "scheduler": get_scheduler("blocking").family, "in_list": "blocking" in scheduler_names(),
                  "buckets": len(plan.buckets), "layers": trace.num_layers, "first": list(plan.buckets[0].layers),
                  "last_layer": trace.names[-1], "iteration_s": sim.iteration_s,
                  "expected_s": float(trace.forward_s().sum() + trace.backward_s().sum()) + sum(comm)}))
""", pkg)
    seen = json.loads(out)
    assert seen["families"][-1] == "blocking" and seen["planners"] == ["blocking"] and seen["in_list"]
    assert seen["scheduler"] == "blocking"
    assert seen["buckets"] == -(-seen["layers"] // 4) and seen["first"][0] == seen["last_layer"]
    assert seen["iteration_s"] == pytest.approx(seen["expected_s"], rel=1e-9)
    # the command line knows it too, with nothing edited
    listed = subprocess.run([sys.executable, "-m", "repro", "schedulers", "--format", "json"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), str(ROOT)])}, timeout=120)
    assert listed.returncode == 0, listed.stderr
    table = json.loads(listed.stdout)
    assert table["schedulers"]["blocking"]["family"] == "blocking" and "blocking" in table["families"]


def test_the_registries_order_does_not_depend_on_what_was_imported_first():
    """A family's module imported before the registries are read registers its entries first; the
    registries still list every entry in the families' order (``repro schedulers``, error messages)."""
    code = ("import json\nfrom repro.core.schedulers import scheduler_names\n"
            "from repro.core.run_options import RUN_OPTIONS\nprint(json.dumps([scheduler_names(), list(RUN_OPTIONS)]))")
    plain = json.loads(_run(code, ROOT))
    first = json.loads(_run("import repro.families.baselines.executors, repro.families.ps\n" + code, ROOT))
    assert first == plain and plain[0][0] == "wfbp" and plain[0][-1] == "local"


def test_a_family_that_fails_to_import_is_named_in_one_line(tmp_path):
    pkg = write_example_family(tmp_path)
    (pkg / "repro_blocking" / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pkg), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", "from repro.core.schedulers import scheduler_names; scheduler_names()"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "family module 'repro_blocking' failed to import: RuntimeError: broken on purpose" in out.stderr


def _train_both(ctx, steps: int) -> dict:
    """Per rank: one model trained by the example family through repro.distribute, one by PyTorch DDP, from
    the same weights on the same batches; their parameters after ``steps`` steps."""
    import torch
    from torch import nn

    import repro

    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))

    ours, ref = make(), make()
    model, opt = repro.distribute(ours, torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), "blocking",
                                  warmup_steps=1, fit_repeats=1)
    ddp = nn.parallel.DistributedDataParallel(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1 + ctx.rank)
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        for m, o in ((model, opt), (ddp, ref_opt)):
            o.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            o.step()
    opt.flush()
    out = {"buckets": len(opt.plan.buckets),
           "ours": [p.detach().clone() for p in ours.parameters()], "ddp": [p.detach().clone() for p in ref.parameters()]}
    opt.remove()
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_a_family_from_another_package_trains_like_ddp(tmp_path, monkeypatch):
    """The example family's update is synchronous SGD's: its parameters equal DDP's within float32
    rounding (DDP divides each gradient by the world size before summing, the example after: up to an ulp
    per step), on a model and loop of our own writing that the family never saw."""
    import torch

    from repro.launch.local import launch_local

    pkg = write_example_family(tmp_path)
    monkeypatch.syspath_prepend(str(pkg))  # the spawned ranks start with this sys.path: they find the entry point
    out = launch_local(_train_both, 2, args=(5,), timeout_s=300, quiet=True)
    for rank in out:
        assert rank["buckets"] == 2  # 6 parameter tensors in groups of 4
        for a, b in zip(rank["ours"], rank["ddp"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(out[0]["ours"], out[1]["ours"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
