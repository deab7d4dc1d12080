"""The contention microbenchmark (repro.runtime.contention): runs on 2 local gloo ranks at tiny size.

No assertion on the slowdown's size (machines are noisy): only that the table is well formed and the
fitted value is a finite non-negative number."""

from __future__ import annotations

import math

import pytest

from repro.runtime.contention import (CONTENTION_COLUMNS, default_contention_sizes_bytes, fit_contention,
                                      measure_contention_local)


@pytest.fixture(scope="module")
def table():
    return measure_contention_local(["tiny_vgg"], 2, sizes_bytes=[4096, 65536], batch_size=4, repeats=1,
                                    steps=1, timeout_s=120)


@pytest.mark.distributed
def test_microbenchmark_table_on_loopback(table):
    assert list(table.columns[:len(CONTENTION_COLUMNS)]) == list(CONTENTION_COLUMNS)
    assert {"cpu_count", "oversubscribed"} <= set(table.columns)
    assert list(table["bytes"]) == [4096, 65536]
    assert (table.model == "tiny_vgg").all() and (table.workers == 2).all()
    for col in ("kernel_alone_s", "kernel_with_comm_s", "allreduce_s"):
        assert (table[col] > 0).all() and table[col].map(math.isfinite).all(), col
    assert table.slowdown.map(math.isfinite).all()
    assert (table.queued_allreduces >= 3).all()
    c = fit_contention(table.slowdown)
    assert math.isfinite(c) and c >= 0


def test_fit_contention_is_median_clipped():
    assert fit_contention([0.1, 0.5, 0.3]) == pytest.approx(0.3)
    assert fit_contention([-0.2, -0.1, 0.05]) == 0.0  # noise below zero: no speed-up from communication
    assert fit_contention([float("nan"), 0.2]) == pytest.approx(0.2)
    assert fit_contention([]) == 0.0


def test_default_sizes_span_a_layer_to_the_model():
    sizes = default_contention_sizes_bytes(1_000_000, count=3)
    assert sizes[0] == 16384 and sizes[-1] == 1_000_000 and len(sizes) == 3
    assert all(s % 4 == 0 for s in sizes)


def test_fit_contention_weighted_by_allreduce_time():
    assert fit_contention([0.2, 0.8], [1.0, 3.0]) == pytest.approx(0.65)
    assert fit_contention([-0.5, 0.8], [1.0, 1.0]) == pytest.approx(0.4)  # clipped before averaging
