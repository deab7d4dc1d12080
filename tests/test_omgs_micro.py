"""OMGS-SGD micro-benchmarks: top-k timing and its gamma fit (repro.runtime.calibrate)."""

import math

import pytest
import torch

from repro.core.cost import CostModel, topk_time_s
from repro.families.sparse.calibrate import fit_topk, time_topk


def test_time_topk_gives_one_positive_median_per_size_without_a_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    sizes = [64, 4096, 65536]
    seconds = time_topk(sizes, 0.01, repeats=3, warmup=1)
    assert len(seconds) == len(sizes)
    assert all(math.isfinite(s) and s > 0 for s in seconds)
    # selecting from 1000x more elements is not faster (loose: timings on a shared CPU are noisy)
    assert seconds[-1] > seconds[0]


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_time_topk_rejects_densities_outside_0_1(bad):
    with pytest.raises(ValueError, match="density"):
        time_topk([100], bad)


def test_time_topk_rejects_empty_tensors():
    with pytest.raises(ValueError, match="element"):
        time_topk([0], 0.1, repeats=1, warmup=0)


def test_fit_topk_returns_the_least_squares_gamma_of_its_own_measurements():
    sizes = [1024, 16384, 131072]
    gamma_s, seconds = fit_topk(sizes, 0.001, repeats=3)
    assert len(seconds) == len(sizes) and gamma_s > 0
    # the fit minimises relative errors, so it lies between the smallest and largest per-point gamma
    per_point = [t / (d * math.log2(d)) for d, t in zip(sizes, seconds)]
    assert min(per_point) * (1 - 1e-9) <= gamma_s <= max(per_point) * (1 + 1e-9)
    # and it plugs into the cost model
    cost = CostModel.from_alpha_beta(2, 1e-4, 1e-9).with_topk(gamma_s)
    assert cost.topk_s(sizes[-1]) == pytest.approx(topk_time_s(gamma_s, sizes[-1]))


# ---- the paper's models and GPU (estimates) ----

def test_vgg16_cifar_is_the_authors_cifar_vgg16():
    from repro.workload.models import build_model, compute_loss, count_params, get_spec, make_batch

    spec = get_spec("vgg16_cifar")
    assert spec.input_size == (3, 32, 32) and spec.num_classes == 10 and spec.paper_batch_sizes == {"omgs": 32}
    model = build_model("vgg16_cifar", device="meta")
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [64, 64, 128, 128, 256, 256, 256] + [512] * 6
    # 13 convs (3x3, bias) + batch norm (scale, shift) per conv + one linear 512 -> 10
    expected, cin = 0, 3
    for c in convs:
        expected += 9 * cin * c.out_channels + c.out_channels + 2 * c.out_channels
        cin = c.out_channels
    expected += 512 * 10 + 10
    assert count_params(model) == expected == 14_728_266
    x, y = make_batch("vgg16_cifar", 2, generator=torch.Generator().manual_seed(0))
    assert compute_loss("vgg16_cifar", build_model("vgg16_cifar"), x, y).isfinite()


def test_p102_is_in_the_gpu_table_between_its_pascal_neighbours():
    from repro.workload.estimate import GPU_SPECS, get_gpu

    p102 = get_gpu("P102-100")
    assert p102 is GPU_SPECS["P102"] is get_gpu("p102")
    assert p102.fp32_flops == pytest.approx(10.77e12, rel=1e-3) and p102.memory_bandwidth == 440.3e9
    assert p102.compute_efficiency is None and p102.memory_efficiency is None   # the defaults
    # GP102 with fewer cores than a 1080 Ti: about a P100's fp32, less memory bandwidth
    assert GPU_SPECS["K80"].fp32_flops < p102.fp32_flops < GPU_SPECS["V100"].fp32_flops
    assert p102.memory_bandwidth < GPU_SPECS["P100"].memory_bandwidth


@pytest.mark.parametrize("stem", ["vgg16_cifar_b32_p102-estimate", "resnet50_b32_p102-estimate",
                                  "inception_v4_b64_p102-estimate", "lstm_ptb_b20_p102-estimate"])
def test_p102_traces_of_the_papers_models_are_shipped_and_slower_than_v100(stem):
    from repro.core.paths import shipped_trace_path
    from repro.core.trace import Trace

    t = Trace.load(shipped_trace_path(stem))
    assert t.device == "P102 (estimate)" and t.extra["estimate"] is True and t.extra["gpu"] == "P102"
    assert t.batch_size == get_spec_batch(t.model)
    v100 = Trace.load(shipped_trace_path(stem.replace("p102", "v100")))
    assert t.names == v100.names and t.total_params == v100.total_params
    ratio = (t.total_forward_s + t.total_backward_s) / (v100.total_forward_s + v100.total_backward_s)
    assert 1.2 < ratio < 2.5   # peaks: 15.7/10.77 = 1.46x fp32, 900/440 = 2.04x bandwidth


def get_spec_batch(model):
    from repro.workload.models import get_spec

    return get_spec(model).paper_batch_sizes["omgs"]


# ---- text for the language models without downloads (pydoc_data.topics) ----

def test_pydoc_splits_are_contiguous_deterministic_and_sized_by_the_fractions():
    from repro.workload.datasets import get_dataset, pydoc, pydoc_words

    words = pydoc_words()
    assert len(words) > 50_000 and words.count("<eos>") > 5_000       # ~74k words in Python 3.11
    sets = {s: pydoc(s, seq_len=20) for s in ("train", "valid", "test")}
    tokens = {s: d.tensors[0].numel() for s, d in sets.items()}
    assert tokens["train"] == pytest.approx(0.8 * len(words), abs=25)
    assert tokens["valid"] == pytest.approx(0.1 * len(words), abs=25)
    assert tokens["test"] == pytest.approx(0.1 * len(words), abs=25)
    again = get_dataset("pydoc", split="train", seq_len=20)
    assert torch.equal(again.tensors[0], sets["train"].tensors[0]) and again.vocab == sets["train"].vocab
    # targets are the inputs shifted by one token, and the train split decodes back to the text
    x, y = sets["train"].tensors
    assert torch.equal(x.flatten()[1:], y.flatten()[:-1])
    vocab = sets["train"].vocab
    decoded = [vocab[i] for i in x[0].tolist()]
    assert [w if w in vocab else "<unk>" for w in words[:20]] == decoded


def test_pydoc_vocabulary_is_capped_with_the_rarest_words_unknown():
    from collections import Counter

    from repro.workload.datasets import pydoc, pydoc_words

    d = pydoc("train", vocab_size=50)
    assert len(d.vocab) == 50 and d.vocab[:2] == ["<eos>", "<unk>"] and len(set(d.vocab)) == 50
    assert int(d.tensors[0].max()) < 50
    train = pydoc_words()[:round(0.8 * len(pydoc_words()))]
    counts = Counter(w for w in train if w != "<eos>")
    kept = set(d.vocab[2:])
    assert min(counts[w] for w in kept) >= max(counts[w] for w in counts if w not in kept)
    assert (d.tensors[0] == 1).any()                                     # rare words became <unk>
    assert len(pydoc("train").vocab) == 1000                             # default: tiny_lstm's vocabulary
    with pytest.raises(ValueError, match="vocab_size"):
        pydoc(vocab_size=2)
    with pytest.raises(ValueError, match="split"):
        pydoc("dev")


def test_pydoc_trains_tiny_lstm():
    from repro.workload.datasets import make_loader, pydoc
    from repro.workload.models import build_model, compute_loss

    torch.manual_seed(0)
    data = pydoc("train", seq_len=16)
    model = build_model("tiny_lstm", num_classes=len(data.vocab))
    x, y = next(iter(make_loader(data, 8, seed=0)))
    assert x.shape == y.shape == (8, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = compute_loss("tiny_lstm", model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(1000), rel=0.05)          # uniform over 1000 words at start
    assert losses[-1] < losses[0]


# ---- the micro-benchmark study (repro.studies.omgs_micro) and its figures ----

def _fake_allgather(workers=(2,), a_s=1e-3, b_s_per_byte=1e-9, sizes=(8, 20, 68, 264, 4096, 65536)):
    import pandas as pd

    rows = [{"workers": p, "bytes_per_worker": m, "gathered_bytes": m * p,
             "measured_s": a_s + b_s_per_byte * p * m, "oversubscribed": p > 2}
            for p in workers for m in sizes]
    return pd.DataFrame(rows)


def test_published_numbers_are_the_papers():
    from repro.studies import omgs_micro as st

    assert st.PUBLISHED_GAMMA_S == 2.19e-10
    t = st.paper_iteration_times()
    assert list(t.model) == ["vgg16_cifar", "resnet50", "inception_v4", "lstm_ptb"]
    assert list(t.topk_sgd_s) == [0.336, 0.666, 1.602, 1.019] and list(t.omgs_sgd_s) == [0.331, 0.507, 1.243, 0.916]
    assert list(t.speedup) == [1.02, 1.31, 1.29, 1.11]
    # the published speedups are the published times' ratios, rounded
    assert all(abs(a / b - s) < 0.006 for a, b, s in zip(t.topk_sgd_s, t.omgs_sgd_s, t.speedup))
    assert set(t.workers) == {16} and set(t.network) == {"1GbE"}
    from repro.workload.models import get_spec

    assert all(get_spec(m).paper_batch_sizes["omgs"] == b for m, b in zip(t.model, t.batch_size))


def test_topk_fit_table_recovers_gamma_and_sets_the_published_line_beside_it():
    import pandas as pd

    from repro.studies import omgs_micro as st

    numels = st.default_numels(10, 16)
    assert numels == [1024, 4096, 16384, 65536]
    times = pd.DataFrame({"numel": numels, "k": 1, "density": 0.001, "threads": 1,
                          "measured_s": [topk_time_s(3e-10, n) for n in numels]})
    per_size, fits = st.topk_fit_table(times)
    mine = fits[fits.source == "measured"].iloc[0]
    assert mine.gamma_s == pytest.approx(3e-10) and mine.max_abs_relative_error < 1e-9
    assert fits[fits.source == "published"].iloc[0].gamma_s == 2.19e-10
    assert per_size.relative_error.abs().max() < 1e-9
    assert per_size.published_p102_s.iloc[-1] == pytest.approx(2.19e-10 * 65536 * 16)


def test_measure_topk_restores_the_thread_count():
    from repro.studies import omgs_micro as st

    before = torch.get_num_threads()
    t = st.measure_topk([256, 1024], 0.01, repeats=1, threads=1)
    assert torch.get_num_threads() == before
    assert list(t.k) == [3, 11] and set(t.threads) == {1} and (t.measured_s > 0).all()


def test_allgather_sizes_hold_every_sparse_message_and_reach_max_bytes():
    from repro.studies import omgs_micro as st

    numels = st.default_numels()
    sizes = st.allgather_sizes_bytes(numels, 0.001, max_bytes=2**20)
    assert {4 * int(math.ceil(0.001 * n)) for n in numels} <= set(sizes)
    assert max(sizes) == 2**20 and sizes == sorted(sizes) and all(s % 4 == 0 for s in sizes)


def test_allgather_fit_table_refits_measured_worlds_and_adds_the_published_fits():
    from repro.studies import omgs_micro as st

    ag = _fake_allgather(workers=(2, 3))
    fits = st.allgather_fit_table(ag)
    measured = fits[fits.source == "measured"].set_index("workers")
    assert list(measured.index) == [2, 3]
    assert measured.a_s.tolist() == pytest.approx([1e-3, 1e-3]) and measured.b_s_per_byte.tolist() == pytest.approx([1e-9] * 2)
    assert measured.oversubscribed.tolist() == [False, True]
    published = fits[fits.source == "published"].set_index("workers")
    assert published.loc[16, "a_s"] == 1.1e-2 and published.loc[16, "b_s_per_byte"] == 1.7e-8
    assert list(published.index) == [2, 4, 8, 16]
    errors = st.allgather_fit_errors(ag, fits)
    assert errors.relative_error.abs().max() < 1e-9


def test_cost_compare_uses_two_allgathers_per_tensor_and_the_papers_setting():
    import pandas as pd

    from repro.studies import omgs_micro as st

    numels = [1024, 65536]
    topk = pd.DataFrame({"numel": numels, "k": [2, 66], "density": 0.001, "measured_s": [1e-5, 1e-3]})
    ag = _fake_allgather(sizes=(8, 264))
    table = st.cost_compare_table(topk, ag, st.allgather_fit_table(ag))
    q = table.set_index(["setting", "numel", "quantity"]).seconds
    assert q["measured", 65536, "topk_s"] == 1e-3
    assert q["measured", 65536, "sparse_allgather_s"] == pytest.approx(2 * (1e-3 + 1e-9 * 2 * 264))
    assert q["measured", 65536, "allgather_startup_s"] == pytest.approx(1e-3)
    assert q["paper", 65536, "topk_s"] == pytest.approx(2.19e-10 * 65536 * 16)
    assert q["paper", 65536, "sparse_allgather_s"] == pytest.approx(2 * (1.1e-2 + 1.7e-8 * 16 * 4 * 66))
    with pytest.raises(ValueError, match="no all-gather measured at 264 bytes"):
        st.cost_compare_table(topk, ag[ag.bytes_per_worker != 264], st.allgather_fit_table(ag))


@pytest.mark.slow
def test_the_three_figures_draw_log_axes_and_legends_below(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from repro.figures import save_figure
    from repro.figures.omgs_micro_plots import (crossover_numel, plot_allgather_fit, plot_cost_compare,
                                                plot_topk_time)
    from repro.studies import omgs_micro as st

    numels = [1024, 65536, 1048576]
    topk = pd.DataFrame({"numel": numels, "k": [2, 66, 1049], "density": 0.001, "threads": 1,
                         "measured_s": [2e-6, 2e-4, 5e-3]})
    per_size, tfits = st.topk_fit_table(topk)
    ag = _fake_allgather(workers=(2, 3), sizes=(8, 264, 4196, 65536))
    afits = st.allgather_fit_table(ag)
    compare = st.cost_compare_table(topk, ag, afits)
    assert crossover_numel(compare, "measured") == 1048576 and crossover_numel(compare, "paper") is None
    for fig_id, fig in (("omgs.topk_time", plot_topk_time(per_size, tfits, "tiny scale, measured")),
                        ("omgs.allgather_fit", plot_allgather_fit(st.allgather_fit_errors(ag, afits), afits, "x")),
                        ("omgs.cost_compare", plot_cost_compare(compare, "tiny scale, measured"))):
        ax = fig.axes[0]
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and ax.get_xlabel() and ax.get_ylabel()
        assert fig.legends and not ax.get_legend()          # one legend for the figure, below the axes
        side = save_figure(fig, fig_id, tmp_path, scale="tiny", source="measured")
        assert "tiny" in side["title"] and (tmp_path / f"{fig_id.replace('.', '_')}.png").is_file()
        plt.close(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("published" in t for t in labels)


def test_a_fit_error_beyond_half_is_listed_with_its_sizes_and_why():
    from repro.figures.omgs_micro_plots import fit_error_note

    assert fit_error_note([1024, 4096], [0.2, -0.49], "elements", "why") == ""
    note = fit_error_note([1024, 4096, 2**20], [-0.79, 0.1, 0.6], "elements", "Because.")
    assert note == "beyond ±50%: -79% at 1,024 elements, +60% at 1,048,576 elements. Because."
