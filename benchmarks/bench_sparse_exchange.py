"""The sparse exchange of one tensor vs its dense all-reduce, on 2 gloo ranks (prints a table; not a test).

    python benchmarks/bench_sparse_exchange.py [--sizes 1e5 1e6 1e7 2.5e7] [--densities 0.001 0.004 0.01]
        [--repeats 5] [--world-size 2] [--emulate-bandwidth 1gbit] [--no-emulation]

For every tensor size (float32 elements) and density, each rank holds its own random tensor and times
(median of ``repeats`` after one warm-up, the slowest rank's median):

- ``dense``: one ``all_reduce`` of the whole tensor;
- ``sparse``: what :class:`repro.families.sparse.executor.SparseExecutor` does per bucket: top-k selection
  (:class:`~repro.families.sparse.executor.TopKCompressor`, k = ceil(density x n)), two all-gathers (values,
  int32 indices; :class:`~repro.families.sparse.executor.AllGatherCommunicator`), scatter-add of the P
  contributions into a dense tensor and the division by P; split into its three parts;
- ``packed``: the same with values and indices in one all-gather.

First on loopback, then (unless ``--no-emulation``, or when emulation is unavailable) with every rank
behind an emulated link of ``--emulate-bandwidth`` (:mod:`repro.launch.netns`; needs root). The
ratio column is sparse / dense time: below 1 the sparse exchange is cheaper. Error feedback (adding the
residual, a copy) is not included. One thread per rank.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd


def exchange_times(ctx, sizes: list[int], densities: list[float], repeats: int) -> list[dict]:
    """Launch target (every rank): median seconds of each variant per (size, density)."""
    import torch
    import torch.distributed as dist

    from repro.families.sparse.executor import AllGatherCommunicator, TopKCompressor

    P, rank = dist.get_world_size(), dist.get_rank()
    comm = AllGatherCommunicator()
    rows = []

    def timed(fn, parts: int) -> list[float]:
        samples = []
        for i in range(repeats + 1):
            dist.barrier()
            stamps = fn()
            if i:
                samples.append([b - a for a, b in zip(stamps[:-1], stamps[1:])])
        med = torch.tensor([statistics.median(s[j] for s in samples) for j in range(parts)], dtype=torch.float64)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        return med.tolist()

    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        buf = torch.empty_like(x)

        def dense():
            buf.copy_(x)
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            return [t0, time.perf_counter()]

        (dense_s,) = timed(dense, 1)
        for d in densities:
            comp = TopKCompressor(d)
            for packed in (False, True):
                def sparse():
                    t0 = time.perf_counter()
                    values, indices = comp.compress(x)
                    t1 = time.perf_counter()
                    gv, gi = comm.finish(comm.start(values, indices, packed))
                    t2 = time.perf_counter()
                    out = torch.zeros_like(x)
                    comp.decompress(gv, gi, out).div_(P)
                    return [t0, t1, t2, time.perf_counter()]

                compress_s, comm_s, decompress_s = timed(sparse, 3)
                rows.append({"numel": n, "density": d, "k": comp.count(n), "packed": packed, "dense_s": dense_s,
                             "compress_s": compress_s, "comm_s": comm_s, "decompress_s": decompress_s})
    return rows


def _table(rows: list[dict], link: str) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["sparse_s"] = df.compress_s + df.comm_s + df.decompress_s
    out = []
    for (n, d), g in df.groupby(["numel", "density"], sort=True):
        two, one = g[~g.packed].iloc[0], g[g.packed].iloc[0]
        out.append({"link": link, "numel": int(n), "density": d, "k": int(two.k),
                    "dense_allreduce_ms": 1e3 * two.dense_s,
                    "sparse_ms": 1e3 * two.sparse_s, "topk_ms": 1e3 * two.compress_s,
                    "allgather_x2_ms": 1e3 * two.comm_s, "scatter_add_ms": 1e3 * two.decompress_s,
                    "packed_ms": 1e3 * one.sparse_s, "allgather_x1_ms": 1e3 * one.comm_s,
                    "sparse/dense": two.sparse_s / two.dense_s, "packed/dense": one.sparse_s / one.dense_s})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6, 1e7, 2.5e7], help="float32 elements")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.004, 0.01])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--emulate-bandwidth", default="1gbit", help="rate of the emulated links (tc style)")
    ap.add_argument("--no-emulation", action="store_true", help="loopback only")
    args = ap.parse_args()
    from repro.launch.local import launch_local

    sizes = [int(s) for s in args.sizes]
    job = (sizes, args.densities, args.repeats)
    tables = [_table(launch_local(exchange_times, args.world_size, args=job, timeout_s=3600, quiet=True)[0],
                     "loopback")]
    if not args.no_emulation:
        from repro.launch.netns import EmulationUnavailableError, check_emulation_available

        try:
            check_emulation_available()
            tables.append(_table(launch_local(exchange_times, args.world_size, args=job, timeout_s=3600, quiet=True,
                                              emulate_bandwidth=args.emulate_bandwidth)[0],
                                 f"emulated {args.emulate_bandwidth}"))
        except EmulationUnavailableError as e:
            print(f"(no emulated run: {e})")
    df = pd.concat(tables, ignore_index=True)
    print(f"Sparse exchange vs dense all-reduce of one float32 tensor, {args.world_size} gloo ranks, 1 thread "
          f"each; median of {args.repeats}, slowest rank; times in milliseconds; sparse = top-k + 2 "
          "all-gathers (values, int32 indices) + scatter-add/P; packed = the same with 1 all-gather")
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 200):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
