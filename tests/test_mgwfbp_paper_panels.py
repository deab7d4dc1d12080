"""MG-WFBP's published numbers are drawn where the paper draws them, and the measured figures carry
the paper-scale simulated panels (issue 24): each test fails if a published number or a panel is dropped."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from repro.figures import mgwfbp_plots as mp  # noqa: E402
from repro.costs.presets import preset  # noqa: E402
from repro.studies import mgwfbp_sim as study  # noqa: E402


def _texts(fig) -> str:
    out = [fig._suptitle.get_text() if fig._suptitle else ""] + [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out += [ax.get_title()] + [t.get_text() for t in ax.texts]
    for leg in fig.legends:
        out += [t.get_text() for t in leg.get_texts()]
    return "\n".join(out)


def test_published_fits_are_data_with_their_source_and_are_the_presets():
    fits = study.paper_allreduce_fits()
    assert {"source", "where", "page"} <= set(fits.columns) and fits.source.str.contains("TPDS 2021").all()
    assert len(fits) == 8 and set(fits.workers) == {2, 4, 8, 16}
    for _, r in fits.iterrows():  # the presets the simulations use hold exactly the published lines
        line = preset(r.network, int(r.workers)).line("allreduce")
        assert (line.a_s, line.b_s_per_byte) == (r.a_s, r.b_s_per_byte)
    head = study.journal_headline().set_index("baseline")
    assert head.speedup.to_dict() == {"wfbp": 1.7, "syncea": 1.2}
    assert head.source.str.contains("TPDS 2021").all()


def _fit_tables():
    from repro.studies import mgwfbp_train as train

    times = pd.DataFrame([{"workers": 2, "bytes": n, "seconds": 1e-3 + n * 1e-8, "oversubscribed": False}
                          for n in (4096, 65536, 1048576)])
    fits = train.allreduce_fit_table(times)
    return train.allreduce_fit_errors(times, fits), fits


def test_allreduce_fit_draws_every_published_line():
    errors, fits = _fit_tables()
    paper = study.paper_allreduce_fits()
    fig = mp.plot_allreduce_fit(errors, fits, "tiny scale, test", paper)
    ax = fig.axes[2]
    assert ax.get_title().startswith("paper (") and ax.get_xlabel() and "ms" in ax.get_ylabel()
    drawn = {ln.get_label(): ln for ln in ax.get_lines()}
    for _, r in paper.iterrows():  # one line per distinct published fit; its values are a + b*M
        hit = [ln for lab, ln in drawn.items() if f"P={int(r.workers)}," in lab and r.paper_network in lab]
        assert len(hit) == 1, (r.network, r.workers, list(drawn))
        x, y = hit[0].get_data()
        np.testing.assert_allclose(y, (r.a_s + r.b_s_per_byte * np.asarray(x)) * 1e3)
    assert len(drawn) == 6  # P=2 and P=4 are the same intra-node line for both networks: drawn once each
    plt.close(fig)
    assert len(mp.plot_allreduce_fit(errors, fits, "t").axes) == 2  # without the paper, as before


def test_cost_models_show_the_published_a_and_b_per_p():
    paper = study.paper_allreduce_fits()
    fig = mp.plot_cost_models(study.cost_model_table(45.25e-6, 1.3e-10, 2.5e-9, [2, 4, 8, 16, 64]), "t", paper)
    for ax, col, scale in ((fig.axes[0], "a_s", 1e3), (fig.axes[1], "b_s_per_byte", 1e9)):
        for net, g in paper.groupby("paper_network"):
            sets = [c for c in ax.collections if net in c.get_label() and c.get_label().startswith("paper")]
            assert len(sets) == 1, (net, [c.get_label() for c in ax.collections])
            got = sorted(map(tuple, sets[0].get_offsets().tolist()))
            want = sorted(zip(g.workers.astype(float), g[col] * scale))
            np.testing.assert_allclose(got, want)
    plt.close(fig)



def test_cost_models_say_where_the_paper_fits_and_the_lines_are_more_than_2x_apart():
    paper = study.paper_allreduce_fits()
    table = study.cost_model_table(45.25e-6, 1.07e-9, 2.5e-9, [2, 4, 8, 16, 64])
    lines = mp.cost_model_gap_lines(table, paper)
    ring = table[table.algorithm == "ring"].set_index("workers")["b_s_per_byte"]
    far = [r for r in paper.itertuples() if r.workers in ring.index
           and not 0.5 <= r.b_s_per_byte / ring[r.workers] <= 2]
    assert len(lines) == len(far) > 0 and all("ring line" in ln and "ns/B" in ln for ln in lines)
    fig = mp.plot_cost_models(table, "t", paper)
    assert any("more than 2x apart" in t.get_text() for t in fig.texts)
    plt.close(fig)
    # lines that match the fits leave no note
    one = paper[paper.paper_network == paper.paper_network.iloc[0]]
    close = table.assign(b_s_per_byte=table.workers.map(dict(zip(one.workers, one.b_s_per_byte))).fillna(1e-9))
    assert mp.cost_model_gap_lines(close, one) == []

def test_real_speedup_shows_the_conference_speedups_beside_their_simulation_and_the_tie():
    speedup = pd.DataFrame([{"model": "tiny_resnet", "scheduler": s, "workers": p, "speedup": p * 0.8,
                             "oversubscribed": False} for s in ("linear", "wfbp", "mgwfbp") for p in (1, 2)])
    k80 = study.k80_speedup_table()
    paper = study.paper_speedups()
    fig = mp.plot_real_speedup(speedup, "tiny scale, test", k80)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3
    for ax, model in zip(visible[1:], ("googlenet", "resnet50")):
        assert ax.get_title().startswith(model) and "paper (INFOCOM'19" in ax.get_title()
        dots = np.concatenate([c.get_offsets() for c in ax.collections if len(c.get_offsets())])
        want = paper[paper.model == model][["workers", "speedup"]].to_numpy(dtype=float)
        assert sorted(map(tuple, dots.tolist())) == sorted(map(tuple, want.tolist()))
        assert ax.get_lines(), "the simulated lines"
    text = _texts(fig)
    assert "googlenet: paper 1.20x, simulated 1.00x (a tie), not reproduced" in text.replace("\n", " ")
    assert "(ours, measured, tiny)" in text
    plt.close(fig)


def test_sim_speedup_says_that_googlenet_simulates_as_a_tie():
    traces = study.load_traces(["googlenet"], "k80-estimate")
    sweep = study.speedup_sweep({"googlenet@k80": traces["googlenet"]}, ["10gbe-k80"], [2, 4, 8],
                                ["wfbp", "syncea", "mgwfbp"])
    fig = mp.plot_sim_speedup(study.sim_speedup_table(sweep, study.paper_speedups(), ["googlenet@k80"]))
    text = _texts(fig)
    assert "googlenet: paper 1.20x, simulated 1.00x (a tie), not reproduced" in text
    plt.close(fig)


def test_breakdown_has_the_paper_scale_panels_and_the_journal_headline():
    bd = pd.DataFrame([{"model": "tiny_resnet", "scheduler": s, "workers": 2, "wire_dtype": "float32", "source": src,
                        "computation_s": 0.05, "exposed_comm_s": 0.01, "oversubscribed": False}
                       for s in ("wfbp", "syncea", "mgwfbp") for src in ("measured", "simulated")])
    paper_bd = study.paper_breakdown_table()
    assert set(paper_bd.model) == set(study.JOURNAL_MODELS) and set(paper_bd.workers) == {16}
    assert set(paper_bd.wire_dtype) == {"float32", "float16"} and set(paper_bd.network) == set(study.JOURNAL_NETWORKS)
    head = study.journal_headline()
    cmp = study.headline_comparison(paper_bd, head).set_index("baseline")
    assert cmp.paper_speedup.to_dict() == {"wfbp": 1.7, "syncea": 1.2}
    fig = mp.plot_breakdown(bd, "tiny scale, test", paper_bd, head)
    assert len(fig.axes) == 2 + len(study.JOURNAL_MODELS) * len(study.JOURNAL_NETWORKS)
    text = _texts(fig)
    flat = text.replace("\n", " ")
    assert "up to 1.7x over WFBP" in flat and "up to 1.2x over SyncEASGD" in flat
    # no gain of ours in a title: the claims page judges the headline on another table (mgwfbp_sim_speedup)
    assert f"{cmp.simulated_speedup['wfbp']:.2f}x" not in flat and "claims page" in flat
    assert text.count("(simulated)") >= len(study.JOURNAL_MODELS) * len(study.JOURNAL_NETWORKS)
    assert "measured (tiny)" in text
    # the bars are the table's: computation + exposed communication in ms
    ax = fig.axes[2]
    tops = sorted(round(p.get_y() + p.get_height(), 6) for p in ax.patches)
    sub = paper_bd[(paper_bd.model == study.JOURNAL_MODELS[0]) & (paper_bd.network == study.JOURNAL_NETWORKS[0])]
    want = sorted(round((r.computation_s + r.exposed_comm_s) * 1e3, 6) for r in sub.itertuples())
    assert [t for t in tops if t in want] and set(want) <= set(tops)
    plt.close(fig)
    # a headline without its numbers is not silently drawn: dropping it drops the line
    fig = mp.plot_breakdown(bd, "t", paper_bd, None)
    assert "1.7x" not in _texts(fig)
    plt.close(fig)


def test_threshold_sweep_has_the_paper_scale_panels_and_a_verdict():
    sweep = pd.DataFrame([{"model": "tiny_resnet", "scheduler": "threshold", "workers": 2, "source": src,
                           "iteration_s": 0.1 + t * 1e-8, "threshold_bytes": t, "oversubscribed": False}
                          for t in (4096, 65536) for src in ("measured", "simulated")]
                         + [{"model": "tiny_resnet", "scheduler": s, "workers": 2, "source": src, "iteration_s": 0.09,
                             "threshold_bytes": None, "oversubscribed": False}
                            for s in ("mgwfbp", "optimal") for src in ("measured", "simulated")])
    paper_sweep = study.paper_threshold_sweep_table()
    fig = mp.plot_threshold_sweep(sweep, note="tiny scale, test", paper_scale=paper_sweep)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 1 + len(study.JOURNAL_MODELS) * len(study.JOURNAL_NETWORKS)
    titled = [ax for ax in visible if "simulated, paper scale" in ax.get_title()]
    assert len(titled) == len(study.JOURNAL_MODELS) * len(study.JOURNAL_NETWORKS)
    for ax in titled:
        assert "bytes" in ax.get_xlabel() and "ms" in ax.get_ylabel()
    assert "best fixed threshold ÷ MG-WFBP" in _texts(fig) and "reproduced" in _texts(fig)
    plt.close(fig)


@pytest.mark.parametrize("name", ["mgwfbp_allreduce_fits", "mgwfbp_journal_headline"])
def test_new_paper_number_files_name_paper_place_and_page(name):
    from repro.core.paths import paper_numbers_path

    df = pd.read_csv(paper_numbers_path(name))
    assert {"source", "where", "page"} <= set(df.columns)
    assert df[["source", "where", "page"]].notna().all().all()


def test_simulated_fp16_rows_compute_on_the_fp16_traces():
    bd = study.paper_breakdown_table(models=("densenet201",), networks=("10gbe-v100",), schedulers=("wfbp",))
    by = bd.set_index("wire_dtype")
    assert by.loc["float16", "trace"] == "densenet201_b64_v100-estimate-fp16"
    assert by.loc["float16", "compute_dtype"] == "float16"
    assert by.loc["float32", "trace"] == "densenet201_b64_v100-estimate"
    assert by.loc["float16", "computation_s"] < by.loc["float32", "computation_s"] / 2
    # a model without an FP16 estimate falls back to its FP32 trace, and says so
    trace, dtype, stem = study.compute_trace("vgg16", study.load_traces(["vgg16"])["vgg16"], "float16")
    assert dtype == "float32" and stem == "vgg16_b32_v100-estimate"


def test_sim_speedup_text_is_whole_and_the_paper_diamonds_ring_the_simulated_markers():
    traces = study.load_traces(["googlenet"], "k80-estimate")
    sweep = study.speedup_sweep({"googlenet@k80": traces["googlenet"]}, ["10gbe-k80"], [2, 4, 8],
                                ["wfbp", "syncea", "mgwfbp"])
    fig = mp.plot_sim_speedup(study.sim_speedup_table(sweep, study.paper_speedups(), ["googlenet@k80"]))
    title = fig._suptitle.get_text()
    assert not title.rstrip().endswith("scheduler's") and "at that P" in title
    for t in fig.texts:  # every verdict clause whole on one line: no "only." left alone
        assert all(len(line.split()) > 1 for line in t.get_text().split("\n")), t.get_text()
    ax = fig.axes[0]
    diamond = max(c.get_sizes()[0] for c in ax.collections if len(c.get_offsets()))
    marker = max(ln.get_markersize() for ln in ax.get_lines())
    assert diamond >= 2.5 * marker ** 2  # scatter size is in points², markersize in points
    plt.close(fig)


def test_sim_speedup_explains_the_derived_networks_only_when_drawn():
    traces = study.load_traces(["googlenet"], "k80-estimate")
    sweep = study.speedup_sweep({"googlenet": traces["googlenet"]}, ["10gbe-derived"], [2, 4], ["wfbp", "mgwfbp"])
    fig = mp.plot_sim_speedup(sweep)
    assert "10gbe-/56gbib-derived = per-hop ring" in _texts(fig)
    plt.close(fig)


def test_pack_parts_never_splits_a_clause():
    text = "head: a: paper 1.20x, not reproduced; b: paper 1.22x, simulated 1.10x, direction only."
    lines = mp._pack_parts(text, 50)
    assert lines == ["head: a: paper 1.20x, not reproduced;", "b: paper 1.22x, simulated 1.10x, direction only."]


def test_real_speedup_title_says_which_panels_are_simulated():
    speedup = pd.DataFrame([{"model": "tiny_resnet", "scheduler": s, "workers": p, "speedup": p * 0.8,
                             "oversubscribed": False} for s in ("linear", "wfbp", "mgwfbp") for p in (1, 2)])
    fig = mp.plot_real_speedup(speedup, "tiny scale, test", study.k80_speedup_table())
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "top panel measured" in title and "bottom panels simulated" in title  # one measured model: one panel
    plt.close(fig)


def test_titles_lose_nested_brackets_and_convergence_says_its_extent():
    assert mp.flat_brackets("g (batch 64, V100 (estimate)), P=16 (paper model)") == \
        "g (batch 64, V100, estimate), P=16 (paper model)"
    epochs = pd.DataFrame([{"scheduler": s, "epoch": e, "test_accuracy": 0.5 + e / 10}
                           for s in ("ddp", "mgwfbp") for e in (1, 2, 3)])
    assert mp.convergence_extent_text(epochs) == "1 seed, 3 epochs"
    fig = mp.plot_convergence(epochs, "n")
    assert "1 seed, 3 epochs" in fig.axes[0].get_title()
    plt.close(fig)
