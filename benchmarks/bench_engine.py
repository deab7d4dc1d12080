"""Discrete-event engine speed on this machine (prints figures; not a test).

    python benchmarks/bench_engine.py [--tasks 100000] [--ref-tasks 5000] [--repeats 3]

Builds training task graphs of many iterations: forward then backward compute tasks (100 layers)
on the in-order ``compute`` stream, and one all-reduce message per 4 layers on a queue stream,
depending on that layer's backward task. Variants:

- ``fifo``: one ``comm`` stream, equal priorities (FCFS); communication takes ~1.3x the compute
  time and compute runs ahead, so the comm queue backs up (as in one iteration of a long
  communication-bound model): the case that made the original linear-scan engine quadratic;
- ``prio``: the same with two queue streams (``comm``, ``comm2``), each ~1.3x the compute time,
  and layer-index priorities (later-released front layers overtake the backlog);
- ``sync``: ``fifo`` with a barrier: each iteration's forward waits for the previous iteration's
  messages, so the queue never holds more than one iteration's messages.

Prints tasks, seconds and tasks/s of :func:`repro.core.engine.run_tasks` on ~``--tasks`` tasks and
on ~``--ref-tasks`` tasks, beside the original engine (``_reference_run_tasks``, the literal copy
kept in ``tests/test_engine.py``) on ~``--ref-tasks`` tasks, after checking both give identical
ops there. Target: 100,000 tasks in < 1 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from repro.core.engine import Task, run_tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_planners import timed  # noqa: E402  (median wall time of a few calls)
from tests.test_engine import _reference_run_tasks  # noqa: E402  (the original engine, compare only)

LAYERS = 100
LAYERS_PER_MESSAGE = 4
VARIANTS = ("fifo", "prio", "sync")


def training_graph(n_tasks: int, variant: str) -> list[Task]:
    """About ``n_tasks`` tasks: whole iterations of forward, backward and all-reduce tasks."""
    per_iter = 2 * LAYERS + -(-LAYERS // LAYERS_PER_MESSAGE)
    fwd = [1e-4 * (1 + layer % 7) for layer in range(LAYERS)]
    bwd = [2 * f for f in fwd]
    # messages carry ~1.3x one iteration's compute time in all
    msg_s = 1.3 * (sum(fwd) + sum(bwd)) / -(-LAYERS // LAYERS_PER_MESSAGE)
    tasks: list[Task] = []
    prev_msgs: list[int] = []
    for it in range(max(1, round(n_tasks / per_iter))):
        for layer in range(LAYERS):
            deps = tuple(prev_msgs) if layer == 0 and variant == "sync" else ()
            tasks.append(Task("compute", "forward", f"f{it}.{layer}", fwd[layer], deps))
        msgs = []
        for layer in reversed(range(LAYERS)):
            tasks.append(Task("compute", "backward", f"b{it}.{layer}", bwd[layer]))
            if layer % LAYERS_PER_MESSAGE == 0:
                stream, prio, dur = "comm", 0.0, msg_s * (0.5 + layer % 3 / 2)
                if variant == "prio":  # front layers first: the next forward needs them first
                    stream = "comm" if (layer // LAYERS_PER_MESSAGE) % 2 else "comm2"
                    prio = float(layer)
                    dur *= 2  # each of the two streams carries ~1.3x the compute time
                tasks.append(Task(stream, "allreduce", f"m{it}.{layer}", dur, (len(tasks) - 1,), prio))
                msgs.append(len(tasks) - 1)
        prev_msgs = msgs
    return tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--ref-tasks", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    print(f"Discrete-event engine, median of {args.repeats} (reference: the original linear-scan "
          "engine, one run):")
    print(f"{'variant':<8} {'tasks':>7} {'new s':>7} {'new tasks/s':>12} | {'tasks':>6} {'new s':>7} "
          f"{'ref s':>7} {'new tasks/s':>12} {'ref tasks/s':>12} {'ratio':>6}")
    for variant in VARIANTS:
        big = training_graph(args.tasks, variant)
        small = training_graph(args.ref_tasks, variant)
        t_big = timed(lambda: run_tasks(big, {"compute"}), args.repeats)
        t_new = timed(lambda: run_tasks(small, {"compute"}), args.repeats)
        t0 = time.perf_counter()
        ref_ops = _reference_run_tasks(small, {"compute"})
        t_ref = time.perf_counter() - t0
        assert run_tasks(small, {"compute"}) == ref_ops, "new engine differs from the reference"
        print(f"{variant:<8} {len(big):>7} {t_big:>7.3f} {len(big) / t_big:>12.0f} | {len(small):>6} "
              f"{t_new:>7.3f} {t_ref:>7.3f} {len(small) / t_new:>12.0f} {len(small) / t_ref:>12.0f} "
              f"{t_ref / t_new:>5.0f}x")


if __name__ == "__main__":
    main()
