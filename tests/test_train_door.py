"""`repro train` is a client of the public door (repro.distribute): no second implementation of the
warm-up, online planning or execution; and its --network takes a preset or a cost file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from repro.core.cost import CostModel, Linear
from repro.training.config import TrainConfig

TRAIN = Path(__file__).resolve().parent.parent / "repro" / "train.py"


def test_the_training_loop_builds_no_executor_and_plans_through_the_door():
    tree = ast.parse(TRAIN.read_text(encoding="utf-8"))
    called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
              for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "executor_class" not in called and "wrap_optimizer" not in called
    assert not {"AllReduceExecutor", "grad_abs_mean"} & {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "distribute" in called  # the door
    # planning online happens in the door, the serving ranks' share too (distribute's dedicated_servers)
    plan_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "plan_online"]
    assert not plan_calls


def test_the_training_loop_uses_only_the_doors_public_surface():
    """No reach into distribute's private state (``dopt._door``) or options (``_context``): what the loop
    reads is public API of the returned optimizer (trace, cost, last_stamps, executor, ...)."""
    tree = ast.parse(TRAIN.read_text(encoding="utf-8"))
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    keywords = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords if k.arg}
    keys = {k.value for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys
            if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "repro.api"
                for a in n.names}
    assert "_door" not in attributes and "ex" not in attributes
    assert not {k for k in keywords | keys if k.startswith("_")}
    assert imported == {"distribute"}


def test_network_takes_a_cost_file_for_this_many_workers(tmp_path):
    path = tmp_path / "cost.json"
    CostModel(2, {"allreduce": Linear(1e-4, 1e-9)}, source="test").save(path)
    cfg = TrainConfig(scheduler="mgwfbp", network=str(path))
    cfg.check_world(2)
    with pytest.raises(ValueError, match=r"P=2|workers"):
        cfg.check_world(4)
    with pytest.raises(ValueError, match=r"^cost file '.*' has no sparse_allgather line"):
        TrainConfig(scheduler="omgs", network=str(path)).check_world(2)
    with pytest.raises(ValueError, match="unknown network preset 'nope' \\(and no cost file of that name\\)"):
        TrainConfig(network="nope")


def test_a_cost_file_stands_for_a_preset_everywhere(tmp_path):
    """repro.costs.presets.preset (which every study and command calls) takes a cost file of the right P; the
    notebooks' preset parameters accept one (issue 22: the user's cluster wherever a preset goes)."""
    from repro.figures.schemas._common import _preset_or_file
    from repro.costs.presets import preset

    path = tmp_path / "mine.json"
    preset("10gbe-dear64", 64).save(path)
    assert preset(str(path), 64).lines == preset("10gbe-dear64", 64).lines
    with pytest.raises(ValueError, match="is for P=64 workers, asked for P=16"):
        preset(str(path), 16)
    assert _preset_or_file(str(path)) == str(path)
    with pytest.raises(ValueError, match="not a preset, nor a cost file"):
        _preset_or_file(str(tmp_path / "missing.json"))


def test_dedicated_servers_are_refused_on_nccl_before_any_rank_starts():
    """repro train's parameter servers serve from one thread per worker, point to point, which NCCL cannot do:
    the world check says so in one line (it used to surface inside the serving rank, after the warm-up)."""
    cfg = TrainConfig(scheduler="ps_bsp", servers=1)
    with pytest.raises(ValueError, match="'ps_bsp' runs 1 dedicated server rank.*need the gloo backend") as e:
        cfg.check_world(3, backend="nccl")
    assert "\n" not in str(e.value)
    cfg.check_world(3, backend="gloo")
    cfg.check_world(3)
    TrainConfig(scheduler="mgwfbp").check_world(3, backend="nccl")  # no serving ranks: nothing to refuse


def test_the_world_check_judges_the_device_it_is_given():
    """``check_world(device=...)`` (the ranks' device type, as a grid job asks before it starts any) is the
    device judged, before ``--device`` and the backend's own: CUDA tensors over gloo are refused for a family
    whose gloo collectives read CPU tensors only, whatever the config's own device says."""
    cfg = TrainConfig(scheduler="dear_threshold")
    with pytest.raises(ValueError, match="'dear_threshold' cannot train CUDA tensors over gloo"):
        cfg.check_world(2, backend="gloo", device="cuda")
    cfg.check_world(2, backend="gloo", device="cpu")
    cfg.check_world(2, backend="gloo")  # gloo's own device: the CPU
