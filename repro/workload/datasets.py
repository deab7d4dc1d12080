"""Datasets for training runs, and a loader that shards them over data-parallel ranks.

Nothing is downloaded: real datasets are read from ``data/datasets/`` (:func:`repro.core.paths.data_dir`;
``REPRO_DATA_DIR`` overrides it), and a missing one raises :class:`DatasetNotFoundError` saying where
to get it. :func:`get_dataset` builds any of :data:`DATASETS` by name; :func:`make_loader` gives a rank
its shard::

    loader = make_loader(get_dataset("digits", split="train"), 32, rank=rank, world_size=world_size, seed=0)
    loader.sampler.set_epoch(epoch)      # every epoch: a new shuffle, the same on every rank
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from repro.core.paths import data_dir
from repro.workload.models import make_batch

__all__ = ["DatasetNotFoundError", "UInt8ImageDataset", "TokenSequences", "CIFAR10_MEAN", "CIFAR10_STD",
           "IMAGENET_MEAN", "IMAGENET_STD", "digits", "cifar10", "imagenet", "ptb", "pydoc", "synthetic",
           "pydoc_words", "DATASETS", "DATASET_NAMES", "get_dataset", "make_loader"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)   # per-channel mean and std of the training images
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)     # the usual ImageNet normalisation (torchvision's)
IMAGENET_STD = (0.229, 0.224, 0.225)

_CIFAR_RECORD = 1 + 3 * 32 * 32           # one label byte, then 3072 pixel bytes (CHW, uint8)
_CIFAR_FILES = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]}
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
_PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not where they were looked for; the message says where and how."""


def _check_choice(label: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {label} {value!r}; valid: {', '.join(choices)}")


def _check_positive_int(label: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{label} must be a positive integer, got {value!r}")


def _root(root: str | Path | None, default: str) -> Path:
    return Path(root) if root is not None else data_dir() / default


class UInt8ImageDataset(Dataset):
    """Images ``(N, C, H, W)`` uint8 and labels ``(N,)`` int64; a sample is ``(image, label)`` with
    the image as float32 scaled to [0, 1] and, if ``mean``/``std`` are given, normalised per channel."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4 or len(images) != len(labels):
            raise ValueError("images must be uint8 (N, C, H, W) with one label per image")
        self.images, self.labels = images, labels
        self.mean = None if mean is None else torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = None if std is None else torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[index].float().div_(255)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x, self.labels[index]


def digits(split: str = "train", image_size: int = 32, channels: int = 3, test_fraction: float = 0.2,
           seed: int = 0) -> TensorDataset:
    """scikit-learn's handwritten digits (1797 8x8 images, 10 classes) as ``(C, S, S)`` float images:
    normalised with the training pixels' mean and std, resized (bilinear) and repeated to ``channels``
    (3x32x32 fits the tiny vision models). Stratified split from ``test_fraction`` and ``seed``
    (0.2: 1437 train, 360 test), samples in scikit-learn's order."""
    _check_choice("split", split, ("train", "test"))
    _check_positive_int("image_size", image_size)
    _check_positive_int("channels", channels)
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        raise ImportError("repro.workload.datasets.digits needs scikit-learn (pip install scikit-learn); "
                          "its digits ship with it, nothing is downloaded") from e

    raw = load_digits()
    images = raw.images.astype(np.float32) / 16.0           # (1797, 8, 8) in [0, 1]
    labels = raw.target.astype(np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=test_fraction,
                                           random_state=seed, stratify=labels)
    mean, std = images[train_idx].mean(), images[train_idx].std()
    idx = np.sort(train_idx if split == "train" else test_idx)
    x = torch.from_numpy((images[idx] - mean) / std).unsqueeze(1)   # (N, 1, 8, 8)
    if image_size != x.shape[-1]:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    x = x.repeat(1, channels, 1, 1).contiguous()
    return TensorDataset(x, torch.from_numpy(labels[idx]))


def _read_cifar_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    size = path.stat().st_size
    if size == 0 or size % _CIFAR_RECORD:
        raise ValueError(f"{path}: {size} bytes is not a positive multiple of {_CIFAR_RECORD} "
                         f"(1 label byte + 3072 pixel bytes per record); the file is truncated or is "
                         f"not from the CIFAR-10 binary version")
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
    labels = raw[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise ValueError(f"{path}: label {int(labels.max())} outside 0..9; this is not a CIFAR-10 "
                         f"binary file (CIFAR-100's binary layout has two label bytes)")
    return raw[:, 1:].reshape(-1, 3, 32, 32), labels


def cifar10(root: str | Path | None = None, split: str = "train", normalize: bool = True
            ) -> UInt8ImageDataset:
    """CIFAR-10 from the standard binary layout: ``<root>/cifar-10-batches-bin/data_batch_{1..5}.bin``
    (train, 50,000) and ``test_batch.bin`` (10,000), or those files directly in ``root`` (default
    ``data/datasets/cifar10``). Samples are float32 in [0, 1], normalised with :data:`CIFAR10_MEAN` /
    :data:`CIFAR10_STD` if ``normalize``; no augmentation."""
    _check_choice("split", split, ("train", "test"))
    root = _root(root, "cifar10")
    folder = root / "cifar-10-batches-bin"
    names = _CIFAR_FILES[split]
    if not folder.is_dir() and (root / names[0]).is_file():
        folder = root
    for name in names:
        if not (folder / name).is_file():
            raise DatasetNotFoundError(
                f"CIFAR-10 not found: expected {folder / name} (the {split} split is "
                f"{', '.join(names)} in {folder}). Put the 'CIFAR-10 binary version' there: download "
                f"cifar-10-binary.tar.gz from the dataset's site ({_CIFAR_URL}) and extract it into "
                f"{root}, which creates cifar-10-batches-bin/ (or pass root=..., or set REPRO_DATA_DIR)")
    parts = [_read_cifar_file(folder / name) for name in names]
    images = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    labels = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    return UInt8ImageDataset(images, labels, *((CIFAR10_MEAN, CIFAR10_STD) if normalize else ()))


def imagenet(root: str | Path | None = None, split: str = "train", image_size: int = 224) -> Dataset:
    """An ImageNet-style folder, ``<root>/<split>/<class>/<image>`` (``root``: ``data/datasets/imagenet``),
    as a torchvision ``ImageFolder`` (labels: sorted class folders). Train: random resized crop and flip;
    val: resize to ``image_size * 256 / 224`` and center crop; both normalised (:data:`IMAGENET_MEAN`)."""
    _check_choice("split", split, ("train", "val"))
    _check_positive_int("image_size", image_size)
    from torchvision import datasets, transforms

    root = _root(root, "imagenet")
    folder = root / split
    hint = (f"put one sub-folder per class there, holding that class's images, e.g. "
            f"{folder / 'n01440764' / 'n01440764_10026.JPEG'}: the ILSVRC2012 training and validation "
            f"images from https://image-net.org (registration required), validation images sorted "
            f"into class folders like the training ones (or pass root=..., or set REPRO_DATA_DIR)")
    if not folder.is_dir() or not any(p.is_dir() for p in folder.iterdir()):
        raise DatasetNotFoundError(f"ImageNet not found: expected class folders in {folder}; {hint}")
    crop = ([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip()] if split == "train"
            else [transforms.Resize(round(image_size * 256 / 224)), transforms.CenterCrop(image_size)])
    transform = transforms.Compose([*crop, transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    try:
        return datasets.ImageFolder(str(folder), transform=transform)
    except FileNotFoundError as e:   # e.g. a class folder without any image
        raise DatasetNotFoundError(f"ImageNet not usable in {folder}: {e}; {hint}") from e


class TokenSequences(TensorDataset):
    """``(input, target)`` pairs of token-id sequences (targets = inputs shifted by one token);
    ``vocab[i]`` is the word with id ``i``."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, vocab: Sequence[str]) -> None:
        super().__init__(inputs, targets)
        self.vocab = list(vocab)


def _words(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [w for line in f for w in line.split() + ["<eos>"]]


def ptb(root: str | Path | None = None, split: str = "train", seq_len: int = 35) -> TokenSequences:
    """Penn Treebank, word level, from ``<root>/ptb.{train,valid,test}.txt`` (``root``: ``data/datasets/ptb``).

    ``<eos>`` ends each line. The vocabulary comes from ``ptb.train.txt`` (ids by first appearance;
    ``<unk>`` for unknown words). With the token stream ``t`` and ``S = seq_len``, sample ``i`` is
    ``(t[i*S : (i+1)*S], t[i*S+1 : (i+1)*S+1])``.
    """
    _check_choice("split", split, ("train", "valid", "test"))
    _check_positive_int("seq_len", seq_len)
    root = _root(root, "ptb")
    for s in dict.fromkeys(("train", split)):
        path = root / f"ptb.{s}.txt"
        if not path.is_file():
            raise DatasetNotFoundError(
                f"Penn Treebank not found: expected {path} (word-level text, one sentence per line; "
                f"ptb.train.txt, ptb.valid.txt and ptb.test.txt in {root}; the vocabulary comes from "
                f"ptb.train.txt). These are the data/ptb.*.txt files of Mikolov's simple-examples.tgz "
                f"({_PTB_URL}) (or pass root=..., or set REPRO_DATA_DIR)")
    vocab = list(dict.fromkeys(_words(root / "ptb.train.txt")))
    if "<unk>" not in vocab:
        vocab.append("<unk>")
    path = root / f"ptb.{split}.txt"
    return _cut(_words(path), vocab, seq_len, str(path))


def _cut(words: Sequence[str], vocab: Sequence[str], seq_len: int, what: str) -> TokenSequences:
    """Word stream -> ids (words outside ``vocab`` are ``<unk>``) -> ``len // seq_len`` sequences."""
    index = {w: i for i, w in enumerate(vocab)}
    unk = index["<unk>"]
    ids = [index.get(w, unk) for w in words]
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise ValueError(f"{what}: {len(ids)} tokens (with <eos>) are too few for one sequence of "
                         f"seq_len={seq_len} (needs seq_len + 1)")
    stream = torch.tensor(ids[:n * seq_len + 1], dtype=torch.int64)
    return TokenSequences(stream[:-1].view(n, seq_len), stream[1:].view(n, seq_len), vocab)


_PYDOC_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+")


def pydoc_words() -> list[str]:
    """The word stream of :func:`pydoc` before the split: every topic of ``pydoc_data.topics`` in
    sorted topic order, each non-empty line lower-cased, cut into words (letters, with an inner
    apostrophe), numbers written as ``N`` (as in PTB) and punctuation dropped, then ``<eos>``."""
    from pydoc_data.topics import topics

    out: list[str] = []
    for key in sorted(topics):
        for line in topics[key].splitlines():
            words = ["N" if w[0].isdigit() else w for w in _PYDOC_WORD.findall(line.lower())]
            if words:
                out += words + ["<eos>"]
    return out


def pydoc(split: str = "train", seq_len: int = 35, vocab_size: int = 1000,
          valid_fraction: float = 0.1, test_fraction: float = 0.1) -> TokenSequences:
    """Word-level language-model data from the running Python's help texts (``pydoc_data.topics``),
    nothing downloaded; deterministic for one interpreter.

    The :func:`pydoc_words` stream is split contiguously into train, valid and test. The vocabulary is
    ``<eos>``, ``<unk>`` and the training part's ``vocab_size - 2`` most frequent other words (ties:
    first appearance first); any other word is ``<unk>``. Sequences are cut as in :func:`ptb`.
    """
    _check_choice("split", split, ("train", "valid", "test"))
    _check_positive_int("seq_len", seq_len)
    _check_positive_int("vocab_size", vocab_size)
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be at least 3 (<eos>, <unk> and one word), got {vocab_size}")
    for label, v in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0 < v < 1:
            raise ValueError(f"{label} must be in (0, 1), got {v!r}")
    if valid_fraction + test_fraction >= 1:
        raise ValueError(f"valid_fraction + test_fraction must be below 1, got {valid_fraction + test_fraction!r}")
    words = pydoc_words()
    a = round(len(words) * (1 - valid_fraction - test_fraction))
    b = round(len(words) * (1 - test_fraction))
    parts = {"train": words[:a], "valid": words[a:b], "test": words[b:]}
    counts = Counter(parts["train"])
    counts.pop("<eos>", None)
    ranked = sorted(counts, key=lambda w: -counts[w])   # stable: ties keep first appearance
    vocab = ["<eos>", "<unk>"] + ranked[:vocab_size - 2]
    return _cut(parts[split], vocab, seq_len, f"pydoc ({split} split)")


def synthetic(model_name: str, batch_size: int, num_batches: int, seed: int = 0,
              device: str | torch.device = "cpu", **model_kwargs: Any) -> list[tuple[Any, Any]]:
    """``num_batches`` random ``(inputs, targets)`` batches of ``model_name`` (iterate the list directly,
    not through :func:`make_loader`) from :func:`repro.workload.models.make_batch`, seeded by ``seed``."""
    _check_positive_int("num_batches", num_batches)
    gen = torch.Generator().manual_seed(seed)
    return [make_batch(model_name, batch_size, device=device, generator=gen, **model_kwargs)
            for _ in range(num_batches)]


DATASETS: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (digits, cifar10, imagenet, ptb, pydoc, synthetic)}
DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)


def get_dataset(name: str, **kwargs: Any) -> Any:
    """The dataset ``name`` built with ``kwargs``; ``ValueError`` listing the valid names if unknown."""
    fn = DATASETS.get(name)
    if fn is None:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}")
    return fn(**kwargs)


def make_loader(dataset: Dataset, batch_size: int, *, rank: int = 0, world_size: int = 1,
                shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                num_workers: int = 0, pin_memory: bool = False) -> DataLoader:
    """A ``DataLoader`` over rank ``rank``'s shard of ``dataset``: a ``DistributedSampler`` with these
    arguments, so every rank gets the same number of samples and batches (``drop_last=False`` repeats up
    to ``world_size - 1`` samples and may end with a smaller batch). ``pin_memory`` is for a CUDA device.
    Call ``loader.sampler.set_epoch(epoch)`` every epoch, the same on all ranks.
    """
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("world_size", world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, world_size={world_size}), got {rank!r}")
    n = len(dataset)
    per_rank = n // world_size if drop_last else math.ceil(n / world_size)
    batches = per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
    if batches < 1:
        raise ValueError(f"dataset of {n} samples cannot give world_size={world_size} ranks a batch of "
                         f"{batch_size} (each rank gets {per_rank} samples"
                         f"{'; incomplete batches are dropped' if drop_last else ''})")
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last,
                      num_workers=num_workers, pin_memory=pin_memory)
