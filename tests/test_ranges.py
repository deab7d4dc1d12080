"""Numbers that cannot be (issue 33, items 3-6): every number read from a file has a plausible range
(repro.core.ranges), checked where the file is read and refused in one line naming the file, the field, the
value and the range."""

import json

import pytest

from repro.core import ranges
from repro.core.trace import Trace, TraceError


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
    for layer in d["layers"]:  # each layer's bytes its params x 4 (float32), as the loader checks
        layer["params"] = layer["bytes"] // 4
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


# ---- plans (items 4, 5, 6) -------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ('{"buckets": [["a", "b"]], "iteration_s": 1e308}', "'iteration_s' = 1e+308 is outside the plausible range [0, 1e6] s"),
    ('{"buckets": [["a", "b"]], "iteration_s": "x"}', "'iteration_s' must be a number of seconds in [0, 1e6] s, got 'x'"),
    ('{"buckets": [["a", "b"]], "iteration_s": NaN}', "'iteration_s' must be a finite number of seconds"),
    ('{"buckets": [["a", "b"]], "threshold_bytes": 1e300}', "'threshold_bytes' = 1e+300 is outside the plausible"),
    ('{"buckets": [{"layers": ["a"], "piece": [0, 1e300]}, ["b"]]}', "'buckets[0].piece[1]'"),
    ('{"family": "ps", "buckets": [{"layers": ["a", "b"], "messages": ["push", "pull"]}], '
     '"options": {"mode": "bsp", "servers": 1e12, "bucket_servers": [0]}}', "'servers' of family 'ps' must be <= 100000"),
])
def test_plan_file_numbers_out_of_range_are_refused(tmp_path, text, expected):
    """Items 4 and 5: a plan's iteration_s of 1e308, "x" or NaN was accepted."""
    from repro.core.plan import Plan, PlanError

    p = tmp_path / "plan.json"
    p.write_text(text)
    with pytest.raises(PlanError) as e:
        Plan.load(p)
    msg = _one_line(str(e.value))
    assert msg.startswith(f"{p}: ") and expected in msg


def test_plan_meta_null_prediction_and_shipped_style_plans_load(tmp_path):
    from repro.core.plan import Plan

    p = tmp_path / "plan.json"
    p.write_text('{"buckets": [["a", "b"]], "iteration_s": null, "lower_bound_s": 0.5, "gap_pct": 3.0}')
    assert Plan.load(p).meta["lower_bound_s"] == 0.5


def test_plan_layer_not_in_trace_names_the_bucket():
    from repro.core.plan import Plan, PlanError

    t = Trace.from_dict(_trace())
    with pytest.raises(PlanError, match=r"'buckets\[1\]': layer 'c' is not in trace 'm'"):
        Plan.from_dict({"buckets": [["a"], ["c"]]}).groups(t)


def _cli(capsys, *argv):
    from repro.cli.main import main

    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_simulate_plan_trace_mismatch_names_both_files(capsys, tmp_path):
    """Item 6: `repro simulate --trace T --plan P` with layers T lacks named neither file."""
    t = _write(tmp_path / "trace.json", _trace())
    p = _write(tmp_path / "plan.json", {"buckets": [["a", "c"]]})
    rc, out, err = _cli(capsys, "simulate", "--trace", t, "--plan", p, "--alpha-s", "1e-4", "--beta-s-per-byte", "1e-9")
    assert rc == 2 and out == ""
    line = _one_line(err.strip())
    assert line.startswith(f"repro: error: {p}: ") and "'buckets[0]'" in line and "'c'" in line and str(t) in line


def test_cli_trace_params_1e30_is_one_line_not_an_internal_error(capsys, tmp_path):
    """Item 3 at the command line: exit 2, one line naming the file and field, nothing written."""
    t = _write(tmp_path / "big.json", _trace(params=10 ** 30))
    p = _write(tmp_path / "plan.json", {"buckets": [["a", "b"]]})
    out_file = tmp_path / "out.json"
    rc, out, err = _cli(capsys, "simulate", "--trace", t, "--plan", p, "--network", "10gbe-v100", "--workers", 4,
                        "-o", out_file)
    assert rc == 2 and out == "" and not out_file.exists()
    line = _one_line(err.strip())
    assert "internal error" not in line and str(t) in line and "'layers[1].params'" in line and "[0, 2**50]" in line


# ---- cost files, measurements, cluster files (items 4, 6) -----------------------------------------------
def test_cost_fit_csv_row_of_1e300_bytes_is_refused(tmp_path):
    """Item 4: one `bytes: 1e300` row silently wrecked the fit (b = 2e-302 s/byte)."""
    from repro.costs.cluster_cost import fit_measurements_csv
    from repro.core.cost import CostModelError

    p = tmp_path / "m.csv"
    p.write_text("bytes,workers,seconds,collective\n1000,4,0.001,allreduce\n1e6,4,0.01,allreduce\n"
                 "1e300,4,0.02,allreduce\n")
    with pytest.raises(CostModelError) as e:
        fit_measurements_csv(p)
    assert _one_line(str(e.value)) == f"{p}:4: column 'bytes' = 1e+300 is outside the plausible range [0, 2**50] bytes (1 PiB)"
    p.write_text("bytes,workers,seconds,collective\n1000,1e9,0.001,allreduce\n")
    with pytest.raises(CostModelError, match=r"m\.csv:2: column 'workers' = 1000000000\.0 is outside the plausible "
                                             r"range \[2, 100000\] workers"):
        fit_measurements_csv(p)


@pytest.mark.parametrize("change, expected", [
    ({"workers": 1e300}, "'workers' = 1e+300 is outside the plausible range [2, 100000] workers"),
    ({"lines": {"allreduce": {"a_s": 1e308, "b_s_per_byte": 1e-9}}}, "'lines.allreduce.a_s' = 1e+308 is outside"),
    ({"lines": {"allreduce": {"a_s": 1e-4, "b_s_per_byte": 5.0}}}, "'lines.allreduce.b_s_per_byte' = 5.0 is outside"),
    ({"topk_gamma_s": 1.0}, "'topk_gamma_s' = 1.0 is outside the plausible range [0, 1e-3] s"),
    ({"realism": {"compute_scale": 1e300}}, "'compute_scale' = 1e+300 is outside"),
])
def test_cost_file_numbers_out_of_range_are_refused(tmp_path, change, expected):
    from repro.core.cost import CostModel, CostModelError

    d = {"workers": 4, "lines": {"allreduce": {"a_s": 1e-4, "b_s_per_byte": 1e-9}}}
    d.update(change)
    p = _write(tmp_path / "cost.json", d)
    with pytest.raises(CostModelError) as e:
        CostModel.load(p)
    msg = _one_line(str(e.value))
    assert msg.startswith(f"{p}: ") and expected in msg


def test_cost_file_without_allreduce_line_names_the_file(tmp_path, capsys):
    """Item 6: a cost file without an all-reduce line said "cost model 'custom' ..." naming no file."""
    p = _write(tmp_path / "cost.json", {"workers": 4, "lines": {"push": {"a_s": 1e-3, "b_s_per_byte": 1e-9}}})
    t = _write(tmp_path / "trace.json", _trace())
    rc, out, err = _cli(capsys, "plan", "--trace", t, "--solver", "mgwfbp", "--cost", p)
    assert rc == 2 and out == ""
    line = _one_line(err.strip())
    assert f"cost file {p}" in line and "no allreduce line" in line


def test_cluster_file_rate_and_latency_out_of_range(tmp_path):
    from repro.costs.cluster_cost import load_cluster, parse_link
    from repro.core.cost import CostModelError

    base = {"schema": "repro.launch", "version": 1, "gpus_per_node": 4}
    p = _write(tmp_path / "c.json", {**base, "inter_link": {"rate_bits_per_s": 1e30, "latency_s": 2e-5}})
    with pytest.raises(CostModelError, match=r"c\.json: field 'inter_link\.rate_bits_per_s' = 1e\+30 is outside "
                                             r"the plausible range \[8, 1e15\] bit/s"):
        load_cluster(p)
    p = _write(tmp_path / "c.json", {**base, "inter_link": "25gbit@1e9s"})
    with pytest.raises(CostModelError, match=r"c\.json: inter_link: latency '1e9s' is outside the plausible range"):
        load_cluster(p)
    p = _write(tmp_path / "c.json", {**base, "gpus_per_node": 10 ** 12, "inter_link": "25gbit"})
    with pytest.raises(CostModelError, match=r"'gpus_per_node' = 1000000000000 is outside"):
        load_cluster(p)
    with pytest.raises(CostModelError, match="outside the plausible range"):
        parse_link("1e30gbit", "--inter-link", 25e-6)


# ---- grid files (items 4, 6) -----------------------------------------------------------------------------
_GRID = """paper: mgwfbp
notebook: nb
gpus_per_node: {gpn}
train: {{dataset: synthetic, steps: {steps}}}
experiments:
  - name: e
    models: {{resnet50: {{batch_size: {batch}}}}}
    world_sizes: [2, {p}]
    schedulers: [wfbp]
"""


@pytest.mark.parametrize("values, expected", [
    ({"p": 10 ** 9}, "experiments[0]: field 'world_sizes[1]' = 1000000000 is outside the plausible range [1, 100000]"),
    ({"gpn": 10 ** 9}, "field 'gpus_per_node' = 1000000000 is outside the plausible range [1, 100000] workers"),
    ({"batch": 2 ** 40}, "'batch_size' = 1099511627776 is outside the plausible range [1, 2**24] samples"),
    ({"steps": "1.0e+300"}, "'train.steps' = 1e+300 is outside the plausible range [0, 1e9]"),
])
def test_grid_numbers_out_of_range_are_refused(tmp_path, values, expected):
    from repro.grids.grid import GridError, load_grid

    kw = {"gpn": 4, "steps": 10, "batch": 32, "p": 4, **values}
    p = tmp_path / "g.yaml"
    p.write_text(_GRID.format(**kw))
    load = lambda: load_grid(str(p))  # noqa: E731
    with pytest.raises(GridError) as e:
        load()
    msg = _one_line(str(e.value))
    assert msg.startswith(f"{p}: ") and expected in msg


def test_non_utf8_grid_file_is_named(tmp_path, capsys):
    """Item 6: `repro grid check bad.yaml` of non-UTF-8 bytes printed a codec error naming no file."""
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"paper: x\xff\xfe\n")
    rc, out, err = _cli(capsys, "grid", "check", p)
    assert rc == 2 and out == ""
    assert _one_line(err.strip()) == f"repro: error: {p}: a grid file is UTF-8 YAML text, but byte 8 is not UTF-8"
