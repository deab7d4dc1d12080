"""Small trace builders shared by the tests."""

import numpy as np

from repro.core.trace import Layer, Trace


def make_trace(backward_s, nbytes, forward_s=None, model="synthetic"):
    """A trace from per-layer backward seconds and gradient bytes (forward order)."""
    forward_s = forward_s if forward_s is not None else [b / 2 for b in backward_s]
    layers = [Layer(f"l{i}", int(n) // 4, int(n), float(f), float(b))
              for i, (f, b, n) in enumerate(zip(forward_s, backward_s, nbytes))]
    return Trace(model, 32, "synthetic", "float32", layers)


def random_trace(rng: np.random.Generator, num_layers: int) -> Trace:
    """Random but model-like: log-uniform sizes, backward times up to a few ms."""
    nbytes = (4 * np.exp(rng.uniform(np.log(10), np.log(5e6), num_layers))).astype(int)
    bwd = rng.uniform(0, 3e-3, num_layers) * rng.choice([0.01, 1.0], num_layers)
    return make_trace(list(bwd), list(nbytes))
