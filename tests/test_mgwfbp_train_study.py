import pandas as pd
import pytest

from repro.studies import mgwfbp_train as study


def _runs():
    rows = [
        {"model": "m", "scheduler": "local", "world_size": 1, "iteration_s": 1.0, "wire_dtype": "float32"},
        {"model": "m", "scheduler": "wfbp", "world_size": 2, "iteration_s": 1.6, "wire_dtype": "float32"},
        {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 1.25, "wire_dtype": "float32"},
        {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 1.1, "wire_dtype": "float16"},
    ]
    return pd.DataFrame(rows)


def test_speedup_is_p_t1_over_tp_in_fp32_with_linear_reference():
    s = study.speedup_table(_runs(), ["wfbp", "mgwfbp"]).set_index(["scheduler", "workers"])["speedup"]
    assert s[("wfbp", 2)] == pytest.approx(2 * 1.0 / 1.6)
    assert s[("mgwfbp", 2)] == pytest.approx(2 * 1.0 / 1.25)  # the fp16 run is not mixed in
    assert s[("linear", 1)] == 1 and s[("linear", 2)] == 2


def test_allreduce_fit_table_recovers_lines():
    times = pd.DataFrame([{"workers": p, "bytes": n, "seconds": a + b * n}
                          for p, a, b in ((2, 1e-4, 1e-9), (4, 3e-4, 2e-9)) for n in (1e3, 1e5, 1e7)])
    fits = study.allreduce_fit_table(times).set_index("workers")
    assert fits.loc[4, "a_s"] == pytest.approx(3e-4) and fits.loc[2, "b_s_per_byte"] == pytest.approx(1e-9)


def test_reading_a_missing_results_dir_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="read_only=False or copy a cluster job"):
        study.load_runs(tmp_path)


def test_convergence_runs_are_not_mixed_into_timings():
    runs = _runs().assign(dataset="synthetic")
    conv = {"model": "m", "scheduler": "mgwfbp", "world_size": 2, "iteration_s": 9.0, "wire_dtype": "float32",
            "dataset": "digits"}
    runs = pd.concat([runs, pd.DataFrame([conv])], ignore_index=True)
    s = study.speedup_table(runs, ["mgwfbp"])
    assert len(s[s.scheduler == "mgwfbp"]) == 1
