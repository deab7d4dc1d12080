"""Models, data, profiling and estimates: what a run computes and how long each layer takes.

``repro.workload.profile_model`` (lazily imported: it needs torch, the catalogue does not) measures
a per-layer trace of a registry model or of any ``nn.Module`` with an example batch and a loss.
"""


def __getattr__(name: str):
    if name == "profile_model":
        from repro.workload.profile import profile_model

        return profile_model
    raise AttributeError(f"module 'repro.workload' has no attribute {name!r}")
