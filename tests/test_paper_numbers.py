"""The shipped table of public measurements (issue 12's calibration data): tidy, faithful to its source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from repro.core.paths import paper_numbers_path
from repro.core.schedulers import scheduler_names

ROOT = Path(__file__).resolve().parents[1]
# The public source table, copied into the repository (tests/fixtures/README.md says from where).
SOURCE = ROOT / "tests" / "fixtures" / "ddl_benchmarks_2020-05-29.csv"


@pytest.fixture(scope="module")
def measured() -> pd.DataFrame:
    return pd.read_csv(paper_numbers_path("ddl_benchmarks_measured"), keep_default_na=False,
                       na_values={"samples_per_s_std": [""]})


def test_one_row_per_model_network_method_and_gpu_count(measured):
    assert len(measured) == 3 * 2 * 7 * 5
    assert not measured.duplicated(["model", "network", "method", "gpus"]).any()
    assert set(measured.gpus) == {1, 4, 8, 16, 32}
    assert (measured.nodes == (measured.gpus + 3) // 4).all() and (measured.gpus_per_node <= 4).all()
    assert measured.source.str.contains("arXiv 2005.13247").all()


def test_numbers_are_the_published_ones(measured):
    def at(model, network, method, gpus):
        row = measured[(measured.model == model) & (measured.network == network) & (measured.method == method)
                       & (measured.gpus == gpus)]
        assert len(row) == 1
        return row.iloc[0]

    # the source README's examples: the cliff when BERT-Large first spans two nodes, MG-WFBP behind WFBP
    assert at("bert_large", "10gbe", "BSP-A2A", 4).samples_per_s == 53.04
    assert at("bert_large", "10gbe", "BSP-A2A", 8).samples_per_s == 28.96
    assert at("bert_base", "10gbe", "MG-WFBP", 32).samples_per_s == 1925.78
    assert at("bert_base", "10gbe", "WFBP-A2A", 32).samples_per_s == 2013.38
    assert at("bert_base", "10gbe", "WFBP-PS", 32).samples_per_s == 2546.695  # copied whole, not rounded
    r = at("resnet50", "10gbe", "BSP-A2A", 8)
    assert r.iteration_s == pytest.approx(64 * 8 / 1282.28, rel=1e-5)


def test_schedulers_named_exist(measured):
    named = set(measured.scheduler) - {""}
    assert named <= set(scheduler_names()), named - set(scheduler_names())
    assert set(measured[measured.scheduler == ""].method) == {"WFBP-PS", "ByteScheduler-PS"}


def test_the_shipped_table_is_what_the_script_makes_from_its_source(tmp_path):
    assert SOURCE.is_file(), f"{SOURCE} (the source table, part of the repository) is missing"
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import make_paper_numbers as m; "
            f"m.tidy({str(SOURCE)!r}).to_csv({str(tmp_path / 'out.csv')!r}, index=False)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    assert (tmp_path / "out.csv").read_text() == paper_numbers_path("ddl_benchmarks_measured").read_text()
