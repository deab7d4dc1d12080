import json
import re

import pytest

from repro.core.trace import Trace, TraceError, load_trace
from tests.helpers import make_trace


def _valid():
    return {"model": "m", "batch_size": 8, "device": "cpu", "dtype": "float32", "note": "kept",
            "layers": [{"name": "a", "params": 10, "bytes": 40, "forward_s": 0.1, "backward_s": 0.2,
                        "kind": "conv"},
                       {"name": "b", "params": 0, "bytes": 0, "forward_s": 0.0, "backward_s": 0.0}]}


def test_json_round_trip_keeps_extra_keys(tmp_path):
    t = Trace.from_dict(_valid())
    p = tmp_path / "t.json"
    t.save(p)
    back = Trace.load(p)
    assert back == t
    assert back.to_dict() == _valid()
    assert back.extra["note"] == "kept" and back.layers[0].extra["kind"] == "conv"
    assert back.total_bytes == 40 and back.total_params == 10
    assert back.total_forward_s == pytest.approx(0.1) and back.total_backward_s == pytest.approx(0.2)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("model"), "'model' is missing"),
    (lambda d: d.update(batch_size=-1), "'batch_size' = -1 is outside the plausible range [1, 2**24]"),
    (lambda d: d.update(batch_size="8"), "'batch_size' must be an integer"),
    (lambda d: d.update(layers=[]), "'layers' is empty"),
    (lambda d: d.pop("layers"), "'layers' is missing"),
    (lambda d: d["layers"][1].pop("bytes"), "'layers[1].bytes' is missing"),
    (lambda d: d["layers"][0].update(backward_s=-0.1), "'layers[0].backward_s' = -0.1 is outside the plausible range [0, 1e6] s"),
    (lambda d: d["layers"][0].update(params=-3), "'layers[0].params' = -3 is outside the plausible range [0, 2**50]"),
    (lambda d: d["layers"][0].update(forward_s="fast"), "'layers[0].forward_s' must be a number of seconds"),
    (lambda d: d["layers"][0].update(forward_s=float("nan")), "'layers[0].forward_s' must be a finite"),
    (lambda d: d["layers"][1].update(name="a"), "duplicate layer names"),
])
def test_malformed_trace_names_the_field(mutate, field):
    d = _valid()
    mutate(d)
    with pytest.raises(TraceError, match=re.escape(field)):
        Trace.from_dict(d)


def test_non_json_and_non_object_rejected(tmp_path):
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.from_json("{nope")
    with pytest.raises(TraceError, match="must be a JSON object"):
        Trace.from_json(json.dumps([1, 2]))
    p = tmp_path / "bad.json"
    p.write_text("garbage")
    with pytest.raises(TraceError, match="bad.json"):
        Trace.load(p)
    with pytest.raises(TraceError, match="not found"):
        Trace.load(tmp_path / "missing.json")


def test_numpy_views_are_forward_order():
    t = make_trace([1.0, 2.0, 3.0], [4, 8, 12])
    assert list(t.backward_s()) == [1.0, 2.0, 3.0]
    assert list(t.bytes()) == [4, 8, 12]
    assert t.index() == {"l0": 0, "l1": 1, "l2": 2}


def test_unknown_shipped_trace_name_lists_known():
    with pytest.raises(FileNotFoundError, match="no shipped trace named"):
        load_trace("no_such_trace_b1_cpu")


def test_overflowing_times_are_refused_not_printed_as_infinity():
    from repro.core.trace import Layer, Trace, TraceError

    with pytest.raises(TraceError, match=r"'layers\[0\]\.forward_s' = 1e\+308 is outside the plausible range"):
        Trace("m", 1, "cpu", "float32", [Layer("a", 1, 4, 1e308, 1e308), Layer("b", 1, 4, 1e308, 0.0)])
    # each layer plausible, the iteration they add up to not
    with pytest.raises(TraceError, match=r"add up to 1\.2e\+06 s per iteration, outside the plausible range"):
        Trace("m", 1, "cpu", "float32", [Layer("a", 1, 4, 6e5, 0.0), Layer("b", 1, 4, 6e5, 0.0)])


# ---- every load error names the file; shipped names stay in the shipped folder ----

def test_load_errors_name_the_file(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"model": "caf\xe9"}')
    folder = tmp_path / "folder.json"
    folder.mkdir()
    for path, message in [(deep, "nested too deeply"), (latin, "not UTF-8"), (folder, "is a folder"),
                          (tmp_path / "missing.json", "not found")]:
        with pytest.raises(TraceError) as e:
            load_trace(path)
        assert str(path) in str(e.value) and message in str(e.value), str(e.value)
        assert len(str(e.value).splitlines()) == 1
    with pytest.raises(TraceError, match="is a folder"):
        load_trace(tmp_path)  # no .json suffix: a folder that exists is still a folder
    with pytest.raises(TraceError, match="is not a regular file"):
        load_trace("/dev/null")


@pytest.mark.parametrize("name", ["..", "../calibration/10gbe-calibrated", "../traces/tiny_vgg_b32_cpu",
                                  "tiny_vgg_b32_cpu/..", "x/../../data", "..tiny_vgg_b32_cpu", "a..b"])
def test_shipped_trace_names_cannot_leave_the_shipped_folder(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # none of these exists here as a path
    # before, "../calibration/10gbe-calibrated" reached data/calibration/10gbe-calibrated.json
    with pytest.raises(TraceError) as e:
        load_trace(name)
    assert len(str(e.value).splitlines()) == 1
    assert load_trace("tiny_vgg_b32_cpu").model == "tiny_vgg"


# ---- every number of a trace file is checked when read ----

def _shipped_dict() -> dict:
    from repro.core.paths import shipped_trace_path

    return json.loads(shipped_trace_path("tiny_resnet_b32_cpu").read_text())


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["layers"][0].update(bytes=7),
     "trace field 'layers[0].bytes' = 7 does not match its params 432 x 4 bytes (float32) = 1728"),
    (lambda d: d["layers"][0].update(params=0),
     "trace field 'layers[0].bytes' = 1728 does not match its params 0 x 4 bytes (float32) = 0"),
    (lambda d: d.update(wall_forward_s=-5.0), "trace field 'wall_forward_s' = -5.0 is outside the plausible range"),
    (lambda d: d.update(backward_tail_s=1e12), "trace field 'backward_tail_s' = 1000000000000.0 is outside"),
    (lambda d: d["layers"][1].update(grad_abs_mean=float("nan")),
     "trace field 'layers[1].grad_abs_mean' must be a finite number, got nan"),
    (lambda d: d["layers"][1].update(grad_abs_mean=-1.0), "trace field 'layers[1].grad_abs_mean' must be >= 0"),
    (lambda d: d.update(iters=-3), "trace field 'iters' = -3 is outside the plausible range"),
    (lambda d: d.update(forward_flops=1e30), "trace field 'forward_flops' = 1e+30 is outside the plausible range"),
    (lambda d: d.update(assumptions={"peak_flops": float("inf")}),
     "trace field 'assumptions.peak_flops' must be a finite number"),
])
def test_every_number_of_a_trace_file_is_checked(tmp_path, mutate, words):
    d = _shipped_dict()
    assert d["dtype"] == "float32" and d["layers"][0]["params"] == 432
    mutate(d)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))  # NaN written as the bare token NaN, as Python's json reads it
    with pytest.raises(TraceError) as e:
        Trace.load(path)
    assert words in str(e.value) and str(path) in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_mixed_dtype_traces_skip_the_bytes_check(tmp_path):
    d = _shipped_dict()
    d["dtype"] = "mixed"
    d["layers"][0]["bytes"] = 7
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    assert Trace.load(path).layers[0].bytes == 7


def test_every_shipped_trace_still_loads():
    from repro.core.paths import shipped_traces

    for name in shipped_traces():
        load_trace(name)
