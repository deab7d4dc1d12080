"""Our all-reduce executor vs PyTorch DDP on one GPU, at equal buckets (prints figures; not a test).

    python benchmarks/bench_gpu.py [--models resnet50 bert_base] [--rounds 10] [--steps 20] [--device cuda]

One process, world size 1, NCCL on ``cuda:0`` (gloo with ``--device cpu``, to try the script here). With
one rank every all-reduce is a copy on the device, so what is compared is what each side adds to a
training step on the GPU: the gradient hooks, the copies into buckets, the division, the launches and the
waits (ours: :class:`repro.families.allreduce.executor.AllReduceExecutor` through :func:`repro.distribute` with a
``threshold`` plan; DDP's: its C++ reducer given the same buckets through ``bucket_cap_mb_list``, or its
default 25 MiB buckets and ours planned at 25 MiB where that torch has no per-bucket caps). A step without
any wrapper (``plain``) is timed too, so the overheads read against the step itself.

Statistics as ``bench_runtime.py``: ``rounds`` pairs of runs in ABBA order; a run's time is the median
of its ``steps`` timed steps (after ``--warmup-steps``), each timed with a device sync at both ends;
printed: the median of the pair ratios, their range and a 95% bootstrap interval of that median.

Models (random data, nothing downloaded): torchvision ResNet-50 (161 parameter tensors) on 224x224
images, and BERT-base from ``transformers``' config (about 200 tensors; masked LM on random tokens).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import bootstrap_median_ci, verdict  # noqa: E402  (the same statistics)

import repro  # noqa: E402
from repro.api import _sizes_trace  # noqa: E402
from repro.core.planners import make_plan  # noqa: E402
from repro.costs.presets import preset  # noqa: E402


def resnet50(device: torch.device, batch: int):
    import torchvision

    model = torchvision.models.resnet50(num_classes=1000).to(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, generator=g).to(device)
    y = torch.randint(0, 1000, (batch,), generator=g).to(device)
    return model, lambda m: nn.functional.cross_entropy(m(x), y)


def bert_base(device: torch.device, batch: int, seq: int = 128):
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig()).to(device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30522, (batch, seq), generator=g).to(device)
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def tiny(device: torch.device, batch: int):
    """A small MLP, to try the script on a CPU."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)], nn.Linear(256, 10)).to(device)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, 256, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device)
    return model, lambda m: nn.functional.cross_entropy(m(x), y)


MODELS = {"resnet50": (resnet50, 64), "bert_base": (bert_base, 32), "tiny": (tiny, 64)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(kind: str, name: str, device: torch.device, args, caps: dict) -> float:
    """One run of ``kind`` (plain, ddp, ours): the median step time in ms over ``args.steps`` timed steps."""
    build, batch = MODELS[name]
    torch.manual_seed(0)
    net, loss_of = build(device, args.batch_size or batch)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    dopt = None
    model = net
    if kind == "ddp":
        kw = {"bucket_cap_mb_list": caps["mb"]} if caps["mb"] is not None else {"bucket_cap_mb": 25}
        model = nn.parallel.DistributedDataParallel(net, **kw)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    elif kind == "ours":
        model, opt = repro.distribute(net, opt, scheduler=caps["plan"])
        dopt = opt
    times = []
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            for i in range(args.warmup_steps + args.steps):
                sync(device)
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss_of(model).backward()
                opt.step()
                sync(device)
                if i >= args.warmup_steps:
                    times.append(time.perf_counter() - t0)
        if dopt is not None:
            opt.flush()
    finally:
        if dopt is not None:
            opt.remove()
    del model, net, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 1e3 * statistics.median(times)


def equal_buckets(name: str, device: torch.device, args) -> dict:
    """The threshold plan both sides run, and DDP's caps for it (None where DDP takes no cap list)."""
    build, batch = MODELS[name]
    net, _ = build(device, 1)
    threshold = args.threshold_bytes
    try:
        import inspect

        has_list = "bucket_cap_mb_list" in inspect.signature(nn.parallel.DistributedDataParallel).parameters
    except (TypeError, ValueError):
        has_list = False
    if not has_list:
        threshold = 25 * 2**20  # DDP's default cap; DDP's own first-bucket rule then differs a little
    plan = make_plan("threshold", _sizes_trace(net, "tensor"), preset("10gbe-v100", 2), threshold_bytes=threshold)
    mb = repro.ddp_bucket_caps(plan, net) if has_list else None
    return {"plan": plan, "mb": mb, "threshold": threshold, "buckets": plan.num_buckets, "tensors": len(list(net.parameters()))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "bert_base"], choices=sorted(MODELS))
    ap.add_argument("--rounds", type=int, default=10, help="pairs per comparison (ABBA order)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per run (a run's time: their median)")
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=0, help="samples per step (0: the model's default)")
    ap.add_argument("--threshold-bytes", type=int, default=25 * 2**20, help="bucket size of both sides, bytes")
    ap.add_argument("--bf16", action="store_true", help="autocast the forward to bfloat16")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("bench_gpu: --device cuda, but CUDA is not available (--device cpu tries the script)", file=sys.stderr)
            return 2
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    store = tempfile.NamedTemporaryFile(delete=False)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=dist.FileStore(store.name, 1), rank=0, world_size=1, **kwargs)
    name_dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"bench_gpu: {name_dev}, torch {torch.__version__}, {backend}, world size 1, "
          f"{'bf16 autocast' if args.bf16 else 'fp32'}, {args.rounds} pairs x {args.steps} steps", flush=True)
    try:
        for name in args.models:
            caps = equal_buckets(name, device, args)
            how = "bucket_cap_mb_list" if caps["mb"] is not None else "DDP default bucket_cap_mb=25"
            print(f"{name}: {caps['tensors']} tensors, {caps['buckets']} buckets of <= {caps['threshold']} bytes ({how})",
                  flush=True)
            plain = [run("plain", name, device, args, caps) for _ in range(max(2, args.rounds // 3))]
            ours, ddp = [], []
            for r in range(args.rounds):
                order = ("ours", "ddp") if r % 2 == 0 else ("ddp", "ours")
                got = {k: run(k, name, device, args, caps) for k in order}
                ours.append(got["ours"])
                ddp.append(got["ddp"])
            ratios = [a / b for a, b in zip(ours, ddp)]
            lo, hi = bootstrap_median_ci(ratios)
            print(f"  plain {statistics.median(plain):8.2f} ms  DDP {statistics.median(ddp):8.2f} ms  "
                  f"ours {statistics.median(ours):8.2f} ms  ours/DDP paired median {statistics.median(ratios):5.3f}  "
                  f"range {min(ratios):5.3f}-{max(ratios):5.3f}  95% CI {lo:5.3f}-{hi:5.3f}  ({len(ratios)} pairs)  "
                  f"{verdict(lo, hi, len(ratios))}", flush=True)
    finally:
        dist.destroy_process_group()
        os.unlink(store.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
