"""OMGS-SGD micro-benchmarks as tidy tables: top-k selection time (:func:`measure_topk`, fitted as
``gamma d log2 d``), the sparse all-gather cost (:func:`measure_allgather`, fitted as ``a + b P m``), and
how they compare (:func:`cost_compare_table`), each beside the paper's published numbers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from repro.core.cost import CostModel, fit_linear, fit_topk_gamma, relative_errors, topk_time_s
from repro.core.paths import paper_numbers_path
from repro.costs.presets import preset, preset_workers
from repro.families.sparse.calibrate import time_topk
from repro.families.sparse.simulate import INDEX_BYTES, topk_count
from repro.launch.local import launch_local
from repro.runtime.calibrate import fit_on_ranks
from repro.studies.common import available_cpus, warn_if_oversubscribed, with_oversubscription

__all__ = ["PUBLISHED_GAMMA_S", "PUBLISHED_NETWORK", "PAPER_WORKERS", "default_numels", "measure_topk",
           "topk_fit_table", "allgather_sizes_bytes", "measure_allgather", "allgather_fit_table",
           "allgather_fit_errors", "cost_compare_table", "paper_iteration_times"]

#: The paper's top-k fit on its P102-100 GPU (density 0.001), as the ``1gbe-allgather`` preset holds it.
PUBLISHED_GAMMA_S: float = float(preset("1gbe-allgather", 16).topk_gamma_s)
PUBLISHED_NETWORK = "1gbe-allgather"
PAPER_WORKERS = 16
_VALUE_BYTES = 4   # float32 gradient values on the wire; int32 indices (INDEX_BYTES) are as large
assert INDEX_BYTES == _VALUE_BYTES
_PUBLISHED_TOPK = "published: P102-100 GPU (OMGS-SGD, INFOCOM 2020)"
_PUBLISHED_AG = "published: 1GbE, P102-100 nodes (OMGS-SGD, INFOCOM 2020)"


def default_numels(lo_log2: int = 10, hi_log2: int = 22, step: int = 2) -> list[int]:
    """Tensor sizes ``2**lo_log2, 2**(lo_log2 + step), ..., 2**hi_log2`` elements."""
    return [2 ** e for e in range(lo_log2, hi_log2 + 1, step)]


# Top-k selection

def measure_topk(numels: Sequence[int], density: float, *, repeats: int = 5, threads: int | None = 1) -> pd.DataFrame:
    """Median seconds of one top-k selection by magnitude per tensor size on this machine's CPU.
    Columns: numel, k, density, measured_s, device ("cpu"), threads (torch intra-op threads during the
    timing; None keeps the current setting), repeats."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        used = torch.get_num_threads()
        seconds = time_topk(list(numels), density, repeats=repeats)
    finally:
        torch.set_num_threads(before)
    return pd.DataFrame({"numel": [int(n) for n in numels], "k": [int(topk_count(n, density)) for n in numels],
                         "density": float(density), "measured_s": seconds, "device": "cpu", "threads": used,
                         "repeats": repeats})


def topk_fit_table(times: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per_size, fits)`` of the ``gamma * d * log2(d)`` fit to :func:`measure_topk`'s times:
    ``per_size`` adds ``fitted_s``, ``relative_error`` and ``published_p102_s`` (the paper's gamma);
    ``fits`` has this machine's gamma (``source="measured"``) and the paper's (``"published"``)."""
    gamma = fit_topk_gamma(times["numel"], times["measured_s"])
    fitted = topk_time_s(gamma, times["numel"].to_numpy())
    per_size = times.assign(fitted_s=fitted, relative_error=fitted / times["measured_s"].to_numpy() - 1.0,
                            published_p102_s=topk_time_s(PUBLISHED_GAMMA_S, times["numel"].to_numpy()))
    threads = int(times["threads"].iloc[0]) if "threads" in times and len(times) else None
    fits = pd.DataFrame([
        {"source": "measured", "device": f"local CPU ({threads} thread{'s' if threads != 1 else ''})",
         "gamma_s": gamma, "density": float(times["density"].iloc[0]),
         "max_abs_relative_error": float(np.abs(per_size["relative_error"]).max()),
         "citation": "measured here: abs() + repro.families.sparse.topk (exact top-k), median of repeats"},
        {"source": "published", "device": "P102-100 GPU", "gamma_s": PUBLISHED_GAMMA_S, "density": 0.001,
         "max_abs_relative_error": np.nan, "citation": _PUBLISHED_TOPK},
    ])
    return per_size, fits


# All-gather

def allgather_sizes_bytes(numels: Sequence[int], density: float, *, max_bytes: int = 4 * 2**20,
                          extra: int = 4) -> list[int]:
    """Bytes per worker to time: the sparse messages of ``numels`` at ``density`` (``4k`` bytes)
    and ``extra`` geometric sizes up to ``max_bytes``, so the fit sees the bandwidth term too."""
    sparse = {int(topk_count(n, density)) * _VALUE_BYTES for n in numels}
    lo = max(sparse) if sparse else 4096
    more = {int(s) // 4 * 4 for s in np.geomspace(lo, max(lo * 2, max_bytes), extra + 1)[1:]} if extra else set()
    return sorted(sparse | more)


def measure_allgather(world_sizes: Sequence[int], sizes_bytes: Sequence[int], *, repeats: int = 5,
                      timeout_s: float = 300) -> pd.DataFrame:
    """All-gather times and fitted lines ``T = a + b * gathered_bytes`` on P local gloo ranks for
    each P (the slowest rank's median per size). Columns: workers, bytes_per_worker, gathered_bytes,
    measured_s, a_s, b_s_per_byte, cpu_count, threads_per_rank, oversubscribed."""
    cpus = available_cpus()
    rows = []
    for p in world_sizes:
        if p < 2:
            continue
        warn_if_oversubscribed(p, "all-gather timing", cpus=cpus)
        d = launch_local(fit_on_ranks, p, args=(list(map(int, sizes_bytes)), ("sparse_allgather",), repeats),
                         timeout_s=timeout_s, quiet=True)[0]
        cost = CostModel.from_dict(d)
        line = cost.line("sparse_allgather")
        m = cost.meta["measurements"]["sparse_allgather"]
        rows += [{"workers": p, "bytes_per_worker": int(n), "gathered_bytes": int(n) * p, "measured_s": float(t),
                  "a_s": line.a_s, "b_s_per_byte": line.b_s_per_byte, "cpu_count": cpus, "threads_per_rank": 1}
                 for n, t in zip(m["bytes"], m["seconds"])]
    return with_oversubscription(pd.DataFrame(rows), workers="workers")


def allgather_fit_table(times: pd.DataFrame, published_workers: Sequence[int] | None = None) -> pd.DataFrame:
    """One line ``T = a + b * P * m`` per row: each measured world refitted with
    :func:`repro.core.cost.fit_linear` (with its largest relative error), and the paper's published 1GbE
    fits (``published_workers``: default all of the preset's P)."""
    rows = []
    for p, g in times.groupby("workers"):
        line = fit_linear(g["gathered_bytes"], g["measured_s"])
        err = relative_errors(line, g["gathered_bytes"], g["measured_s"])
        rows.append({"workers": int(p), "source": "measured", "network": "local gloo (loopback)",
                     "a_s": line.a_s, "b_s_per_byte": line.b_s_per_byte,
                     "max_abs_relative_error": float(np.abs(err).max()),
                     "oversubscribed": bool(g["oversubscribed"].any()) if "oversubscribed" in g else False,
                     "citation": "measured here"})
    for p in published_workers or preset_workers(PUBLISHED_NETWORK):
        line = preset(PUBLISHED_NETWORK, p).line("sparse_allgather")
        rows.append({"workers": int(p), "source": "published", "network": "1GbE", "a_s": line.a_s,
                     "b_s_per_byte": line.b_s_per_byte, "max_abs_relative_error": np.nan, "oversubscribed": False,
                     "citation": _PUBLISHED_AG})
    return pd.DataFrame(rows)


def allgather_fit_errors(times: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """The measured rows with the fitted seconds of their world's line and the relative error."""
    frames = []
    measured = fits[fits["source"] == "measured"]
    for p, g in times.groupby("workers"):
        f = measured[measured["workers"] == p].iloc[0]
        fitted = f.a_s + f.b_s_per_byte * g["gathered_bytes"].to_numpy()
        frames.append(g.assign(fitted_s=fitted, relative_error=fitted / g["measured_s"].to_numpy() - 1.0))
    return pd.concat(frames, ignore_index=True) if frames else times.assign(fitted_s=[], relative_error=[])


# Top-k vs all-gather

def cost_compare_table(topk: pd.DataFrame, allgather: pd.DataFrame, fits: pd.DataFrame,
                       workers: int | None = None) -> pd.DataFrame:
    """Per tensor size of ``topk``: seconds of top-k selection, of the sparse exchange of ``k``
    values and indices (two all-gathers of ``4k`` bytes per worker) and of one all-gather start-up, as
    measured here (on ``workers`` ranks, default the largest world) and in the paper's setting.

    Tidy: numel, k, density, setting, workers, quantity (``topk_s``, ``sparse_allgather_s``,
    ``allgather_startup_s``), seconds. ValueError when a needed all-gather size was not measured."""
    if workers is None:
        workers = int(allgather["workers"].max())
    ag = allgather[allgather["workers"] == workers].set_index("bytes_per_worker")["measured_s"]
    f = fits[(fits["source"] == "measured") & (fits["workers"] == workers)].iloc[0]
    paper = preset(PUBLISHED_NETWORK, PAPER_WORKERS).line("sparse_allgather")
    rows = []
    for r in topk.itertuples():
        k = int(r.k)
        nbytes = k * _VALUE_BYTES
        if nbytes not in ag.index:
            raise ValueError(f"no all-gather measured at {nbytes} bytes per worker (k={k} of d={r.numel}); "
                             "time the sizes allgather_sizes_bytes(numels, density) returns")
        seconds = {("measured", workers): (float(r.measured_s), 2 * float(ag.loc[nbytes]), float(f.a_s)),
                   ("paper", PAPER_WORKERS): (float(topk_time_s(PUBLISHED_GAMMA_S, r.numel)),
                                              2 * (paper.a_s + paper.b_s_per_byte * PAPER_WORKERS * nbytes),
                                              paper.a_s)}
        rows += [{"numel": int(r.numel), "k": k, "density": float(r.density), "setting": setting,
                  "workers": p, "quantity": q, "seconds": t}
                 for (setting, p), ts in seconds.items()
                 for q, t in zip(("topk_s", "sparse_allgather_s", "allgather_startup_s"), ts)]
    return pd.DataFrame(rows)


# Published iteration times

def paper_iteration_times() -> pd.DataFrame:
    """OMGS-SGD's published seconds per iteration as shipped: model, paper_model, batch_size,
    topk_sgd_s, omgs_sgd_s, speedup, workers, network, source."""
    return pd.read_csv(paper_numbers_path("omgs_iteration_times"))
