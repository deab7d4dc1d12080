"""The batches ``repro train`` feeds its ranks: a real dataset's shard, or an endless synthetic stream,
deterministic given ``seed`` and the rank. Synthetic batches are drawn on the training device by a
generator that lives there; real ones come from a DataLoader (pinned on CUDA, :func:`loader_workers`
processes) and are copied with ``non_blocking=True``.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import torch

__all__ = ["batch_generator", "loader_workers", "epoch_batches", "Batches"]


def batch_generator(seed: int, rank: int, device: torch.device) -> torch.Generator:
    """The generator of rank ``rank``'s synthetic batches, on ``device`` (CPU or this rank's GPU)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1000 + rank)
    return gen


def loader_workers(device: torch.device, requested: int | None = None) -> int:
    """Loader processes per rank: ``requested`` if given; else 0 on a CPU (the ranks use the cores) and,
    on a GPU, up to 4 but no more than this rank's share of the CPUs it may use."""
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {requested!r}")
        return requested
    if device.type != "cuda":
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_rank = cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(4, per_rank - 1))


def epoch_batches(cfg: Any, rank: int, world: int, device: torch.device, epoch: int,
                  num_workers: int | None = None, *, generator: torch.Generator | None = None,
                  skip: int = 0) -> Iterator[tuple[Any, Any]]:
    """(inputs, targets) on ``device`` for one epoch of rank ``rank``'s shard of ``cfg.dataset``, or an
    endless synthetic stream (drawn with ``generator``, default :func:`batch_generator`). ``skip``: leave
    out the epoch's first ``skip`` batches without loading them."""
    if cfg.dataset == "synthetic":
        from repro.workload.models import make_batch

        gen = generator if generator is not None else batch_generator(cfg.seed, rank, device)
        while True:
            yield make_batch(cfg.model, cfg.batch_size, device=device, generator=gen, **cfg.model_kwargs)
    yield from _moved(iter(_epoch_loader(cfg, rank, world, device, epoch, num_workers, skip)), device)


def _epoch_loader(cfg: Any, rank: int, world: int, device: torch.device, epoch: int, num_workers: int | None,
                  skip: int = 0):
    """Rank ``rank``'s DataLoader of ``epoch`` without its first ``skip`` batches (drawn, not loaded)."""
    from repro.workload.datasets import get_dataset, make_loader

    pinned = device.type == "cuda"
    loader = make_loader(get_dataset(cfg.dataset, split="train"), cfg.batch_size, rank=rank, world_size=world,
                         seed=cfg.seed, num_workers=loader_workers(device, num_workers), pin_memory=pinned)
    loader.sampler.set_epoch(epoch)
    if skip <= 0:
        return loader
    from torch.utils.data import DataLoader

    batches = list(loader.batch_sampler)[skip:]
    return DataLoader(loader.dataset, batch_sampler=batches, num_workers=loader.num_workers,
                      pin_memory=loader.pin_memory, collate_fn=loader.collate_fn)


def _moved(it: Iterator, device: torch.device) -> Iterator[tuple[Any, Any]]:
    pinned = device.type == "cuda"
    for x, y in it:
        yield x.to(device, non_blocking=pinned), y.to(device, non_blocking=pinned)


class Batches:
    """Batches across epoch boundaries: ``epoch`` completed passes, ``position`` batches taken in the
    current one; :meth:`state` / :meth:`load_state` carry them into a checkpoint."""

    def __init__(self, cfg: Any, rank: int, world: int, device: torch.device, num_workers: int | None = None) -> None:
        self.cfg, self.rank, self.world, self.device = cfg, rank, world, device
        self.num_workers = num_workers
        self.epoch = 0
        self.position = 0
        self._gen = batch_generator(cfg.seed, rank, device) if cfg.dataset == "synthetic" else None
        self._it = epoch_batches(cfg, rank, world, device, 0, num_workers, generator=self._gen)

    def next(self) -> tuple[Any, Any]:
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch += 1
            self.position = 0
            self._it = epoch_batches(self.cfg, self.rank, self.world, self.device, self.epoch, self.num_workers,
                                     generator=self._gen)
            batch = next(self._it)
        self.position += 1
        return batch

    def state(self) -> dict[str, Any]:
        """Where the stream is: epoch, batches taken in it, the synthetic generator's state."""
        return {"epoch": self.epoch, "position": self.position,
                "generator": self._gen.get_state() if self._gen is not None else None}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state`. A real dataset's iterator is made at once: its DataLoader draws a
        seed from torch's global generator, which the caller restores afterwards."""
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        if self._gen is not None:
            self._gen.set_state(state["generator"])
            return
        loader = _epoch_loader(self.cfg, self.rank, self.world, self.device, self.epoch, self.num_workers,
                               skip=self.position)
        self._it = _moved(iter(loader), self.device)
