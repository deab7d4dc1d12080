"""The wire dtype rule (repro.core.run_options.check_wire_dtype), one for repro.distribute, repro train and
repro grid check: the gradients' own dtype (float32 here) is every scheduler's, a cast only the casting
schedulers'. The paper grids' launchers used to pass --wire-dtype float32 to every run, and every
scheduler that cannot cast refused it at start-up."""

from __future__ import annotations

import pytest

from repro.grids.grid import load_grid, parse_grid
from repro.grids.jobs import train_argv
from repro.core.run_options import check_wire_dtype
from repro.core.schedulers import get_scheduler, scheduler_names
from repro.training.config import TrainConfig, config_from_argv

CASTING = [n for n in scheduler_names() if get_scheduler(n).wire_dtype]
NOT_CASTING = [n for n in scheduler_names() if not get_scheduler(n).wire_dtype]


def test_both_kinds_of_scheduler_exist():
    assert {"mgwfbp", "wfbp"} <= set(CASTING) and {"ddp", "local", "omgs", "ps_bsp", "bytescheduler"} <= set(NOT_CASTING)


@pytest.mark.parametrize("name", NOT_CASTING)
def test_the_gradients_own_dtype_is_every_schedulers(name):
    sched = get_scheduler(name)
    assert check_wire_dtype("float32", sched) is None  # nothing to cast: sent as the gradients are
    assert check_wire_dtype("bfloat16", sched, ["bfloat16"]) is None
    for wire, own in (("float16", ["float32"]), ("bfloat16", ["float32"]), ("float32", ["bfloat16"]),
                      ("float32", ["float32", "bfloat16"])):
        with pytest.raises(ValueError, match=f"wire_dtype {wire} does not apply to scheduler '{name}'") as e:
            check_wire_dtype(wire, sched, own)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", CASTING)
def test_a_casting_scheduler_keeps_what_it_is_given(name):
    for wire in ("float32", "float16", "bfloat16"):
        assert check_wire_dtype(wire, get_scheduler(name)) == wire


def test_repro_train_takes_float32_for_every_scheduler():
    for name in scheduler_names():
        cfg = TrainConfig(scheduler=name, wire_dtype="float32")
        assert cfg.wire_dtype == ("float32" if name in CASTING else None), name
    with pytest.raises(ValueError, match="wire_dtype float16 does not apply to scheduler 'omgs'"):
        TrainConfig(scheduler="omgs", wire_dtype="float16")


def test_launchers_pass_a_wire_dtype_only_when_the_grid_asks_for_another():
    grid = parse_grid({"paper": "t", "notebook": "nb", "gpus_per_node": 2, "train": {"steps": 3},
                       "experiments": [{"name": "e", "models": {"tiny_resnet": {"batch_size": 8}},
                                        "world_sizes": [2], "schedulers": ["wfbp", "omgs"],
                                        "precisions": ["float32", "float16"]}]}, "t.yaml")
    flags = {(r["scheduler"], r["wire_dtype"]): train_argv(r, "/runs") for r in grid.runs}
    assert "--wire-dtype" not in flags["wfbp", "float32"] and "--wire-dtype" not in flags["omgs", "float32"]
    argv = flags["wfbp", "float16"]
    assert argv[argv.index("--wire-dtype") + 1] == "float16"
    cfg, _ = config_from_argv(flags["omgs", "float32"][2:])
    assert cfg.wire_dtype is None
    for paper in ("mgwfbp", "omgs", "dear", "osp"):  # the shipped grids: only mgwfbp's float16 runs cast
        given = {r["wire_dtype"] for r in load_grid(paper).runs if "--wire-dtype" in train_argv(r, "/runs")}
        assert given == ({"float16"} if paper == "mgwfbp" else set()), paper


def _distribute(scheduler: str, wire_dtype: str, dtype: str = "float32") -> str:
    import torch
    from torch import nn

    import repro

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to(getattr(torch, dtype))
    try:
        _, opt = repro.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), scheduler, wire_dtype=wire_dtype)
    except ValueError as e:
        return str(e)
    opt.remove()
    return "accepted"


@pytest.mark.distributed
def test_distribute_takes_the_gradients_own_dtype_for_every_scheduler(one_rank):
    for name in ("local", "ddp", "mgwfbp"):
        assert _distribute(name, "float32") == "accepted", name
    for name in ("omgs", "dear_threshold", "bytescheduler", "ps_bsp"):  # past the wire check (one rank is refused)
        assert "wire_dtype" not in _distribute(name, "float32"), name
    assert "does not apply to scheduler 'omgs'" in _distribute("omgs", "float16")
    assert "which sends each gradient in its own dtype (bfloat16" in _distribute("local", "float32", "bfloat16")
