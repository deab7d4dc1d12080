"""The roofline estimator's per-layer error against the measured H200 traces, before and after.

For every measured trace ``data/traces/<model>_b<batch>_h200-<fp32|bf16>.json`` (measured on one H200,
module view, fp32 with PyTorch's default TF32 settings and bf16 under autocast; data/traces/README.md)
this estimates the same model, batch and view twice:

* ``before``: the estimator as it was when those traces were taken (docs/gpu_report.md, part 3):
  the H100 SXM entry (the table had no H200), float32 matmuls *and* convolutions on CUDA cores, and
  the 16-bit runs as pure float16 with every convolution/matmul at 0.8 of the tensor peak
  (``gpu="H100", tf32_conv=False, amp=False, tensor_core_efficiency={"conv": 0.8, "matmul": 0.8}``);
* ``after``: the estimator now: the H200 entry, TF32 convolutions in float32 (PyTorch's default),
  bf16 under autocast with float32 master weights and the per-kind tensor-core efficiencies
  (:data:`repro.workload.estimate.TENSOR_CORE_EFFICIENCY`).

Writes ``<out>/estimator_error_layers.csv`` (model, precision, variant, layer, measured_s,
estimated_s, ratio = estimated / measured, per layer forward + backward) and ``<out>/estimator_error.md``
(per model, precision and variant: median per-layer ratio, its interquartile range, the share of
layers within 2x, and the total-iteration ratio).

Usage: ``python scripts/estimator_error.py [--out docs] [--only SUBSTRING]``
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from repro.core.paths import shipped_traces
from repro.core.trace import load_trace
from repro.workload.estimate import KERNEL_OVERHEAD_S, estimate_trace, layer_errors

VARIANTS = {
    "before": lambda precision: dict(gpu="H100", tf32_conv=False, amp=False,
                                     tensor_core_efficiency={"conv": 0.8, "matmul": 0.8},
                                     dtype="float32" if precision == "fp32" else "float16"),
    "after": lambda precision: dict(gpu="H200", dtype="float32" if precision == "fp32" else "bfloat16"),
}


def measured_traces(only: str = "") -> list[tuple[str, str]]:
    """(stem, precision) of every shipped H200 measurement whose stem contains ``only``."""
    out = []
    for stem in sorted(shipped_traces()):
        for precision in ("fp32", "bf16"):
            if stem.endswith(f"_h200-{precision}") and only in stem:
                out.append((stem, precision))
    return out


def summarise(rows: list[dict]) -> dict:
    ratios = sorted(r["ratio"] for r in rows if r["ratio"] is not None)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    meas = sum(r["measured_s"] for r in rows)
    est = sum(r["estimated_s"] for r in rows)
    return {"layers": len(rows), "median_ratio": statistics.median(ratios), "q1": q[0], "q3": q[2],
            "within_2x": sum(0.5 <= x <= 2 for x in ratios) / len(ratios),
            "measured_ms": 1e3 * meas, "estimated_ms": 1e3 * est, "total_ratio": est / meas}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs"), help="output folder (default: docs)")
    ap.add_argument("--only", default="", help="only measured traces whose stem contains this")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    layer_rows, summary = [], []
    for stem, precision in measured_traces(args.only):
        measured = load_trace(stem)
        view = measured.extra.get("view", "module")
        for variant, kwargs in VARIANTS.items():
            est = estimate_trace(measured.model, measured.batch_size, view=view, **kwargs(precision))
            rows = [{"model": measured.model, "batch_size": measured.batch_size, "precision": precision,
                     "variant": variant, "layer": r["layer"], "measured_s": r["measured_s"],
                     "estimated_s": r["estimated_s"],
                     "ratio": r["estimated_s"] / r["measured_s"] if r["measured_s"] > 0 else None}
                    for r in layer_errors(measured, est)]
            layer_rows += rows
            summary.append({"model": measured.model, "batch_size": measured.batch_size, "precision": precision,
                            "variant": variant, **summarise(rows)})
            # Diagnostic: the per-kernel overhead that would close the gap of the totals alone, i.e.
            # (measured - estimate without its per-kernel overhead) / kernels. Not used by the estimator.
            k = est.extra["kernels"]
            summary[-1]["implied_overhead_us"] = 1e6 * (sum(r["measured_s"] for r in rows)
                                                        - sum(r["estimated_s"] for r in rows) + k * KERNEL_OVERHEAD_S) / k
            summary[-1]["kernels"] = k
            print(f"{stem} {variant}: total ratio {summary[-1]['total_ratio']:.2f}", file=sys.stderr)

    with open(args.out / "estimator_error_layers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(layer_rows[0]))
        w.writeheader()
        for r in layer_rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})

    lines = ["| model | batch | precision | variant | layers | median ratio | IQR of ratio | layers within 2x "
             "| measured ms | estimated ms | total ratio | kernels | implied overhead us/kernel |",
             "|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        lines.append(f"| {s['model']} | {s['batch_size']} | {s['precision']} | {s['variant']} | {s['layers']} | "
                     f"{s['median_ratio']:.2f} | {s['q1']:.2f}-{s['q3']:.2f} | {100 * s['within_2x']:.0f}% | "
                     f"{s['measured_ms']:.1f} | {s['estimated_ms']:.1f} | {s['total_ratio']:.2f} | {s['kernels']} | "
                     f"{s['implied_overhead_us']:.1f} |")
    (args.out / "estimator_error_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
