"""Studies: each paper's experiments as functions returning tidy tables."""
