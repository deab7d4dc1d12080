"""repro: communication scheduling for data-parallel training (MG-WFBP, OMGS-SGD, DeAR, OSP).

Core seam (:mod:`repro.core`, torch-free): a :class:`~repro.core.trace.Trace` and a
:class:`~repro.core.cost.CostModel` go into a planner, which returns a :class:`~repro.core.plan.Plan`; the
simulator (:mod:`repro.core.simulate`) and the runtime (each family's executor) execute the same plan.
Each family is one folder of :mod:`repro.families` that registers its planners, schedulers and options.
"""

def _version() -> str:
    """The installed distribution's version (pyproject.toml is the one source); a checkout that is not
    installed reads its pyproject.toml, and anything else says it does not know."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("repro")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M)
        except OSError:
            found = None
        return found.group(1) if found else "0+unknown"


__version__ = _version()

def __getattr__(name: str):
    """``repro.distribute`` (the one-call API, :mod:`repro.api`) and the DDP bridge
    (``repro.ddp_bucket_caps``, ``repro.check_ddp_buckets``: :mod:`repro.families.allreduce.ddp_bridge`) import
    torch only when first used, so ``import repro`` and the torch-free core stay light."""
    if name in ("distribute", "DistributedOptimizer"):
        from repro import api

        return getattr(api, name)
    if name in ("ddp_bucket_caps", "check_ddp_buckets"):
        from repro.families.allreduce import ddp_bridge

        return getattr(ddp_bridge, name)
    raise AttributeError(f"module 'repro' has no attribute {name!r}")
