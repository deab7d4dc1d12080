"""The families of gradient exchange, one folder each; every folder registers itself when imported
(:func:`repro.core.registry.load_families`), and so does a family of another package that names its
module under the entry-point group ``repro.families``."""
