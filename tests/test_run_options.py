"""Run options declared once (repro.core.run_options): TrainConfig's fields, repro train's flags and the checks derive from them."""

from __future__ import annotations

from dataclasses import fields

import pytest

from repro.core.run_options import RUN_OPTIONS, RunOption, check_run_options, option_flag, register_run_option
from repro.core.schedulers import get_scheduler, scheduler_names
from repro.training.config import TrainConfig, _option_fields, build_parser


def test_every_option_is_a_config_field_and_a_flag_with_its_help():
    names = {f.name: f for f in fields(TrainConfig)}
    helps = build_parser().format_help()
    for option in RUN_OPTIONS.values():
        assert option.name in names, option.name
        assert names[option.name].default == option.default
        assert option_flag(option.name).split("/")[0] in helps


def test_every_option_a_scheduler_takes_is_declared_or_common():
    common = {f.name for f in fields(TrainConfig)} - set(RUN_OPTIONS)
    for name in scheduler_names():
        s = get_scheduler(name)
        for option in s.planner_options + s.executor_options:
            assert option in RUN_OPTIONS or option in common, (name, option)


@pytest.mark.parametrize("values, scheduler, message", [
    ({"servers": 2}, "mgwfbp", r"^--servers does not apply to --scheduler mgwfbp \(it applies to: ps_bsp"),
    ({"density": 0.0}, "omgs", r"density must be a number in \(0, 1\]"),
    ({"stage1_share": 1.5}, "osp", r"stage1_share must be a number in \[0, 1\]"),
    ({"staleness": -1}, "ps_ssp", "staleness must be a non-negative integer"),
    ({"lgp": 1}, "osp", "lgp must be true or false"),
    ({"tuner_min_bytes": 8, "tuner_max_bytes": 8}, "dear_bo", "tuner_min_bytes < tuner_max_bytes"),
    ({"nosuch": 1}, "mgwfbp", "unknown run option 'nosuch'"),
])
def test_bad_values_get_one_line_naming_the_option(values, scheduler, message):
    with pytest.raises(ValueError, match=message) as e:
        check_run_options(values, get_scheduler(scheduler), where="flag")
    assert "\n" not in str(e.value)


def test_a_value_with_a_default_is_not_used_elsewhere_but_still_checked():
    assert check_run_options({"density": 0.5}, get_scheduler("mgwfbp"))["density"] == 0.5
    with pytest.raises(ValueError, match="density"):
        check_run_options({"density": 5}, get_scheduler("mgwfbp"))


def test_a_family_from_another_package_adds_a_field_without_editing_shared_code():
    register_run_option(RunOption("window_s", float, "plugin: a window", "plugin", unit="s"))
    try:
        assert "window_s" in [name for name, _, _ in _option_fields()]
        with pytest.raises(ValueError, match="declared already"):
            register_run_option(RunOption("window_s", float, "again", "plugin"))
    finally:
        del RUN_OPTIONS["window_s"]


def test_every_option_a_scheduler_or_family_takes_is_a_declared_run_option():
    from repro.core.families import FAMILIES
    from repro.core.run_options import RUN_OPTIONS
    from repro.core.schedulers import SCHEDULERS

    common = {f.name for f in fields(TrainConfig)}  # a scheduler may also take a common setting (dear_bo: seed)
    for s in SCHEDULERS.values():
        assert set(s.planner_options) <= set(RUN_OPTIONS), s.name
        assert set(s.executor_options) <= set(RUN_OPTIONS) | common, s.name
    for f in FAMILIES.values():  # a plan given on its own: only run options (repro.distribute's keywords)
        assert set(f.executor_options) <= set(RUN_OPTIONS), f.name


def test_the_reducer_engine_refusals_are_one_rule():
    from repro.families.allreduce import reducer_engine_refusal

    assert reducer_engine_refusal({"engine": "hooks", "wire_dtype": "float16", "device": "cuda"}) is None
    assert reducer_engine_refusal({"engine": "reducer"}) is None
    assert "wire dtype (bfloat16)" in reducer_engine_refusal({"engine": "reducer", "wire_dtype": "bfloat16"})
    assert "CPU only" in reducer_engine_refusal({"engine": "reducer", "device": "cuda"})
    assert "CPU only" in reducer_engine_refusal({"engine": "reducer", "backend": "nccl"})
