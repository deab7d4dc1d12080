"""Reduce-scatter / all-gather primitives vs a native all-reduce, on gloo ranks (prints a table; not a test).

    python benchmarks/bench_primitives.py [--sizes-bytes 65536 262144 1048576 4194304 16777216 67108864]
        [--world-sizes 2 3] [--repeats 5] [--emulate-bandwidth 1gbit] [--no-emulation]

For every buffer size (bytes of float32) and world size, each rank holds its own random buffer and
times (median of ``repeats`` after one warm-up, each repeat started by a barrier; the slowest rank's
median), in milliseconds:

- ``AR``, ``nat_RS``, ``nat_AG``: torch's ``all_reduce``, ``reduce_scatter_tensor`` and
  ``all_gather_into_tensor`` (called directly, on the default group; torch 2.14's names for the last
  two are ``reduce_scatter_single`` / ``all_gather_single``, used when present);
- ``RS``, ``AG``, ``RS+AG``: :class:`repro.runtime.collectives.CommStream`'s ring reduce-scatter,
  ring all-gather, and the two back to back (submitted together, waited once), on its thread;
- ``stream_AR``: the stream's own ``all_reduce`` (auto: native all_reduce on the stream's group);

and the ratios RS/AR, AG/AR, (RS+AG)/AR. The issue's target: RS+AG <= 1.15 x AR at >= 1 MB on the
emulated link. First on loopback, then (unless ``--no-emulation``, or when emulation is unavailable)
with every rank behind an emulated link of ``--emulate-bandwidth`` (:mod:`repro.launch.netns`; needs
root). One thread per rank.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd


def primitive_times(ctx, sizes_bytes: list[int], repeats: int) -> list[dict]:
    """Launch target (every rank): median seconds of each primitive per size (slowest rank's)."""
    import torch
    import torch.distributed as dist

    from repro.runtime.calibrate import slowest_median_s
    from repro.runtime.collectives import CommStream, _all_gather_into_tensor, _reduce_scatter_tensor

    P, rank = dist.get_world_size(), dist.get_rank()
    stream = CommStream()
    rows = []

    def timed(fn) -> float:
        return slowest_median_s(fn, repeats)

    for nbytes in sizes_bytes:
        n = max(P, nbytes // 4 // P * P)
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        buf = x.clone()
        shard = torch.empty(n // P)
        row = {"world_size": P, "bytes": n * 4}
        row["AR"] = timed(lambda: dist.all_reduce(buf))
        row["nat_RS"] = timed(lambda: _reduce_scatter_tensor(shard, buf))
        row["nat_AG"] = timed(lambda: _all_gather_into_tensor(buf, shard))
        row["RS"] = timed(lambda: stream.reduce_scatter(buf).wait())
        row["AG"] = timed(lambda: stream.all_gather(buf).wait())

        def rs_ag():
            stream.reduce_scatter(buf)
            stream.all_gather(buf).wait()

        row["RS+AG"] = timed(rs_ag)
        row["stream_AR"] = timed(lambda: stream.all_reduce(buf).wait())
        rows.append(row)
    stream.close()
    return rows


def _table(rows: list[dict], link: str) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    times = ["AR", "nat_RS", "nat_AG", "RS", "AG", "RS+AG", "stream_AR"]
    out = df[["world_size", "bytes"]].copy()
    out.insert(0, "link", link)
    for c in times:
        out[f"{c}_ms"] = 1e3 * df[c]
    out["RS/AR"] = df["RS"] / df["AR"]
    out["AG/AR"] = df["AG"] / df["AR"]
    out["(RS+AG)/AR"] = df["RS+AG"] / df["AR"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-bytes", type=float, nargs="+",
                    default=[2**16, 2**18, 2**20, 2**22, 2**24, 2**26], help="buffer sizes in bytes (float32)")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--emulate-bandwidth", default="1gbit", help="rate of the emulated links (tc style)")
    ap.add_argument("--no-emulation", action="store_true", help="loopback only")
    args = ap.parse_args()
    from repro.launch.local import launch_local

    sizes = [int(s) for s in args.sizes_bytes]
    links: list[tuple[str, dict]] = [("loopback", {})]
    if not args.no_emulation:
        from repro.launch.netns import EmulationUnavailableError, check_emulation_available

        try:
            check_emulation_available()
            links.append((f"emulated {args.emulate_bandwidth}", {"emulate_bandwidth": args.emulate_bandwidth}))
        except EmulationUnavailableError as e:
            print(f"(no emulated run: {e})")
    tables = []
    for link, extra in links:
        for P in args.world_sizes:
            t0 = time.perf_counter()
            rows = launch_local(primitive_times, P, args=(sizes, args.repeats), timeout_s=3600, quiet=True, **extra)[0]
            tables.append(_table(rows, link))
            print(f"({link}, {P} ranks: {time.perf_counter() - t0:.0f} s)", flush=True)
    df = pd.concat(tables, ignore_index=True)
    print(f"Ring RS/AG (repro.runtime.collectives.CommStream) vs native gloo collectives, float32, 1 thread per "
          f"rank; median of {args.repeats} after a warm-up, slowest rank; times in milliseconds; "
          "target: (RS+AG)/AR <= 1.15 at >= 1 MB on the emulated link")
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 200):
        print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    main()
