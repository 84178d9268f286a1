"""Edge-case input at every binding entry point: layouts kvsift's views cannot describe
(broadcast, reversed, byte-offset strides), non-native byte order, overflow-sized counts, and
wrong shape / NaN / empty / out-of-range input. Each case must raise a ValueError subclass
(or pybind11's TypeError for ints beyond size_t) naming the fix, never crash or read garbage.

Some of these crashed the interpreter before the fixes (a zero token stride read past the
array; k = 2**62 over a batch wrote through a wrapped m * k), so the dangerous ones are also
run in a child process: a crash there fails the test instead of killing the whole session."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import kvsift as ks

D = 16
BIG = 2**62


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((300, D)).astype(np.float32)
    queries = rng.standard_normal((60, D)).astype(np.float32)
    return keys, queries


@pytest.fixture(scope="module")
def graph(data):
    keys, queries = data
    return ks.RoarGraphIndex(keys, queries[:40], nq=10, M=8, L=16, threads=1)


def in_child(code):
    """Runs `code` (with kvsift as ks and numpy as np imported) in a fresh interpreter; returns
    (returncode, stdout + stderr). A segfault is a negative return code."""
    prog = "import numpy as np, kvsift as ks\n" + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


# ------------------------------------------------------------------------- strides (item 1)


def test_broadcast_token_stride_is_rejected_not_read_past():
    # np.broadcast_to gives token stride 0: (n, heads, d) over one (heads, d) row. Before the
    # fix the binding replaced the 0 by d and read n * d elements of a heads * d buffer.
    rc, out = in_child("""
        row = np.ones((1, 2, 8), np.float32)
        k = np.broadcast_to(row, (4096, 2, 8))
        assert k.strides[0] == 0
        try:
            ks.dense_attention(np.ones(8, np.float32), k, k, 0, 4096, kv_head=1)
        except ks.InvalidArgument as e:
            print("RAISED", e)
        else:
            print("NO ERROR")
    """)
    assert rc == 0, out
    assert "RAISED" in out, out
    assert "stride" in out and "ascontiguousarray" in out, out


def test_zero_and_negative_strides_on_every_axis_raise(data):
    keys, queries = data
    q = np.ones(8, np.float32)
    base = np.ones((6, 2, 8), np.float32)
    head_bcast = np.broadcast_to(np.ones((6, 1, 8), np.float32), (6, 2, 8))  # head stride 0
    reversed_tokens = base[::-1]  # negative token stride
    reversed_heads = base[:, ::-1]
    for bad in (head_bcast, reversed_tokens, reversed_heads):
        with pytest.raises(ks.InvalidArgument, match="ascontiguousarray"):
            ks.dense_attention(q, bad, bad, 0, 6)
        with pytest.raises(ks.InvalidArgument, match="ascontiguousarray"):
            ks.sparse_attention(q, bad, bad, np.arange(3))
    # 2-D: broadcast rows and reversed rows.
    b2 = np.broadcast_to(keys[:1], (50, D))
    for bad in (b2, keys[::-1]):
        with pytest.raises(ks.InvalidArgument, match="ascontiguousarray"):
            ks.FlatIndex(bad)
        with pytest.raises(ks.InvalidArgument, match="ascontiguousarray"):
            ks.sparse_attention(queries[0], bad, bad, np.arange(3))
        with pytest.raises(ks.InvalidArgument, match="ascontiguousarray"):
            ks.BlockIndex(bad, 4)
    with pytest.raises(ks.InvalidArgument):
        ks.FlatIndex(keys).topk(np.broadcast_to(queries[:1], (5, D)), 3)


def test_strides_not_a_multiple_of_the_item_size_raise():
    raw = np.zeros(4096, np.uint8)
    # float32 elements at a 2-byte offset from each other's grid: strides 34 and 4 bytes.
    k = np.ndarray((4, 8), dtype=np.float32, buffer=raw, offset=0, strides=(34, 4))
    with pytest.raises(ks.InvalidArgument, match="multiple of the item size 4"):
        ks.FlatIndex(k)
    k3 = np.ndarray((3, 2, 8), dtype=np.float32, buffer=raw, offset=0, strides=(66, 34, 4))
    with pytest.raises(ks.InvalidArgument, match="multiple of the item size 4"):
        ks.dense_attention(np.ones(8, np.float32), k3, k3, 0, 3)


def test_overlapping_token_rows_raise():
    buf = np.ones(64, np.float32)
    k = as_strided(buf, shape=(4, 2, 8), strides=(4, 32, 4))  # token stride 1 element < d
    with pytest.raises(ks.InvalidArgument, match="token stride >= 8"):
        ks.dense_attention(np.ones(8, np.float32), k, k, 0, 4)


def test_valid_strided_layouts_still_work(data):
    # (heads, tokens, d) transposed to (tokens, heads, d): token stride d, head stride n * d.
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((2, 40, 8)).astype(np.float32)
    k = cache.transpose(1, 0, 2)
    q = rng.standard_normal(8).astype(np.float32)
    o, lse = ks.dense_attention(q, k, k, 0, 40, kv_head=1)
    o2, lse2 = ks.dense_attention(q, cache[1], cache[1], 0, 40)
    np.testing.assert_allclose(o, o2, rtol=1e-6)
    assert lse == pytest.approx(lse2)


# ------------------------------------------------------------------------- overflow (item 2)


def test_huge_k_over_a_batch_is_a_clear_error(data):
    rc, out = in_child("""
        rng = np.random.default_rng(0)
        keys = rng.standard_normal((100, 8)).astype(np.float32)
        flat = ks.FlatIndex(keys)
        for m in (1, 3):
            try:
                flat.topk(keys[:m].copy(), 2**62)
            except ValueError as e:
                print("RAISED", type(e).__name__, e)
            else:
                print("NO ERROR")
    """)
    assert rc == 0, out
    assert out.count("RAISED") == 2, out
    assert "k: expected at most 4294967295" in out, out


def test_huge_k_and_counts_raise_everywhere(data, graph):
    keys, queries = data
    flat = ks.FlatIndex(keys)
    for k in (BIG, 2**32):
        with pytest.raises(ks.OutOfRange, match="k: expected at most"):
            flat.topk(queries[:4], k)
        with pytest.raises(ks.OutOfRange, match="expected at most 4294967295"):
            graph.search(queries[:4], k, L=k)
    with pytest.raises(ks.OutOfRange, match="L: expected at most"):
        graph.search(queries[:4], 3, L=BIG)
    with pytest.raises(ks.OutOfRange, match="l0: expected at most"):
        graph.dipr(queries[0], 1.0, l0=BIG)
    with pytest.raises(ks.OutOfRange, match="max_candidates: expected at most"):
        flat.dipr(queries[0], 1.0, max_candidates=BIG)
    # Beyond size_t: pybind11 refuses the conversion itself.
    with pytest.raises(TypeError):
        flat.topk(queries[0], 2**64)
    with pytest.raises(TypeError):
        flat.topk(queries[0], -1)


def test_huge_roargraph_parameters_are_a_clear_error(data):
    keys, queries = data
    rc, out = in_child("""
        rng = np.random.default_rng(0)
        keys = rng.standard_normal((100, 8)).astype(np.float32)
        for kw in ({"M": 2**62}, {"L": 2**62}, {"nq": 2**62}, {"M": 2**62, "L": 2**63}):
            try:
                ks.RoarGraphIndex(keys, keys[:20], threads=1, **kw)
            except ValueError as e:
                print("RAISED", e)
            else:
                print("NO ERROR")
    """)
    assert rc == 0, out
    assert out.count("RAISED") == 4, out
    assert "RoarGraphIndex: M: expected at most 4294967295" in out, out
    with pytest.raises(TypeError):
        ks.RoarGraphIndex(keys, queries[:20], M=2**64)
    with pytest.raises(TypeError):
        ks.RoarGraphIndex(keys, queries[:20], M=-1)


# ------------------------------------------------------------------------- byte order (item 3)


@pytest.mark.parametrize("dt", [">f2", ">f4"])
def test_big_endian_arrays_are_rejected_with_the_fix(data, dt):
    keys, queries = data
    be = keys.astype(dt)
    assert not be.dtype.isnative
    want = "native byte order.*astype\\('<f" + dt[-1]
    with pytest.raises(ks.InvalidArgument, match=want):
        ks.FlatIndex(be)
    with pytest.raises(ks.InvalidArgument, match=want):
        ks.RoarGraphIndex(be, queries[:20], nq=5, M=4, L=8)
    with pytest.raises(ks.InvalidArgument, match=want):
        ks.sparse_attention(queries[0], be, be, np.arange(3))
    with pytest.raises(ks.InvalidArgument, match=want):
        ks.dense_attention(queries[0], be, be, 0, 3)
    qbe = queries.astype(dt)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.FlatIndex(keys).topk(qbe, 3)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.FlatIndex(keys).dipr(qbe[0], 1.0)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.RoarGraphIndex(keys, qbe[:20], nq=5, M=4, L=8)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.BlockIndex(be, 4)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.merge(qbe[0], 0.0, queries[1], 0.0)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.merge_n(qbe[:2], np.zeros(2, np.float32))
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.sample_gqa_queries([qbe], 0.5)


def test_big_endian_after_byteswap_fix_gives_the_native_result(data):
    keys, queries = data
    be = keys.astype(">f4")
    fixed = be.astype("<f4")
    a = ks.FlatIndex(fixed).topk(queries[0], 5).ids
    b = ks.FlatIndex(keys).topk(queries[0], 5).ids
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------ shapes, NaN, empty, range


def test_wrong_shapes_at_each_entry_point(data, graph):
    keys, queries = data
    flat = ks.FlatIndex(keys)
    with pytest.raises(ks.DimensionMismatch):
        flat.topk(queries[:2, :5], 3)
    with pytest.raises(ks.DimensionMismatch):
        graph.search(queries[:2, :5], 3)
    with pytest.raises(ks.DimensionMismatch):
        graph.dipr(queries[:2], 1.0)  # dipr takes one (d,) query
    with pytest.raises(ks.DimensionMismatch):
        ks.BlockIndex(keys.ravel(), 4)
    with pytest.raises(ks.DimensionMismatch):
        ks.BlockIndex(keys, 4).topk(queries[0, :5], 2)
    with pytest.raises(ks.DimensionMismatch):
        ks.sparse_attention(queries[0], keys[None], keys, np.arange(2))
    with pytest.raises(ks.DimensionMismatch):
        ks.sparse_attention(queries[0], keys, keys[:10], np.arange(2))
    with pytest.raises(ks.DimensionMismatch):
        ks.merge(queries[0], 0.0, queries[1, :5], 0.0)
    with pytest.raises(ks.DimensionMismatch):
        ks.merge_n(queries[:2].ravel(), np.zeros(2, np.float32))
    with pytest.raises(ks.DimensionMismatch):
        ks.sparse_attention(queries[0], keys, keys, np.zeros((2, 2), np.int64))
    with pytest.raises(ks.InvalidArgument, match="integer array"):
        ks.sparse_attention(queries[0], keys, keys, np.zeros(2, np.float32))
    with pytest.raises(ks.InvalidArgument, match="integer array"):
        ks.BlockIndex(keys, 4).tokens(np.zeros(2, np.float32))


def test_nan_and_inf_at_each_entry_point(data, graph):
    keys, queries = data
    for bad_value in (np.nan, np.inf, -np.inf):
        bad = keys.copy()
        bad[5, 2] = bad_value
        with pytest.raises(ks.NonFiniteValue):
            ks.RoarGraphIndex(bad, queries[:20], nq=5, M=4, L=8)
        with pytest.raises(ks.NonFiniteValue):
            ks.BlockIndex(bad, 4)
        q = queries[0].copy()
        q[1] = bad_value
        with pytest.raises(ks.NonFiniteValue):
            ks.BlockIndex(keys, 4).topk(q, 2)
        with pytest.raises(ks.NonFiniteValue):
            ks.sparse_attention(q, keys, keys, np.arange(3))
        if bad_value != -np.inf:  # -inf is the empty state, valid
            with pytest.raises(ks.NonFiniteValue):
                ks.merge(queries[0], float(bad_value), queries[1], 0.0)
    # A NaN lse inside merge_n is rejected as well.
    with pytest.raises(ks.NonFiniteValue):
        ks.merge_n(queries[:2], np.array([0.0, np.nan], np.float32))


def test_empty_input_at_each_entry_point(data, graph):
    keys, queries = data
    empty_keys = np.zeros((0, D), np.float32)
    with pytest.raises(ks.InvalidArgument):
        ks.BlockIndex(empty_keys, 4)
    with pytest.raises(ks.InvalidArgument):
        ks.RoarGraphIndex(keys, np.zeros((0, D), np.float32), nq=5, M=4, L=8)
    with pytest.raises(ks.InvalidArgument):
        ks.sample_gqa_queries([], 0.5)
    # Zero queries is a defined empty result, not an error.
    r = ks.FlatIndex(keys).topk(np.zeros((0, D), np.float32), 3)
    assert r.ids.shape == (0, 3)
    r = graph.search(np.zeros((0, D), np.float32), 3)
    assert r.ids.shape == (0, 3)
    # The empty token set is the empty partial state.
    o, lse = ks.sparse_attention(queries[0], keys, keys, np.zeros(0, np.int64))
    assert lse == -math.inf and not o.any()


def test_out_of_range_integers_at_each_entry_point(data, graph):
    keys, queries = data
    with pytest.raises(ks.OutOfRange):
        ks.sparse_attention(queries[0], keys, keys, np.array([2**40]))
    with pytest.raises(ks.OutOfRange):
        ks.sparse_attention(queries[0], keys, keys, np.array([0]), kv_head=1)
    with pytest.raises(ks.OutOfRange):
        ks.dense_attention(queries[0], keys, keys, 0, 2**40)
    with pytest.raises(ks.OutOfRange):
        ks.BlockIndex(keys, 4).tokens_of(10**6)
    with pytest.raises(ks.OutOfRange):
        ks.BlockIndex(keys, 4).tokens(np.array([-1]))
    with pytest.raises(ks.OutOfRange):
        ks.BlockIndex(keys, 4).tokens(np.array([10**6]))
    with pytest.raises(ks.OutOfRange):
        graph.search(queries[0], 3, entries=np.array([-1]))
    with pytest.raises(ks.InvalidArgument):
        ks.BlockIndex(keys, -1)
    with pytest.raises(ks.InvalidArgument):
        ks.Planner(short_context=-1)
    with pytest.raises(ks.InvalidArgument):
        ks.Planner().plan(-5)


def test_remaining_entry_points_bad_input(data, graph):
    keys, queries = data
    block = ks.BlockIndex(keys, 4)
    q = queries[0].copy()
    q[0] = np.nan
    with pytest.raises(ks.NonFiniteValue):
        block.dipr(q, 1.0)
    with pytest.raises(ks.DimensionMismatch):
        block.dipr(queries[0, :3], 1.0)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        block.dipr(queries[0].astype(">f4"), 1.0)
    with pytest.raises(ks.OutOfRange):
        block.bounds(queries[0], 10**6)
    with pytest.raises(ks.OutOfRange):
        block.bounds(queries[0], -1)
    with pytest.raises(TypeError):
        ks.IdBelow(2**64)
    with pytest.raises(TypeError):
        ks.IdRange(-1, 3)
    with pytest.raises(ks.OutOfRange):
        ks.FlatIndex(keys).topk(queries[0], 3, filter=ks.IdBelow(2**62))
    with pytest.raises(ks.InvalidArgument):
        ks.Planner().gpu_bytes("no-such-index", 100)
    with pytest.raises(ks.InvalidArgument):
        ks.sample_gqa_queries([queries, queries[:, :5]], 0.5)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        graph.dipr(queries[0].astype(">f4"), 1.0)
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        graph.search(queries[:3].astype(">f4"), 3)
