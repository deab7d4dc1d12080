"""Cluster files (repro.costs.cluster_cost.ClusterDescription, `repro cost cluster`): one file describes a cluster
(node size, links, algorithm, top-k cost) and gives the cost model of ANY P, built by the same cluster-cost
builder as the --nodes/--gpus-per-node/--inter-link flags on ceil(P / gpus_per_node) nodes; one-P cost
files keep working as before."""

from __future__ import annotations

import json
import math

import pytest

from repro.costs.cluster_cost import (
    CLUSTER_SCHEMA, ClusterDescription, cluster_cost_model, is_cluster_file, load_cluster, load_cost,
    parse_link)
from repro.core.cost import CostModel, CostModelError
from repro.costs.presets import is_cost_file, preset, preset_workers


def _write(path, **over):
    data = {"schema": "repro.launch", "version": 1, "gpus_per_node": 4, "inter_link": "25gbit@20us",
            "intra_link": "300GB/s@3us", "algorithm": "ring", **over}
    data = {k: v for k, v in data.items() if v is not ...}
    path.write_text(json.dumps(data))
    return str(path)


def _same(a: CostModel, b: CostModel) -> None:
    assert a.workers == b.workers and set(a.lines) == set(b.lines)
    for k in a.lines:
        assert a.lines[k].a_s == pytest.approx(b.lines[k].a_s, rel=1e-12)
        assert a.lines[k].b_s_per_byte == pytest.approx(b.lines[k].b_s_per_byte, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical", "tree"])
def test_preset_of_a_cluster_file_is_the_builders_model_for_every_p(tmp_path, algorithm):
    path = _write(tmp_path / "c.json", algorithm=algorithm, topk_gamma_s=1e-10)
    inter, intra = parse_link("25gbit@20us", "x", 0), parse_link("300GB/s@3us", "x", 0)
    assert is_cluster_file(path) and is_cost_file(path) and preset_workers(path) is None
    for p in (2, 4, 8, 16, 64, 1024):
        got = preset(path, p)
        _same(got, cluster_cost_model(math.ceil(p / 4), 4, inter, intra, algorithm, p))
        assert got.topk_gamma_s == 1e-10 and "cluster" in got.source
        _same(load_cost(path, p, "--network"), got)  # --network/--cost FILE take it too


def test_a_cluster_file_round_trips(tmp_path):
    c = ClusterDescription(gpus_per_node=8, inter=parse_link("100mbit@50us", "x", 0), intra=None,
                           algorithm="hierarchical", topk_gamma_s=2e-10, topk_source="mine", name="lab")
    path = tmp_path / "lab.json"
    path.write_text(c.to_json())
    back = load_cluster(path)
    assert back.to_dict() == c.to_dict() and back.intra is None and back.name == "lab"
    assert back.inter.alpha_s == pytest.approx(50e-6) and back.inter.beta_s_per_byte == pytest.approx(8 / 1e8)
    assert json.loads(path.read_text())["schema"] == CLUSTER_SCHEMA
    _same(preset(str(path), 32), c.cost_model(32))


@pytest.mark.parametrize("change, words", [
    ({"schema": "other"}, "schema must be 'repro.launch'"),
    ({"version": 2}, "version 2 is not supported"),
    ({"colour": 1}, "unknown key(s) colour"),
    ({"inter_link": ...}, "inter_link is missing"),
    ({"inter_link": "25gbps"}, "ambiguous"),
    ({"inter_link": {"rate_bits_per_s": -1, "latency_s": 0}}, "'inter_link.rate_bits_per_s' = -1 is outside the plausible range [8, 1e15] bit/s"),
    ({"gpus_per_node": 0}, "'gpus_per_node' = 0 is outside the plausible range [1, 100000]"),
    ({"algorithm": "star"}, "algorithm 'star' unknown"),
    ({"topk_gamma_s": "fast"}, "'topk_gamma_s' must be a number of seconds"),
])
def test_a_bad_cluster_file_is_refused_in_one_line_naming_the_problem(tmp_path, change, words):
    path = _write(tmp_path / "bad.json", **change)
    with pytest.raises(CostModelError) as e:
        load_cluster(path) if change.get("schema") == "other" else preset(path, 8)
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "bad.json" in msg, msg


def test_cluster_file_errors_name_the_file_and_p(tmp_path):
    path = _write(tmp_path / "c.json")
    with pytest.raises(CostModelError, match=r"c\.json: P=6 does not fill whole nodes of 4 GPUs"):
        preset(path, 6)
    with pytest.raises(CostModelError, match="integer >= 2"):
        preset(path, 1)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(CostModelError, match=r"broken\.json: not JSON"):
        load_cluster(tmp_path / "broken.json")
    with pytest.raises(CostModelError, match="needs --workers P"):
        load_cost(path, None, "--cost")


def test_one_p_cost_files_work_as_before(tmp_path):
    path = tmp_path / "fit.json"
    CostModel.linear(8, 1e-4, 1e-9, source="fit").save(path)
    assert not is_cluster_file(path) and preset_workers(str(path)) == [8]
    assert preset(str(path), 8).lines["allreduce"].a_s == 1e-4
    with pytest.raises(CostModelError, match="is for P=8 workers, asked for P=16"):
        preset(str(path), 16)


def test_repro_cost_cluster_writes_a_file_every_p_reads(tmp_path, capsys):
    from repro.cli.main import main

    out = tmp_path / "mine.json"
    assert main(["cost", "cluster", "--gpus-per-node", "8", "--inter-link", "25gbit@20us", "--intra-link",
                 "300GB/s@3us", "--algorithm", "hierarchical", "--topk-device", "A100", "--name", "mine",
                 "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == "repro.launch" and data["version"] == 1 and data["gpus_per_node"] == 8
    assert data["inter_link"]["rate_bits_per_s"] == pytest.approx(25e9) and data["topk_gamma_s"] > 0
    for p in (4, 8, 16, 256):
        assert preset(str(out), p).workers == p
    assert main(["cost", "cluster", "--gpus-per-node", "8", "--inter-link", "25gbps"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--inter-link" in err and "ambiguous" in err
    assert main(["cost", "cluster", "--gpus-per-node", "4", "--inter-link", "1gbit", "--topk-gamma", "1e-10",
                 "--topk-device", "V100"]) == 2
    assert "give one top-k cost" in capsys.readouterr().err
    plan = tmp_path / "plan.json"  # a command's --network takes it for its P
    assert main(["plan", "--trace", "resnet50_b32_v100-estimate", "--solver", "mgwfbp", "--network", str(out),
                 "--workers", "32", "-o", str(plan)]) == 0
    assert json.loads(plan.read_text())


def test_a_simulation_notebook_takes_a_cluster_file_as_a_preset(tmp_path):
    from repro.figures.params import ParameterError, validate_parameters
    from repro.figures.schemas.mgwfbp_simulation import MgwfbpSimulationParams
    from repro.studies import mgwfbp_sim

    path = _write(tmp_path / "c.json")
    params = validate_parameters(MgwfbpSimulationParams, {"network_presets": [path, "10gbe-derived"],
                                                          "timeline_network_preset": path})
    assert params.network_presets[0] == path
    workers = [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    assert mgwfbp_sim.workers_for(path, workers) == workers  # the sweep keeps every P
    bad = _write(tmp_path / "bad.json", version=9)
    with pytest.raises(ParameterError) as e:
        validate_parameters(MgwfbpSimulationParams, {"network_presets": [bad]})
    assert "version 9 is not supported" in str(e.value)
