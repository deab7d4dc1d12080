"""The hierarchical cluster model (repro.core.topology): the ring and two-level all-reduce written out."""

from __future__ import annotations

import pytest

from repro.core.cost import CostModel, CostModelError, alpha_beta_lines
from repro.core.topology import Link, Topology

INTRA = Link(5e-6, 1 / 10e9)       # e.g. NVLink-class: 5 us, 10 GB/s
INTER = Link(50e-6, 1 / 1.25e9)    # 10 Gbit/s Ethernet: 50 us, 1.25 GB/s
CLUSTER = Topology(8, 4, INTRA, INTER)
M = 100e6


def test_one_node_is_the_flat_ring_on_the_intra_link():
    for P in (2, 4):
        want = alpha_beta_lines(P, INTRA.alpha_s, INTRA.beta_s_per_byte)
        for algorithm in ("ring", "hierarchical"):
            got = CLUSTER.cost_model(P, algorithm)
            for kind in ("allreduce", "reduce_scatter", "allgather"):
                assert got.line(kind).a_s == pytest.approx(want[kind].a_s)
                assert got.line(kind).b_s_per_byte == pytest.approx(want[kind].b_s_per_byte)


def test_across_nodes_the_flat_ring_runs_at_the_inter_link():
    for P in (8, 16, 32):
        line = CLUSTER.allreduce_line(P, "ring")
        assert line(M) == pytest.approx(2 * (P - 1) * INTER.alpha_s + 2 * (P - 1) / P * M * INTER.beta_s_per_byte)


def test_the_two_level_all_reduce_written_out():
    for P in (8, 16, 32):
        n, g = P // 4, 4
        want = (2 * (g - 1) * INTRA.alpha_s + 2 * (g - 1) / g * M * INTRA.beta_s_per_byte
                + 2 * (n - 1) * INTER.alpha_s + 2 * (n - 1) / n * (M / g) * INTER.beta_s_per_byte)
        assert CLUSTER.allreduce_line(P, "hierarchical")(M) == pytest.approx(want)
        assert CLUSTER.allreduce_line(P, "hierarchical")(M) < CLUSTER.allreduce_line(P, "ring")(M)


def test_equal_links_make_both_algorithms_the_flat_ring_in_bandwidth():
    same = Topology(4, 4, INTER, INTER)
    for P in (8, 16):
        flat = alpha_beta_lines(P, INTER.alpha_s, INTER.beta_s_per_byte)["allreduce"]
        assert same.allreduce_line(P, "ring").b_s_per_byte == pytest.approx(flat.b_s_per_byte)
        assert same.allreduce_line(P, "hierarchical").b_s_per_byte == pytest.approx(flat.b_s_per_byte)


def test_the_cliff_when_a_job_first_spans_two_nodes():
    # seconds per byte of the flat ring jump from the intra to the inter link between 4 and 8 workers
    per_byte = {P: CLUSTER.allreduce_line(P, "ring").b_s_per_byte for P in (2, 4, 8, 16)}
    assert per_byte[8] / per_byte[4] > 5 and per_byte[16] / per_byte[8] < 1.1


def test_reduction_cost_and_point_to_point():
    t = Topology(2, 2, INTRA, INTER, gamma_s_per_byte=1e-10)
    cm = t.cost_model(4, "hierarchical")
    no_gamma = Topology(2, 2, INTRA, INTER).cost_model(4, "hierarchical")
    assert cm.line("allreduce").b_s_per_byte - no_gamma.line("allreduce").b_s_per_byte == pytest.approx(0.75e-10)
    assert cm.line("allgather") == no_gamma.line("allgather")
    assert cm.line("push").b_s_per_byte == INTER.beta_s_per_byte
    assert t.cost_model(2).line("push").b_s_per_byte == INTRA.beta_s_per_byte
    assert CostModel.from_dict(cm.to_dict()).line("allreduce") == cm.line("allreduce")


@pytest.mark.parametrize("make, match", [
    (lambda: CLUSTER.cost_model(33), "do not fit 8 nodes x 4"),
    (lambda: CLUSTER.cost_model(6), "do not fill whole nodes of 4"),
    (lambda: CLUSTER.cost_model(1), "integer >= 2"),
    (lambda: CLUSTER.cost_model(8, "tree"), "unknown algorithm"),
    (lambda: Topology(0, 4, INTRA, INTER), "nodes must be a positive integer"),
    (lambda: Link(-1, 1e-9), "alpha_s must be"),
    (lambda: Link.from_rate(1e-6, 0), "bits_per_s"),
])
def test_bad_input_is_one_clear_error(make, match):
    with pytest.raises(CostModelError, match=match):
        make()


def test_link_from_rate():
    assert Link.from_rate(1e-5, 10e9).beta_s_per_byte == pytest.approx(8e-10)


def test_a_flat_ring_across_nodes_waits_for_its_slowest_hop_even_inside_a_node():
    # A fast network and slower links inside the nodes (PCIe): the ring's steps run at the intra link.
    slow_intra = Link(2e-5, 4e-10)
    fast_inter = Link(1e-5, 1e-10)
    topo = Topology(4, 4, slow_intra, fast_inter)
    line = topo.allreduce_line(8, "ring")
    assert line.a_s == pytest.approx(2 * 7 * 2e-5)
    assert line.b_s_per_byte == pytest.approx(2 * 7 / 8 * 4e-10)
    # The slowest alpha and the slowest beta may come from different links.
    mixed = Topology(4, 4, Link(1e-6, 4e-10), Link(3e-5, 1e-10)).allreduce_line(16, "ring")
    assert mixed.a_s == pytest.approx(2 * 15 * 3e-5) and mixed.b_s_per_byte == pytest.approx(2 * 15 / 16 * 4e-10)
