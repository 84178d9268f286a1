"""The synthetic out-of-distribution workload of the Python benchmarks in bench/python/ (imported
by name, like gpu_timing). Keys are standard normal around a random shift; queries are a tighter
cloud around another random direction, so their nearest keys are not the keys' own neighbours
(what defeats key-only ANN indexes). The callers draw the noise and directions from their own
generator, in their own order, so each script's data stays what it was."""

import numpy as np

KEY_SHIFT = 0.5  # keys: N(0, I) + KEY_SHIFT * shift
QUERY_SPREAD = 0.6  # queries: QUERY_SPREAD * N(0, I) + direction


def ood_keys(noise, shift):
    """Keys from standard normal `noise` (..., d) and a direction `shift` (d,), float32."""
    return (noise + KEY_SHIFT * shift).astype(np.float32)


def ood_queries(noise, direction):
    """Queries from standard normal `noise` (m, d) and their direction (d,), float32."""
    return (noise * QUERY_SPREAD + direction).astype(np.float32)
