"""Execute Plans on real models over torch.distributed.

``bucketed`` runs the all-reduce family (WFBP, SyncEASGD, threshold, MG-WFBP, optimal): gradient
hooks fill per-bucket flat buffers and launch each bucket's asynchronous all-reduce as soon as its
last gradient arrives. The runtime never plans: it executes a :class:`~repro.core.plan.Plan`.
"""
