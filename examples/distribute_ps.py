"""The parameter-server family (BSP, ASP, SSP, OSP) in your own training loop: one call, `repro.distribute`.

    torchrun --standalone --nproc-per-node 2 examples/distribute_ps.py --scheduler osp

The servers are co-located on the training ranks, as BytePS places them: rank s serves shard s of
the parameters (one shard per rank unless --option servers=N) and holds that shard's optimizer state;
every rank pushes its gradients to the owners and pulls the owners' new values, with collectives
only (gloo on CPUs, NCCL on GPUs). A torchvision model on random images (nothing to download).

    torchrun --standalone --nproc-per-node 2 examples/distribute_ps.py --scheduler ps_bsp --check-ddp
    torchrun --standalone --nproc-per-node 2 examples/distribute_ps.py --scheduler osp --option stage1_share=0.5
    torchrun --standalone --nproc-per-node 2 examples/distribute_ps.py --scheduler ps_ssp --option staleness=1
    torchrun --standalone --nproc-per-node 2 examples/distribute_ps.py --scheduler ps_asp

With --check-ddp the same steps also run under PyTorch DDP and the largest parameter difference is
printed: BSP is DDP's math (zero up to float rounding); ASP, SSP and OSP change the math on purpose
(per-rank updates, stale parameters), so for them it is not zero.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torchvision
from torch import nn

import repro
from distribute_torchvision import batches, parse_option, train  # the same data and loop (this folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scheduler", default="osp", help="ps_bsp, ps_asp, ps_ssp, osp or osp_auto (or a plan file)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per step")
    p.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="a scheduler option: servers=N, stage1_share=0.5, staleness=1, lgp=false, importance=magnitude")
    p.add_argument("--check-ddp", action="store_true", help="also train under DDP and print the difference")
    args = p.parse_args()
    options = dict(parse_option(item) for item in args.option)

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    net = torchvision.models.mobilenet_v3_small(num_classes=10).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    model, opt = repro.distribute(net, opt, scheduler=args.scheduler, warmup_steps=2, **options)  # the repro line
    loss = train(model, opt, batches(rank, args.steps, args.batch_size, device))
    opt.flush()  # every rank now holds the servers' parameters (collective: call it on every rank)
    plan = opt.plan
    line = (f"{args.scheduler}: mode {plan.option('mode')}, {plan.option('servers')} servers, "
            f"{plan.num_buckets} buckets, last loss {loss:.4f}")

    if args.check_ddp:
        torch.manual_seed(0)
        ref = torchvision.models.mobilenet_v3_small(num_classes=10).to(device)
        ddp = nn.parallel.DistributedDataParallel(ref)
        train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9),
              batches(rank, args.steps, args.batch_size, device))
        diff = max(float((a - b).detach().abs().max()) for a, b in zip(net.parameters(), ref.parameters()))
        line += f", max |param - DDP's| {diff:.3g}"
    if rank == 0:
        print(line, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
