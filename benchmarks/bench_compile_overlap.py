"""What torch.compile does to the overlap of the gradient exchange with backward (prints a table; not a test).

    python benchmarks/bench_compile_overlap.py [--world-size 2] [--steps 20] [--width 1024] [--depth 8]
                                               [--modes eager inductor aot_eager compiled_autograd] [--json FILE]

One local world (gloo, CPU) trains an MLP of ``depth`` Linear(width, width) + Tanh layers through
``repro.distribute`` with a WFBP plan (one all-reduce per parameter tensor, launched from that tensor's
post-accumulate-grad hook), in each mode:

* ``eager``: no compilation;
* ``inductor`` / ``aot_eager``: ``torch.compile(model, backend=...)`` of the returned model (AOTAutograd
  turns the backward into one compiled graph);
* ``compiled_autograd``: inductor plus ``torch._dynamo.config.compiled_autograd = True`` (the autograd
  engine's graph, hooks included, is compiled too).

Per step it records, relative to the call of ``loss.backward()``: when the first and the last gradient
hook fired (the executor's gradient-ready marks, host ``perf_counter``), when ``backward()`` returned,
and when ``optimizer.step()`` returned (the exchange waited for, then the update). Printed: medians
over the timed steps (after two warm-up steps) on rank 0, and the derived overlap numbers:
``first_hook_frac`` (first hook / backward time: near 0 when gradients are handed over during backward,
near 1 when they all come at its end) and ``tail_ms`` (step end - backward end: the exchange left after
backward plus the update).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time

MODES = ("eager", "inductor", "aot_eager", "compiled_autograd")


def overlap_times(ctx, mode: str, steps: int, width: int, depth: int, batch: int) -> dict:
    """One mode on this rank: per-step times (seconds after ``loss.backward()`` was called), medians."""
    import torch
    from torch import nn

    import repro
    from repro.core.plan import Plan
    from repro.workload.layers import layer_parameters

    torch.manual_seed(0)
    net = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])
    names = list(layer_parameters(net, "tensor"))[::-1]
    plan = Plan.from_dict({"solver": "wfbp", "buckets": [[n] for n in names]})  # one message per tensor
    model, opt = repro.distribute(net, torch.optim.SGD(net.parameters(), lr=1e-4), scheduler=plan)
    if mode != "eager":
        model = torch.compile(model, backend="aot_eager" if mode == "aot_eager" else "inductor")
    ready = opt._door.ex.grad_ready_s  # layer -> when its gradient hook fired (perf_counter seconds)
    x = torch.randn(batch, width)
    patch = contextlib.nullcontext()
    if mode == "compiled_autograd":
        import torch._dynamo.config as dynamo_config

        patch = dynamo_config.patch(compiled_autograd=True)
    rows = []
    with patch:
        for step in range(steps + 2):
            opt.zero_grad()
            loss = model(x).square().mean()
            t0 = time.perf_counter()
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            marks = [v - t0 for v in dict(ready).values() if v >= t0]
            if step >= 2:
                rows.append({"hooks": len(marks), "first_hook_s": min(marks, default=float("nan")),
                             "last_hook_s": max(marks, default=float("nan")), "backward_s": t1 - t0,
                             "step_end_s": t2 - t0})
    opt.remove()
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} | {"tensors": len(names)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()

    from repro.launch.local import launch_local

    rows = []
    for mode in args.modes:
        try:
            r = launch_local(overlap_times, args.world_size, args=(mode, args.steps, args.width, args.depth, args.batch),
                             timeout_s=1800, quiet=True)[0]
        except Exception as e:  # noqa: BLE001 - a mode that fails is a result too
            rows.append({"mode": mode, "error": str(e).splitlines()[0][:200]})
            continue
        rows.append({"mode": mode, "tensors": r["tensors"], "hooks": round(r["hooks"]),
                     "first_hook_ms": 1e3 * r["first_hook_s"], "last_hook_ms": 1e3 * r["last_hook_s"],
                     "backward_ms": 1e3 * r["backward_s"], "first_hook_frac": r["first_hook_s"] / r["backward_s"],
                     "tail_ms": 1e3 * (r["step_end_s"] - r["backward_s"])})
    import torch

    print(f"# {platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.world_size} gloo ranks, MLP {args.depth} x Linear({args.width}) batch {args.batch}, "
          f"{args.steps} timed steps (medians, rank 0)")
    cols = ["mode", "tensors", "hooks", "first_hook_ms", "last_hook_ms", "backward_ms", "first_hook_frac", "tail_ms"]
    print(" | ".join(cols))
    for row in rows:
        if "error" in row:
            print(f"{row['mode']} | failed: {row['error']}")
            continue
        print(" | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
