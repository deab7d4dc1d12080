"""repro: communication scheduling for data-parallel training (MG-WFBP, OMGS-SGD, DeAR, OSP).

Core seam: a :class:`~repro.trace.Trace` and a :class:`~repro.cost.CostModel` go into a planner,
which returns a :class:`~repro.plan.Plan`; the simulator (and later the runtime) execute the plan.
"""

__version__ = "0.1.0"
