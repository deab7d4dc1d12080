"""The papers' claims as data: our numbers computed from result tables, verdicts that follow them, the
runner and gallery carrying them, the docs page in sync, and compare.schedulers' exact planners."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from repro.figures import claims as cl  # noqa: E402
from repro.figures.manifest import load_manifest  # noqa: E402
from repro.results.tables import write_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _omgs_setting(data: Path, topk_s: float, omgs_s: float, model: str = "resnet50") -> None:
    write_table(pd.DataFrame({"model": [model, model, model], "planner": ["topk_single", "omgs", "omgs_optimal"],
                              "iteration_s": [topk_s, omgs_s, omgs_s * 0.9], "buckets": [1, 1, 7]}),
                data, "omgs_paper_setting")


def _row(table: pd.DataFrame, claim_id: str) -> pd.Series:
    return table.set_index("claim_id").loc[claim_id]


# ------------------------------------------------------------------------------------- the data

def test_shipped_claims_are_valid_and_point_at_manifest_figures():
    claims = cl.all_claims()
    ids = [c["id"] for c in claims]
    assert len(ids) == len(set(ids))
    figures = {e.id for e in load_manifest(check_files=False)}
    for paper in cl.PAPERS:
        mine = [c for c in claims if c["paper_key"] == paper]
        assert len(mine) >= 3, paper
        for c in mine:
            assert c["paper"]["source"].strip()
            assert set(c.get("figures") or []) <= figures, c["id"]
    # every claim's paper has a figure with a verdict on its card
    assert all(any(cl.figure_claims(f) for f in figures if f.startswith(p + ".")) for p in cl.PAPERS)


def test_a_malformed_claims_file_is_one_clear_error(tmp_path):
    (tmp_path / "omgs.yaml").write_text(yaml.safe_dump({"title": "x", "claims": [
        {"id": "omgs.a", "claim": "c", "paper": {"value": 1, "source": "s"}, "rule": {"kind": "close"},
         "simulated": {"table": "t", "value": "v", "num": {"a": 1}}}]}))
    with pytest.raises(cl.ClaimsError, match="'num' and 'den' go together"):
        cl.load_claims("omgs", tmp_path)
    with pytest.raises(cl.ClaimsError, match="no claims file"):
        cl.load_claims("nosuch", tmp_path)


# ------------------------------------------------------------------------------- numbers, verdicts

def test_verdict_follows_the_table(tmp_path):
    """Our number is read from the table, so the verdict flips when the table does."""
    data = tmp_path / "data"
    assert _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")["verdict"] == cl.NOT_RUN
    _omgs_setting(data, 0.666, 0.507)  # the paper's own seconds: 1.31x
    r = _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")
    assert r["simulated"] == pytest.approx(0.666 / 0.507) and r["verdict"] == "reproduced"
    assert r["simulated_text"] == "1.31x" and r["measured_text"] == "n/a"
    assert "1 bucket(s)" in r["why"]  # a fact computed from the table, not typed in
    _omgs_setting(data, 0.666, 0.666)  # one bucket: OMGS is TopK-SGD
    assert _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")["verdict"] == "not reproduced"
    _omgs_setting(data, 0.666, 0.60)  # 1.11x: a gain, a third of the paper's
    assert _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")["verdict"] == "direction only"


@pytest.mark.parametrize("ours, paper, rule, expected", [
    (1.02, 1.02, {"kind": "close", "etol": 0.5, "neutral": 1.0}, "reproduced"),
    # a claimed 2% gain is not reproduced by no gain (the tolerance is a share of the effect)
    (1.00, 1.02, {"kind": "close", "etol": 0.5, "neutral": 1.0}, "not reproduced"),
    (1.40, 1.11, {"kind": "close", "etol": 0.5, "neutral": 1.0}, "direction only"),
    # "up to N" claims are two-sided: far above the paper is not reproduced
    (80.0, 83.0, {"kind": "close", "rtol": 0.1, "neutral": 0.0}, "reproduced"),
    (2.17, 1.7, {"kind": "close", "rtol": 0.1, "neutral": 1.0, "neutral_atol": 0.01}, "direction only"),
    (55.5, 50.0, {"kind": "close", "rtol": 0.1, "neutral": 0.0}, "direction only"),
    (7.6, 83.0, {"kind": "close", "rtol": 0.1, "neutral": 0.0}, "direction only"),
    (-3.0, 83.0, {"kind": "close", "rtol": 0.1, "neutral": 0.0}, "not reproduced"),
    (0.5, 83.0, {"kind": "close", "rtol": 0.1, "neutral": 0.0, "neutral_atol": 1.0}, "not reproduced"),  # no effect
    # a bound ("at least as fast", "optimal") is one-sided and has no "direction only"
    (1.30, 1.0, {"kind": "at_least", "atol": 0.03}, "reproduced"),
    (0.95, 1.0, {"kind": "at_least", "atol": 0.03}, "not reproduced"),
    (0.2, 0.0, {"kind": "at_most", "atol": 0.5}, "reproduced"),
    (3.0, 0.0, {"kind": "at_most", "atol": 0.5}, "not reproduced"),
    (None, 1.3, {"kind": "close", "rtol": 0.1}, cl.NOT_RUN),
])
def test_verdict_rules(ours, paper, rule, expected):
    assert cl.verdict(ours, paper, rule) == expected


def test_grouped_metric_reports_where_and_uses_the_median_of_seeds(tmp_path):
    data = tmp_path / "data"
    # DeAR as released against the best baseline, per model; "up to" = the largest
    rows = []
    for model, base, released, ours in (("resnet50", 1.0, 1.1, 0.95), ("bert_base", 1.0, 0.8, 0.7)):
        rows += [{"model": model, "network": "10gbe-dear64", "workers": 64, "scheduler": s, "iteration_s": t}
                 for s, t in (("mgwfbp", base), ("ddp_buckets", base * 1.05), ("dear_threshold", released),
                              ("dear_nofusion", released * 1.2), ("dear_optimal", ours))]
    write_table(pd.DataFrame(rows), data, "dear_paper_setting")
    r = _row(cl.claims_table(data, ["dear"]), "dear.headline_10gbe")
    assert r["simulated"] == pytest.approx(25.0) and r["simulated_at"] == "bert_base"
    assert r["verdict"] == "direction only"  # +25% against the paper's 83%
    assert "-9.1% (resnet50)" in r["why"] and "+42.9% (bert_base)" in r["why"]  # released worst, ours best
    # the convergence run's seeds are the bootstrap's pairs: three seeds are too few for a verdict
    acc = {"wfbp": [0.80, 0.81, 0.79], "topk_single": [0.50, 0.52, 0.51], "omgs": [0.51, 0.10, 0.52]}

    def convergence(acc):
        write_table(pd.DataFrame([{"model": "tiny_resnet", "lm": False, "scheduler": s, "seed": i, "epoch": e,
                                   "test_accuracy": a * e / 3} for s, v in acc.items() for i, a in enumerate(v)
                                  for e in (1, 2, 3)]), data, "omgs_convergence")
        return _row(cl.claims_table(data, ["omgs"]), "omgs.convergence")

    r = convergence(acc)
    assert r["measured"] == pytest.approx(0.0) and r["measured_samples"] == 3 and r["verdict"] == "inconclusive"
    # six seeds that agree: the interval lies above the -2 pts bound
    acc = {"wfbp": [0.80] * 6, "topk_single": [0.50, 0.52, 0.51, 0.50, 0.52, 0.51],
           "omgs": [0.51, 0.51, 0.52, 0.50, 0.52, 0.51]}
    r = convergence(acc)
    assert r["measured"] == pytest.approx(0.0) and r["verdict"] == "reproduced", r["measured_text"]
    # one collapsed OMGS seed leaves the median alone but not the interval (draws that repeat it)
    acc["omgs"][1] = 0.10
    r = convergence(acc)
    assert r["measured"] == pytest.approx(0.0) and r["measured_low"] < -2.0 and r["verdict"] == "inconclusive"
    acc["omgs"] = [0.10, 0.12, 0.11, 0.13, 0.10, 0.52]
    assert convergence(acc)["verdict"] == "not reproduced"


def test_the_language_model_is_judged_by_perplexity_not_its_degenerate_accuracy(tmp_path):
    """At tiny scale the LSTM predicts the most frequent token, so its next-token accuracy is that token's
    share for every scheduler (or another frequent token's): omgs.convergence (accuracy) reads the
    classifier only, omgs.convergence_lm the language model's perplexity against TopK-SGD's."""
    data = tmp_path / "data"
    rows = [{"model": "tiny_resnet", "lm": False, "scheduler": s, "test_accuracy": a, "perplexity": None}
            for s, a in (("wfbp", 0.91), ("topk_single", 0.90), ("omgs", 0.89))]
    rows += [{"model": "tiny_lstm", "lm": True, "scheduler": s, "test_accuracy": a, "perplexity": p}
             for s, a, p in (("wfbp", 0.117, 179.0), ("topk_single", 0.117, 184.0), ("omgs", 0.087, 193.0))]
    write_table(pd.DataFrame(rows), data, "omgs_convergence_final")
    table = cl.claims_table(data, ["omgs"])
    # a summary table without seeds: the numbers are shown, the verdict waits for an interval
    cnn = _row(table, "omgs.convergence")
    assert cnn["measured"] == pytest.approx(-1.0) and cnn["measured_at"] == "tiny_resnet"
    assert cnn["verdict"] == cl.NO_INTERVAL
    lm = _row(table, "omgs.convergence_lm")
    assert lm["measured"] == pytest.approx(100 * (193 / 184 - 1)) and lm["verdict"] == cl.NO_INTERVAL
    assert "+2.8%" in lm["why"]  # TopK-SGD against dense, from the table
    # per-seed rows (the seeds are the pairs): judged by perplexity with an interval
    seeds = [{"model": "tiny_lstm", "lm": True, "scheduler": s, "seed": i, "epoch": 3, "test_accuracy": 0.117,
              "perplexity": p * (1 + 0.002 * i)}
             for s, p in (("wfbp", 179.0), ("topk_single", 184.0), ("omgs", 193.0)) for i in range(6)]
    write_table(pd.DataFrame(seeds), data, "omgs_convergence")
    lm = _row(cl.claims_table(data, ["omgs"]), "omgs.convergence_lm")
    assert lm["measured"] == pytest.approx(100 * (193 / 184 - 1)) and lm["verdict"] == "not reproduced"
    for r in seeds:
        r["perplexity"] = r["perplexity"] * (186.0 / 193.0 if r["scheduler"] == "omgs" else 1.0)
    write_table(pd.DataFrame(seeds), data, "omgs_convergence")
    assert _row(cl.claims_table(data, ["omgs"]), "omgs.convergence_lm")["verdict"] == "reproduced"


# ---------------------------------------------------------------------------------- runner, gallery

def test_the_runner_stores_verdicts_and_the_gallery_card_shows_them(tmp_path, monkeypatch):
    from repro.figures import runner, save_figure

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    (nbs / "omgs_training.ipynb").write_text("{}")
    manifest = nbs / "figures.yaml"
    manifest.write_text(yaml.safe_dump({"figures": [
        {"id": "omgs.breakdown", "notebook": "omgs_training.ipynb", "stem": "omgs_breakdown", "status": "done",
         "kind": "measured + simulated", "title": "Breakdown"}]}))
    speed = {"omgs": 0.666}

    def fake_execute(src, dst, params, cwd, kernel_name, log_output, execution_timeout):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, 1])
        save_figure(fig, "omgs.breakdown", params["output_dir"], scale="tiny", source="simulated")
        plt.close(fig)
        _omgs_setting(Path(params["results_dir"]), 0.666, speed["omgs"])
        return None

    monkeypatch.setattr(runner, "_execute", fake_execute)
    monkeypatch.setattr(runner, "check_kernel", lambda *a, **k: tmp_path)
    monkeypatch.setattr(runner, "declared_parameters", lambda _p: ["output_dir", "results_dir", "scale"])
    lines: list[str] = []
    out = tmp_path / "results"
    runner.run(out, manifest=manifest, say=lines.append, heartbeat_s=0)
    record = json.loads((out / "notebooks" / "omgs_training.run.json").read_text())
    verdicts = {v["claim_id"]: v for v in record["claims"]["omgs.breakdown"]}
    assert verdicts["omgs.speedup_resnet50"]["verdict"] == "not reproduced"
    assert verdicts["omgs.speedup_resnet50"]["line"].startswith("not reproduced: ours 1.00x (simulated) vs paper 1.31x")
    assert any("claim not reproduced: ours 1.00x" in line for line in lines)
    page, md = (out / "index.html").read_text(), (out / "index.md").read_text()
    card = page[page.index('id="omgs_breakdown"'):]
    card = card[:card.index("</article>")]
    assert 'class="verdict no"' in card and "ours 1.00x (simulated) vs paper 1.31x" in card
    assert "claim: **not reproduced** — ours 1.00x (simulated) vs paper 1.31x" in md
    # a new run with other numbers: the stored verdict follows
    speed["omgs"] = 0.507
    runner.run(out, manifest=manifest, say=lines.append, heartbeat_s=0)
    record = json.loads((out / "notebooks" / "omgs_training.run.json").read_text())
    assert {v["claim_id"]: v["verdict"] for v in record["claims"]["omgs.breakdown"]}["omgs.speedup_resnet50"] \
        == "reproduced"
    assert 'class="verdict yes"' in (out / "index.html").read_text()


# ------------------------------------------------------------------------------------------- docs

def _doc_script():
    spec = importlib.util.spec_from_file_location("make_claims_doc", ROOT / "scripts" / "make_claims_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_claims_page_is_in_sync_with_the_data():
    """docs/claims.md is the rendering of its snapshot docs/claims.csv, and the snapshot holds the claims
    data as shipped (regenerate: python scripts/make_claims_doc.py --keep-numbers)."""
    mod = _doc_script()
    snap = mod.read_snapshot()
    fresh = mod.build(None)[0]
    for col in mod.DATA_COLUMNS:
        assert list(snap[col]) == list(fresh[col]), f"docs/claims.csv column {col} is stale"
    assert (ROOT / "docs" / "claims.md").read_text() == cl.claims_markdown(snap)
    assert set(snap["verdict"]) <= set(cl.VERDICTS) | {cl.NOT_RUN}
    page = (ROOT / "docs" / "claims.md").read_text()
    assert "## Verdict rules" in page and "direction only" in page and "partly" not in page
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "claims.md" in nav


def test_update_takes_only_the_claims_a_results_folder_has_whole(tmp_path, monkeypatch):
    """``--update``: a claim's numbers come from the new results only when its row there has a number
    wherever the snapshot's had one; the rest keep the snapshot's, and the provenance names both."""
    mod = _doc_script()
    snap = mod.read_snapshot().copy()
    ids = list(snap["claim_id"])
    snap["simulated_text"] = ["1.00x"] * len(ids)   # every claim had a simulated number before
    snap["measured_text"] = ["n/a"] * len(ids)
    snap["numbers_from"] = "old runs"
    monkeypatch.setattr(mod, "SNAPSHOT", tmp_path / "claims.csv")
    snap.to_csv(mod.SNAPSHOT, index=False)
    table = cl.claims_table(None)  # the new results: a number for the first 5 claims, none for the rest
    table["simulated_text"] = ["2.00x"] * 5 + [mod.NOT_MEASURED] * (len(table) - 5)
    monkeypatch.setattr(mod, "claims_table", lambda results: table)
    stale = ids.index("mgwfbp.vs_fixed_threshold")
    snap.loc[stale, "simulated_key"] = "0123456789"  # computed by a metric since changed
    snap.to_csv(mod.SNAPSHOT, index=False)
    got = mod.build(tmp_path, update=True, note="a note")[0]
    # kept: the claims with a simulated metric whose definition is the one that computed the number
    kept = ["1.00x" if (k and i != stale) else mod.NOT_MEASURED for i, k in enumerate(snap["simulated_key"])]
    assert list(got["simulated_text"]) == ["2.00x"] * 5 + kept[5:]
    assert "not measured yet" in got.loc[stale, "simulated_text"]
    # kept rows are judged again under the current rules (the snapshot's verdict is not copied)
    assert set(got["verdict"]) <= set(cl.VERDICTS) | {cl.NOT_RUN}
    line = got["numbers_from"].iloc[0]
    assert line.startswith("old runs Updated since (") and line.endswith("a note")


# ---------------------------------------------------------------------------- compare.schedulers

def test_exact_choice_takes_a_faster_heuristic_plan_of_the_same_family():
    from repro.studies.compare import exact_choice

    got = exact_choice({"wfbp": 1.0, "mgwfbp": 0.8, "optimal": 0.9, "dear_threshold": 0.5, "dear_optimal": 0.6,
                        "bytescheduler": 0.1})
    assert got["optimal"] == ("mgwfbp", 0.8)
    assert got["dear_optimal"] == ("dear_threshold", 0.5)  # bytescheduler is another plan family
    assert exact_choice({"mgwfbp": 0.8, "optimal": 0.8}) == {"optimal": ("optimal", 0.8)}  # ties keep it


def test_compare_exact_planners_never_lose_to_a_heuristic_under_the_judging_model():
    from repro.figures.compare_plots import HEURISTIC_PLAN_MARK, exact_note
    from repro.studies import compare

    names = ["wfbp", "mgwfbp", "optimal", "topk_single", "omgs", "omgs_optimal", "dear_threshold", "dear_optimal"]
    df = compare.simulated_table(["resnet50"], ["10gbe-derived"], [8], names, cost_mode="calibrated")
    fam = {s: compare._family(s) for s in names}
    for exact in compare.EXACT:
        own = df[df.scheduler == exact].iloc[0]
        rivals = df[(df.scheduler.map(fam) == fam[exact]) & ~df.scheduler.isin(compare.EXACT)]
        # the exact planner's row is never slower than a heuristic of its family (ties: relative 1e-9)
        assert own.iteration_s <= rivals.iteration_s.min() * (1 + 1e-9), exact
        assert own.exact_plan_iteration_s >= own.iteration_s * (1 - 1e-12)
    # the figure's note states the loss of the contention-free optimum, where there is one
    lost = df[df.exact_plan_loss_pct > 0]
    note = exact_note(df)
    assert "contention" in note
    for r in lost.itertuples():
        assert f"{r.scheduler}'s own plan loses" in note and HEURISTIC_PLAN_MARK in note


# --------------------------------------------------------------------- samples, intervals, cost modes

def _threshold_samples(data: Path, mg_s: list[float], thresholds: dict[int, list[float]]) -> None:
    """A recorded mgwfbp_timing_samples table: one row per (scheduler, pair), the 2-rank tiny model."""
    rows = [{"model": "tiny_resnet", "workers": 2, "scheduler": "mgwfbp", "threshold_bytes": None, "pair": i,
             "iteration_s": t} for i, t in enumerate(mg_s)]
    rows += [{"model": "tiny_resnet", "workers": 2, "scheduler": "threshold", "threshold_bytes": b, "pair": i,
              "iteration_s": t} for b, ts in thresholds.items() for i, t in enumerate(ts)]
    write_table(pd.DataFrame(rows), data, "mgwfbp_timing_samples", params={"threshold_sweep_bytes": list(thresholds)})


def test_measured_verdicts_carry_a_seeded_interval_and_straddling_is_inconclusive(tmp_path):
    data = tmp_path / "data"
    # the machine drifts (pair 5 is twice as slow for everyone); the best threshold is 10% slower in each pair
    drift = [1.0, 1.1, 0.9, 1.05, 0.95, 2.0, 1.0, 1.02]
    mg = [0.100 * d for d in drift]
    _threshold_samples(data, mg, {65536: [0.110 * d for d in drift], 1048576: [0.130 * d for d in drift]})
    r = _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.vs_fixed_threshold")
    assert r["measured"] == pytest.approx(1.10) and r["measured_samples"] == 8
    # within pairs the ratio is exact, so the interval is tight although the samples spread twofold
    assert r["measured_low"] > 1.0 and r["verdict"] == "reproduced" and "8 pairs" in r["measured_text"]
    # noise around a tie: the interval straddles the 0.97 bound of "at least as fast (3% tie)"
    noise = [0.90, 1.04, 0.93, 1.05, 0.92, 1.03, 0.94, 1.06]
    _threshold_samples(data, mg, {65536: [m * n for m, n in zip(mg, noise)]})
    a = _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.vs_fixed_threshold")
    assert a["measured_low"] < 0.97 < a["measured_high"] and a["verdict"] == "inconclusive"
    # the same inputs twice: the same interval and verdict (the bootstrap is seeded)
    b = _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.vs_fixed_threshold")
    keys = ["measured_low", "measured_high", "verdict"]
    assert list(a[keys]) == list(b[keys])
    # a clear loss: MG-WFBP 20% slower than a threshold in every pair
    _threshold_samples(data, mg, {65536: [m / 1.2 for m in mg]})
    assert _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.vs_fixed_threshold")["verdict"] == "not reproduced"
    # fewer than 5 pairs: inconclusive however clear
    _threshold_samples(data, mg[:4], {65536: [m * 1.5 for m in mg[:4]]})
    r = _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.vs_fixed_threshold")
    assert r["measured"] == pytest.approx(1.5) and r["verdict"] == "inconclusive"


def test_the_best_of_several_schedulers_is_taken_inside_each_draw():
    """``agg: min`` over cells: each threshold's median over the drawn pairs, then the smallest."""
    df = pd.DataFrame([{"scheduler": s, "threshold_bytes": b, "pair": i, "iteration_s": t}
                       for i in range(6) for s, b, t in (("mgwfbp", None, 1.0), ("threshold", 1, 1.2 + 0.01 * i),
                                                         ("threshold", 2, 1.1 + 0.01 * (5 - i)))])
    m = {"table": "t", "pair": "pair", "value": "iteration_s", "num": {"scheduler": "threshold"},
         "den": {"scheduler": "mgwfbp"}, "cells": ["scheduler", "threshold_bytes"], "agg": "min", "as": "ratio"}
    got = cl._bootstrap(m, df)
    assert got["value"] == pytest.approx(1.125) and got["samples"] == 6  # threshold 2's median, not the pooled one
    assert 1.1 <= got["low"] <= got["value"] <= got["high"] <= 1.15


def test_an_up_to_claim_is_judged_on_the_papers_models_and_far_above_is_not_reproduced(tmp_path):
    data = tmp_path / "data"

    def speedups(values):
        rows = []
        for model, net, ratio in values:
            rows += [{"model": model, "network": net, "workers": 16, "origin": "simulated", "scheduler": "wfbp",
                      "speedup": 10.0}, {"model": model, "network": net, "workers": 16, "origin": "simulated",
                                         "scheduler": "mgwfbp", "speedup": 10.0 * ratio}]
        write_table(pd.DataFrame(rows), data, "mgwfbp_sim_speedup")
        return _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.journal_vs_wfbp")

    # googlenet is not one of the journal's four models: its 3x is never the maximum
    r = speedups([("googlenet", "10gbe-derived", 3.0), ("densenet161", "10gbe-derived", 1.72),
                  ("resnet152", "56gbib-derived", 1.1)])
    assert r["simulated"] == pytest.approx(1.72) and r["simulated_at"] == "densenet161, 10gbe-derived"
    assert r["verdict"] == "reproduced"
    r = speedups([("densenet201", "10gbe-derived", 2.17)])  # 2.17x against "up to about 1.7x"
    assert r["verdict"] == "direction only"
    assert speedups([("densenet201", "10gbe-derived", 1.0)])["verdict"] == "not reproduced"


def test_simulated_claims_get_a_calibrated_column(tmp_path):
    data = tmp_path / "data"
    _omgs_setting(data, 0.666, 0.507)  # no cost_mode column: an old table, all paper mode
    r = _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")
    assert r["verdict"] == "reproduced" and r["calibrated_text"] == cl.NOT_RUN
    rows = [{"model": "resnet50", "planner": p, "iteration_s": t, "buckets": 1, "cost_mode": "paper"}
            for p, t in (("topk_single", 0.666), ("omgs", 0.507))]
    write_table(pd.DataFrame(rows), data, "omgs_paper_setting")
    r = _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")
    assert r["calibrated_text"] == cl.NOT_RUN  # the calibrated mode has not run
    other = rows + [{"model": "vgg16_cifar", "planner": p, "iteration_s": 0.3, "buckets": 1, "cost_mode": "calibrated"}
                    for p in ("topk_single", "omgs")]
    write_table(pd.DataFrame(other), data, "omgs_paper_setting")
    r = _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")  # it ran, but not for resnet50
    assert r["calibrated_text"] == cl.NO_CALIBRATED and r["verdict_calibrated"] == cl.NO_CALIBRATED
    rows += [{"model": "resnet50", "planner": p, "iteration_s": t, "buckets": 5, "cost_mode": "calibrated"}
             for p, t in (("topk_single", 0.70), ("omgs", 0.70))]
    write_table(pd.DataFrame(rows), data, "omgs_paper_setting")
    table = cl.claims_table(data, ["omgs"])
    r = _row(table, "omgs.speedup_resnet50")
    assert r["simulated"] == pytest.approx(0.666 / 0.507) and r["calibrated"] == pytest.approx(1.0)
    assert r["verdict"] == "reproduced" and r["verdict_calibrated"] == "not reproduced"
    assert "(calibrated: not reproduced, 1.00x)" in cl.verdict_line(r)
    assert "1 bucket(s)" in r["why"]  # facts read the paper-mode rows
    page = cl.claims_markdown(cl.snapshot(table, "test").astype(str))
    section = page[page.index("## Where the paper and calibrated presets disagree"):page.index("## OMGS")]
    assert "omgs.speedup_resnet50" in section


def test_settings_come_from_the_tables_params(tmp_path):
    data = tmp_path / "data"
    rows = [{"model": "tiny_resnet", "lm": False, "scheduler": s, "seed": i, "epoch": 3, "test_accuracy": 0.5}
            for s in ("wfbp", "topk_single", "omgs") for i in range(5)]
    params = {"cnn_model": "tiny_resnet", "cnn_density": 0.2, "convergence_epochs": 3, "convergence_world_size": 2}
    write_table(pd.DataFrame(rows), data, "omgs_convergence", params=params)
    r = _row(cl.claims_table(data, ["omgs"]), "omgs.convergence")
    assert "density 0.2 (paper 0.001)" in r["settings_text"] and "epochs 3" in r["settings_text"]
    assert "workers 2 (paper 16)" in r["settings_text"] and "seeds 5" in r["settings_text"]
    assert "not the paper's setting: the paper's density 0.001 runs here too" in r["settings_text"]
    write_table(pd.DataFrame(rows), data, "omgs_convergence",
                params=dict(params, cnn_density=0.001, convergence_world_size=16))
    assert _row(cl.claims_table(data, ["omgs"]), "omgs.convergence")["settings_text"].endswith(
        "at the paper's setting")



def test_a_setting_the_verdicts_metric_selects_is_named_not_called_unrecorded(tmp_path):
    """omgs.faster_tiny is judged on the samples at density 0.001 (its metric's ``where``), which the
    params JSON holds only as a sweep: the page says "density 0.001", not "density not recorded"."""
    data = tmp_path / "data"
    rows = [{"model": m, "scheduler": s, "density": d, "pair": p, "iteration_s": 1.0}
            for m in ("tiny_resnet", "tiny_lstm") for s in ("topk_single", "omgs") for d in (0.05, 0.001)
            for p in range(5)]
    write_table(pd.DataFrame(rows), data, "omgs_timing_samples", params={"timing_densities": [0.05, 0.001]})
    text = _row(cl.claims_table(data, ["omgs"]), "omgs.faster_tiny")["settings_text"]
    assert "density 0.001" in text and "density not recorded" not in text and "density 0.001 (paper" not in text

def test_osp_is_judged_against_its_best_baseline_and_osp_auto_never_counts(tmp_path):
    data = tmp_path / "data"
    rows = [{"model": "resnet50", "network": "10gbit", "scheduler": s, "iteration_s": t}
            for s, t in (("ps_bsp", 1.5), ("ps_asp", 1.05), ("ps_ssp", 1.1), ("osp", 1.0), ("osp_auto", 0.5))]
    write_table(pd.DataFrame(rows), data, "osp_sim_throughput")
    r = _row(cl.claims_table(data, ["osp"]), "osp.throughput")
    assert r["simulated"] == pytest.approx(5.0) and r["verdict"] == "direction only"  # +5% over ASP, not +50% over BSP
    assert "+50.0%" in r["why"]  # against BSP alone, as a fact
    assert "osp_auto" not in str(cl.load_claims("osp")[0]["simulated"])


def test_verdict_rules_and_samples_are_validated(tmp_path):
    def write(rule, measured=None):
        (tmp_path / "omgs.yaml").write_text(yaml.safe_dump({"title": "x", "claims": [
            {"id": "omgs.a", "claim": "c", "paper": {"value": 1, "source": "s"}, "rule": rule,
             "measured": measured}]}))
        cl._load_file.cache_clear()

    write({"kind": "at_most", "atol": 0.5, "partly_max": 5.0})
    with pytest.raises(cl.ClaimsError, match="unknown rule key.*partly_max"):
        cl.load_claims("omgs", tmp_path)
    write({"kind": "close", "atol": 0.1}, {"table": "t", "value": "v", "cells": ["scheduler"]})
    with pytest.raises(cl.ClaimsError, match="'cells' needs 'pair'"):
        cl.load_claims("omgs", tmp_path)


def test_a_measured_up_to_claim_far_above_the_paper_is_not_reproduced(tmp_path):
    """An "up to 1.7x" claim judged by recorded samples: a tight interval around 2.5x is "direction
    only", around 1.7x "reproduced", and one across the tolerance band's edge "inconclusive"."""
    claims = tmp_path / "claims"
    claims.mkdir()
    (claims / "mgwfbp.yaml").write_text(yaml.safe_dump({"title": "t", "claims": [{
        "id": "mgwfbp.up_to", "claim": "up to 1.7x", "paper": {"value": 1.7, "unit": "x", "source": "s"},
        "rule": {"kind": "close", "rtol": 0.1, "neutral": 1.0, "neutral_atol": 0.01}, "judge_by": "measured",
        "measured": {"table": "mgwfbp_timing_samples", "pair": "pair", "value": "iteration_s", "by": ["model"],
                     "num": {"scheduler": "wfbp"}, "den": {"scheduler": "mgwfbp"}, "as": "ratio", "reduce": "max"}}]}))
    data = tmp_path / "data"

    def judged(ratios):
        rows = [{"model": "m", "scheduler": s, "pair": i, "iteration_s": t}
                for i, r in enumerate(ratios) for s, t in (("mgwfbp", 0.1), ("wfbp", 0.1 * r))]
        write_table(pd.DataFrame(rows), data, "mgwfbp_timing_samples")
        return _row(cl.claims_table(data, ["mgwfbp"], directory=claims), "mgwfbp.up_to")

    far = judged([2.45, 2.5, 2.55, 2.48, 2.52, 2.5])
    assert far["measured"] == pytest.approx(2.5) and far["measured_low"] > 1.87 and far["verdict"] == "direction only"
    assert judged([1.68, 1.7, 1.72, 1.69, 1.71, 1.7])["verdict"] == "reproduced"
    assert judged([1.6, 1.9, 1.7, 2.0, 1.65, 1.95])["verdict"] == "inconclusive"  # straddles 1.87


def test_a_notebook_that_says_why_it_left_the_calibrated_mode_out_is_shown_as_na(tmp_path):
    data = tmp_path / "data"
    rows = [{"model": "resnet50", "planner": p, "iteration_s": t, "buckets": 1, "cost_mode": "paper"}
            for p, t in (("topk_single", 0.666), ("omgs", 0.507))]
    write_table(pd.DataFrame(rows), data, "omgs_paper_setting")
    assert _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")["calibrated_text"] == cl.NOT_RUN
    write_table(pd.DataFrame(rows), data, "omgs_paper_setting",
                params={"calibrated_omitted": {"1gbe-allgather": "no 1GbE measurements to fit"}})
    r = _row(cl.claims_table(data, ["omgs"]), "omgs.speedup_resnet50")
    assert r["calibrated_text"] == r["verdict_calibrated"] == "n/a (no calibrated preset: 1gbe-allgather)"


def test_a_claim_can_say_why_it_has_no_calibrated_number(tmp_path):
    claim = next(c for c in cl.load_claims("mgwfbp") if c["id"] == "mgwfbp.vs_fixed_threshold")
    assert claim["calibrated_na"]
    r = _row(cl.claims_table(tmp_path / "nothing", ["mgwfbp"]), "mgwfbp.vs_fixed_threshold")
    assert r["verdict_calibrated"].startswith("n/a (") and r["verdict_calibrated"] != cl.NOT_RUN


def test_an_exact_measured_number_is_judged_as_a_point_and_says_so(tmp_path):
    data = tmp_path / "data"
    rows = [{"epoch": e, "scheduler": s, "test_accuracy": a, "model": "tiny_resnet"}
            for e in (1, 2) for s, a in (("mgwfbp", 0.9 + e / 100), ("ddp", 0.9 + e / 100))]
    write_table(pd.DataFrame(rows), data, "mgwfbp_convergence")
    r = _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.convergence")
    assert r["verdict"] == "reproduced" and r["measured_text"].endswith("(exact)")
    rows = [dict(x, test_accuracy=x["test_accuracy"] - (0.02 if x["scheduler"] == "mgwfbp" else 0)) for x in rows]
    write_table(pd.DataFrame(rows), data, "mgwfbp_convergence")
    assert _row(cl.claims_table(data, ["mgwfbp"]), "mgwfbp.convergence")["verdict"] == "not reproduced"
    # a number without an interval that is not declared exact stays inconclusive
    plain = {"paper": {"value": 0.0}, "rule": {"kind": "close", "atol": 0.5}, "judge_by": "measured"}
    assert cl.judge(plain, None, 0.0) == cl.NO_INTERVAL and cl.judge(plain, None, 0.0, exact=True) == "reproduced"
