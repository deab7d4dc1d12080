"""The model registry: names, errors, shapes, parameter counts, tiny models train."""

import math

import pytest
import torch

from repro.models import (MODEL_NAMES, MODELS, PAPER_MODELS, TINY_MODELS, build_model, compute_loss,
                          count_params, get_spec, make_batch)

torch.set_num_threads(1)

EXPECTED = {"resnet50", "resnet152", "densenet161", "densenet201", "googlenet", "vgg16",
            "inception_v4", "bert_base", "bert_large", "tiny_resnet", "tiny_vgg", "tiny_bert"}


def test_registry_names():
    assert set(MODEL_NAMES) == EXPECTED
    assert set(PAPER_MODELS) | set(TINY_MODELS) == EXPECTED
    assert not set(PAPER_MODELS) & set(TINY_MODELS)
    assert all(MODELS[n].name == n for n in MODEL_NAMES)


def test_paper_batch_sizes_and_input_sizes():
    expected = {"resnet152": 128, "densenet161": 64, "densenet201": 64, "inception_v4": 128,
                "googlenet": 64, "resnet50": 32, "vgg16": 32, "bert_base": 64, "bert_large": 32}
    assert {n: get_spec(n).paper_batch_size for n in PAPER_MODELS} == expected
    assert all(get_spec(n).paper_batch_size is None for n in TINY_MODELS)
    assert get_spec("inception_v4").input_size == (3, 299, 299)
    assert get_spec("resnet50").input_size == (3, 224, 224)
    assert get_spec("tiny_resnet").input_size == (3, 32, 32)
    assert get_spec("bert_base").input_size == (64,)
    assert get_spec("tiny_bert").input_size == (32,)


@pytest.mark.parametrize("call", [
    lambda: get_spec("resnet51"),
    lambda: build_model("resnet51", device="meta"),
    lambda: make_batch("resnet51", 2),
    lambda: compute_loss("resnet51", None, None, None),
])
def test_unknown_name_lists_valid_names(call):
    with pytest.raises(ValueError, match="unknown model 'resnet51'") as e:
        call()
    for name in MODEL_NAMES:
        assert name in str(e.value)


def test_bad_kwargs_and_batch_size():
    with pytest.raises(TypeError, match="seq_len"):
        build_model("resnet50", device="meta", seq_len=3)
    with pytest.raises(TypeError, match="num_classes"):
        make_batch("tiny_bert", 2, num_classes=3)
    with pytest.raises(ValueError, match="batch_size"):
        make_batch("tiny_vgg", 0)


def test_resnet50_parameter_count():
    assert count_params(build_model("resnet50", device="meta")) == 25_557_032


def test_bert_base_pretraining_heads():
    model = build_model("bert_base", device="meta")
    n = count_params(model)
    # BERT-Base encoder + embeddings ~109.5M; the pre-training heads add ~0.6M (decoder tied).
    assert 109_000_000 < n < 111_000_000
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.seq_relationship.out_features == 2
    assert model.config.hidden_size == 768 and model.config.num_hidden_layers == 12
    large = build_model("bert_large", device="meta")
    assert large.config.hidden_size == 1024 and large.config.num_hidden_layers == 24
    assert 330_000_000 < count_params(large) < 345_000_000


@pytest.mark.parametrize("name", PAPER_MODELS)
def test_paper_models_build_and_run_on_meta(name):
    model = build_model(name, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    inputs, targets = make_batch(name, 2, device="meta")
    loss = compute_loss(name, model, inputs, targets)
    assert loss.shape == ()


def test_vision_batch_shapes_and_determinism():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    x1, y1 = make_batch("inception_v4", 2, generator=g1)
    x2, y2 = make_batch("inception_v4", 2, generator=g2)
    assert x1.shape == (2, 3, 299, 299) and y1.shape == (2,)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    x, y = make_batch("tiny_resnet", 4, image_size=16, num_classes=5)
    assert x.shape == (4, 3, 16, 16) and int(y.max()) < 5


def test_bert_batch_shapes():
    inputs, targets = make_batch("bert_base", 3, device="meta")
    assert inputs["input_ids"].shape == (3, 64)
    inputs, targets = make_batch("tiny_bert", 8, generator=torch.Generator().manual_seed(0), seq_len=16)
    ids, labels = inputs["input_ids"], targets["labels"]
    assert ids.shape == labels.shape == inputs["token_type_ids"].shape == (8, 16)
    assert int(ids.max()) < get_spec("tiny_bert").num_classes
    assert (labels == -100).any() and (labels != -100).any()
    assert set(inputs["token_type_ids"].unique().tolist()) == {0, 1}
    assert targets["next_sentence_label"].shape == (8,)


def test_bert_seq_len_beyond_default_positions():
    model = build_model("tiny_bert", seq_len=200)
    inputs, targets = make_batch("tiny_bert", 2, seq_len=200)
    assert torch.isfinite(compute_loss("tiny_bert", model, inputs, targets, seq_len=200))


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_models_train_step(name):
    torch.manual_seed(0)
    model = build_model(name)
    inputs, targets = make_batch(name, 32, generator=torch.Generator().manual_seed(0))
    loss = compute_loss(name, model, inputs, targets)
    assert loss.shape == () and math.isfinite(loss.item())
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, n
    assert count_params(model) < 1_000_000
