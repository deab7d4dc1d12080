"""The batches `repro train` feeds its ranks (repro.training.data): drawn where the model trains, pinned for a GPU."""

from __future__ import annotations

import pytest
import torch

from repro.training.config import TrainConfig
from repro.training.data import Batches, batch_generator, epoch_batches, loader_workers


def _firsts(cfg, rank, device, n=3):
    it = epoch_batches(cfg, rank, 2, device, 0)
    return [next(it) for _ in range(n)]


def test_synthetic_batches_come_from_a_generator_on_the_training_device(monkeypatch):
    import repro.workload.models as models

    seen = []
    real = models.make_batch

    def spy(name, batch_size, device="cpu", generator=None, **kw):
        seen.append((torch.device(device), generator.device))
        return real(name, batch_size, device=device, generator=generator, **kw)

    monkeypatch.setattr(models, "make_batch", spy)
    cfg = TrainConfig(model="tiny_resnet", batch_size=4)
    _firsts(cfg, 0, torch.device("cpu"), 2)
    assert seen and all(gen == dev for dev, gen in seen)


def test_synthetic_batches_repeat_with_the_seed_and_differ_between_ranks():
    cfg = TrainConfig(model="tiny_resnet", batch_size=4, seed=7)
    a, b = _firsts(cfg, 0, torch.device("cpu")), _firsts(cfg, 0, torch.device("cpu"))
    other = _firsts(cfg, 1, torch.device("cpu"))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], other[0][0])
    assert not torch.equal(a[0][0], a[1][0])  # a stream, not one batch repeated


def test_loader_workers_defaults_and_checks(monkeypatch):
    assert loader_workers(torch.device("cpu")) == 0
    assert loader_workers(torch.device("cpu"), 3) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert 0 <= loader_workers(torch.device("cuda")) <= 4
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_workers"):
            loader_workers(torch.device("cpu"), bad)
    with pytest.raises(ValueError, match="num_workers"):
        TrainConfig(num_workers=-2)


def test_real_batches_cross_epochs_and_a_gpu_loader_pins(monkeypatch):
    import repro.workload.datasets as datasets

    made = []
    real = datasets.make_loader

    def spy(*a, **kw):
        made.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(datasets, "make_loader", spy)
    cfg = TrainConfig(model="tiny_resnet", dataset="digits", batch_size=256, epochs=1)
    data = Batches(cfg, 0, 2, torch.device("cpu"))
    per_epoch = 1797 // 2 // 256
    for _ in range(per_epoch + 1):
        data.next()
    assert data.epoch == 1 and made[0]["pin_memory"] is False and made[0]["num_workers"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_synthetic_batches_are_drawn_there():
    cfg = TrainConfig(model="tiny_resnet", batch_size=4)
    x, y = _firsts(cfg, 0, torch.device("cuda"), 1)[0]
    assert x.is_cuda and y.is_cuda and batch_generator(0, 0, torch.device("cuda")).device.type == "cuda"
