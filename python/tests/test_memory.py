"""kvsift.BufferElasticity: Spin's page budget across requests and the per-pair limits that
kvsift.cuda.OffloadedKV.attend takes (the C++ buffer_elasticity and pair_page_limits)."""
import numpy as np
import pytest

import kvsift as ks


def test_admit_grow_and_reclaim():
    b = ks.BufferElasticity(100)
    assert b.total_pages == 100 and b.free_pages == 100 and b.active == 0
    assert b.admit(1, 1000, 20, 30)
    assert not b.admit(2, 1000, 40, 20)  # 60 > 50 free: refused, nothing changes
    assert b.free_pages == 50 and b.active == 1
    assert b.admit(2, 3000, 10, 40)
    assert b.free_pages == 0
    # Request 1 needs 40 more mandatory pages: its own buffer (30), then 10 from request 2.
    taken = b.set_mandatory(1, 1000, 60)
    assert taken == [(2, 10)]
    assert b.allocation(1) == (1000, 60, 0) and b.allocation(2) == (3000, 10, 30)
    assert b.reclaim(4) == [(2, 4)] and b.free_pages == 4
    b.release(2)
    assert b.free_pages == 4 + 10 + 26 and b.active == 1
    assert b.distribute_free() == [(1, 40)] and b.free_pages == 0
    assert b.allocation(1) == (1000, 60, 40)


def test_pair_limits_split_each_request_over_its_kv_heads():
    b = ks.BufferElasticity(64)
    assert b.admit(0, 4000, 0, 10) and b.admit(1, 1000, 0, 3)
    b.set_mandatory(0, 4000, 7)
    b.set_mandatory(1, 1000, 4)
    limits = b.pair_limits([0, 1], [3, 4, 4, 0])
    assert limits.dtype == np.int32
    assert limits.tolist() == [3 + 5, 4 + 5, 4 + 2, 0 + 1]  # buffers 10 and 3 over 2 heads
    assert int(limits.sum()) == 7 + 10 + 4 + 3


def test_bad_input_names_expected_and_actual_values():
    with pytest.raises(ks.InvalidArgument, match="total_pages must be > 0"):
        ks.BufferElasticity(0)
    with pytest.raises(ks.InvalidArgument, match="expected total_pages >= 0, got -5"):
        ks.BufferElasticity(-5)
    b = ks.BufferElasticity(10)
    assert b.admit(1, 10, 2, 1)
    with pytest.raises(ks.InvalidArgument, match="already active"):
        b.admit(1, 10, 0, 0)
    with pytest.raises(ks.InvalidArgument, match="expected a request id >= 0, got -1"):
        b.admit(-1, 10, 0, 0)
    with pytest.raises(ks.InvalidArgument, match="length must be > 0"):
        b.admit(2, 0, 0, 0)
    with pytest.raises(ks.OutOfRange, match="request 9 is not active"):
        b.allocation(9)
    with pytest.raises(ks.InvalidArgument, match="page demand of 50 pages exceeds"):
        b.set_mandatory(1, 10, 50)
    assert b.allocation(1) == (10, 2, 1)  # unchanged
    with pytest.raises(ks.InvalidArgument, match="allocation of 2 mandatory pages.*add up to 3"):
        b.pair_limits([1], [1, 2])
    with pytest.raises(ks.InvalidArgument, match="got 3 for 2 requests"):
        b.pair_limits([1, 1], [1, 1, 0])
    with pytest.raises(ks.InvalidArgument, match="at least one request"):
        b.pair_limits([], [])
    with pytest.raises(ks.InvalidArgument, match="pair_mandatory >= 0, got -2"):
        b.pair_limits([1], [-2, 4])
    with pytest.raises(ks.InvalidArgument, match="asked for 5 pages"):
        b.reclaim(5)
    with pytest.raises(ks.OutOfRange):
        b.pair_limits([3], [2])
