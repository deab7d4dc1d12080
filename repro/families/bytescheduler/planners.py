"""Planner of the ByteScheduler family: each layer split into chunks of at most ``partition_params``
elements, each one all-reduce with its layer's forward index as priority (input side first), listed in
backward order. ``meta["iteration_s"]`` is the simulated steady-state period.
"""

from __future__ import annotations

import math

import numpy as np

from repro.core.cost import CostModel
from repro.core.plan import Bucket, Message, Plan
from repro.core.trace import Trace

__all__ = ["FAMILY", "DEFAULT_PARTITION_PARAMS", "DEFAULT_CREDIT_BYTES", "bytescheduler"]

FAMILY = "bytescheduler"
DEFAULT_PARTITION_PARAMS = 4_000_000   # the DeAR paper's runs (ICDCS 2023)
DEFAULT_CREDIT_BYTES = 16_000_000


def bytescheduler(trace: Trace, cost: CostModel, partition_params: int = DEFAULT_PARTITION_PARAMS,
                  credit_bytes: int = DEFAULT_CREDIT_BYTES) -> Plan:
    """Chunks of at most ``partition_params`` elements per layer, priority = forward layer index."""
    for name, v in (("partition_params", partition_params), ("credit_bytes", credit_bytes)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    params = trace.params()
    buckets = []
    for i in reversed(range(trace.num_layers)):
        count = max(1, math.ceil(int(params[i]) / int(partition_params)))
        msg = (Message("allreduce", "backward", float(i)),)
        for j in range(count):
            buckets.append(Bucket((trace.names[i],), msg, (j, count) if count > 1 else None))
    plan = Plan(buckets, "bytescheduler", family=FAMILY, options={"credit_bytes": int(credit_bytes)},
                meta={"partition_params": int(partition_params)})
    from repro.core.simulate import simulate

    return plan.replace(meta={**plan.meta, "iteration_s": simulate(trace, plan, cost, with_ops=False).iteration_s})
