"""Numbers that cannot be (issue 33, items 3-6): every number read from a file has a plausible range
(repro.ranges), checked where the file is read and refused in one line naming the file, the field, the
value and the range."""

import json

import pytest

from repro import ranges
from repro.trace import Trace, TraceError


def _trace(**layer1):
    layer = {"name": "b", "params": 10, "bytes": 40, "forward_s": 1e-3, "backward_s": 2e-3}
    layer.update(layer1)
    return {"model": "m", "batch_size": 8, "device": "cpu", "dtype": "float32",
            "layers": [{"name": "a", "params": 10, "bytes": 40, "forward_s": 1e-3, "backward_s": 2e-3}, layer]}


def _one_line(msg: str) -> str:
    assert "\n" not in msg
    return msg


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return path


# ---- the table -------------------------------------------------------------------------------------------
def test_check_names_field_value_and_range():
    with pytest.raises(ValueError) as e:
        ranges.check(ranges.ELEMENTS, 10 ** 30, "layers[1].params")
    assert str(e.value) == ("field 'layers[1].params' = 1000000000000000000000000000000 is outside the plausible "
                            "range [0, 2**50] elements")
    with pytest.raises(ValueError, match=r"must be a finite number of seconds in \[0, 1e6\] s, got nan"):
        ranges.check(ranges.SECONDS, float("nan"), "iteration_s")
    with pytest.raises(ValueError, match=r"must be a number of seconds in \[0, 1e6\] s, got 'x'"):
        ranges.check(ranges.SECONDS, "x", "iteration_s")
    with pytest.raises(ValueError, match=r"= 1 is outside the plausible range \[2, 100000\] workers"):
        ranges.check(ranges.WORKERS, 1, "workers", low=2)
    assert ranges.check(ranges.WORKERS, 4.0, "workers") == 4.0
    assert "integer of" in ranges.show(10 ** 400)


# ---- traces (items 3, 4, 5) ------------------------------------------------------------------------------
def test_trace_params_1e30_is_refused_naming_file_and_field(tmp_path):
    """Item 3: params 10**30 ended in an OverflowError (an internal error) naming no file."""
    p = _write(tmp_path / "big.json", _trace(params=10 ** 30))
    with pytest.raises(TraceError) as e:
        Trace.load(p)
    msg = _one_line(str(e.value))
    assert str(p) in msg and "'layers[1].params'" in msg and "[0, 2**50]" in msg and "1" * 1 + "0" * 30 in msg


@pytest.mark.parametrize("field, value, rng", [
    ("backward_s", 1e300, "[0, 1e6] s"), ("forward_s", 2e6, "[0, 1e6] s"), ("bytes", 2 ** 51, "[0, 2**50] bytes"),
])
def test_trace_absurd_finite_numbers_are_refused(tmp_path, field, value, rng):
    """Item 4: finite but impossible numbers were accepted."""
    p = _write(tmp_path / "t.json", _trace(**{field: value}))
    with pytest.raises(TraceError) as e:
        Trace.load(p)
    msg = _one_line(str(e.value))
    assert str(p) in msg and f"'layers[1].{field}'" in msg and rng in msg


def test_trace_model_totals_are_in_range(tmp_path):
    d = _trace(bytes=2 ** 50)
    d["layers"][0]["bytes"] = 2 ** 50
    with pytest.raises(TraceError, match=r"'layers\[\*\]\.bytes' adds up to .* outside the plausible range"):
        Trace.from_dict(d)
    d = _trace()
    d["overheads"] = {"update_s": 1e300}
    with pytest.raises(TraceError, match=r"'overheads.update_s' = 1e\+300 is outside"):
        Trace.from_dict(d)


def test_trace_dtype_float99_is_refused(tmp_path):
    """Item 5: a dtype of "float99" was accepted."""
    d = _trace()
    d["dtype"] = "float99"
    p = _write(tmp_path / "t.json", d)
    with pytest.raises(TraceError) as e:
        Trace.load(p)
    msg = _one_line(str(e.value))
    assert str(p) in msg and "'dtype'" in msg and "float99" in msg and "float32" in msg
