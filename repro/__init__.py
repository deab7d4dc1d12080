"""repro: communication scheduling for data-parallel training (MG-WFBP, OMGS-SGD, DeAR, OSP).

Core seam: a :class:`~repro.trace.Trace` and a :class:`~repro.cost.CostModel` go into a planner,
which returns a :class:`~repro.plan.Plan`; the simulator (:mod:`repro.sim`) and the runtime
(:mod:`repro.runtime`) execute the same plan. The family registry (:mod:`repro.families`) and the
scheduler registry (:mod:`repro.schedulers`) are the two tables a new scheduler is added to.
The torch-free core (trace, cost, plan, families, planners, sim) never imports torch.
"""

from repro import _moved

__version__ = "0.2.0.dev0"

_moved.install()
