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


# The GQA groups of the C++ CUDA benchmarks (bench/cuda/gqa_heads.cuh, make_head): query head h of
# a group draws its queries with query mean norm HEAD_OFFSET[h % 4] and topic strength
# HEAD_TOPIC[h % 4]; every head of the group shares the seed, so the keys and topics.
HEAD_OFFSET = (4.0, 3.0, 5.0, 4.5)
HEAD_TOPIC = (2.0, 1.5, 2.5, 3.0)


def gqa_key_set(n, extra, d, group, seed):
    """Key set `seed` of kvsift-cuda-decode_search_bench, the same arrays: kvsift.make_ood (the
    C++ generator) as make_head calls it, 1024 topics, once per query head of the group.
    Returns (keys (n, d) float32 rounded through float16, as the cache holds them and the C++
    bench indexes them; queries, one (n + extra, d) float32 array per head: rows [0, n) are the
    prefill queries, the rest held out)."""
    import kvsift as ks  # only here: the older workload above needs no kvsift

    heads = [ks.make_ood(n, n + extra, d, topics=1024, query_offset=HEAD_OFFSET[h % 4],
                         topic_scale=HEAD_TOPIC[h % 4], seed=seed) for h in range(group)]
    keys = heads[0][0].astype(np.float16).astype(np.float32)
    return keys, [q for _, q in heads]
