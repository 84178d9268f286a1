"""Tensors in without copies: any DLPack producer on the CPU (torch, or the ctypes producer of
dlpack_producer.py standing in for one), f32/f16/bf16, borrowed in place; wrong device, dtype,
layout, stride or byte order is an error naming the fix, never a silent copy."""

import gc
import os
import sys

import numpy as np
import pytest

import kvsift as ks

sys.path.insert(0, os.path.dirname(__file__))
from dlpack_producer import (FLAG_IS_COPIED, KDL_BFLOAT, KDL_CUDA, Producer,  # noqa: E402
                             bf16_bits)

D = 16
N = 400


@pytest.fixture()
def data():
    rng = np.random.default_rng(5)
    # Small integers: every dot product and every bf16/f16 value is exact.
    keys = rng.integers(-8, 8, size=(N, D)).astype(np.float32)
    values = rng.integers(-8, 8, size=(N, D)).astype(np.float32)
    q = rng.integers(-4, 4, size=D).astype(np.float32)
    return keys, values, q


def oracle_topk(keys, q, k):
    s = keys.astype(np.float64) @ q.astype(np.float64)
    return np.argsort(-s, kind="stable")[:k]


def oracle_attention(q, K, V, ids):
    s = (K[ids].astype(np.float64) @ q.astype(np.float64)) / np.sqrt(q.size)
    m = s.max()
    w = np.exp(s - m)
    return (w @ V[ids].astype(np.float64)) / w.sum(), m + np.log(w.sum())


# ------------------------------------------------------------------ zero copies, lifetime


@pytest.mark.parametrize("versioned", [True, False])
def test_flat_index_reads_the_producers_memory(data, versioned):
    keys, _, q = data
    p = Producer(keys, versioned=versioned)
    flat = ks.FlatIndex(p)
    assert flat.keys is p and flat.size == N and flat.dim == D
    best = int(flat.topk(q, 1).ids[0])
    assert best == oracle_topk(keys, q, 1)[0]
    # The index reads the caller's buffer: a write into it moves the top-1.
    other = (best + 1) % N
    keys[other] = 100 * np.sign(q)
    assert int(flat.topk(q, 1).ids[0]) == other
    # The export is released exactly once, when the index goes.
    assert p.exports == 1 and p.deleted == 0
    del flat
    gc.collect()
    assert p.deleted == 1


def test_failed_calls_release_the_export(data):
    keys, _, _ = data
    p = Producer(keys, flags=FLAG_IS_COPIED)
    with pytest.raises(ks.InvalidArgument, match="IS_COPIED"):
        ks.FlatIndex(p)
    gc.collect()
    assert p.exports == 1 and p.deleted == 1


def test_compact_export_without_strides(data):
    keys, values, q = data
    o, lse = ks.dense_attention(q, Producer(keys, strides=None), Producer(values, strides=None),
                                0, N)
    want_o, want_lse = oracle_attention(q, keys, values, np.arange(N))
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    assert lse == pytest.approx(want_lse, rel=1e-5)


# ------------------------------------------------------------------ bfloat16 and float16


def test_bf16_keys_and_kv_are_read_in_place(data):
    keys, values, q = data
    kb, kf = bf16_bits(keys)
    vb, vf = bf16_bits(values)
    np.testing.assert_array_equal(kf, keys)  # small integers are exact in bf16
    flat = ks.FlatIndex(Producer(kb, code=KDL_BFLOAT))
    np.testing.assert_array_equal(flat.topk(q, 10).ids, ks.FlatIndex(kf).topk(q, 10).ids)
    ids = np.array([3, 50, 7, 399])
    kv = Producer(kb[:, None, :], code=KDL_BFLOAT), Producer(vb[:, None, :], code=KDL_BFLOAT)
    o, lse = ks.sparse_attention(q, *kv, ids)
    want_o, want_lse = oracle_attention(q, kf, vf, ids)
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    assert lse == pytest.approx(want_lse, rel=1e-5)
    # In place: a bf16 write through the caller's buffer changes the result.
    kb[ids[0]] = bf16_bits(100 * np.sign(q))[0]
    assert ks.sparse_attention(q, *kv, ids)[1] > lse + 10


def test_ml_dtypes_bfloat16_numpy_arrays(data):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    keys, _, q = data
    kb = keys.astype(ml_dtypes.bfloat16)
    g = ks.RoarGraphIndex(kb, np.tile(q, (50, 1)), nq=10, M=8, L=32)
    assert g.dtype == kb.dtype
    np.testing.assert_array_equal(ks.FlatIndex(kb).topk(q, 5).ids, oracle_topk(keys, q, 5))


# ------------------------------------------------------------------ rejected, with the fix


def test_device_other_than_cpu_is_rejected_naming_cpu(data):
    keys, values, q = data
    p = Producer(keys, device=(KDL_CUDA, 1))
    with pytest.raises(ks.InvalidArgument, match=r"device cpu.*cuda:1.*x\.cpu\(\)"):
        ks.FlatIndex(p)
    with pytest.raises(ks.InvalidArgument, match="cuda:1"):
        ks.dense_attention(q, p, p, 0, 3)
    assert p.exports == 0  # refused before any export


def test_broadcast_3d_kv_is_rejected(data):
    keys, values, q = data
    # One token row broadcast over 50 tokens and 2 heads: strides (0, 0, 1).
    kp = Producer(keys[:1], shape=(50, 2, D), strides=(0, 0, 1))
    with pytest.raises(ks.InvalidArgument, match=r"positive stride.*contiguous\(\)"):
        ks.dense_attention(q, kp, kp, 0, 50)
    # The same through NumPy, a read-only broadcast NumPy < 2 cannot even export over DLPack.
    b = np.broadcast_to(keys[:1, None, :], (50, 2, D))
    with pytest.raises(ks.InvalidArgument, match="ascontiguousarray"):
        ks.sparse_attention(q, b, b, np.arange(3))


def test_big_endian_f16_numpy_is_rejected(data):
    keys, values, q = data
    be = keys.astype(">f2")
    with pytest.raises(ks.InvalidArgument, match=r"native byte order.*astype\('<f2'\)"):
        ks.sparse_attention(q, be, be, np.arange(3))
    with pytest.raises(ks.InvalidArgument, match="native byte order"):
        ks.FlatIndex(be)


def test_wrong_dtype_and_layout_name_the_framework_fix(data):
    keys, _, q = data
    with pytest.raises(ks.InvalidArgument, match=r"got float64.*x\.to\(torch\.float32\)"):
        ks.FlatIndex(Producer(keys.astype(np.float64)))
    t = np.ascontiguousarray(keys.T)  # (D, N) buffer, exported as (N, D) column-major
    with pytest.raises(ks.InvalidArgument, match=r"contiguous\(\)"):
        ks.FlatIndex(Producer(t, shape=(N, D), strides=(1, N)))
    with pytest.raises(ks.InvalidArgument, match="float32, got float16"):
        ks.FlatIndex(keys).topk(Producer(q.astype(np.float16)), 3)
    with pytest.raises(ks.InvalidArgument, match="DLPack tensor"):
        ks.FlatIndex([[1.0, 2.0]])


def test_ids_from_any_integer_producer_and_int64_results(data):
    keys, values, q = data
    ids = np.array([5, 9, 11], np.int32)
    a = ks.sparse_attention(q, keys, values, Producer(ids))
    b = ks.sparse_attention(q, keys, values, ids.astype(np.uint64))
    np.testing.assert_array_equal(a[0], b[0])
    with pytest.raises(ks.OutOfRange, match="got -1"):
        ks.sparse_attention(q, keys, values, Producer(np.array([-1], np.int64)))
    r = ks.FlatIndex(keys).topk(q, 4)
    assert r.ids.dtype == np.int64 and ks.FlatIndex(keys).dipr(q, 1.0).ids.dtype == np.int64
    np.testing.assert_array_equal(keys[r.ids], keys[oracle_topk(keys, q, 4)])


# ------------------------------------------------------------------ torch (when installed)


def test_torch_tensors_zero_copy_bf16_and_rejections(data):
    torch = pytest.importorskip("torch")
    keys, values, q = data
    kt = torch.from_numpy(keys.copy())
    flat = ks.FlatIndex(kt)
    assert flat.dtype == torch.float32
    best = int(flat.topk(torch.from_numpy(q), 1).ids[0])
    kt[(best + 1) % N] = 100 * torch.sign(torch.from_numpy(q))  # caller's tensor, in place
    assert int(flat.topk(q, 1).ids[0]) == (best + 1) % N
    # bf16 K/V straight from torch; results index torch tensors (int64).
    kb, vb = torch.from_numpy(keys).bfloat16(), torch.from_numpy(values).bfloat16()
    r = ks.FlatIndex(kb).topk(q, 8)
    sel = kb[torch.from_numpy(r.ids)]
    assert sel.shape == (8, D)
    o, lse = ks.sparse_attention(q, kb[:, None], vb[:, None], torch.from_numpy(r.ids))
    want_o, want_lse = oracle_attention(q, keys, values, r.ids)
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    # expand() is a zero-stride view: refused, naming .contiguous().
    e = torch.from_numpy(keys[:1, None, :]).expand(50, 2, D)
    with pytest.raises(ks.InvalidArgument, match=r"contiguous\(\)"):
        ks.dense_attention(q, e, e, 0, 50)
    with pytest.raises(ks.InvalidArgument, match="float16 or bfloat16, got float64"):
        ks.FlatIndex(torch.from_numpy(keys).double())
    if torch.cuda.is_available():
        with pytest.raises(ks.InvalidArgument, match="cuda:0"):
            ks.FlatIndex(kt.cuda())
