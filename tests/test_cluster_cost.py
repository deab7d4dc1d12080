"""A user's cluster as a cost model (repro.costs.cluster_cost), torch-free: rates and latencies parsed or refused
in one line naming the flag, every family's collective lines written out from the ring / two-level / flat
formulas, the top-k device table, cost sources by name or file, and fitting measured collectives."""

import math

import numpy as np
import pytest

from repro.costs.cluster_cost import (
    CLUSTER_ALGORITHMS, DEFAULT_INTER_LATENCY_S, DEFAULT_INTRA_LATENCY_S, PUBLISHED_TOPK_GAMMA_S,
    TOPK_DEVICES, cluster_cost_model, default_intra_link, fit_measurements, fit_measurements_csv, load_cost,
    parse_latency, parse_link, parse_rate, topk_device_of_trace, topk_gamma_for_device)
from repro.core.cost import COLLECTIVES, CostModel, CostModelError, Linear
from repro.core.topology import Link
from repro.core.trace import load_trace

# Parsed numbers are products of a decimal mantissa and a power of ten or two: equal to the written-out
# value up to a few ulps, so a relative tolerance of 1e-12 allows rounding and nothing else.
RTOL = 1e-12


@pytest.mark.parametrize("text, bits_per_s", [
    ("25gbit", 25e9), ("100mbit", 100e6), ("1.5Gbit", 1.5e9), ("512kibit", 512 * 1024), ("1e9bit", 1e9),
    ("10GB/s", 80e9), ("500MB/s", 4e9), ("1GiB/s", 8 * 2 ** 30), ("3 GB/s", 24e9),
])
def test_rates_in_bits_or_bytes_per_second(text, bits_per_s):
    assert parse_rate(text, "--inter-link") == pytest.approx(bits_per_s, rel=RTOL)


@pytest.mark.parametrize("text, message", [
    ("25gbps", "ambiguous"), ("10gb/s", "ambiguous"), ("10Gb/s", "ambiguous"), ("fast", "cannot read rate"),
    ("0gbit", "must be positive"), ("-1gbit", "cannot read rate"), ("25", "cannot read rate"),
])
def test_bad_rates_are_one_line_naming_the_flag(text, message):
    with pytest.raises(CostModelError, match=message) as e:
        parse_rate(text, "--inter-link")
    assert str(e.value).startswith("--inter-link: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("text, seconds", [("5us", 5e-6), ("0.5ms", 5e-4), ("200ns", 2e-7), ("1e-5s", 1e-5),
                                           ("0us", 0.0), ("3µs", 3e-6)])
def test_latencies_need_a_unit(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds, rel=RTOL)


@pytest.mark.parametrize("text", ["5", "5 parsecs", "fast", "-5us"])
def test_bad_latencies_are_refused(text):
    with pytest.raises(CostModelError, match="--intra-link: cannot read latency"):
        parse_latency(text, "--intra-link")


def test_a_link_is_a_rate_and_a_latency_with_a_default():
    link = parse_link("25gbit@20us", "--inter-link", DEFAULT_INTER_LATENCY_S)
    assert link.alpha_s == pytest.approx(20e-6, rel=RTOL) and link.beta_s_per_byte == pytest.approx(8 / 25e9, rel=RTOL)
    assert parse_link("10GB/s", "--intra-link", DEFAULT_INTRA_LATENCY_S).alpha_s == DEFAULT_INTRA_LATENCY_S
    with pytest.raises(CostModelError, match="--inter-link: nothing after '@'"):
        parse_link("25gbit@", "--inter-link", DEFAULT_INTER_LATENCY_S)


# ---- collective lines, written out ----
INTER = Link(30e-6, 8 / 25e9)     # 25 Gbit/s, 30 us
INTRA = Link(2e-6, 8 / 800e9)     # 100 GB/s, 2 us: faster than the network in both terms
INTER_LINE = Linear(INTER.alpha_s, INTER.beta_s_per_byte)
INTRA_LINE = Linear(INTRA.alpha_s, INTRA.beta_s_per_byte)


def test_ring_over_every_device_waits_for_the_network():
    cm = cluster_cost_model(4, 8, INTER, INTRA, "ring")
    P = 32
    assert cm.workers == P and set(cm.lines) == set(COLLECTIVES)
    # one ring over 32 devices: 2(P-1) steps of alpha and 2(P-1)/P M bytes, on the slower (inter) link
    ar = cm.line("allreduce")
    assert ar.a_s == pytest.approx(2 * 31 * 30e-6, rel=RTOL)
    assert ar.b_s_per_byte == pytest.approx(2 * 31 / 32 * 8 / 25e9, rel=RTOL)
    for half in ("reduce_scatter", "allgather", "sparse_allgather"):
        assert cm.line(half).a_s == pytest.approx(31 * 30e-6, rel=RTOL)
        assert cm.line(half).b_s_per_byte == pytest.approx(31 / 32 * 8 / 25e9, rel=RTOL)
    # a parameter server on another node: one message over the network
    assert cm.line("push") == cm.line("pull") == INTER_LINE
    # sparse all-gather of n bytes per worker: each receives (P-1) n bytes
    assert cm.sparse_allgather_s(1000) == pytest.approx(31 * 30e-6 + 31 * 1000 * 8 / 25e9, rel=RTOL)
    assert cm.meta["cluster"]["nodes_used"] == 4 and cm.meta["cluster"]["workers_per_node"] == 8


def test_hierarchical_reduces_inside_nodes_first():
    cm = cluster_cost_model(4, 8, INTER, INTRA, "hierarchical")
    n, g = 4, 8
    a = 2 * ((g - 1) * 2e-6 + (n - 1) * 30e-6)
    b = 2 * ((g - 1) / g * 8 / 800e9 + (n - 1) / (n * g) * 8 / 25e9)
    assert cm.line("allreduce").a_s == pytest.approx(a, rel=RTOL)
    assert cm.line("allreduce").b_s_per_byte == pytest.approx(b, rel=RTOL)


@pytest.mark.parametrize("algorithm, steps", [("tree", 2 * 5), ("recursive_doubling", 5), ("halving_doubling", 2 * 5)])
def test_flat_algorithms_use_the_slowest_link(algorithm, steps):
    cm = cluster_cost_model(4, 8, INTER, INTRA, algorithm)
    assert cm.line("allreduce").a_s == pytest.approx(steps * 30e-6, rel=RTOL)   # log2(32) = 5
    assert cm.line("push") == INTER_LINE
    assert set(cm.lines) == set(COLLECTIVES)


def test_a_job_on_one_node_uses_only_the_intra_link():
    cm = cluster_cost_model(4, 8, INTER, INTRA, "ring", workers=8)
    assert cm.workers == 8 and cm.meta["cluster"]["nodes_used"] == 1
    assert cm.line("allreduce").a_s == pytest.approx(2 * 7 * 2e-6, rel=RTOL)
    assert cm.line("push") == INTRA_LINE
    one = cluster_cost_model(1, 4, None, INTRA)   # no network needed on one node
    assert one.workers == 4 and one.line("pull") == INTRA_LINE


def test_without_an_intra_link_the_measured_nodes_one_is_used():
    cm = cluster_cost_model(2, 4, INTER)
    intra = default_intra_link()
    assert cm.meta["cluster"]["intra"] == {"alpha_s": intra.alpha_s, "beta_s_per_byte": intra.beta_s_per_byte}
    assert cm.meta["cluster"]["intra_default"] is True and "default" in cm.source


@pytest.mark.parametrize("kwargs, message", [
    ({"nodes": 2, "gpus_per_node": 4, "inter": None}, "--nodes 2 needs --inter-link"),
    ({"nodes": 1, "gpus_per_node": 1, "inter": INTER}, "nothing to communicate"),
    ({"nodes": 0, "gpus_per_node": 1, "inter": INTER}, "--nodes must be a positive integer"),
    ({"nodes": 2, "gpus_per_node": 4, "inter": INTER, "workers": 6}, "--workers 6: 6 workers do not fill whole nodes"),
    ({"nodes": 2, "gpus_per_node": 4, "inter": INTER, "algorithm": "magic"}, "--algorithm: unknown algorithm"),
])
def test_bad_clusters_are_one_line(kwargs, message):
    with pytest.raises(CostModelError, match=message):
        cluster_cost_model(**kwargs)


def test_every_algorithm_named_in_the_help_is_known():
    assert set(CLUSTER_ALGORITHMS) == {"ring", "hierarchical", "tree", "recursive_doubling", "halving_doubling"}


# ---- top-k ----
def test_topk_table_scales_the_published_fit_by_memory_bandwidth():
    assert TOPK_DEVICES["P102"] == PUBLISHED_TOPK_GAMMA_S
    # V100 and P102 share the default memory efficiency: gamma scales by 440.3 / 900 GB/s
    assert TOPK_DEVICES["V100"] == pytest.approx(PUBLISHED_TOPK_GAMMA_S * 440.3 / 900, rel=RTOL)
    gamma, source = topk_gamma_for_device("v100 (estimate)")
    assert gamma == TOPK_DEVICES["V100"] and "estimate" in source
    assert topk_gamma_for_device("P102-100")[0] == PUBLISHED_TOPK_GAMMA_S
    with pytest.raises(CostModelError, match="--topk-device: no top-k cost for device 'X100'"):
        topk_gamma_for_device("X100")


def test_topk_table_agrees_with_the_estimates_gpu_table():
    pytest.importorskip("torch")
    from repro.costs.cluster_cost import _MEMORY
    from repro.workload.estimate import GPU_SPECS, MEMORY_EFFICIENCY

    assert set(_MEMORY) == set(GPU_SPECS)
    for name, spec in GPU_SPECS.items():
        assert _MEMORY[name] == (spec.memory_bandwidth, spec.memory_efficiency or MEMORY_EFFICIENCY), name


def test_a_trace_names_its_gpu():
    assert topk_device_of_trace(load_trace("resnet50_b32_v100-estimate")) == "V100"
    assert topk_device_of_trace(load_trace("resnet50_b32_p102-estimate")) == "P102"
    assert topk_device_of_trace(load_trace("tiny_vgg_b32_cpu")) is None


# ---- sources ----
def test_a_cost_source_is_a_preset_or_a_file(tmp_path):
    assert load_cost("10gbe-derived", 8).source == "preset 10gbe-derived"
    path = tmp_path / "c.json"
    CostModel.linear(8, 1e-4, 1e-9).save(path)
    assert load_cost(str(path), None).workers == 8
    assert load_cost(str(path), 8).line("allreduce").a_s == 1e-4
    with pytest.raises(CostModelError, match="--network: the cost model in .* is for P=8, not the 4 workers"):
        load_cost(str(path), 4, "--network")
    with pytest.raises(CostModelError, match="--cost: unknown network preset 'nope' \\(and no file"):
        load_cost("nope", 4)
    with pytest.raises(CostModelError, match="--cost: cost model file not found"):
        load_cost(str(tmp_path / "missing.json"), 4)
    with pytest.raises(CostModelError, match="needs --workers P"):
        load_cost("10gbe-derived", None)


# ---- fitting measured collectives ----
def _rows(P, kind, a, b, sizes):
    x = [n * P for n in sizes] if kind == "sparse_allgather" else sizes
    return [{"bytes": n, "workers": P, "seconds": a + b * xx, "collective": kind} for n, xx in zip(sizes, x)]


def test_fitting_recovers_the_lines_measured():
    sizes = [4096, 65536, 2 ** 20, 2 ** 24]
    rows = _rows(8, "allreduce", 1e-4, 8e-10, sizes) + _rows(8, "sparse_allgather", 5e-5, 1e-9, sizes) + \
        _rows(8, "push", 3e-5, 3e-10, sizes)
    cm = fit_measurements(rows)
    assert cm.workers == 8 and set(cm.lines) == {"allreduce", "sparse_allgather", "push"}
    # exact data through a line: least squares returns it up to rounding (relative 1e-9 of the terms)
    assert cm.line("allreduce").a_s == pytest.approx(1e-4, rel=1e-9)
    assert cm.line("allreduce").b_s_per_byte == pytest.approx(8e-10, rel=1e-9)
    assert cm.sparse_allgather_s(4096) == pytest.approx(5e-5 + 1e-9 * 4096 * 8, rel=1e-9)
    assert cm.meta["max_abs_relative_error"]["push"] < 1e-9
    assert cm.meta["measurements"]["allreduce"]["bytes"] == sizes


def test_fitting_needs_one_worker_count():
    rows = _rows(8, "allreduce", 1e-4, 8e-10, [1e3, 1e6]) + _rows(16, "allreduce", 2e-4, 9e-10, [1e3, 1e6])
    with pytest.raises(CostModelError, match="P = 8, 16; .* choose one with --workers"):
        fit_measurements(rows)
    assert fit_measurements(rows, 16).line("allreduce").a_s == pytest.approx(2e-4, rel=1e-9)
    with pytest.raises(CostModelError, match="no measurements for P=4"):
        fit_measurements(rows, 4)
    with pytest.raises(CostModelError, match="allreduce at P=8: fit needs measurements at two or more distinct"):
        fit_measurements(_rows(8, "allreduce", 1e-4, 8e-10, [1e3, 1e3]))


def test_a_csv_of_measurements_fits_and_bad_cells_name_the_line(tmp_path):
    good = tmp_path / "m.csv"
    good.write_text("bytes,workers,seconds,collective,host\n"
                    + "".join(f"{n},4,{1e-4 + 1e-9 * n},allreduce,a\n" for n in (1e3, 1e5, 1e7)))
    cm = fit_measurements_csv(good)
    assert cm.workers == 4 and cm.line("allreduce").a_s == pytest.approx(1e-4, rel=1e-9)
    assert cm.meta["measurements_file"] == str(good)
    for body, message in [("bytes,workers,seconds\n1,4,1\n", "no column 'collective'"),
                          ("bytes,workers,seconds,collective\n1000,4,x,allreduce\n", "m2.csv:2: bytes, workers"),
                          ("bytes,workers,seconds,collective\n1000,1,1,allreduce\n", "m2.csv:2: workers must be"),
                          ("bytes,workers,seconds,collective\n1000,4,1,broadcast\n", "unknown collective 'broadcast'"),
                          ("bytes,workers,seconds,collective\n", "no measurements after the header"),
                          ("", "empty")]:
        bad = tmp_path / "m2.csv"
        bad.write_text(body)
        with pytest.raises(CostModelError, match=message):
            fit_measurements_csv(bad)
    assert math.isfinite(cm.allreduce_s(np.float64(1e6)))


def test_one_device_per_node_waits_only_for_the_network():
    slow_intra = Link(1e-3, 1e-8)   # slower than the network: it must not count when no node holds two devices
    cm = cluster_cost_model(4, 1, INTER, slow_intra, "ring")
    assert cm.line("allreduce").a_s == pytest.approx(2 * 3 * 30e-6, rel=RTOL)
    assert cm.line("allreduce").b_s_per_byte == pytest.approx(2 * 3 / 4 * 8 / 25e9, rel=RTOL)
    assert cluster_cost_model(4, 1, INTER, slow_intra, "tree").line("allreduce").a_s == \
        pytest.approx(2 * 2 * 30e-6, rel=RTOL)
    # with two devices per node the slow intra hop is every ring step's bottleneck
    assert cluster_cost_model(2, 2, INTER, slow_intra, "ring").line("allreduce").a_s == \
        pytest.approx(2 * 3 * 1e-3, rel=RTOL)
