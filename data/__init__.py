"""The package ``repro.shipped``: this folder (data/ of the checkout) installed as package data; no code (see README.md and repro.core.paths)."""
