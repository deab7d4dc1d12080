"""Regenerate the traces shipped in data/traces.

* V100 estimates (module view) of every paper model at every per-GPU batch size a paper used:
  ``{model}_b{batch}_v100-estimate.json`` (MG-WFBP's sizes, plus DeAR's where they differ).
* V100 FP16 estimates (autocast with float32 master weights, tensor cores; ``estimate_trace(...,
  dtype="float16")``) of the MG-WFBP journal's FP16 models at its batch sizes (ResNet-152 b128,
  DenseNet-161 b64, DenseNet-201 b64, Inception-v4 b128; data/grids/mgwfbp.yaml ``speedup_fp16``):
  ``{model}_b{batch}_v100-estimate-fp16.json``.
* K80 estimates of GoogLeNet (batch 64) and ResNet-50 (batch 32), for comparison with the MG-WFBP
  conference paper's K80 measurements: ``{model}_b{batch}_k80-estimate.json``.
* P102-100 estimates of OMGS-SGD's four models at its batch sizes (VGG-16 on CIFAR-10 b32, ResNet-50
  b32, Inception-v4 b64, LSTM-PTB b20): ``{model}_b{batch}_p102-estimate.json``.
* CPU measurements of the tiny models at batch 32, one thread, 5 warm-up + 50 timed iterations
  (the MG-WFBP journal's profiling protocol): ``{model}_b32_cpu.json`` (module view) and
  ``{model}_b32_cpu-tensor.json`` (tensor view). These differ from machine to machine.

Usage: ``python scripts/make_traces.py [--out DIR] [--only SUBSTRING] [--no-measure]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from repro.core.paths import traces_dir
from repro.workload.estimate import estimate_trace
from repro.workload.models import PAPER_MODELS, TINY_MODELS, get_spec
from repro.workload.profile import profile_model
from repro.core.trace import Trace

K80_RUNS = [("googlenet", 64), ("resnet50", 32)]
#: the MG-WFBP journal's FP16 runs (data/grids/mgwfbp.yaml, experiment speedup_fp16)
V100_FP16_RUNS = [("resnet152", 128), ("densenet161", 64), ("densenet201", 64), ("inception_v4", 128)]
P102_RUNS = [("vgg16_cifar", 32), ("resnet50", 32), ("inception_v4", 64), ("lstm_ptb", 20)]
TINY_BATCH = 32
WARMUP, ITERS = 5, 50


def jobs() -> list[tuple[str, Callable[[], Trace]]]:
    """(file stem, function producing the trace) for every shipped trace."""
    out = []
    for name in PAPER_MODELS:
        spec = get_spec(name)
        sizes = sorted({spec.paper_batch_size, *spec.paper_batch_sizes.values()} - {None})
        for b in sizes:
            out.append((f"{name}_b{b}_v100-estimate",
                        lambda name=name, b=b: estimate_trace(name, b, gpu="V100", view="module")))
    for name, b in V100_FP16_RUNS:
        out.append((f"{name}_b{b}_v100-estimate-fp16",
                    lambda name=name, b=b: estimate_trace(name, b, gpu="V100", view="module", dtype="float16")))
    for name, b in K80_RUNS:
        out.append((f"{name}_b{b}_k80-estimate",
                    lambda name=name, b=b: estimate_trace(name, b, gpu="K80", view="module")))
    for name, b in P102_RUNS:
        out.append((f"{name}_b{b}_p102-estimate",
                    lambda name=name, b=b: estimate_trace(name, b, gpu="P102", view="module")))
    for name in TINY_MODELS:
        for view, suffix in (("module", "cpu"), ("tensor", "cpu-tensor")):
            out.append((f"{name}_b{TINY_BATCH}_{suffix}",
                        lambda name=name, view=view: profile_model(name, TINY_BATCH, device="cpu", view=view,
                                                                   warmup=WARMUP, iters=ITERS)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=traces_dir(), help="output folder (default: the package's shipped traces)")
    ap.add_argument("--only", default="", help="only traces whose file stem contains this")
    ap.add_argument("--no-measure", action="store_true", help="skip the CPU measurements")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for stem, make in jobs():
        if args.only not in stem or (args.no_measure and "cpu" in stem):
            continue
        t0 = time.perf_counter()
        trace: Trace = make()
        trace.save(args.out / f"{stem}.json")
        rows.append((stem, trace, time.perf_counter() - t0))
        print(f"wrote {stem}.json ({rows[-1][2]:.1f} s)", file=sys.stderr)

    print("| trace | model | batch | device | layers | forward_s | backward_s | params |")
    print("|---|---|---|---|---|---|---|---|")
    for stem, t, _ in rows:
        print(f"| {stem} | {t.model} | {t.batch_size} | {t.device} | {t.num_layers} | "
              f"{t.total_forward_s:.4f} | {t.total_backward_s:.4f} | {t.total_params:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
