"""OMGS-SGD micro-benchmarks: top-k timing and its gamma fit (repro.runtime.calibrate)."""

import math

import pytest
import torch

from repro.cost import CostModel, topk_time_s
from repro.runtime.calibrate import fit_topk, time_topk


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
    from repro.data import shipped_trace_path
    from repro.trace import Trace

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
