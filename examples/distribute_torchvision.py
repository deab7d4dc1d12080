"""Your own training loop with a scheduler of this package: one call, `repro.distribute`.

    torchrun --standalone --nproc-per-node 2 examples/distribute_torchvision.py --scheduler mgwfbp

A torchvision model trained on random images (nothing to download), by the loop you would write for
PyTorch alone. On CPUs the ranks use gloo, on GPUs NCCL (one GPU per rank). With --check-ddp the same
steps are also run under PyTorch DDP and the largest parameter difference is printed: the all-reduce,
DeAR and ByteScheduler schedulers exchange gradients exactly, so it is zero up to float rounding; the
sparse ones (topk_*, omgs*) change the math on purpose (top-k with error feedback), so it is not.

One command per family (2 CPU ranks; on GPUs drop nothing, NCCL is picked by itself):

    torchrun --standalone --nproc-per-node 2 examples/distribute_torchvision.py --scheduler optimal --check-ddp
    torchrun --standalone --nproc-per-node 2 examples/distribute_torchvision.py --scheduler omgs --option density=0.01
    torchrun --standalone --nproc-per-node 2 examples/distribute_torchvision.py --scheduler dear_threshold \
        --option threshold_bytes=1048576 --check-ddp
    torchrun --standalone --nproc-per-node 2 examples/distribute_torchvision.py --scheduler bytescheduler --check-ddp

Several at once, one after the other from the same start (what CI runs; each option goes to the
schedulers that take it):

    torchrun --standalone --nproc-per-node 2 examples/distribute_torchvision.py --check-ddp \
        --scheduler mgwfbp,optimal,dear_threshold,bytescheduler,omgs \
        --option threshold_bytes=1048576 --option density=0.01

The parameter-server family (ps_*, osp*): examples/distribute_ps.py (servers co-located on the ranks).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torchvision
from torch import nn

import repro


def batches(rank: int, steps: int, batch: int, device: torch.device):
    g = torch.Generator().manual_seed(rank)  # every rank its own data
    for _ in range(steps):
        yield (torch.randn(batch, 3, 32, 32, generator=g).to(device),
               torch.randint(0, 10, (batch,), generator=g).to(device))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, data) -> float:
    loss_fn = nn.CrossEntropyLoss()
    for x, y in data:  # the ordinary loop
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def parse_option(item: str):
    """``NAME=VALUE`` -> (name, value as an int, a float, a bool or the string)."""
    name, _, value = item.partition("=")
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    return name, value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scheduler", default="mgwfbp", help="any name of `repro schedulers` (or a plan file); "
                   "several, comma-separated, train one after the other from the same start")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per step")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="a scheduler option, e.g. density=0.01 (sparse), threshold_bytes=1048576 (DeAR); "
                   "given to the schedulers that take it")
    p.add_argument("--check-ddp", action="store_true", help="also train under DDP and print the difference")
    args = p.parse_args()
    options = dict(parse_option(item) for item in args.option)

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    ref = None
    if args.check_ddp:  # the reference: DDP on the same start and data
        torch.manual_seed(0)
        ref = torchvision.models.mobilenet_v3_small(num_classes=10).to(device)
        ddp = nn.parallel.DistributedDataParallel(ref)
        train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9),
              batches(rank, args.steps, args.batch_size, device))
    for name in args.scheduler.split(","):
        torch.manual_seed(0)
        net = torchvision.models.mobilenet_v3_small(num_classes=10).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        takes = _options_of(name)
        mine = {k: v for k, v in options.items() if takes is None or k in takes}
        model, opt = repro.distribute(net, opt, scheduler=name, warmup_steps=2, **mine)  # the repro line
        loss = train(model, opt, batches(rank, args.steps, args.batch_size, device))
        opt.flush()  # nothing in flight: the parameters are the ones every rank agrees on
        line = f"{name}: {opt.plan.num_buckets if opt.plan else '-'} buckets, last loss {loss:.4f}"
        if ref is not None:
            diff = max(float((a - b).detach().abs().max()) for a, b in zip(net.parameters(), ref.parameters()))
            line += f", max |param - DDP's| {diff:.3g}"
        opt.remove()
        if rank == 0:
            print(line, flush=True)
    dist.destroy_process_group()


def _options_of(name: str):
    """The option names scheduler ``name`` takes (None for a plan file: all given ones go through)."""
    from repro.core.schedulers import get_scheduler

    if name.endswith(".json"):
        return None
    s = get_scheduler(name)
    return set(s.planner_options) | set(s.executor_options)


if __name__ == "__main__":
    main()
