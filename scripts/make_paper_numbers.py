"""Write ``data/paper_numbers/ddl_benchmarks_measured.csv``: the public measured throughput of
HKBU-HPML/ddl-benchmarks (``results/2020-05-29/README.md``; Shi et al., arXiv 2005.13247) as a tidy
table in this package's names, for calibrating and validating the simulator (issue 12).

    python scripts/make_paper_numbers.py [--source tests/fixtures/ddl_benchmarks_2020-05-29.csv]

``--source`` is that README's table transcribed as CSV (columns: model, batch per GPU, network, method,
GPUs, samples/s, std); the repository keeps it as a test fixture.

The source rows (model, batch per GPU, network, method, GPUs, samples/s over all GPUs, std) become one
row each, with: our model and network names; ``method`` as published and ``scheduler``, the scheduler
of this package that runs the same schedule (empty where none does: WFBP and ByteScheduler on a
parameter server); the cluster shape (4 GPUs per node, so 1-4 GPUs sit in one node); the seconds per
iteration the throughput implies (``batch x GPUs / samples_per_s``; on 1 GPU: the computation alone);
and the source. Numbers are copied, never changed.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from repro.core.paths import shipped_path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "fixtures" / "ddl_benchmarks_2020-05-29.csv"
OUT = shipped_path("paper_numbers", "ddl_benchmarks_measured.csv")
CITATION = ("HKBU-HPML/ddl-benchmarks results/2020-05-29 (Shi et al., arXiv 2005.13247): 8 nodes x 4 GPUs, "
            "synthetic data, measured")
GPUS_PER_NODE = 4

MODELS = {"ResNet-50": "resnet50", "BERT-Base": "bert_base", "BERT-Large": "bert_large"}
NETWORKS = {"10GbE with TCP/IP": "10gbe", "100GbIB with RDMA": "100gbib"}
# published method -> (family of the exchange, this package's scheduler running that schedule or "")
METHODS = {"BSP-A2A": ("allreduce", "syncea"), "WFBP-A2A": ("allreduce", "wfbp"), "MG-WFBP": ("allreduce", "mgwfbp"),
           "ByteScheduler-A2A": ("allreduce", "bytescheduler"), "BSP-PS": ("ps", "ps_bsp"),
           "WFBP-PS": ("ps", ""), "ByteScheduler-PS": ("ps", "")}


def tidy(source: Path) -> pd.DataFrame:
    raw = pd.read_csv(source, comment="#")
    unknown = (set(raw.model) - set(MODELS)) | (set(raw.network) - set(NETWORKS)) | (set(raw.method) - set(METHODS))
    if unknown:
        raise SystemExit(f"{source}: unknown names {sorted(unknown)}; extend the maps in {Path(__file__).name}")
    out = pd.DataFrame({
        "model": raw.model.map(MODELS), "paper_model": raw.model, "batch_size": raw.batch_size_per_gpu,
        "network": raw.network.map(NETWORKS), "paper_network": raw.network,
        "method": raw.method, "family": raw.method.map(lambda m: METHODS[m][0]),
        "scheduler": raw.method.map(lambda m: METHODS[m][1]),
        "gpus": raw.gpus, "nodes": raw.gpus.map(lambda g: math.ceil(g / GPUS_PER_NODE)),
        "gpus_per_node": raw.gpus.map(lambda g: min(g, GPUS_PER_NODE)),
        "samples_per_s": raw.samples_per_s, "samples_per_s_std": raw["std"],
    })
    out["iteration_s"] = out.batch_size * out.gpus / out.samples_per_s
    out["source"] = CITATION
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=SOURCE,
                   help="the ddl-benchmarks 2020-05-29 results transcribed as CSV")
    args = p.parse_args()
    df = tidy(args.source)
    df.to_csv(OUT, index=False)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(df)} rows")


if __name__ == "__main__":
    main()
