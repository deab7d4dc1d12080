"""One parameter schema per notebook (repro.figures.schemas): it agrees with the notebook's parameters
cell, refuses bad values in one line naming the parameter, and the notebook applies it before it writes
anything (unknown parameter names included)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from repro.figures.params import (ParameterError, apply_parameters, injected_parameter_names, notebook_type,
                                  validate_parameters)
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
    """Same names in the same order, same types, same defaults: the schema cannot drift from the notebook."""
    schema = schema_for(nb_path.stem)
    assert schema.notebook == nb_path.stem
    cell = _parameters_cell(nb_path)
    assert list(schema.model_fields) == list(cell), nb_path.stem
    for name, field in schema.model_fields.items():
        annotation, default = cell[name]
        assert notebook_type(field.annotation) == annotation, (nb_path.stem, name)
        assert field.default == default and type(field.default) is type(default), (nb_path.stem, name)
    schema()  # the defaults themselves are valid


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_applies_its_schema_first(nb_path):
    """The first code cell after the parameters applies the notebook's own schema, and no cell before it
    writes anything; the old scattered checks are gone."""
    code = [_source(c) for c in _cells(nb_path) if c["cell_type"] == "code"]
    call = f"apply_parameters({SCHEMAS[nb_path.stem]}, globals())"
    assert call in code[1], nb_path.stem
    assert f"from repro.figures.schemas.{nb_path.stem} import {SCHEMAS[nb_path.stem]}" in code[1]
    before = code[1].split(call)[0]
    assert not re.search(r"\b(write_table|save_figure|clear_runs|mkdir|run_\w+|usable_bandwidths)\(", before), nb_path.stem
    text = "\n".join(code)
    assert "parse_list(" not in text and "parse_choice(" not in text, nb_path.stem
