"""Functions that ranks started by ``repro.launch.local.launch_local`` run in tests (they must be importable).

Run as a script under torchrun (``python -m torch.distributed.run --standalone --nproc-per-node 2
-m tests.launch_targets OUT_DIR [BACKEND]``), each rank writes ``OUT_DIR/rank<R>.json`` with what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def allreduce_and_report(ctx, base, *, scale=1.0, message=None):
    import torch
    import torch.distributed as dist

    if message is not None:
        print(f"{message} {ctx.rank}", flush=True)
    t = torch.tensor([float(ctx.rank + 1), float(base)]) * scale
    dist.all_reduce(t)
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "is_main": ctx.is_main,
        "value": t.tolist(),
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "extra_env": os.environ.get("REPRO_TEST_EXTRA"),
        "pid": os.getpid(),
        "role": getattr(ctx, "role", None),
        "role_rank": getattr(ctx, "role_rank", None),
    }


def raise_on_rank1(ctx):
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        time.sleep(0.5)  # let rank 0 block in its all_reduce first
        raise ValueError("boom from rank 1")
    dist.all_reduce(torch.ones(3))  # never completes: rank 1 never joins
    return "unreachable"


def exit_on_rank1(ctx, code):
    if ctx.rank == 1:
        time.sleep(0.3)
        os._exit(code)
    time.sleep(3600)  # not in a collective: only the launcher can end this rank
    return "unreachable"


def hang_on_rank1(ctx):
    if ctx.rank == 1:
        time.sleep(3600)
    return ctx.rank


def write_pid_and_hang(ctx, out_dir):
    Path(out_dir, f"rank{ctx.rank}.pid").write_text(str(os.getpid()))
    time.sleep(3600)


def _network_seen() -> dict:
    import socket

    return {
        "interfaces": sorted(name for _i, name in socket.if_nameindex()),
        "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "bandwidth_bps": os.environ.get("REPRO_EMULATED_BANDWIDTH_BPS"),
        "netns": os.environ.get("REPRO_EMULATED_NETNS"),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "netns_inode": os.stat("/proc/self/ns/net").st_ino,
    }


def time_allreduce(ctx, sizes_bytes, repeats=5, warmup=1, report_network=False):
    """Seconds of a float32 ``dist.all_reduce`` of each size (bytes), ``repeats`` times after ``warmup``.

    Every measurement starts right after a barrier; a rank reports its own wall times, and each result is
    checked (the sum of ``rank + 1`` over the ranks). Returns ``{"times": {size: [s, ...]}, "network": ...}``
    where ``network`` (with ``report_network``) is what the rank saw of its network.
    """
    import torch
    import torch.distributed as dist

    expected = ctx.world_size * (ctx.world_size + 1) / 2
    out = {}
    for size in sizes_bytes:
        n = int(size) // 4
        times = []
        for i in range(warmup + repeats):
            t = torch.full((n,), float(ctx.rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
            if not (t[0].item() == expected and t[-1].item() == expected):
                raise AssertionError(f"wrong all_reduce result {t[0].item()} != {expected}")
        out[int(size)] = times
    return {"times": out, "network": _network_seen() if report_network else None}


def raise_on_rank1_after_allreduce(ctx):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1000))
    if ctx.rank == 1:
        raise ValueError("boom from rank 1 on an emulated network")
    dist.all_reduce(torch.ones(3))
    return "unreachable"


def _role_info(ctx) -> dict:
    return {"rank": ctx.rank, "world_size": ctx.world_size, "role": ctx.role, "role_rank": ctx.role_rank,
            "role_world_size": ctx.role_world_size, "env": [os.environ.get(k) for k in
                                                            ("ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE")]}


def sum_server(ctx, *, label="sum"):
    """Server role: receive one tensor from every other rank (point to point), send each the total back."""
    import torch
    import torch.distributed as dist

    got = []
    for src in range(1, ctx.world_size):
        t = torch.zeros(2)
        dist.recv(t, src=src)
        got.append(t.tolist())
    total = torch.tensor([sum(g[0] for g in got), sum(g[1] for g in got)])
    for dst in range(1, ctx.world_size):
        dist.send(total, dst=dst)
    everyone = torch.ones(1)
    dist.all_reduce(everyone)  # the group holds every role
    return dict(_role_info(ctx), label=label, received=got, all_reduce=everyone.item())


def send_to_server(ctx, base, *, scale=1.0):
    """Worker role: send ``[base + role_rank, rank] * scale`` to rank 0 and return what comes back."""
    import torch
    import torch.distributed as dist

    dist.send(torch.tensor([base + ctx.role_rank, float(ctx.rank)]) * scale, dst=0)
    total = torch.zeros(2)
    dist.recv(total, src=0)
    everyone = torch.ones(1)
    dist.all_reduce(everyone)
    return dict(_role_info(ctx), total=total.tolist(), all_reduce=everyone.item())


def server_waits_for_workers(ctx):
    """Server role that blocks receiving from every worker in turn."""
    import torch
    import torch.distributed as dist

    for src in range(1, ctx.world_size):
        dist.recv(torch.zeros(1), src=src)
    return "unreachable"


def worker_fails_on_role_rank1(ctx):
    import torch
    import torch.distributed as dist

    if ctx.role_rank == 1:
        time.sleep(0.5)  # let the server block in its recv first
        raise ValueError(f"worker {ctx.role_rank} gave up")
    dist.send(torch.ones(1), dst=0)
    dist.barrier()  # never completes: the failing worker never joins
    return "unreachable"


def hang_if_worker(ctx):
    if ctx.role == "worker":
        time.sleep(3600)
    return ctx.role


def _listening_addresses(pid: int, port: int) -> list[str]:
    """Addresses with a TCP socket listening on ``port`` in the network namespace of process ``pid``."""
    import ipaddress

    found = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr_hex, port_hex = fields[1].split(":")
            if fields[3] != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = b"".join(bytes.fromhex(addr_hex[i:i + 8])[::-1] for i in range(0, width, 8))
            found.append(str(ipaddress.ip_address(raw)))
    return sorted(found)


def store_listeners(ctx):
    """Where the launcher's rendezvous store listens (seen in the launcher's network namespace)."""
    port = int(os.environ["MASTER_PORT"])
    return dict(_role_info(ctx), master_addr=os.environ["MASTER_ADDR"], port=port,
                listeners=_listening_addresses(os.getppid(), port))


def _torchrun_main(out_dir: str, backend: str | None = None) -> None:
    import torch
    import torch.distributed as dist

    from repro.launch.torchrun import distributed

    with distributed(backend=backend, timeout_s=60) as ctx:
        t = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(t)
        Path(out_dir, f"rank{ctx.rank}.json").write_text(json.dumps({
            "rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
            "backend": ctx.backend, "device": str(ctx.device), "sum": t.item(),
        }))


if __name__ == "__main__":
    _torchrun_main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)


def train_then_fail_in_epoch(ctx, cfg_kwargs, fail_epoch):
    """Train per ``cfg_kwargs`` but raise (on every rank) when evaluating epoch ``fail_epoch``: a run
    stopped part-way, whose earlier epochs must stay readable."""
    import repro.train as train

    real = train._evaluate

    def evaluate(cfg, model, epoch, *args, **kwargs):
        if epoch >= fail_epoch:
            raise RuntimeError(f"stopped on purpose in epoch {epoch}")
        return real(cfg, model, epoch, *args, **kwargs)

    train._evaluate = evaluate
    return train.train_worker(ctx, train.TrainConfig(**cfg_kwargs))
