"""One parameter schema per notebook (repro.figures.schemas): it agrees with the notebook's parameters
cell, which alone holds the defaults, refuses bad values in one line naming the parameter, and the
notebook applies it before it writes anything (unknown parameter names included)."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest

from repro.figures import params as params_module
from repro.figures.params import (ParameterError, apply_parameters, injected_parameter_names, list_length,
                                  notebook_defaults, notebook_type, parameter_bounds, validate_parameters)
from repro.figures.schemas import SCHEMAS, schema_for

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _cells(nb_path: Path) -> list[dict]:
    return json.loads(nb_path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _parameters_cell(nb_path: Path) -> dict[str, tuple[str, object]]:
    """name -> (annotation, default) of the notebook's ``parameters`` cell, in order."""
    cells = [c for c in _cells(nb_path) if "parameters" in (c.get("metadata", {}).get("tags") or [])]
    assert len(cells) == 1, f"{nb_path.name}: one parameters cell"
    out = {}
    for node in ast.parse(_source(cells[0])).body:
        assert isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name), ast.unparse(node)
        out[node.target.id] = (ast.unparse(node.annotation), ast.literal_eval(node.value))
    return out


def _error(schema, data) -> str:
    with pytest.raises(ParameterError) as e:
        validate_parameters(schema, data)
    message = str(e.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------- schema <-> parameters cell

def test_every_notebook_has_a_schema():
    assert {p.stem for p in NOTEBOOKS} == set(SCHEMAS)


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_schema_agrees_with_the_parameters_cell(nb_path):
    """Same names in the same order, same types: the schema cannot drift from the notebook."""
    schema = schema_for(nb_path.stem)
    assert schema.notebook == nb_path.stem
    cell = _parameters_cell(nb_path)
    assert list(schema.model_fields) == list(cell), nb_path.stem
    for name, field in schema.model_fields.items():
        assert notebook_type(field.annotation) == cell[name][0], (nb_path.stem, name)


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_defaults_live_only_in_the_parameters_cell(nb_path):
    """No schema field has a default (a schema built from nothing is refused); validate_parameters(schema, {})
    is the notebook's own defaults, validated; notebook_defaults reads exactly the cell's values."""
    stem = nb_path.stem
    schema = schema_for(stem)
    assert [n for n, f in schema.model_fields.items() if not f.is_required()] == [], stem
    with pytest.raises(Exception):
        schema()
    cell = {name: default for name, (_, default) in _parameters_cell(nb_path).items()}
    defaults = notebook_defaults(stem)
    assert list(defaults) == list(cell) and defaults == cell, stem
    assert [type(v) for v in defaults.values()] == [type(v) for v in cell.values()], stem
    model = validate_parameters(schema, {})  # the defaults themselves are valid
    expected = validate_parameters(schema, cell)
    assert model == expected, stem
    for name in ("output_dir", "results_dir"):
        assert getattr(model, name) == ROOT / cell[name], (stem, name)
    defaults[next(iter(defaults))] = "changed"  # a caller's copy: the next call is the cell again
    assert notebook_defaults(stem) == cell


def test_validate_parameters_fills_only_what_is_missing():
    model = validate_parameters(schema_for("osp_simulation"), {"staleness": "7"})
    assert model.staleness == 7 and model.models == notebook_defaults("osp_simulation")["models"]


def _fake_notebook(root: Path, stem: str, cell: str, tags=("parameters",)) -> None:
    (root / "notebooks").mkdir(exist_ok=True)
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": list(tags)}, "source": cell, "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (root / "notebooks" / f"{stem}.ipynb").write_text(json.dumps(nb), encoding="utf-8")


@pytest.mark.parametrize("cell, tags, match", [
    (None, ("parameters",), r"^nb: cannot read the parameters' defaults: notebooks/nb\.ipynb not found"),
    ("a: int = 1\nb: int = max(1, 2)  # not a literal\n", ("parameters",),
     r"^b: its default in notebooks/nb\.ipynb is not a literal value \('max\(1, 2\)'\)$"),
    ("a: int = 1\nimport os\n", ("parameters",), r"^notebooks/nb\.ipynb: the parameters cell may only assign names"),
    ("a: int = 1\n", (), r"^notebooks/nb\.ipynb: expected one cell tagged 'parameters', found 0$"),
    ("a: int = (\n", ("parameters",), r"^notebooks/nb\.ipynb: its parameters cell is not valid Python"),
], ids=["no-notebook", "not-literal", "not-assignment", "no-cell", "syntax"])
def test_unreadable_defaults_are_one_line(tmp_path, monkeypatch, cell, tags, match):
    monkeypatch.setattr(params_module, "repo_root", lambda: tmp_path)
    params_module._read_defaults.cache_clear()
    try:
        if cell is not None:
            _fake_notebook(tmp_path, "nb", cell, tags)
        with pytest.raises(ParameterError, match=match) as e:
            notebook_defaults("nb")
        assert "\n" not in str(e.value)
    finally:
        params_module._read_defaults.cache_clear()


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_lists_every_parameter(nb_path, caplog):
    """papermill's own reading of the parameters cell (``papermill --help-notebook``, and the runner's
    check of --parameters-json) lists every parameter of the schema, without a warning: a line it cannot
    parse (a second ``=`` in its comment) used to drop ``slurm`` with "Unable to parse line 25"."""
    import logging

    import papermill as pm

    with caplog.at_level(logging.WARNING, logger="papermill"):
        listed = list(pm.inspect_notebook(str(nb_path)))
    assert listed == list(schema_for(nb_path.stem).model_fields), nb_path.stem
    assert not [r for r in caplog.records if "Unable to parse" in r.getMessage()], nb_path.stem


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_applies_its_schema_first(nb_path):
    """The first code cell after the parameters applies the notebook's own schema, and no cell before it
    writes anything; the old scattered checks are gone."""
    code = [_source(c) for c in _cells(nb_path) if c["cell_type"] == "code"]
    call = f"apply_parameters({SCHEMAS[nb_path.stem]}, globals())"
    assert call in code[1], nb_path.stem
    assert f"from repro.figures.schemas.{nb_path.stem} import {SCHEMAS[nb_path.stem]}" in code[1]
    before = code[1].split(call)[0]
    writes = r"\b(write_table|save_figure|clear_runs|mkdir|run_\w+|usable_bandwidths)\("
    assert not re.search(writes, before), nb_path.stem
    text = "\n".join(code)
    assert "parse_list(" not in text and "parse_choice(" not in text, nb_path.stem


# ------------------------------------------------------------------------------- every field, generically

_WRONG_TYPE = {"int": 2.5, "float": "abc", "bool": "maybe", "str": 5, "list[int]": "[4, x]",
               "list[float]": "[0.5, abc]", "list[str]": "[ok, 1]"}


def _fields():
    for stem in SCHEMAS:
        schema = schema_for(stem)
        for name, field in schema.model_fields.items():
            yield pytest.param(stem, name, notebook_type(field.annotation), id=f"{stem}.{name}")


@pytest.mark.parametrize("stem, name, kind", list(_fields()))
def test_every_parameter_refuses_a_wrong_type_naming_itself(stem, name, kind):
    """2.5 for an int, "maybe" for a bool, "abc" for a number, a number for a string, a bad list item."""
    schema = schema_for(stem)
    default = notebook_defaults(stem)[name]
    wrong = f"[{default[0]}, 1]" if kind == "list[str]" and default else _WRONG_TYPE[kind]
    message = _error(schema, {name: wrong})
    assert message.startswith(f"{name}: "), message
    assert repr(wrong) in message, message  # the value given
    if kind in ("int", "float"):
        assert _error(schema, {name: True}).startswith(f"{name}: expected a number, got a boolean")


@pytest.mark.parametrize("stem, name, kind", [p for p in _fields() if p.values[2].startswith("list")])
def test_list_parameters_accept_papermill_strings(stem, name, kind):
    """``-p workers "[4, 16]"`` and ``-p workers 4,16`` hand the notebook strings: both give the list."""
    schema = schema_for(stem)
    default = notebook_defaults(stem)[name]
    flow = "[" + ", ".join(map(str, default)) + "]"
    assert getattr(validate_parameters(schema, {name: flow}), name) == default
    if default:
        assert getattr(validate_parameters(schema, {name: ",".join(map(str, default))}), name) == default
        assert getattr(validate_parameters(schema, {name: tuple(default)}), name) == default
        assert getattr(validate_parameters(schema, {name: json.dumps(default)}), name) == default
    assert _error(schema, {name: "[1, 2"}).startswith(f"{name}: cannot parse '[1, 2' as a list")
    assert _error(schema, {name: "{a: 1}"}).startswith(f"{name}: expected a list, got a mapping")


@pytest.mark.parametrize("stem", list(SCHEMAS))
def test_unknown_parameters_and_paths(stem, tmp_path):
    schema = schema_for(stem)
    assert _error(schema, {"nosuchparam": 5}) == "nosuchparam: not a parameter of this notebook (got 5)"
    model = validate_parameters(schema, {"output_dir": "relative/figs", "results_dir": str(tmp_path)})
    assert model.output_dir == ROOT / "relative" / "figs" and model.results_dir == tmp_path
    assert _error(schema, {"results_dir": " "}).startswith("results_dir: a path parameter is empty")
    assert _error(schema, {"scale": "huge"}) == "scale: unknown value 'huge'; choose from tiny, paper (got 'huge')"
    if "cost_mode" in schema.model_fields:
        assert _error(schema, {"cost_mode": "exact"}).startswith("cost_mode: unknown value 'exact'; choose from paper")


# ------------------------------------------------------------------------------ ranges and choices

BAD = [
    # the red team's osp_simulation values
    ("osp_simulation", {"staleness": -3}, r"^staleness: Input should be greater than or equal to 0; osp_simulation takes staleness in \[0, 100\] "
                                          r"\(got -3\)$"),
    ("osp_simulation", {"staleness": 2.5}, r"^staleness: .*fractional part \(got 2\.5\)$"),
    ("osp_simulation", {"stage1_share": "abc"}, r"^stage1_share: Input should be a valid number.*\(got 'abc'\)$"),
    ("osp_simulation", {"servers": "abc"}, r"^servers: Input should be a valid integer.*\(got 'abc'\)$"),
    ("osp_simulation", {"stage1_share": 1.5}, r"^stage1_share: stage1_share must be a number in \[0, 1\]"),
    ("osp_simulation", {"stage1_share": -0.1}, r"^stage1_share: stage1_share must be a number in \[0, 1\]"),
    ("osp_simulation", {"servers": 0}, r"^servers: Input should be greater than or equal to 1"),
    ("osp_simulation", {"sim_workers": 1}, r"^sim_workers: Input should be greater than or equal to 2"),
    ("osp_simulation", {"latency_us": -1}, r"^latency_us: Input should be greater than or equal to 0"),
    ("osp_simulation", {"latency_us": float("nan")}, r"^latency_us: Input should be a finite number"),
    ("osp_simulation", {"timeline_iterations": 0}, r"^timeline_iterations: Input should be greater than or equal to 1"),
    ("osp_simulation", {"models": "[resnet50, lenet]"}, r"^models: unknown value 'lenet'; choose from resnet50, .* "
                                                        r"\(got 'lenet' in '\[resnet50, lenet\]'\)$"),
    ("osp_simulation", {"models": "[]"}, r"^models: the list is empty"),
    ("osp_simulation", {"timeline_model": "lenet"}, r"^timeline_model: unknown value 'lenet'"),
    ("osp_simulation", {"timeline_schedulers": "[ps_bsp, wfbp]"}, r"^timeline_schedulers: unknown value 'wfbp'; "
                                                                  r"choose from ps_bsp, ps_asp"),
    ("osp_simulation", {"sim_link_rates": "[10gbit, 1gbps]"}, r"^sim_link_rates: ambiguous bandwidth unit in '1gbps'"),
    ("osp_simulation", {"timeline_link_rate": "fast"}, r"^timeline_link_rate: cannot read bandwidth 'fast'"),
    ("osp_simulation", {"stage1_shares": "[0.5, 1.5]"}, r"^stage1_shares: stage1_share must be a number in \[0, 1\]; "
                                                        r"osp_simulation takes each item of stage1_shares in \[0, 1\] "
                                                        r"\(got 1\.5 in '\[0\.5, 1\.5\]'\)$"),
    # the red team's mgwfbp_simulation values
    ("mgwfbp_simulation", {"timeline_workers": -8}, r"^timeline_workers: Input should be greater than or equal to 2"),
    ("mgwfbp_simulation", {"threshold_bytes": -5}, r"^threshold_bytes: Input should be greater than or equal to 0"),
    ("mgwfbp_simulation", {"paper_check": "maybe"}, r"^paper_check: expected true or false \(got 'maybe'\)$"),
    ("mgwfbp_simulation", {"paper_check": 1}, r"^paper_check: expected true or false"),
    ("mgwfbp_simulation", {"gpu": "a100"}, r"^gpu: unknown value 'a100'; choose from k80, p102, v100"),
    ("mgwfbp_simulation", {"models": "[resnet50, lenet]"}, r"^models: no shipped trace for model 'lenet' on 'v100"),
    ("mgwfbp_simulation", {"gpu": "k80"}, r"^models: no shipped trace for model '\w+' on 'k80-estimate'"),
    ("mgwfbp_simulation", {"timeline_model": "lenet"}, r"^timeline_model: no shipped trace for model 'lenet'"),
    ("mgwfbp_simulation", {"network_presets": "[10gbe-derived, 1gbe]"}, r"^network_presets: unknown value '1gbe'"),
    ("mgwfbp_simulation", {"timeline_network_preset": "x"}, r"^timeline_network_preset: unknown value 'x'"),
    ("mgwfbp_simulation", {"workers": "[1, 4]"}, r"^workers: Input should be greater than or equal to 2; "
                                                        r"mgwfbp_simulation takes each item of workers in \[2, 4096\] \(got 1 in"),
    ("mgwfbp_simulation", {"schedulers": "[wfbp, nope]"}, r"^schedulers: unknown value 'nope'"),
    ("compare_schedulers", {"workers": "[4, 6]"}, r"^workers: P=6 is not whole nodes .* \(cost_mode calibrated\)$"),
    ("compare_schedulers", {"models": "[lenet]"}, r"^models: no shipped V100 estimate trace for model 'lenet'"),
    ("compare_schedulers", {"density": 0}, r"^density: density must be a number in \(0, 1\]"),
    ("compare_schedulers", {"density": 1.5}, r"^density: density must be a number in \(0, 1\]"),
    ("compare_schedulers", {"topk_gamma_s": -1e-10}, r"^topk_gamma_s: Input should be greater than or equal to 0"),
    ("compare_schedulers", {"measured_schedulers": "[nope]"}, r"^measured_schedulers: unknown value 'nope'"),
    ("compare_schedulers", {"measured_model": "resnet9000"}, r"^measured_model: unknown value 'resnet9000'"),
    ("compare_schedulers", {"measured_workers": 1}, r"^measured_workers: Input should be greater than or equal to 2"),
    ("compare_schedulers", {"link_rate": "fast"}, r"^link_rate: cannot read bandwidth 'fast'"),
    ("compare_schedulers", {"batch_size": 0}, r"^batch_size: Input should be greater than or equal to 1"),
    ("compare_schedulers", {"steps": 0}, r"^steps: Input should be greater than or equal to 1"),
    ("compare_schedulers", {"warmup_steps": 0}, r"^warmup_steps: Input should be greater than or equal to 1"),
    ("compare_schedulers", {"read_only": "maybe"}, r"^read_only: expected true or false"),
    ("dear_simulation", {"models": "[googlenet]"}, r"^models: unknown value 'googlenet'; choose from resnet50"),
    ("dear_simulation", {"schedulers": "[wfbp, omgs]"}, r"^schedulers: unknown value 'omgs'"),
    ("dear_simulation", {"timeline_schedulers": "[bytescheduler]"}, r"^timeline_schedulers: unknown value"),
    ("dear_simulation", {"summary_workers": 1}, r"^summary_workers: Input should be greater than or equal to 2"),
    ("dear_simulation", {"timeline_workers": 0}, r"^timeline_workers: Input should be greater than or equal to 2"),
    ("dear_simulation", {"timeline_model": "lenet"}, r"^timeline_model: no shipped V100 estimate trace"),
    ("dear_simulation", {"summary_network_presets": "[x]"}, r"^summary_network_presets: unknown value 'x'"),
    ("dear_training", {"world_sizes": "[1, 2]"}, r"^world_sizes: Input should be greater than or equal to 2"),
    ("dear_training", {"nofusion_schedulers": "[dear_bo]"}, r"^nofusion_schedulers: unknown value 'dear_bo'"),
    ("dear_training", {"fusion_schedulers": "[local]"}, r"^fusion_schedulers: unknown value 'local'"),
    ("dear_training", {"threshold_sweep_bytes": "[8192]"}, r"^threshold_sweep_bytes: give at least 2 values"),
    ("dear_training", {"threshold_sweep_bytes": "[0, 8192]"}, r"^threshold_sweep_bytes: Input should be greater"),
    ("dear_training", {"primitive_sizes_bytes": "[0]"}, r"^primitive_sizes_bytes: Input should be greater"),
    ("dear_training", {"bo_steps": 0}, r"^bo_steps: Input should be greater than or equal to 1"),
    ("dear_training", {"search_trials": 0}, r"^search_trials: Input should be greater than or equal to 1"),
    ("dear_training", {"search_seeds": 0}, r"^search_seeds: Input should be greater than or equal to 1"),
    ("dear_training", {"primitive_repeats": 0}, r"^primitive_repeats: Input should be greater than or equal to 1"),
    ("dear_training", {"paper_models": "[googlenet]"}, r"^paper_models: unknown value 'googlenet'"),
    ("dear_training", {"tuning_model": "googlenet"}, r"^tuning_model: unknown value 'googlenet'"),
    ("dear_training", {"paper_workers": 1}, r"^paper_workers: Input should be greater than or equal to 2"),
    ("dear_training", {"model": "lenet"}, r"^model: unknown value 'lenet'; choose from"),
    ("dear_training", {"network_presets": "[x]"}, r"^network_presets: unknown value 'x'"),
    ("mgwfbp_training", {"world_sizes": "[0]"}, r"^world_sizes: Input should be greater than or equal to 1"),
    ("mgwfbp_training", {"precisions": "[float64]"}, r"^precisions: unknown value 'float64'; choose from float32, "),
    ("mgwfbp_training", {"threshold_sweep_bytes": "[0]"}, r"^threshold_sweep_bytes: Input should be greater"),
    ("mgwfbp_training", {"allreduce_sizes_bytes": "[]"}, r"^allreduce_sizes_bytes: the list is empty"),
    ("mgwfbp_training", {"convergence_dataset": "mnist"}, r"^convergence_dataset: unknown value 'mnist'"),
    ("mgwfbp_training", {"convergence_epochs": 0}, r"^convergence_epochs: Input should be greater than or equal to 1"),
    ("mgwfbp_training", {"convergence_world_size": 0}, r"^convergence_world_size: Input should be greater"),
    ("mgwfbp_training", {"schedulers": "[local]"}, r"^schedulers: unknown value 'local'"),
    ("omgs_microbench", {"density": 0}, r"^density: density must be a number in \(0, 1\]"),
    ("omgs_microbench", {"density": 1.01}, r"^density: density must be a number in \(0, 1\]"),
    ("omgs_microbench", {"topk_numels": "[1]"}, r"^topk_numels: Input should be greater than or equal to 2"),
    ("omgs_microbench", {"world_sizes": "[1]"}, r"^world_sizes: Input should be greater than or equal to 2"),
    ("omgs_microbench", {"allgather_max_bytes": 0}, r"^allgather_max_bytes: Input should be greater"),
    ("omgs_microbench", {"repeats": 0}, r"^repeats: Input should be greater than or equal to 1"),
    ("omgs_microbench", {"threads": 0}, r"^threads: Input should be greater than or equal to 1"),
    ("omgs_simulation", {"gpu": "a100"}, r"^gpu: unknown value 'a100'"),
    ("omgs_simulation", {"models": "[lenet]"}, r"^models: no shipped estimate trace for model 'lenet'"),
    ("omgs_simulation", {"timeline_model": "lenet"}, r"^timeline_model: no shipped estimate trace"),
    ("omgs_simulation", {"densities": "[0, 0.5]"}, r"^densities: density must be a number in \(0, 1\]"),
    ("omgs_simulation", {"schedulers": "[wfbp]"}, r"^schedulers: unknown value 'wfbp'; choose from topk_layerwise"),
    ("omgs_simulation", {"measured_network_preset": "x"}, r"^measured_network_preset: unknown value 'x'"),
    ("omgs_simulation", {"measured_density": 2}, r"^measured_density: density must be a number in \(0, 1\]"),
    ("omgs_simulation", {"measured_world_size": 1}, r"^measured_world_size: Input should be greater"),
    ("omgs_simulation", {"measured_model": "lenet"}, r"^measured_model: unknown value 'lenet'"),
    ("omgs_simulation", {"workers": "[1]"}, r"^workers: Input should be greater than or equal to 2"),
    ("omgs_simulation", {"timeline_workers": 1}, r"^timeline_workers: Input should be greater than or equal to 2"),
    ("omgs_simulation", {"steps": 0}, r"^steps: Input should be greater than or equal to 1"),
    ("omgs_simulation", {"network_preset": "x"}, r"^network_preset: unknown value 'x'"),
    ("omgs_training", {"cnn_density": 0}, r"^cnn_density: density must be a number in \(0, 1\]"),
    ("omgs_training", {"lm_density": 1.5}, r"^lm_density: density must be a number in \(0, 1\]"),
    ("omgs_training", {"breakdown_density": -1}, r"^breakdown_density: density must be a number in \(0, 1\]"),
    ("omgs_training", {"lr": 0}, r"^lr: Input should be greater than 0"),
    ("omgs_training", {"lm_lr": -1}, r"^lm_lr: Input should be greater than 0"),
    ("omgs_training", {"seeds": [0, -1]}, r"^seeds(\.1)?: Input should be greater than or equal to 0"),
    ("omgs_training", {"models": "[lenet]"}, r"^models: unknown value 'lenet'"),
    ("omgs_training", {"cnn_model": "lenet"}, r"^cnn_model: unknown value 'lenet'"),
    ("omgs_training", {"lm_model": "lenet"}, r"^lm_model: unknown value 'lenet'"),
    ("omgs_training", {"paper_network": "x"}, r"^paper_network: unknown value 'x'"),
    ("omgs_training", {"link_rate": "fast"}, r"^link_rate: cannot read bandwidth 'fast'"),
    ("omgs_training", {"paper_workers": 1}, r"^paper_workers: Input should be greater than or equal to 2"),
    ("omgs_training", {"breakdown_world_size": 0}, r"^breakdown_world_size: Input should be greater"),
    ("osp_training", {"ps_workers": 1}, r"^ps_workers: Input should be greater than or equal to 2"),
    ("osp_training", {"servers": 0}, r"^servers: Input should be greater than or equal to 1"),
    ("osp_training", {"momentum": 1.0}, r"^momentum: Input should be less than 1"),
    ("osp_training", {"momentum": -0.1}, r"^momentum: Input should be greater than or equal to 0"),
    ("osp_training", {"lr": 0}, r"^lr: Input should be greater than 0"),
    ("osp_training", {"stage1_share": 2}, r"^stage1_share: stage1_share must be a number in \[0, 1\]"),
    ("osp_training", {"ablation_shares": "[0.5, 2]"}, r"^ablation_shares: stage1_share must be a number in \[0, 1\]"),
    ("osp_training", {"staleness": -1}, r"^staleness: Input should be greater than or equal to 0"),
    ("osp_training", {"staleness": 2.5}, r"^staleness: .*fractional part"),
    ("osp_training", {"importance": "random"}, r"^importance: unknown value 'random'; choose from magnitude, position"),
    ("osp_training", {"dataset": "mnist"}, r"^dataset: unknown value 'mnist'; choose from digits, cifar10, imagenet"),
    ("osp_training", {"paper_models": "[resnet50, lenet]"}, r"^paper_models: unknown value 'lenet'"),
    ("osp_training", {"sim_link_rates": "[1gbps]"}, r"^sim_link_rates: ambiguous bandwidth unit"),
    ("osp_training", {"sim_stage1_shares": "[-0.5]"}, r"^sim_stage1_shares: stage1_share must be a number in \[0, 1\]"),
    ("osp_training", {"paper_workers": 1}, r"^paper_workers: Input should be greater than or equal to 2"),
    ("osp_training", {"epochs": 0}, r"^epochs: Input should be greater than or equal to 1"),
    ("validation", {"world_sizes": "[1]"}, r"^world_sizes: Input should be greater than or equal to 2"),
    ("validation", {"link_rates": "[loopback, fast]"}, r"^link_rates: cannot read bandwidth 'fast'"),
    ("validation", {"threshold_bytes": -1}, r"^threshold_bytes: Input should be greater than or equal to 0"),
    ("validation", {"contention_repeats": 0}, r"^contention_repeats: Input should be greater than or equal to 1"),
    ("validation", {"schedulers": "[local]"}, r"^schedulers: unknown value 'local'"),
    ("validation", {"require_emulation": "maybe"}, r"^require_emulation: expected true or false"),
    ("validation", {"models": "[lenet]"}, r"^models: unknown value 'lenet'"),
    ("validation_published", {"max_nfev": 4}, r"^max_nfev: Input should be greater than or equal to 5"),
    ("validation_published", {"refit": "maybe"}, r"^refit: expected true or false"),
    # rates beyond repro.core.ranges.BITS_PER_S (1e30gbit is no link)
    ("omgs_training", {"link_rate": "1e30gbit"}, r"^link_rate: bandwidth '1e30gbit' = 1e\+39 bit/s is outside the "
                                                 r"plausible range of link rates \[8, 1e15\] bit/s"),
    ("validation", {"link_rates": "[loopback, 1e30gbit]"}, r"^link_rates: bandwidth '1e30gbit' .*outside the plausible"),
    ("osp_simulation", {"sim_link_rates": "[10gbit, 1e30gbit]"}, r"^sim_link_rates: bandwidth '1e30gbit' .*outside"),
    # input folders must exist; the convergence runs train epochs, which synthetic data has not
    ("omgs_training", {"runs_dir": "/nonexistent"}, r"^runs_dir: /nonexistent does not exist; give an existing "
                                                    r"folder, or leave it empty for the default \(got '/nonexistent'\)$"),
    ("omgs_training", {"ptb_dir": "/nonexistent"}, r"^ptb_dir: /nonexistent does not exist"),
    ("omgs_training", {"ptb_dir": "/dev/null"}, r"^ptb_dir: /dev/null is a character device, not a folder"),
    ("omgs_simulation", {"runs_dir": "/nonexistent"}, r"^runs_dir: /nonexistent does not exist"),
    ("mgwfbp_training", {"convergence_dataset": "synthetic"}, r"^convergence_dataset: epochs need a real dataset"),
    # output folders must be folders or creatable
    ("omgs_training", {"output_dir": "/dev/null"}, r"^output_dir: /dev/null is a character device, not a folder; "
                                                   r"give a folder that exists or can be created"),
    ("osp_simulation", {"results_dir": "/dev/null/x"}, r"^results_dir: /dev/null/x cannot be created: /dev/null is "
                                                       r"a character device"),
]


def test_folders_that_are_files_or_fifos_are_refused(tmp_path):
    import os

    schema = schema_for("omgs_training")
    afile = tmp_path / "afile"
    afile.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _error(schema, {"output_dir": str(afile)}).startswith(f"output_dir: {afile} is a file, not a folder")
    assert _error(schema, {"results_dir": str(fifo)}).startswith(f"results_dir: {fifo} is a FIFO, not a folder")
    assert _error(schema, {"results_dir": str(afile / "sub")}).startswith(
        f"results_dir: {afile / 'sub'} cannot be created: {afile} is a file")
    assert _error(schema, {"runs_dir": str(afile)}).startswith(f"runs_dir: {afile} is a file, not a folder")
    # what works: a folder that exists or can be created; an existing input folder (made absolute); empty
    model = validate_parameters(schema, {"output_dir": str(tmp_path / "new" / "figs"), "results_dir": str(tmp_path),
                                         "runs_dir": str(tmp_path), "ptb_dir": ""})
    assert model.runs_dir == str(tmp_path) and model.ptb_dir == ""
    assert not (tmp_path / "new").exists(), "checking creates nothing"
    assert validate_parameters(schema_for("omgs_simulation"), {"runs_dir": "none"}).runs_dir == "none"
    assert validate_parameters(schema_for("omgs_simulation"), {"runs_dir": "data"}).runs_dir == str(ROOT / "data")


@pytest.mark.parametrize("stem, data, match", BAD, ids=[f"{s}.{k}={v!r}" for s, d, _ in BAD for k, v in d.items()])
def test_bad_values_fail_in_one_line_naming_the_parameter(stem, data, match):
    message = _error(schema_for(stem), data)
    assert re.search(match, message), message


# ----------------------------------------------------------------------------------- upper bounds

# Issue 33's values, each once accepted: timeline_workers=1e12 failed five cells into the notebook after
# tables were written, measured_workers=1e9 passed, batch_size=1e12 failed inside the first rank with an
# allocation error, and a third hist_models entry ran though the parameter's comment says at most 2.
REPORTED = [
    ("mgwfbp_simulation", "timeline_workers", 1e12, "[2, 4096]"),
    ("dear_simulation", "timeline_workers", 1e12, "[2, 4096]"),
    ("omgs_simulation", "timeline_workers", 1e12, "[2, 4096]"),
    ("compare_schedulers", "measured_workers", 1e9, "[2, 128]"),
    *[(stem, "batch_size", 1e12, "[1, 1024]") for stem in ("compare_schedulers", "dear_training", "mgwfbp_training",
                                                          "omgs_training", "osp_training", "validation")],
]


@pytest.mark.parametrize("stem, name, value, interval", REPORTED, ids=[f"{s}.{n}" for s, n, _, _ in REPORTED])
def test_reported_huge_values_are_refused_naming_notebook_parameter_value_and_range(stem, name, value, interval):
    message = _error(schema_for(stem), {name: value})
    assert message.startswith(f"{name}: Input should be less than or equal to "), message
    assert f"; {stem} takes {name} in {interval} (got {value!r})" in message, message


def test_a_third_hist_models_entry_is_refused():
    """The parameter's comment says at most 2 (the figure has two panels)."""
    message = _error(schema_for("mgwfbp_simulation"), {"hist_models": "[resnet50, bert_base, vgg16]"})
    assert message == ("hist_models: give at most 2 values, not 3; mgwfbp_simulation takes 0 to 2 values for "
                       "hist_models (got '[resnet50, bert_base, vgg16]')"), message
    assert validate_parameters(schema_for("mgwfbp_simulation"), {"hist_models": "[vgg16, bert_base]"})


def _numeric_fields():
    for stem in SCHEMAS:
        for name, field in schema_for(stem).model_fields.items():
            if notebook_type(field.annotation) in ("int", "float", "list[int]", "list[float]"):
                yield pytest.param(stem, name, id=f"{stem}.{name}")


@pytest.mark.parametrize("stem, name", list(_numeric_fields()))
def test_every_numeric_parameter_has_an_upper_bound(stem, name):
    """A numeric parameter added without a plausible range fails here: its upper bound is declared, the
    bound itself is accepted, and just past it is refused in one line naming the notebook and the range."""
    schema = schema_for(stem)
    field = schema.model_fields[name]
    bounds = parameter_bounds(field)
    assert bounds is not None and bounds.hi is not None and bounds.lo is not None, (stem, name, bounds)
    assert math.isfinite(bounds.hi), (stem, name, bounds)
    is_list = notebook_type(field.annotation).startswith("list")
    length = list_length(field)

    def given(v):
        return [v] * max(1, length.min_length) if is_list else v

    if not bounds.hi_open:
        assert validate_parameters(schema, {name: given(bounds.hi)})
    above = bounds.hi * 2 if isinstance(bounds.hi, int) else bounds.hi * 1.5 + 1
    message = _error(schema, {name: given(above)})
    assert message.startswith(f"{name}: "), message
    assert f"; {stem} takes {'each item of ' if is_list else ''}{name} in {bounds} (got " in message, message


def test_every_bounded_list_length_is_checked():
    """List parameters whose documentation states a length limit declare it (ListOf(max_length=...))."""
    limited = {(stem, name): list_length(f).max_length for stem in SCHEMAS
               for name, f in schema_for(stem).model_fields.items()
               if list_length(f) is not None and list_length(f).max_length is not None}
    assert limited == {("mgwfbp_simulation", "hist_models"): 2}


GOOD = [
    ("osp_simulation", {"staleness": 0, "stage1_share": 0, "servers": "2", "sim_workers": 2.0},
     {"staleness": 0, "stage1_share": 0.0, "servers": 2, "sim_workers": 2}),
    ("osp_simulation", {"stage1_share": 1, "stage1_shares": "0,1", "models": "resnet50"},
     {"stage1_share": 1.0, "stage1_shares": [0.0, 1.0], "models": ["resnet50"]}),
    ("mgwfbp_simulation", {"threshold_bytes": 0, "paper_check": "false", "workers": "[4, 16]", "hist_models": "[]"},
     {"threshold_bytes": 0, "paper_check": False, "workers": [4, 16], "hist_models": []}),
    ("mgwfbp_simulation", {"gpu": "k80", "models": "[googlenet, resnet50]", "timeline_model": "resnet50",
                           "paper_check": "True"}, {"gpu": "k80", "paper_check": True}),
    ("compare_schedulers", {"workers": "[6]", "cost_mode": "paper", "measured_schedulers": "[]",
                            "link_rate": "loopback"},
     {"workers": [6], "measured_schedulers": [], "link_rate": "loopback"}),
    ("compare_schedulers", {"models": "[resnet50_b64_v100-estimate]"}, {"models": ["resnet50_b64_v100-estimate"]}),
    ("mgwfbp_training", {"world_sizes": "[]", "threshold_sweep_bytes": ""},
     {"world_sizes": [], "threshold_sweep_bytes": []}),
    ("omgs_simulation", {"measured_network_preset": "", "runs_dir": "none", "gpu": "v100"},
     {"measured_network_preset": "", "runs_dir": "none"}),
    ("osp_training", {"ratio_shares": "[]", "momentum": 0}, {"ratio_shares": [], "momentum": 0.0}),
    ("validation", {"link_rates": "loopback", "threshold_bytes": 0},
     {"link_rates": ["loopback"], "threshold_bytes": 0}),
    ("validation_published", {"refit": "true", "max_nfev": 5}, {"refit": True, "max_nfev": 5}),
]


@pytest.mark.parametrize("stem, data, expected", GOOD, ids=[s for s, _, _ in GOOD])
def test_boundary_values_and_papermill_strings_are_accepted(stem, data, expected):
    model = validate_parameters(schema_for(stem), data)
    for name, value in expected.items():
        got = getattr(model, name)
        assert got == value and type(got) is type(value), (name, got)


# ------------------------------------------------------------------------------------ apply_parameters

OWN_CELL = '# Parameters (papermill -p / -y / -f; lists as "[a, b]")\nstaleness: int = 2  # SSP bound\n'


def _namespace(**values):
    ns = notebook_defaults("osp_simulation")
    ns.update(values)
    return ns


def test_apply_parameters_writes_normalised_values_back():
    from repro.figures.schemas.osp_simulation import OspSimulationParams

    ns = _namespace(staleness="3", stage1_shares="[0, 0.5]", output_dir="out/figs",
                    In=["", OWN_CELL, "# Parameters\nstaleness = \"3\"\nstage1_shares = \"[0, 0.5]\"\n"])
    p = apply_parameters(OspSimulationParams, ns)
    assert ns["staleness"] == p.staleness == 3 and ns["stage1_shares"] == [0.0, 0.5]
    assert ns["output_dir"] == ROOT / "out" / "figs" and ns["In"][1] == OWN_CELL
    with pytest.raises(Exception):
        p.staleness = 4  # frozen: the namespace holds the values the notebook uses


def test_apply_parameters_refuses_names_papermill_injected_that_the_schema_lacks():
    from repro.figures.schemas.osp_simulation import OspSimulationParams

    injected = "# Parameters\nnosuchparam = 5\nstaleness = 1\nstalenes, other = 1, 2\n"
    assert injected_parameter_names({"In": ["", OWN_CELL, injected]}) == ["nosuchparam", "staleness", "stalenes",
                                                                          "other"]
    with pytest.raises(ParameterError) as e:
        apply_parameters(OspSimulationParams, _namespace(nosuchparam=5, In=["", OWN_CELL, injected]))
    message = str(e.value)
    assert message.startswith("nosuchparam, stalenes, other: unknown parameters (osp_simulation has models, ")
    assert "staleness, stage1_shares" in message and "\n" not in message
    # the notebook's own parameters cell and cells assigning other names are not papermill's
    assert injected_parameter_names({"In": ["", OWN_CELL, "x = 1\n", "# Parameters\n"]}) == []
    assert injected_parameter_names({}) == [] and injected_parameter_names({"In": "not a list"}) == []
    assert apply_parameters(OspSimulationParams, _namespace()).staleness == 2  # no In (plain Python): fine


def test_apply_parameters_names_the_bad_value():
    from repro.figures.schemas.osp_simulation import OspSimulationParams

    ns = _namespace(staleness=2.5, In=["", OWN_CELL, "# Parameters\nstaleness = 2.5\n"])
    with pytest.raises(ParameterError, match=r"^staleness: .*fractional part \(got 2\.5\)$"):
        apply_parameters(OspSimulationParams, ns)
    assert ns["staleness"] == 2.5  # nothing written back on failure


def test_several_bad_parameters_share_one_line():
    message = _error(schema_for("osp_simulation"), {"staleness": -3, "servers": "abc"})
    assert message.startswith("2 bad parameters (osp_simulation): ")
    assert "servers: Input should be a valid integer" in message and "staleness: Input should be greater" in message


# ------------------------------------------------------------------------------- the notebook, for real

def _kernel() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    return "repro" if "repro" in KernelSpecManager().find_kernel_specs() else "python3"


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("name, value", [("staleness", -3), ("staleness", 2.5), ("stage1_share", "abc"),
                                         ("servers", "abc"), ("nosuchparam", 5)], ids=lambda v: repr(v))
def test_osp_simulation_refuses_a_bad_parameter_before_writing_anything(tmp_path, name, value):
    """The red team's values: each fails at once, naming the parameter, and neither folder gets a file
    (staleness -3 used to fail after five files, 2.5 to run as 2, "abc" to fail with a bare TypeError)."""
    import papermill as pm

    figures, data = tmp_path / "figures", tmp_path / "data"
    figures.mkdir()
    data.mkdir()
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(ROOT / "notebooks" / "osp_simulation.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={name: value, "output_dir": str(figures), "results_dir": str(data)},
                            kernel_name=_kernel(), progress_bar=False, cwd=str(ROOT))
    assert e.value.ename == "ParameterError", e.value.ename
    assert e.value.evalue.startswith(f"{name}: "), e.value.evalue
    assert "\n" not in e.value.evalue
    assert list(figures.rglob("*")) == [] and list(data.rglob("*")) == []


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("stem, name, value", [("mgwfbp_simulation", "timeline_workers", 1e12),
                                               ("compare_schedulers", "measured_workers", 1e9),
                                               ("compare_schedulers", "batch_size", 1e12),
                                               ("mgwfbp_simulation", "hist_models", "[resnet50, bert_base, vgg16]")],
                         ids=lambda v: repr(v))
def test_reported_values_stop_the_notebook_before_it_writes_anything(tmp_path, stem, name, value):
    """Issue 33's values, run for real: the first code cell stops the notebook with one line naming the
    notebook and the parameter, and neither output folder gets a file (timeline_workers=1e12 used to
    fail in cell 5 after tables were written, batch_size=1e12 inside the first rank)."""
    import papermill as pm

    figures, data = tmp_path / "figures", tmp_path / "data"
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(ROOT / "notebooks" / f"{stem}.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={name: value, "output_dir": str(figures), "results_dir": str(data)},
                            kernel_name=_kernel(), progress_bar=False, cwd=str(ROOT))
    assert e.value.ename == "ParameterError", e.value.ename
    assert e.value.evalue.startswith(f"{name}: ") and f"; {stem} takes " in e.value.evalue, e.value.evalue
    assert "\n" not in e.value.evalue
    assert not figures.exists() or list(figures.rglob("*")) == []
    assert not data.exists() or list(data.rglob("*")) == []
