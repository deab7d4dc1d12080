"""Datasets: digits, CIFAR-10 / ImageNet / PTB readers on small files written here, synthetic
batches, the registry, and sharding over ranks."""

import numpy as np
import pytest
import torch

from repro.workload.datasets import (CIFAR10_MEAN, CIFAR10_STD, DATASET_NAMES, DatasetNotFoundError, cifar10,
                            digits, get_dataset, imagenet, make_loader, ptb, synthetic)
from repro.workload.models import build_model, compute_loss

torch.set_num_threads(1)


# ---- digits ----

@pytest.fixture(scope="module")
def digits_train():
    return digits("train")


@pytest.mark.slow
def test_digits_shapes_classes_and_split_sizes(digits_train):
    test = digits("test")
    x, y = digits_train.tensors
    assert x.shape == (1437, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (1437,) and y.dtype == torch.int64
    assert len(test) == 360 and len(digits_train) + len(test) == 1797
    assert set(y.tolist()) == set(range(10)) == set(test.tensors[1].tolist())
    assert torch.equal(x[:, 0], x[:, 2])            # grey repeated to 3 channels
    assert abs(x.mean().item()) < 0.1 and 0.8 < x.std().item() < 1.2   # normalised (train statistics)
    small = digits("test", image_size=8, channels=1, test_fraction=0.5)
    assert small.tensors[0].shape == (899, 1, 8, 8)


def test_digits_split_is_deterministic_and_disjoint(digits_train):
    again = digits("train")
    assert all(torch.equal(a, b) for a, b in zip(digits_train.tensors, again.tensors))
    other = digits("train", seed=1)
    assert not torch.equal(digits_train.tensors[0], other.tensors[0])
    # No test image is also a training image.
    train = digits("train", image_size=8, channels=1).tensors[0].flatten(1)
    test = digits("test", image_size=8, channels=1).tensors[0].flatten(1)
    assert torch.cdist(test, train).min(dim=1).values.gt(0).float().mean() > 0.95


def test_digits_argument_errors():
    with pytest.raises(ValueError, match="split"):
        digits("val")
    with pytest.raises(ValueError, match="test_fraction"):
        digits(test_fraction=1.0)


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_vgg"])
def test_tiny_cnn_runs_on_a_digits_batch(digits_train, name):
    torch.manual_seed(0)
    model = build_model(name)
    x, y = next(iter(make_loader(digits_train, 16)))
    loss = compute_loss(name, model, x, y)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()


@pytest.mark.slow
def test_tiny_vgg_learns_digits(digits_train):
    torch.manual_seed(0)
    model = build_model("tiny_vgg")
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for x, y in make_loader(digits_train, 64, seed=0):
        opt.zero_grad()
        loss = compute_loss("tiny_vgg", model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert len(losses) == 1437 // 64
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])
    x, y = digits("test").tensors
    with torch.no_grad():
        accuracy = (model.eval()(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.6   # one epoch (chance: 0.1; ~0.89 observed)


# ---- CIFAR-10 ----

def _write_cifar(path, labels, rng):
    pixels = rng.integers(0, 256, size=(len(labels), 3072), dtype=np.uint8)
    records = np.concatenate([np.array(labels, dtype=np.uint8)[:, None], pixels], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    records.tofile(path)
    return pixels.reshape(-1, 3, 32, 32)


@pytest.fixture
def cifar_root(tmp_path, rng):
    folder = tmp_path / "cifar-10-batches-bin"
    written = {"train": [], "test": []}
    for i in range(1, 6):
        labels = [(i + j) % 10 for j in range(3)]
        written["train"].append((labels, _write_cifar(folder / f"data_batch_{i}.bin", labels, rng)))
    written["test"].append(([9, 0], _write_cifar(folder / "test_batch.bin", [9, 0], rng)))
    return tmp_path, written


@pytest.mark.parametrize("split, n", [("train", 15), ("test", 2)])
def test_cifar10_round_trips_exactly(cifar_root, split, n):
    root, written = cifar_root
    ds = cifar10(root, split, normalize=False)
    labels = [label for part in written[split] for label in part[0]]
    pixels = np.concatenate([part[1] for part in written[split]])
    assert len(ds) == n and ds.labels.tolist() == labels
    assert ds.images.dtype == torch.uint8 and torch.equal(ds.images, torch.from_numpy(pixels))
    x, y = ds[n - 1]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and int(y) == labels[-1]
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(pixels[-1]))
    # Normalised samples: (x - mean) / std per channel; the folder itself may be given as root.
    xn, _ = cifar10(root / "cifar-10-batches-bin", split)[n - 1]
    mean, std = torch.tensor(CIFAR10_MEAN).view(3, 1, 1), torch.tensor(CIFAR10_STD).view(3, 1, 1)
    assert torch.allclose(xn, (x - mean) / std)


def test_cifar10_bad_file_size_names_the_file(cifar_root):
    root, _ = cifar_root
    bad = root / "cifar-10-batches-bin" / "data_batch_3.bin"
    bad.write_bytes(bad.read_bytes()[:-1])
    with pytest.raises(ValueError, match="data_batch_3.bin.*not a positive multiple of 3073"):
        cifar10(root, "train")
    cifar10(root, "test")   # the other split is unaffected


def test_cifar10_missing_says_where(tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError) as e:
        cifar10(tmp_path / "nowhere")
    msg = str(e.value)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-bin" / "data_batch_1.bin") in msg
    assert "CIFAR-10 binary version" in msg and "cifar.html" in msg
    assert isinstance(e.value, FileNotFoundError)
    monkeypatch.setenv("REPRO_DATA_DIR", str(tmp_path))   # the default root is <data_dir>/cifar10
    with pytest.raises(DatasetNotFoundError, match="cifar10/cifar-10-batches-bin/test_batch.bin"):
        cifar10(split="test")


# ---- ImageNet folder ----

@pytest.fixture
def imagenet_root(tmp_path):
    from PIL import Image
    for split, per_class in (("train", 3), ("val", 2)):
        for c, colour in (("n01", (255, 0, 0)), ("n02", (0, 0, 255))):
            folder = tmp_path / split / c
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (12 + i, 10), colour).save(folder / f"{c}_{i}.png")
    return tmp_path


def test_imagenet_folder_labels_and_transforms(imagenet_root):
    train = imagenet(imagenet_root, "train", image_size=8)
    assert train.classes == ["n01", "n02"] and len(train) == 6
    assert [label for _, label in train.samples] == [0, 0, 0, 1, 1, 1]
    val = imagenet(imagenet_root, "val", image_size=8)
    assert len(val) == 4
    x, y = val[3]
    assert x.shape == (3, 8, 8) and y == 1
    # Blue image: the normalised red channel sits at (0 - mean) / std, blue at (1 - mean) / std.
    assert torch.allclose(x[0], torch.full((8, 8), -0.485 / 0.229), atol=1e-5)
    assert torch.allclose(x[2], torch.full((8, 8), (1 - 0.406) / 0.225), atol=1e-5)
    xs, ys = next(iter(make_loader(train, 2, shuffle=False)))
    assert xs.shape == (2, 3, 8, 8) and ys.tolist() == [0, 0]


def test_imagenet_missing_says_where(tmp_path, imagenet_root):
    with pytest.raises(DatasetNotFoundError, match="ImageNet not found") as e:
        imagenet(tmp_path / "none", "val")
    assert str(tmp_path / "none" / "val") in str(e.value) and "class" in str(e.value)
    empty = imagenet_root / "train" / "n03"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError, match="n03"):
        imagenet(imagenet_root, "train")
    with pytest.raises(ValueError, match="split"):
        imagenet(imagenet_root, "test")


# ---- Penn Treebank ----

@pytest.fixture
def ptb_root(tmp_path):
    (tmp_path / "ptb.train.txt").write_text(" the cat sat \n the dog sat on the cat \n")
    (tmp_path / "ptb.valid.txt").write_text(" the bird sat \n")
    (tmp_path / "ptb.test.txt").write_text(" a \n")
    return tmp_path


def test_ptb_tokens_vocab_and_sequences(ptb_root):
    train = ptb(ptb_root, "train", seq_len=3)
    assert train.vocab == ["the", "cat", "sat", "<eos>", "dog", "on", "<unk>"]
    # stream: the cat sat <eos> the dog sat on the cat <eos>  (11 tokens -> 3 sequences of 3)
    stream = [0, 1, 2, 3, 0, 4, 2, 5, 0, 1, 3]
    inputs, targets = train.tensors
    assert inputs.tolist() == [stream[0:3], stream[3:6], stream[6:9]]
    assert targets.tolist() == [stream[1:4], stream[4:7], stream[7:10]]
    valid = ptb(ptb_root, "valid", seq_len=2)
    assert valid.vocab == train.vocab
    assert valid.tensors[0].tolist() == [[0, 6]] and valid.tensors[1].tolist() == [[6, 2]]
    with pytest.raises(ValueError, match="too few"):
        ptb(ptb_root, "test", seq_len=2)


def test_ptb_trains_tiny_lstm_batch(ptb_root):
    ds = ptb(ptb_root, "train", seq_len=3)
    model = build_model("tiny_lstm", num_classes=len(ds.vocab))
    x, y = next(iter(make_loader(ds, 2)))
    assert x.shape == y.shape == (2, 3)
    assert torch.isfinite(compute_loss("tiny_lstm", model, x, y, num_classes=len(ds.vocab)))


def test_ptb_missing_says_where(tmp_path, ptb_root):
    with pytest.raises(DatasetNotFoundError, match="Penn Treebank not found") as e:
        ptb(tmp_path / "none", "test")
    assert str(tmp_path / "none" / "ptb.train.txt") in str(e.value)   # the vocabulary needs train
    (ptb_root / "ptb.test.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="ptb.test.txt"):
        ptb(ptb_root, "test")


# ---- synthetic, registry ----

def test_synthetic_batches_are_fixed_and_seeded():
    a = synthetic("tiny_resnet", 4, 3, seed=1)
    b = get_dataset("synthetic", model_name="tiny_resnet", batch_size=4, num_batches=3, seed=1)
    assert len(a) == 3 and a[0][0].shape == (4, 3, 32, 32) and a[0][1].shape == (4,)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert not torch.equal(a[0][0], a[1][0])
    assert not torch.equal(a[0][0], synthetic("tiny_resnet", 4, 1, seed=2)[0][0])
    x, y = synthetic("tiny_lstm", 2, 1, seq_len=5)[0]
    assert x.shape == y.shape == (2, 5)
    with pytest.raises(ValueError, match="num_batches"):
        synthetic("tiny_resnet", 4, 0)


def test_registry_names_and_unknown_name():
    assert DATASET_NAMES == ("digits", "cifar10", "imagenet", "ptb", "pydoc", "synthetic")
    assert len(get_dataset("digits", split="test")) == 360
    with pytest.raises(ValueError, match="unknown dataset 'mnist'") as e:
        get_dataset("mnist")
    for name in DATASET_NAMES:
        assert name in str(e.value)


# ---- sharding ----

def _indices(loader):
    return [i for batch in loader for i in batch[0].tolist()]


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_ranks_get_disjoint_shards_covering_the_dataset(shuffle):
    ds = torch.utils.data.TensorDataset(torch.arange(20))
    loaders = [make_loader(ds, 3, rank=r, world_size=2, shuffle=shuffle, drop_last=False) for r in (0, 1)]
    shards = [_indices(loader) for loader in loaders]
    assert [len(loader) for loader in loaders] == [4, 4]          # 10 samples each: 3 + 3 + 3 + 1
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(20))


def test_drop_last_and_epochs():
    ds = torch.utils.data.TensorDataset(torch.arange(23))
    loaders = [make_loader(ds, 4, rank=r, world_size=3, seed=5) for r in range(3)]
    assert [len(loader) for loader in loaders] == [1, 1, 1]      # 23 // 3 = 7 samples, one batch of 4
    first = [_indices(loader) for loader in loaders]
    assert all(len(s) == 4 for s in first) and len(set(sum(first, []))) == 12
    assert first == [_indices(loader) for loader in loaders]        # same epoch, same order
    for loader in loaders:
        loader.sampler.set_epoch(1)
    assert first != [_indices(loader) for loader in loaders]
    # drop_last=False pads the shards to the same size and keeps the short last batch.
    padded = [make_loader(ds, 4, rank=r, world_size=3, drop_last=False) for r in range(3)]
    assert [len(loader) for loader in padded] == [2, 2, 2]        # 8 samples each: 4 + 4
    assert set(sum((_indices(loader) for loader in padded), [])) == set(range(23))


def test_too_small_dataset_and_bad_arguments():
    ds = torch.utils.data.TensorDataset(torch.arange(7))
    with pytest.raises(ValueError, match="dataset of 7 samples cannot give world_size=2 ranks a batch of 4"):
        make_loader(ds, 4, rank=0, world_size=2)
    assert len(make_loader(ds, 4, rank=1, world_size=2, drop_last=False)) == 1
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(ds, 0)
    with pytest.raises(ValueError, match="rank"):
        make_loader(ds, 1, rank=2, world_size=2)
