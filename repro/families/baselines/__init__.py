"""Baselines that execute no plan of ours: PyTorch DDP (and DDP given a plan's bucket sizes), FSDP2, and one
worker without communication. Registers their schedulers on import; executors in :mod:`.executors` and
:mod:`.fsdp` (torch).
"""

from __future__ import annotations

from repro.core.schedulers import Scheduler, register_scheduler

DDP = "PyTorch DDP (Li et al., VLDB 2020)"
DDP_EXECUTOR = "repro.families.baselines.executors:TorchDDPExecutor"

for _s in (
    Scheduler("ddp", "PyTorch DistributedDataParallel with its defaults (real DDP, not a plan)", DDP, DDP_EXECUTOR,
              sparse_gradients=True),
    Scheduler("ddp_threshold", "PyTorch DDP given the threshold plan's bucket sizes (bucket_cap_mb_list)", DDP,
              DDP_EXECUTOR, planner="threshold", planner_options=("threshold_bytes",), family="allreduce",
              sparse_gradients=True),
    Scheduler("fsdp", "PyTorch FSDP2 (fully_shard, parameters kept unsharded after forward): reduce-scatter of "
              "gradients in backward, all-gather of parameters in the next forward (real FSDP2, not a plan)",
              "PyTorch FSDP2 (Zhao et al., VLDB 2023), what a user would pick instead of DeAR today",
              "repro.families.baselines.fsdp:FSDPExecutor"),
    Scheduler("local", "no communication: one worker's computation (the baseline of speedups)",
              "-", "repro.families.baselines.executors:LocalExecutor", communicates=False, sparse_gradients=True),
):
    register_scheduler(_s)
