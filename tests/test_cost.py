import math

import numpy as np
import pytest

from repro.core.cost import CostModel, CostModelError, Linear, alpha_beta_lines, fit_linear, relative_errors
from repro.costs.presets import preset, preset_names, preset_workers


def test_linear_is_zero_for_empty_messages_and_vectorised():
    line = Linear(1e-3, 1e-9)
    assert line(0) == 0.0
    assert line(1e6) == pytest.approx(1e-3 + 1e-3)
    np.testing.assert_allclose(line(np.array([0, 1e6])), [0.0, 2e-3])


def test_fit_recovers_a_known_line_from_noisy_measurements():
    rng = np.random.default_rng(0)
    x = np.geomspace(1e3, 1e8, 40)
    y = 5e-4 + 8e-10 * x
    fit = fit_linear(x, y * (1 + rng.normal(0, 0.01, x.size)))
    assert fit.b_s_per_byte == pytest.approx(8e-10, rel=0.03)
    assert fit.a_s == pytest.approx(5e-4, rel=0.3)


@pytest.mark.parametrize("x, y, msg", [([1.0], [1.0], "two or more"), ([1, 1], [1, 2], "two or more"),
                                       ([1, 2], [1], "as many"), ([1, 2], [-1, 2], "non-negative")])
def test_fit_rejects_bad_data(x, y, msg):
    with pytest.raises(CostModelError, match=msg):
        fit_linear(x, y)


def test_ring_formulas_and_rs_plus_ag_equals_allreduce():
    P, al, be, ga = 8, 1e-5, 1e-9, 2e-10
    lines = alpha_beta_lines(P, al, be, ga, "ring")
    ar = lines["allreduce"]
    assert ar.a_s == pytest.approx(2 * 7 * al)
    assert ar.b_s_per_byte == pytest.approx(2 * 7 / 8 * be + 7 / 8 * ga)
    n = 1e7
    assert lines["reduce_scatter"](n) + lines["allgather"](n) == pytest.approx(ar(n))


@pytest.mark.parametrize("algo, a_mult, b_mult", [
    ("tree", lambda P: 2 * math.log2(P), lambda P, be, ga: 2 * math.log2(P) * (be + ga)),
    ("recursive_doubling", lambda P: math.log2(P), lambda P, be, ga: math.log2(P) * (be + ga)),
    ("halving_doubling", lambda P: 2 * math.log2(P), lambda P, be, ga: 2 * (P - 1) / P * be + (P - 1) / P * ga),
])
def test_tabulated_algorithms(algo, a_mult, b_mult):
    P, al, be, ga = 16, 3e-6, 2e-9, 1e-10
    ar = alpha_beta_lines(P, al, be, ga, algo)["allreduce"]
    assert ar.a_s == pytest.approx(a_mult(P) * al)
    assert ar.b_s_per_byte == pytest.approx(b_mult(P, be, ga))


def test_presets_hold_published_fits():
    cm = preset("10gbe-v100", 16)
    assert cm.allreduce_s(1e6) == pytest.approx(9.081e-4 + 7.396e-10 * 1e6)
    assert preset("56gbib-v100", 8).startup_s == pytest.approx(9.754e-5)
    assert preset_workers("10gbe-v100") == [2, 4, 8, 16]
    assert preset_workers("10gbe-k80") is None
    ag = preset("1gbe-allgather", 4)
    # OMGS-SGD: T_ag(m) = a + b * m * P with m the bytes each worker sends
    assert ag.sparse_allgather_s(1000) == pytest.approx(2.7e-3 + 1.3e-8 * 1000 * 4)
    k80 = preset("10gbe-k80", 1024)  # per-hop presets work for any P
    assert k80.startup_s == pytest.approx(2 * 1023 * 45.25e-6)


def test_unknown_preset_and_missing_p_say_how_to_fit():
    with pytest.raises(CostModelError, match="unknown network preset 'nope'; known: .*10gbe-v100"):
        preset("nope", 4)
    with pytest.raises(CostModelError, match=r"no fit for P=32 \(it has P = 2, 4, 8, 16\).*fit"):
        preset("10gbe-v100", 32)
    with pytest.raises(CostModelError, match="no reduce_scatter line"):
        preset("10gbe-v100", 8).reduce_scatter_s(100)
    with pytest.raises(CostModelError, match="integer >= 2"):
        preset("10gbe-k80", 1)
    assert len(preset_names()) >= 6


def test_cost_model_json_round_trip_and_fit():
    cm = CostModel.fit(4, {"allreduce": ([1e3, 1e6, 1e7], [1e-4, 1.1e-3, 1.01e-2])})
    back = CostModel.from_dict(cm.to_dict())
    assert back == cm
    assert back.allreduce_s(5e6) == pytest.approx(cm.allreduce_s(5e6))
    with pytest.raises(CostModelError, match="malformed"):
        CostModel.from_dict({"workers": 4})


def test_relative_fit_honours_the_start_up_term_where_least_squares_misses_it():
    # start-up dominated small messages plus a few large ones with 2% noise
    x = np.array([4e3, 1.6e4, 6.5e4, 2.6e5, 1e6, 4e6, 1.6e7, 6.4e7])
    true = Linear(2e-3, 8e-10)
    y = true(x) * np.array([1.0, 1.02, 0.98, 1.0, 1.02, 0.98, 1.02, 0.97])
    rel = fit_linear(x, y)
    ols = fit_linear(x, y, weighting="absolute")
    assert np.abs(relative_errors(rel, x, y)).max() < 0.05
    assert np.abs(relative_errors(rel, x, y)).max() < np.abs(relative_errors(ols, x, y)).max()
    assert rel.a_s == pytest.approx(2e-3, rel=0.05) and rel.b_s_per_byte == pytest.approx(8e-10, rel=0.05)
    # OLS is decided by the 64 MB point: its start-up term is off by far more than the relative fit's
    assert abs(ols.a_s / 2e-3 - 1) > 5 * abs(rel.a_s / 2e-3 - 1)


def test_fits_stay_non_negative_at_the_constrained_optimum():
    x = np.array([1e3, 1e4, 1e5])
    falling = fit_linear(x, [3e-3, 2e-3, 1e-3])  # time falls with size: b clipped to 0
    assert falling.b_s_per_byte == 0.0 and falling.a_s > 0
    through_zero = fit_linear(x, [1e-6, 1.2e-5, 1.1e-4])  # negative intercept: a clipped to 0
    assert through_zero.a_s == 0.0 and through_zero.b_s_per_byte == pytest.approx(1.1e-9, rel=0.1)
    with pytest.raises(CostModelError, match="weighting"):
        fit_linear(x, [1, 2, 3], weighting="log")
