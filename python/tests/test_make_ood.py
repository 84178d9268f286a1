"""kvsift.make_ood: the C++ tests' and benchmarks' synthetic workload from Python. It must be the
very arrays the C++ generator makes (kvsift-bench --demo writes its workload with --save-data),
deterministic per seed, shaped by its parameters, and refuse bad arguments before allocating."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kvsift as ks

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(os.environ.get("KVSIFT_BENCH", ROOT / "build" / "bin" / "kvsift-bench"))


def read_fbin(path):
    raw = np.fromfile(path, dtype=np.uint32, count=2)
    return np.fromfile(path, dtype=np.float32, offset=8).reshape(int(raw[0]), int(raw[1]))


@pytest.mark.skipif(not BENCH.exists(), reason="kvsift-bench not built (set KVSIFT_BENCH)")
def test_equals_the_cpp_generator_bit_for_bit(tmp_path):
    n, dim, ev, spread = 1500, 32, 40, 0.3
    subprocess.run([str(BENCH), "--demo", "--n", str(n), "--dim", str(dim), "--eval", str(ev),
                    "--spread", str(spread), "--index", "flat", "--k", "10", "--L", "10",
                    "--threads", "1", "--save-data", str(tmp_path)],
                   check=True, capture_output=True, timeout=300)
    keys, queries = ks.make_ood(n, n // 10 + ev, dim, norm_spread=spread)
    assert keys.dtype == np.float32 and queries.dtype == np.float32
    assert np.array_equal(keys, read_fbin(tmp_path / "keys.fbin"))
    assert np.array_equal(queries[: n // 10], read_fbin(tmp_path / "train.fbin"))
    assert np.array_equal(queries[n // 10:], read_fbin(tmp_path / "eval.fbin"))


def test_deterministic_per_seed_and_shaped_by_its_parameters():
    k1, q1 = ks.make_ood(800, 300, 24, topics=16, seed=3)
    k2, q2 = ks.make_ood(800, 300, 24, topics=16, seed=3)
    assert k1.shape == (800, 24) and q1.shape == (300, 24)
    assert np.array_equal(k1, k2) and np.array_equal(q1, q2)
    k3, _ = ks.make_ood(800, 300, 24, topics=16, seed=4)
    assert not np.array_equal(k1, k3)
    # The key mean has norm key_offset; the query mean is orthogonal to it.
    k, q = ks.make_ood(4000, 4000, 64, key_offset=6.0, query_offset=5.0, topic_scale=0.5, noise=0.1)
    mk, mq = k.mean(axis=0), q.mean(axis=0)
    assert abs(np.linalg.norm(mk) - 6.0) < 0.3
    assert abs(np.linalg.norm(mq) - 5.0) < 0.3
    assert abs(mk @ mq) / (np.linalg.norm(mk) * np.linalg.norm(mq)) < 0.05
    # Out of distribution: a query's best inner-product key is rarely its nearest key.
    ip = q[:200] @ k.T
    l2 = ((q[:200, None, :] - k[None, :, :]) ** 2).sum(axis=-1)
    assert (ip.argmax(axis=1) == l2.argmin(axis=1)).mean() < 0.5
    # norm_spread 0 gives every key the same scale around the common mean: a narrow spread of norms.
    k0, _ = ks.make_ood(2000, 1, 64, norm_spread=0.0, noise=0.0, key_offset=0.0)
    assert np.allclose(np.linalg.norm(k0, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("kwargs, part", [
    (dict(keys=0, queries=1, dim=8), "keys must be > 0"),
    (dict(keys=10, queries=1, dim=1), "dim must be >= 2"),
    (dict(keys=10, queries=1, dim=8, topics=0), "topics must be > 0"),
    (dict(keys=10, queries=1, dim=8, norm_spread=1.0), "norm_spread in [0, 1)"),
    (dict(keys=-1, queries=1, dim=8), "expected keys >= 0, got -1"),
    (dict(keys=10, queries=-5, dim=8), "expected queries >= 0, got -5"),
    (dict(keys=2**40, queries=2**40, dim=2**20), "<= 2^40 floats"),
    (dict(keys=2**62, queries=2**62, dim=4), "<= 2^40 floats"),
])
def test_bad_arguments_are_refused(kwargs, part):
    with pytest.raises(ks.InvalidArgument, match=part.replace("[", r"\[").replace(")", r"\)")
                       .replace("^", r"\^")):
        ks.make_ood(**kwargs)


@pytest.mark.parametrize("name", ["key_offset", "query_offset", "topic_scale", "noise",
                                  "norm_spread"])
def test_non_finite_parameters_are_refused(name):
    for bad in (float("nan"), float("inf"), -1e300):
        with pytest.raises(ks.NonFiniteValue, match="expected finite"):
            ks.make_ood(10, 1, 8, **{name: bad})


def test_the_cuda_step_bench_draws_the_cpp_bench_data():
    # bench/python/ood_data.gqa_key_set, which cuda_decode_step.py uses: the C++ CUDA benches'
    # make_head (gqa_heads.cuh), keys shared by the group and rounded through f16, each head's
    # queries its own. Its CPU part runs here; the script itself needs a GPU (test_cuda.py).
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "bench" / "python"))
    try:
        ood_data = importlib.import_module("ood_data")
    finally:
        sys.path.pop(0)
    n, extra, d, group = 4096, 8, 128, 4
    keys, queries = ood_data.gqa_key_set(n, extra, d, group, 100)
    assert keys.shape == (n, d) and len(queries) == group
    assert all(q.shape == (n + extra, d) for q in queries)
    assert np.array_equal(keys, keys.astype(np.float16).astype(np.float32))
    raw, q0 = ks.make_ood(n, n + extra, d, topics=1024, query_offset=4.0, topic_scale=2.0,
                          seed=100)
    assert np.array_equal(keys, raw.astype(np.float16).astype(np.float32))
    assert np.array_equal(queries[0], q0)
    assert not np.array_equal(queries[0], queries[1])
    # At the GPU smoke test's size (n 4096, k 20, pool 128) the index built from these queries
    # (10% of each head's prefill, as the bench samples them) finds the top-20 of held-out
    # queries: that test asks the GPU walk for recall > 0.9.
    train = ks.sample_gqa_queries([q[:n] for q in queries], 0.1, 7)
    index = ks.RoarGraphIndex(keys, train)
    held = np.stack([q[n + e] for q in queries for e in range(extra)])
    exact = np.argsort(-(held @ keys.T), axis=1)[:, :20]
    found = index.search(held, k=20, L=128).ids
    recall = np.mean([len(set(a) & set(b)) / 20 for a, b in zip(exact, found)])
    assert recall > 0.95
