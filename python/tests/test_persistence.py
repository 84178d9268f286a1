"""RoarGraphIndex kept across processes: save/load and pickle give back an index that answers
exactly as the original did, and refuse to attach a graph to other keys or to damaged bytes."""

import os
import pickle
import struct

import numpy as np
import pytest

import kvsift as ks

N, D = 1200, 24


def fnv1a64(data: bytes, h: int = 14695981039346656037) -> int:
    """64-bit FNV-1a, written independently of the C++ one (the oracle of key_fingerprint)."""
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def fingerprint(keys: np.ndarray) -> int:
    """key_fingerprint for keys below 16 MiB: n, d (uint64), element type (uint32: 0 f32,
    1 f16), then every row's bytes."""
    n, d = keys.shape
    kind = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}[keys.dtype]
    head = struct.pack("<QQI", n, d, kind)
    return fnv1a64(head + np.ascontiguousarray(keys).tobytes())


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    c = rng.standard_normal((16, D)).astype(np.float32) * 2.0
    keys = c[rng.integers(0, 16, N)] + rng.standard_normal((N, D)).astype(np.float32)
    queries = keys[rng.integers(0, N, 200)] * 0.5 + rng.standard_normal((200, D))
    return np.ascontiguousarray(keys, np.float32), np.ascontiguousarray(queries, np.float32)


@pytest.fixture(scope="module")
def graph(data):
    keys, queries = data
    return ks.RoarGraphIndex(keys, queries[:150], nq=20, M=12, L=48, threads=2)


def same_answers(a, b, queries):
    """Beam search (batched, and filtered) and DIPR of `a` and `b` agree bit for bit."""
    ra, rb = a.search(queries, 10, L=40), b.search(queries, 10, L=40)
    np.testing.assert_array_equal(ra.ids, rb.ids)
    np.testing.assert_array_equal(ra.scores, rb.scores)
    np.testing.assert_array_equal(ra.hops, rb.hops)
    fa = a.search(queries, 5, L=40, filter=ks.IdBelow(N // 3))
    fb = b.search(queries, 5, L=40, filter=ks.IdBelow(N // 3))
    np.testing.assert_array_equal(fa.ids, fb.ids)
    for q in queries[:5]:
        da, db = a.dipr(q, 2.0), b.dipr(q, 2.0)
        np.testing.assert_array_equal(da.ids, db.ids)
        np.testing.assert_array_equal(da.scores, db.scores)
    assert a.max_degree == b.max_degree and a.entry_point == b.entry_point


# ------------------------------------------------------------------------- round trips


def test_key_fingerprint_matches_an_independent_fnv1a(data, graph):
    keys, _ = data
    assert graph.key_fingerprint == fingerprint(keys)
    half = keys.astype(np.float16)
    h = ks.RoarGraphIndex(half, data[1][:100], nq=10, M=8, L=24, threads=1)
    assert h.key_fingerprint == fingerprint(half)


def test_save_load_round_trip(data, graph, tmp_path):
    keys, queries = data
    path = tmp_path / "g.kvsg"
    graph.save(path)  # os.PathLike
    loaded = ks.RoarGraphIndex.load(str(path), keys)  # str
    assert loaded.keys is keys  # borrowed, as by the constructor
    assert loaded.key_fingerprint == graph.key_fingerprint
    same_answers(graph, loaded, queries[150:])


def test_save_load_round_trip_float16(data, tmp_path):
    keys, queries = data
    half = keys.astype(np.float16)
    g = ks.RoarGraphIndex(half, queries[:100], nq=10, M=8, L=24, threads=1)
    g.save(tmp_path / "h.kvsg")
    same_answers(g, ks.RoarGraphIndex.load(tmp_path / "h.kvsg", half), queries[150:])


def test_pickle_round_trip_is_self_contained(data, graph):
    keys, queries = data
    blob = pickle.dumps(graph)
    # The keys travel with the graph: the pickle is larger than the key data.
    assert len(blob) > keys.nbytes
    restored = pickle.loads(blob)
    assert restored.keys is not keys and not np.shares_memory(restored.keys, keys)
    np.testing.assert_array_equal(restored.keys, keys)
    same_answers(graph, restored, queries[150:])
    assert restored.build_stats.total_seconds == graph.build_stats.total_seconds
    # The unpickled index owns its copy: it survives everything else going away.
    del blob
    again = pickle.loads(pickle.dumps(restored))
    del restored
    same_answers(graph, again, queries[150:])


def test_bytes_round_trip(data, graph, tmp_path):
    # to_bytes is exactly what save() writes; from_bytes borrows the keys as load() does and
    # refuses other keys, truncated or flipped bytes the same way.
    keys, queries = data
    blob = graph.to_bytes()
    graph.save(tmp_path / "g.kvsg")
    assert blob == (tmp_path / "g.kvsg").read_bytes()
    restored = ks.RoarGraphIndex.from_bytes(blob, keys, build_stats=(1.0, 2.0, 3.0, 6.0))
    assert restored.keys is keys
    assert restored.build_stats.connectivity_seconds == 3.0
    assert restored.build_stats.total_seconds == 6.0
    same_answers(graph, restored, queries[150:])
    assert ks.RoarGraphIndex.from_bytes(blob, keys).build_stats.total_seconds == 0.0
    other = keys.copy()
    other[3, 3] += 1.0
    with pytest.raises(ks.InvalidArgument, match="fingerprint"):
        ks.RoarGraphIndex.from_bytes(blob, other)
    with pytest.raises(ks.IoError, match="truncated"):
        ks.RoarGraphIndex.from_bytes(blob[:-5], keys)
    with pytest.raises(ks.IoError, match="checksum"):
        ks.RoarGraphIndex.from_bytes(blob[:100] + bytes([blob[100] ^ 1]) + blob[101:], keys)
    with pytest.raises(ValueError, match="build_stats"):
        ks.RoarGraphIndex.from_bytes(blob, keys, build_stats=(1.0, 2.0))
    with pytest.raises(ValueError, match="convert"):
        ks.RoarGraphIndex.from_bytes(blob, keys, build_stats=(1.0, 2.0, 3.0, "x"))


def test_pickle_of_a_strided_key_view(data):
    keys, queries = data
    wide = np.zeros((N, D + 8), np.float32)
    wide[:, :D] = keys
    view = wide[:, :D]  # rows of D floats, row stride D + 8
    g = ks.RoarGraphIndex(view, queries[:100], nq=10, M=8, L=24, threads=1)
    restored = pickle.loads(pickle.dumps(g))
    # The fingerprint ignores row padding: the contiguous copy matches the strided original.
    assert restored.key_fingerprint == g.key_fingerprint
    same_answers(g, restored, queries[150:])


# ------------------------------------------------------------------------- wrong keys


def test_load_onto_other_keys_names_both_fingerprints(data, graph, tmp_path):
    keys, _ = data
    path = tmp_path / "g.kvsg"
    graph.save(path)
    other = keys.copy()
    other[517, 3] += 1.0
    with pytest.raises(ks.InvalidArgument) as e:
        ks.RoarGraphIndex.load(path, other)
    msg = str(e.value)
    assert f"{fingerprint(keys):#x}" in msg and f"{fingerprint(other):#x}" in msg, msg


def test_load_onto_another_shape_or_dtype(data, graph, tmp_path):
    keys, _ = data
    path = tmp_path / "g.kvsg"
    graph.save(path)
    with pytest.raises(ks.DimensionMismatch, match=f"{N} x {D}"):
        ks.RoarGraphIndex.load(path, keys[:-1])
    with pytest.raises(ks.DimensionMismatch, match=f"{N} x {D}"):
        ks.RoarGraphIndex.load(path, np.ascontiguousarray(keys[:, :-1]))
    with pytest.raises(ks.InvalidArgument, match="f32.*f16"):
        ks.RoarGraphIndex.load(path, keys.astype(np.float16))
    with pytest.raises(ks.InvalidArgument, match="dtype"):
        ks.RoarGraphIndex.load(path, keys.astype(np.float64))


def test_unpickle_onto_other_keys_is_refused(data, graph):
    keys, _ = data
    state = graph.__getstate__()
    other = keys.copy()
    other[0, 0] = -other[0, 0] - 1.0
    bad = ks.RoarGraphIndex.__new__(ks.RoarGraphIndex)
    with pytest.raises(ks.InvalidArgument, match="fingerprint"):
        bad.__setstate__((state[0], other, state[2], state[3]))


# ------------------------------------------------------------------------- damaged bytes


def test_truncated_corrupted_missing_files(data, graph, tmp_path):
    keys, _ = data
    path = tmp_path / "g.kvsg"
    graph.save(path)
    raw = path.read_bytes()
    assert issubclass(ks.IoError, OSError)
    for cut in (0, 8, 40, len(raw) // 2, len(raw) - 1):
        path.write_bytes(raw[:cut])
        with pytest.raises(ks.IoError, match="truncated|magic"):
            ks.RoarGraphIndex.load(path, keys)
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    with pytest.raises(ks.IoError, match="checksum"):
        ks.RoarGraphIndex.load(path, keys)
    path.write_bytes(raw + b"\0")
    with pytest.raises(ks.IoError, match="unread"):
        ks.RoarGraphIndex.load(path, keys)
    with pytest.raises(ks.IoError, match="no such file"):
        ks.RoarGraphIndex.load(tmp_path / "absent.kvsg", keys)
    path.write_bytes(raw)
    ks.RoarGraphIndex.load(path, keys)  # the intact bytes still load


def test_damaged_pickle_state(data, graph):
    keys, _ = data
    v, k, blob, st = graph.__getstate__()
    fresh = ks.RoarGraphIndex.__new__
    with pytest.raises(ks.IoError, match="truncated"):
        fresh(ks.RoarGraphIndex).__setstate__((v, k, blob[:-3], st))
    b = bytearray(blob)
    b[100] ^= 0x40
    with pytest.raises(ks.IoError, match="checksum"):
        fresh(ks.RoarGraphIndex).__setstate__((v, k, bytes(b), st))
    with pytest.raises(ks.InvalidArgument, match="another kvsift version"):
        fresh(ks.RoarGraphIndex).__setstate__((v + 1, k, blob, st))
    with pytest.raises(ks.InvalidArgument, match="another kvsift version"):
        fresh(ks.RoarGraphIndex).__setstate__((v, k, blob))


def test_save_to_an_unwritable_place_raises_ioerror(graph, tmp_path):
    with pytest.raises(ks.IoError):
        graph.save(tmp_path / "no" / "such" / "dir" / "g.kvsg")
    os.mkdir(tmp_path / "d")
    with pytest.raises(ks.IoError, match="directory"):
        graph.save(tmp_path / "d")
